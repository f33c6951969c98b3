"""What the scanner imports: it starts with four other programs on a node's two cores, so what its work does
not need must never load. The real `python -m scanner` code path (scanner/__main__.py) on a simulated
node; its modules are read from inside the process once it has scanned and published (its status record
follows the first publication), then it is stopped with SIGTERM as supervisord does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Run as `python -c`: runs the scanner's entry as `-m scanner` does, records sys.modules once it has published.
HARNESS = """
import json, os, pathlib, runpy, signal, sys, threading

run_dir, report = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


def watch():
    published = threading.Event()
    while not published.wait(0.02):
        try:
            status = json.loads((run_dir / "status-scanner.json").read_bytes())
        except (OSError, ValueError):
            continue
        published.set()
    report.write_text(json.dumps({"modules": sorted(sys.modules), "status": status}))
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=watch, daemon=True).start()
sys.argv = ["scanner"]
runpy.run_module("scanner", run_name="__main__", alter_sys=True)
"""
# asyncio (loguru's, shared/fence/loguru_asyncio.py) and what it brings; OpenSSL's hashes (hashlib, hmac: the
# random names need only os.urandom); uuid (platform); PyYAML, for a YAML CDI spec
# only (the node has none); the other programs' own libraries and code; the web's modules.
NEVER = ("asyncio", "ssl", "_hashlib", "hmac", "concurrent", "uuid", "yaml", "grpc", "google.protobuf",
         "opentelemetry", "email", "http", "xmlrpc", "resource_worker", "kubelet_watchdog", "dra_worker",
         "rbln_device_plugin")


def _loaded(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_the_scanner_imports_only_what_its_work_needs(make_node, tmp_path):
    node = make_node("2:none,1:vf4")
    report = tmp_path / "modules.json"
    result = subprocess.run([sys.executable, "-c", HARNESS, str(node.run_dir), str(report)],
                            env={**os.environ, **node.env()}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(report.read_text())
    assert seen["status"]["resources"]["rebellions.ai/npu"] == 2  # it scanned and published before the check
    assert _loaded(seen["modules"], ("zmq", "loguru", "scanner.main")) != []
    assert _loaded(seen["modules"], NEVER) == []
