"""What a node shows of the stack's and the rbln-smi stand-in's work: status files, scans, RSD groups."""

from __future__ import annotations

import fcntl
import pathlib
import time

from shared.channels import status_files
from simulator.node import SimulatedNode
from simulator.smi_state import CHANGE_LOCK
from tests.support.waiting import wait_until


def change_in_progress(node: SimulatedNode) -> bool:
    """Whether the stand-in is making a group change now (it holds its change lock meanwhile; a
    change is only written to its call log once it has ended)."""
    change_lock = node.state_dir / CHANGE_LOCK
    return change_lock.exists() and not lock_is_free(change_lock)


def process_pid(node, process: str) -> int | None:
    status = status_files.read_status(node.run_dir, process)
    return status["pid"] if status else None


def await_scans(node, count: int = 2, timeout: float = 20.0) -> None:
    """Return once `count` scans have completed after now (the scanner rewrites its status file each scan)."""
    since = time.monotonic()
    for _ in range(count):
        def scanned_after(moment=since):
            status = status_files.read_status(node.run_dir, "scanner")
            return status["monotonic"] if status and status["monotonic"] > moment else None
        since = wait_until(scanned_after, timeout, "a scan")


def non_default_groups(node) -> dict[int, list[int]]:
    return {gid: npus for gid, npus in node.rsd_groups().items() if gid != 0}


def lock_is_free(lock_file: pathlib.Path) -> bool:
    """Whether nobody holds the flock: a fresh open file description conflicts with any holder's."""
    with open(lock_file, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True
