"""NodePrepareResources and NodeUnprepareResources as plain domain logic (docs/dra.md#prepare-and-unprepare).

Per claim: its allocation is read from the API server (outside the lock: a slow server never holds up
another claim's Unprepare), then, serialized by one lock, the checkpoint decides: a claim prepared before gets
its recorded answer again; a new one has its devices checked (known, Healthy by a status read now, prepared
for no other claim), gets one RSD group for all its devices under the node's RSD flock, a CDI spec, and a
checkpoint entry, in that order, undone on failure. Unprepare destroys the claim's group, removes its spec
and drops the entry; an unknown claim is done already. Errors are per claim, never raised.

The checkpoint outlives a reboot (it is on disk), the RSD groups and CDI_ROOT (a tmpfs) do not: a recorded
claim whose spec is gone is prepared again, and its recorded group, whose number a new group may have taken
since, is not destroyed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from loguru import logger

from dra_worker import cdi
from dra_worker.checkpoint import Checkpoint, CheckpointError, PreparedClaim, PreparedDevice
from dra_worker.inventory import NodeInventory, ServedDevice
from dra_worker.kube import ApiFailure
from shared.cdi.annotation import RUNTIME_DEVICE, CdiAnnotation
from shared.config import DRA_DRIVER
from shared.node.device_health import Health
from shared.node.device_nodes import DEVICE_NODE_TIMEOUT, DeviceNode, first_missing, own_node, rsd_host_path, rsd_node
from shared.node.driver_status import StatusReading
from shared.node.rsd_group import RsdGroupError, RsdGroups, held_flock
from shared.observability.hostile_ids import quoted

Json = dict[str, Any]
# The bound of one request's claim GETs together, retries included (one read started in time may take its own
# request timeout more): with the locks' waits, far inside the kubelet's 45 s per call whatever the claim count.
CLAIM_READ_TIMEOUT = 10.0
SERIALIZE_LOCK = "serialize.lock"
SERIALIZE_TIMEOUT = 15.0


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None
    rsd_group: int | None = None


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str, timeout: float) -> Json: ...


class PrepareError(Exception):
    """A claim that cannot be prepared; the message is the claim's error as the kubelet shows it."""


def allocated_devices(claim: Json, ref: ClaimRef, pool: str) -> dict[str, tuple[str, ...]]:
    """This driver's devices of the claim's allocation, each with the requests it serves (subrequests cut, as
    the kubelet gives containers requests by their own names); PrepareError if the claim is not this one or
    not allocated here."""
    metadata = claim.get("metadata") or {}
    if metadata.get("uid") != ref.uid:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {quoted(str(metadata.get('uid')))}, "
                           f"not {quoted(ref.uid)}: it was replaced")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    devices: dict[str, list[str]] = {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != DRA_DRIVER:
            continue
        if result.get("pool") != pool:
            raise PrepareError(f"device {quoted(str(result.get('device')))} is allocated from pool "
                               f"{quoted(str(result.get('pool')))}, not this node's ({pool})")
        request = str(result.get("request") or "").split("/", 1)[0]
        requests = devices.setdefault(str(result.get("device")), [])
        if request and request not in requests:
            requests.append(request)
    return {device: tuple(requests) for device, requests in devices.items()}


class Preparer:
    def __init__(self, *, api: ClaimReader, inventory: Callable[[], NodeInventory], rsd_groups: RsdGroups,
                 checkpoint: Checkpoint, cdi_root: pathlib.Path, dev_root: pathlib.Path, pool: str,
                 read_status: Callable[[str], StatusReading], cdi_annotation: CdiAnnotation,
                 node_timeout: float = DEVICE_NODE_TIMEOUT, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._inventory = inventory
        self._rsd_groups = rsd_groups
        self._checkpoint = checkpoint
        self._cdi_root = cdi_root
        self._dev_root = dev_root
        self._pool = pool
        self._read_status = read_status
        self._cdi_annotation = cdi_annotation
        self._node_timeout = node_timeout
        self._clock = clock
        # Serializes Prepare and Unprepare in this process; the flock beside the checkpoint serializes them
        # with any other instance on the node (a restart's overlap).
        self._lock = threading.Lock()
        self._flock = checkpoint.path.parent / SERIALIZE_LOCK

    @contextlib.contextmanager
    def _serialized(self) -> Iterator[None]:
        """Both locks, each waited for at most SERIALIZE_TIMEOUT: a call stuck behind another still answers
        within the kubelet's 45 s."""
        if not self._lock.acquire(timeout=SERIALIZE_TIMEOUT):
            raise RsdGroupError(f"another Prepare or Unprepare still runs after {SERIALIZE_TIMEOUT:g}s")
        try:
            with held_flock(self._flock, SERIALIZE_TIMEOUT):
                yield
        finally:
            self._lock.release()

    def prepared_count(self) -> int:
        try:
            return len(self._checkpoint.load())
        except CheckpointError:
            return 0

    # -- Prepare ----------------------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        results: dict[str, ClaimResult] = {}
        try:
            known = self._checkpoint.load()
        except CheckpointError as exc:
            return {ref.uid: ClaimResult(error=str(exc)) for ref in claims}
        wanted: dict[str, tuple[ClaimRef, dict[str, tuple[str, ...]]]] = {}
        reads_end = self._clock() + CLAIM_READ_TIMEOUT
        for ref in claims:
            if (ref.uid in known and self._intact(ref.uid, known[ref.uid])) or ref.uid in wanted or ref.uid in results:
                continue
            remaining = reads_end - self._clock()
            if remaining <= 0:
                results[ref.uid] = ClaimResult(error=f"ResourceClaim {ref.namespace}/{ref.name} not read: the "
                                                     f"request's {CLAIM_READ_TIMEOUT:g}s for API reads ran out; retry")
                continue
            try:
                claim = self._api.get_claim(ref.namespace, ref.name, remaining)
                wanted[ref.uid] = (ref, allocated_devices(claim, ref, self._pool))
            except (ApiFailure, PrepareError) as exc:
                results[ref.uid] = ClaimResult(error=str(exc))
            except (AttributeError, TypeError, ValueError) as exc:  # a claim not shaped as the API's
                results[ref.uid] = ClaimResult(error=f"ResourceClaim {ref.namespace}/{ref.name} is malformed: "
                                                     f"{type(exc).__name__}: {exc}")
        try:
            with self._serialized():
                prepared = self._checkpoint.load()
                for ref in claims:
                    if ref.uid in results:
                        continue
                    if ref.uid in prepared and (ref.uid not in wanted or self._intact(ref.uid, prepared[ref.uid])):
                        entry = prepared[ref.uid]
                        results[ref.uid] = ClaimResult(entry.devices, rsd_group=entry.rsd_group)
                    elif ref.uid in wanted:
                        prepared.pop(ref.uid, None)  # a stale entry: its group and spec went with a reboot
                        results[ref.uid] = self._prepare_new(*wanted[ref.uid], prepared)
                    else:  # recorded at the first read, gone at the second: another instance unprepared it
                        results[ref.uid] = ClaimResult(error=f"claim {ref.uid} was unprepared meanwhile; retry")
        except (CheckpointError, RsdGroupError) as exc:
            for ref in claims:
                results.setdefault(ref.uid, ClaimResult(error=str(exc)))
        return results

    def _intact(self, uid: str, entry: PreparedClaim) -> bool:
        """Whether a recorded claim's CDI spec is still there (it is written after the group and removed with it)."""
        return entry.rsd_group is None or cdi.spec_path(self._cdi_root, uid).exists()

    def _check_devices(self, devices: Sequence[str], uid: str,
                       prepared: dict[str, PreparedClaim]) -> list[ServedDevice]:
        inventory = self._inventory()
        if not inventory.complete:
            raise PrepareError("the node's inventory has not arrived from the scanner yet (just started); retry")
        holders = {d.device: other for other, claim in prepared.items() if other != uid for d in claim.devices}
        served = []
        for name in devices:
            device = inventory.devices.get(name)
            if device is None:
                raise PrepareError(f"device {quoted(name)} is not a device of this node")
            if name in holders:
                raise PrepareError(f"device {name} is already prepared for claim {holders[name]}")
            reading = self._read_status(name)
            healthy = reading.ready if reading.readable else device.health is Health.HEALTHY
            if not healthy:
                raise PrepareError(f"device {name} is Unhealthy ({reading.name})")
            served.append(device)
        return served

    def _prepare_new(self, ref: ClaimRef, devices: dict[str, tuple[str, ...]],
                     prepared: dict[str, PreparedClaim]) -> ClaimResult:
        group: int | None = None
        spec_written = False
        try:
            served = self._check_devices(list(devices), ref.uid, prepared)
            nodes = {d.record.device_id: own_node(d.record.device_id) for d in served}
            self._await_nodes(list(nodes.values()))
            if served:
                group = self._rsd_groups.recreate([d.record for d in served]).group_id
                self._await_nodes([rsd_node(group)])
                cdi.write_claim_spec(self._cdi_root, ref.uid,
                                     {name: (rsd_node(group), node) for name, node in nodes.items()})
                spec_written = True
            common = [RUNTIME_DEVICE] if self._gives_runtime_device() else []
            entry = PreparedClaim(ref.namespace, ref.name, tuple(
                PreparedDevice(name, devices[name], (cdi.qualified_name(ref.uid, name), *common))
                for name in sorted(devices)), group)
            prepared[ref.uid] = entry
            self._checkpoint.save(prepared)
        except (PrepareError, RsdGroupError, CheckpointError, OSError, ValueError) as exc:
            prepared.pop(ref.uid, None)
            self._undo(ref.uid, group, spec_written)
            message = str(exc) if isinstance(exc, PrepareError) else f"{type(exc).__name__}: {exc}"
            return ClaimResult(error=f"claim {ref.namespace}/{ref.name}: {message}", rsd_group=None)
        return ClaimResult(entry.devices, rsd_group=group)

    def _gives_runtime_device(self) -> bool:
        """Whether the answer names the toolkit's CDI device (the driver libraries and hooks), by
        CDI_ANNOTATION as Allocate's annotation; a missing spec is said, never silently left out."""
        resolvable = self._inventory().cdi_resolvable
        if not resolvable and self._cdi_annotation is not CdiAnnotation.NEVER:
            logger.warning("No CDI spec resolves the toolkit's device; containers of the claim may not start",
                           cdiDevice=RUNTIME_DEVICE, cdiAnnotation=self._cdi_annotation.value)
        return self._cdi_annotation is CdiAnnotation.ALWAYS or (
            self._cdi_annotation is CdiAnnotation.WHEN_RESOLVABLE and resolvable)

    def _await_nodes(self, nodes: Sequence[DeviceNode]) -> None:
        missing = first_missing(self._dev_root, nodes, self._node_timeout)
        if missing is not None:
            raise PrepareError(f"device node {missing.host_path} did not appear under {self._dev_root} "
                               f"within {self._node_timeout:g}s")

    def _undo(self, uid: str, group: int | None, spec_written: bool) -> None:
        if spec_written:
            try:
                cdi.remove_claim_spec(self._cdi_root, uid)
            except OSError as exc:
                logger.warning("Cannot remove a claim's CDI spec", claimUID=uid, err=str(exc))
        if group is not None:
            try:
                self._rsd_groups.destroy(group)
            except RsdGroupError as exc:
                logger.warning("Cannot destroy a claim's RSD group", claimUID=uid, rsdGroup=rsd_host_path(group),
                               err=str(exc))

    # -- Unprepare --------------------------------------------------------------------------------------

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
        """Each claim's error, None when it is unprepared (or never was)."""
        results: dict[str, str | None] = {}
        try:
            with self._serialized():
                prepared = self._checkpoint.load()
                for ref in claims:
                    results[ref.uid] = self._unprepare_one(ref.uid, prepared)
        except (CheckpointError, RsdGroupError) as exc:
            for ref in claims:
                results.setdefault(ref.uid, str(exc))
        return results

    def _unprepare_one(self, uid: str, prepared: dict[str, PreparedClaim]) -> str | None:
        entry = prepared.get(uid)
        if entry is None:
            return None
        try:
            if entry.rsd_group is not None and self._intact(uid, entry):
                self._rsd_groups.destroy(entry.rsd_group)
            cdi.remove_claim_spec(self._cdi_root, uid)
            del prepared[uid]
            self._checkpoint.save(prepared)
        except (RsdGroupError, OSError, CheckpointError) as exc:
            return f"claim {entry.namespace}/{entry.name}: {type(exc).__name__}: {exc}"
        return None


def elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)
