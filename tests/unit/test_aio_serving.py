"""shared/kubelet/aio_serving.py: a blocking servicer behind gRPC's asyncio server, called by a real gRPC
client over a unix socket: answers, aborts, callbacks once the call is over, and a stream's generator closed
(its `finally` run) however the call ends."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from shared.kubelet.aio_serving import blocking_handlers
from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from shared.supervision.loop_thread import shared_loop
from tests.support.waiting import wait_until


class Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self) -> None:
        self.over: list[str] = []
        self.closed = threading.Event()
        self.release = threading.Event()

    def GetDevicePluginOptions(self, request, context):
        context.add_callback(lambda: self.over.append("options"))
        return api_pb2.DevicePluginOptions(pre_start_required=True)

    def PreStartContainer(self, request, context):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"no {list(request.devices_ids)}")
        raise AssertionError("abort returned")

    def ListAndWatch(self, request, context):
        context.add_callback(self.release.set)
        try:
            yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID="rbln0", health="Healthy")])
            self.release.wait(30)  # blocked here when the client cancels: the call's end releases it
            if context.is_active():
                yield api_pb2.ListAndWatchResponse()
        finally:
            self.closed.set()


@pytest.fixture
def served(short_tmp):
    servicer = Servicer()
    pool = futures.ThreadPoolExecutor(4)
    loop = shared_loop()
    path = short_tmp / "plugin.sock"

    async def start() -> grpc.aio.Server:
        server = grpc.aio.server(handlers=blocking_handlers(
            lambda capture: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, capture), pool))
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        return server

    server = loop.call(start())
    channel = grpc.insecure_channel(f"unix://{path}")
    yield servicer, api_pb2_grpc.DevicePluginStub(channel), channel
    channel.close()
    loop.call(server.stop(0))
    pool.shutdown(wait=True)


def test_a_call_is_answered_and_its_callbacks_run_once_it_is_over(served):
    servicer, stub, _ = served
    assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5).pre_start_required is True
    wait_until(lambda: servicer.over == ["options"], 5, "the callback")


def test_abort_ends_the_call_with_its_code(served):
    _, stub, _ = served
    with pytest.raises(grpc.RpcError) as refused:
        stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["rbln9"]), timeout=5)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION and refused.value.details() == "no ['rbln9']"


def test_a_request_that_does_not_parse_is_internal_as_the_thread_based_server_says(served):
    _, _, channel = served
    with pytest.raises(grpc.RpcError) as refused:
        channel.unary_unary("/v1beta1.DevicePlugin/PreStartContainer")(b"\xff\xff\xff", timeout=5)
    assert refused.value.code() is grpc.StatusCode.INTERNAL


def test_a_cancelled_stream_releases_its_blocked_generator_and_closes_it(served):
    servicer, stub, _ = served
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=30)
    assert next(stream).devices[0].ID == "rbln0"
    stream.cancel()
    assert servicer.closed.wait(5), "the generator's finally ran"
