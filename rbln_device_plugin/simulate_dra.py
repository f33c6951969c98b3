"""`rbln-device-plugin simulate --resource-api dra`: the real stack in DRA mode on a simulated node, with a
loopback stand-in for the API server (simulator/kube_api.py) and for the kubelet's side of a DRA plugin
(simulator/dra_kubelet.py): the published slices, a claim prepared and its CDI spec, a device turning Unhealthy
(its taint in the slice, the health stream's message), and `rbln-device-plugin status`."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import textwrap
import time
from collections.abc import Callable
from typing import Any

from rbln_device_plugin import status
from shared.config import DRA_DRIVER
from shared.device_status import KernelStatus
from simulator.dra_kubelet import DraKubeletStandIn
from simulator.kube_api import FakeKubeApi
from simulator.node import SimulatedNode
from simulator.stack import StackProcess

NODE_NAME = "simulated-node"
NAMESPACE = "demo"
CLAIM_NAME = "npu-claim"
CLAIM_UID = "5e1f0c2a-0000-4000-8000-00000000c1a1"
START_TIMEOUT = 60.0
_POLL = 0.1


def _published(api: FakeKubeApi) -> dict[str, dict[str, Any]]:
    return {device["name"]: device for item in api.current_slices() for device in item["spec"]["devices"]}


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(_POLL)


def _attribute(device: dict[str, Any], name: str) -> str:
    value = device["attributes"].get(name) or {}
    return str(next(iter(value.values()), "-"))


def _show_slices(api: FakeKubeApi) -> None:
    for item in api.current_slices():
        spec = item["spec"]
        print(f"  {item['metadata']['name']}: pool {spec['pool']['name']} generation {spec['pool']['generation']}, "
              f"{len(spec['devices'])} device(s)")
        for device in spec["devices"]:
            kind = _attribute(device, "type") + (f" x{_attribute(device, 'vfCount')}" if "vfCount" in
                                                 device["attributes"] else "")
            taints = " ".join(f"taint {t['key']}={t['value']}:{t['effect']}" for t in device.get("taints") or ())
            print(f"    {device['name']:<9} {kind:<5} PCI {_attribute(device, 'resource.kubernetes.io/pciBusID')} "
                  f"NUMA {_attribute(device, 'resource.kubernetes.io/numaNode')} {taints}".rstrip())


def _claim(device: str) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: allocated to `device` of this node's pool."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": CLAIM_NAME, "namespace": NAMESPACE, "uid": CLAIM_UID},
            "spec": {"devices": {"requests": [{"name": "npu", "exactly": {"deviceClassName": DRA_DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "npu", "driver": DRA_DRIVER, "pool": NODE_NAME, "device": device}]}}}}


def _prepare(kubelet: DraKubeletStandIn, api: FakeKubeApi, node: SimulatedNode, device: str) -> None:
    api.add_claim(_claim(device))
    answer = kubelet.prepare(NAMESPACE, CLAIM_UID, CLAIM_NAME)
    if answer.error:
        raise RuntimeError(f"NodePrepareResources failed: {answer.error}")
    print(f"Claim {NAMESPACE}/{CLAIM_NAME} allocated to {device}, prepared by NodePrepareResources; the container "
          "gets the CDI devices:")
    for prepared in answer.devices:
        print(f"  {', '.join(prepared.cdi_device_ids)}")
    for spec_file in sorted(node.cdi_root.glob(f"*{CLAIM_UID}*")):
        print(f"  from the CDI spec {spec_file}:")
        print(textwrap.indent(json.dumps(json.loads(spec_file.read_text()), indent=2), "    "))
    print("  and the claim's status.devices says:")
    for entry in api.claim_status(NAMESPACE, CLAIM_NAME).get("devices") or ():
        print(f"    {entry['device']}: {json.dumps(entry['data'], sort_keys=True)}")


def _status_once(node: SimulatedNode, settled: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """`status`'s report once it says what the demo just did (the status files follow within a scan; supervisord
    calls a program RUNNING after a second), or as it is after START_TIMEOUT."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        report, _ = status.gather(node.run_dir, node.pod_resources_socket)
        if settled(report) or time.monotonic() > deadline:
            return report
        time.sleep(_POLL)


def run(node: SimulatedNode, args: argparse.Namespace) -> int:
    registry = pathlib.Path(node.env()["KUBELET_PLUGIN_REGISTRY_PATH"])
    with FakeKubeApi() as api, DraKubeletStandIn(registry) as kubelet:
        api.nodes[NODE_NAME] = {"apiVersion": "v1", "kind": "Node",
                                "metadata": {"name": NODE_NAME, "uid": "5e1f0c2a-0000-4000-8000-00000000n0de"}}
        environ = {**os.environ, **node.env(args.scan_interval), "RESOURCE_API": "dra", "NODE_NAME": NODE_NAME,
                   "KUBECONFIG": str(api.kubeconfig(node.root / "kubeconfig"))}
        with StackProcess(environ) as stack:
            print(f"Stack started in DRA mode (supervisord pid {stack.pid}); the API server is a stand-in on "
                  f"{api.url}.")
            info = kubelet.register(DRA_DRIVER, START_TIMEOUT)
            print(f"The kubelet stand-in registered {info.name} ({info.type}) at {info.endpoint}; services "
                  f"{', '.join(info.supported_versions)}.")
            devices = sorted(d.device for d in node.inventory if d.is_vf or d.num_vfs == 0)
            _wait(lambda: sorted(_published(api)) == devices, START_TIMEOUT, "the publication of every device")
            print("Published ResourceSlices:")
            _show_slices(api)
            kubelet.watch_health()
            health = kubelet.wait_health(lambda h: sorted(h) == devices, START_TIMEOUT, "every device")
            print(f"The health stream (NodeWatchResources) reports {len(health)} device(s), all "
                  f"{', '.join(sorted({h for h, _ in health.values()}))}.")
            claimed = devices[0]
            _prepare(kubelet, api, node, claimed)

            print(f"{claimed} turns Unhealthy (its driver status reads {KernelStatus.FAULT.name}):")
            node.set_status(claimed, KernelStatus.FAULT.value)
            _wait(lambda: bool(_published(api)[claimed].get("taints")), START_TIMEOUT, f"the taint on {claimed}")
            print("  in the slice it stays, tainted:")
            _show_slices(api)
            state, message = kubelet.wait_health(lambda h: h.get(claimed, ("",))[0] == "UNHEALTHY", START_TIMEOUT,
                                                 f"{claimed} Unhealthy")[claimed]
            print(f"  the health stream says {claimed} {state}, message {message!r}; the kubelet shows it in the "
                  "pod's status.containerStatuses[].allocatedResourcesStatus")
            report = _status_once(node, lambda r: (r["dra"] or {}).get("taintedDevices") == 1 and all(
                p["state"] == "RUNNING" for p in r["processes"].values()))
            print("rbln-device-plugin status:")
            print(textwrap.indent(status.render_text(report), "  "))
            code = stack.stop()
    print(f"Stack stopped (exit status {code}).")
    return 0 if code == 0 else 1
