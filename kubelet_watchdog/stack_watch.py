"""What tells the watchdog that the stack's state may have changed, so that an idle stack costs it (and
supervisord) next to nothing between the kubelet's probes:

- `StatusFiles`: the processes' status files, each reread only when it was replaced (its identity changed),
  with an inotify watch on the run dir that becomes readable when one is;
- `ProgramExits`: a pidfd per program supervisord last reported running, readable once any of them exits,
  so that the watchdog asks supervisord again at once instead of every few seconds.

Neither is trusted alone: the watchdog still asks supervisord at a steady interval (kubelet_watchdog.main),
which covers a lost event, and judges the status files it reads as before.
"""

from __future__ import annotations

import os
import pathlib
import select
from collections.abc import Iterable, Mapping
from typing import Any

from loguru import logger

from shared.channels import status_files
from shared.channels.status_records import Document
from shared.fs import inotify
from shared.fs.inotify import flags

# A status file is put in place by a rename (shared/channels/status_files.py); a new file by a write. An overflowed
# queue or a watch that went away says nothing about which file changed: every file is stat'ed again anyway.
_WATCHED = flags.MOVED_TO | flags.CLOSE_WRITE
_STATUS_PREFIX = "status-"
_Identity = tuple[int, int, int, int, int]


def _identity(path: pathlib.Path) -> _Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _run_dir_watch(run_dir: pathlib.Path) -> inotify.Inotify | None:
    try:
        watch = inotify.Inotify()
    except OSError as exc:
        err = str(exc)
    else:
        if watch.watch(run_dir, _WATCHED) is not None:
            return watch
        watch.close()
        err = "the watch was refused"
    logger.warning("Cannot watch the run dir for status changes; judging the stack every check instead",
                   path=str(run_dir), err=err)
    return None


class StatusFiles:
    """The status documents of the run dir's processes as last read; `fileno` is readable when a status file
    was replaced since `changed()` was last called. Without an inotify instance (the node's root has used up
    fs.inotify.max_user_instances, which every root container shares) `watching` is False and `fileno` None:
    the watchdog then judges the files at every check instead of dying at start."""

    def __init__(self, run_dir: pathlib.Path):
        self._run_dir = run_dir
        self._inotify = _run_dir_watch(run_dir)
        # Per process: the identity of its file when last read, and what it held.
        self._read: dict[str, tuple[_Identity | None, Document | None]] = {}

    @property
    def watching(self) -> bool:
        return self._inotify is not None

    def fileno(self) -> int | None:
        return self._inotify.fileno() if self._inotify is not None else None

    def changed(self) -> bool:
        """Whether any status file was replaced since the last call (the events are consumed). Never blocks."""
        if self._inotify is None:
            return False
        return any(event.mask & flags.Q_OVERFLOW or event.name.startswith(_STATUS_PREFIX)
                   for event in self._inotify.pending())

    def read(self, process: str) -> Document | None:
        """The document of `process`'s status file (shared.channels.status_files.read_status), read again only when the
        file is not the one last read."""
        identity = _identity(status_files.status_file(self._run_dir, process))
        known = self._read.get(process)
        if identity is not None and known is not None and known[0] == identity:
            return known[1]
        document = status_files.read_status(self._run_dir, process)
        self._read[process] = (identity, document)
        return document

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()


class ProgramExits:
    """Watches the programs of a table from supervisord (getAllProcessInfo by name) that were running."""

    def __init__(self) -> None:
        self._pidfds: list[int] = []

    def watch(self, programs: Mapping[str, Mapping[str, Any]], skip: Iterable[int] = ()) -> bool:
        """Watch every RUNNING program's pid of `programs` but those of `skip`, instead of the ones before. False
        when one of them has already exited (supervisord's table is out of date) or cannot be watched: nothing
        is watched then."""
        self.close()
        skipped = set(skip)
        for info in programs.values():
            pid = info.get("pid")
            if info.get("statename") != "RUNNING" or not isinstance(pid, int) or pid <= 0 or pid in skipped:
                continue
            try:
                self._pidfds.append(os.pidfd_open(pid))
            except OSError:
                # Gone already (ProcessLookupError), or no pidfds here (a kernel before 5.3, a seccomp profile
                # that refuses pidfd_open): the watchdog then reads supervisord's table every CHECK_INTERVAL.
                self.close()
                return False
        if self._pidfds and select.select(self._pidfds, [], [], 0)[0]:
            self.close()
            return False
        return True

    def filenos(self) -> list[int]:
        return list(self._pidfds)

    def exited(self, readable: Iterable[int]) -> bool:
        """Whether a watched program has exited, `readable` being what select said of the descriptors; a
        pidfd is readable once its process has exited."""
        return not set(self._pidfds).isdisjoint(readable)

    def close(self) -> None:
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds = []
