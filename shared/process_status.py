"""Small status files each process keeps in the run dir, for the watchdog's probes and the `status` command.

A file is replaced atomically (write, then rename), so a reader sees either
the old or the new content, never a mix. Readers treat a missing or broken
file as "no status".
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time
from typing import Any

_MAX_STATUS_BYTES = 64 * 1024


def status_file(run_dir: pathlib.Path, process: str) -> pathlib.Path:
    return run_dir / f"status-{process}.json"


def write_status(run_dir: pathlib.Path, process: str, fields: dict[str, Any]) -> None:
    """Publish `fields` (plus pid and time stamps) as the process's status; errors are not fatal."""
    document = {"process": process, "pid": os.getpid(), "monotonic": time.monotonic(), "time": time.time(),
                **fields}
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
    try:
        status_file(run_dir, process).unlink()
    except OSError:
        pass
