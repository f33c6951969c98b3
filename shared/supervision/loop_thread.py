"""An asyncio loop in a thread of its own, one per process: the watchdog's ports and a worker's gRPC server
run on it, and any other thread hands it coroutines with `call`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
# A coroutine handed over (a server's start or stop) is done in milliseconds; past this it is stuck.
_CALL_TIMEOUT_SECONDS = 30.0


class LoopThread:
    """The loop, running in its daemon thread; `call` runs a coroutine on it and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="serving-loop", daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(_CALL_TIMEOUT_SECONDS)


_shared: LoopThread | None = None
_shared_lock = threading.Lock()  # guards _shared, made by the first to need it


def shared_loop() -> LoopThread:
    """The process's loop thread."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LoopThread()
        return _shared
