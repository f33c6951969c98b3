import pathlib
import queue
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from shared.kubelet.podresources.v1 import api_pb2 as podresources_pb2
from shared.kubelet.podresources.v1 import api_pb2_grpc as podresources_pb2_grpc
from simulator.kubelet import KubeletSimulator
from simulator.registration_rules import is_extended_resource_name

NPU = "rebellions.ai/npu"


def device(device_id: str, health: str = "Healthy", numa: int | None = None) -> api_pb2.Device:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa is not None else None
    return api_pb2.Device(ID=device_id, health=health, topology=topology)


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """A minimal device plugin: streams whatever `push` gives it, allocates any ID not starting with "bad"."""

    def __init__(self, socket: pathlib.Path, fail_options: bool = False):
        self.socket = socket
        self.fail_options = fail_options
        self.cond = threading.Condition()
        self.devices: list[api_pb2.Device] = []
        self.queues: list[queue.Queue] = []
        self.options_calls = self.streams_opened = self.streams_ended = 0
        self.server = grpc.server(ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def push(self, devices: list[api_pb2.Device]) -> None:
        with self.cond:
            self.devices = devices
            for stream in self.queues:
                stream.put(devices)

    def end_streams(self) -> None:
        with self.cond:
            for stream in self.queues:
                stream.put(None)

    def wait(self, predicate: Callable[["FakePlugin"], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), timeout=10)

    def GetDevicePluginOptions(self, request, context):
        with self.cond:
            self.options_calls += 1
        if self.fail_options:
            context.abort(grpc.StatusCode.INTERNAL, "options are broken")
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:
        updates: queue.Queue = queue.Queue()
        context.add_callback(lambda: updates.put(None))  # a cancelled stream wakes up and ends
        with self.cond:
            self.queues.append(updates)
            self.streams_opened += 1
            updates.put(self.devices)
            self.cond.notify_all()
        try:
            while (devices := updates.get()) is not None:
                yield api_pb2.ListAndWatchResponse(devices=devices)
        finally:
            with self.cond:
                self.queues.remove(updates)
                self.streams_ended += 1
                self.cond.notify_all()

    def Allocate(self, request, context):
        responses = []
        for container in request.container_requests:
            for device_id in container.devices_ids:
                if device_id.startswith("bad"):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"device {device_id} is unknown")
            responses.append(api_pb2.ContainerAllocateResponse(devices=[
                api_pb2.DeviceSpec(container_path=f"/dev/{d}", host_path=f"/dev/{d}", permissions="rw")
                for d in container.devices_ids]))
        return api_pb2.AllocateResponse(container_responses=responses)

    def GetPreferredAllocation(self, request, context):
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=(list(r.must_include_deviceIDs) + sorted(r.available_deviceIDs))[:r.allocation_size])
            for r in request.container_requests])


def register(kubelet: KubeletSimulator, endpoint: str, resource: str = NPU, version: str = "v1beta1") -> None:
    with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource,
                                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)),
            timeout=15)


@pytest.fixture
def sock_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    if len(str(tmp_path)) < 60:
        yield tmp_path
        return
    short = tempfile.mkdtemp(dir="/tmp", prefix="kubesim-")  # unix socket paths are limited to 107 bytes
    yield pathlib.Path(short)
    shutil.rmtree(short)


@pytest.fixture
def kubelet(sock_dir: pathlib.Path) -> Iterator[KubeletSimulator]:
    with KubeletSimulator(sock_dir / "dp") as simulator:
        yield simulator


@pytest.fixture
def start_plugin(kubelet: KubeletSimulator) -> Iterator[Callable[..., FakePlugin]]:
    plugins: list[FakePlugin] = []

    def start(name: str = "plugin.sock", **options) -> FakePlugin:
        plugins.append(FakePlugin(kubelet.plugin_dir / name, **options))
        return plugins[-1]

    yield start
    for plugin in plugins:
        plugin.server.stop(grace=None).wait()


def test_register_dials_back_and_watches(kubelet, start_plugin):
    plugin = start_plugin()
    plugin.push([device("rbln0", numa=0), device("rbln1", "Unhealthy")])
    register(kubelet, "plugin.sock")
    assert plugin.options_calls == 1  # before Register returned
    view = kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Unhealthy"})
    assert view.devices["rbln0"] == ("Healthy", (0,)) and view.devices["rbln1"].numa_nodes == ()
    assert view.endpoint == "plugin.sock" and view.options.get_preferred_allocation_available
    assert view.connected and view.updates == 1 and view.registrations == 1
    [record] = kubelet.registrations
    assert record.error is None and record.request.resource_name == NPU and record.time > 0


def test_every_message_replaces_the_device_set(kubelet, start_plugin):
    plugin = start_plugin()
    plugin.push([device("rbln0"), device("rbln1")])
    register(kubelet, "plugin.sock")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"})
    plugin.push([device("rbln1", "Unhealthy")])
    view = kubelet.wait_for_devices(NPU, {"rbln1": "Unhealthy"})
    assert view.updates == 2
    assert kubelet.wait_for_devices(NPU, lambda v: v.updates == 2).devices.keys() == {"rbln1"}


def test_unsupported_version_is_refused(kubelet, start_plugin):
    start_plugin()
    with pytest.raises(grpc.RpcError) as refused:
        register(kubelet, "plugin.sock", version="v1alpha")
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert refused.value.details() == ('requested API version "v1alpha" is not supported by kubelet. '
                                       'Supported versions are ["v1beta1"]')
    assert kubelet.resources() == {} and kubelet.registrations[0].error == refused.value.details()


@pytest.mark.parametrize("name", ["npu", "kubernetes.io/npu", "requests.rebellions.ai/npu", "rebellions.ai/",
                                  "Rebellions.ai/npu", "rebellions.ai/npu!", "a/b/c", f"rebellions.ai/{'n' * 64}"])
def test_invalid_resource_name_is_refused(kubelet, start_plugin, name):
    start_plugin()
    with pytest.raises(grpc.RpcError) as refused:
        register(kubelet, "plugin.sock", resource=name)
    assert refused.value.details() == f'the ResourceName "{name}" is invalid'
    assert kubelet.resources() == {}


@pytest.mark.parametrize("name", ["rebellions.ai/npu", "rebellions.ai/npu-vf4", "example.com/A_b.c"])
def test_extended_resource_names(name):
    assert is_extended_resource_name(name)


def test_unreachable_endpoint_fails_register(sock_dir):
    with KubeletSimulator(sock_dir / "dp", dial_timeout=0.3) as kubelet:
        with pytest.raises(grpc.RpcError) as refused:
            register(kubelet, "nobody-here.sock")
        assert refused.value.details().startswith("failed to dial device plugin")
        assert kubelet.resources() == {}


def test_options_failure_fails_register(kubelet, start_plugin):
    plugin = start_plugin(fail_options=True)
    with pytest.raises(grpc.RpcError) as refused:
        register(kubelet, "plugin.sock")
    assert refused.value.details() == "failed to get device plugin options: options are broken"
    assert kubelet.resources() == {} and plugin.streams_opened == 0


def test_end_stream_disconnects_for_good(kubelet, start_plugin):
    plugin = start_plugin()
    plugin.push([device("rbln0")])
    register(kubelet, "plugin.sock")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"})
    kubelet.end_stream(NPU)
    view = kubelet.resources()[NPU]
    assert not view.connected and view.health == {"rbln0": "Healthy"}
    plugin.wait(lambda p: p.streams_ended == 1)
    # The endpoint still answers, but the kubelet never reopens the stream.
    assert kubelet.allocate(NPU, [["rbln0"]]).container_responses[0].devices[0].host_path == "/dev/rbln0"
    assert plugin.streams_opened == 1


def test_stream_ended_by_the_plugin_disconnects(kubelet, start_plugin):
    plugin = start_plugin()
    register(kubelet, "plugin.sock")
    kubelet.wait_for_devices(NPU, {})
    plugin.end_streams()
    kubelet.wait_for(lambda k: not k.resources()[NPU].connected, 10, "the plugin to end its stream")
    assert plugin.streams_opened == 1


def test_new_registration_replaces_the_old_client(kubelet, start_plugin):
    old, new = start_plugin("old.sock"), start_plugin("new.sock")
    old.push([device("rbln0")])
    new.push([device("rbln1")])
    register(kubelet, "old.sock")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"})
    register(kubelet, "new.sock")
    old.wait(lambda p: p.streams_ended == 1)
    view = kubelet.wait_for_devices(NPU, {"rbln1": "Healthy"})
    assert view.endpoint == "new.sock" and view.registrations == 2 and view.connected
    new.push([device("rbln1", "Unhealthy")])
    assert kubelet.wait_for_devices(NPU, {"rbln1": "Unhealthy"}).connected
    assert len(kubelet.registrations) == 2


def test_restart_removes_sockets_and_serves_again(kubelet, start_plugin):
    plugin = start_plugin()
    plugin.push([device("rbln0")])
    register(kubelet, "plugin.sock")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"})
    (kubelet.plugin_dir / "kubelet_internal_checkpoint").write_text("{}")
    (kubelet.plugin_dir / "notes").write_text("not a socket")
    (kubelet.plugin_dir / "subdir").mkdir()

    kubelet.restart()

    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == [
        "kubelet.sock", "kubelet_internal_checkpoint", "notes", "subdir"]
    assert stat.S_ISSOCK(kubelet.socket_path.stat().st_mode)
    plugin.wait(lambda p: p.streams_ended == 1)
    view = kubelet.resources()[NPU]
    assert not view.connected and view.devices == {}  # as restored from the checkpoint
    # A plugin that notices serves on a new socket and registers again.
    again = start_plugin("plugin-2.sock")
    again.push([device("rbln0", "Unhealthy")])
    register(kubelet, "plugin-2.sock")
    assert kubelet.wait_for_devices(NPU, {"rbln0": "Unhealthy"}).registrations == 2


def test_unary_calls(kubelet, start_plugin):
    start_plugin()
    register(kubelet, "plugin.sock")
    response = kubelet.allocate(NPU, [["rbln0", "rbln1"], ["rbln2"]])
    assert [[d.host_path for d in c.devices] for c in response.container_responses] == [
        ["/dev/rbln0", "/dev/rbln1"], ["/dev/rbln2"]]
    with pytest.raises(grpc.RpcError) as failed:
        kubelet.allocate(NPU, [["bad0"]])
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bad0" in failed.value.details()
    preferred = kubelet.preferred_allocation(NPU, ["rbln3", "rbln1", "rbln2"], must_include=["rbln3"], size=2)
    assert list(preferred.container_responses[0].deviceIDs) == ["rbln3", "rbln1"]
    assert kubelet.options(NPU).get_preferred_allocation_available
    with pytest.raises(LookupError, match=r"rebellions\.ai/npu-vf4"):
        kubelet.allocate("rebellions.ai/npu-vf4", [["rbln0-0"]])


def test_wait_for_reports_what_and_state_on_timeout(kubelet, start_plugin):
    start_plugin().push([device("rbln0")])
    register(kubelet, "plugin.sock")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"})
    with pytest.raises(TimeoutError, match=r"(?s)the moon.*rebellions.ai/npu .*rbln0=Healthy"):
        kubelet.wait_for(lambda k: False, 0.05, "the moon")


def test_socket_path_must_fit(tmp_path):
    with pytest.raises(ValueError, match="too long"):
        KubeletSimulator(tmp_path / ("x" * 120))


# The PodResources API


def pod_resources(kubelet: KubeletSimulator) -> list[tuple[str, str, str, str, list[str], list[int]]]:
    """(namespace, pod, container, resource, device IDs, NUMA nodes) as a PodResources client reads List."""
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        response = podresources_pb2_grpc.PodResourcesListerStub(channel).List(
            podresources_pb2.ListPodResourcesRequest(), timeout=5)
    return [(pod.namespace, pod.name, container.name, devices.resource_name, list(devices.device_ids),
             [node.ID for node in devices.topology.nodes])
            for pod in response.pod_resources for container in pod.containers for devices in container.devices]


def test_pod_resources_reports_what_each_allocation_gave_whom(kubelet, start_plugin, sock_dir):
    assert kubelet.pod_resources_socket == sock_dir / "pod-resources" / "kubelet.sock"
    plugin = start_plugin()
    plugin.push([device("rbln0", numa=0), device("rbln1", numa=1), device("rbln2", numa=1)])
    register(kubelet, "plugin.sock")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Healthy"})
    assert pod_resources(kubelet) == []
    kubelet.allocate(NPU, [["rbln0"], ["rbln1", "rbln2"]], pod="train", namespace="ml")
    kubelet.allocate(NPU, [["rbln0"]])  # rbln0 again: its earlier pod has ended, its container keeps nothing
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(NPU, [["bad0"]])  # refused: nobody holds it
    assert pod_resources(kubelet) == [("ml", "train", "ctr-1", NPU, ["rbln1", "rbln2"], [1]),
                                      ("default", "sim-pod-2", "ctr-0", NPU, ["rbln0"], [0])]
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        train = stub.Get(podresources_pb2.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=5)
        assert [c.name for c in train.pod_resources.containers] == ["ctr-1"]
        with pytest.raises(grpc.RpcError):
            stub.Get(podresources_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml"), timeout=5)
        allocatable = stub.GetAllocatableResources(podresources_pb2.AllocatableResourcesRequest(), timeout=5)
        assert [list(d.device_ids) for d in allocatable.devices] == [["rbln0"], ["rbln1"], ["rbln2"]]
    # Kept across a kubelet restart, as the checkpoint keeps them; gone with their pod.
    kubelet.restart()
    assert [entry[:3] for entry in pod_resources(kubelet)] == [("ml", "train", "ctr-1"),
                                                                ("default", "sim-pod-2", "ctr-0")]
    kubelet.release("train", namespace="ml")
    assert [a.pod for a in kubelet.assignments()] == ["sim-pod-2"]


def test_pod_resources_socket_goes_with_the_kubelet(sock_dir):
    kubelet = KubeletSimulator(sock_dir / "dp", pod_resources_socket=sock_dir / "pr" / "podres.sock")
    kubelet.start()
    assert stat.S_ISSOCK(kubelet.pod_resources_socket.stat().st_mode)
    kubelet.stop()
    assert not kubelet.pod_resources_socket.exists()
