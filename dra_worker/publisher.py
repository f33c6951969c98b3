"""Keeps the node's ResourceSlices equal to the inventory (docs/dra.md#resourceslices).

One thread owns the reconciliation. It wakes on every inventory snapshot and at least once per resync period:
when what it would publish differs from what it last published, or the period has passed (the kubelet wipes a
node's slices when it restarts or loses the driver for 30 s, and anyone may delete one), it lists the slices
of this driver and node and repairs them: obsolete slices deleted first, changed ones updated, missing ones
created, the pool generation bumped on any change. Failures, the API's or any other, are retried with backoff,
never fatal.
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
from shared.observability.hostile_ids import logged

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
                 on_publish: Callable[[bool], None] = lambda ok: None):
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
        self.generation = 0
        """The pool generation last published (read by the status file)."""

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
        devices = slices.published_devices(inventory)
        if devices == self._published and time.monotonic() - self._checked_at < self._resync_period:
            return False
        if not self._node_uid:
            self._node_uid = self._api.node_uid(self._node_name, CALL_TIMEOUT)
        changed = self._repair(devices)
        self._published = devices
        self._checked_at = time.monotonic()
        if changed:
            self._on_publish(True)
        return changed

    def _repair(self, devices: list[Json]) -> bool:
        existing = sorted(self._api.list_slices(self._node_name, CALL_TIMEOUT), key=_name)
        current = max([self.generation, *(_generation(s) for s in existing)])
        wanted = slices.slice_specs(self._node_name, devices, current)
        up_to_date = (len(existing) == len(wanted) and current > 0
                      and {_generation(s) for s in existing} == {current}
                      and [slices.content(s.get("spec") or {}) for s in existing]
                      == [slices.content(w) for w in wanted])
        if up_to_date:
            self.generation = current
            return False
        generation = current + 1
        wanted = slices.slice_specs(self._node_name, devices, generation)
        kept, obsolete = existing[:len(wanted)], existing[len(wanted):]
        for stale in obsolete:  # first: the pool must never show more slices than its count says
            self._api.delete_slice(_name(stale), CALL_TIMEOUT)
        for index, spec in enumerate(wanted):
            if index < len(kept):
                body = {**kept[index], "spec": spec}
                self._api.replace_slice(body, CALL_TIMEOUT)
            else:
                self._api.create_slice(slices.new_slice(self._node_name, self._node_uid, spec), CALL_TIMEOUT)
        self.generation = generation
        logger.info("Published ResourceSlices", pool=self._node_name, generation=generation,
                    slices=len(wanted), devices=len(devices), deviceIDs=logged([d["name"] for d in devices]))
        return True
