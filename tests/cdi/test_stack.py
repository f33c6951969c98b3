"""The real stack (supervisord and its programs on a simulated node, the kubelet simulator) for each
CDI_ANNOTATION setting, with the toolkit's spec present, absent, malformed, appearing later and removed
later: every Allocate answer's annotations are resolved by the CDI reference library against the node's
spec dirs (in containerd's order, /etc/cdi first), and the stack's own verdict (its records, `status`, the
worker's status file) is the library's. What the stack does to CDI specs (the housekeeping at start) is
checked with the library as well."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shared.cdi.annotation import ANNOTATION_KEY, RUNTIME_DEVICE, CdiAnnotation
from shared.cdi.stale_specs import TRANSIENT_SPEC_PREFIX
from shared.channels import status_files
from simulator.stack import ENTRYPOINT
from tests.support.cdi_spec_family import EDGE_FILES
from tests.support.metrics_scrape import metrics_port, value, wait_for_scrape
from tests.support.waiting import wait_until

NPU = "rebellions.ai/npu"
RESOLVABLE_METRIC = "rbln_device_plugin_cdi_spec_resolvable"
TOOLKIT_SPEC = next(data for why, _suffix, data in EDGE_FILES if why == "the toolkit's spec")
# Defines the device, but with a key the library does not know: refused as a whole.
MALFORMED_SPEC = TOOLKIT_SPEC.replace(b"kind: rebellions.ai/npu\n", b"kind: rebellions.ai/npu\nvendor: rbln\n")


def runtime_dirs(node):
    return [node.static_cdi_dir, node.cdi_root]


def status_report(node) -> dict:
    run = subprocess.run([sys.executable, "-c", ENTRYPOINT, "status", "--json"], env={**os.environ, **node.env()},
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def await_worker_verdict(node, resolvable: bool, timeout: float = 20.0) -> None:
    """Until the npu worker's latest snapshot says `resolvable`: its next Allocate goes by it."""
    def verdict_is_reached() -> bool:
        status = status_files.read_status(node.run_dir, "worker-npu") or {}
        return status.get("cdiResolvable") is resolvable
    wait_until(verdict_is_reached, timeout, f"the worker's verdict to become resolvable={resolvable}")


class Scenario:
    def __init__(self, node, kubelet, stack, reference, policy: CdiAnnotation):
        self.node, self.kubelet, self.stack, self.reference, self.policy = node, kubelet, stack, reference, policy
        self.verdicts = 0
        # Verdict records so far, by verdict: the stack logs one at start and one at each change.
        self.records = {True: 0, False: 0}

    def expect(self, resolvable: bool) -> None:
        """The stack's verdict is `resolvable`, the library's too, and Allocate answers as the setting says."""
        self.verdicts += 1
        self.records[resolvable] += 1
        records = self.stack.wait_for_record(verdict_message(resolvable), count=self.records[resolvable])
        assert records[-1]["cdiDevice"] == RUNTIME_DEVICE and records[-1]["cdiAnnotation"] == self.policy.value
        assert records[-1]["specDirs"] == [str(self.node.cdi_root), str(self.node.static_cdi_dir)]
        library = self.reference.resolve(runtime_dirs(self.node), devices=[RUNTIME_DEVICE])
        assert library.resolved[RUNTIME_DEVICE] is resolvable
        await_worker_verdict(self.node, resolvable)
        assert status_report(self.node)["cdi"]["resolvable"] is resolvable

        response = self.kubelet.allocate(NPU, [["rbln0"]])
        (container,) = response.container_responses
        annotations = dict(container.annotations)
        annotated = self.policy is CdiAnnotation.ALWAYS or (self.policy is CdiAnnotation.WHEN_RESOLVABLE
                                                            and resolvable)
        assert annotations == ({ANNOTATION_KEY: RUNTIME_DEVICE} if annotated else {})
        # The device nodes and the RSD node in every case.
        assert [d.container_path for d in container.devices] == ["/dev/rsd0", "/dev/rbln0"]
        completed = self.stack.wait_for_record("Completed container allocation", count=self.verdicts)[-1]
        assert (completed["cdiAnnotation"], completed["cdiResolvable"]) == (annotated, resolvable)
        if annotations:
            # What containerd does with the answer: the library parses the annotations and injects.
            answer = self.reference.resolve(runtime_dirs(self.node), annotations=annotations)
            assert answer.annotation_error == "" and answer.annotation_devices == (RUNTIME_DEVICE,)
            assert answer.resolved[RUNTIME_DEVICE] is resolvable
            assert (answer.inject_error == "") is resolvable, answer.inject_error

    def logged_once_per_change(self) -> bool:
        return all(len(self.stack.find(verdict_message(v))) == count for v, count in self.records.items())


def verdict_message(resolvable: bool) -> str:
    return "CDI device resolvable" if resolvable else "CDI device unresolvable"


@pytest.mark.parametrize("policy", list(CdiAnnotation), ids=lambda p: p.value)
def test_spec_present_then_removed_then_malformed_then_repaired(make_node, kubelet, start_stack, reference, policy):
    node = make_node("1")
    (node.static_cdi_dir / "rbln.yaml").write_bytes(TOOLKIT_SPEC)
    stack = start_stack(node, CDI_ANNOTATION=policy.value)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    scenario = Scenario(node, kubelet, stack, reference, policy)
    scenario.expect(True)  # present at start
    (node.static_cdi_dir / "rbln.yaml").unlink()
    scenario.expect(False)  # removed later
    (node.cdi_root / "rbln.yaml").write_bytes(MALFORMED_SPEC)
    (refused,) = stack.wait_for_record("CDI spec refused; a runtime ignores it")
    assert refused["path"] == str(node.cdi_root / "rbln.yaml") and "vendor" in refused["err"]
    assert str(node.cdi_root / "rbln.yaml") in reference.resolve(runtime_dirs(node)).spec_errors
    assert scenario.logged_once_per_change()  # malformed: still unresolvable, no new verdict record
    report = status_report(node)["cdi"]
    assert report["refusedSpecs"][0]["path"] == str(node.cdi_root / "rbln.yaml")
    (node.cdi_root / "rbln.yaml").write_bytes(TOOLKIT_SPEC)
    scenario.expect(True)  # repaired (appearing, in the other dir)
    assert scenario.logged_once_per_change()


@pytest.mark.parametrize("policy", list(CdiAnnotation), ids=lambda p: p.value)
def test_spec_absent_then_appearing_then_in_conflict(make_node, kubelet, start_stack, reference, policy):
    node = make_node("1")
    stack = start_stack(node, CDI_ANNOTATION=policy.value)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    scenario = Scenario(node, kubelet, stack, reference, policy)
    scenario.expect(False)  # absent at start
    (warning,) = stack.find("CDI device unresolvable")
    assert warning["level"] == "warn" and "no valid spec" in warning["err"] and warning["consequence"]
    (node.static_cdi_dir / "rbln.yaml").write_bytes(TOOLKIT_SPEC)
    scenario.expect(True)  # appearing later
    (node.static_cdi_dir / "rbln-copy.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "rebellions.ai/npu",
        "devices": [{"name": "runtime", "containerEdits": {"env": ["A=1"]}}]}))
    scenario.expect(False)  # two specs of one dir: the library resolves it nowhere
    assert "both define it" in stack.find("CDI device unresolvable")[-1]["err"]
    assert scenario.logged_once_per_change()


def test_the_metric_follows_the_verdict(make_node, kubelet, start_stack, reference):
    node = make_node("1")
    stack = start_stack(node, METRICS_PORT="0")
    port = metrics_port(stack)
    wait_for_scrape(port, lambda s: value(s, RESOLVABLE_METRIC) == 0.0, "the metric at 0")
    (node.cdi_root / "rbln.yaml").write_bytes(TOOLKIT_SPEC)
    wait_for_scrape(port, lambda s: value(s, RESOLVABLE_METRIC) == 1.0, "the metric at 1")
    assert reference.resolve(runtime_dirs(node), devices=[RUNTIME_DEVICE]).resolved[RUNTIME_DEVICE]


def test_a_bad_setting_stops_the_stack_with_one_line(make_node):
    node = make_node("1")
    run = subprocess.run([sys.executable, "-c", ENTRYPOINT, "run", "--cdi-annotation", "sometimes"],
                         env={**os.environ, **node.env()}, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].endswith(
        "invalid CDI_ANNOTATION 'sometimes': not one of always, when-resolvable, never")


def test_the_housekeeping_removes_only_the_stack_s_transient_specs(make_node, kubelet, start_stack, reference):
    """At start the stack removes the transient specs a previous instance left (named as the library names a
    transient spec of kind rebellions.ai/npu) and nothing else: the toolkit's spec and other vendors' specs,
    transient or not, resolve as before."""
    node = make_node("1")
    other = {"cdiVersion": "0.5.0", "kind": "example.com/gpu",
             "devices": [{"name": "g0", "containerEdits": {"env": ["A=1"]}}]}
    transient = {"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu",
                 "devices": [{"name": "claim-1", "containerEdits": {"env": ["A=1"]}}]}
    (node.cdi_root / "rbln.yaml").write_bytes(TOOLKIT_SPEC)
    (node.cdi_root / "example.com-gpu_claim-9.json").write_text(json.dumps(other))
    (node.cdi_root / f"{TRANSIENT_SPEC_PREFIX}claim-1.json").write_text(json.dumps(transient))
    before = reference.resolve(runtime_dirs(node))
    assert {RUNTIME_DEVICE, "example.com/gpu=g0", "rebellions.ai/npu=claim-1"} <= before.devices
    stack = start_stack(node)
    (removed,) = stack.wait_for_record("Removed stale CDI specs", process="scanner")
    assert removed["paths"] == [str(node.cdi_root / f"{TRANSIENT_SPEC_PREFIX}claim-1.json")]
    after = reference.resolve(runtime_dirs(node))
    assert before.devices - after.devices == {"rebellions.ai/npu=claim-1"}
    assert after.spec_errors == {}
    stack.wait_for_record("CDI device resolvable")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
