"""NodePrepareResources and NodeUnprepareResources as plain domain logic (docs/dra.md#prepare-and-unprepare).

Prepare, per claim: a claim the checkpoint records gets its recorded answer again; a new one has its devices
checked (known, Healthy by a status read now, prepared for no other claim), gets one RSD group for all its
devices under the node's RSD flock, a CDI spec and its checkpoint entry, in that order, each step undone when
a later one fails. Unprepare destroys the claim's group, removes its spec and drops its entry; an unknown
claim is done already. Errors are per claim, never raised.

A claim with admin access (KEP-5018: every allocation result of it says `adminAccess: true`, which the API server
allows only in namespaces an administrator labelled) is for monitoring a device, not using it: it is prepared
whatever other claims hold the device and whatever its health, gets a CDI spec with the device's own nodes only,
and neither its Prepare nor its Unprepare touches an RSD group, so the workload keeps its /dev/rsd0. Other claims
do not count it as the device's holder. An Unhealthy device is prepared for a claim whose allocation tolerates
its taint (the scheduler copies a request's tolerations into the allocation result): a diagnostics pod's.

Every look at the checkpoint and every change made on what it says happen under its file lock, which any
instance on the node takes (two run during a surge upgrade): nothing is decided on an earlier read. A request
takes the lock twice: first to answer the claims prepared already (they cost no API read), then, after the
other claims were read from the API server (a slow server holds up no other call), to prepare those.

A device held by a claim the API server no longer has is not refused (dra_worker/stale.py): only then the
holder is read, and a stale one is unprepared under the lock a third time.

The checkpoint outlives a reboot (it is on disk), the RSD groups and CDI_ROOT (a tmpfs) do not: a recorded
claim whose spec is gone is prepared again, and its recorded group, whose number a new group may have taken
since, is not destroyed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from loguru import logger

from dra_worker import cdi
from dra_worker.allocation import AllocatedDevice, ClaimRef, PrepareError, allocated_devices, is_admin
from dra_worker.checkpoint import Checkpoint, CheckpointError, PreparedClaim, PreparedDevice
from dra_worker.inventory import NodeInventory, ServedDevice
from dra_worker.kube import ApiFailure
from dra_worker.stale import DeviceHeld, stale_holders, unprepare_stale
from shared.cdi.annotation import RUNTIME_DEVICE, CdiAnnotation
from shared.node.device_health import Health
from shared.node.device_nodes import DEVICE_NODE_TIMEOUT, DeviceNode, first_missing, own_node, rsd_host_path, rsd_node
from shared.node.driver_status import StatusReading
from shared.node.rsd_group import RsdGroupError, RsdGroups
from shared.observability.hostile_ids import quoted

Json = dict[str, Any]
# The bound of one request's claim GETs together, retries included (one read started in time may take its own
# request timeout more): with the locks' waits, far inside the kubelet's 45 s per call whatever the claim count.
CLAIM_READ_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None
    rsd_group: int | None = None
    prepared_now: bool = dataclasses.field(default=False, compare=False)
    """Prepared by this call, not answered from the checkpoint (the answer is the same either way)."""


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str, timeout: float) -> Json: ...


@dataclasses.dataclass(frozen=True)
class PrepareSettings:
    """What preparing a claim works with: the node's parts, then where and how claims are prepared."""

    api: ClaimReader
    inventory: Callable[[], NodeInventory]
    """The scanner's latest inventory."""
    rsd_groups: RsdGroups
    checkpoint: Checkpoint
    read_status: Callable[[str], StatusReading]
    """A device's status, read now (the final check before it is handed out)."""
    pool: str
    cdi_root: pathlib.Path
    dev_root: pathlib.Path
    cdi_annotation: CdiAnnotation
    node_timeout: float = DEVICE_NODE_TIMEOUT
    """How long a device node may take to appear under dev_root."""
    clock: Callable[[], float] = time.monotonic
    on_stale_unprepared: Callable[[], None] = lambda: None
    """Called for each claim the API server no longer had, unprepared for another claim's devices."""


def _answer(entry: PreparedClaim) -> ClaimResult:
    return ClaimResult(entry.devices, rsd_group=entry.rsd_group)


def _claim_error(ref: ClaimRef, exc: Exception) -> ClaimResult:
    message = str(exc) if isinstance(exc, (PrepareError, DeviceHeld)) else f"{type(exc).__name__}: {exc}"
    return ClaimResult(error=f"claim {ref.namespace}/{ref.name}: {message}")


class Preparer:
    def __init__(self, settings: PrepareSettings):
        self._settings = settings

    def prepared_count(self) -> int:
        return self._settings.checkpoint.count()

    # -- Prepare ----------------------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            refs.setdefault(ref.uid, ref)
        results: dict[str, ClaimResult] = {}
        reads_end = self._settings.clock() + CLAIM_READ_TIMEOUT
        try:
            with self._settings.checkpoint.locked() as prepared:
                for uid in refs:
                    if uid in prepared and self._answerable(uid, prepared[uid]):
                        results[uid] = _answer(prepared[uid])
            allocations = self._read_allocations([ref for uid, ref in refs.items() if uid not in results], results,
                                                 reads_end)
            with self._settings.checkpoint.locked() as prepared:
                refused = self._prepare_claims(allocations, prepared, results)
            stale = stale_holders(refused.values(), self._settings.api.get_claim, self._settings.pool, reads_end,
                                  self._settings.clock)
            if stale:
                with self._settings.checkpoint.locked() as prepared:
                    unprepare_stale(stale, prepared, self._unprepare_claim, self._settings.on_stale_unprepared)
                    self._prepare_claims([(ref, devices) for ref, devices in allocations if ref.uid in refused],
                                         prepared, results)
        except CheckpointError as exc:
            for uid in refs:
                results.setdefault(uid, ClaimResult(error=str(exc)))
        return results

    def _read_allocations(self, refs: Sequence[ClaimRef], results: dict[str, ClaimResult], reads_end: float
                          ) -> list[tuple[ClaimRef, dict[str, AllocatedDevice]]]:
        """Each claim's devices from the API server, all reads by `reads_end`; a claim that cannot be read, or is
        not allocated here, gets its error in `results`."""
        allocations = []
        for ref in refs:
            remaining = reads_end - self._settings.clock()
            if remaining <= 0:
                results[ref.uid] = ClaimResult(error=f"ResourceClaim {ref.namespace}/{ref.name} not read: the "
                                                     f"request's {CLAIM_READ_TIMEOUT:g}s for API reads ran out; retry")
                continue
            try:
                claim = self._settings.api.get_claim(ref.namespace, ref.name, remaining)
                allocations.append((ref, allocated_devices(claim, ref, self._settings.pool)))
            except (ApiFailure, PrepareError) as exc:
                results[ref.uid] = ClaimResult(error=str(exc))
            except (AttributeError, TypeError, ValueError) as exc:  # a claim not shaped as the API's
                results[ref.uid] = ClaimResult(error=f"ResourceClaim {ref.namespace}/{ref.name} is malformed: "
                                                     f"{type(exc).__name__}: {exc}")
        return allocations

    def _prepare_claims(self, allocations: Sequence[tuple[ClaimRef, dict[str, AllocatedDevice]]],
                        prepared: dict[str, PreparedClaim], results: dict[str, ClaimResult]) -> dict[str, DeviceHeld]:
        """Prepare each claim into `results`; called with the checkpoint locked. The claims refused because another
        claim holds a device, by UID."""
        refused = {}
        for ref, devices in allocations:
            try:
                results[ref.uid] = self._prepare_claim(ref, devices, prepared)
            except DeviceHeld as exc:
                refused[ref.uid] = exc
                results[ref.uid] = _claim_error(ref, exc)
        return refused

    def _prepare_claim(self, ref: ClaimRef, devices: dict[str, AllocatedDevice],
                       prepared: dict[str, PreparedClaim]) -> ClaimResult:
        """Prepare one claim and record it in `prepared` and on disk; called with the checkpoint locked. DeviceHeld
        if another claim holds one of its devices."""
        recorded = prepared.get(ref.uid)
        try:
            if recorded is not None and self._answerable(ref.uid, recorded):  # another instance prepared it meanwhile
                return _answer(recorded)
            if recorded is not None and self._kept_by_node(ref.uid, recorded, devices):
                return _answer(self._record(ref, devices, recorded.rsd_group, prepared))
            # A recorded claim that is not intact lost its group and spec to a reboot: prepared again, its entry
            # replaced.
            served = self._check_devices(devices, {u: c for u, c in prepared.items() if u != ref.uid})
            with contextlib.ExitStack() as undo:
                group: int | None = None
                if served and is_admin(devices):  # the device's own nodes; no group made, none changed
                    self._await_nodes([own_node(d.record.device_id) for d in served])
                    undo.callback(self._remove_spec, ref.uid)
                    cdi.write_claim_spec(self._settings.cdi_root, ref.uid,
                                         {d.record.device_id: (own_node(d.record.device_id),) for d in served})
                elif served:
                    self._await_nodes([own_node(d.record.device_id) for d in served])
                    group = self._settings.rsd_groups.recreate([d.record for d in served]).group_id
                    undo.callback(self._destroy_group, ref.uid, group)
                    self._await_nodes([rsd_node(group)])
                    undo.callback(self._remove_spec, ref.uid)
                    cdi.write_claim_spec(self._settings.cdi_root, ref.uid, {
                        d.record.device_id: (rsd_node(group), own_node(d.record.device_id)) for d in served})
                entry = self._record(ref, devices, group, prepared)
                undo.pop_all()  # all done: nothing to undo
        except (PrepareError, RsdGroupError, CheckpointError, OSError, ValueError) as exc:
            return _claim_error(ref, exc)
        return dataclasses.replace(_answer(entry), prepared_now=True)

    def _record(self, ref: ClaimRef, devices: dict[str, AllocatedDevice], group: int | None,
                prepared: dict[str, PreparedClaim]) -> PreparedClaim:
        """The claim's entry, saved in the checkpoint and put in `prepared`; CheckpointError if not saved."""
        common = [RUNTIME_DEVICE] if self._gives_runtime_device() else []
        entry = PreparedClaim(ref.namespace, ref.name, tuple(
            PreparedDevice(name, devices[name].requests, (cdi.qualified_name(ref.uid, name), *common))
            for name in sorted(devices)), group, admin_access=is_admin(devices))
        self._settings.checkpoint.save({**prepared, ref.uid: entry})
        prepared[ref.uid] = entry
        return entry

    def _kept_by_node(self, uid: str, entry: PreparedClaim, devices: dict[str, AllocatedDevice]) -> bool:
        """Whether a claim rebuilt from the node still has its group and spec for the devices it is allocated:
        then its entry is completed from the claim, and the node is left as it is."""
        if not entry.rebuilt or not self._intact(uid, entry):
            return False
        return {d.device for d in entry.devices} == set(devices)

    def _answerable(self, uid: str, entry: PreparedClaim) -> bool:
        """Whether a recorded claim's answer can be given as recorded (a rebuilt one lacks its requests)."""
        return not entry.rebuilt and self._intact(uid, entry)

    def _intact(self, uid: str, entry: PreparedClaim) -> bool:
        """Whether a recorded claim's CDI spec is still there (it is written after the group and removed with it)."""
        has_spec = entry.rsd_group is not None or (entry.admin_access and bool(entry.devices))
        return not has_spec or cdi.spec_path(self._settings.cdi_root, uid).exists()

    def _check_devices(self, devices: dict[str, AllocatedDevice], others: dict[str, PreparedClaim]
                       ) -> list[ServedDevice]:
        """The inventory's entries of `devices`; PrepareError unless each is known, and (but for admin access)
        Healthy now, or tolerating its taint; DeviceHeld if one is prepared for any of the `others`."""
        inventory = self._settings.inventory()
        if not inventory.complete:
            raise PrepareError("the node's inventory has not arrived from the scanner yet (just started); retry")
        holders = {d.device: uid for uid, claim in others.items() if not claim.admin_access for d in claim.devices}
        held = {holders[name]: others[holders[name]] for name, allocated in devices.items()
                if name in holders and not allocated.admin_access}
        served = []
        for name, allocated in devices.items():
            device = inventory.devices.get(name)
            if device is None:
                raise PrepareError(f"device {quoted(name)} is not a device of this node")
            if not allocated.admin_access:
                if name in holders:
                    raise DeviceHeld(name, holders[name], held)
                reading = self._settings.read_status(name)
                healthy = reading.ready if reading.readable else device.health is Health.HEALTHY
                status = reading.name if reading.readable else device.lifecycle
                if not healthy and not allocated.tolerates_unhealthy(status):
                    raise PrepareError(f"device {name} is Unhealthy ({reading.name})")
            served.append(device)
        return served

    def _gives_runtime_device(self) -> bool:
        """Whether the answer names the toolkit's CDI device (the driver libraries and hooks), by
        CDI_ANNOTATION as Allocate's annotation; a missing spec is said, never silently left out."""
        annotation = self._settings.cdi_annotation
        resolvable = self._settings.inventory().cdi_resolvable
        if not resolvable and annotation is not CdiAnnotation.NEVER:
            logger.warning("No CDI spec resolves the toolkit's device; containers of the claim may not start",
                           cdiDevice=RUNTIME_DEVICE, cdiAnnotation=annotation.value)
        return annotation is CdiAnnotation.ALWAYS or (annotation is CdiAnnotation.WHEN_RESOLVABLE and resolvable)

    def _await_nodes(self, nodes: Sequence[DeviceNode]) -> None:
        dev_root, timeout = self._settings.dev_root, self._settings.node_timeout
        missing = first_missing(dev_root, nodes, timeout)
        if missing is not None:
            raise PrepareError(f"device node {missing.host_path} did not appear under {dev_root} within {timeout:g}s")

    def _remove_spec(self, uid: str) -> None:
        """Undo: best effort, said when it fails."""
        try:
            cdi.remove_claim_spec(self._settings.cdi_root, uid)
        except OSError as exc:
            logger.warning("Cannot remove a claim's CDI spec", claimUID=uid, err=str(exc))

    def _destroy_group(self, uid: str, group: int) -> None:
        """Undo: best effort, said when it fails."""
        try:
            self._settings.rsd_groups.destroy(group)
        except RsdGroupError as exc:
            logger.warning("Cannot destroy a claim's RSD group", claimUID=uid, rsdGroup=rsd_host_path(group),
                           err=str(exc))

    # -- Unprepare --------------------------------------------------------------------------------------

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
        """Each claim's error, None when it is unprepared (or never was)."""
        results: dict[str, str | None] = {}
        try:
            with self._settings.checkpoint.locked() as prepared:
                for ref in claims:
                    results[ref.uid] = self._unprepare_claim(ref, prepared)
        except CheckpointError as exc:
            for ref in claims:
                results.setdefault(ref.uid, str(exc))
        return results

    def _unprepare_claim(self, ref: ClaimRef, prepared: dict[str, PreparedClaim]) -> str | None:
        """Undo one claim and drop it from `prepared` and from disk; called with the checkpoint locked."""
        uid = ref.uid
        entry = prepared.get(uid)
        if entry is None:
            return None
        try:
            if entry.rsd_group is not None and self._intact(uid, entry):
                self._settings.rsd_groups.destroy(entry.rsd_group)
            cdi.remove_claim_spec(self._settings.cdi_root, uid)
            self._settings.checkpoint.save({other: claim for other, claim in prepared.items() if other != uid})
        except (RsdGroupError, OSError, CheckpointError) as exc:
            return f"claim {ref.namespace}/{ref.name}: {type(exc).__name__}: {exc}"
        del prepared[uid]
        return None


def elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)
