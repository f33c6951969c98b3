"""Keeps the node's ResourceSlices equal to the inventory (docs/dra.md#resourceslices).

One thread owns the reconciliation. It wakes on every inventory snapshot and at least once per resync period:
when what it would publish differs from what it last published, or the period has passed (the kubelet wipes a
node's slices when it restarts or loses the driver for 30 s, and anyone may delete one), it lists the slices
of this driver and node and repairs them: obsolete slices deleted first, changed ones updated, missing ones
created, and the pool generation bumped, except for a change confined to one slice, which keeps it (KEP-5055:
the scheduler then sees the one slice's new content at once, with no pool to wait for). Failures, the API's or
any other, are retried with backoff, never fatal. An API server that stores a slice without the taints it was
sent has them off: from then on Unhealthy devices are left out instead (one warning).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from loguru import logger

from dra_worker import slices
from dra_worker.inventory import NodeInventory
from dra_worker.kube import ApiFailure, Backoff
from shared.config import TaintEffect
from shared.hostile_ids import logged

Json = dict[str, Any]
# One API call's bound: a publish cycle never stalls for long on a server that does not answer.
CALL_TIMEOUT = 10.0


class SliceApi(Protocol):
    def node_uid(self, node_name: str, timeout: float) -> str: ...
    def list_slices(self, node_name: str, timeout: float) -> list[Json]: ...
    def create_slice(self, body: Json, timeout: float) -> Json: ...
    def replace_slice(self, body: Json, timeout: float) -> Json: ...
    def delete_slice(self, name: str, timeout: float) -> None: ...


def _name(existing: Json) -> str:
    return str(existing["metadata"]["name"])


def _generation(existing: Json) -> int:
    pool = (existing.get("spec") or {}).get("pool") or {}
    generation = pool.get("generation")
    return generation if isinstance(generation, int) else 0


class SlicePublisher:
    def __init__(self, api: SliceApi, node_name: str, inventory: Callable[[], NodeInventory], resync_period: float,
                 on_publish: Callable[[bool], None] = lambda ok: None,
                 taint_effect: TaintEffect = TaintEffect.NO_SCHEDULE):
        self._api = api
        self._node_name = node_name
        self._inventory = inventory
        self._resync_period = resync_period
        self._on_publish = on_publish
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
        self._node_uid = ""
        # Owned by the publisher thread: the devices of the last successful reconciliation, and when it was.
        self._published: list[Json] | None = None
        self._checked_at = 0.0
        self._taint_effect: TaintEffect | None = taint_effect
        """None once the API server was seen dropping taints."""
        self.generation = 0
        """The pool generation last published (read by the status file)."""
        self.tainted = 0
        """Devices published with the unhealthy taint (read by the status file)."""

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = Backoff(first=0.5, most=30.0)
        wait = self._resync_period
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile_once()
            except Exception as exc:  # an ApiFailure, or anything unforeseen: this thread alone keeps the pool
                unforeseen = not isinstance(exc, ApiFailure)
                self._published = None  # unknown now: the next try relists
                wait = backoff.pause()
                logger.opt(exception=unforeseen).warning(
                    "ResourceSlice publish failed; retrying", retryInSeconds=wait,
                    err=f"{type(exc).__name__}: {exc}" if unforeseen else str(exc))
                self._on_publish(False)
                continue
            backoff.reset()
            wait = self._resync_period

    def reconcile_once(self) -> bool:
        """One reconciliation if one is due; True if the API server was changed."""
        inventory = self._inventory()
        if not inventory.complete:
            return False  # a pool published before every resource's snapshot would offer too little
        devices = slices.published_devices(inventory, self._taint_effect)
        if devices == self._published and time.monotonic() - self._checked_at < self._resync_period:
            return False
        if not self._node_uid:
            self._node_uid = self._api.node_uid(self._node_name, CALL_TIMEOUT)
        changed = self._repair(devices)
        if changed and self._taint_effect is None and slices.tainted(devices):
            devices = slices.published_devices(inventory, None)  # the server dropped the taints: leave them out
            self._repair(devices)
        self._published = devices
        self.tainted = slices.tainted(devices)
        self._checked_at = time.monotonic()
        if changed:
            self._on_publish(True)
        return changed

    def _repair(self, devices: list[Json]) -> bool:
        existing = sorted(self._api.list_slices(self._node_name, CALL_TIMEOUT), key=_name)
        current = max([self.generation, *(_generation(s) for s in existing)])
        per_slice = (slices.MAX_DEVICES_PER_TAINTED_SLICE if self._taint_effect is not None
                     else slices.MAX_DEVICES_PER_SLICE)
        wanted = slices.slice_specs(self._node_name, devices, current, per_slice)
        differing = [index for index, (have, want) in enumerate(zip(existing, wanted, strict=False))
                     if slices.content(have.get("spec") or {}) != slices.content(want)]
        consistent = (len(existing) == len(wanted) and current > 0
                      and {_generation(s) for s in existing} == {current})
        if consistent and not differing:
            self.generation = current
            return False
        if not consistent or len(differing) > 1:  # more than one slice: the pool changes as a whole
            wanted = slices.slice_specs(self._node_name, devices, current + 1, per_slice)
            differing = list(range(len(wanted)))
        kept, obsolete = existing[:len(wanted)], existing[len(wanted):]
        for stale in obsolete:  # first: the pool must never show more slices than its count says
            self._api.delete_slice(_name(stale), CALL_TIMEOUT)
        for index in differing:
            if index < len(kept):
                spec = slices.keep_time_added(wanted[index], kept[index].get("spec") or {})
                stored = self._api.replace_slice({**kept[index], "spec": spec}, CALL_TIMEOUT)
            else:
                spec = wanted[index]
                stored = self._api.create_slice(slices.new_slice(self._node_name, self._node_uid, spec),
                                                CALL_TIMEOUT)
            if self._taint_effect is not None and slices.taints_dropped(spec, stored.get("spec") or {}):
                self._taint_effect = None
                logger.warning("API server drops device taints; Unhealthy devices are left out of the slices",
                               pool=self._node_name, taint=slices.UNHEALTHY_TAINT_KEY)
        self.generation = wanted[0]["pool"]["generation"]
        logger.info("Published ResourceSlices", pool=self._node_name, generation=self.generation,
                    slices=len(wanted), devices=len(devices), deviceIDs=logged([d["name"] for d in devices]),
                    tainted=logged([d["name"] for d in devices if d.get("taints")]))
        return True
