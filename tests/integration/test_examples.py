"""The example pods get what examples/ says they get, served by the real stack on a simulated node."""

from __future__ import annotations

import yaml

from shared.resources import Resource
from tests.support.deploy import ROOT

EXAMPLES = ROOT / "examples"
VF4 = Resource.NPU_VF4.value
RUNTIME = {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}


def test_the_vf4_pod_gets_its_own_rsd_group_its_vf_nodes_and_the_annotation(make_node, kubelet, start_stack):
    walkthrough = (EXAMPLES / "single-pod-npu-vf4.md").read_text()
    assert "(pod-npu-vf4.yaml)" in walkthrough
    (pod,) = [doc for doc in yaml.safe_load_all((EXAMPLES / "pod-npu-vf4.yaml").read_text()) if doc]
    (container,) = pod["spec"]["containers"]
    count = container["resources"]["limits"][VF4]
    assert f"rebellions.ai/npu-vf4: {count}" in walkthrough

    node = make_node("2:vf4")  # two cards of four VFs each
    start_stack(node)
    kubelet.wait_for_devices(VF4, lambda view: len(view.devices) == 8, timeout=30)
    available = sorted(kubelet.resources()[VF4].devices)
    (preferred,) = kubelet.preferred_allocation(VF4, available, size=count).container_responses
    chosen = list(preferred.deviceIDs)
    assert len(chosen) == count and len({device.split("-")[0] for device in chosen}) == 1  # one card
    (response,) = kubelet.allocate(VF4, [chosen]).container_responses
    (gid,) = [group for group, members in node.rsd_groups().items() if group != 0 and members]
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/rsd0", f"/dev/rsd{gid}", "rw"), *((f"/dev/{device}", f"/dev/{device}", "rw") for device in chosen)]
    assert dict(response.annotations) == RUNTIME
    for promised in ("`/dev/rsd0`", "`/dev/rbln0-0`, `/dev/rbln0-1`", "rebellions.ai/npu=runtime"):
        assert promised in walkthrough
