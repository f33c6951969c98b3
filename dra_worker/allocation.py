"""What a ResourceClaim's allocation result says for this driver's devices on this node: the requests each serves,
admin access (KEP-5018) and the device taint tolerations (KEP-5055) the scheduler copied from the claim."""

from __future__ import annotations

import dataclasses
from typing import Any

from dra_worker.slices import UNHEALTHY_TAINT_KEY, taint_value
from shared.config import DRA_DRIVER
from shared.hostile_ids import quoted

Json = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


class PrepareError(Exception):
    """A claim that cannot be prepared; the message is the claim's error as the kubelet shows it."""


@dataclasses.dataclass(frozen=True)
class AllocatedDevice:
    """One device of a claim's allocation result."""

    requests: tuple[str, ...]
    """The requests it serves (subrequests cut, as the kubelet gives containers requests by their own names)."""
    admin_access: bool = False
    tolerations: tuple[Json, ...] = ()
    """The device taint tolerations of its allocation result."""

    def tolerates_unhealthy(self, status: str) -> bool:
        """Whether the tolerations tolerate the unhealthy taint a device in driver status `status` carries."""
        value = taint_value(status)
        return any(t.get("key") in (None, "", UNHEALTHY_TAINT_KEY) and (
            t.get("operator") == "Exists" or (t.get("operator", "Equal") == "Equal" and t.get("value") == value))
            for t in self.tolerations)


def allocated_devices(claim: Json, ref: ClaimRef, pool: str) -> dict[str, AllocatedDevice]:
    """This driver's devices of the claim's allocation; PrepareError if the claim is not this one or not allocated
    here."""
    metadata = claim.get("metadata") or {}
    if metadata.get("uid") != ref.uid:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {quoted(str(metadata.get('uid')))}, "
                           f"not {quoted(ref.uid)}: it was replaced")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    devices: dict[str, AllocatedDevice] = {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != DRA_DRIVER:
            continue
        if result.get("pool") != pool:
            raise PrepareError(f"device {quoted(str(result.get('device')))} is allocated from pool "
                               f"{quoted(str(result.get('pool')))}, not this node's ({pool})")
        request = str(result.get("request") or "").split("/", 1)[0]
        name = str(result.get("device"))
        known = devices.get(name, AllocatedDevice(()))
        tolerations = tuple(t for t in result.get("tolerations") or () if isinstance(t, dict))
        devices[name] = AllocatedDevice(known.requests + ((request,) if request and request not in known.requests
                                                          else ()),
                                        known.admin_access or result.get("adminAccess") is True,
                                        known.tolerations + tolerations)
    if len({device.admin_access for device in devices.values()}) > 1:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} mixes requests with and without admin access "
                           "on this driver's devices; give the monitoring requests a claim of their own")
    return devices


def is_admin(devices: dict[str, AllocatedDevice]) -> bool:
    """Whether the claim has admin access (allocated_devices refuses a claim that mixes)."""
    return any(device.admin_access for device in devices.values())
