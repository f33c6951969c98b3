"""Prepare and Unprepare against a simulated node: its rbln-smi stand-in makes the RSD groups, under the lock."""

from __future__ import annotations

import json
import pathlib
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_worker import cdi
from dra_worker.checkpoint import LOCK_NAME, LOCK_TIMEOUT, Checkpoint
from dra_worker.inventory import InventoryState
from dra_worker.kube import ApiFailure
from dra_worker.prepare import CLAIM_READ_TIMEOUT, ClaimRef, Preparer, PrepareSettings
from dra_worker.rebuild import rebuild_claims
from shared.cdi.annotation import RUNTIME_DEVICE, CdiAnnotation
from shared.cdi.spec import check_spec
from shared.cdi.spec_dirs import parse_spec_text
from shared.node.driver_status import read_status
from shared.node.rbln_smi import RblnSmi
from shared.node.rsd_group import RsdGroups
from tests.support.dra import NODE, ClaimStore, claim, feed, simulated_node


@pytest.fixture
def node(tmp_path):
    return simulated_node(tmp_path)


def _preparer(node, tmp_path, store, state, annotation=CdiAnnotation.ALWAYS, timeout=0.2, clock=time.monotonic,
              lock_timeout=LOCK_TIMEOUT, rebuilds=None, stale_unprepared=None):
    rebuilds = [] if rebuilds is None else rebuilds
    stale_unprepared = [] if stale_unprepared is None else stale_unprepared
    plugin_dir = tmp_path / "plugins" / "npu.rebellions.ai"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    return Preparer(PrepareSettings(
        api=store, inventory=state.current, rsd_groups=RsdGroups(RblnSmi(node.rbln_smi), node.lock_file),
        checkpoint=Checkpoint(plugin_dir, lambda: rebuild_claims(node.cdi_root, RblnSmi(node.rbln_smi).groups()),
                              on_rebuilt=lambda: rebuilds.append(1), lock_timeout=lock_timeout),
        read_status=lambda device: read_status(node.sysfs_root, device), pool=NODE, cdi_root=node.cdi_root,
        dev_root=node.dev_root, cdi_annotation=annotation, node_timeout=timeout, clock=clock,
        on_stale_unprepared=lambda: stale_unprepared.append(1)))


@pytest.fixture
def world(node, tmp_path):
    store = ClaimStore()
    state = InventoryState()
    feed(state, node)
    return store, state, _preparer(node, tmp_path, store, state)


def _ref(body) -> ClaimRef:
    m = body["metadata"]
    return ClaimRef(m["namespace"], m["uid"], m["name"])


def _groups(node) -> dict[int, list[int]]:
    """The node's RSD groups but the default one, which holds every device not in another."""
    return {gid: members for gid, members in node.rsd_groups().items() if gid != 0}


def _npus(node) -> dict[str, int]:
    return {d.device: d.npu for d in node.inventory}


def test_a_claim_gets_one_rsd_group_and_a_cdi_spec_naming_its_nodes(node, world):
    store, _state, preparer = world
    body = store.add(claim("uid-1", ["rbln0", "rbln1"]))
    result = preparer.prepare([_ref(body)])["uid-1"]
    assert result.error is None
    groups = _groups(node)
    assert groups == {result.rsd_group: sorted([_npus(node)["rbln0"], _npus(node)["rbln1"]])}
    assert [(d.device, d.requests) for d in result.devices] == [("rbln0", ("npus",)), ("rbln1", ("npus",))]
    assert result.devices[0].cdi_device_ids == (cdi.qualified_name("uid-1", "rbln0"), RUNTIME_DEVICE)
    raw = cdi.spec_path(node.cdi_root, "uid-1").read_bytes()
    assert check_spec(parse_spec_text(raw)).devices == {cdi.qualified_name("uid-1", "rbln0"),
                                                        cdi.qualified_name("uid-1", "rbln1")}
    spec = json.loads(raw)
    edits = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert edits["uid-1-rbln0"] == [
        {"path": "/dev/rsd0", "hostPath": f"/dev/rsd{result.rsd_group}", "permissions": "rw"},
        {"path": "/dev/rbln0", "hostPath": "/dev/rbln0", "permissions": "rw"}]


def test_a_repeat_returns_the_same_answer_without_touching_the_node(node, world):
    store, _state, preparer = world
    body = store.add(claim("uid-1", ["rbln0"]))
    first = preparer.prepare([_ref(body)])["uid-1"]
    calls, reads = len(node.smi_calls()), store.reads
    assert preparer.prepare([_ref(body)])["uid-1"] == first
    assert len(node.smi_calls()) == calls and store.reads == reads


def test_prepared_claims_survive_a_restart_and_unprepare_undoes_everything(node, tmp_path, world):
    store, state, preparer = world
    body = store.add(claim("uid-1", ["rbln0"]))
    first = preparer.prepare([_ref(body)])["uid-1"]
    restarted = _preparer(node, tmp_path, store, state)
    assert restarted.prepare([_ref(body)])["uid-1"] == first
    assert restarted.unprepare([_ref(body)]) == {"uid-1": None}
    assert _groups(node) == {}
    assert not cdi.spec_path(node.cdi_root, "uid-1").exists()
    assert restarted.prepared_count() == 0
    assert restarted.unprepare([_ref(body)]) == {"uid-1": None}, "an unknown claim is unprepared already"


def test_after_a_reboot_a_recorded_claim_is_prepared_again_and_a_gone_claim_spares_its_old_group_number(
        node, tmp_path, world):
    store, state, preparer = world
    gone, kept = store.add(claim("uid-a", ["rbln0"])), store.add(claim("uid-b", ["rbln1"]))
    old_group = preparer.prepare([_ref(gone)])["uid-a"].rsd_group
    preparer.prepare([_ref(kept)])
    # A reboot: the RSD groups and CDI_ROOT (a tmpfs) are gone, the checkpoint (on disk) is not.
    groups = RsdGroups(RblnSmi(node.rbln_smi), node.lock_file)
    for group in _groups(node):
        groups.destroy(group)
    for spec in node.cdi_root.glob(f"{cdi.VENDOR}-{cdi.CLASS}_*"):
        spec.unlink()
    restarted = _preparer(node, tmp_path, store, state)

    again = restarted.prepare([_ref(kept)])["uid-b"]
    assert again.error is None and cdi.spec_path(node.cdi_root, "uid-b").exists()
    assert _groups(node) == {again.rsd_group: [_npus(node)["rbln1"]]}
    assert again.rsd_group == old_group, "the new group takes the number the gone claim recorded"
    assert restarted.prepare([_ref(kept)])["uid-b"] == again

    assert restarted.unprepare([_ref(gone)]) == {"uid-a": None}
    assert _groups(node) == {again.rsd_group: [_npus(node)["rbln1"]]}, "the kept claim's group survives"
    assert restarted.prepared_count() == 1


def test_the_claim_reads_of_one_request_share_one_bound_whatever_the_claim_count(node, tmp_path):
    """A slow API server costs the request at most CLAIM_READ_TIMEOUT of reads: the claims left unread are
    told to retry (the kubelet does), the ones read are prepared."""
    now = [0.0]
    timeouts: list[float] = []

    class SlowStore(ClaimStore):
        def get_claim(self, namespace, name, timeout):
            timeouts.append(timeout)
            now[0] += 0.6 * CLAIM_READ_TIMEOUT
            return super().get_claim(namespace, name, timeout)

    store, state = SlowStore(), InventoryState()
    feed(state, node)
    preparer = _preparer(node, tmp_path, store, state, clock=lambda: now[0])
    bodies = [store.add(claim(f"uid-{i}", [f"rbln{i}"])) for i in range(3)]
    results = preparer.prepare([_ref(b) for b in bodies])
    assert timeouts == [CLAIM_READ_TIMEOUT, pytest.approx(0.4 * CLAIM_READ_TIMEOUT)]
    assert results["uid-0"].error is None and results["uid-1"].error is None
    assert "ran out; retry" in (results["uid-2"].error or "")
    assert preparer.prepared_count() == 2


def test_a_device_prepared_for_another_claim_is_refused(node, world):
    store, _state, preparer = world
    first, second = store.add(claim("uid-1", ["rbln0"])), store.add(claim("uid-2", ["rbln1", "rbln0"]))
    preparer.prepare([_ref(first)])
    groups, reads = _groups(node), store.reads
    result = preparer.prepare([_ref(second)])["uid-2"]
    assert "rbln0 is already prepared for claim uid-1" in result.error
    assert store.reads == reads + 2, "the claim's read and one of the holder, still allocated rbln0"
    assert _groups(node) == groups, "the first claim's group is intact"
    assert not cdi.spec_path(node.cdi_root, "uid-2").exists()


def _deleted(store, body):
    del store.claims[f"{body['metadata']['namespace']}/{body['metadata']['name']}"]


def _replaced(store, body):
    store.add(claim("uid-1-again", ["rbln3"], name=body["metadata"]["name"]))


def _deallocated(store, body):
    body["status"] = {}


def _reallocated(store, body):
    store.add(claim("uid-1", ["rbln3"]))


@pytest.mark.parametrize("gone", [_deleted, _replaced, _deallocated, _reallocated])
def test_a_device_held_by_a_claim_the_api_server_no_longer_has_is_prepared_for_the_new_claim(
        node, tmp_path, world, logs, gone):
    store, state, _ = world
    stale_unprepared: list[int] = []
    preparer = _preparer(node, tmp_path, store, state, stale_unprepared=stale_unprepared)
    old, new = store.add(claim("uid-1", ["rbln0"])), store.add(claim("uid-2", ["rbln1", "rbln0"]))
    old_group = preparer.prepare([_ref(old)])["uid-1"].rsd_group
    gone(store, old)  # the pod was deleted; the kubelet has not called NodeUnprepareResources yet
    reads = store.reads
    result = preparer.prepare([_ref(new)])["uid-2"]
    assert result.error is None
    assert store.reads == reads + 2, "the new claim's read and one of the holder"
    assert _groups(node) == {result.rsd_group: sorted([_npus(node)["rbln0"], _npus(node)["rbln1"]])}
    assert old_group not in _groups(node) or old_group == result.rsd_group
    assert not cdi.spec_path(node.cdi_root, "uid-1").exists()
    assert preparer.prepared_count() == 1
    records = [r for r in logs if r["msg"].startswith("Unprepared a claim the API server no longer has")]
    assert [(r["level"], r["claimUID"], r["claim"], r["deviceIDs"]) for r in records] == [
        ("WARNING", "uid-1", "default/claim-uid-1", ["rbln0"])]
    assert stale_unprepared == [1]
    # The kubelet's late Unprepare of the old claim finds it done and leaves the new claim's group.
    assert preparer.unprepare([_ref(old)]) == {"uid-1": None}
    assert result.rsd_group in _groups(node) and cdi.spec_path(node.cdi_root, "uid-2").exists()
    assert preparer.prepare([_ref(new)])["uid-2"] == result


def test_each_holder_of_a_claim_s_devices_is_read_once_and_only_the_stale_ones_are_unprepared(node, world):
    store, _state, preparer = world
    gone, kept = store.add(claim("uid-a", ["rbln0"])), store.add(claim("uid-b", ["rbln1"]))
    preparer.prepare([_ref(gone)])
    kept_result = preparer.prepare([_ref(kept)])["uid-b"]
    _deleted(store, gone)
    reads = store.reads
    both = store.add(claim("uid-c", ["rbln0", "rbln1"]))
    assert "rbln1 is already prepared for claim uid-b" in preparer.prepare([_ref(both)])["uid-c"].error
    assert store.reads == reads + 3, "the claim and each holder once"
    assert not cdi.spec_path(node.cdi_root, "uid-a").exists() and preparer.prepared_count() == 1
    assert preparer.prepare([_ref(kept)])["uid-b"] == kept_result


def test_a_held_device_is_refused_while_its_holder_cannot_be_read(node, world):
    store, _state, preparer = world
    old, new = store.add(claim("uid-1", ["rbln0"])), store.add(claim("uid-2", ["rbln0"]))
    first = preparer.prepare([_ref(old)])["uid-1"]
    real_get = store.get_claim

    def unreachable(namespace, name, timeout):
        if name == "claim-uid-1":
            raise ApiFailure("get ResourceClaim default/claim-uid-1: 503 Service Unavailable", 503)
        return real_get(namespace, name, timeout)

    store.get_claim = unreachable
    _deleted(store, old)
    assert "rbln0 is already prepared for claim uid-1" in preparer.prepare([_ref(new)])["uid-2"].error
    assert preparer.prepare([_ref(old)])["uid-1"] == first, "the holder is intact"


def test_another_instance_unpreparing_the_stale_holder_meanwhile_leaves_one_group_for_the_new_claim(
        node, world, tmp_path, logs):
    store, state, preparer = world
    other_instance = _preparer(node, tmp_path, store, state)
    old, new = store.add(claim("uid-1", ["rbln0"])), store.add(claim("uid-2", ["rbln0"]))
    preparer.prepare([_ref(old)])
    _deleted(store, old)
    real_get = store.get_claim
    answered = {}

    def racing(namespace, name, timeout):
        if name == "claim-uid-1" and not answered:  # the holder's read: the other instance goes first
            assert other_instance.unprepare([_ref(old)]) == {"uid-1": None}
            answered.update(other_instance.prepare([_ref(new)]))
        return real_get(namespace, name, timeout)

    store.get_claim = racing
    assert preparer.prepare([_ref(new)])["uid-2"] == answered["uid-2"]
    assert list(_groups(node)) == [answered["uid-2"].rsd_group]
    assert not [r for r in logs if r["msg"].startswith("Unprepared a claim the API server")], "nothing left to do"


def test_a_held_device_is_refused_without_a_holder_read_once_the_request_s_reads_are_out_of_time(node, tmp_path):
    store, state = ClaimStore(), InventoryState()
    feed(state, node)
    now = [0.0]

    def get_claim(namespace, name, timeout):
        now[0] += CLAIM_READ_TIMEOUT
        return ClaimStore.get_claim(store, namespace, name, timeout)

    store.get_claim = get_claim
    preparer = _preparer(node, tmp_path, store, state, clock=lambda: now[0])
    old = store.add(claim("uid-1", ["rbln0"]))
    preparer.prepare([_ref(old)])
    _deleted(store, old)
    reads = store.reads
    assert "rbln0 is already prepared for claim uid-1" in preparer.prepare(
        [_ref(store.add(claim("uid-2", ["rbln0"])))])["uid-2"].error
    assert store.reads == reads + 1, "only the new claim was read"


@pytest.mark.parametrize(("body", "expected"), [
    (claim("uid-1", ["rbln9"]), "'rbln9' is not a device of this node"),
    (claim("uid-1", ["rbln0"], pool="node-b"), "not this node's"),
    ({"metadata": {"name": "claim-uid-1", "namespace": "default", "uid": "uid-1"}, "status": {}}, "not allocated"),
    ({**claim("uid-1", ["rbln0"]), "metadata": {"name": "claim-uid-1", "namespace": "default", "uid": "other"}},
     "it was replaced"),
])
def test_claims_it_cannot_serve_are_answered_with_an_error(node, world, body, expected):
    store, _state, preparer = world
    store.add(body)
    result = preparer.prepare([ClaimRef("default", "uid-1", "claim-uid-1")])["uid-1"]
    assert expected in result.error
    assert _groups(node) == {} and preparer.prepared_count() == 0


def test_every_claim_of_a_request_is_answered_whatever_the_others_do(node, world):
    store, _state, preparer = world
    good = store.add(claim("uid-1", ["rbln0"]))
    missing = ClaimRef("default", "uid-2", "gone")
    results = preparer.prepare([_ref(good), missing])
    assert results["uid-1"].error is None
    assert "404" in results["uid-2"].error


def test_an_unhealthy_device_is_refused_at_the_final_status_read(node, world):
    store, _state, preparer = world
    node.set_status("rbln0", 4)  # after the last scan: only the final read sees it
    result = preparer.prepare([_ref(store.add(claim("uid-1", ["rbln0"])))])["uid-1"]
    assert "rbln0 is Unhealthy (FAULT)" in result.error


def test_a_vf_claim_gets_its_own_group(node, world):
    store, _state, preparer = world
    vf = next(d.device for d in node.inventory if d.is_vf)
    result = preparer.prepare([_ref(store.add(claim("uid-1", [vf])))])["uid-1"]
    assert result.error is None and _groups(node) == {result.rsd_group: [_npus(node)[vf]]}


def test_other_drivers_results_are_not_ours(node, world):
    store, _state, preparer = world
    body = claim("uid-1", ["rbln0"])
    body["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "dra.net", "pool": NODE, "device": "eth0"})
    result = preparer.prepare([_ref(store.add(body))])["uid-1"]
    assert [d.device for d in result.devices] == ["rbln0"]


def test_a_failed_rsd_group_leaves_nothing_behind(node, world):
    store, _state, preparer = world
    node.set_smi_fault("exit", commands=["create"])
    result = preparer.prepare([_ref(store.add(claim("uid-1", ["rbln0"])))])["uid-1"]
    assert "RsdGroupError" in result.error
    assert preparer.prepared_count() == 0 and not cdi.spec_path(node.cdi_root, "uid-1").exists()


def _checkpoint_path(node):
    return Checkpoint(node.root.parent / "plugins" / "npu.rebellions.ai").path


@pytest.mark.parametrize("damage", [
    lambda text: text[:len(text) // 2],  # truncated: a crash mid-write where rename is not atomic
    lambda text: "{not json",
    lambda text: json.dumps({**json.loads(text), "version": 99}),  # a later version, after a downgrade
    lambda text: json.dumps({"checksum": 1, "v1": {"preparedClaims": {}}}),  # the Go driver's file
])
def test_an_unreadable_checkpoint_is_moved_aside_and_rebuilt_from_the_node(node, tmp_path, logs, damage):
    store, state = ClaimStore(), InventoryState()
    feed(state, node)
    rebuilds: list[int] = []
    preparer = _preparer(node, tmp_path, store, state, rebuilds=rebuilds)
    vf = next(d.device for d in node.inventory if d.is_vf)
    kept, other = store.add(claim("uid-1", ["rbln0", "rbln1"])), store.add(claim("uid-2", [vf]))
    first = preparer.prepare([_ref(kept)])["uid-1"]
    path = _checkpoint_path(node)
    text = path.read_text()
    path.write_text(damage(text))
    calls = len(node.smi_calls())

    assert preparer.prepare([_ref(other)])["uid-2"].error is None, "service goes on"
    records = [r for r in logs if r["msg"] == "Checkpoint unreadable; moved aside and rebuilt from the node"]
    assert len(records) == 1 and records[0]["level"] == "ERROR" and records[0]["claims"] == 1
    aside = pathlib.Path(records[0]["movedTo"])
    assert records[0]["path"] == str(path) and aside.parent == path.parent and aside.read_text() == damage(text)
    assert rebuilds == [1]
    again = preparer.prepare([_ref(kept)])["uid-1"]
    assert again == first, "the rebuilt claim keeps its group and answer"
    assert [c["command"] for c in node.smi_calls()[calls:]].count("create") == 1, "only uid-2 made a group"
    assert "rbln0 is already prepared for claim uid-1" in preparer.prepare(
        [_ref(store.add(claim("uid-3", ["rbln0"])))])["uid-3"].error
    assert preparer.unprepare([_ref(kept)]) == {"uid-1": None}
    assert first.rsd_group not in _groups(node) and not cdi.spec_path(node.cdi_root, "uid-1").exists()


def test_a_rebuilt_claim_is_unprepared_without_its_name_and_one_whose_group_went_is_prepared_afresh(
        node, world, logs):
    store, _state, preparer = world
    gone, kept = store.add(claim("uid-a", ["rbln0"])), store.add(claim("uid-b", ["rbln1"]))
    old = preparer.prepare([_ref(gone)])["uid-a"]
    preparer.prepare([_ref(kept)])
    RsdGroups(RblnSmi(node.rbln_smi), node.lock_file).destroy(old.rsd_group)  # someone destroyed it
    _checkpoint_path(node).write_text("")
    assert preparer.unprepare([ClaimRef("default", "uid-b", "claim-uid-b")]) == {"uid-b": None}
    assert _groups(node) == {}, "the rebuilt claim's group went with its Unprepare"
    warned = [r for r in logs if r["msg"] == "Removed a claim's CDI spec the node no longer backs"]
    assert [r["claimUID"] for r in warned] == ["uid-a"] and not cdi.spec_path(node.cdi_root, "uid-a").exists()
    afresh = preparer.prepare([_ref(gone)])["uid-a"]
    assert afresh.error is None and _groups(node) == {afresh.rsd_group: [_npus(node)["rbln0"]]}


def test_a_version_1_checkpoint_is_migrated(node, world):
    store, _state, preparer = world
    body = store.add(claim("uid-1", ["rbln0"]))
    first = preparer.prepare([_ref(body)])["uid-1"]
    path = _checkpoint_path(node)
    document = json.loads(path.read_text())
    for entry in document["claims"].values():
        del entry["rebuilt"]
    path.write_text(json.dumps({**document, "version": 1}))
    assert preparer.prepare([_ref(body)])["uid-1"] == first
    assert preparer.prepare([_ref(store.add(claim("uid-2", ["rbln1"])))])["uid-2"].error is None
    assert json.loads(path.read_text())["version"] == 2 and preparer.prepared_count() == 2


def test_when_the_node_cannot_be_read_the_unreadable_checkpoint_stays_and_the_next_call_rebuilds(node, world):
    store, _state, preparer = world
    body = store.add(claim("uid-1", ["rbln0"]))
    preparer.prepare([_ref(body)])
    path = _checkpoint_path(node)
    path.write_text("{")
    node.set_smi_fault("exit", commands=["groups"])
    assert "rebuilding the prepared claims from the node failed" in preparer.unprepare([_ref(body)])["uid-1"]
    assert path.read_text() == "{"
    node.set_smi_fault(None)
    assert preparer.unprepare([_ref(body)]) == {"uid-1": None} and _groups(node) == {}


@pytest.mark.parametrize(("annotation", "resolvable", "named"), [
    (CdiAnnotation.ALWAYS, False, True), (CdiAnnotation.WHEN_RESOLVABLE, True, True),
    (CdiAnnotation.WHEN_RESOLVABLE, False, False), (CdiAnnotation.NEVER, True, False)])
def test_the_toolkit_s_device_is_named_as_cdi_annotation_says_and_a_missing_spec_is_said(
        node, tmp_path, logs, annotation, resolvable, named):
    store = ClaimStore()
    state = InventoryState()
    feed(state, node, cdi_resolvable=resolvable)
    preparer = _preparer(node, tmp_path, store, state, annotation)
    result = preparer.prepare([_ref(store.add(claim("uid-1", ["rbln0"])))])["uid-1"]
    assert (RUNTIME_DEVICE in result.devices[0].cdi_device_ids) is named
    warned = [r for r in logs if r["msg"].startswith("No CDI spec resolves the toolkit's device")]
    assert bool(warned) is (not resolvable and annotation is not CdiAnnotation.NEVER)


def test_a_call_stuck_behind_another_instance_answers_with_an_error_in_bounded_time(node, tmp_path):
    from shared.node.rsd_group import held_flock

    store, state = ClaimStore(), InventoryState()
    feed(state, node)
    preparer = _preparer(node, tmp_path, store, state, lock_timeout=0.2)
    body = store.add(claim("uid-1", ["rbln0"]))
    lock = node.root.parent / "plugins" / "npu.rebellions.ai" / LOCK_NAME
    with held_flock(lock, 1.0):  # another instance on the node, mid-call
        result = preparer.prepare([_ref(body)])["uid-1"]
        assert "still held by another process" in result.error
        assert "still held" in preparer.unprepare([_ref(body)])["uid-1"]
    assert preparer.prepare([_ref(body)])["uid-1"].error is None


def test_a_new_claim_before_the_first_inventory_is_told_to_retry_and_a_prepared_one_is_answered(node, tmp_path):
    store = ClaimStore()
    state = InventoryState()
    feed(state, node)
    body = store.add(claim("uid-1", ["rbln0"]))
    first = _preparer(node, tmp_path, store, state).prepare([_ref(body)])["uid-1"]
    restarted = _preparer(node, tmp_path, store, InventoryState())  # no snapshot yet
    assert restarted.prepare([_ref(body)])["uid-1"] == first
    later = restarted.prepare([_ref(store.add(claim("uid-2", ["rbln1"])))])["uid-2"]
    assert "inventory has not arrived" in later.error


_JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(results=st.lists(st.fixed_dictionaries({}, optional={
    "request": _JUNK | st.sampled_from(["npus", "npus/sub"]), "driver": _JUNK | st.just("npu.rebellions.ai"),
    "pool": _JUNK | st.just(NODE), "device": _JUNK | st.sampled_from(["rbln0", "rbln1", "rbln9", "../x"])}),
    max_size=4), status=_JUNK)
def test_any_claim_shape_gets_an_answer_and_leaves_the_node_consistent(node, world, results, status):
    store, _state, preparer = world
    body = claim("uid-x", [])
    body["status"]["allocation"]["devices"]["results"] = results
    store.add(body)
    odd = store.add({**claim("uid-y", []), "metadata": {"name": "claim-uid-y", "namespace": "default", "uid": "uid-y"},
                     "status": status})
    answers = preparer.prepare([_ref(body), _ref(odd)])
    assert set(answers) == {"uid-x", "uid-y"}
    for uid, answer in answers.items():
        if answer.error is None:
            assert {d.device for d in answer.devices} <= {"rbln0", "rbln1"}
        assert preparer.unprepare([ClaimRef("default", uid, "x")]) == {uid: None}
    assert _groups(node) == {} and not list(node.cdi_root.glob("k8s.npu.rebellions.ai-npu_*"))


def test_two_instances_on_one_node_prepare_each_claim_once_and_agree(node, tmp_path):
    """A surge upgrade's two instances share the checkpoint: racing on the same claims, each claim gets one
    group, both answer alike, and an Unprepare by one is seen by the other's next Prepare."""
    import threading

    store, state = ClaimStore(), InventoryState()
    feed(state, node)
    instances = [_preparer(node, tmp_path, store, state) for _ in range(2)]
    refs = [_ref(store.add(claim(f"uid-{i}", [f"rbln{i}"]))) for i in range(2)]
    answers: list[dict] = []

    def run(preparer):
        answers.append(preparer.prepare(refs))

    threads = [threading.Thread(target=run, args=(p,)) for p in instances for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(a == answers[0] for a in answers) and all(r.error is None for r in answers[0].values())
    assert sorted(_groups(node)) == sorted(r.rsd_group for r in answers[0].values())
    creates = [c for c in node.smi_calls() if c["command"] == "create"]
    assert len(creates) == 2, creates

    assert instances[1].unprepare([refs[0]]) == {"uid-0": None}
    again = instances[0].prepare([refs[0]])["uid-0"]
    assert again.error is None and _groups(node)[again.rsd_group] == [_npus(node)["rbln0"]]


def _admin(body):
    for result in body["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    return body


def test_an_admin_claim_shares_a_workload_s_device_without_touching_its_rsd_group(node, world, tmp_path):
    store, state, preparer = world
    workload = store.add(claim("uid-work", ["rbln0"]))
    work = preparer.prepare([_ref(workload)])["uid-work"]
    groups = _groups(node)
    monitor = store.add(_admin(claim("uid-mon", ["rbln0"], name="monitor")))
    result = preparer.prepare([_ref(monitor)])["uid-mon"]
    assert result.error is None and result.rsd_group is None
    assert _groups(node) == groups  # the workload keeps its group
    spec = json.loads(cdi.spec_path(node.cdi_root, "uid-mon").read_bytes())
    assert [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]] == ["/dev/rbln0"]
    # A workload claim next to the admin one is not refused because of it, and unpreparing the admin claim
    # leaves the workload's group.
    other = store.add(claim("uid-work2", ["rbln1"]))
    assert preparer.prepare([_ref(other)])["uid-work2"].error is None
    assert preparer.unprepare([_ref(monitor)]) == {"uid-mon": None}
    assert work.rsd_group in _groups(node) and not cdi.spec_path(node.cdi_root, "uid-mon").exists()
    # Checkpointed like the others: a new preparer (a restarted worker) answers it the same.
    again = store.add(_admin(claim("uid-mon2", ["rbln0"], name="monitor2")))
    first = preparer.prepare([_ref(again)])["uid-mon2"]
    restarted = _preparer(node, tmp_path, store, state)
    assert restarted.prepare([_ref(again)])["uid-mon2"] == first and restarted.prepared_count() == 3


def test_an_admin_claim_is_prepared_on_an_unhealthy_device_and_a_tolerating_claim_too(node, world):
    store, _state, preparer = world
    node.set_status("rbln0", 4)
    plain = store.add(claim("uid-plain", ["rbln0"]))
    assert "Unhealthy (FAULT)" in preparer.prepare([_ref(plain)])["uid-plain"].error
    monitor = store.add(_admin(claim("uid-mon", ["rbln0"], name="monitor")))
    assert preparer.prepare([_ref(monitor)])["uid-mon"].error is None
    tolerant = claim("uid-diag", ["rbln0"], name="diagnostics")
    tolerant["status"]["allocation"]["devices"]["results"][0]["tolerations"] = [
        {"key": "npu.rebellions.ai/unhealthy", "operator": "Equal", "value": "FAULT", "effect": "NoSchedule"}]
    store.add(tolerant)
    assert preparer.prepare([_ref(tolerant)])["uid-diag"].error is None


def test_a_claim_mixing_admin_and_plain_requests_is_refused_with_the_reason(world):
    store, _state, preparer = world
    body = claim("uid-mix", ["rbln0", "rbln1"])
    body["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    store.add(body)
    assert "mixes requests with and without admin access" in preparer.prepare([_ref(body)])["uid-mix"].error


def test_an_admin_claim_s_spec_is_rebuilt_as_an_admin_claim(node, world):
    store, _state, preparer = world
    monitor = store.add(_admin(claim("uid-mon", ["rbln1"], name="monitor")))
    preparer.prepare([_ref(monitor)])
    rebuilt = rebuild_claims(node.cdi_root, RblnSmi(node.rbln_smi).groups())
    assert rebuilt["uid-mon"].admin_access and rebuilt["uid-mon"].rsd_group is None
