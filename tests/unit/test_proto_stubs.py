"""The committed gRPC stubs are exactly what the pinned generator makes of protos/."""

import pathlib
import subprocess
import sys

import pytest

from shared.kubelet.deviceplugin.v1beta1 import api_pb2
from shared.kubelet.podresources.v1 import api_pb2 as podresources_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBELET_APIS = ("deviceplugin/v1beta1", "podresources/v1", "pluginregistration/v1", "dra/v1", "dra/v1beta1",
                "dra_health/v1", "dra_health/v1alpha1")
APISERVER_APIS = ("resource/v1",)
APIS = KUBELET_APIS + APISERVER_APIS


def home(api: str) -> str:
    return f"{'kubelet' if api in KUBELET_APIS else 'kubeapi'}/{api}"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(out)], check=True)
    return out


def test_every_api_under_protos_is_generated(generated):
    protos = sorted(str(p.parent.relative_to(ROOT / "protos")) for p in (ROOT / "protos").rglob("*.proto"))
    assert protos == sorted(APIS)
    assert sorted(str(p.relative_to(generated)) for p in generated.glob("*/*/*")) == sorted(map(home, APIS))


@pytest.mark.parametrize("api", APIS)
def test_committed_stubs_match_the_proto(generated, api):
    """The kubelet's APIs with their gRPC services; the API server's messages alone."""
    names = sorted(p.name for p in (generated / home(api)).iterdir())
    assert names == ["api_pb2.py", "api_pb2.pyi", *(["api_pb2_grpc.py"] if api in KUBELET_APIS else [])]
    for name in names:
        committed = ROOT / "shared" / home(api) / name
        assert (generated / home(api) / name).read_text() == committed.read_text(), \
            f"{committed} is stale: run protos/generate.py"


def test_wire_contract_field_numbers():
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    fields = {f.name: f.number for f in api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    request = {f.name: f.number for f in api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR.fields}
    assert request == {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}
    services = {s.name: [m.name for m in s.methods] for s in api_pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {"Registration": ["Register"],
                        "DevicePlugin": ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation",
                                         "Allocate", "PreStartContainer"]}


def test_pod_resources_wire_contract():
    """What `status` reads of the kubelet's answer: /v1.PodResourcesLister/List and the fields down to the IDs."""
    assert podresources_pb2.DESCRIPTOR.package == "v1"
    service = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]

    def numbers(message):
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(podresources_pb2.ListPodResourcesResponse) == {"pod_resources": 1}
    assert numbers(podresources_pb2.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert numbers(podresources_pb2.ContainerResources) == {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4,
                                                            "dynamic_resources": 5}
    assert numbers(podresources_pb2.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}


def test_plugin_registration_wire_contract():
    """The kubelet's plugin watcher calls /pluginregistration.Registration/* on the registration socket."""
    from shared.kubelet.pluginregistration.v1 import api_pb2 as registration_pb2

    service = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    numbers = {f.name: f.number for f in registration_pb2.PluginInfo.DESCRIPTOR.fields}
    assert numbers == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    status = {f.name: f.number for f in registration_pb2.RegistrationStatus.DESCRIPTOR.fields}
    assert status == {"plugin_registered": 1, "error": 2}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_wire_contract(version):
    """Both DRA services the kubelet may pick, with the same messages and field numbers."""
    import importlib

    dra_pb2 = importlib.import_module(f"shared.kubelet.dra.{version}.api_pb2")
    assert dra_pb2.DESCRIPTOR.package == f"k8s.io.kubelet.pkg.apis.dra.{version}"
    service = dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]

    def numbers(message):
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(dra_pb2.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert numbers(dra_pb2.NodePrepareResourcesRequest) == {"claims": 1}
    assert numbers(dra_pb2.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert numbers(dra_pb2.Device) == {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4,
                                       "share_id": 5}
    assert numbers(dra_pb2.NodeUnprepareResourceResponse) == {"error": 1}


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_dra_health_wire_contract(version):
    """The health service the kubelet watches on the DRA socket: /<version>.DRAResourceHealth/NodeWatchResources,
    a server stream of complete device lists."""
    import importlib

    health_pb2 = importlib.import_module(f"shared.kubelet.dra_health.{version}.api_pb2")
    assert health_pb2.DESCRIPTOR.package == version
    service = health_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == f"{version}.DRAResourceHealth"
    assert [(m.name, m.server_streaming) for m in service.methods] == [("NodeWatchResources", True)]

    def numbers(message):
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(health_pb2.NodeWatchResourcesResponse) == {"devices": 1}
    assert numbers(health_pb2.DeviceHealth) == {"device": 1, "health": 2, "last_updated_time": 3,
                                                "health_check_timeout_seconds": 4, "message": 5}
    assert numbers(health_pb2.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
    assert dict(health_pb2.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
