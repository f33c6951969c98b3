"""Prepared claims the API server no longer has (docs/dra.md#prepare-and-unprepare).

The scheduler may hand a deleted pod's device to a new claim seconds before the kubelet unprepares the old
claim. So a claim refused because a device is prepared for another costs one more read, outside the checkpoint's
lock, per holder: one that is gone, replaced (another UID) or no longer allocated the devices it holds here is
stale, which never reverses. Under the lock again, a stale holder that nothing changed meanwhile is unprepared as
its own Unprepare would (which then finds it done), and the refused claims are prepared again. A holder still
allocated, one that cannot be read, or a rebuilt one whose name is unknown yet, refuses as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from loguru import logger

from dra_worker.allocation import ClaimRef, PrepareError, allocated_devices
from dra_worker.checkpoint import PreparedClaim
from dra_worker.kube import ApiFailure

Json = dict[str, Any]


class DeviceHeld(Exception):
    """A claim's device prepared for another claim, `holder`; `holders` are all the claim's devices' holders, by
    UID (each may be stale)."""

    def __init__(self, device: str, holder: str, holders: dict[str, PreparedClaim]):
        super().__init__(f"device {device} is already prepared for claim {holder}")
        self.holders = holders


def still_holds(claim: Json, ref: ClaimRef, pool: str, devices: set[str]) -> bool:
    """Whether the API server's `claim` is still the prepared claim `ref` with any of its `devices` allocated here;
    False when it was replaced (another UID), is no longer allocated, or is allocated other devices."""
    try:
        return bool(devices & set(allocated_devices(claim, ref, pool)))
    except PrepareError:
        return False


def stale_holders(refused: Iterable[DeviceHeld], get_claim: Callable[[str, str, float], Json], pool: str,
                  reads_end: float, clock: Callable[[], float]) -> dict[str, PreparedClaim]:
    """The holders of the refused claims' devices that the API server says are stale, one read each, all by
    `reads_end`; none that cannot be told (no name, the API server unreachable or out of time)."""
    holders = {uid: holder for held in refused for uid, holder in held.holders.items() if holder.name}
    stale = {}
    for uid, holder in holders.items():
        remaining = reads_end - clock()
        if remaining <= 0:
            break
        try:
            alive = still_holds(get_claim(holder.namespace, holder.name, remaining),
                                ClaimRef(holder.namespace, uid, holder.name), pool, {d.device for d in holder.devices})
        except ApiFailure as exc:
            alive = exc.status != 404
        except (AttributeError, TypeError, ValueError):  # a claim not shaped as the API's: not known stale
            alive = True
        if not alive:
            stale[uid] = holder
    return stale


def unprepare_stale(stale: dict[str, PreparedClaim], prepared: dict[str, PreparedClaim],
                    unprepare: Callable[[ClaimRef, dict[str, PreparedClaim]], str | None],
                    on_unprepared: Callable[[], None]) -> None:
    """Unprepare by `unprepare` (the claims' own Unprepare) each stale holder that no other call changed since it
    was read; called with the checkpoint locked (`prepared` is what it holds)."""
    for uid, holder in stale.items():
        if prepared.get(uid) != holder:
            continue
        claim = f"{holder.namespace}/{holder.name}"
        devices = [d.device for d in holder.devices]
        error = unprepare(ClaimRef(holder.namespace, uid, holder.name), prepared)
        if error is None:
            on_unprepared()
            logger.warning("Unprepared a claim the API server no longer has, to prepare its devices for another",
                           claimUID=uid, claim=claim, deviceIDs=devices)
        else:
            logger.error("Cannot unprepare a claim the API server no longer has", claimUID=uid, claim=claim,
                         deviceIDs=devices, err=error)
