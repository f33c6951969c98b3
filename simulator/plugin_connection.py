"""The kubelet simulator's connection to one registered plugin endpoint, and the ListAndWatch stream on it."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc


class PluginConnection:
    """The kubelet's connection to one registered plugin endpoint."""

    def __init__(self, resource: str, socket: pathlib.Path):
        self.resource = resource
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stream: Any = None  # the ListAndWatch call: an iterator that can be cancelled
        self._cancelled = False

    def open_stream(self) -> Iterator[api_pb2.ListAndWatchResponse]:
        with self._lock:
            if self._cancelled:
                return iter(())
            self._stream = self.stub.ListAndWatch(api_pb2.Empty())
            return self._stream

    def cancel_stream(self) -> None:
        with self._lock:
            self._cancelled = True
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        self.cancel_stream()
        self.channel.close()
