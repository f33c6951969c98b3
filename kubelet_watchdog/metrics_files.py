"""The event metrics every process of the stack writes: its value files in the metrics directory, added up
for a scrape.

Each process writes files of its own, named by kind and pid (`counter_<pid>.db`, `histogram_<pid>.db`;
prometheus_client's multiprocess layout). A restarted worker starts new files under its new pid while the
old ones stay: their counts still happened. So that restarts never make the directory, and the time of a
scrape, grow without end, the files of processes that have ended are folded into one archive per kind
(`counter_archive.db`, ...) at the next scrape: what they count is kept exactly once. The gauge files of an
ended process, were there any, are dropped: a dead process's gauges describe nothing now.
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Callable, Iterable

from loguru import logger
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from shared.fence import prometheus_value_files

ARCHIVE = "archive"
_GAUGE_PREFIX = "gauge_"


def file_pid(path: pathlib.Path) -> int | None:
    """The pid a value file belongs to (`histogram_1234.db`, `gauge_livesum_1234.db`); None for an archive."""
    last = path.stem.rsplit("_", 1)[-1]
    return int(last) if last.isdigit() else None


def is_running(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie not yet reaped still does: it is folded later)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True


class ProcessFilesCollector:
    """A prometheus_client collector over the metrics directory; folds ended processes' files first."""

    def __init__(self, directory: pathlib.Path, running: Callable[[int], bool] = is_running):
        self._directory = directory
        self._running = running
        # Held by a collection from listing the files to reading them: a fold renames and deletes files.
        self._lock = threading.Lock()
        self._broken: set[str] = set()  # files already reported unreadable
        self._fold_failing = False  # reported; the next fold that works is reported too

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            files = sorted(self._directory.glob("*.db"))
            ended = [path for path in files if (pid := file_pid(path)) is not None and not self._running(pid)]
            if ended:
                try:
                    self._fold(ended)
                except OSError as exc:  # a full run dir: the files stay and are counted as they are
                    if not self._fold_failing:
                        logger.warning("Cannot fold the metrics of ended processes", path=str(self._directory),
                                       err=str(exc))
                    self._fold_failing = True
                else:
                    if self._fold_failing:
                        logger.info("Metrics of ended processes folded again", path=str(self._directory))
                    self._fold_failing = False
                files = sorted(self._directory.glob("*.db"))
            return self._merge(files, accumulate=True)

    def _merge(self, files: list[pathlib.Path], accumulate: bool) -> list[Metric]:
        """The merged families of `files`, leaving out (and reporting once) any file that cannot be read."""
        try:
            return list(MultiProcessCollector.merge([str(path) for path in files], accumulate=accumulate))
        except Exception:  # a damaged file can fail its parse in any way (struct, JSON, UTF-8, a short read)
            readable = [path for path in files if self._readable(path)]
            return list(MultiProcessCollector.merge([str(path) for path in readable], accumulate=accumulate))

    def _readable(self, path: pathlib.Path) -> bool:
        try:
            MultiProcessCollector.merge([str(path)])
            return True
        except Exception as exc:
            if path.name not in self._broken:
                self._broken.add(path.name)
                logger.warning("Metrics file cannot be read; leaving it out", path=str(path),
                               err=f"{type(exc).__name__}: {exc}")
            return False

    def _fold(self, ended: list[pathlib.Path]) -> None:
        by_kind: dict[str, list[pathlib.Path]] = {}
        for path in ended:
            if path.name.startswith(_GAUGE_PREFIX):
                path.unlink(missing_ok=True)
            else:
                by_kind.setdefault(path.name.split("_", 1)[0], []).append(path)
        for kind, paths in by_kind.items():
            archive = self._directory / f"{kind}_{ARCHIVE}.db"
            merged = self._merge(paths + ([archive] if archive.exists() else []), accumulate=False)
            # Written beside the archive under a name no collection reads, then put in its place at once.
            partial = self._directory / f".{kind}_{ARCHIVE}.partial"
            partial.unlink(missing_ok=True)
            table = prometheus_value_files.ValueFile(partial)
            try:
                for metric in merged:
                    for sample in metric.samples:
                        key = prometheus_value_files.key(metric.name, sample.name, sample.labels, metric.documentation)
                        table.set(key, sample.value)
            finally:
                table.close()
            os.replace(partial, archive)
            for path in paths:
                path.unlink(missing_ok=True)
