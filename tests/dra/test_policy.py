"""The chart's ValidatingAdmissionPolicy on the real API server: the plugin's service account, with a real
pod-bound token (a TokenRequest bound to a pod on node A, which then names node A), writes node A's slices and
is refused node B's with the policy's message; RBAC alone would let it write every node's."""

from __future__ import annotations

import pathlib

import yaml

from tests.dra.dra_harness import DRIVER, RESOURCE_V1

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
OWN_NODE_ONLY = "may write only ResourceSlices of its own node"


def _slice(name: str, node: str) -> dict:
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                 "resourceSliceCount": 1}, "devices": []}}


def _token(kubeconfig: str) -> str:
    return yaml.safe_load(pathlib.Path(kubeconfig).read_text())["users"][0]["user"]["token"]


def test_a_pod_bound_token_writes_its_own_node_s_slices_and_no_other_s(cluster, make_node):
    node_a = make_node("1")
    node_b = f"{node_a.name}-b"  # another node of the cluster
    cluster.admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_b}})
    token, server = _token(node_a.kubeconfig), cluster.server

    own = server.request("POST", SLICES, token=token, body=_slice(f"{node_a.name}-policy", node_a.name))
    assert own.status_code == 201, own.text
    other = server.request("POST", SLICES, token=token, body=_slice(f"{node_b}-policy", node_b))
    assert other.status_code == 422 and "denied request" in other.text, other.text
    assert f"the DRA plugin of node {node_a.name} {OWN_NODE_ONLY}" in other.json()["message"]

    written = own.json()
    moved = {**written, "spec": {**written["spec"], "nodeName": node_b}}
    assert server.request("PUT", f"{SLICES}/{node_a.name}-policy", token=token, body=moved).status_code == 422
    (b_slice,) = cluster.admin.apply(_slice(f"{node_b}-policy", node_b))
    refused = server.request("DELETE", f"{SLICES}/{b_slice['metadata']['name']}", token=token)
    assert refused.status_code == 422 and OWN_NODE_ONLY in refused.text
    assert server.request("DELETE", f"{SLICES}/{node_a.name}-policy", token=token).status_code == 200


def test_credentials_that_name_no_node_may_write_no_slice(cluster, make_node):
    node = make_node("1")
    static = _token(cluster.server.worker_kubeconfig)
    answer = cluster.server.request("POST", SLICES, token=static, body=_slice(f"{node.name}-static", node.name))
    assert answer.status_code == 422 and "name no node" in answer.json()["message"], answer.text
