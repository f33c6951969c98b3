"""NFD_FEATURE_FILE on disk: NFD's `local` feature-file format, written atomically (docs/node-labels.md).

The file is rewritten only when a label changes or when its expiry comes near: NFD ignores the labels
of a file whose `# +expiry-time` has passed, so labels of a stack that ended without removing the file
age out, while a live scanner renews them long before that. A directory that cannot be written (full,
read-only, missing) is reported once and retried on every scan; it never stops the scanner.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import time
from collections.abc import Callable, Mapping

from loguru import logger

from shared.fs.atomic_file import temp_path, write_atomically

# How long NFD keeps the labels of a file nobody renews (Rebellions' feature discovery uses one hour too).
LIFETIME_SECONDS = 3600.0
EXPIRY_DIRECTIVE = "# +expiry-time="
_HEADER = "# Node labels from the rbln-device-plugin scanner, for Node Feature Discovery's local source.\n"

WallClock = Callable[[], float]


def expiry_text(expires_at: float) -> str:
    """RFC 3339 in UTC, to the second: the form NFD's local source parses (Go's time.RFC3339)."""
    return datetime.datetime.fromtimestamp(int(expires_at), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(labels: Mapping[str, str], expires_at: float) -> str:
    lines = [_HEADER, f"{EXPIRY_DIRECTIVE}{expiry_text(expires_at)}\n"]
    lines += [f"{name}={value}\n" for name, value in labels.items()]
    return "".join(lines)


def parse(text: str) -> tuple[datetime.datetime | None, dict[str, str]]:
    """(expiry, labels) of a feature file, as NFD reads one: `name=value` lines (a bare name is `true`),
    `#` lines comments except the expiry directive."""
    expiry = None
    labels: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(EXPIRY_DIRECTIVE):
            expiry = datetime.datetime.strptime(line.removeprefix(EXPIRY_DIRECTIVE).strip(), "%Y-%m-%dT%H:%M:%S%z")
        elif line and not line.startswith("#"):
            name, _, value = line.partition("=")
            labels[name] = value if "=" in line else "true"
    return expiry, labels


def renewal_margin(lifetime: float, scan_interval: float) -> float:
    """Rewrite an unchanged file once less than this is left: half its lifetime, and never less than two
    scan intervals, so that a late scan still renews it in time."""
    return max(lifetime / 2, 2 * scan_interval)


def _identity(path: pathlib.Path) -> tuple[int, int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


class FeatureFile:
    """Keeps one feature file: `update` after every scan, `remove` at stop. Owned by the scanner's thread."""

    def __init__(self, path: pathlib.Path, scan_interval: float, lifetime: float = LIFETIME_SECONDS,
                 wall_clock: WallClock = time.time) -> None:
        self.path = path
        # Never shorter than four scans: a scan interval of hours still renews the file before it lapses.
        self._lifetime = max(lifetime, 4 * scan_interval)
        self._margin = renewal_margin(self._lifetime, scan_interval)
        self._wall_clock = wall_clock
        self._written: dict[str, str] | None = None
        self._expires_at = 0.0
        # The file as this keeper left it (inode, mtime, size): another writer or a deletion shows as a change.
        self._identity: tuple[int, int, int] | None = None
        self._failing = False
        self._overwrite_reported = False

    def update(self, labels: Mapping[str, str] | None) -> None:
        """Write `labels` when they differ from the file's or its expiry is near. None means the scan could
        not tell (discovery failed): the file keeps what it says, unrenewed, so a short failure does not
        flap the node's labels and a lasting one lets them age out."""
        now = self._wall_clock()
        if labels is None:
            return
        labels = dict(labels)
        if labels == self._written and self._expires_at - now > self._margin:
            if _identity(self.path) == self._identity:
                return
            if not self._overwrite_reported:
                # Two writers of one file (Rebellions' feature discovery too?) would flap the node's labels.
                logger.warning("Node feature file was changed or removed by something else; writing it again",
                               path=str(self.path))
                self._overwrite_reported = True
        expires_at = now + self._lifetime
        try:
            write_atomically(self.path, render(labels, expires_at).encode())
        except OSError as exc:
            if not self._failing:
                logger.error("Cannot write the node feature file; node labels are not kept until it can be written",
                             path=str(self.path), err=f"{exc.strerror or exc}")
            self._failing = True
            return
        if self._failing:
            logger.info("Node feature file written again", path=str(self.path))
        if labels != self._written:
            logger.info("Node labels updated", path=str(self.path), labels=labels)
        self._failing = False
        self._written = labels
        self._expires_at = expires_at
        self._identity = _identity(self.path)

    def remove(self) -> None:
        """At stop: the labels go with the stack, and so does a temp file a killed earlier keeper left."""
        try:
            temp_path(self.path).unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("Cannot remove the node feature file; its labels expire on their own",
                           path=str(self.path), err=f"{exc.strerror or exc}")
        self._written = None
