"""Counts the kubelet's open ListAndWatch streams and notices when it drops one."""

from __future__ import annotations

import threading
from collections.abc import Callable


class StreamTracker:
    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        # Guards the two counters; notified on every change.
        self._changed = threading.Condition()
        self._open = 0
        self._dropped = 0

    def opened(self) -> None:
        with self._changed:
            self._open += 1
            self._changed.notify_all()

    def closed(self, by_kubelet: bool) -> None:
        with self._changed:
            self._open -= 1
            if by_kubelet:
                self._dropped += 1
            self._changed.notify_all()
        self._on_change()

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
