"""The Clone-pattern client: keeps one resource's inventory in sync with the scanner.

One thread owns both sockets. It sleeps in zmq poll until a message, the
heartbeat timeout or stop() (a frame on an inproc pipe) wakes it. It subscribes first, then asks for a snapshot
(updates queue in the SUB socket meanwhile), drops updates the snapshot
already covers, and starts over on a sequence gap, a new scanner epoch or a
missed heartbeat. While the scanner is away the last good state stays in force.
"""

from __future__ import annotations

import enum
import itertools
import pathlib
import threading
from collections.abc import Callable

import zmq
from loguru import logger

from shared.channels import inventory_protocol
from shared.resources import Resource

_stop_names = itertools.count()


class SyncState(enum.Enum):
    INITIAL = "initial"
    SYNCING = "syncing"
    ACTIVE = "active"


class InventorySubscriber:
    def __init__(self, context: zmq.Context, run_dir: pathlib.Path, resource: Resource,
                 on_inventory: Callable[[inventory_protocol.InventoryMessage], None], heartbeat_timeout: float):
        self._context = context
        self._pub_endpoint, self._snapshot_endpoint = inventory_protocol.endpoints(run_dir)
        self._resource = resource
        self._topic = inventory_protocol.topic(resource)
        self._on_inventory = on_inventory
        self._timeout_ms = max(1, int(heartbeat_timeout * 1000))
        self._stop = threading.Event()
        self._stop_endpoint = f"inproc://inventory-subscriber-stop-{next(_stop_names)}"
        self._stop_pipe: zmq.Socket | None = None  # the sending end; owned by the thread that calls start()
        self._stopped: zmq.Socket | None = None  # the receiving end; owned by the subscriber thread
        self._thread = threading.Thread(target=self._run, name="inventory-subscriber", daemon=True)
        self.state = SyncState.INITIAL
        self._epoch: str | None = None
        self._seq = 0
        self._stale_logged = False

    def start(self) -> None:
        # Bound before the thread connects its end, so its connect attaches at once.
        self._stop_pipe = self._context.socket(zmq.PAIR)
        self._stop_pipe.bind(self._stop_endpoint)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._stop_pipe is None:
            return
        try:
            self._stop_pipe.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass  # the thread's end is not connected yet: it sees the event before it first waits
        self._thread.join(timeout=5)
        self._stop_pipe.close(linger=0)
        self._stop_pipe = None

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, inventory_protocol.MAX_MESSAGE_BYTES)
        if kind == zmq.SUB:
            sock.setsockopt(zmq.SUBSCRIBE, self._topic)
        sock.connect(endpoint)
        return sock

    def _run(self) -> None:
        self._stopped = self._context.socket(zmq.PAIR)
        self._stopped.connect(self._stop_endpoint)
        try:
            while not self._stop.is_set():
                self._run_session()
        finally:
            self._stopped.close(linger=0)

    def _run_session(self) -> None:
        sub = self._socket(zmq.SUB, self._pub_endpoint)
        snapshot = self._socket(zmq.DEALER, self._snapshot_endpoint)
        try:
            self._session(sub, snapshot)
        except Exception:
            # The thread must outlive anything a peer can send; start a new session.
            logger.opt(exception=True).warning("Inventory subscription failed; resyncing",
                                               resourceName=self._resource.value)
        finally:
            sub.close()
            snapshot.close()
        self.state = SyncState.INITIAL

    def _session(self, sub: zmq.Socket, snapshot: zmq.Socket) -> None:
        """Sync once, then follow updates until a resync is needed or stop() is called."""
        self.state = SyncState.SYNCING
        snapshot.send_multipart([inventory_protocol.SNAPSHOT_REQUEST, self._topic])
        if not self._await_snapshot(snapshot):
            return
        self.state = SyncState.ACTIVE
        while not self._stop.is_set():
            if not self._readable(sub):
                self._log_stale("no update from the scanner within the heartbeat timeout")
                return
            frames = sub.recv_multipart()
            message = self._decode(frames[1] if len(frames) == 2 and frames[0] == self._topic else None)
            if message is None:
                continue
            if message.epoch != self._epoch:
                logger.info("Scanner restarted; resyncing inventory", resourceName=self._resource.value)
                return
            if message.seq <= self._seq:
                continue  # already covered by the snapshot
            if message.seq != self._seq + 1:
                logger.warning("Inventory update sequence gap; resyncing", resourceName=self._resource.value,
                               expected=self._seq + 1, received=message.seq)
                return
            self._accept(message)

    def _await_snapshot(self, snapshot: zmq.Socket) -> bool:
        while not self._stop.is_set():
            if not self._readable(snapshot):
                self._log_stale("the scanner did not answer a snapshot request")
                return False
            frames = snapshot.recv_multipart()
            if len(frames) != 2 or frames[0] != inventory_protocol.SNAPSHOT_REPLY:
                logger.warning("Ignored malformed snapshot reply", resourceName=self._resource.value)
                continue
            message = self._decode(frames[1])
            if message is not None:
                self._epoch = message.epoch
                self._seq = 0
                self._accept(message)
                return True
        return False

    def _readable(self, sock: zmq.Socket) -> bool:
        """Wait up to the heartbeat timeout for a message on `sock`; False at the timeout or on stop()."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._stopped, zmq.POLLIN)
        events = dict(poller.poll(self._timeout_ms))
        return sock in events and self._stopped not in events

    def _decode(self, payload: bytes | None) -> inventory_protocol.InventoryMessage | None:
        try:
            if payload is None:
                raise inventory_protocol.ProtocolError("unexpected frames")
            message = inventory_protocol.decode(payload)
            if message.resource is not self._resource:
                raise inventory_protocol.ProtocolError(f"message for {message.resource.value}")
            return message
        except inventory_protocol.ProtocolError as exc:
            logger.warning("Ignored malformed inventory message; keeping the last good state",
                           resourceName=self._resource.value, err=str(exc))
            return None

    def _accept(self, message: inventory_protocol.InventoryMessage) -> None:
        self._seq = message.seq
        if self._stale_logged:
            logger.info("Inventory updates resumed", resourceName=self._resource.value)
            self._stale_logged = False
        self._on_inventory(message)

    def _log_stale(self, reason: str) -> None:
        if not self._stale_logged and not self._stop.is_set():
            logger.warning("Scanner unreachable; keeping the last inventory", resourceName=self._resource.value,
                           err=reason)
            self._stale_logged = True
