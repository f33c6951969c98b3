"""The Clone-pattern server: publishes inventory updates and answers snapshot requests.

One thread owns the PUB and ROUTER sockets. The scan loop hands it encoded
messages through an inproc PAIR pipe, so a slow scan (rbln-smi can take
seconds) never delays a worker's snapshot request.
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import stat
import threading
import time

import zmq
from loguru import logger

from shared.channels import inventory_protocol
from shared.resources import Resource

_STOP = b"$STOP"
_SNAPSHOT_REQUEST_MAX_BYTES = 256
_pipe_names = itertools.count()
_TOPICS = frozenset(inventory_protocol.topic(resource) for resource in Resource)
# The socket files are checked (see _BoundSocket) after each publication, which a scan's wake-up brings
# anyway, and at least this often, so that a long scan interval leaves no lost file for long either.
_FILE_CHECK_SECONDS = 10.0
# Requests held until the first scan: a few per worker; a peer asking without end is not remembered.
_MAX_WAITING = 64


class InventoryPublisher:
    def __init__(self, context: zmq.Context, run_dir: pathlib.Path):
        self._context = context
        self._pub_endpoint, self._snapshot_endpoint = inventory_protocol.endpoints(run_dir)
        self._pipe_endpoint = f"inproc://inventory-publisher-{next(_pipe_names)}"
        self._ready = threading.Event()
        self._startup_error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="inventory-publisher", daemon=True)
        self._pipe: zmq.Socket | None = None  # the caller's end; owned by the thread that calls start()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
        self._pipe = self._context.socket(zmq.PAIR)
        self._pipe.connect(self._pipe_endpoint)

    def publish(self, message: inventory_protocol.InventoryMessage) -> None:
        """Queue a message for publication (called from the thread that called start())."""
        assert self._pipe is not None
        self._pipe.send_multipart([inventory_protocol.topic(message.resource), inventory_protocol.encode(message)])

    def stop(self) -> None:
        if self._pipe is not None:
            self._pipe.send_multipart([_STOP])
            self._thread.join(timeout=5)
            self._pipe.close(linger=0)
            self._pipe = None

    def _run(self) -> None:
        try:
            pipe = self._context.socket(zmq.PAIR)
            pipe.bind(self._pipe_endpoint)
            pub = _BoundSocket(self._context, zmq.PUB, self._pub_endpoint)
            router = _BoundSocket(self._context, zmq.ROUTER, self._snapshot_endpoint)
        except Exception as exc:  # handed to start(), which raises it in the caller
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._serve(pipe, pub, router)
        finally:
            pipe.close(linger=0)
            pub.close()
            router.close()

    def _serve(self, pipe: zmq.Socket, pub: _BoundSocket, router: _BoundSocket) -> None:
        latest: dict[bytes, bytes] = {}
        waiting: list[tuple[bytes, bytes]] = []  # snapshot requests that arrived before the first scan
        poller = zmq.Poller()
        poller.register(pipe, zmq.POLLIN)
        poller.register(router.socket, zmq.POLLIN)
        next_check = time.monotonic() + _FILE_CHECK_SECONDS
        while True:
            events = dict(poller.poll(max(0, math.ceil((next_check - time.monotonic()) * 1000))))
            if pipe in events:
                frames = pipe.recv_multipart()
                if frames == [_STOP]:
                    return
                topic, payload = frames
                latest[topic] = payload
                pub.socket.send_multipart([topic, payload])
                for identity, _topic in [w for w in waiting if w[1] == topic]:
                    router.socket.send_multipart([identity, inventory_protocol.SNAPSHOT_REPLY, payload])
                waiting = [w for w in waiting if w[1] != topic]
            if router.socket in events:
                frames = router.socket.recv_multipart()
                if len(frames) != 3 or frames[1] != inventory_protocol.SNAPSHOT_REQUEST or frames[2] not in _TOPICS:
                    logger.warning("Ignored malformed snapshot request", frames=len(frames))
                elif frames[2] in latest:
                    router.socket.send_multipart([frames[0], inventory_protocol.SNAPSHOT_REPLY, latest[frames[2]]])
                elif len(waiting) < _MAX_WAITING:
                    waiting.append((frames[0], frames[2]))
            if pipe in events or time.monotonic() >= next_check:
                next_check = time.monotonic() + _FILE_CHECK_SECONDS
                pub.rebind_if_lost()
                if router.rebind_if_lost(poller):
                    waiting.clear()  # asked on connections that are gone; the workers ask again


class _BoundSocket:
    """A socket bound to an ipc endpoint, with the identity of the socket file its bind made.

    The file is the only way in: if it is deleted or replaced, workers that connect
    later (a restarted worker, a resync) would never reach the scanner, so the socket
    is replaced by a fresh one bound to the same path. Workers connected to the old one
    are cut off, and ZeroMQ reconnects them to the new file by itself.
    """

    def __init__(self, context: zmq.Context, kind: int, endpoint: str):
        self._context = context
        self._kind = kind
        self._endpoint = endpoint
        self._path = endpoint.removeprefix("ipc://")
        self.socket, self._identity = self._bind()

    def _bind(self) -> tuple[zmq.Socket, tuple[int, int]]:
        sock = self._context.socket(self._kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self._kind == zmq.ROUTER:
            # A foreign peer sending something large is disconnected by ZeroMQ itself.
            sock.setsockopt(zmq.MAXMSGSIZE, _SNAPSHOT_REQUEST_MAX_BYTES)
        try:
            sock.bind(self._endpoint)
            inventory_protocol.restrict_endpoint(self._endpoint)
            info = os.stat(self._path)
        except BaseException:
            sock.close()
            raise
        return sock, (info.st_dev, info.st_ino)

    def _file_is_ours(self) -> bool:
        try:
            info = os.stat(self._path)
        except OSError:
            return False
        return stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == self._identity

    def rebind_if_lost(self, poller: zmq.Poller | None = None) -> bool:
        """Replace the socket when its file is gone or is not ours any more; True if it was replaced."""
        if self._file_is_ours():
            return False
        logger.warning("IPC socket file was removed or replaced; binding it again", path=self._path)
        try:
            fresh, identity = self._bind()
        except (zmq.ZMQError, OSError) as exc:
            logger.error("Cannot bind the IPC socket again; retrying", path=self._path, err=str(exc))
            return False
        if poller is not None:
            poller.unregister(self.socket)
            poller.register(fresh, zmq.POLLIN)
        self.socket.close()
        self.socket, self._identity = fresh, identity
        return True

    def close(self) -> None:
        ours = self._file_is_ours()
        self.socket.close(linger=0)
        if ours:  # libzmq leaves ipc socket files behind
            try:
                os.unlink(self._path)
            except OSError:
                pass
