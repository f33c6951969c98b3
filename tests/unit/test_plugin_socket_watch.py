"""The worker's watch on its plugin sockets, with real inotify on real unix sockets in tmp_path."""

from __future__ import annotations

import errno
import os
import socket
import threading

import pytest
from loguru import logger

from resource_worker import plugin_socket_watch
from resource_worker.plugin_socket_watch import SocketWatch
from shared.fs import inotify

WAIT = 10.0


@pytest.fixture
def bound(tmp_path):
    """A listening unix socket at tmp_path/<name>, as a plugin server binds one."""
    sockets = []

    def bind(name: str):
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(tmp_path / name))
        server.listen()
        sockets.append(server)
        return tmp_path / name
    yield bind
    for server in sockets:
        server.close()


def test_unlinking_or_renaming_a_watched_socket_calls_its_listener_and_looking_at_it_does_not(bound, tmp_path):
    watch = SocketWatch()
    removed, renamed, barrier = threading.Event(), threading.Event(), threading.Event()
    first, second, third = bound("a.sock"), bound("b.sock"), bound("c.sock")
    assert watch.watch(first, removed.set) is not None
    assert watch.watch(second, renamed.set) is not None
    assert watch.watch(third, barrier.set) is not None
    first.stat()
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(first))  # as the kubelet dials it
    os.unlink(third)  # inotify keeps the order of events: once this one is heard, the others would have been
    assert barrier.wait(WAIT) and not removed.is_set() and not renamed.is_set()
    os.unlink(first)
    assert removed.wait(WAIT)
    os.rename(second, tmp_path / "elsewhere.sock")
    assert renamed.wait(WAIT)


def test_an_unwatched_socket_calls_nobody_and_a_missing_one_cannot_be_watched(bound, tmp_path):
    watch = SocketWatch()
    forgotten, barrier = threading.Event(), threading.Event()
    dropped, kept = bound("a.sock"), bound("b.sock")
    descriptor = watch.watch(dropped, forgotten.set)
    assert descriptor is not None
    watch.unwatch(descriptor)
    watch.unwatch(descriptor)  # twice (a stop after the kernel dropped the watch): harmless
    watch.watch(kept, barrier.set)
    os.unlink(dropped)
    os.unlink(kept)
    assert barrier.wait(WAIT) and not forgotten.is_set()
    assert watch.watch(tmp_path / "never-bound.sock", forgotten.set) is None


def test_without_an_inotify_instance_the_process_has_no_watch_and_says_so_once(monkeypatch):
    def used_up():
        raise OSError(errno.EMFILE, "Too many open files")

    records: list[tuple[str, str]] = []
    sink = logger.add(lambda m: records.append((m.record["level"].name, m.record["message"])), level="DEBUG")
    monkeypatch.setattr(inotify, "INotify", used_up)
    plugin_socket_watch.shared_watch.cache_clear()
    try:
        assert plugin_socket_watch.shared_watch() is None and plugin_socket_watch.shared_watch() is None
    finally:
        plugin_socket_watch.shared_watch.cache_clear()
        logger.remove(sink)
    assert records == [("WARNING", "Cannot watch the device plugin socket; looking at it every second")]
