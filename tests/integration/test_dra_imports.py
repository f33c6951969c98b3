"""What worker-dra imports, and when: its memory is mostly the modules it loads, so what it does not need (the
OpenTelemetry SDK without an endpoint, prometheus_client (its value files are written without it), the other
programs' code) must never be imported, what only its shutdown needs not while it serves, and the API client
not before its first call. The real `python -m dra_worker` code path, on a simulated node with the real scanner
and the loopback stand-in of the API server; its modules are read from inside the process once it serves and
has published its slices, then it is stopped with SIGTERM as supervisord does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client.mmap_dict import MmapedDict

from simulator.kube_api import FakeKubeApi

NODE = "node-imports"
# Run as `python -c`: records sys.modules at import and once the worker serves, then stops the worker.
HARNESS = """
import json, os, pathlib, signal, sys, threading

import dra_worker.main
from shared.channels.status_files import read_status

at_import = sorted(sys.modules)
run_dir, report = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


def watch():
    published = threading.Event()
    while not published.wait(0.02):
        status = read_status(run_dir, "worker-dra")
        if status is not None and status["sliceGeneration"] >= 1 and status["devices"] > 0:
            published.set()
    report.write_text(json.dumps({"import": at_import, "serving": sorted(sys.modules)}))
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=watch, daemon=True).start()
dra_worker.main.main()
"""
# Never needed by worker-dra: the SDK (tracing off by default), prometheus_client (only the watchdog, serving
# /metrics, reads the value files with it), the other programs, any general-purpose Kubernetes or HTTP client
# (worker-dra speaks HTTP/2 to the API server itself: dra_worker/http2_client.py).
NEVER = ("opentelemetry", "prometheus_client", "resource_worker", "scanner", "kubelet_watchdog", "kubernetes",
         "lightkube", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "requests")
# Not before the first API call (made by the slice publisher once the worker serves).
API_CLIENT = ("dra_worker.http2_client", "dra_worker.api_credentials", "h2", "hpack", "hyperframe", "yaml")
# Only for the question asked of supervisord at shutdown (shared/supervision/transport.py).
AT_SHUTDOWN = ("configparser", "xml")


def _loaded(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def _worker_modules(node, tmp_path, metrics_port: str) -> dict[str, list[str]]:
    api = FakeKubeApi().start()
    api.nodes[NODE] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid"}}
    try:
        report = tmp_path / f"modules-{metrics_port}.json"
        env = {**os.environ, **node.env(), "RESOURCE_API": "dra", "NODE_NAME": NODE,
               "KUBELET_PLUGINS_PATH": str(node.root / "plugins"),
               "KUBELET_PLUGIN_REGISTRY_PATH": str(node.root / "plugins_registry"),
               "KUBECONFIG": str(api.kubeconfig(node.root / "kubeconfig")), "METRICS_PORT": metrics_port}
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        # The scanner publishes the inventory the worker waits for before its first slices.
        scanner = subprocess.Popen([sys.executable, "-m", "scanner"], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            result = subprocess.run([sys.executable, "-c", HARNESS, str(node.run_dir), str(report)], env=env,
                                    capture_output=True, text=True, timeout=120)
        finally:
            scanner.terminate()
            scanner.wait(timeout=30)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(report.read_text())
    finally:
        api.stop()


@pytest.mark.parametrize("metrics_port", ["0", "-1"])
def test_worker_dra_imports_only_what_it_uses(make_node, tmp_path, metrics_port):
    node = make_node("2")
    modules = _worker_modules(node, tmp_path, metrics_port)
    assert _loaded(modules["import"], API_CLIENT + NEVER) == []
    serving = modules["serving"]
    assert _loaded(serving, NEVER + AT_SHUTDOWN) == []
    assert _loaded(serving, ("h2",)) != []  # the condition above is met by a worker that did its work
    # Its events recorded all the same (only worker-dra publishes slices), with metrics on.
    recorded = {json.loads(key)[0] for path in (node.run_dir / "metrics").glob("*.db")
                for key, *_ in MmapedDict.read_all_values_from_file(str(path))}
    assert ("rbln_device_plugin_dra_slice_publishes" in recorded) is (metrics_port != "-1")
