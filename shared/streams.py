"""Counts open gRPC server streams (the kubelet's ListAndWatch streams, worker-dra's health streams), bounds them, and
notices when the kubelet drops one."""

from __future__ import annotations

import threading
from collections.abc import Callable

# Each open stream holds one of the server's handler threads for its whole life. The kubelet keeps
# one (two for a moment while it replaces it); the bound keeps a client that opens streams without
# end from taking every thread and starving Allocate.
MAX_OPEN_STREAMS = 4


class StreamTracker:
    def __init__(self, on_change: Callable[[], None] = lambda: None, limit: int = MAX_OPEN_STREAMS) -> None:
        self._on_change = on_change
        self._limit = limit
        # Guards the two counters; notified on every change.
        self._changed = threading.Condition()
        self._open = 0
        self._dropped = 0

    def try_open(self) -> bool:
        """Count a new stream, unless `limit` are open already (then False: the stream must be refused)."""
        with self._changed:
            if self._open >= self._limit:
                return False
            self._open += 1
            self._changed.notify_all()
            return True

    def closed(self, by_kubelet: bool) -> None:
        with self._changed:
            self._open -= 1
            if by_kubelet:
                self._dropped += 1
            self._changed.notify_all()
        self._on_change()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def open_streams(self) -> int:
        with self._changed:
            return self._open

    def take_dropped(self) -> bool:
        """True (once) if the kubelet ended a stream and none is open now: the worker must register again."""
        with self._changed:
            dropped = self._dropped > 0 and self._open == 0
            if dropped:
                self._dropped = 0
            return dropped
