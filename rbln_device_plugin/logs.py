"""`rbln-device-plugin logs <process> [-f] [--level L] [--since D]`: one process's records, for a person.

Reads the process's own log files (shared.observability.log writes them as JSON): the rotated
ones oldest first, then the current one, and prints each record as a text line.
With `-f` it keeps printing records as they are written, across rotations,
until interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from shared.durations import parse_duration
from shared.observability import log
from shared.programs import ALL_PROGRAMS

FOLLOW_POLL_SECONDS = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("process", choices=ALL_PROGRAMS, help="whose records to show")
    parser.add_argument("-f", "--follow", action="store_true", help="keep showing new records until interrupted")
    parser.add_argument("--level", default="debug", metavar="L",
                        help="show records at this level or above: error, warn (warning), info, debug")
    parser.add_argument("--since", metavar="D", help="show records of the last D only (Go duration: 30s, 15m, 2h)")
    parser.add_argument("--log-dir", default=os.environ.get(log.DIR_ENV, log.DEFAULT_DIR), metavar="DIR",
                        help=f"where the stack writes its log files (env {log.DIR_ENV}, default {log.DEFAULT_DIR})")


class RecordFilter:
    """Which lines to show: records at `level` or above, written at or after `since`."""

    def __init__(self, level: str, since: datetime.datetime | None):
        self._min_rank = log.LEVELS.index(level)
        self._since = since

    def render(self, line: str) -> str | None:
        """The line as a person reads it, or None when it is filtered out. A line that is not a record is kept."""
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            return line
        level = log.level_name(str(record.get("level", "")))
        if level is not None and log.LEVELS.index(level) < self._min_rank:
            return None
        if self._since is not None:
            try:
                if log.parse_timestamp(str(record.get("ts", ""))) < self._since:
                    return None
            except ValueError:
                pass
        return log.text_line(record)


def _written_since(path: pathlib.Path) -> float:
    """When `path` was begun: its first record's time; its modification time when that cannot be read.

    Modification times cannot order rotated files alone: several may be written within
    one tick of the file system's clock.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first_line = handle.readline()
            modified = os.fstat(handle.fileno()).st_mtime
    except OSError:
        return 0.0  # removed meanwhile by retention: it shows nothing anyway
    try:
        return log.parse_timestamp(json.loads(first_line)["ts"]).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError):
        return modified


def log_files(log_dir: pathlib.Path, process: str) -> list[pathlib.Path]:
    """The process's files in the order they were written: rotated ones by age, then the current one."""
    rotated = sorted((path for path in log_dir.glob(f"{process}.*.log") if path.is_file()),
                     key=lambda path: (_written_since(path), path.name))
    current = log_dir / f"{process}.log"
    return rotated + ([current] if current.is_file() else [])


def _complete_lines(handle: IO[str], pending: str) -> tuple[list[str], str]:
    """Whole lines now readable from `handle`; a trailing partial line is kept as the new `pending`."""
    text = pending + handle.read()
    *lines, rest = text.split("\n")
    return lines, rest


def _same_file(handle: IO[str], path: pathlib.Path) -> bool:
    try:
        current = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(handle.fileno())
    return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)


def follow(path: pathlib.Path, stopped: Callable[[float], bool]) -> Iterator[str]:
    """Lines of `path` from its start, then as they are appended, also after the file is rotated
    (renamed and replaced), until `stopped(pause)` - which waits up to `pause` seconds - says to end."""
    handle = None
    pending = ""
    try:
        while True:
            if handle is None and path.is_file():
                # Not a `with`: the handle lives across yields and is closed at rotation or in `finally`.
                handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
            if handle is not None:
                lines, pending = _complete_lines(handle, pending)
                yield from lines
                if not _same_file(handle, path):
                    # Rotated: what was written before the rename is in the old handle; the rest in the new file.
                    lines, pending = _complete_lines(handle, pending)
                    yield from lines
                    handle.close()
                    handle, pending = None, ""
                    continue
            if stopped(FOLLOW_POLL_SECONDS):
                return
    finally:
        if handle is not None:
            handle.close()


def show(log_dir: pathlib.Path, process: str, records: RecordFilter, out: IO[str],
         stopped: Callable[[float], bool] | None = None) -> int:
    """Print the process's records to `out`; with `stopped`, follow the current file until it says stop."""
    files = log_files(log_dir, process)
    if stopped is None:
        if not files:
            print(f"rbln-device-plugin logs: no log file for {process} in {log_dir}", file=sys.stderr)
            return 1
        _print((line for path in files for line in _read_lines(path)), records, out)
        return 0
    current = log_dir / f"{process}.log"
    _print((line for path in files if path != current for line in _read_lines(path)), records, out)
    _print(follow(current, stopped), records, out)
    return 0


def _read_lines(path: pathlib.Path) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                yield line.rstrip("\n")
    except FileNotFoundError:  # rotated away while reading
        return


def _print(lines: Iterable[str], records: RecordFilter, out: IO[str]) -> None:
    for line in lines:
        shown = records.render(line)
        if shown is not None:
            out.write(shown + "\n")
            out.flush()


def _until_interrupted(pause: float) -> bool:
    time.sleep(pause)  # Ctrl-C ends it with KeyboardInterrupt
    return False


def run(args: argparse.Namespace) -> int:
    level = log.level_name(args.level)
    if level is None:
        print(f"rbln-device-plugin logs: invalid --level {args.level!r} (error, warn, info or debug)", file=sys.stderr)
        return 2
    since = None
    if args.since:
        try:
            since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
                seconds=parse_duration(args.since))
        except ValueError as exc:
            print(f"rbln-device-plugin logs: invalid --since: {exc}", file=sys.stderr)
            return 2
    if not args.log_dir:
        print(f"rbln-device-plugin logs: per-process log files are off ({log.DIR_ENV} is empty)", file=sys.stderr)
        return 1
    try:
        return show(pathlib.Path(args.log_dir), args.process, RecordFilter(level, since), sys.stdout,
                    _until_interrupted if args.follow else None)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # the reader (`| head`) went away; so must the final flush of stdout
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
