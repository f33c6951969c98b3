"""A worker whose resource the node lacks holds only what following the snapshots needs (the subscription, its
device table, the log): no gRPC server, no tracer, no recorder, no placement. It starts serving from the
first snapshot that lists devices.

The real `python -m resource_worker` and the real scanner over ZeroMQ on a simulated node, the kubelet
simulator on the device plugin dir; metrics on and tracing configured (an OTLP endpoint on loopback where
nothing listens: no span is ever sent). What the worker imports is what the interpreter itself reports
(`-X importtime` writes a line to stderr as each module is imported, at any time of the process's life); that
gRPC's extension is not loaded is read from outside, in /proc/<pid>/maps. The scanner scans every 5 s (the
default): the worker must register before the scan after the one that first lists the devices, with a margin
of seconds over what serving takes to start (well under one on this machine, loaded).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

from shared.channels.status_files import read_status
from shared.resources import Resource
from simulator import smi_state
from tests.support.ports import free_port
from tests.support.waiting import wait_until

NPU = Resource.NPU.value
TIMEOUT = 30.0
SCAN_INTERVAL = "5s"
# What serving needs, and only serving: gRPC (and the asyncio it imports) and the API, the tracer (and with an
# endpoint the SDK), the Allocator and placement.
SERVING_ONLY = ("grpc", "asyncio", "opentelemetry", "shared.observability.tracing", "shared.kubelet.deviceplugin",
                "resource_worker.serving", "resource_worker.plugin_server", "resource_worker.allocation",
                "resource_worker.placement")
# Never imported by a worker: the value files are written without prometheus_client; OpenSSL's hashes (the
# random socket names need only os.urandom) come with gRPC's ssl at most.
NEVER = ("prometheus_client",)
ABSENT_NEVER = ("_hashlib", "hmac")
GRPC_EXTENSION = "cygrpc"


def _imported(log: pathlib.Path) -> set[str]:
    """The modules the process has imported so far, from its `-X importtime` lines."""
    lines = log.read_text(errors="replace").splitlines()
    return {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:") and "|" in line}


def _loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def _maps_grpc(pid: int) -> bool:
    return GRPC_EXTENSION in pathlib.Path(f"/proc/{pid}/maps").read_text()


def _scanner(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scanner"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=TIMEOUT)


def test_a_worker_without_devices_holds_no_serving_parts_and_serves_from_the_first_snapshot_with_devices(
        make_node, kubelet, tmp_path):
    node = make_node("2")
    for device in node.devices():
        node.remove_device(device)
    env = {**os.environ, **node.env(SCAN_INTERVAL), "METRICS_PORT": "0",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"127.0.0.1:{free_port()}"}
    imports = tmp_path / "importtime.log"
    scanner = _scanner(env)
    with imports.open("wb") as stderr:
        worker = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "resource_worker", "--resource", NPU],
                                  env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        def following() -> bool:
            status = read_status(node.run_dir, Resource.NPU.process_name)
            return status is not None and status["scannedAt"] is not None

        wait_until(following, TIMEOUT, "the worker to follow the scanner's snapshots")
        status = read_status(node.run_dir, Resource.NPU.process_name)
        assert status is not None and status["deviceCount"] == 0 and status["registered"] is False
        absent = _imported(imports)
        assert "resource_worker.lifecycle" in absent and "zmq" in absent  # the log is read as it should be
        assert _loaded(absent, SERVING_ONLY + NEVER + ABSENT_NEVER) == []
        assert not _maps_grpc(worker.pid)
        assert kubelet.registrations == []

        # The devices appear, to the next scan.
        appeared = time.time()
        for device in node.devices():
            node.restore_device(device)
        kubelet.wait_for(lambda k: any(r.request.resource_name == NPU and r.error is None for r in k.registrations),
                         TIMEOUT, "the worker's Register")
        kubelet.wait_for_devices(NPU, {device: "Healthy" for device in node.devices()}, TIMEOUT)
        registered = min(r.time for r in kubelet.registrations if r.error is None)
        scans = [call for call in node.smi_calls() if call["command"] == smi_state.INVENTORY
                 and appeared <= call["start"] <= registered]
        # At most the one that found the devices (none if one under way as they appeared did): not the next.
        assert len(scans) <= 1, scans

        serving = _imported(imports)
        assert _loaded(serving, SERVING_ONLY) != []  # the absence above is the absence of what serving imports
        assert _loaded(serving, ("grpc", "opentelemetry.sdk", "resource_worker.placement")) != []
        assert _loaded(serving, NEVER) == []
        assert _maps_grpc(worker.pid)
        assert sorted(path.name.split("_")[0] for path in (node.run_dir / "metrics").glob(f"*_{worker.pid}.db")) \
            == ["counter", "histogram"]
    finally:
        worker_exit = _stop(worker)
        _stop(scanner)
    assert worker_exit == 0
