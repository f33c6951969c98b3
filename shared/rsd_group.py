"""RSD groups: each allocation gets a fresh group holding exactly its devices (docs/node.md#rsd-groups-and-their-lock).

Group changes are serialised across every process on the node by an flock on
the RSD lock file. While the lock is held the first listing is authoritative,
so it is enough to both find the groups to destroy and choose the new group
id: list, destroy (only when needed), create - at most three rbln-smi calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pathlib
import time
from collections.abc import Iterator, Sequence

from shared import safe_open
from shared.config import RSD_LOCK_FILE_ENV
from shared.inventory import DeviceRecord
from shared.rbln_smi import RblnSmi, RblnSmiError, SmiUsage

DEFAULT_GROUP = 0
LOCK_TIMEOUT = 30.0
_LOCK_POLL_MIN = 0.005
_LOCK_POLL_MAX = 0.1


class RsdGroupError(RuntimeError):
    """The RSD group could not be (re)created; the message says why."""


@contextlib.contextmanager
def held_flock(lock_file: pathlib.Path, timeout: float, setting: str = RSD_LOCK_FILE_ENV,
               name: str = "RSD lock") -> Iterator[int]:
    """Hold an exclusive flock on `lock_file` and yield its descriptor; RsdGroupError if it is not
    free within `timeout`. `setting` (the variable that places the file) and `name` are for the messages.

    Each call opens the file anew, and flocks of two open files exclude each other: the lock serializes
    threads of one process as it does processes.

    The kernel drops the lock when the last descriptor of it closes: a holder that dies never
    wedges the node, except through a child it handed the descriptor to, which keeps the lock
    until it ends (see RblnSmi's group changes).
    """
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RsdGroupError(f"{setting} {lock_file}: cannot create its directory: "
                            f"{exc.strerror or exc}") from None
    try:
        # The descriptor goes to rbln-smi, run as root: only a plain file of the stack's user will do.
        fd = safe_open.open_file(lock_file, os.O_RDWR | os.O_CREAT, setting)
    except OSError as exc:
        raise RsdGroupError(str(exc)) from None
    try:
        deadline = time.monotonic() + timeout
        pause = _LOCK_POLL_MIN
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = f"{name} {lock_file} still held by another process after {timeout:g}s"
                    raise RsdGroupError(held) from None
                time.sleep(pause)
                pause = min(pause * 2, _LOCK_POLL_MAX)
        yield fd
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


@dataclasses.dataclass(frozen=True)
class GroupChange:
    group_id: int
    replaced: tuple[int, ...]
    """Groups destroyed because they held some of the devices."""
    smi: SmiUsage
    """The rbln-smi calls the change made."""


def next_group_id(used: set[int]) -> int:
    group_id = DEFAULT_GROUP + 1
    while group_id in used:
        group_id += 1
    return group_id


class RsdGroups:
    def __init__(self, smi: RblnSmi, lock_file: pathlib.Path, lock_timeout: float = LOCK_TIMEOUT):
        self._smi = smi
        self._lock_file = lock_file
        self._lock_timeout = lock_timeout

    def recreate(self, devices: Sequence[DeviceRecord]) -> GroupChange:
        """Put exactly `devices` into a new RSD group; the new group's id and what rbln-smi cost."""
        wanted = {device.bus_id.lower(): device for device in devices}
        usage = SmiUsage()
        smi = self._smi.counted(usage)
        try:
            with held_flock(self._lock_file, self._lock_timeout) as lock_fd:
                listing = smi.groups()
                members = {entry.bus_id.lower(): entry for entry in listing.devices if entry.bus_id.lower() in wanted}
                missing = [device.device_id for bus, device in wanted.items() if bus not in members]
                if missing:
                    raise RsdGroupError(f"rbln-smi does not list {', '.join(sorted(missing))}")
                stale = sorted({entry.group_id for entry in members.values()
                                if entry.group_id not in (None, DEFAULT_GROUP)})
                used = {entry.group_id for entry in listing.devices if entry.group_id is not None}
                if stale:
                    smi.destroy_groups(stale, lock_fd)
                group_id = next_group_id(used - set(stale))
                npus = [members[device.bus_id.lower()].npu for device in devices]
                smi.create_group(group_id, npus, lock_fd)
                return GroupChange(group_id, tuple(stale), usage)
        except RblnSmiError as exc:
            raise RsdGroupError(str(exc)) from None

    def destroy(self, group_id: int) -> SmiUsage:
        """Destroy group `group_id` if it still exists (another change may have replaced it); never group 0."""
        usage = SmiUsage()
        if group_id == DEFAULT_GROUP:
            return usage
        smi = self._smi.counted(usage)
        try:
            with held_flock(self._lock_file, self._lock_timeout) as lock_fd:
                if any(entry.group_id == group_id for entry in smi.groups().devices):
                    smi.destroy_groups([group_id], lock_fd)
                return usage
        except RblnSmiError as exc:
            raise RsdGroupError(str(exc)) from None
