"""The prepared claims, on disk in the plugin's data dir, under a file lock: read at every call, replaced
atomically on change.

A restart of the worker or of the whole stack finds every claim it prepared, so a later Unprepare undoes it
and a repeated Prepare gives the same answer. Two instances on one node (a surge upgrade) share the file: each
reads and changes it only while it holds the flock on `serialize.lock` beside it, so neither ever acts on what
the other has changed since. The format is this project's own (the Go driver's checksum is Go-specific):
`{"version": 1, "claims": {"<uid>": PreparedClaim}}`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from collections.abc import Iterator
from typing import Any

from shared.atomic_file import write_atomically
from shared.rsd_group import RsdGroupError, held_flock

VERSION = 1
FILE_NAME = "checkpoint.json"
LOCK_NAME = "serialize.lock"
# A call waits this long at most for another to finish with the checkpoint: two waits and the work itself
# stay well inside the kubelet's 45 s per call.
LOCK_TIMEOUT = 15.0
_MAX_BYTES = 16 * 1024 * 1024


class CheckpointError(RuntimeError):
    """The checkpoint cannot be read or written; the message names the file and why."""


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

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "rsdGroup": self.rsd_group,
                "devices": [{"device": d.device, "requests": list(d.requests), "cdiDeviceIDs": list(d.cdi_device_ids)}
                            for d in self.devices]}

    @classmethod
    def from_json(cls, raw: Any) -> PreparedClaim:
        group = raw["rsdGroup"]
        if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
            raise TypeError("rsdGroup is not an integer")
        devices = tuple(PreparedDevice(str(d["device"]), tuple(str(r) for r in d["requests"]),
                                       tuple(str(c) for c in d["cdiDeviceIDs"])) for d in raw["devices"])
        return cls(str(raw["namespace"]), str(raw["name"]), devices, group)


class Checkpoint:
    def __init__(self, directory: pathlib.Path, lock_timeout: float = LOCK_TIMEOUT):
        self.path = directory / FILE_NAME
        self.lock_path = directory / LOCK_NAME
        self._lock_timeout = lock_timeout

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, PreparedClaim]]:
        """The prepared claims as the file holds them now, with the file lock held until the block ends: change
        the node and `save` the claims within it. CheckpointError if the lock is not free within the timeout or
        the file cannot be read."""
        try:
            with held_flock(self.lock_path, self._lock_timeout, "KUBELET_PLUGINS_PATH", "checkpoint lock"):
                yield self.load()
        except RsdGroupError as exc:  # the lock's own failures (held_flock serves the RSD lock too)
            raise CheckpointError(str(exc)) from None

    def load(self) -> dict[str, PreparedClaim]:
        """The claims as on disk; outside `locked` only for a count, as the file is replaced whole."""
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            if len(raw) > _MAX_BYTES:
                raise ValueError(f"larger than {_MAX_BYTES} bytes")
            document = json.loads(raw)
            if document.get("version") != VERSION:
                raise ValueError(f"version {document.get('version')!r}, expected {VERSION}")
            return {str(uid): PreparedClaim.from_json(claim) for uid, claim in document["claims"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"{self.path} is corrupt: {type(exc).__name__}: {exc}") from None

    def save(self, claims: dict[str, PreparedClaim]) -> None:
        """Replace the file with `claims`; only within `locked`."""
        document = {"version": VERSION, "claims": {uid: claim.to_json() for uid, claim in sorted(claims.items())}}
        try:
            write_atomically(self.path, json.dumps(document, indent=1).encode(), mode=0o600)
        except OSError as exc:
            raise CheckpointError(f"cannot write {self.path}: {exc.strerror or exc}") from None
