"""The driver's device lifecycle status, as read from sysfs: one enum, one parser, one reader
(docs/node.md#driver-status).

`$SYSFS_ROOT/class/rebellions/<device>/status` holds an integer. A file that is
missing, unreadable or malformed gives an UNREADABLE reading: that is not a
status of the device, only the absence of one, and the health policy treats it so.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import re
import stat

# A status file holds a few digits; anything longer is junk, and reading a
# huge file must not cost memory or time.
MAX_STATUS_BYTES = 64
_INTEGER = re.compile(rb"[+-]?[0-9]+")
# The inventory message carries the code as a msgpack int64, and no driver
# writes a number beyond it: such a file is malformed, not an unknown status.
_CODES = range(-(2**63), 2**63)


class KernelStatus(enum.IntEnum):
    READY = 0
    BUSY = 1
    PROBING = 2
    INIT = 3
    FAULT = 4
    FINISH = 5


@dataclasses.dataclass(frozen=True)
class StatusReading:
    """One read of a status file. `code` is None when nothing numeric could be read."""

    code: int | None
    problem: str | None = dataclasses.field(default=None, compare=False)
    """Why a file that is there could not be read (a missing one is no problem: VFs have none)."""

    @property
    def readable(self) -> bool:
        return self.code is not None

    @property
    def ready(self) -> bool:
        return self.code == KernelStatus.READY

    @property
    def name(self) -> str:
        """READY, BUSY, ... for known codes, UNKNOWN(n) for others, UNREADABLE without a code."""
        if self.code is None:
            return "UNREADABLE"
        try:
            return KernelStatus(self.code).name
        except ValueError:
            return f"UNKNOWN({self.code})"


UNREADABLE = StatusReading(None)


def parse_status(raw: bytes) -> StatusReading:
    """Parse a status file's bytes: an optionally signed decimal integer, ASCII whitespace trimmed."""
    if len(raw) > MAX_STATUS_BYTES:
        return UNREADABLE
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        return UNREADABLE
    code = int(text)
    return StatusReading(code) if code in _CODES else UNREADABLE


def status_path(sysfs_root: pathlib.Path, device_id: str) -> pathlib.Path:
    return sysfs_root.joinpath("class", "rebellions", device_id, "status")  # one join: every device, every scan


def read_status(sysfs_root: pathlib.Path, device_id: str) -> StatusReading:
    """Read one device's status; never raises. `device_id` must be a validated device name."""
    path = status_path(sysfs_root, device_id)
    try:
        # Non-blocking: a FIFO in place of the file must not stall a scan or an Allocate.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return UNREADABLE
    except OSError as exc:  # ELOOP for a link loop, EACCES, ...
        return StatusReading(None, f"cannot read {path}: {exc.strerror or exc}")
    try:
        # Only a regular file is read: a FIFO or a device in its place would block or feed without end.
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return StatusReading(None, f"{path} is not a regular file")
        raw = os.read(fd, MAX_STATUS_BYTES + 1)
    except OSError as exc:  # EIO from a failing driver
        return StatusReading(None, f"cannot read {path}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    reading = parse_status(raw)
    if not reading.readable:
        return StatusReading(None, f"{path} holds no status code")
    return reading
