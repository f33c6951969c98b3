"""What the DRA scenarios (tests/dra) share: a claim allocated to a pod by the scheduler's allocator, and what
the node then shows (its claim specs, its RSD groups)."""

from __future__ import annotations

from tests.dra.dra_harness import claim, exactly, pod

NPU_CLASS = "npu.rebellions.ai"
REGISTERED = "Registered with the kubelet"


def claim_pod(serving, name: str, count: int = 1):
    """A claim of `count` NPUs allocated by the scheduler's allocator to a pod of the same name: (pod, devices, uid)."""
    kubelet, namespace = serving.kubelet, serving.namespace
    kubelet.apply(claim(name, namespace, [exactly("npus", NPU_CLASS, count=count)]))
    spec = pod(name, namespace, {"npus": name})
    answer = kubelet.allocate(spec)
    assert answer["allocated"], f"{name} not allocated"
    return spec, sorted(d["device"] for d in answer["results"][name]), kubelet.claim(namespace, name)["metadata"]["uid"]


def claim_spec_files(node, uid: str):
    return [path for path in node.cdi_root.iterdir() if uid in path.name]


def npus(node, devices: list[str]) -> list[int]:
    return sorted(node.device(d).npu for d in devices)


def claim_groups(node) -> dict[int, list[int]]:
    return {gid: members for gid, members in node.rsd_groups().items() if gid != 0}
