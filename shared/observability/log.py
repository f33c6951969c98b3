"""The one structured log stream of the stack, and each process's own log file (docs/logs.md).

Each process writes one record per line to stdout: JSON by default (`ts`,
`level`, `msg`, `process`, then the event's keys) or a text rendering for
people. supervisord passes every program's stdout through to its own, so a
record must reach the pipe in a single write: records are kept below the pipe's
atomic-write size and flushed one by one. Standard-library logging (gRPC's and
OpenTelemetry's own records) is routed into the same stream.

Besides stdout, each process appends the same records to `<log dir>/<process>.log`,
rotated by size with a bounded number of old files kept. The files are always
JSON, whatever the stream's format, so that `rbln-device-plugin logs` can
filter them by level and time before rendering them for a person. A log file is
only ever opened as a plain file of the stack's user, never through a symbolic
link (shared/fs/safe_open.py), and old files are removed only when they are
provably this process's own rotated files (`own_rotated_files`).

Callers log with loguru and pass the event's keys as keyword arguments:
`logger.info("Device exposed", resourceName=..., device=...)`.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import glob
import json
import logging
import os
import pathlib
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loguru import logger

from shared.fs import safe_open

if TYPE_CHECKING:
    from loguru import Record

LEVEL_ENV = "RBLN_DEVICE_PLUGIN_LOG_LEVEL"
FORMAT_ENV = "RBLN_DEVICE_PLUGIN_LOG_FORMAT"
DIR_ENV = "RBLN_DEVICE_PLUGIN_LOG_DIR"
DEFAULT_LEVEL = "info"
DEFAULT_FORMAT = "json"
DEFAULT_DIR = "/var/log/rbln-device-plugin"

# The stream's level names, least severe first.
LEVELS = ("debug", "info", "warn", "error")
_LOGURU_LEVELS = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR"}
# loguru level name -> the stream's name.
_LEVEL_KEYS = {"CRITICAL": "error", "ERROR": "error", "WARNING": "warn", "SUCCESS": "info",
               "INFO": "info", "DEBUG": "debug", "TRACE": "debug"}
_FORMATS = ("json", "text")
# PIPE_BUF: a write of at most this many bytes to a pipe is never interleaved.
MAX_RECORD_BYTES = 4096
_FIRST_KEYS = ("ts", "level", "msg", "process")
# A process's file is rotated when it would grow past ROTATE_BYTES; KEEP_ROTATED old files
# are kept besides the current one, so a process never holds more than (1 + KEEP_ROTATED) x ROTATE_BYTES.
ROTATE_BYTES = 10 * 1024 * 1024
KEEP_ROTATED = 3
# loguru renames a full file to `<process>.<creation time>.log`, with a counter from 2 when the name is taken.
_ROTATED_SUFFIX = r"\.(\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{6})(?:\.(\d+))?\.log"
_FIRST_LINE_BYTES = MAX_RECORD_BYTES + 1
# Standard-library records carry `component`: these libraries by a short name, others by their package.
_COMPONENTS = {"grpc": "grpc", "opentelemetry": "otel"}
# Libraries whose debug records are not let through: hpack (worker-dra's HTTP/2 header coding) logs every header
# it codes, and each encoded header block whole, the API token in it (Huffman-coded, not hidden).
_QUIET_BELOW_WARNING = ("hpack",)
OTEL_ERROR_MESSAGE = "OpenTelemetry SDK error"
# A text value is shown bare unless it could be misread.
_BARE_TEXT = re.compile(r'^[^\s"=]+$')


def level_name(text: str) -> str | None:
    """The stream's name for a level as a person writes it (`WARNING` -> `warn`); None if it is no level."""
    name = text.strip().lower()
    name = "warn" if name == "warning" else name
    return name if name in LEVELS else None


def timestamp(moment: datetime.datetime) -> str:
    """RFC3339Nano in UTC: fractional seconds without trailing zeros, `Z` suffix."""
    utc = moment.astimezone(datetime.timezone.utc)
    fraction = f"{utc.microsecond:06d}".rstrip("0")
    return utc.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


def parse_timestamp(text: str) -> datetime.datetime:
    """The inverse of `timestamp` (any RFC3339 offset, up to nanoseconds); ValueError otherwise."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", text.strip())
    if match is None:
        raise ValueError(f"not an RFC3339 timestamp: {text!r}")
    seconds, fraction, zone = match.groups()
    moment = datetime.datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return moment + datetime.timedelta(microseconds=int((fraction or "0").ljust(9, "0")[:6]))


def _caller(record: Mapping[str, Any]) -> str:
    path = pathlib.Path(record["file"].path)
    return f"{path.parent.name}/{path.name}:{record['line']}"


def _fields(record: Mapping[str, Any], with_caller: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": timestamp(record["time"]),
        "level": _LEVEL_KEYS.get(record["level"].name, record["level"].name.lower()),
        "msg": record["message"],
        "process": record["extra"].get("process", ""),
    }
    for key, value in record["extra"].items():
        if key not in fields and not key.startswith("_"):
            fields[key] = value
    if record["exception"] is not None and "err" not in fields:
        fields["err"] = f"{record['exception'].type.__name__}: {record['exception'].value}"
    if with_caller:
        fields["caller"] = record["extra"].get("_caller") or _caller(record)
    return fields


def _shrink(fields: dict[str, Any], encode) -> str:
    """Encode `fields`, halving the longest event value (or the message, when it is longer than any) until the
    record fits one atomic write."""
    line = encode(fields)
    while len(line.encode()) >= MAX_RECORD_BYTES:
        candidates = [k for k in fields if k not in _FIRST_KEYS]
        key = max([*candidates, "msg"], key=lambda k: len(json.dumps(fields[k], default=str)))
        if key == "msg":
            fields["msg"] = fields["msg"][: len(fields["msg"]) // 2]
        else:
            text = fields[key] if isinstance(fields[key], str) else json.dumps(fields[key], default=str)
            fields[key] = text[: len(text) // 2] + "…(truncated)"
        line = encode(fields)
    return line


def json_line(fields: Mapping[str, Any]) -> str:
    return json.dumps(fields, default=str, separators=(",", ":"))


def _text_value(value: Any) -> str:
    if isinstance(value, str) and _BARE_TEXT.match(value):
        return value
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


def text_line(fields: Mapping[str, Any]) -> str:
    """A record for a person: `<ts> <LEVEL> [<process>] <msg>  key=value ...`."""
    rest = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items() if k not in _FIRST_KEYS)
    head = f"{fields.get('ts', '')} {str(fields.get('level', '')).upper():5} [{fields.get('process', '')}] " \
           f"{fields.get('msg', '')}"
    return f"{head}  {rest}" if rest else head


def _first_record(path: pathlib.Path) -> Any:
    """The first line of the plain file at `path` as JSON (never through a link); None if it has none."""
    try:
        fd = safe_open.open_file(path, os.O_RDONLY, DIR_ENV)
        with os.fdopen(fd, "rb") as handle:
            return json.loads(handle.readline(_FIRST_LINE_BYTES))
    except (OSError, ValueError):
        return None


def own_rotated_files(log_dir: pathlib.Path, process: str, candidates: list[str]) -> list[pathlib.Path]:
    """Of `candidates` (the files loguru's retention found), those this process rotated, oldest first:
    named as loguru names them, directly in `log_dir`, plain files of the stack's user, begun by a record
    of `process`. A log dir shared with other software therefore never loses a file that is not the stack's."""
    name = re.compile(re.escape(process) + _ROTATED_SUFFIX)
    own = []
    for candidate in map(pathlib.Path, candidates):
        match = name.fullmatch(candidate.name)
        if candidate.parent != log_dir or match is None:
            continue
        record = _first_record(candidate)
        if isinstance(record, dict) and record.get("process") == process:
            own.append(((match[1], int(match[2] or 1)), candidate))
    return [path for _, path in sorted(own)]


def _retention(log_dir: pathlib.Path, process: str, keep: int):
    """loguru's retention: keep the newest `keep` of the process's own rotated files, remove the others."""

    def remove_old(candidates: list[str]) -> None:
        files = own_rotated_files(log_dir, process, candidates)
        for old in files[:max(len(files) - keep, 0)]:
            try:
                old.unlink()
            except FileNotFoundError:
                pass

    return remove_old


# Write errors that say the log dir has no room now, which it may have again later.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT})


class LogFile:
    """The process's log file as a loguru sink: each record appended with one write, the file rotated by
    size (renamed `<process>.<time it was begun>.log`, as loguru names them) and the process's own oldest
    rotated files removed beyond `keep`.

    A write the file system refuses (a full or read-only log dir) drops the record from the file only:
    stdout has it. That is reported once on stdout, naming the directory, and so is the first record written
    again: each record tries the file again, so it recovers by itself when space comes back. The reports go
    straight to `announce`, since a sink cannot log through loguru."""

    def __init__(self, directory: pathlib.Path, process: str, rotate_bytes: int, keep: int, announce):
        self._directory = directory
        self._process = process
        self._path = directory / f"{process}.log"
        self._rotate_bytes = rotate_bytes
        self._remove_old = _retention(directory, process, keep)
        self._announce = announce
        self._opener = safe_open.opener(DIR_ENV, mode=0o640)
        # Guards the descriptor and the counts: records come from any thread.
        self._lock = threading.Lock()
        self._fd = -1
        self._size = 0
        self._begun = 0.0
        self._failing = False
        try:
            self._open()
        except OSError as exc:
            # A full or read-only log dir is tried again at each record (and reported at the first); a link
            # or a stranger's file in its place is a setting to fix: the caller falls back to stdout.
            if exc.errno not in _NO_ROOM:
                raise

    def _open(self) -> None:
        self._fd = self._opener(str(self._path), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
        info = os.fstat(self._fd)
        self._size = info.st_size
        self._begun = info.st_mtime if info.st_size else time.time()

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        stamp = datetime.datetime.fromtimestamp(self._begun).strftime("%Y-%m-%d_%H-%M-%S_%f")
        target = self._directory / f"{self._process}.{stamp}.log"
        counter = 2
        while target.exists():
            target = self._directory / f"{self._process}.{stamp}.{counter}.log"
            counter += 1
        os.rename(self._path, target)
        self._open()
        self._remove_old([str(path) for path in self._directory.glob(f"{glob.escape(self._process)}.*.log")])

    def write(self, message: str) -> None:
        data = message.encode()
        with self._lock:
            try:
                if self._fd < 0:
                    self._open()
                if self._size and self._size + len(data) > self._rotate_bytes:
                    self._rotate()
                written = os.write(self._fd, data)
                if written < len(data):  # the file system is full: no half record stays in the file
                    os.ftruncate(self._fd, self._size)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self._size += written
            except OSError as exc:
                if not self._failing:
                    self._failing = True
                    self._announce("warn", "Log file not written; logging to stdout only",
                                   {"path": str(self._directory), "err": str(exc)})
                return
            if self._failing:
                self._failing = False
                self._announce("info", "Log file written again", {"path": str(self._directory)})


@dataclasses.dataclass(frozen=True)
class LogSetup:
    """What `setup` installed: the level and format in use (the stream's names), and the settings
    that fell back to their defaults, not yet logged."""

    level: str
    format: str
    fallbacks: list[Fallback]


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A logging setting that could not be used; the default it fell back to is in `fields`."""

    message: str
    fields: Mapping[str, str]

    def log(self) -> None:
        logger.warning(self.message, **self.fields)


def _stdlib_level(record: logging.LogRecord) -> str:
    if record.levelno >= logging.ERROR:
        return "ERROR"
    if record.levelno >= logging.WARNING:
        return "WARNING"
    return "INFO" if record.levelno >= logging.INFO else "DEBUG"


class _StdlibBridge(logging.Handler):
    """Routes standard-library records into the stream, tagged with the library they come from.

    A library's informational chatter is per-request flow (debug). OpenTelemetry
    reports about best-effort tracing, so its warnings and errors become one
    warn-level `OpenTelemetry SDK error` with the library's text under `err`.
    """

    def emit(self, record: logging.LogRecord) -> None:
        package = record.name.split(".", 1)[0]
        component = _COMPONENTS.get(package, package)
        level = _stdlib_level(record)
        message = record.getMessage()
        # A library's caller is named by its logger: `grpc/_server.py` would not say which package it is.
        extra: dict[str, Any] = {"component": component, "_caller": f"{record.name}:{record.lineno}"}
        if record.exc_info and record.exc_info[1] is not None:
            extra["err"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        if package in _COMPONENTS and level == "INFO":
            level = "DEBUG"
        if component == "otel" and level in ("WARNING", "ERROR"):
            level = "WARNING"
            extra["err"] = message + (f" ({extra['err']})" if "err" in extra else "")
            message = OTEL_ERROR_MESSAGE
        logger.bind(**extra).log(level, message)


def _level_and_format(environ: Mapping[str, str]) -> tuple[str, str, list[Fallback]]:
    """LOG_LEVEL and LOG_FORMAT as set, or their defaults, with a fallback for each setting not understood."""
    fallbacks = []
    level_text = environ.get(LEVEL_ENV, "")
    level = level_name(level_text) if level_text.strip() else DEFAULT_LEVEL
    if level is None:
        fallbacks.append(Fallback("Invalid log level; using the default",
                                  {"env": LEVEL_ENV, "value": level_text, "fallback": DEFAULT_LEVEL}))
        level = DEFAULT_LEVEL
    format_text = environ.get(FORMAT_ENV, "")
    log_format = format_text.strip().lower() or DEFAULT_FORMAT
    if log_format not in _FORMATS:
        fallbacks.append(Fallback("Invalid log format; using the default",
                                  {"env": FORMAT_ENV, "value": format_text, "fallback": DEFAULT_FORMAT}))
        log_format = DEFAULT_FORMAT
    return level, log_format, fallbacks


def _log_file(environ: Mapping[str, str], process: str, rotate_bytes: int, keep_rotated: int,
              announce: Callable[[str, str, Mapping[str, str]], None], fallbacks: list[Fallback]) -> LogFile | None:
    """The process's log file in LOG_DIR; None without one (the directory unusable: a fallback says why)."""
    log_dir = environ.get(DIR_ENV, DEFAULT_DIR)
    if not log_dir:
        return None
    directory = pathlib.Path(os.path.abspath(log_dir))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return LogFile(directory, process, rotate_bytes, keep_rotated, announce)
    except OSError as exc:
        fallbacks.append(Fallback("Log directory unavailable; logging to stdout only",
                                  {"env": DIR_ENV, "value": log_dir, "err": str(exc)}))
        return None


def setup(process: str, environ: Mapping[str, str] | None = None, stream=None,
          rotate_bytes: int = ROTATE_BYTES, keep_rotated: int = KEEP_ROTATED) -> LogSetup:
    """Install the stream (and the log file) for `process`.

    The settings that fell back to their defaults are returned, not yet logged: the
    caller logs them after its startup record, which must be the process's first.
    """
    environ = os.environ if environ is None else environ
    stream = sys.stdout if stream is None else stream
    level, log_format, fallbacks = _level_and_format(environ)
    with_caller = level == "debug"
    as_text = log_format == "text"

    def patch(record: Record) -> None:
        fields = _fields(record, with_caller)
        record["extra"]["_json"] = _shrink(dict(fields), json_line)
        record["extra"]["_line"] = _shrink(fields, text_line) if as_text else record["extra"]["_json"]

    logger.remove()
    logger.configure(extra={"process": process}, patcher=patch)

    def announce(level: str, message: str, fields: Mapping[str, str]) -> None:
        """One record straight to the stream, as the stream's sink would have written it."""
        record = {"ts": timestamp(datetime.datetime.now(datetime.timezone.utc)), "level": level, "msg": message,
                  "process": process, **fields}
        stream.write(_shrink(record, text_line if as_text else json_line) + "\n")
        stream.flush()

    log_file = _log_file(environ, process, rotate_bytes, keep_rotated, announce, fallbacks)

    def write(message) -> None:
        """Both destinations of a record: one loguru sink, since each sink costs a process's start some 7 ms
        (loguru's exception formatter of a sink reads every sysconfig scheme). The file gets the record
        even when the stream fails; loguru then reports the stream's error as it would for a sink of its own."""
        extra = message.record["extra"]
        try:
            stream.write(extra["_line"] + "\n")
            stream.flush()
        finally:
            if log_file is not None:
                log_file.write(extra["_json"] + "\n")

    # The lines are made by the patcher: loguru's own rendering is left empty.
    logger.add(write, format=lambda _record: "", level=_LOGURU_LEVELS[level], colorize=False, backtrace=False,
               diagnose=False)

    logging.basicConfig(handlers=[_StdlibBridge()], level=logging.DEBUG if with_caller else logging.INFO,
                        force=True)
    for library in _QUIET_BELOW_WARNING:
        logging.getLogger(library).setLevel(logging.WARNING)
    return LogSetup(level, log_format, fallbacks)
