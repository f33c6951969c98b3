"""What an operator replacing the original Go plugin relies on, on the real stack: its settings are
accepted, their records keep the original's fields, and a kubelet restart cleans the CDI root as the
original's restart did."""

from __future__ import annotations

from scanner.cdi import TRANSIENT_SPEC_PREFIX
from shared.resources import Resource

NPU = Resource.NPU.value
PROGRAMS = {"scanner", "watchdog", *(resource.process_name for resource in Resource)}
START = "Starting rbln-device-plugin"
LEGACY_NAMES = "Legacy resource names are not supported; advertising the generic names"


def test_use_generic_resource_name_false_warns_once_and_changes_nothing_else(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node, USE_GENERIC_RESOURCE_NAME="false")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"}, timeout=30)
    starts = stack.wait_for_record(START, count=len(PROGRAMS))
    assert {r["process"]: r["useGenericResourceName"] for r in starts} == dict.fromkeys(PROGRAMS, False)
    (container,) = kubelet.allocate(NPU, [["rbln0"]]).container_responses
    assert dict(container.annotations) == {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}
    assert set(kubelet.resources()) == {NPU}
    stack.stop()
    (warning,) = stack.find(LEGACY_NAMES)
    assert (warning["level"], warning["process"]) == ("warn", "scanner")
    assert warning["resourceNames"] == [resource.value for resource in Resource]


def test_the_default_is_true_and_quiet(make_node, kubelet, start_stack):
    stack = start_stack(make_node("1"))
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    starts = stack.wait_for_record(START, count=len(PROGRAMS))
    assert {r["useGenericResourceName"] for r in starts} == {True}
    assert all({"logLevel", "logFormat", "version"} <= r.keys() for r in starts)
    stack.stop()
    assert not stack.find(LEGACY_NAMES)


def test_stale_transient_cdi_specs_are_removed_again_when_the_kubelet_restarts(make_node, kubelet, start_stack):
    node = make_node("1")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    stack.wait_for_record(START, count=len(PROGRAMS))
    # Left by something else since the stack started (the start removed the earlier ones).
    stale = [node.cdi_root / f"{TRANSIENT_SPEC_PREFIX}{name}" for name in ("0.yaml", "claim-1.json")]
    kept = node.cdi_root / "rbln.yaml"  # the container toolkit's spec is not the plugin's to remove
    for path in (*stale, kept):
        path.write_text("cdiVersion: 0.5.0\n")
    kubelet.restart()
    stack.wait_for_record("Detected kubelet socket recreation; restarting device plugins")
    (removed,) = stack.wait_for_record("Removed stale CDI specs", process="watchdog")
    assert sorted(removed["paths"]) == sorted(map(str, stale))
    assert [path.exists() for path in (*stale, kept)] == [False, False, True]
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
