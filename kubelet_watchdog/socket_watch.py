"""Notices every new kubelet.sock: inotify for promptness, a periodic inode check for missed events."""

from __future__ import annotations

import os
import pathlib

from inotify_simple import INotify, flags

_WATCHED = flags.CREATE | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF


def _identity(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class KubeletSocketWatcher:
    def __init__(self, plugin_dir: pathlib.Path):
        self._dir = plugin_dir
        self._socket = plugin_dir / "kubelet.sock"
        self._inotify = INotify()
        self._watch: int | None = None
        self._seen = _identity(self._socket)
        self._ensure_watch()

    def _ensure_watch(self) -> None:
        if self._watch is None:
            try:
                self._watch = self._inotify.add_watch(self._dir, _WATCHED)
            except OSError:
                self._watch = None  # the directory does not exist yet; the inode check covers it

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True when a kubelet.sock other than the last one seen exists."""
        if self._watch is not None:
            for event in self._inotify.read(timeout=int(timeout * 1000)):
                if event.mask & (flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF):
                    self._watch = None  # the directory went away; watch the new one when it exists
        else:
            self._inotify.read(timeout=int(timeout * 1000))
        self._ensure_watch()
        current = _identity(self._socket)
        recreated = current is not None and current != self._seen
        self._seen = current
        return recreated

    def close(self) -> None:
        self._inotify.close()
