"""worker-dra's unix sockets: a stale file at the path is replaced, the service answers once start() returns,
and stop() removes the socket."""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import grpc
import pytest

from dra_worker.registration import SUPPORTED_VERSIONS, RegistrationService
from dra_worker.server import UnixServer
from shared.kubelet.pluginregistration.v1 import api_pb2, api_pb2_grpc


@pytest.fixture
def short_dir():
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-srv-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_stale_file_is_replaced_the_service_answers_and_stop_removes_the_socket(short_dir):
    path = short_dir / "registry" / "npu.rebellions.ai-reg.sock"
    path.parent.mkdir()
    path.write_text("left by a killed instance")
    verdicts: list[bool] = []
    service = RegistrationService(short_dir / "plugins" / "dra.sock", on_change=lambda: verdicts.append(True))
    server = UnixServer(path, lambda s: api_pb2_grpc.add_RegistrationServicer_to_server(service, s), "test")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(api_pb2.InfoRequest(), timeout=5)
            assert info.endpoint == str(short_dir / "plugins" / "dra.sock")
            assert tuple(info.supported_versions) == SUPPORTED_VERSIONS == (
                "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
            stub.NotifyRegistrationStatus(api_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
            assert service.registered.is_set() and verdicts == [True]
            stub.NotifyRegistrationStatus(api_pb2.RegistrationStatus(plugin_registered=False, error="x"), timeout=5)
            assert not service.registered.is_set() and verdicts == [True, True]
    finally:
        server.stop()
    assert not path.exists()


def test_the_announced_socket_appears_by_its_name_only_once_served_from_the_same_server(short_dir):
    registry, plugins = short_dir / "registry", short_dir / "plugins"
    registry.mkdir()
    announced = registry / "npu.rebellions.ai-reg.sock"
    announced.write_text("left by a killed instance")
    service = RegistrationService(plugins / "dra.sock")
    seen_before_start: list[list[str]] = []

    def services(server):
        api_pb2_grpc.add_RegistrationServicer_to_server(service, server)
        seen_before_start.append(sorted(p.name for p in registry.iterdir()))

    server = UnixServer(plugins / "dra.sock", services, "test", announced=announced)
    server.start()
    try:
        assert seen_before_start == [["npu.rebellions.ai-reg.sock"]]  # the stale file, until start() replaces it
        assert sorted(p.name for p in registry.iterdir()) == ["npu.rebellions.ai-reg.sock"]  # no hidden name left
        for path in (announced, plugins / "dra.sock"):
            with grpc.insecure_channel(f"unix://{path}") as channel:
                info = api_pb2_grpc.RegistrationStub(channel).GetInfo(api_pb2.InfoRequest(), timeout=5)
                assert info.endpoint == str(plugins / "dra.sock")
    finally:
        server.stop()
    assert list(registry.iterdir()) == [] and not (plugins / "dra.sock").exists()
