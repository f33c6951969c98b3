"""The committed gRPC stubs are exactly what the pinned generator makes of protos/."""

import pathlib
import subprocess
import sys

from shared.deviceplugin.v1beta1 import api_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUBS = ROOT / "shared" / "deviceplugin" / "v1beta1"


def test_committed_stubs_match_the_proto(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(tmp_path)], check=True)
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"]
    for name in generated:
        assert (tmp_path / name).read_text() == (STUBS / name).read_text(), f"{name} is stale: run protos/generate.py"


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
