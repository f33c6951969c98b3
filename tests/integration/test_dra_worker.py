"""worker-dra in the real stack (supervisord, scanner, watchdog) on a simulated node, driven over its unix
sockets with gRPC the way the kubelet does: GetInfo, NotifyRegistrationStatus, Prepare and Unprepare repeated
and out of order, v1 and v1beta1, with the worker killed in between.

The API server here is the loopback stand-in of simulator/kube_api.py (claims written by the test, slices
kept as the worker writes them); tests/dra runs the same worker against a real kube-apiserver and the kubelet's
own DRA manager.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess

import grpc
import pytest

from shared.dra.v1 import api_pb2 as v1
from shared.dra.v1 import api_pb2_grpc as v1_grpc
from shared.dra.v1beta1 import api_pb2 as v1beta1
from shared.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from shared.pluginregistration.v1 import api_pb2 as reg
from shared.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from shared.process_status import read_status
from shared.supervisord.client import connect
from simulator.kube_api import FakeKubeApi
from simulator.stack import RUN_COMMAND

NODE = "node-it"
DRIVER = "npu.rebellions.ai"


@pytest.fixture
def api():
    server = FakeKubeApi().start()
    server.nodes[NODE] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid"}}
    yield server
    server.stop()


def _dra_env(node, api, **extra) -> dict[str, str]:
    root = node.root
    return {"RESOURCE_API": "dra", "NODE_NAME": NODE, "KUBELET_PLUGINS_PATH": str(root / "plugins"),
            "KUBELET_PLUGIN_REGISTRY_PATH": str(root / "plugins_registry"),
            "KUBECONFIG": str(api.kubeconfig(root / "kubeconfig")), **extra}


def stack_env(node, api) -> dict[str, str]:
    return {**os.environ, **node.env(), **_dra_env(node, api)}


def _sockets(node) -> tuple[pathlib.Path, pathlib.Path]:
    return node.root / "plugins" / DRIVER / "dra.sock", node.root / "plugins_registry" / f"{DRIVER}-reg.sock"


def _claim(api, uid: str, devices: list[str], name: str) -> v1.Claim:
    api.claims[("default", name)] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid}, "spec": {"devices": {}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "npus", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]}}}}
    return v1.Claim(namespace="default", uid=uid, name=name)


def _channel(path: pathlib.Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


def _published(api) -> list[str]:
    return sorted(d["name"] for s in api.slices.values() for d in s["spec"]["devices"])


def test_registration_serving_and_slices(make_node, start_stack, api):
    node = make_node("2,1:vf4")
    stack = start_stack(node, **_dra_env(node, api))
    stack.wait_for_record("Serving the DRA plugin")
    dra_sock, reg_sock = _sockets(node)
    with _channel(reg_sock) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
            "DRAPlugin", DRIVER, str(dra_sock),
            ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"])
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error="no such version"),
                                      timeout=5)
        stack.wait_for_record("Kubelet refused the DRA plugin registration", err="no such version")
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
        assert read_status(node.run_dir, "worker-dra")["registered"] is True, "readiness sees it at once"
        stack.wait_for_record("Registered with the kubelet")
    published = stack.wait_for_record("Published ResourceSlices")[0]
    expected = sorted(d.device for d in node.inventory if d.is_vf or not d.num_vfs)
    assert published["deviceIDs"] == expected
    assert _published(api) == expected
    starts = {r["process"] for r in stack.find("Starting rbln-device-plugin")}
    assert starts == {"scanner", "worker-dra", "watchdog"}, "no device plugin worker runs in DRA mode"
    assert set(connect(node.run_dir).programs()) == {"scanner", "worker-dra", "watchdog"}
    assert not list(node.plugin_dir.glob("rbln-device-plugin-*.sock"))
    # Anyone deleting the slices: the watch shows it, and they are back.
    for name in list(api.slices):
        api.remove_slice(name)
    stack.wait_for_record("Published ResourceSlices", count=2)
    assert _published(api) == expected


def test_prepare_and_unprepare_repeated_out_of_order_and_across_a_restart(make_node, start_stack, api):
    node = make_node("2")
    stack = start_stack(node, **_dra_env(node, api))
    # The first publication comes once the scanner's inventory is complete; a Prepare before it is told to retry.
    stack.wait_for_record("Published ResourceSlices")
    dra_sock, _reg = _sockets(node)
    one, two = _claim(api, "uid-1", ["rbln0"], "one"), _claim(api, "uid-2", ["rbln1"], "two")
    with _channel(dra_sock) as channel:
        stub, beta = v1_grpc.DRAPluginStub(channel), v1beta1_grpc.DRAPluginStub(channel)
        # Unprepare before any Prepare: nothing to undo.
        early = stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[two]), timeout=10)
        assert early.claims["uid-2"].error == ""
        first = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[one, two]), timeout=30)
        assert {uid: r.error for uid, r in first.claims.items()} == {"uid-1": "", "uid-2": ""}
        device = first.claims["uid-1"].devices[0]
        assert (device.pool_name, device.device_name, list(device.request_names)) == (NODE, "rbln0", ["npus"])
        assert device.cdi_device_ids[0] == "k8s.npu.rebellions.ai/npu=uid-1-rbln0"
        spec = json.loads((node.cdi_root / "k8s.npu.rebellions.ai-npu_uid-1.json").read_text())
        assert spec["devices"][0]["containerEdits"]["deviceNodes"][1]["hostPath"] == "/dev/rbln0"
        # The same claim through v1beta1 gets the same answer.
        repeat = beta.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(
            claims=[v1beta1.Claim(namespace="default", uid="uid-1", name="one")]), timeout=30)
        assert repeat.claims["uid-1"].devices[0].SerializeToString() == device.SerializeToString()
        # A second claim for a device prepared for the first is refused, in its own error field.
        clash = _claim(api, "uid-3", ["rbln0"], "three")
        refused = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[clash]), timeout=30)
        assert "already prepared for claim uid-1" in refused.claims["uid-3"].error
        groups = node.rsd_groups()

    status = read_status(node.run_dir, "worker-dra")
    assert status is not None and status["preparedClaims"] == 2
    report = json.loads(subprocess.run([*RUN_COMMAND[:-1], "status", "--json"], env=stack_env(node, api),
                                       capture_output=True, text=True, timeout=30).stdout)
    assert list(report["processes"]) == ["scanner", "worker-dra", "watchdog"]
    assert report["dra"]["preparedClaims"] == 2
    os.kill(status["pid"], signal.SIGKILL)
    stack.wait_for_record("Serving the DRA plugin", count=2, timeout=30)
    with _channel(dra_sock) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        again = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[one]), timeout=30)
        assert again.claims["uid-1"].devices[0].SerializeToString() == device.SerializeToString()
        assert node.rsd_groups() == groups, "a restart changes no group"
        done = stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[one, two]), timeout=30)
        assert {uid: r.error for uid, r in done.claims.items()} == {"uid-1": "", "uid-2": ""}
    assert {gid for gid in node.rsd_groups() if gid != 0} == set()
    assert not list(node.cdi_root.glob("k8s.npu.rebellions.ai-npu_*"))


def test_an_unreachable_api_server_fails_the_claim_not_the_worker(make_node, start_stack, api):
    node = make_node("1")
    stack = start_stack(node, **_dra_env(node, api))
    stack.wait_for_record("Serving the DRA plugin")
    api.fail = [503] * 1000
    dra_sock, _reg = _sockets(node)
    with _channel(dra_sock) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        answer = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(
            claims=[_claim(api, "uid-1", ["rbln0"], "one")]), timeout=40)
        assert "503" in answer.claims["uid-1"].error
    stack.wait_for_record("Claim preparation failed", claimUID="uid-1")
    assert len(stack.find("Starting rbln-device-plugin", process="worker-dra")) == 1


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(RUN_COMMAND, env=env, capture_output=True, text=True, timeout=60)


def test_a_node_serves_its_npus_one_way_only(make_node, start_stack, api):
    node = make_node("1")
    env = _dra_env(node, api)
    stack = start_stack(node, **env)
    stack.wait_for_record("Serving the DRA plugin")
    other = {**os.environ, **node.env(), **env, "RESOURCE_API": "device-plugin",
             "RBLN_DEVICE_PLUGIN_RUN_DIR": str(node.root / "run2")}
    refused = _run(other)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "a live DRA plugin serves this node's NPUs" in lines[0]
    assert stack.stop() == 0
    assert [path.exists() for path in _sockets(node)] == [False, False], "its own sockets go at stop"
    # A device plugin worker's live socket keeps a DRA stack from starting.
    plugin_socket = node.plugin_dir / f"rbln-device-plugin-rebellions-ai-npu-{'0' * 8}.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(plugin_socket))
        listener.listen()
        refused = _run({**os.environ, **node.env(), **env})
    assert refused.returncode == 2 and "a live device plugin serves this node's NPUs" in refused.stderr


def test_the_stack_s_metrics_count_prepares_prepared_claims_and_slice_publishes(make_node, start_stack, api):
    from shared.metrics import FAMILIES
    from tests.support.metrics_scrape import families, metrics_port, scrape_text, value, wait_for_scrape

    node = make_node("1")
    stack = start_stack(node, METRICS_PORT="0", **_dra_env(node, api))
    stack.wait_for_record("Published ResourceSlices")
    port = metrics_port(stack)
    dra_sock, _reg = _sockets(node)
    with _channel(dra_sock) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        claims = [_claim(api, "uid-1", ["rbln0"], "one"), _claim(api, "uid-2", ["rbln7"], "unknown")]
        answer = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=claims), timeout=30)
        assert answer.claims["uid-1"].error == "" and answer.claims["uid-2"].error
    samples = wait_for_scrape(port, lambda s: value(s, "rbln_device_plugin_dra_prepared_claims") == 1,
                              "the prepared claim counted")
    assert value(samples, "rbln_device_plugin_dra_prepares_total", result="success") == 1
    assert value(samples, "rbln_device_plugin_dra_prepares_total", result="failure") == 1
    assert value(samples, "rbln_device_plugin_dra_prepare_duration_seconds_count") == 2
    assert value(samples, "rbln_device_plugin_dra_slice_publishes_total", result="success") >= 1
    names = families(scrape_text(port))
    assert {"rbln_device_plugin_dra_prepares_total", "rbln_device_plugin_dra_slice_publishes_total",
            "rbln_device_plugin_dra_prepared_claims"} <= names <= {family.name for family in FAMILIES}
