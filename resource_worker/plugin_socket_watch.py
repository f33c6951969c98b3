"""Notices a plugin instance's socket file being removed, without looking at it again and again.

The kubelet removes the sockets of its plugin directory when it restarts, and anything else with access to
the directory may remove one at any time; the instance has to serve on a new socket then. An inotify watch
on the socket file itself reports its unlinking (a change of its link count: IN_ATTRIB) and its renaming:
one inotify instance and one thread per process, asleep in read() while nothing happens. Its listeners get
no details: each looks at its socket again.
"""

from __future__ import annotations

import functools
import pathlib
import threading
from collections.abc import Callable

from loguru import logger

from shared.fs import inotify
from shared.fs.inotify import flags

_WATCHED = flags.ATTRIB | flags.DELETE_SELF | flags.MOVE_SELF


class SocketWatch:
    def __init__(self) -> None:
        self._inotify = inotify.Inotify()
        # Guards `_listeners` (watch descriptor -> listener), changed by the lifecycle loop, read by the thread.
        self._lock = threading.Lock()
        self._listeners: dict[int, Callable[[], None]] = {}
        threading.Thread(target=self._run, name="socket-watch", daemon=True).start()

    def watch(self, path: pathlib.Path, listener: Callable[[], None]) -> int | None:
        """Call `listener` (from the watch's thread) whenever `path` may have gone; the watch's descriptor, or
        None when it cannot be watched (gone already, or the user's inotify watches used up)."""
        descriptor = self._inotify.watch(path, _WATCHED)
        if descriptor is None:
            return None
        with self._lock:
            self._listeners[descriptor] = listener
        return descriptor

    def unwatch(self, descriptor: int) -> None:
        with self._lock:
            self._listeners.pop(descriptor, None)
        self._inotify.unwatch(descriptor)

    def _run(self) -> None:
        while True:
            events = self._inotify.wait()
            with self._lock:
                listeners = {self._listeners.get(event.wd) for event in events}
            for listener in listeners:
                if listener is not None:
                    listener()


@functools.cache
def shared_watch() -> SocketWatch | None:
    """The process's one watch, made at first use (by the first plugin instance); None if the
    process can have no inotify instance (the user's limit is reached): its instances are looked at instead.
    Plugin instances are made by the lifecycle loop's thread alone, so it is tried once."""
    try:
        return SocketWatch()
    except OSError as exc:
        logger.warning("Cannot watch the device plugin socket; looking at it every second", err=str(exc))
        return None
