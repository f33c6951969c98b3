"""Small status files each process keeps in the run dir, for the watchdog's probes and the `status` command.

A file is replaced atomically, so a reader sees either the old or the new content, never a mix. Readers
treat a missing or broken file as "no status".

The probes read these files, so a full run dir must not stop them being written: liveness would fail and
the kubelet restart the pod. Each process therefore keeps a spare file beside its status file with its
space allocated, writes the new status over the spare's bytes (padded with spaces, which JSON ignores, so
the file keeps its size and needs no new space), and puts it in the status file's place with a rename,
the old status kept as the next spare through a second link to it (a name, no data). Only a status that
outgrows the spare needs new space; when that fails, the file is replaced by a new one (write, rename).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time
from typing import Any

_MAX_STATUS_BYTES = 64 * 1024
# A spare holds this much at least, and grows in doublings: a status that changes in size by a few
# devices' worth keeps its space.
_SPARE_BYTES = 4096


def status_file(run_dir: pathlib.Path, process: str) -> pathlib.Path:
    return run_dir / f"status-{process}.json"


def _spare_file(run_dir: pathlib.Path, process: str) -> pathlib.Path:
    return run_dir / f".status-{process}.spare"


def _write_over_spare(run_dir: pathlib.Path, process: str, content: bytes) -> None:
    """`content` as the status file, through the spare (module docstring)."""
    spare = _spare_file(run_dir, process)
    fd = os.open(spare, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size < len(content):
            size = max(_SPARE_BYTES, size)
            while size < len(content):
                size *= 2
            os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, content + b" " * (size - len(content)), 0)
    finally:
        os.close(fd)
    status = status_file(run_dir, process)
    old = run_dir / f".status-{process}.old"
    old.unlink(missing_ok=True)  # left by a process that died between the renames below
    try:
        os.link(status, old)
    except FileNotFoundError:
        pass  # the first status: no spare to keep
    os.rename(spare, status)
    if old.exists():
        os.rename(old, spare)


def write_status(run_dir: pathlib.Path, process: str, fields: dict[str, Any]) -> None:
    """Publish `fields` (plus pid and time stamps) as the process's status; errors are not fatal."""
    document = {"process": process, "pid": os.getpid(), "monotonic": time.monotonic(), "time": time.time(),
                **fields}
    content = json.dumps(document).encode()
    try:
        _write_over_spare(run_dir, process, content)
        return
    except OSError:
        pass  # no space for a larger spare: a new file, if there is room for it
    try:
        with tempfile.NamedTemporaryFile("w", dir=run_dir, prefix=f".status-{process}-", delete=False) as tmp:
            json.dump(document, tmp)
        os.chmod(tmp.name, 0o600)
        os.replace(tmp.name, status_file(run_dir, process))
    except OSError:
        # Status is for probes and operators; a full or read-only run dir must not stop the stack.
        try:
            os.unlink(tmp.name)
        except (OSError, UnboundLocalError):
            pass


def read_status(run_dir: pathlib.Path, process: str) -> dict[str, Any] | None:
    try:
        with open(status_file(run_dir, process), "rb") as handle:
            raw = handle.read(_MAX_STATUS_BYTES + 1)
        document = json.loads(raw) if len(raw) <= _MAX_STATUS_BYTES else None
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def remove_status(run_dir: pathlib.Path, process: str) -> None:
    for path in (status_file(run_dir, process), _spare_file(run_dir, process), run_dir / f".status-{process}.old"):
        try:
            path.unlink()
        except OSError:
            pass
