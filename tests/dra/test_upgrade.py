"""A surge upgrade and a lost checkpoint, through the kubelet's own plugin manager and DRA manager: the new
instance registers beside the old one (sockets named by the pod UID), calls keep flowing while the old one
stops, and a checkpoint that cannot be read is rebuilt from the node without stopping service."""

from __future__ import annotations

import pathlib
import threading

from tests.dra.dra_harness import DRIVER
from tests.support.dra_scenarios import REGISTERED, claim_groups, claim_pod, claim_spec_files, npus
from tests.support.waiting import wait_until

OLD_POD, NEW_POD = "5d0c6a2e-0000-4000-8000-00000000a1d0", "5d0c6a2e-0000-4000-8000-00000000b2e0"


def _sockets(dra_node, pod_uid: str):
    return (dra_node.registry / f"{DRIVER}-{pod_uid}-reg.sock", dra_node.plugins / DRIVER / f"dra-{pod_uid}.sock")


def _creates(node) -> int:
    return [call["command"] for call in node.smi_calls()].count("create")


def test_a_surge_upgrade_fails_no_call_prepares_each_claim_once_and_leaves_only_the_new_sockets(
        serve, start_stack):
    serving = serve("4", {"rbln0", "rbln1", "rbln2", "rbln3"}, POD_UID=OLD_POD)
    node, kubelet, old = serving.node, serving.kubelet, serving.stack
    assert all(path.is_socket() for path in _sockets(serving.dra_node, OLD_POD))
    kept, kept_devices, kept_uid = claim_pod(serving, "kept")
    kubelet.prepare(kept)  # by the old instance, unprepared by the new one below
    churned = [claim_pod(serving, f"churn-{i}") for i in range(3)]
    prepares = [_creates(node)]

    def churn() -> None:
        """Each churned claim prepared (one group, exactly its NPUs) and unprepared through the kubelet; any
        failure raises."""
        for spec, devices, uid in churned:
            kubelet.prepare(spec)
            prepares.append(1)
            assert sorted(claim_groups(node).values()) == sorted([npus(node, kept_devices), npus(node, devices)])
            kubelet.unprepare(spec["metadata"]["uid"])
            assert not claim_spec_files(node, uid)

    new = start_stack(serving.dra_node, POD_UID=NEW_POD, RBLN_DEVICE_PLUGIN_RUN_DIR=str(node.root / "run-new"),
                      RBLN_DEVICE_PLUGIN_LOG_DIR=str(node.root / "log-new"))
    while not new.find(REGISTERED):  # the new instance starts and registers while calls flow
        churn()
    stopping = threading.Thread(target=old.stop)
    stopping.start()
    while stopping.is_alive():  # the old one stops while calls flow
        churn()
    stopping.join()
    churn()

    assert old.find("Prepared claim") and new.find("Prepared claim"), "both instances served calls"
    assert not old.find("Claim preparation failed") and not new.find("Claim preparation failed")
    assert _creates(node) == sum(prepares), "every claim prepared exactly once: one RSD group per Prepare"
    assert not any(path.exists() for path in _sockets(serving.dra_node, OLD_POD)), "the old instance's sockets"
    assert all(path.is_socket() for path in _sockets(serving.dra_node, NEW_POD))
    wait_until(kubelet.registered, 10, "the new instance is the driver's registration")
    kubelet.unprepare(kept["metadata"]["uid"])
    assert claim_groups(node) == {} and not claim_spec_files(node, kept_uid)


def test_an_unreadable_checkpoint_is_rebuilt_from_the_node_and_service_goes_on(serve):
    serving = serve("3", {"rbln0", "rbln1", "rbln2"})
    node, kubelet, stack = serving.node, serving.kubelet, serving.stack
    first, first_devices, first_uid = claim_pod(serving, "first")
    kubelet.prepare(first)
    checkpoint = serving.dra_node.plugins / DRIVER / "checkpoint.json"
    damaged = checkpoint.read_bytes()[:20]
    checkpoint.write_bytes(damaged)  # truncated, as by a crash where a rename is not atomic

    second, second_devices, _ = claim_pod(serving, "second")
    kubelet.prepare(second)
    (record,) = stack.find("Checkpoint unreadable; moved aside and rebuilt from the node")
    assert record["level"] == "error" and record["path"] == str(checkpoint) and record["claims"] == 1
    assert pathlib.Path(record["movedTo"]).read_bytes() == damaged
    assert sorted(claim_groups(node).values()) == sorted([npus(node, first_devices), npus(node, second_devices)])
    kubelet.unprepare(first["metadata"]["uid"])
    assert list(claim_groups(node).values()) == [npus(node, second_devices)]
    assert not claim_spec_files(node, first_uid)
