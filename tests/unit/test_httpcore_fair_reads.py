"""shared/fence/httpcore_fair_reads.py: httpcore2's HTTP/2 connections get a read lock that goes to its waiters in
turn, so that a thread whose reply another thread read is not kept from it by a reader that takes the lock back."""

from __future__ import annotations

import threading

from shared.fence.httpcore_fair_reads import FairLock, fair_reads
from tests.support.waiting import wait_until


class _Stream:
    def close(self) -> None:
        pass


def test_an_http2_connection_made_after_fair_reads_reads_under_a_fair_lock():
    import httpcore2
    from httpcore2._sync.http2 import HTTP2Connection

    fair_reads()
    fair_reads()  # idempotent: the lock is set once, by one wrapper
    connection = HTTP2Connection(httpcore2.URL("https://127.0.0.1:6443").origin, _Stream())  # type: ignore[arg-type]
    assert isinstance(connection._read_lock, FairLock)
    assert HTTP2Connection.__init__.__qualname__.startswith("fair_reads")


def test_a_waiter_gets_the_lock_before_its_holder_takes_it_back():
    lock = FairLock()
    order: list[str] = []
    lock.__enter__()  # the reader holds it, blocked in a read
    writer = threading.Thread(target=lambda: (lock.__enter__(), order.append("writer"), lock.__exit__()))
    writer.start()
    wait_until(lambda: lock._next_ticket == 2, 5, "the writer waits for the lock")
    lock.__exit__()  # the reader's read returned ...
    with lock:  # ... and it reads again at once: behind the writer
        order.append("reader")
    writer.join(5)
    assert order == ["writer", "reader"]


def test_waiters_get_the_lock_in_the_order_they_came():
    lock = FairLock()
    order: list[int] = []
    lock.__enter__()
    threads = []
    for index in range(5):
        threads.append(threading.Thread(target=lambda index=index: (lock.__enter__(), order.append(index),
                                                                      lock.__exit__())))
        threads[-1].start()
        wait_until(lambda index=index: lock._next_ticket == index + 2, 5, f"waiter {index} queued")
    lock.__exit__()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]
