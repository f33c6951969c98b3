"""What the device plugin contract says the kubelet sees: healthy devices, an Allocate's response."""

from __future__ import annotations

from tests.support.node_state import non_default_groups

HEALTHY = "Healthy"


def all_healthy(ids):
    return {device: HEALTHY for device in ids}


def assert_contract_response(response, ids, node):
    (container,) = response.container_responses
    groups = non_default_groups(node)
    (gid,) = [g for g, npus in groups.items() if sorted(npus) == sorted(node.device(i).npu for i in ids)]
    expected = [("/dev/rsd0", f"/dev/rsd{gid}", "rw")] + [(f"/dev/{i}", f"/dev/{i}", "rw") for i in sorted(ids)]
    assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == expected
    assert dict(container.annotations) == {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}
    assert not container.envs and not container.mounts
    return gid
