"""The Grafana dashboard the chart ships, and the PromQL expressions it holds."""

from __future__ import annotations

import json
from collections.abc import Iterator

from tests.support.deploy import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "rbln-device-plugin-dashboard.json"


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> Iterator[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its template variables."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
