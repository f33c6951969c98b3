"""The two unix sockets worker-dra serves: the DRA service first, then the registration socket the kubelet
watches for, so that the kubelet never finds a plugin it cannot reach. Stale files at either path (a killed
instance's) are removed at start; at stop each socket goes, registration first, so the kubelet deregisters
the plugin before its service ends."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from concurrent import futures

import grpc

from shared.streams import MAX_OPEN_STREAMS

# Prepare and Unprepare are serialized anyway; the others wait in the queue rather than time out at once. Each
# open health stream holds a thread of its own for its whole life: room for as many as may be open.
_THREADS = 4 + MAX_OPEN_STREAMS


def _remove(path: pathlib.Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class UnixServer:
    def __init__(self, path: pathlib.Path, add_services: Callable[[grpc.Server], None], name: str):
        self.path = path
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix=name),
                                   options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)])
        add_services(self._server)

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove(self.path)
        if self._server.add_insecure_port(f"unix://{self.path}") == 0:
            raise OSError(f"cannot listen on {self.path}")
        self._server.start()

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)
        _remove(self.path)
