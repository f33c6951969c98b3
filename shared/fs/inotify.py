"""The one door to inotify (through inotify_simple): an instance, its watches, and its events read without
waiting or by a thread that does nothing else.

The kernel may refuse an instance (the node's root has used up fs.inotify.max_user_instances, which every
root container on the node shares) or a watch (the path is gone, or max_user_watches is used up). Neither
may stop a process: `Inotify()` raises OSError, which its user turns into a warning of its own and a steady
look at what it would have watched; `watch` gives None for a watch refused.
"""

from __future__ import annotations

import contextlib
import pathlib

from inotify_simple import Event, INotify, flags

__all__ = ["Event", "Inotify", "flags"]


class Inotify:
    """One inotify instance. Owned by one thread, but for `watch` and `unwatch`, which the kernel serialises."""

    def __init__(self) -> None:
        self._instance = INotify()

    def watch(self, path: pathlib.Path, mask: int) -> int | None:
        """Watch `path` for the events of `mask`; the watch's descriptor, or None when it is refused."""
        try:
            return self._instance.add_watch(path, mask)
        except OSError:
            return None

    def unwatch(self, descriptor: int) -> None:
        with contextlib.suppress(OSError):  # the kernel dropped it already: the file was deleted
            self._instance.rm_watch(descriptor)

    def fileno(self) -> int:
        """Readable when events are pending, for a caller that waits on several descriptors at once."""
        return self._instance.fileno()

    def pending(self) -> list[Event]:
        """The events since the last read; never blocks."""
        return self._instance.read(timeout=0)

    def wait(self) -> list[Event]:
        """The next events, waiting for them as long as it takes."""
        return self._instance.read()

    def close(self) -> None:
        self._instance.close()
