"""A real Prometheus server scrapes the real stack on a simulated node, and PromQL over its HTTP API sees
the device counts, an allocation, a device turning FAULT, and answers every query of the Grafana dashboard.

    python -m pytest tests/integration/prometheus_check.py

The server is Debian's `prometheus` package (/usr/bin/prometheus, or the binary PROMETHEUS names), started
here on 127.0.0.1 with a free port, a temporary storage directory and a 1 s scrape interval. A fresh
machine does not have it, and the README's `python -m pytest` must pass there: so this module is not named
test_*.py and only runs when named, as .ci/run does after installing the package. Without the binary it
fails and says what to install; it is never skipped.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from shared.resources import Resource
from tests.support.dashboard import load as load_dashboard
from tests.support.dashboard import queries as dashboard_queries
from tests.support.metrics_scrape import metrics_port
from tests.support.ports import free_port
from tests.support.waiting import wait_until

NPU, VF4 = Resource.NPU.value, Resource.NPU_VF4.value
JOB = "rbln-device-plugin"
SCRAPE_INTERVAL = "1s"
START_TIMEOUT = 60.0
# A change reaches a query after the scanner's scan, the watchdog's check (2 s) and the next scrape (1 s).
QUERY_TIMEOUT = 30.0


def prometheus_binary() -> str:
    binary = os.environ.get("PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no Prometheus server at {binary}: install Debian's package (apt-get install -y prometheus) "
                    f"or set PROMETHEUS to a prometheus binary", pytrace=False)
    return binary


class Prometheus:
    """A Prometheus server of this test's own, scraping `targets`."""

    def __init__(self, directory: pathlib.Path, targets: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                       "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}]}))
        self._log = (directory / "prometheus.log").open("w")
        self._process = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        self._log_path = directory / "prometheus.log"
        wait_until(self._ready, START_TIMEOUT, "Prometheus to be ready", poll=0.25)

    def _ready(self) -> bool:
        if self._process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self._process.returncode}:\n{self._log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict]:
        """The result of an instant query: [{"metric": {...}, "value": [time, "v"]}, ...]."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            document = json.load(answer)
        assert document["status"] == "success", document
        return document["data"]["result"]

    def values(self, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Each series of the query's result by its labels (name, job and instance left out), and its value."""
        ignored = ("__name__", "job", "instance")
        return {tuple(sorted((k, v) for k, v in entry["metric"].items() if k not in ignored)): float(entry["value"][1])
                for entry in self.query(promql)}

    def await_values(self, promql: str, expected: dict, what: str) -> None:
        try:
            wait_until(lambda: self.values(promql) == expected, QUERY_TIMEOUT, what, poll=0.25)
        except TimeoutError as exc:
            with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as answer:
                targets = json.load(answer)["data"]["activeTargets"]
            raise TimeoutError(f"{exc}: {promql} is {self.values(promql)}, not {expected}; targets: "
                               + json.dumps([{k: t.get(k) for k in ("scrapeUrl", "health", "lastError")}
                                             for t in targets])) from None

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


@pytest.fixture
def prometheus_for(node_root) -> Iterator[Callable[[int], Prometheus]]:
    servers: list[Prometheus] = []

    def start(port: int) -> Prometheus:
        directory = node_root / "prometheus"
        directory.mkdir()
        servers.append(Prometheus(directory, [f"127.0.0.1:{port}"]))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_prometheus_sees_the_devices_an_allocation_and_a_fault(make_node, kubelet, start_stack, prometheus_for):
    node = make_node("2,1:vf4")
    stack = start_stack(node, METRICS_PORT="0")
    prometheus = prometheus_for(metrics_port(stack))
    prometheus.await_values(f'up{{job="{JOB}"}}', {(): 1.0}, "the stack's endpoint to be up")

    # npu-vf1, which the node lacks, has no series: its worker never runs (absent, not down).
    prometheus.await_values('sum by (resource) (rbln_device_plugin_devices{health="Healthy"})',
                            {(("resource", NPU),): 2.0, (("resource", VF4),): 4.0}, "the device counts")
    prometheus.await_values("rbln_device_plugin_registered == 1", {(("resource", NPU),): 1.0,
                                                                   (("resource", VF4),): 1.0},
                            "npu and npu-vf4 registered")

    kubelet.allocate(NPU, [["rbln0", "rbln1"]], pod="train-0", namespace="ml")
    prometheus.await_values('rbln_device_plugin_allocations_total{result="success"} > 0',
                            {(("resource", NPU), ("result", "success")): 1.0}, "the allocation")
    prometheus.await_values(f'rbln_device_plugin_allocate_duration_seconds_count{{resource="{NPU}"}}',
                            {(("resource", NPU),): 1.0}, "the allocation's time")
    prometheus.await_values('sum by (command) (rbln_device_plugin_rbln_smi_duration_seconds_count'
                            '{command=~"group-.*"})',
                            {(("command", "group-list"),): 1.0, (("command", "group-destroy"),): 0.0,
                             (("command", "group-create"),): 1.0}, "the allocation's rbln-smi calls")

    node.set_status("rbln1", 4)
    prometheus.await_values('rbln_device_plugin_device_status{device="rbln1"}',
                            {(("device", "rbln1"), ("resource", NPU), ("status", "FAULT")): 1.0},
                            "rbln1 FAULT, and no READY series left for it")
    prometheus.await_values(f'rbln_device_plugin_devices{{resource="{NPU}"}}',
                            {(("health", "Healthy"), ("resource", NPU)): 1.0,
                             (("health", "Unhealthy"), ("resource", NPU)): 1.0}, "one healthy, one unhealthy")

    # Every query of the Grafana dashboard is PromQL this server accepts, with the dashboard's variables as
    # Grafana would expand them (every pod, a rate window of a few scrapes).
    for promql in dashboard_queries(load_dashboard()):
        expanded = promql.replace("$instance", ".*").replace("$__rate_interval", "15s")
        if not promql.startswith("label_values("):  # Grafana's own function, not PromQL
            prometheus.query(expanded)
    # The dashboard's pod variable (label_values of rbln_device_plugin_registered by instance): this one pod.
    assert len(prometheus.query("group by (instance) (rbln_device_plugin_registered)")) == 1
