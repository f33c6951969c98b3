"""Prepare and Unprepare through the kubelet's own DRA manager: the CDI spec as the CDI reference library
reads it, the RSD group, repeats, and the worker or the kubelet restarting in between."""

from __future__ import annotations

import json
import os
import signal

import pytest

from shared.cdi.annotation import RUNTIME_DEVICE
from shared.supervision.client import connect
from tests.cdi.reference import ReferenceLibrary
from tests.conformance.kubelet_harness import HarnessError
from tests.dra.dra_harness import claim, exactly, pod
from tests.support.cdi_spec_family import EDGE_FILES
from tests.support.dra_scenarios import NPU_CLASS, REGISTERED, claim_groups, claim_pod, claim_spec_files, npus
from tests.support.waiting import wait_until

FAULT = 4
TOOLKIT_SPEC = next(data for why, _suffix, data in EDGE_FILES if why == "the toolkit's spec")


# With the toolkit's spec on the node every CDI device the kubelet hands over resolves, the toolkit's own
# included; without it, when-resolvable leaves that one out and the claim's devices still resolve.
@pytest.mark.parametrize("toolkit_spec, annotation", [(True, "always"), (False, "when-resolvable")])
def test_prepare_writes_a_cdi_spec_the_reference_library_resolves_naming_rsd0_and_exactly_the_claims_nodes(
        serve, toolkit_spec, annotation):
    serving = serve("3", {"rbln0", "rbln1", "rbln2"}, CDI_ANNOTATION=annotation)
    node = serving.node
    if toolkit_spec:
        (node.static_cdi_dir / "rbln.yaml").write_bytes(TOOLKIT_SPEC)
    spec, devices, uid = claim_pod(serving, "pair", count=2)
    cdi_ids = serving.kubelet.prepare(spec)["main"]
    assert (RUNTIME_DEVICE in cdi_ids) is toolkit_spec
    # One RSD group for the claim, holding exactly its NPUs.
    groups = claim_groups(node)
    assert list(groups.values()) == [npus(node, devices)]
    (gid,) = groups

    library = ReferenceLibrary.from_environ()
    answer = library.resolve([node.cdi_root, node.static_cdi_dir], devices=cdi_ids)
    assert answer.resolved == dict.fromkeys(cdi_ids, True), answer.spec_errors
    (path,) = claim_spec_files(node, uid)
    assert not answer.spec_errors.get(str(path))
    claim_devices = {f"k8s.npu.rebellions.ai/npu={uid}-{d}" for d in devices}
    assert claim_devices <= set(cdi_ids) and claim_devices <= answer.devices
    written = json.loads(path.read_text()) if path.suffix == ".json" else None
    assert written is not None, f"{path} is not the JSON spec the worker writes"
    assert written["kind"] == "k8s.npu.rebellions.ai/npu"
    nodes = {(n["path"], n.get("hostPath", n["path"]))
             for d in written["devices"] for n in d["containerEdits"]["deviceNodes"]}
    assert nodes == {("/dev/rsd0", f"/dev/rsd{gid}"), *((f"/dev/{d}", f"/dev/{d}") for d in devices)}


def test_a_repeated_prepare_answers_the_same_and_makes_no_second_group(serve):
    # The kubelet repeats a claim's NodePrepareResources when the pod's start failed on another claim.
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    kubelet.apply(claim("first", namespace, [exactly("npus", NPU_CLASS)]),
                  claim("second", namespace, [exactly("npus", NPU_CLASS)]))
    spec = pod("both", namespace, {"a": "first", "b": "second"})
    results = kubelet.allocate(spec)["results"]
    broken = results["second"][0]["device"]
    node.set_status(broken, FAULT)
    with pytest.raises(HarnessError, match=broken):
        kubelet.prepare(spec)
    # Every claim of the request is answered: the healthy one was prepared, with its group.
    first_groups = claim_groups(node)
    assert len(first_groups) == 1
    node.set_status(broken, 0)
    wait_until(lambda: not kubelet.published_devices()[broken].get("taints"), 30, f"{broken} healthy again")

    cdi = kubelet.prepare(spec)["main"]
    groups = claim_groups(node)
    assert len(groups) == 2
    # The first claim's group from the failed start is the one it still has.
    assert {gid: m for gid, m in groups.items() if gid in first_groups} == first_groups
    assert len([i for i in cdi if i.startswith("k8s.")]) == 2


# A deleted pod's device may be allocated to a new claim before the kubelet unprepares the old one: the new
# claim is prepared at once (not after the kubelet's backoff), and the old one's late Unprepare leaves it.
def test_a_device_of_a_claim_deleted_before_its_unprepare_is_prepared_at_once_for_the_next_claim(serve):
    serving = serve("1", {"rbln0"})
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    old_pod, devices, old_uid = claim_pod(serving, "old")
    kubelet.prepare(old_pod)
    assert devices == ["rbln0"] and claim_spec_files(node, old_uid)
    kubelet.delete("ResourceClaim", "old", namespace=namespace)
    new_pod, new_devices, new_uid = claim_pod(serving, "new")
    assert new_devices == ["rbln0"], "the scheduler's allocator gave the deleted claim's device again"

    cdi_ids = kubelet.prepare(new_pod)["main"]
    assert f"k8s.npu.rebellions.ai/npu={new_uid}-rbln0" in cdi_ids
    serving.stack.wait_for_record("Unprepared a claim the API server no longer has, to prepare its devices for "
                                  "another", claimUID=old_uid, claim=f"{namespace}/old", deviceIDs=["rbln0"])
    groups = claim_groups(node)
    assert list(groups.values()) == [npus(node, ["rbln0"])]
    assert claim_spec_files(node, old_uid) == [] and claim_spec_files(node, new_uid)

    kubelet.unprepare(old_pod["metadata"]["uid"])
    assert claim_groups(node) == groups, "the new claim's group is intact"
    assert claim_spec_files(node, new_uid)


# The claim may be gone from the API server by the time its last pod ends: Unprepare works without it.
@pytest.mark.parametrize("claim_deleted", [False, True])
def test_unprepare_destroys_the_group_and_removes_the_spec(serve, claim_deleted):
    serving = serve("2", {"rbln0", "rbln1"})
    node = serving.node
    spec, _, uid = claim_pod(serving, "solo")
    serving.kubelet.prepare(spec)
    assert claim_groups(node) and claim_spec_files(node, uid)
    if claim_deleted:
        serving.kubelet.delete("ResourceClaim", "solo", namespace=serving.namespace)
        with pytest.raises(KeyError):
            serving.kubelet.claim(serving.namespace, "solo")
    serving.kubelet.unprepare(spec["metadata"]["uid"])
    assert claim_groups(node) == {}
    assert claim_spec_files(node, uid) == []


def test_a_worker_killed_between_prepare_and_unprepare_unprepares_after_its_restart(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    node, kubelet, stack = serving.node, serving.kubelet, serving.stack
    spec, _, uid = claim_pod(serving, "survivor")
    kubelet.prepare(spec)
    victim = connect(node.run_dir).programs()["worker-dra"]["pid"]

    os.kill(victim, signal.SIGKILL)
    stack.wait_for_record(REGISTERED, count=2, timeout=30)
    assert connect(node.run_dir).programs()["worker-dra"]["pid"] != victim
    wait_until(kubelet.registered, 30, "the restarted worker registered")
    kubelet.unprepare(spec["metadata"]["uid"])
    assert claim_groups(node) == {}
    assert claim_spec_files(node, uid) == []


def test_a_restarted_kubelet_unprepares_a_claim_the_previous_one_prepared(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    node, kubelet = serving.node, serving.kubelet
    spec, _, uid = claim_pod(serving, "kept")
    kubelet.prepare(spec)
    kubelet.restart()
    wait_until(kubelet.registered, 30, "the driver registered with the restarted kubelet")
    # The new DRA manager knows the claim from its checkpoint; the worker from its own.
    kubelet.unprepare(spec["metadata"]["uid"])
    assert claim_groups(node) == {}
    assert claim_spec_files(node, uid) == []


def test_a_device_prepared_for_one_claim_is_refused_to_another(serve):
    # A scheduler acting on a stale view allocates the same NPU twice; the worker is the last line of defence.
    serving = serve("1", {"rbln0"})
    kubelet, namespace = serving.kubelet, serving.namespace
    first, devices, _ = claim_pod(serving, "first")
    kubelet.prepare(first)
    kubelet.apply(claim("second", namespace, [exactly("npus", NPU_CLASS)]))
    second = pod("second", namespace, {"npus": "second"})
    assert not kubelet.allocate(second)["allocated"]
    stale = kubelet.allocate(second, ignore_allocated=True)
    assert [d["device"] for d in stale["results"]["second"]] == devices
    with pytest.raises(HarnessError, match="rbln0"):
        kubelet.prepare(second)
    assert len(claim_groups(serving.node)) == 1
