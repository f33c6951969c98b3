"""prometheus_client's value files with their space reserved before it is used.

A value file is memory-mapped: a store into a page the file system cannot back (a full memory-backed run
dir: the file was only extended, never allocated) kills the process with SIGBUS, outside any `try`. So
every byte of a file is allocated (posix_fallocate) before it is mapped or the file grows, and a file
that cannot have its space is an OSError (ENOSPC, EROFS, ...) raised where the event is recorded, which
the recorder reports and drops (shared/metrics.py).
"""

from __future__ import annotations

import os

from prometheus_client import mmap_dict, values


def _entry_bytes(key: str) -> int:
    """The bytes MmapedDict appends for a new key: its length, the key padded to 8 bytes, two doubles."""
    encoded = len(key.encode("utf-8"))
    return 4 + encoded + (8 - (encoded + 4) % 8) + 16


class ReservedMmapedDict(mmap_dict.MmapedDict):
    def __init__(self, filename: str, read_mode: bool = False):
        if not read_mode:
            _reserve_file(filename)
        super().__init__(filename, read_mode)

    def _init_value(self, key: str) -> None:
        capacity = self._capacity
        while self._used + _entry_bytes(key) > capacity:
            capacity *= 2
        if capacity != self._capacity:
            os.posix_fallocate(self._f.fileno(), 0, capacity)
        super()._init_value(key)


def _reserve_file(filename: str) -> None:
    """Allocate the file's blocks: its size, or the initial size of a new file (removed again on failure)."""
    fd = os.open(filename, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            os.posix_fallocate(fd, 0, size or mmap_dict._INITIAL_MMAP_SIZE)
        except OSError:
            if size == 0:
                os.unlink(filename)
            raise
    finally:
        os.close(fd)


def install() -> None:
    """Make prometheus_client's multiprocess values use reserved files (it names the class at each new file)."""
    values.MmapedDict = ReservedMmapedDict  # type: ignore[misc]
