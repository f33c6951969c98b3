"""Small status files each process keeps in the run dir, for the watchdog's probes and the `status` command.

A reader gets a whole status, the old one or the new, never a mix; a missing or broken file reads as "no
status".

The probes read these files, so a full run dir must not stop them being written: liveness would fail and
the kubelet restart the pod. Each process therefore keeps a spare file beside its status file with its
space allocated, writes the new status over the spare's bytes (padded with spaces, which JSON ignores, so
the file keeps its size and needs no new space), and puts it in the status file's place with a rename,
the old status kept as the next spare through a second link to it (a name, no data). Only a status that
outgrows the spare needs new space; when that fails, the status is left as it was.

The spare is the file that was the status two writes earlier, and a slow reader may still have it open: so
the writer rewrites it only under an exclusive lock (flock) that it cannot get while a reader holds its
shared one, and otherwise writes a new file instead (shared.fs.atomic_file, new space). A reader that opened a
file that is no longer the status file (a spare now) opens the status file again: so the statuses one reader
reads in turn never go back in time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import time
from typing import Any

from shared.fs.atomic_file import temp_path, write_atomically

_MAX_STATUS_BYTES = 64 * 1024
# A spare holds this much at least, and grows in doublings: a status that changes in size by a few
# devices' worth keeps its space.
_SPARE_BYTES = 4096
# Each failed try means the writer put a newer status in place meanwhile; this many in one read is a writer
# gone wild, and the read gives up ("no status") rather than spin.
_READ_TRIES = 100


def status_file(run_dir: pathlib.Path, process: str) -> pathlib.Path:
    return run_dir / f"status-{process}.json"


def _spare_file(run_dir: pathlib.Path, process: str) -> pathlib.Path:
    return run_dir / f".status-{process}.spare"


def _spare_size(current: int, length: int) -> int:
    """The spare's size for a status of `length` bytes: its size now when that holds the status and stays
    readable, else the smallest of the doublings that does (a status written as a new file has its exact
    size, and becomes a spare two writes later)."""
    if length <= current <= _MAX_STATUS_BYTES:
        return current
    size = _SPARE_BYTES
    while size < length:
        size *= 2
    return size


def _write_spare(run_dir: pathlib.Path, process: str, content: bytes) -> bool:
    """`content` written over the spare's bytes; False when a reader still reads the spare."""
    fd = os.open(_spare_file(run_dir, process), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        current = os.fstat(fd).st_size
        size = _spare_size(current, len(content))
        if size > current:
            os.posix_fallocate(fd, 0, size)
        elif size < current:
            os.ftruncate(fd, size)
        os.pwrite(fd, content + b" " * (size - len(content)), 0)
        return True
    finally:
        os.close(fd)


def _exchange_spare(run_dir: pathlib.Path, process: str) -> None:
    """The written spare becomes the status file, and the old status the next spare (module docstring)."""
    status = status_file(run_dir, process)
    old = run_dir / f".status-{process}.old"
    old.unlink(missing_ok=True)  # left by a process that died between the renames below
    try:
        os.link(status, old)
    except FileNotFoundError:
        pass  # the first status: no spare to keep
    os.rename(_spare_file(run_dir, process), status)
    if old.exists():
        os.rename(old, _spare_file(run_dir, process))


def write_status(run_dir: pathlib.Path, process: str, fields: dict[str, Any]) -> None:
    """Publish `fields` (plus pid and time stamps) as the process's status; errors are not fatal."""
    document = {"process": process, "pid": os.getpid(), "monotonic": time.monotonic(), "time": time.time(),
                **fields}
    content = json.dumps(document).encode()
    try:
        if _write_spare(run_dir, process, content):
            _exchange_spare(run_dir, process)
            return
    except OSError:
        pass  # no space for a larger spare: a new file, if there is room for it
    # Status is for probes and operators; a full or read-only run dir must not stop the stack.
    with contextlib.suppress(OSError):
        write_atomically(status_file(run_dir, process), content, mode=0o600, durable=False)


def _read_whole(run_dir: pathlib.Path, process: str) -> bytes | None:
    """The status file's bytes, read under a shared lock (module docstring); None when there is none."""
    status = status_file(run_dir, process)
    for _ in range(_READ_TRIES):
        with open(status, "rb") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # the writer rewrites what was the status: a newer one is in place
            if os.fstat(handle.fileno()).st_ino != os.stat(status).st_ino:
                continue  # what was the status is a spare now, maybe holding a status not yet in place
            return handle.read(_MAX_STATUS_BYTES + 1)
    return None


def read_status(run_dir: pathlib.Path, process: str) -> dict[str, Any] | None:
    try:
        raw = _read_whole(run_dir, process)
        document = json.loads(raw) if raw is not None and len(raw) <= _MAX_STATUS_BYTES else None
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def remove_status(run_dir: pathlib.Path, process: str) -> None:
    status = status_file(run_dir, process)
    for path in (status, temp_path(status), _spare_file(run_dir, process), run_dir / f".status-{process}.old"):
        with contextlib.suppress(OSError):
            path.unlink()
