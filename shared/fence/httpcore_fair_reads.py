"""HTTP/2 reads of httpcore2's sync client taken in turn, so that a watch and writes can share one connection
(worker-dra's only: `dra_worker/kube.py`).

worker-dra's watcher thread and its publisher thread use one HTTP/2 connection to the API server, as client-go
multiplexes an informer's watch and a controller's writes. httpcore2 lets one thread at a time read the
connection (its HTTP2Connection's `_read_lock`): whoever reads hands every frame to the stream it belongs to,
and a thread waiting for its response re-checks, once it has the lock, whether the reader already got it. That
lock is a plain `threading.Lock`, which CPython does not hand to a waiter: the watcher, whose stream is quiet,
releases it after each read and takes it back at once to block in the next read, and the writer waiting for a
response that has already arrived never gets the lock (measured: 50 publishers of 50 in one process stuck in a
GET of their Node for as long as the watch stayed quiet, every one of them; kube-apiserver 1.37).
`fair_reads()` gives every HTTP/2 connection created from then on a read lock that goes to its waiters in the
order they came: the writer gets it when the watcher lets go, sees its response and lets go in turn.

It replaces `HTTP2Connection._read_lock`, set in its `__init__`: httpcore2's internals. Checked against httpcore2
2.16.2 (`CHECKED_AGAINST`, pinned exactly in pyproject.toml and the lock); on another release the attribute may
be gone or used otherwise, which tests/unit/test_fence.py shows (the lock is checked to be in place and to
serve a waiting writer while another thread reads).
"""

from __future__ import annotations

import threading
import types
from typing import Any

CHECKED_AGAINST = ("httpcore2", "2.16.2")
_INSTALLED = "_rbln_fair_reads"


class FairLock:
    """A lock its waiters get in the order they asked (a ticket lock); not reentrant, as the lock it replaces."""

    def __init__(self) -> None:
        self._turns = threading.Condition(threading.Lock())  # guards _next_ticket and _serving
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> FairLock:
        with self._turns:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._turns.wait()
        return self

    def __exit__(self, exc_type: type[BaseException] | None = None, exc_value: BaseException | None = None,
                 traceback: types.TracebackType | None = None) -> None:
        with self._turns:
            self._serving += 1
            self._turns.notify_all()


def fair_reads() -> None:
    """Every HTTP/2 connection of httpcore2's sync client made from now on reads in turn (idempotent)."""
    from httpcore2._sync.http2 import HTTP2Connection

    if getattr(HTTP2Connection, _INSTALLED, False):
        return
    original = HTTP2Connection.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._read_lock = FairLock()

    HTTP2Connection.__init__ = init  # type: ignore[method-assign]
    setattr(HTTP2Connection, _INSTALLED, True)
