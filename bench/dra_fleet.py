"""worker-dra's ResourceSlice publisher at fleet scale, beside Kubernetes' own, on a real kube-apiserver.

    python bench/dra_fleet.py [--quick] [--nodes 1 100 1000] [--rest SECONDS] [--harness PATH] [--profile DIR]

The API server is the DRA harness's (tests/dra/harness: kube-apiserver and etcd of the pinned k8s.io/kubernetes
release, in one process on loopback; built here unless --harness names the binary). For each fleet size N, two
publishers of the same N nodes, one after the other, each in a process of its own:

- `python`: N instances of worker-dra's own publisher (dra_worker.publisher.SlicePublisher with its own
  dra_worker.kube.KubeApi client each: one connection per node), at most PUBLISHERS_PER_PROCESS to a Python
  process (a node runs its publisher in a process of its own; packed many to an interpreter, they would measure
  the packing, not the publisher: one interpreter runs on one core at a time, and its threads hand its lock
  over through the kernel: at 1,000 publishers in one process a fleet-wide change cost 31-49 ms of CPU per
  node, 80 % of it futex calls, against 3.3-3.7 ms per node at 20 to 300);
- `go`: N instances of Kubernetes' `k8s.io/dynamic-resource-allocation/resourceslice` controller of the same
  release (`dra-harness publishers`), a client each, in one Go process (which runs on every core).

Every node publishes one pool of the same 8 NPUs (the devices worker-dra publishes for an 8-NPU node). Phases,
each a row: `start` (until every node's slices are right), `rest` (nothing changes; 5 minutes, `--quick` 1),
`change` (every node's inventory changes at once: one NPU turns Unhealthy; until every node's slices are right),
`restart` (the API server restarts gracefully on the same port and data; from the moment it is ready until
every node's watch is back and its slices are right, then 10 s more). Per row: requests on `resourceslices` by
verb (the API server's own `apiserver_request_total`, which counts a watch when it ends: an open watch is not in
it; its counters start again at a restart; the requests of the benchmark's own watch are left out, and the
LISTs it made to start it afresh are in `benchmark_lists`),
requests per node-hour beyond the watch, the API server's CPU seconds (etcd's included: one process), the
publishers' (on this machine they share its cores with the API server) and the seconds until right.
The publishers' own processes: CPU seconds and RSS (summed over a side's processes) at the end of the run.
Goals: no row worse than the Go controller's, and at rest <= 1 request per node-hour beyond the watch.

`--profile DIR` says where the API server's CPU goes and what the publishers' connections are: kube-apiserver
profiles itself (/debug/pprof/profile) for PROFILE_SECONDS from the start of each `start` and `change` row (the
row then lasts at least that long), into DIR/SIDE-N-PHASE.pprof (`go tool pprof -top` reads it), and those rows
gain `connections_seen` (the publishers' TCP connections to the API server, sampled every POLL seconds: how many
distinct ones were open in the row) and `connections_end` (how many at its end).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common
from shared.config import DRA_DRIVER

ROOT = pathlib.Path(__file__).resolve().parent.parent
HARNESS = ROOT / "tests" / "dra" / "harness"
REST_SECONDS, QUICK_REST_SECONDS = 300.0, 60.0
NODES, QUICK_NODES = (1, 100, 1000), (1, 100)
SETTLE_SECONDS = 10.0
CONVERGE_TIMEOUT = 600.0
POLL = 0.5
PROFILE_SECONDS = 45
FAULTY = "rbln3"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PUBLISHERS_PER_PROCESS = 50


# -- the inventories both publishers publish ----------------------------------------------------------------

def inventories() -> tuple[Any, Any]:
    """worker-dra's view of an 8-NPU node, before and after one NPU turns Unhealthy."""
    from dra_worker.inventory import InventoryState
    from scanner.discovery import scan
    from shared.channels import inventory_protocol
    from shared.node.rbln_smi import RblnSmi
    from simulator.spec import NodeSpec

    found = []
    with common.temporary_node(NodeSpec.uniform(num_pfs=8, numa_nodes=2, switches=4)) as node:
        for status in (0, 4):
            node.set_status(FAULTY, status)
            state = InventoryState()
            result = scan(RblnSmi(node.rbln_smi), node.sysfs_root)
            for resource, devices in result.inventories.items():
                state.on_inventory(inventory_protocol.InventoryMessage(resource, "e", 1, 0, devices, None, True,
                                                        result.driver_version))
            found.append(state.current())
    return found[0], found[1]


def device_lists() -> tuple[list[dict], list[dict]]:
    """The devices worker-dra publishes before and after the change (the Unhealthy NPU tainted, as by default)."""
    from dra_worker import slices
    from shared.config import TaintEffect

    before, after = inventories()
    return (slices.published_devices(before, TaintEffect.NO_SCHEDULE),
            slices.published_devices(after, TaintEffect.NO_SCHEDULE))


def published(devices: list[dict]) -> set[tuple[str, tuple[tuple[str, str, str], ...]]]:
    """Devices as the check compares them: names and taints (without the time the API server stamps)."""
    return {(device["name"], tuple(sorted((taint["key"], taint.get("value", ""), taint["effect"])
                                          for taint in device.get("taints") or ()))) for device in devices}


# -- the Python side: worker-dra's publishers, in a process of their own ------------------------------------

def serve_python(kubeconfig: str) -> None:
    """`--serve-python`: worker-dra's publishers driven over stdin as `dra-harness publishers` is."""
    from loguru import logger

    from dra_worker.kube import KubeApi
    from dra_worker.publisher import SlicePublisher

    logger.remove()
    before, after = inventories()
    current = [before]
    restarts: list[int] = []
    publishers: list[SlicePublisher] = []
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "start":
            for node in command["nodes"]:
                publisher = SlicePublisher(KubeApi(pathlib.Path(kubeconfig)), node["name"], lambda: current[0],
                                           on_watch_restart=lambda: restarts.append(1))
                publisher.start()
                publisher.wake()
                publishers.append(publisher)
            answer: dict[str, Any] = {}
        elif command["cmd"] == "update":
            current[0] = after
            for publisher in publishers:
                publisher.wake()
            answer = {}
        elif command["cmd"] == "stats":
            answer = {"watchRestarts": len(restarts)}
        else:
            answer = {}
        print(json.dumps({"ok": True, **answer}), flush=True)
        if command["cmd"] == "stop":
            os._exit(0)  # the watchers block in their streams: end them with the process


class Publishers:
    """One side's processes (`processes` of `argv` each), driven with JSON lines: a `start` command's nodes are
    shared out among them, every other command goes to each, and their answers' counts are added up. Made once
    every process answers (its imports and set-up are not part of any row)."""

    def __init__(self, argv: list[str], log: pathlib.Path, processes: int = 1):
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self._procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                        text=True, bufsize=1) for _ in range(processes)]
        self.request(cmd="stats")

    @property
    def pids(self) -> set[int]:
        return {proc.pid for proc in self._procs}

    def request(self, **command: Any) -> dict[str, Any]:
        for index, proc in enumerate(self._procs):  # all at once: each works while the next is told
            assert proc.stdin is not None
            part = ({**command, "nodes": command["nodes"][index::len(self._procs)]} if command["cmd"] == "start"
                    else command)
            proc.stdin.write(json.dumps(part) + "\n")
        total: dict[str, Any] = {}
        for proc in self._procs:
            assert proc.stdout is not None
            answer = json.loads(proc.stdout.readline() or '{"ok": false, "error": "the process ended"}')
            if not answer.pop("ok"):
                raise RuntimeError(f"{command['cmd']}: {answer.get('error')}")
            for key, value in answer.items():
                total[key] = total.get(key, 0) + value
        return total

    def cpu_seconds(self) -> float:
        return sum(common.own_cpu_seconds(pid) for pid in self.pids)

    def rss_kb(self) -> int:
        return sum(common.memory(pid).rss_kb for pid in self.pids)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.request(cmd="stop")
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._log.close()


# -- the API server's side ----------------------------------------------------------------------------------

class Fleet:
    """The API server as the benchmark sees it: its counters, its CPU, the slices of the driver."""

    def __init__(self, server: Any):
        self.server = server
        self.client = server.client()
        self.tracker = SliceTracker(server)

    def reconnect(self) -> None:
        """After the API server restarted (its counters start at zero)."""
        self.client.close()
        self.client = self.server.client()
        self.tracker.lists = self.tracker.watches_ended = 0

    def create_nodes(self, names: list[str]) -> list[dict[str, str]]:
        """The Nodes, as the publishers are told of them: by name (each side looks its Node's UID up itself, as a
        node's plugin must)."""
        for name in names:
            self.client.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node",
                                                    "metadata": {"name": name}}).raise_for_status()
        return [{"name": name} for name in names]

    def watches(self) -> float:
        """Open watches on resourceslices (the API server's apiserver_longrunning_requests) but the
        benchmark's own."""
        total = 0.0
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith("apiserver_longrunning_requests{") and 'resource="resourceslices"' in line \
                    and 'verb="WATCH"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total - self.tracker.watches

    def counts(self) -> dict[str, float]:
        counts = self.server.request_counts("resourceslices")
        counts["LIST"] = counts.get("LIST", 0.0) - self.tracker.lists
        counts["WATCH"] = counts.get("WATCH", 0.0) - self.tracker.watches_ended
        return counts

    def cpu(self) -> float:
        return common.own_cpu_seconds(self.server.pid)

    def delete_slices(self) -> None:
        self.client.delete(SLICES, params={"fieldSelector": f"spec.driver={DRA_DRIVER}"}).raise_for_status()


class SliceTracker:
    """The driver's slices as a watch of the benchmark's own shows them. Telling when every node's are right then
    costs the API server a LIST and a watch per row (and a LIST again if it drops the watch in a burst), not a
    LIST of the whole fleet's slices every POLL seconds (at 1,000 nodes an answer of 4 MB each, more of them for
    the side that takes longer), and the time until right is known to the event, not to the next poll."""

    def __init__(self, server: Any):
        self._server = server
        self._connection: http.client.HTTPSConnection | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Guards _node_of, _by_node, _wanted, _right and _failure: the watch thread writes them, the benchmark
        # waits on them.
        self._changed = threading.Condition()
        self._node_of: dict[str, str] = {}  # slice name: its node
        self._by_node: dict[str, dict[str, frozenset]] = {}  # node: {its slices' names: their devices as published}
        self._wanted: tuple[frozenset[str], frozenset] | None = None  # the nodes and the devices awaited
        self._right: set[str] = set()  # the awaited nodes whose one slice lists the awaited devices
        self._failure: str | None = None
        self.lists = 0
        """The LISTs it made (the API server counts them with the publishers')."""
        self.watches = 0
        """Its watches open (0 or 1)."""
        self.watches_ended = 0
        """Its watches that ended (the API server counts a watch when it ends)."""

    def start(self) -> None:
        """List the slices, then watch them from the list's version; returns once the watch is open."""
        self._stopping.clear()
        self._failure = None
        response = self._list_and_watch()
        self._thread = threading.Thread(target=self._follow, args=(response,), daemon=True)
        self._thread.start()

    def _list_and_watch(self) -> http.client.HTTPResponse:
        with self._server.client() as client:
            listing = client.get(SLICES, params={"fieldSelector": f"spec.driver={DRA_DRIVER}"})
            self.lists += 1
            listing.raise_for_status()
            body = listing.json()
            token = client.headers["Authorization"]
        with self._changed:
            self._node_of, self._by_node = {}, {}
            for item in body["items"]:
                self._place(item)
            self._judge_all()
        query = urllib.parse.urlencode({
            "fieldSelector": f"spec.driver={DRA_DRIVER}", "watch": "true",
            "resourceVersion": body["metadata"]["resourceVersion"], "timeoutSeconds": int(CONVERGE_TIMEOUT * 10)})
        url = urllib.parse.urlsplit(self._server.url)
        # the standard library's client, whose socket `stop` can shut down under a blocked read
        self._connection = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=60,
                                                       context=self._server.tls_context())
        self._connection.request("GET", f"{SLICES}?{query}", headers={"Authorization": token})
        response = self._connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"the benchmark's watch: {response.status} {response.read()[:200]!r}")
        assert self._connection.sock is not None
        self._connection.sock.settimeout(None)
        self.watches = 1
        return response

    def stop(self) -> None:
        self._stopping.set()
        if self._connection is not None and self._connection.sock is not None:
            with contextlib.suppress(OSError):
                self._connection.sock.shutdown(socket.SHUT_RDWR)  # ends the watch thread's read
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._connection is not None:
            self._connection.close()
        self._thread, self._connection = None, None

    def _follow(self, response: http.client.HTTPResponse) -> None:
        """Apply the watch's events; a watch the API server ends (kube-apiserver drops a watcher that falls
        behind a burst of events) is started afresh from a new list, as an informer would."""
        while True:
            try:
                while (line := response.readline()) and self._apply(json.loads(line) if line.strip() else None):
                    pass
            except (OSError, http.client.HTTPException):
                pass
            self.watches = 0
            self.watches_ended += 1
            if self._connection is not None:
                self._connection.close()
            if self._stopping.is_set():
                return
            try:
                response = self._list_and_watch()
            except Exception as exc:  # the watch is the benchmark's only view: what stops it fails the wait
                with self._changed:
                    self._failure = f"the benchmark's watch failed: {type(exc).__name__}: {exc}"
                    self._changed.notify_all()
                return

    def _apply(self, event: dict[str, Any] | None) -> bool:
        """One line of the watch (None: an empty one); False for an ERROR event (410 Gone: the watch is started
        afresh)."""
        if event is None:
            return True
        if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
            return event["type"] != "ERROR"
        item = event["object"]
        name = item["metadata"]["name"]
        with self._changed:
            before = self._node_of.pop(name, None)
            if before is not None:
                del self._by_node[before][name]
            if event["type"] != "DELETED":
                self._place(item)
            for node in {before, self._node_of.get(name)}:
                if node is not None:
                    self._judge(node)
            self._changed.notify_all()
        return True

    def _place(self, item: dict[str, Any]) -> None:
        """Called with the lock held."""
        name, node = item["metadata"]["name"], item["spec"].get("nodeName", "")
        self._node_of[name] = node
        self._by_node.setdefault(node, {})[name] = frozenset(published(item["spec"].get("devices") or []))

    def _judge(self, node: str) -> None:
        """Called with the lock held."""
        if self._wanted is None or node not in self._wanted[0]:
            return
        if list(self._by_node.get(node, {}).values()) == [self._wanted[1]]:
            self._right.add(node)
        else:
            self._right.discard(node)

    def _judge_all(self) -> None:
        """Called with the lock held."""
        self._right = set()
        for node in self._wanted[0] if self._wanted is not None else ():
            self._judge(node)
        self._changed.notify_all()

    def await_right(self, nodes: list[str], devices: list[dict], timeout: float = CONVERGE_TIMEOUT) -> float:
        """Seconds until every node has exactly one slice of the driver, listing exactly `devices` (their taints
        too)."""
        started = time.monotonic()
        with self._changed:
            self._wanted = (frozenset(nodes), frozenset(published(devices)))
            self._judge_all()
            while len(self._right) < len(nodes):
                if self._failure is not None:
                    raise RuntimeError(self._failure)
                if not self._changed.wait(max(0.0, started + timeout - time.monotonic())):
                    raise TimeoutError(f"not within {timeout:g}s: {len(nodes) - len(self._right)} nodes' slices "
                                       "are not right")
        return time.monotonic() - started


def _await(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not within {timeout:g}s: {what}")
        time.sleep(POLL)
    return time.monotonic() - started


def publisher_connections(port: int, pids: set[int]) -> set[str]:
    """The local ends of the established TCP connections to the API server's `port` that processes `pids` hold."""
    listing = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{port} )"], capture_output=True,
                             text=True, check=True).stdout
    owners = tuple(f"pid={pid}," for pid in pids)
    return {line.split()[2] for line in listing.splitlines() if any(owner in line for owner in owners)}


@contextlib.contextmanager
def profiled(fleet: Fleet, row: dict[str, Any], directory: pathlib.Path | None, pids: set[int]) -> Iterator[None]:
    """With a `directory`: the API server's CPU profile from the block's start into it, and the publishers'
    connections seen over the block, into `row`; else nothing."""
    if directory is None:
        yield
        return
    port = int(fleet.server.url.rsplit(":", 1)[1])
    seen: set[str] = set()
    done = threading.Event()

    def profile() -> None:
        with fleet.server.client() as client:
            answer = client.get("/debug/pprof/profile", params={"seconds": PROFILE_SECONDS},
                                timeout=PROFILE_SECONDS + 60)
        answer.raise_for_status()
        (directory / f"{row['side']}-{row['nodes']}-{row['phase']}.pprof").write_bytes(answer.content)

    def sample() -> None:
        while not done.wait(POLL):
            seen.update(publisher_connections(port, pids))

    threads = [threading.Thread(target=profile), threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    yield
    row["connections_end"] = len(publisher_connections(port, pids))
    threads[0].join()
    done.set()
    threads[1].join()
    row["connections_seen"] = len(seen)


@contextlib.contextmanager
def measured(fleet: Fleet, publishers: Publishers, row: dict[str, Any], nodes: int) -> Iterator[None]:
    """Requests by verb, the API server's CPU and the publishers' over the block, into `row`."""
    counts, cpu, started, lists = fleet.counts(), fleet.cpu(), time.monotonic(), fleet.tracker.lists
    publishers_cpu = publishers.cpu_seconds()
    yield
    seconds = time.monotonic() - started
    after = fleet.counts()
    by_verb = {verb: int(after.get(verb, 0) - counts.get(verb, 0)) for verb in sorted({*after, *counts})}
    row["requests"] = {verb: n for verb, n in by_verb.items() if n}
    beyond = sum(n for verb, n in by_verb.items() if verb != "WATCH")
    row["per_node_hour_beyond_watch"] = round(beyond / nodes / (seconds / 3600), 2)
    row["apiserver_cpu_s"] = round(fleet.cpu() - cpu, 2)
    row["publishers_cpu_s"] = round(publishers.cpu_seconds() - publishers_cpu, 2)
    row["window_s"] = round(seconds, 1)
    row["benchmark_lists"] = fleet.tracker.lists - lists  # its watch started afresh (left out of `requests`)


def run_side(side: str, fleet: Fleet, publishers: Publishers, count: int, rest: float,
             devices: tuple[list[dict], list[dict]], profile: pathlib.Path | None = None) -> list[dict]:
    names = [f"{side}-{count}-{index:04d}" for index in range(count)]
    nodes = fleet.create_nodes(names)
    rows: list[dict[str, Any]] = []

    def row(phase: str) -> dict[str, Any]:
        rows.append({"benchmark": f"dra_fleet/{side}/{count}/{phase}", "side": side, "nodes": count,
                     "phase": phase})
        return rows[-1]

    fleet.tracker.start()
    with measured(fleet, publishers, start := row("start"), count), profiled(fleet, start, profile, publishers.pids):
        started = time.monotonic()
        publishers.request(cmd="start", driver=DRA_DRIVER, nodes=nodes, devices=devices[0])
        start["until_right_s"] = round(time.monotonic() - started + fleet.tracker.await_right(names, devices[0]), 2)
    with measured(fleet, publishers, row("rest"), count):
        time.sleep(rest)  # the quiet being measured
    with measured(fleet, publishers, change := row("change"), count), profiled(fleet, change, profile, publishers.pids):
        started = time.monotonic()
        publishers.request(cmd="update", devices=devices[1])
        change["until_right_s"] = round(time.monotonic() - started + fleet.tracker.await_right(names, devices[1]),
                                        2)
    restart = row("restart")
    fleet.tracker.stop()
    fleet.server.restart()  # graceful: kube-apiserver's own shutdown, then the same port and data again
    fleet.reconnect()
    cpu = fleet.cpu()  # the new process's, from the moment it is ready; its request counters start at zero
    started = time.monotonic()
    fleet.tracker.start()
    fleet.tracker.await_right(names, devices[1])
    _await(lambda: fleet.watches() >= count, CONVERGE_TIMEOUT, "every node's watch back")
    restart["until_right_s"] = round(time.monotonic() - started, 2)
    time.sleep(SETTLE_SECONDS)  # what the fleet still does once it is back is part of the restart's cost
    restart["requests"] = {verb: int(n) for verb, n in sorted(fleet.counts().items()) if int(n)}
    restart["apiserver_cpu_s"] = round(fleet.cpu() - cpu, 2)
    fleet.tracker.stop()
    with contextlib.suppress(Exception):
        restart.update(publishers.request(cmd="stats"))
    rows.append({"benchmark": f"dra_fleet/{side}/{count}/publishers", "side": side, "nodes": count,
                 "phase": "publishers", "cpu_s": round(publishers.cpu_seconds(), 2),
                 "rss_mib": round(publishers.rss_kb() / 1024, 1)})
    return rows


def build_harness(directory: pathlib.Path) -> pathlib.Path:
    binary = directory / "dra-harness"
    subprocess.run(["nice", "-n", "10", "go", "build", "-buildvcs=false", "-ldflags=-s -w", "-o", str(binary), "."],
                   cwd=HARNESS, check=True)
    return binary


def run(quick: bool, nodes: tuple[int, ...] | None = None, rest: float | None = None,
        harness: pathlib.Path | None = None, sides: tuple[str, ...] = ("go", "python"),
        profile: pathlib.Path | None = None) -> list[dict]:
    from tests.dra.dra_harness import ApiServer

    nodes = nodes or (QUICK_NODES if quick else NODES)
    rest = rest if rest is not None else (QUICK_REST_SECONDS if quick else REST_SECONDS)
    devices = device_lists()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rbln-bench-fleet-") as work:
        work_dir = pathlib.Path(work)
        binary = harness or build_harness(work_dir)
        server = ApiServer(binary, work_dir / "api", "kube-system/rbln-device-plugin",
                           profiling=profile is not None).start()
        fleet = Fleet(server)
        try:
            for count in nodes:
                for side in sides:
                    if side == "go":
                        publishers = Publishers([str(binary), "publishers", f"-kubeconfig={server.admin_kubeconfig}"],
                                                work_dir / f"{side}-{count}.log")
                    else:
                        publishers = Publishers([sys.executable, str(pathlib.Path(__file__).resolve()),
                                                 "--serve-python", server.admin_kubeconfig],
                                                work_dir / f"{side}-{count}.log",
                                                -(-count // PUBLISHERS_PER_PROCESS))
                    try:
                        rows += run_side(side, fleet, publishers, count, rest, devices, profile)
                    finally:
                        fleet.tracker.stop()
                        publishers.stop()
                        fleet.delete_slices()
                    print(json.dumps(rows[-5:]), file=sys.stderr, flush=True)
        finally:
            fleet.client.close()
            server.close()
    return rows + (goal_rows(rows) if len(sides) == 2 else [])


def goal_rows(rows: list[dict]) -> list[dict]:
    """Per fleet size: python's rows against go's (requests beyond the watch, API server CPU, time until
    right), and the at-rest request rate."""
    verdicts = []
    for count in sorted({r["nodes"] for r in rows}):
        for phase in ("start", "rest", "change", "restart"):
            mine = next(r for r in rows if r["nodes"] == count and r["side"] == "python" and r["phase"] == phase)
            theirs = next(r for r in rows if r["nodes"] == count and r["side"] == "go" and r["phase"] == phase)

            def beyond(row: dict) -> int:
                return sum(n for verb, n in row["requests"].items() if verb != "WATCH")

            worse = [name for name, a, b in (
                ("requests", beyond(mine), beyond(theirs)),
                ("apiserver_cpu_s", mine["apiserver_cpu_s"], theirs["apiserver_cpu_s"] * 1.2 + 0.5),
                ("until_right_s", mine.get("until_right_s", 0), theirs.get("until_right_s", 0) + 1.0)) if a > b]
            verdict: dict[str, Any] = {"benchmark": f"dra_fleet/{count}/{phase}",
                                       "goal": "no worse than the Go controller",
                       "met": not worse, "worse": worse}
            if phase == "rest":
                verdict["goal"] += "; <= 1 request per node-hour beyond the watch"
                verdict["met"] = verdict["met"] and mine["per_node_hour_beyond_watch"] <= 1
            verdicts.append(verdict)
    return verdicts


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-python":
        serve_python(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"fleets of {QUICK_NODES} nodes, {QUICK_REST_SECONDS:g} s at rest")
    parser.add_argument("--nodes", type=int, nargs="+", help=f"fleet sizes (default {NODES})")
    parser.add_argument("--rest", type=float, help=f"seconds at rest (default {REST_SECONDS:g})")
    parser.add_argument("--harness", type=pathlib.Path, help="a built dra-harness binary")
    parser.add_argument("--profile", type=pathlib.Path,
                        help="a directory: the API server's CPU profiles of the start and change rows, and the "
                             "publishers' connections")
    parser.add_argument("--sides", nargs="+", choices=("go", "python"), default=("go", "python"),
                        help="which publishers (default both; the goals need both)")
    args = parser.parse_args()
    for row in run(args.quick, tuple(args.nodes) if args.nodes else None, args.rest, args.harness,
                   tuple(args.sides), args.profile):
        print(json.dumps(row))


if __name__ == "__main__":
    threading.stack_size(256 * 1024)  # thousands of publisher threads: their stacks need not be 8 MiB each
    main()
