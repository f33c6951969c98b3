"""Private state of the simulated `rbln-smi`, shared by the stand-in and `SimulatedNode`.

The state is one JSON file, replaced atomically (temp file + os.replace) under an
flock on `state.lock`, so a reader never sees half a file and two writers never
lose each other's change. Every stand-in invocation appends one line to `calls.jsonl`.

Only the standard library's cheapest modules are imported: the stand-in runs on
every Allocate and its start-up time is part of the allocation latency.

State document:
    {"kmd_version": str, "lock_file": str, "dev_root": str,
     "devices": [{"entry": <rbln-smi JSON entry without group_id>, "hosts_vfs": bool}, ...],
     "hidden": [device name, ...],             # left out of rbln-smi output
     "groups": {"<gid>": [npu, ...], ...},     # RSD groups >= 1; group 0 is everything else
     "fault": null | {"kind": str, "commands": [str, ...], "delay": float}}
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms per call)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

STATE_FILE = "state.json"
CALLS_FILE = "calls.jsonl"
STATE_LOCK = "state.lock"
CHANGE_LOCK = "change.lock"
"""Held by a stand-in for the whole of a group change; failing to take it means two changes overlap."""

INVENTORY, GROUPS, DESTROY, CREATE = "inventory", "groups", "destroy", "create"
COMMANDS = (INVENTORY, GROUPS, DESTROY, CREATE)
"""Names of the four commands: `-j`, `-g -j`, `group -d`, `group -c`."""
GROUP_CHANGES = (DESTROY, CREATE)


def load(state_dir: str) -> dict[str, Any]:
    with open(os.path.join(state_dir, STATE_FILE), encoding="utf-8") as handle:
        return json.load(handle)


def save(state_dir: str, state: dict[str, Any]) -> None:
    """Replace the state file atomically. Callers that read-modify-write use `update` instead."""
    path = os.path.join(state_dir, STATE_FILE)
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=1)
    os.replace(temp, path)


@contextlib.contextmanager
def update(state_dir: str) -> Iterator[dict[str, Any]]:
    """Yield the state for modification and save it on normal exit, all under the state lock."""
    with exclusive(os.path.join(state_dir, STATE_LOCK)):
        state = load(state_dir)
        yield state
        save(state_dir, state)


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def append_call(state_dir: str, record: dict[str, Any]) -> None:
    # One write of one line on an O_APPEND descriptor: concurrent stand-ins do not interleave.
    line = (json.dumps(record) + "\n").encode("utf-8")
    fd = os.open(os.path.join(state_dir, CALLS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_calls(state_dir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(state_dir, CALLS_FILE), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def group_members(state: dict[str, Any]) -> dict[int, list[int]]:
    """gid -> npus; group 0 holds every device that is in no other group."""
    groups = {int(gid): sorted(npus) for gid, npus in state["groups"].items()}
    grouped = {npu for npus in groups.values() for npu in npus}
    default = sorted(d["entry"]["npu"] for d in state["devices"] if d["entry"]["npu"] not in grouped)
    return {0: default, **dict(sorted(groups.items()))}
