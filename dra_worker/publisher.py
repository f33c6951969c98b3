"""Keeps the node's ResourceSlices equal to the inventory, at the cost of one watch
(docs/dra.md#publishing-and-its-api-cost).

Two threads, each owning its part. The watcher owns the view of the API server: one watch-list on this driver's
slices of the node (field selectors spec.nodeName and spec.driver) gives the slices as they are and then every
change, which it applies to the view (an API server without watch-lists: a list, then a watch from its version).
A watch the server ends at its timeout is resumed from the last version seen; one that fails (the API server
restarted, 410 Gone, a broken connection) is re-established afresh after a jittered backoff, so that a fleet's
watches do not come back in one burst.

The publisher wakes on every inventory snapshot and every watch event, and writes only when the slices it wants
differ from the ones the view shows: obsolete slices deleted first (the UID and resourceVersion it saw as
preconditions), changed ones updated (the resourceVersion it saw as precondition), missing ones created, the
pool generation bumped. What it wrote goes into the view at once, so it never writes twice for one change. A
write that loses a race (409 Conflict) is retried once the watch shows the other writer's change; writers that
keep undoing each other (two instances that disagree during an upgrade) are slowed down step by step. At rest
nothing is requested but the watch.

A change confined to one slice (a device tainted or its taint removed, in slices of 64) rewrites that slice and
keeps the pool generation (KEP-5055: the scheduler then sees the one slice's new content at once, with no pool to
wait for). An API server that stores a slice without the taints it was sent has them off: from then on Unhealthy
devices are left out instead (one warning).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from loguru import logger

from dra_worker import slices
from dra_worker.inventory import NodeInventory
from dra_worker.kube import SYNCED, ApiFailure, Backoff, SliceList
from shared.config import TaintEffect
from shared.observability.hostile_ids import logged

Json = dict[str, Any]
# One API call's bound: a publish cycle never stalls for long on a server that does not answer.
CALL_TIMEOUT = 10.0
# How long the API server keeps one watch open, drawn per watch (its own default range for watches that name
# none): few watch requests, spread over the fleet.
WATCH_SECONDS = (1800, 3600)
# After a watch failed, the pause before listing again: doubling from 1 s to 30 s, each drawn between the
# step and twice it, so that after an API server restart a fleet's lists spread out.
RELIST_BACKOFF = (1.0, 30.0)
# A watch that lasted this long was healthy: the next failure starts the backoff afresh.
HEALTHY_WATCH = 60.0
# What an API server without watch-lists answers one (the WatchList feature off): then a list and a watch.
_NO_WATCH_LIST = frozenset({400, 422})
# How many deleted slices the view remembers (SliceView._deleted).
DELETED_KEPT = 64
# Writes less than this apart count as one fight with another writer; each fight step doubles the pause.
FIGHT_WINDOW = 5.0
FIGHT_PAUSE = (0.5, 30.0)


class SliceApi(Protocol):
    def node_uid(self, node_name: str, timeout: float) -> str: ...
    def list_slices(self, node_name: str, timeout: float) -> SliceList: ...
    def watch_slices(self, node_name: str, resource_version: str, server_timeout: int) -> Any: ...
    def watch_list_slices(self, node_name: str, server_timeout: int) -> Any: ...
    def create_slice(self, body: Json, timeout: float) -> Json: ...
    def replace_slice(self, body: Json, timeout: float) -> Json: ...
    def delete_slice(self, existing: Json, timeout: float) -> None: ...


def _name(existing: Json) -> str:
    return str(existing["metadata"]["name"])


def _generation(existing: Json) -> int:
    pool = (existing.get("spec") or {}).get("pool") or {}
    generation = pool.get("generation")
    return generation if isinstance(generation, int) else 0


def _version(item: Json) -> object:
    return (item.get("metadata") or {}).get("resourceVersion")


def _number(version: object) -> int | None:
    """A resourceVersion as a number. Versions are opaque to clients, but all of them come from one API
    server's etcd: compared as numbers when they are numbers."""
    if not isinstance(version, str | int):
        return None
    try:
        return int(version)
    except ValueError:
        return None


def _later_than(item: Json, version: object) -> bool:
    """Whether `item`'s state was written after `version` (False when either is not a number)."""
    written, listed = _number(_version(item)), _number(version)
    return written is not None and listed is not None and written > listed


def _newer(candidate: Json, known: Json | None) -> bool:
    """Whether `candidate` is a later state of the object than `known` (the candidate, when either version is
    not a number)."""
    if known is None:
        return True
    mine, theirs = _number(_version(candidate)), _number(_version(known))
    return mine is None or theirs is None or mine >= theirs


class SliceView:
    """The node's slices as the API server showed them last: the watch's events and this worker's own writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _slices, _deleted and _listed (the watcher and the publisher)
        self._slices: dict[str, Json] = {}
        # The slices deleted lately (the last DELETED_KEPT since the last list), with the version of their
        # deletion: a write's answer that comes after the watch told of the slice's deletion must not bring it
        # back into the view. Such an answer is milliseconds late; a worker that runs for months sees a new
        # slice name at every create, so older entries are let go.
        self._deleted: dict[str, object] = {}
        self._listed = False

    def replace(self, items: list[Json], listed_at: object = None) -> None:
        """The slices as listed at version `listed_at`. What this worker wrote after that version stays (the
        list cannot show it; the watch that follows the list will): else a slice created while a watch was being
        started afresh would be missing from the view, and created twice."""
        with self._lock:
            fresh = {_name(item): item for item in items}
            for name, held in self._slices.items():
                if _later_than(held, listed_at) and _newer(held, fresh.get(name)):
                    fresh[name] = held
            self._slices = fresh
            self._deleted.clear()
            self._listed = True

    def apply(self, kind: str, item: Json) -> bool:
        """A watch event, or a write's answer (MODIFIED); an older state than the one held is ignored. True if
        the view changed: the watch's echo of this worker's own write (the version it holds) changes nothing."""
        name = _name(item)
        with self._lock:
            held = self._slices.get(name)
            if kind == "DELETED":
                self._deleted[name] = _version(item)
                if len(self._deleted) > DELETED_KEPT:
                    del self._deleted[next(iter(self._deleted))]
                return self._slices.pop(name, None) is not None
            if name in self._deleted and not _later_than(item, self._deleted[name]):
                return False
            if not _newer(item, held):
                return False
            self._slices[name] = item
            return held is None or _version(held) != _version(item)

    def snapshot(self) -> list[Json] | None:
        """The slices by name; None until the first list."""
        with self._lock:
            return sorted(self._slices.values(), key=_name) if self._listed else None


class SlicePublisher:
    def __init__(self, api: SliceApi, node_name: str, inventory: Callable[[], NodeInventory],
                 on_publish: Callable[[bool], None] = lambda ok: None,
                 on_watch_restart: Callable[[], None] = lambda: None, draw: Callable[[], float] = random.random,
                 taint_effect: TaintEffect = TaintEffect.NO_SCHEDULE):
        self._api = api
        self._node_name = node_name
        self._inventory = inventory
        self._on_publish = on_publish
        self._on_watch_restart = on_watch_restart
        self._draw = draw
        self.view = SliceView()
        """What the API server showed last (the watcher keeps it; tests may fill it)."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._publish, name="slice-publisher", daemon=True),
                         threading.Thread(target=self._watch, name="slice-watch", daemon=True)]
        # Owned by the publisher thread.
        self._last_write = float("-inf")
        # Owned by the watcher thread: False once the server refused a watch-list.
        self._watch_list = True
        self._fights = 0
        # The devices last built, and the inventory and taint effect they were built from (owned by the publisher
        # thread): the publisher wakes on every watch event too, most of which leave both as they were.
        self._built: tuple[NodeInventory, TaintEffect | None, list[Json]] | None = None
        self._taint_effect: TaintEffect | None = taint_effect
        """None once the API server was seen dropping taints."""
        self.generation = 0
        """The pool generation last published or seen (read by the status file)."""
        self.tainted = 0
        """Devices published with the unhealthy taint (read by the status file)."""

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ends the publisher; the watcher, blocked in its stream, ends with the process (a daemon thread)."""
        self._stop.set()
        self._wake.set()
        self._threads[0].join(timeout=5)

    # -- the watcher ------------------------------------------------------------------------------------

    def _watch(self) -> None:
        backoff = Backoff(*RELIST_BACKOFF)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._list_and_watch()
                reason = "the watch ended"
            except Exception as exc:  # an ApiFailure, or anything unforeseen: this thread alone keeps the view
                reason = str(exc) if isinstance(exc, ApiFailure) else f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            if time.monotonic() - started > HEALTHY_WATCH:
                backoff.reset()
            pause = backoff.pause() * (1 + self._draw())
            logger.warning("ResourceSlice watch ended; starting it afresh", err=reason, retryInSeconds=round(pause, 3))
            self._on_watch_restart()
            self._stop.wait(pause)

    def _list_and_watch(self) -> None:
        low, high = WATCH_SECONDS
        seconds = int(low + (high - low) * self._draw())
        if self._watch_list:
            try:
                self._follow(self._api.watch_list_slices(self._node_name, seconds), synced=False)
                return
            except ApiFailure as failure:
                if failure.status not in _NO_WATCH_LIST:
                    raise
                self._watch_list = False
                logger.info("The API server serves no watch-lists; listing, then watching", err=str(failure))
        listing = self._api.list_slices(self._node_name, CALL_TIMEOUT)
        self.view.replace(listing.items, listing.resource_version)
        self._wake.set()
        self._follow(self._api.watch_slices(self._node_name, listing.resource_version, seconds), synced=True)

    def _follow(self, events: Any, synced: bool) -> None:
        """Apply the events to the view; before SYNCED (a watch-list's initial events), gather them and
        replace the view with them at SYNCED."""
        initial: list[Json] = []
        for kind, item in events:
            if kind == SYNCED:
                self.view.replace(initial, _version(item))
                synced = True
                self._wake.set()
            elif not synced:
                initial.append(item)
            elif kind in ("ADDED", "MODIFIED", "DELETED") and self.view.apply(kind, item):
                self._wake.set()
            if self._stop.is_set():
                return

    # -- the publisher ----------------------------------------------------------------------------------

    def _publish(self) -> None:
        backoff = Backoff(first=0.5, most=30.0)
        wait: float | None = None  # at rest: until something happens
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                changed = self.reconcile_once()
            except Exception as exc:  # an ApiFailure, or anything unforeseen: this thread alone keeps the pool
                unforeseen = not isinstance(exc, ApiFailure)
                wait = backoff.pause()
                logger.opt(exception=unforeseen).warning(
                    "ResourceSlice publish failed; retrying", retryInSeconds=wait,
                    err=f"{type(exc).__name__}: {exc}" if unforeseen else str(exc))
                self._on_publish(False)
                continue
            backoff.reset()
            wait = None
            if changed:
                self._stop.wait(self._fight_pause())

    def _fight_pause(self) -> float:
        """After a write: none for the first in a while, else a doubling pause (another writer undoes ours)."""
        now = time.monotonic()
        self._fights = self._fights + 1 if now - self._last_write < FIGHT_WINDOW else 0
        self._last_write = now
        first, most = FIGHT_PAUSE
        return 0.0 if self._fights == 0 else min(first * 2 ** (self._fights - 1), most)

    def reconcile_once(self) -> bool:
        """Compare what is wanted with what the view shows, and write the difference; True if anything was
        written."""
        inventory = self._inventory()
        if not inventory.complete:
            return False  # a pool published before every resource's snapshot would offer too little
        existing = self.view.snapshot()
        if existing is None:
            return False  # not listed yet: the watcher wakes this thread when it has
        devices = self._devices(inventory)
        changed = self._repair(devices, existing)
        if changed and self._taint_effect is None and slices.tainted(devices):
            devices = self._devices(inventory)  # the server dropped the taints: leave them out
            self._repair(devices, self.view.snapshot() or [])
        self.tainted = slices.tainted(devices)
        if changed:
            self._on_publish(True)
        return changed

    def _devices(self, inventory: NodeInventory) -> list[Json]:
        """The devices to publish (`slices.published_devices`), built once per inventory and taint effect."""
        if self._built is None or self._built[0] is not inventory or self._built[1] is not self._taint_effect:
            self._built = (inventory, self._taint_effect, slices.published_devices(inventory, self._taint_effect))
        return self._built[2]

    def _repair(self, devices: list[Json], existing: list[Json]) -> bool:
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
        # The Node's UID, asked again by every repair that creates: a Node deleted and registered again by its
        # kubelet has a new UID, and the garbage collector deletes the slices the old one owned.
        node_uid = None
        for stale in obsolete:  # first: the pool must never show more slices than its count says
            self._api.delete_slice(stale, CALL_TIMEOUT)
            self.view.apply("DELETED", stale)
        for index in differing:
            if index < len(kept):
                spec = slices.keep_time_added(wanted[index], kept[index].get("spec") or {})
                written = self._api.replace_slice({**kept[index], "spec": spec}, CALL_TIMEOUT)
            else:
                if node_uid is None:
                    node_uid = self._api.node_uid(self._node_name, CALL_TIMEOUT)
                spec = wanted[index]
                body = slices.new_slice(self._node_name, node_uid, spec, slices.slice_name(self._node_name))
                written = self._api.create_slice(body, CALL_TIMEOUT)
            self.view.apply("MODIFIED", written)
            if self._taint_effect is not None and slices.taints_dropped(spec, written.get("spec") or {}):
                self._taint_effect = None
                logger.warning("API server drops device taints; Unhealthy devices are left out of the slices",
                               pool=self._node_name, taint=slices.UNHEALTHY_TAINT_KEY)
        self.generation = wanted[0]["pool"]["generation"]
        logger.info("Published ResourceSlices", pool=self._node_name, generation=self.generation,
                    slices=len(wanted), devices=len(devices), deviceIDs=logged([d["name"] for d in devices]),
                    tainted=logged([d["name"] for d in devices if d.get("taints")]))
        return True
