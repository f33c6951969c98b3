"""A servicer of plain blocking methods, served by gRPC's asyncio server.

gRPC's thread-based server keeps a thread that polls its completion queue every 200 ms (its check for
Python signals): 21 ms of CPU a minute at rest, a sixth of an idle node's stack (per-thread schedstat over
60 s, 8-NPU node). Its asyncio server waits for work without a timeout. The servicer stays what it was: each
call runs on the handler pool, as the thread-based server ran it, with a context that offers what the
thread-based one did (`abort`, `add_callback`, `is_active`); a server-streaming call's generator is advanced on
the pool one response at a time, and closed there once the call is over, so that its `finally` runs whatever
ended the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Generator
from concurrent import futures
from typing import Any, NoReturn

import grpc

_END = object()


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The blocking handler's view of its call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _callbacks and _over
        self._callbacks: list[Callable[[], None]] = []
        self._over = False

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        """Ends the call with `code`, as the thread-based server's abort does: by raising."""
        raise _Abort(code, details)

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """`callback` once the call is over; False (and not registered) if it is over already."""
        with self._lock:
            if self._over:
                return False
            self._callbacks.append(callback)
            return True

    def is_active(self) -> bool:
        with self._lock:
            return not self._over

    def end(self) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class _Responses:
    """A streaming handler's generator: one thread at a time advances or closes it."""

    def __init__(self, iterator: Generator[Any, None, None], call: CallContext):
        self._iterator = iterator
        self._call = call
        self._lock = threading.Lock()  # guards the generator: advanced and closed on pool threads

    def advance(self) -> Any:
        with self._lock:
            item = next(self._iterator, _END) if self._call.is_active() else _END
            if item is _END or not self._call.is_active():
                self._iterator.close()  # over while this response was made: nobody takes it
                return _END
            return item

    def close(self) -> None:
        with self._lock:
            self._iterator.close()


def _unary(method: Callable[..., Any], pool: futures.ThreadPoolExecutor) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = CallContext()

        def over(_context: object) -> None:
            call.end()

        context.add_done_callback(over)  # type: ignore[arg-type]  # typeshed's stub wants its own alias
        await _refuse_malformed(request, context)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, method, request, call)
        except _Abort as abort:
            await context.abort(abort.code, abort.details)

    return handler


def _server_stream(method: Callable[..., Generator[Any, None, None]],
                   pool: futures.ThreadPoolExecutor) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> None:
        await _refuse_malformed(request, context)
        call = CallContext()
        responses = _Responses(method(request, call), call)
        loop = asyncio.get_running_loop()
        try:
            while (item := await loop.run_in_executor(pool, responses.advance)) is not _END:
                await context.write(item)
        except _Abort as abort:
            await context.abort(abort.code, abort.details)
        finally:
            call.end()  # wakes a generator waiting for something to send
            with contextlib.suppress(RuntimeError):  # the pool is shut down: the process is stopping
                pool.submit(responses.close)

    return handler


class _Malformed:
    """A request its message type could not parse: the handler refuses it, saying what the parser said."""

    def __init__(self, error: Exception):
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # protobuf's DecodeError, and whatever a parser may raise on hostile bytes
            return _Malformed(exc)

    return deserialize


async def _refuse_malformed(request: Any, context: grpc.aio.ServicerContext) -> None:
    """Ends the call (abort raises) if the request could not be parsed: INTERNAL, as the thread-based server
    answers it (the asyncio one would say UNKNOWN)."""
    if isinstance(request, _Malformed):
        await context.abort(grpc.StatusCode.INTERNAL, f"Exception deserializing request: {request.error}")


class _Capture:
    """Stands in for a server to generated `add_…Servicer_to_server` functions: keeps their method handlers."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.services[service] = handlers


def _blocking(name: str, handler: grpc.RpcMethodHandler, pool: futures.ThreadPoolExecutor) -> grpc.RpcMethodHandler:
    assert handler.request_deserializer is not None, f"{name}: no request type"
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _server_stream(handler.unary_stream, pool),  # type: ignore[arg-type]  # a generator
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer)
    assert handler.unary_unary is not None, f"{name}: neither unary nor server-streaming"
    return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, pool),
                                               request_deserializer=_tolerant(handler.request_deserializer),
                                               response_serializer=handler.response_serializer)


def blocking_handlers(add_services: Callable[[Any], None],
                      pool: futures.ThreadPoolExecutor) -> list[grpc.GenericRpcHandler]:
    """The handlers that `add_services` (calling generated `add_…Servicer_to_server` functions on the server it
    is given) would give a server, each method run on `pool`: for an asyncio server's `handlers`. Unary and
    server-streaming methods only (all that the kubelet's plugin APIs have)."""
    captured = _Capture()
    add_services(captured)
    return [grpc.method_handlers_generic_handler(service, {name: _blocking(name, handler, pool)
                                                           for name, handler in handlers.items()})
            for service, handlers in captured.services.items()]
