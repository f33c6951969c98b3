"""The prepared claims, on disk in the plugin's data dir, under a file lock: read at every call, replaced
atomically on change (docs/dra.md#the-checkpoint).

A restart of the worker or of the whole stack finds every claim it prepared, so a later Unprepare undoes it
and a repeated Prepare gives the same answer. Two instances on one node (a surge upgrade) share the file: each
reads and changes it only while it holds the flock on `serialize.lock` beside it, so neither ever acts on what
the other has changed since. The format is this project's own (the Go driver's checksum is Go-specific):
`{"version": 2, "claims": {"<uid>": PreparedClaim}}`; version 1, the same without `rebuilt`, is migrated.

A file that cannot stop the node: one that cannot be read or understood (truncated, corrupt, another version or
program) is moved aside for a person, and the claims are rebuilt from what the node still shows (the caller's
`rebuild`: the claims' CDI specs and the RSD groups).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

from loguru import logger

from shared.atomic_file import write_atomically
from shared.rsd_group import RsdGroupError, held_flock

VERSION = 2
_MIGRATED = (1,)
"""Older versions read as they are: version 2 only added `rebuilt`, false before."""
FILE_NAME = "checkpoint.json"
LOCK_NAME = "serialize.lock"
# A call waits this long at most for another to finish with the checkpoint: two waits and the work itself
# stay well inside the kubelet's 45 s per call.
LOCK_TIMEOUT = 15.0
_MAX_BYTES = 16 * 1024 * 1024


class CheckpointError(RuntimeError):
    """The checkpoint cannot be read or written; the message names the file and why."""


class UnreadableCheckpoint(CheckpointError):
    """The file is there but is no checkpoint of a version this worker reads."""


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    device: str
    requests: tuple[str, ...]
    cdi_device_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    rsd_group: int | None
    """The claim's RSD group; None for a claim with no device of this driver."""
    rebuilt: bool = False
    """Rebuilt from the node after the checkpoint was lost: its devices and group are known, its name and the
    requests its devices serve come from the claim at its next Prepare."""
    admin_access: bool = False
    """A monitoring claim (adminAccess): no RSD group, and no other claim's holder of its devices."""

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "rsdGroup": self.rsd_group, "rebuilt": self.rebuilt,
                "adminAccess": self.admin_access,
                "devices": [{"device": d.device, "requests": list(d.requests), "cdiDeviceIDs": list(d.cdi_device_ids)}
                            for d in self.devices]}

    @classmethod
    def from_json(cls, raw: Any) -> PreparedClaim:
        group = raw["rsdGroup"]
        if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
            raise TypeError("rsdGroup is not an integer")
        rebuilt, admin_access = raw.get("rebuilt", False), raw.get("adminAccess", False)
        if not isinstance(rebuilt, bool) or not isinstance(admin_access, bool):
            raise TypeError("rebuilt or adminAccess is not a boolean")
        devices = tuple(PreparedDevice(str(d["device"]), tuple(str(r) for r in d["requests"]),
                                       tuple(str(c) for c in d["cdiDeviceIDs"])) for d in raw["devices"])
        return cls(str(raw["namespace"]), str(raw["name"]), devices, group, rebuilt, admin_access)


def _moved_aside_path(path: pathlib.Path, now: datetime.datetime) -> pathlib.Path:
    return path.with_name(f"{path.name}.unreadable-{now.strftime('%Y%m%dT%H%M%S.%fZ')}")


class Checkpoint:
    def __init__(self, directory: pathlib.Path, rebuild: Callable[[], dict[str, PreparedClaim]] = dict,
                 on_rebuilt: Callable[[], None] = lambda: None, lock_timeout: float = LOCK_TIMEOUT):
        self.path = directory / FILE_NAME
        self.lock_path = directory / LOCK_NAME
        self._rebuild = rebuild
        self._on_rebuilt = on_rebuilt
        self._lock_timeout = lock_timeout

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, PreparedClaim]]:
        """The prepared claims as the file holds them now, with the file lock held until the block ends: change
        the node and `save` the claims within it. CheckpointError if the lock is not free within the timeout,
        or the file can be neither read nor rebuilt."""
        try:
            with held_flock(self.lock_path, self._lock_timeout, "KUBELET_PLUGINS_PATH", "checkpoint lock"):
                yield self._load_or_rebuild()
        except RsdGroupError as exc:  # the lock's own failures (held_flock serves the RSD lock too)
            raise CheckpointError(str(exc)) from None

    def count(self) -> int:
        """How many claims the file holds, for the status file: read without the lock (the file is replaced
        whole), never waiting for a call; 0 if it cannot be read (the next call rebuilds it)."""
        try:
            return len(self.read())
        except CheckpointError:
            return 0

    def read(self) -> dict[str, PreparedClaim]:
        """The claims as on disk, without changing anything; UnreadableCheckpoint for a file that is no
        checkpoint this worker reads, CheckpointError for a failure to read it that may pass."""
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            failure = UnreadableCheckpoint if exc.errno == errno.EIO else CheckpointError
            raise failure(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            if len(raw) > _MAX_BYTES:
                raise ValueError(f"larger than {_MAX_BYTES} bytes")
            document = json.loads(raw)
            version = document.get("version")
            if version != VERSION and version not in _MIGRATED:
                raise ValueError(f"version {version!r}, expected {VERSION}")
            return {str(uid): PreparedClaim.from_json(claim) for uid, claim in document["claims"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UnreadableCheckpoint(f"{self.path} is unreadable: {type(exc).__name__}: {exc}") from None

    def save(self, claims: dict[str, PreparedClaim]) -> None:
        """Replace the file with `claims` (temporary file, flushed, renamed, directory flushed); only within
        `locked`."""
        document = {"version": VERSION, "claims": {uid: claim.to_json() for uid, claim in sorted(claims.items())}}
        try:
            write_atomically(self.path, json.dumps(document, indent=1).encode(), mode=0o600)
        except OSError as exc:
            raise CheckpointError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def _load_or_rebuild(self) -> dict[str, PreparedClaim]:
        try:
            return self.read()
        except UnreadableCheckpoint as exc:
            unreadable = str(exc)
        # Rebuilt first: if the node cannot be read now (rbln-smi failing), the file stays as it is and this
        # call fails; the next one tries again.
        try:
            claims = self._rebuild()
        except Exception as exc:  # the rebuild's parts raise their own errors (rbln-smi's, the file system's)
            raise CheckpointError(f"{unreadable}; rebuilding the prepared claims from the node failed: "
                                  f"{type(exc).__name__}: {exc}") from None
        aside = _moved_aside_path(self.path, datetime.datetime.now(datetime.timezone.utc))
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CheckpointError(f"{unreadable}; cannot move it aside to {aside}: {exc.strerror or exc}") from None
        self.save(claims)
        logger.error("Checkpoint unreadable; moved aside and rebuilt from the node", path=str(self.path),
                     movedTo=str(aside), claims=len(claims), err=unreadable)
        self._on_rebuilt()
        return claims
