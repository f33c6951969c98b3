"""worker-dra: Prepare's own time, how soon a slice follows an inventory change, and the worker's memory.

    python bench/dra.py [--quick]

- `dra/prepare-own`, `dra/unprepare-own`: NodePrepareResources' and NodeUnprepareResources' domain logic
  (dra_worker.prepare.Preparer) in this process on the benchmark node, for a new one-NPU claim each time:
  checkpoint read and write (fsync'd), device checks with the final status read, the RSD group through the
  simulator's rbln-smi stand-in, the CDI spec (checked; on tmpfs, not fsync'd). Own time = the call's time less
  its time in rbln-smi (spawn to exit, counted by the runner) and less the claim read (here an in-memory store: the API
  server's latency is not the plugin's). Goal: Prepare's own p99 <= 5 ms. `cpu_p99_ms`: this thread's CPU in
  Prepare (the spawn of rbln-smi included); the rest of the own time is waiting for the disk (the
  checkpoint's data fsync, into the benchmark's temporary directory) and for the scheduler; the `/tmpfs` rows keep
  the checkpoint in /dev/shm, which takes the disk out of it.
- `dra/slice-update`: the real stack in DRA mode (scan interval 1 s) with a loopback stand-in of the API
  server, reached over TLS as a real one is (its self-signed certificate is the kubeconfig's cluster CA); a
  device's driver status flips between FAULT and READY, and the time from the flip until the server's
  ResourceSlices show it is measured. Goal: <= one scan interval + 1 s.
- `dra/rss`: worker-dra's resident memory after its slices are published and a claim was prepared over its
  socket, with metrics on and tracing off (the defaults). Goal: <= 45 MiB. `anonymous_mib` is the worker's own
  memory; the rest of its RSS is the libraries' code (gRPC's core alone about 10 MiB, libpython 5, libcrypto 4),
  pages the stack's other Python processes map too (PSS splits them).
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from loguru import logger

from bench import common
from dra_worker.checkpoint import Checkpoint
from dra_worker.inventory import InventoryState
from dra_worker.prepare import ClaimRef, Preparer, PrepareSettings
from scanner.discovery import scan
from shared.cdi.annotation import CdiAnnotation
from shared.channels import inventory_protocol
from shared.node.driver_status import read_status
from shared.node.rbln_smi import RblnSmi, SmiUsage, run_bounded
from shared.node.rsd_group import RsdGroups
from simulator.kube_api import FakeKubeApi
from simulator.spec import NodeSpec
from simulator.stack import StackProcess
from tests.support.certificates import self_signed

NODE = "bench-node"
DRIVER = "npu.rebellions.ai"
CALLS, QUICK_CALLS = 200, 30
FLIPS, QUICK_FLIPS = 8, 3
PREPARE_GOAL_MS = 5.0
RSS_GOAL_MIB = 45
SCAN_INTERVAL_S = 1.0


def _claim(uid: str, device: str) -> dict:
    return {"metadata": {"name": f"c-{uid}", "namespace": "bench", "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "npu", "driver": DRIVER, "pool": NODE, "device": device}]}}}}


class _Claims:
    def __init__(self) -> None:
        self.claims: dict[str, dict] = {}

    def get_claim(self, namespace: str, name: str, timeout: float) -> dict:
        return self.claims[name]


def prepare_rows(calls: int, data_root: str | None = None, suffix: str = "") -> list[dict]:
    """The rows for a checkpoint in a temporary directory under `data_root` (None: the default temp dir)."""
    logger.remove()
    spec = NodeSpec.uniform(num_pfs=8, numa_nodes=2, switches=4)
    with common.temporary_node(spec) as node, \
            tempfile.TemporaryDirectory(prefix="rbln-bench-dra-", dir=data_root) as data:
        usage = SmiUsage()
        smi = RblnSmi(node.rbln_smi, runner=usage.timing(run_bounded))
        state = InventoryState()
        result = scan(RblnSmi(node.rbln_smi), node.sysfs_root)
        for resource, devices in result.inventories.items():
            state.on_inventory(inventory_protocol.InventoryMessage(resource, "e", 1, 0, devices, None, True,
                                                                   result.driver_version))
        claims = _Claims()
        preparer = Preparer(PrepareSettings(
            api=claims, inventory=state.current, rsd_groups=RsdGroups(smi, node.lock_file),
            checkpoint=Checkpoint(pathlib.Path(data)), read_status=lambda d: read_status(node.sysfs_root, d),
            pool=NODE, cdi_root=node.cdi_root, dev_root=node.dev_root, cdi_annotation=CdiAnnotation.ALWAYS))
        prepare_own: list[float] = []
        unprepare_own: list[float] = []
        smi_ms: list[float] = []
        own_cpu: list[float] = []
        for index in range(calls):
            ref = ClaimRef("bench", f"uid-{index}", f"c-uid-{index}")
            claims.claims[ref.name] = _claim(ref.uid, f"rbln{index % 8}")
            for work, own in ((lambda r=ref: preparer.prepare([r]), prepare_own),
                              (lambda r=ref: preparer.unprepare([r]), unprepare_own)):
                before = usage.seconds
                started, cpu = time.perf_counter(), time.thread_time()
                answer = work()
                total = time.perf_counter() - started
                own_cpu.append((time.thread_time() - cpu) * 1000)
                assert all(getattr(v, "error", v) is None for v in answer.values()), answer
                own.append((total - (usage.seconds - before)) * 1000)
                smi_ms.append((usage.seconds - before) * 1000)
    p99 = common.percentile(prepare_own, 0.99)
    return [
        {"benchmark": f"dra/prepare-own{suffix}", "calls": calls, **common.spread(prepare_own),
         "smi_p50_ms": round(common.percentile(smi_ms, 0.5), 1),
         "cpu_p99_ms": round(common.percentile(own_cpu[0::2], 0.99), 3),
         "goal": f"own p99 <= {PREPARE_GOAL_MS:g} ms", "met": p99 <= PREPARE_GOAL_MS},
        {"benchmark": f"dra/unprepare-own{suffix}", "calls": calls, **common.spread(unprepare_own),
         "goal": "", "met": None},
    ]


def _tainted(api: FakeKubeApi) -> set[str]:
    """The published devices that carry a taint (an Unhealthy device stays in its slice, tainted)."""
    with api._lock:
        return {d["name"] for s in api.slices.values() for d in s["spec"]["devices"] if d.get("taints")}


def _await(condition, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError("the slices did not follow the inventory")
        time.sleep(0.005)
    return time.monotonic() - started


def stack_rows(flips: int) -> list[dict]:
    import grpc

    from shared.channels.status_files import read_status as read_process_status
    from shared.kubelet.dra.v1 import api_pb2, api_pb2_grpc

    credentials = tempfile.TemporaryDirectory(prefix="rbln-bench-dra-tls-")
    api = FakeKubeApi(tls=self_signed(pathlib.Path(credentials.name), "127.0.0.1")).start()
    api.nodes[NODE] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "n"}}
    try:
        with common.temporary_node(NodeSpec.uniform(num_pfs=8, numa_nodes=2, switches=4)) as node:
            env = {"RESOURCE_API": "dra", "NODE_NAME": NODE, "KUBELET_PLUGINS_PATH": str(node.root / "plugins"),
                   "KUBELET_PLUGIN_REGISTRY_PATH": str(node.root / "registry"),
                   "KUBECONFIG": str(api.kubeconfig(node.root / "kubeconfig")),
                   "METRICS_PORT": "0"}  # metrics on, as by default (the simulated node turns them off)
            with StackProcess(common.stack_environment(node, f"{SCAN_INTERVAL_S:g}s", **env)) as stack:
                stack.wait_for_record("Published ResourceSlices", timeout=common.START_TIMEOUT)
                delays = []
                for index in range(flips):
                    faulty = index % 2 == 0
                    node.set_status("rbln3", 4 if faulty else 0)
                    delays.append(_await(lambda f=faulty: ("rbln3" in _tainted(api)) is f, 10) * 1000)
                api.claims[("bench", "c1")] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                               **_claim("uid-rss", "rbln0"), "spec": {"devices": {}}}
                api.claims[("bench", "c1")]["metadata"]["name"] = "c1"
                with grpc.insecure_channel(f"unix://{node.root / 'plugins' / DRIVER / 'dra.sock'}") as channel:
                    answer = api_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                        api_pb2.NodePrepareResourcesRequest(claims=[api_pb2.Claim(
                            namespace="bench", uid="uid-rss", name="c1")]), timeout=30)
                    assert answer.claims["uid-rss"].error == "", answer
                status = read_process_status(node.run_dir, "worker-dra")
                assert status is not None
                memory = common.memory(int(status["pid"]))
    finally:
        api.stop()
        credentials.cleanup()
    goal_ms = (SCAN_INTERVAL_S + 1) * 1000
    rss_mib = memory.rss_kb / 1024
    return [
        {"benchmark": "dra/slice-update", "flips": flips, **common.spread(delays),
         "goal": f"<= scan interval + 1 s ({goal_ms:.0f} ms)", "met": max(delays) <= goal_ms},
        {"benchmark": "dra/rss", "rss_mib": round(rss_mib, 1), "pss_mib": round(memory.pss_kb / 1024, 1),
         "anonymous_mib": round(memory.anonymous_kb / 1024, 1),
         "goal": f"RSS <= {RSS_GOAL_MIB} MiB", "met": rss_mib <= RSS_GOAL_MIB},
    ]


def run(quick: bool) -> list[dict]:
    calls = QUICK_CALLS if quick else CALLS
    in_memory = [] if not pathlib.Path("/dev/shm").is_dir() else prepare_rows(calls, "/dev/shm", "/tmpfs")
    return prepare_rows(calls) + in_memory + stack_rows(QUICK_FLIPS if quick else FLIPS)


if __name__ == "__main__":
    common.script_main(__doc__, run, f"{QUICK_CALLS} calls and {QUICK_FLIPS} flips instead of {CALLS} and {FLIPS}")
