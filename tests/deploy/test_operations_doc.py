"""docs/operations.md tells operators which log records and chart values to look for: they must exist."""

from __future__ import annotations

import re

import yaml

from tests.support.deploy import ROOT

GUIDE = (ROOT / "docs" / "operations.md").read_text()
STACK_PACKAGES = ("shared", "scanner", "resource_worker", "kubelet_watchdog", "dra_worker")
VALUE_ROOTS = ("devicePlugin", "logging", "paths", "partitionReadyGate", "image", "metrics", "featureDiscovery",
               "nodeFeatureRule", "dra")


def _code_spans() -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", GUIDE))


def test_every_log_message_the_guide_names_is_logged_by_the_stack():
    # A message is a capitalised phrase: `Device state changed`, `Tracing setup failed; continuing ...`.
    messages = {span for span in _code_spans() if re.fullmatch(r"[A-Z][a-z]+( [\w;:./-]+)+", span)}
    assert len(messages) >= 10, messages
    source = "\n".join(path.read_text() for package in STACK_PACKAGES for path in (ROOT / package).rglob("*.py"))
    assert sorted(message for message in messages if f'"{message}"' not in source) == []


def test_every_chart_value_the_guide_names_exists():
    values = yaml.safe_load((ROOT / "deploy/helm/k8s-device-plugin-chart/values.yaml").read_text())
    named = {span.split("=")[0] for span in _code_spans() if span.split(".")[0] in VALUE_ROOTS}
    assert len(named) >= 8, named
    missing = []
    for dotted in sorted(named):
        node = values
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                missing.append(dotted)
                break
            node = node[key]
    assert missing == []
