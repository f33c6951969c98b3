"""The Clone-pattern server: publishes inventory updates and answers snapshot requests.

One thread owns the PUB and ROUTER sockets. The scan loop hands it encoded
messages through an inproc PAIR pipe, so a slow scan (rbln-smi can take
seconds) never delays a worker's snapshot request.
"""

from __future__ import annotations

import itertools
import pathlib
import threading

import zmq
from loguru import logger

from shared import ipc
from shared.resources import Resource

_STOP = b"$STOP"
_SNAPSHOT_REQUEST_MAX_BYTES = 256
_pipe_names = itertools.count()
_TOPICS = frozenset(ipc.topic(resource) for resource in Resource)


class InventoryPublisher:
    def __init__(self, context: zmq.Context, run_dir: pathlib.Path):
        self._context = context
        self._pub_endpoint, self._snapshot_endpoint = ipc.endpoints(run_dir)
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

    def publish(self, message: ipc.InventoryMessage) -> None:
        """Queue a message for publication (called from the thread that called start())."""
        assert self._pipe is not None
        self._pipe.send_multipart([ipc.topic(message.resource), ipc.encode(message)])

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
            pub = self._context.socket(zmq.PUB)
            pub.bind(self._pub_endpoint)
            ipc.restrict_endpoint(self._pub_endpoint)
            router = self._context.socket(zmq.ROUTER)
            # A foreign peer sending something large is disconnected by ZeroMQ itself.
            router.setsockopt(zmq.MAXMSGSIZE, _SNAPSHOT_REQUEST_MAX_BYTES)
            router.bind(self._snapshot_endpoint)
            ipc.restrict_endpoint(self._snapshot_endpoint)
        except Exception as exc:  # handed to start(), which raises it in the caller
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._serve(pipe, pub, router)
        finally:
            for sock in (pipe, pub, router):
                sock.close(linger=0)

    def _serve(self, pipe: zmq.Socket, pub: zmq.Socket, router: zmq.Socket) -> None:
        latest: dict[bytes, bytes] = {}
        waiting: list[tuple[bytes, bytes]] = []  # snapshot requests that arrived before the first scan
        poller = zmq.Poller()
        poller.register(pipe, zmq.POLLIN)
        poller.register(router, zmq.POLLIN)
        while True:
            events = dict(poller.poll())
            if pipe in events:
                frames = pipe.recv_multipart()
                if frames == [_STOP]:
                    return
                topic, payload = frames
                latest[topic] = payload
                pub.send_multipart([topic, payload])
                for identity, wanted in [w for w in waiting if w[1] == topic]:
                    router.send_multipart([identity, ipc.SNAPSHOT_REPLY, payload])
                waiting = [w for w in waiting if w[1] != topic]
            if router in events:
                frames = router.recv_multipart()
                if len(frames) != 3 or frames[1] != ipc.SNAPSHOT_REQUEST or frames[2] not in _TOPICS:
                    logger.warning("Ignored malformed snapshot request", frames=len(frames))
                    continue
                identity, _, topic = frames
                if topic in latest:
                    router.send_multipart([identity, ipc.SNAPSHOT_REPLY, latest[topic]])
                else:
                    waiting.append((identity, topic))
