"""The Grafana dashboard under deploy/grafana asks only for series the stack exports, and shows what an
operator looks for: devices by health, allocations and their latency, rbln-smi time, registration state.
(tests/integration/prometheus_check.py runs each of its queries against a real Prometheus server.)"""

from __future__ import annotations

import re

from shared.observability import metrics
from shared.observability.metrics import FAMILIES, Kind
from tests.support.dashboard import load, queries

METRIC_NAME = re.compile(r"\brbln_device_plugin_[a-z0-9_]+")
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def exported_series() -> set[str]:
    """The series names a scrape of the stack can hold: a histogram's are its _bucket, _sum and _count."""
    names = set()
    for family in FAMILIES:
        if family.kind is Kind.HISTOGRAM:
            names |= {family.name + suffix for suffix in _HISTOGRAM_SERIES}
        else:
            names.add(family.name)
    return names


def test_every_query_names_only_series_the_stack_exports():
    named = {name for query in queries(load()) for name in METRIC_NAME.findall(query)}
    assert named, "the dashboard queries no metric of the stack"
    assert sorted(named - exported_series()) == []


def test_it_shows_devices_allocations_latency_rbln_smi_and_registration():
    named = {name for query in queries(load()) for name in METRIC_NAME.findall(query)}
    for family in (metrics.DEVICES, metrics.DEVICE_STATUS, metrics.REGISTERED, metrics.ALLOCATIONS):
        assert family.name in named, family.name
    for family in (metrics.ALLOCATE_DURATION, metrics.RBLN_SMI_DURATION, metrics.SCAN_DURATION):
        assert f"{family.name}_bucket" in named, family.name


def test_panels_are_laid_out_and_read_from_the_chosen_data_source():
    dashboard = load()
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    assert dashboard["uid"] and dashboard["title"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                   for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(target["expr"] for target in panel["targets"]), panel["title"]
            # Every query follows the pod chosen at the top of the dashboard.
            assert all('instance=~"$instance"' in target["expr"] for target in panel["targets"]), panel["title"]
