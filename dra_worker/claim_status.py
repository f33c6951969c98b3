"""A prepared claim's `status.devices` (KEP-4817): per device the driver, pool and device, and in `data` what an
operator looks for on the node: the PCI bus ID, the claim's RSD group (none for admin access) and the device's
health (docs/dra.md#device-status-in-the-claim).

Written once, when the claim is prepared (a repeated Prepare answers from the checkpoint and writes nothing), by
server-side apply of the status subresource under the field manager npu.rebellions.ai, which then owns this
driver's entries only. The write is bounded in time, and a failure costs the status alone: the claim stays
prepared, with one warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from loguru import logger

from dra_worker.inventory import NodeInventory
from dra_worker.kube import ApiFailure
from shared.config import DRA_DRIVER
from shared.device_health import Health
from shared.device_nodes import rsd_host_path

Json = dict[str, Any]
# A Prepare waits for the write: a slow API server may cost it this much, never the kubelet's 45 s.
STATUS_WRITE_TIMEOUT = 3.0


class ClaimStatusApi(Protocol):
    def apply_claim_status(self, namespace: str, name: str, uid: str, devices: list[Json], timeout: float) -> None: ...


def device_statuses(pool: str, devices: list[str], rsd_group: int | None, inventory: NodeInventory) -> list[Json]:
    """The entries of `status.devices` for the claim's devices."""
    entries = []
    for name in devices:
        served = inventory.devices.get(name)
        data: Json = {"rsdGroup": rsd_host_path(rsd_group) if rsd_group is not None else None}
        if served is not None:
            data["pciBusID"] = served.record.bus_id.lower()
            data["health"] = served.health.value
            if served.health is Health.UNHEALTHY:
                data["status"] = served.lifecycle
        entries.append({"driver": DRA_DRIVER, "pool": pool, "device": name, "data": data})
    return entries


class ClaimStatusWriter:
    def __init__(self, api: ClaimStatusApi, pool: str, inventory: Callable[[], NodeInventory]):
        self._api = api
        self._pool = pool
        self._inventory = inventory

    def write(self, namespace: str, name: str, uid: str, devices: list[str], rsd_group: int | None) -> None:
        """Write the claim's device status; never raises."""
        entries = device_statuses(self._pool, devices, rsd_group, self._inventory())
        try:
            self._api.apply_claim_status(namespace, name, uid, entries, STATUS_WRITE_TIMEOUT)
        except Exception as exc:  # an ApiFailure, or a client error of any kind: the claim is prepared all the same
            logger.warning("Cannot write the claim's device status; the claim stays prepared", claimUID=uid,
                           claim=f"{namespace}/{name}",
                           err=str(exc) if isinstance(exc, ApiFailure) else f"{type(exc).__name__}: {exc}")
