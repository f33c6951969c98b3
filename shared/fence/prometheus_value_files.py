"""The value files the stack's processes record their events in, written without prometheus_client.

The layout is prometheus_client's multiprocess one, which the process serving `/metrics` reads with
prometheus_client itself (kubelet_watchdog/metrics_files.py): a file starts with the bytes in use (a native
int32) and four bytes of padding; then come entries, each the length of its key (int32), the key in UTF-8
padded with spaces to the next multiple of 8 (at least one space), and two doubles: the value and a timestamp
(always 0 here). A key is the JSON list [family name, sample name, labels, help] with its keys sorted. An
entry is written whole before the count of bytes in use covers it, so a reader never sees half of one.
The recording processes (scanner, workers, worker-dra) thus never import prometheus_client, whose package
brings an HTTP server, email and wsgiref with it. Measured for issue 36 (2-core machine, Python 3.11,
prometheus_client's writer modules imported after each process's own): the scanner would grow by 6.2 MiB of
Rss (3.2 MiB of Pss) and 25-32 ms of import, a worker by 2.3 MiB (1.8 MiB of Pss; gRPC already brings some
of the same standard library) and about 27 ms: 8.5 MiB of the one-resource tree's Rss, and both imports on
the way to the worker's first Register (the scanner's first scan starts the worker). `ProcessFiles` lays
the families out as prometheus_client's Counter and Histogram do (tests/unit/test_prometheus_value_files.py holds the
two writers to the same bytes).

A file is memory-mapped: a store into a page the file system cannot back (a full memory-backed run dir: a
file only extended, never allocated) would kill the process with SIGBUS, outside any `try`. So every byte of
a file is allocated (posix_fallocate) before it is mapped or the file grows, and a file that cannot have
its space is an OSError (ENOSPC, EROFS, ...) raised where the value is written, which the recorder reports
and drops (shared/observability/metrics.py).

What it buys, measured on the stack as a node runs it (bench/stack_lifecycle.py --quick, 8-PF node, two runs
as it is and two with the recording processes importing prometheus_client as its own multiprocess values would;
a 2-core machine shared with other work): the stack's Rss 186.9 -> 198.3-199.0 MiB and Pss 107-110 ->
114.6-117.6 MiB with prometheus_client in them: the scanner 7.5 MiB Rss more (4.1-4.3 MiB Pss), worker-npu
3.8-3.9 MiB (workers without devices record nothing and load neither). One process importing the recorder:
39.0 ms of CPU and 15.2 MiB Rss as it is, 75.9 ms and 23.5 MiB with prometheus_client (median of 15). The
writing itself (a store into a mapped page either way) was not measured apart.
Checked against prometheus_client 0.26.0 (`CHECKED_AGAINST`, pinned exactly in pyproject.toml and the lock):
tests/unit/test_prometheus_value_files.py holds the two writers to the same bytes.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import pathlib
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING

from shared.observability.metric_kinds import Kind

if TYPE_CHECKING:
    from shared.observability.metrics import Family

# The version whose file format this module writes (shared/fence/__init__.py).
CHECKED_AGAINST = ("prometheus_client", "0.26.0")
INITIAL_SIZE = 1 << 16
_HEADER_BYTES = 8
_USED = struct.Struct("i")
_LENGTH = struct.Struct("i")
_VALUE = struct.Struct("dd")


def key(family: str, sample: str, labels: Mapping[str, str], help_text: str) -> str:
    return json.dumps([family, sample, dict(labels), help_text], sort_keys=True)


def _entry(encoded_key: bytes) -> bytes:
    padding = b" " * (8 - (len(encoded_key) + _LENGTH.size) % 8)
    return _LENGTH.pack(len(encoded_key)) + encoded_key + padding + _VALUE.pack(0.0, 0.0)


class ValueFile:
    """One process's file of values by key, mapped into memory. Not thread-safe: its owner holds a lock."""

    def __init__(self, path: pathlib.Path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            try:
                os.posix_fallocate(fd, 0, size or INITIAL_SIZE)
            except OSError:
                if size == 0:
                    path.unlink(missing_ok=True)
                raise
            self._capacity = size or INITIAL_SIZE
            self._map = mmap.mmap(fd, self._capacity)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._positions: dict[str, int] = {}  # where each key's value is
        self._used = _USED.unpack_from(self._map, 0)[0]
        if self._used == 0:
            self._used = _HEADER_BYTES
            self._map[0:_USED.size] = _USED.pack(self._used)
        self._index()

    def _index(self) -> None:
        """The keys of a file an earlier process of this pid left (a pid used again before the fold)."""
        position = _HEADER_BYTES
        while position < self._used:
            length = _LENGTH.unpack_from(self._map, position)[0]
            position += _LENGTH.size
            name = self._map[position:position + length].decode("utf-8")
            position += length + 8 - (length + _LENGTH.size) % 8
            self._positions[name] = position
            position += _VALUE.size

    def _position(self, name: str) -> int:
        position = self._positions.get(name)
        if position is None:
            entry = _entry(name.encode("utf-8"))
            if self._used + len(entry) > self._capacity:
                self._grow(self._used + len(entry))
            self._map[self._used:self._used + len(entry)] = entry
            self._used += len(entry)
            self._map[0:_USED.size] = _USED.pack(self._used)
            position = self._positions[name] = self._used - _VALUE.size
        return position

    def _grow(self, needed: int) -> None:
        capacity = self._capacity
        while capacity < needed:
            capacity *= 2
        os.posix_fallocate(self._fd, 0, capacity)  # refused: the file and its map stay as they were
        self._map.close()
        self._map = mmap.mmap(self._fd, capacity)
        self._capacity = capacity

    def add(self, name: str, amount: float) -> None:
        """Add to the key's value (a new key starts at 0: adding 0 makes its series)."""
        position = self._position(name)
        self._store(position, _VALUE.unpack_from(self._map, position)[0] + amount)

    def set(self, name: str, value: float) -> None:
        self._store(self._position(name), value)

    def _store(self, position: int, value: float) -> None:
        # Both doubles in one copy, never a field at a time (a reader could see a zero in between).
        self._map[position:position + _VALUE.size] = _VALUE.pack(value, 0.0)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def _le(bound: float) -> str:
    """A bucket's `le` label as the exposition writes it (Go's float format, for the bounds used here)."""
    return "+Inf" if bound == math.inf else repr(float(bound))


class ProcessFiles:
    """One process's event families in its value files (`counter_<pid>.db`, `histogram_<pid>.db`), each file
    made at its first write; the series of the families as prometheus_client's Counter and Histogram make
    them, so that the scrape reads them as it would read that client's own files."""

    def __init__(self, directory: pathlib.Path, pid: int):
        self._directory = directory
        self._pid = pid
        self._files: dict[Kind, ValueFile] = {}
        self._keys: dict[tuple[Family, tuple[str, ...]], tuple[str, ...]] = {}

    def _file(self, kind: Kind) -> ValueFile:
        file = self._files.get(kind)
        if file is None:
            # prometheus_client's name for a kind's file.
            file = self._files[kind] = ValueFile(self._directory / f"{kind.value}_{self._pid}.db")
        return file

    def _series(self, family: Family, labels: tuple[str, ...]) -> tuple[str, ...]:
        """The keys of one series, made (at zero) in its file the first time: a counter's value; a histogram's
        sum, then one bucket per bound and +Inf (each holding only its own observations)."""
        keys = self._keys.get((family, labels))
        if keys is None:
            named = dict(zip(family.labels, labels, strict=True))
            if family.kind is Kind.COUNTER:
                keys = (key(family.name.removesuffix("_total"), family.name, named, family.help),)
            elif family.kind is Kind.HISTOGRAM:
                keys = (key(family.name, f"{family.name}_sum", named, family.help),
                        *(key(family.name, f"{family.name}_bucket", {**named, "le": _le(bound)}, family.help)
                          for bound in (*family.buckets, math.inf)))
            else:
                raise ValueError(f"{family.name} is a {family.kind.value}: state families are derived, never "
                                 "recorded")
            file = self._file(family.kind)
            for name in keys:
                file.add(name, 0.0)
            self._keys[(family, labels)] = keys
        return keys

    def touch(self, family: Family, *labels: str) -> None:
        self._series(family, labels)

    def inc(self, family: Family, *labels: str, amount: float = 1.0) -> None:
        self._file(Kind.COUNTER).add(self._series(family, labels)[0], amount)

    def observe(self, family: Family, seconds: float, *labels: str) -> None:
        sum_key, *bucket_keys = self._series(family, labels)
        file = self._file(Kind.HISTOGRAM)
        file.add(sum_key, seconds)
        bounds = (*family.buckets, math.inf)
        file.add(next(bucket for bucket, bound in zip(bucket_keys, bounds, strict=True) if seconds <= bound), 1.0)
