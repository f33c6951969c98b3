"""The chart's NodeFeatureRule: valid against NFD's own CRD schema, and NFD's own rule matcher, fed by NFD's
own pci source on a simulated node's sysfs, labels exactly the nodes with a Rebellions device."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from simulator.node import build_node
from simulator.spec import NodeSpec
from tests.nfd.nfd_tools import crds, rule_labels
from tests.support.chart import NFD_API, manifest_checks, render
from tests.support.deploy import ROOT

CI_VALUES = ROOT / "deploy/helm/ci-values/node-labels.yaml"


@pytest.fixture
def rules_file(short_tmp: pathlib.Path) -> pathlib.Path:
    path = short_tmp / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(render(values=CI_VALUES, api_versions=NFD_API)))
    return path


def test_the_rendered_rule_satisfies_nfds_crd_schema_and_a_broken_one_does_not():
    docs = render(values=CI_VALUES, api_versions=NFD_API)
    assert "NodeFeatureRule" in [doc["kind"] for doc in docs]
    assert manifest_checks.problems(docs, crds=crds()) == []
    broken = [dict(doc) for doc in docs]
    rule = next(doc for doc in broken if doc["kind"] == "NodeFeatureRule")
    rule["spec"] = {"rules": [{"name": "x", "labels": {"rebellions.ai/npu.present": "true"}, "matchFeatures": [
        {"feature": "pci.device", "matchExpressions": {"vendor": {"op": "Equals", "value": ["1eff"]}}}],
        "extra": True}]}
    found = [problem.split(": ", 1)[1] for problem in manifest_checks.problems(broken, crds=crds())]
    assert any("'Equals' is not one of" in problem for problem in found), found
    assert any("'extra' was unexpected" in problem for problem in found), found


@pytest.mark.parametrize("spec", ["2,1:vf1,1:vf4", "1", "2:vf4"])
def test_nfds_rule_matcher_labels_a_node_with_rebellions_devices(short_tmp, rules_file, spec):
    node = build_node(short_tmp / "node", NodeSpec.parse(spec))
    labels, devices = rule_labels(node.sysfs_root, rules_file)
    assert labels == {"rebellions.ai/npu.present": "true"}
    assert {device["vendor"] for device in devices} == {"1eff"}
    assert len(devices) == len(node.inventory)  # NFD's pci source saw every PF and VF of the simulated node


def test_a_node_without_a_rebellions_device_is_not_labelled(short_tmp, rules_file):
    node = build_node(short_tmp / "node", NodeSpec.parse("2"))
    for vendor in (node.sysfs_root / "bus" / "pci" / "devices").glob("*/vendor"):
        if vendor.read_text().strip() == "0x1eff":
            vendor.write_text("0x8086\n")
    labels, devices = rule_labels(node.sysfs_root, rules_file)
    assert labels == {}
    assert devices and {device["vendor"] for device in devices} == {"8086"}
