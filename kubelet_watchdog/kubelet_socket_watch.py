"""Notices every new kubelet.sock: inotify for promptness, an identity check for missed events.

A kubelet that restarts deletes kubelet.sock and creates it again, and the new
socket often gets the inode number the old one just freed. So an inotify event
naming kubelet.sock counts by itself; the identity check (shared.kubelet.plugin_socket)
only covers events that were lost, such as a queue overflow or a directory that did not
exist yet.
"""

from __future__ import annotations

import pathlib

from loguru import logger

from shared.fs import inotify
from shared.fs.inotify import flags
from shared.kubelet.plugin_socket import socket_identity

KUBELET_SOCKET = "kubelet.sock"
_WATCHED = flags.CREATE | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF
_WATCH_GONE = flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF
_CREATED = flags.CREATE | flags.MOVED_TO

class KubeletSocketWatcher:
    """Selectable (fileno) watcher; `recreated()` consumes what happened since the last call. Without an inotify
    instance (the node's root has used up fs.inotify.max_user_instances) `fileno` is None and only the identity
    check at each call remains: the caller then calls it at a steady pace."""

    def __init__(self, plugin_dir: pathlib.Path):
        self._dir = plugin_dir
        self._socket = plugin_dir / KUBELET_SOCKET
        self._inotify: inotify.Inotify | None = None
        try:
            self._inotify = inotify.Inotify()
        except OSError as exc:
            logger.warning("Cannot watch the kubelet's socket directory; looking at kubelet.sock at every check",
                           path=str(plugin_dir), err=str(exc))
        self._watch: int | None = None
        self._ensure_watch()
        self._seen = socket_identity(self._socket)

    def _ensure_watch(self) -> None:
        if self._watch is None and self._inotify is not None:
            # None while the directory does not exist yet; the identity check covers it.
            self._watch = self._inotify.watch(self._dir, _WATCHED)

    def fileno(self) -> int | None:
        return self._inotify.fileno() if self._inotify is not None else None

    def recreated(self) -> bool:
        """True when a kubelet.sock was created since the last call and one exists now. Never blocks."""
        created = False
        for event in self._inotify.pending() if self._inotify is not None else ():
            if event.mask & _WATCH_GONE:
                self._watch = None  # the directory went away; watch the new one once it exists
            elif event.mask & _CREATED and event.name == KUBELET_SOCKET:
                created = True
        self._ensure_watch()
        current = socket_identity(self._socket)
        recreated = current is not None and (created or current != self._seen)
        self._seen = current
        return recreated

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
