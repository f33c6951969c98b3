"""worker-dra's gRPC server on its two unix sockets: the DRA socket (the DRA and health services), and the
registration socket the kubelet watches for, which appears only once the server serves, so that the kubelet
never finds a plugin it cannot reach. Stale files at either path (a killed instance's) are removed at start;
at stop the registration socket goes first, so the kubelet deregisters the plugin before its service ends.

One server for both sockets, gRPC's asyncio one with the blocking servicers on its handler pool
(shared/kubelet/aio_serving.py): gRPC's thread-based server keeps a thread that wakes every 200 ms (its check
for Python signals), 21 ms of CPU a minute at rest, measured; worker-dra ran two. The registration socket is
bound under a hidden name (the kubelet's plugin watcher skips names that begin with a dot) and renamed into
place once the server has started: the kubelet sees it appear (a rename into its directory is a creation to
its watch) ready to answer.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from shared.kubelet.aio_serving import blocking_handlers
from shared.kubelet.streams import MAX_OPEN_STREAMS
from shared.supervision.loop_thread import shared_loop

# Prepare and Unprepare are serialized anyway; the others wait in the queue rather than time out at once. Each
# open health stream holds a thread of its own for its whole life: room for as many as may be open, and for
# the kubelet's registration calls.
_THREADS = 6 + MAX_OPEN_STREAMS


def _remove(path: pathlib.Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _hidden(path: pathlib.Path) -> pathlib.Path:
    """A name of the same directory no other instance uses, never longer than the socket's own: a unix socket's
    path has 107 bytes at most, which the pod UID's names come near."""
    return path.with_name(f".{os.urandom(4).hex()}.sock")


class UnixServer:
    """Serves `path` and, if given, `announced` (the socket the kubelet watches for) from one gRPC server."""

    def __init__(self, path: pathlib.Path, add_services: Callable[[Any], None], name: str,
                 announced: pathlib.Path | None = None):
        self.path = path
        self.announced = announced
        self._pool = futures.ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix=name)
        self._handlers = blocking_handlers(add_services, self._pool)
        self._loop = shared_loop()
        self._server: grpc.aio.Server | None = None

    @staticmethod
    def _listen(server: grpc.aio.Server, path: pathlib.Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(path)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise OSError(f"cannot listen on {path}")

    async def _start(self) -> None:
        server = grpc.aio.server(handlers=self._handlers,
                                 options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)])
        self._listen(server, self.path)
        hidden = None
        if self.announced is not None:
            _remove(self.announced)
            hidden = _hidden(self.announced)
            self._listen(server, hidden)
        await server.start()
        self._server = server
        if hidden is not None and self.announced is not None:
            hidden.rename(self.announced)

    def start(self) -> None:
        self._loop.call(self._start())

    def stop(self, grace: float = 1.0) -> None:
        if self.announced is not None:
            _remove(self.announced)
        if self._server is not None:
            self._loop.call(self._server.stop(grace))
        self._pool.shutdown(wait=True)
        _remove(self.path)
