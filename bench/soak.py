"""Soak: the whole stack under steady load and recurring faults, checked for crashes, lost registrations,
wrong allocations, memory growth and broken log lines.

    python bench/soak.py [--minutes N | --quick]

The 30-minute scenario (`--minutes 30`, the default) on a mixed node (4 plain PFs as npu, one PF as
npu-vf1, one as npu-vf4):
- status flapping: three devices (a PF, the vf1 VF, a vf4 VF) toggle between READY and FAULT at
  random, each about once a second;
- ten Allocates a second, from three client threads, for one or two random devices of a random
  resource as the kubelet simulator last saw it (Unhealthy ones included: those must be refused);
- a kubelet restart every two minutes (every third of the run when it is shorter than three minutes);
- a random program of the stack (the scanner, a worker or the watchdog) SIGKILLed every 45 seconds
  (every quarter of the run when it is shorter than three minutes).
`--quick` (`run(quick=True)`, the CI mode) is a one-minute version; `--minutes 3` the short one.

What is reported, and what must hold:
- crashes: programs that exited without being killed by the soak (supervisord's "not expected"
  exits on stderr, less the soak's own kills), and tracebacks on stderr: 0;
- lost registrations: after every kubelet restart and every kill, each resource must be registered
  again with all its devices within 30 s: 0 lost;
- wrong allocations: an Allocate that succeeded for a device whose status file said FAULT for the
  whole of the call (set before it began and not changed until it returned): 0;
- memory: resident set of every process instance (smaps_rollup Rss, sampled every 5 s) after its
  warm-up (30 s; 15 s quick): the median of the last third of its samples against the median of the
  first third (single samples wander by a few percent). An instance with fewer than 45 s of samples
  after its warm-up is counted but not measured (workers killed by the chaos thread start anew).
  Growth must stay under 5 %;
- stdout: every line a complete JSON object with the contract's first keys: 100 %;
- metrics: /metrics (on, as by default) scraped every 2 s as Prometheus would. Every answer must show
  each resource once in `registered` and no more devices than the node has (a killed worker must leave
  no series behind), and the metrics directory must hold, after each scrape, no more value files than
  the running processes write plus the archives (the files of killed ones folded away): 0 wrong
  scrapes. Scrapes that find no watchdog listening (it was just killed) are counted apart.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import signal
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import grpc

from bench import common
from rbln_device_plugin.simulate import expected_resources
from shared.observability.metrics import PATH, metrics_dir
from shared.programs import PROGRAMS
from shared.resources import Resource
from simulator.kubelet import KubeletSimulator
from simulator.node import SimulatedNode
from simulator.spec import NodeSpec

NODE = "4,1:vf1,1:vf4"
FLAPPING = ("rbln1", "rbln4-0", "rbln5-2")
SCAN_INTERVAL = "500ms"
ALLOCATE_RATE = 10.0
ALLOCATE_CLIENTS = 3
REGISTRATION_TIMEOUT = 30.0
MEMORY_SAMPLE_SECONDS = 5.0
MEMORY_GOAL_PCT = 5.0
MEMORY_MIN_SAMPLES = 9  # 45 s of samples after the warm-up: three windows of three
FAULT = 4
SEED = 20261130
SCRAPE_SECONDS = 2.0
# Value files: a counter and a histogram file per process writing them (scanner, three workers, watchdog),
# one archive per kind, and the files of one killed process that is not reaped yet.
MAX_METRICS_FILES = 2 * 5 + 2 + 2


@dataclasses.dataclass(frozen=True)
class Plan:
    minutes: float
    restart_every: float
    kill_every: float
    warm_up: float

    @classmethod
    def for_minutes(cls, minutes: float) -> Plan:
        seconds = minutes * 60
        if seconds >= 180:
            return cls(minutes, restart_every=120.0, kill_every=45.0, warm_up=30.0)
        return cls(minutes, restart_every=seconds / 3, kill_every=seconds / 4, warm_up=15.0)


class StatusFlapper:
    """Toggles the status files of a few devices and remembers every change, with the window it was made in."""

    def __init__(self, node: SimulatedNode, devices: tuple[str, ...], rng: random.Random):
        self._node = node
        self._devices = devices
        self._rng = rng
        # Guards `changes`: read by the allocation checker while the flapper thread appends.
        self._lock = threading.Lock()
        self.changes: dict[str, list[tuple[float, float, int]]] = {d: [(0.0, 0.0, 0)] for d in devices}

    def step(self) -> None:
        device = self._rng.choice(self._devices)
        with self._lock:
            value = FAULT if self.changes[device][-1][2] == 0 else 0
        before = time.monotonic()
        self._node.set_status(device, value)
        with self._lock:
            self.changes[device].append((before, time.monotonic(), value))

    def faulted_throughout(self, device: str, start: float, end: float) -> bool:
        """Whether the device's status file said FAULT from before `start` until after `end`."""
        if device not in self.changes:
            return False
        with self._lock:
            changes = list(self.changes[device])
        settled = [c for c in changes if c[1] <= start]
        during = [c for c in changes if start < c[1] and c[0] < end]
        return bool(settled) and settled[-1][2] != 0 and not during


@dataclasses.dataclass
class Tally:
    """What the clients saw. Guarded by `lock`: the client threads add to it concurrently."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    attempted: int = 0
    allocated: int = 0
    refused_unhealthy: int = 0
    unavailable: int = 0
    other_errors: list[str] = dataclasses.field(default_factory=list)
    wrong: list[str] = dataclasses.field(default_factory=list)
    skipped: int = 0


def _allocate_once(kubelet: KubeletSimulator, flapper: StatusFlapper, tally: Tally, rng: random.Random) -> None:
    views = {name: view for name, view in kubelet.resources().items() if view.connected and view.devices}
    if not views:
        with tally.lock:
            tally.unavailable += 1
        return
    resource = rng.choice(sorted(views))
    devices = sorted(views[resource].devices)
    chosen = rng.sample(devices, min(len(devices), rng.choice((1, 1, 2))))
    start = time.monotonic()
    try:
        kubelet.allocate(resource, [chosen], timeout=60)
        outcome = "allocated"
    except grpc.RpcError as exc:
        outcome = {grpc.StatusCode.FAILED_PRECONDITION: "refused", grpc.StatusCode.UNAVAILABLE: "unavailable",
                   grpc.StatusCode.CANCELLED: "unavailable"}.get(exc.code(), f"{exc.code().name}: {exc.details()}")
    except LookupError:  # the kubelet is restarting: no plugin registered for the resource right now
        outcome = "unavailable"
    end = time.monotonic()
    with tally.lock:
        tally.attempted += 1
        if outcome == "allocated":
            tally.allocated += 1
            tally.wrong += [f"{d} at {start:.3f}" for d in chosen if flapper.faulted_throughout(d, start, end)]
        elif outcome == "refused":
            tally.refused_unhealthy += 1
        elif outcome == "unavailable":
            tally.unavailable += 1
        else:
            tally.other_errors.append(outcome[:200])


class MemoryLog:
    """Rss samples per process instance (name, pid)."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, int], list[tuple[float, int]]] = {}

    def sample(self, root_pid: int) -> None:
        now = time.monotonic()
        for pid in common.stack_processes(root_pid):
            with contextlib.suppress(OSError, KeyError, ValueError):
                name = common.process_name(pid)
                if name in ("supervisord", *PROGRAMS):
                    self.samples.setdefault((name, pid), []).append((now, common.memory(pid).rss_kb))

    def growth(self, warm_up: float, min_samples: int) -> list[dict]:
        """Per process name: instances measured and the largest growth after warm-up.

        A Python process's Rss wanders by a few percent as its allocator takes and returns arenas, so one
        sample against another says little: growth compares the median of the first third of an
        instance's samples after its warm-up with the median of the last third."""
        rows: dict[str, dict] = {}
        for (name, _pid), samples in sorted(self.samples.items()):
            born = samples[0][0]
            warm = [rss for at, rss in samples if at >= born + warm_up]
            row = rows.setdefault(name, {"benchmark": "soak/memory", "process": name, "instances": 0,
                                         "measured": 0, "rss_warm_kb": None, "rss_end_kb": None, "growth_pct": None})
            row["instances"] += 1
            if len(warm) < min_samples:
                continue
            third = len(warm) // 3
            first, last = statistics.median(warm[:third]), statistics.median(warm[-third:])
            pct = round((last - first) * 100 / first, 2)
            row["measured"] += 1
            if row["growth_pct"] is None or pct > row["growth_pct"]:
                row.update(rss_warm_kb=round(first), rss_end_kb=round(last), growth_pct=pct)
        for row in rows.values():
            row["goal"] = f"growth < {MEMORY_GOAL_PCT:g}% after {warm_up:g}s warm-up"
            row["met"] = None if row["growth_pct"] is None else row["growth_pct"] < MEMORY_GOAL_PCT
        return list(rows.values())


def _all_registered(kubelet: KubeletSimulator, expected: dict[str, list[str]], since: dict[str, int]) -> bool:
    views = kubelet.resources()
    return all(name in views and views[name].connected and views[name].updates > 0
               and sorted(views[name].devices) == sorted(ids) and views[name].registrations > since.get(name, 0)
               for name, ids in expected.items())


def _registrations(kubelet: KubeletSimulator) -> dict[str, int]:
    return {name: view.registrations for name, view in kubelet.resources().items()}


def _program_pid(supervisord: int, program: str) -> int | None:
    for pid in common.stack_processes(supervisord)[1:]:
        with contextlib.suppress(OSError):
            if common.process_name(pid) == program:
                return pid
    return None


def _well_formed(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and list(record)[:4] == ["ts", "level", "msg", "process"]


@dataclasses.dataclass
class Chaos:
    """Kubelet restarts and program kills, on their own thread: waiting for re-registration must not
    pause the load. Its counters are read once the thread has ended."""

    supervisord: int
    kubelet: KubeletSimulator
    expected: dict[str, list[str]]
    plan: Plan
    rng: random.Random
    restarts: int = 0
    kills: int = 0
    lost: list[str] = dataclasses.field(default_factory=list)
    """What did not come back, with the kubelet's view at the time."""

    def run(self, deadline: float, stop: threading.Event) -> None:
        started = time.monotonic()
        next_restart, next_kill = started + self.plan.restart_every, started + self.plan.kill_every * 0.75
        while not stop.wait(max(0.0, min(next_restart, next_kill) - time.monotonic())):
            if time.monotonic() >= deadline:
                return
            if time.monotonic() >= next_restart:
                since = _registrations(self.kubelet)
                self.kubelet.restart()
                self.restarts += 1
                self._await(since, "kubelet restart")
                next_restart = time.monotonic() + self.plan.restart_every
            if time.monotonic() >= next_kill:
                program = self.rng.choice(PROGRAMS)
                pid = _program_pid(self.supervisord, program)
                # Only the killed worker registers again; the other programs' deaths must not unregister anything.
                since = {name: count for name, count in _registrations(self.kubelet).items()
                         if Resource(name).process_name == program}
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        self.kills += 1
                    self._await(since, f"{program} killed")
                next_kill = time.monotonic() + self.plan.kill_every

    def _await(self, since: dict[str, int], after: str) -> None:
        try:
            self.kubelet.wait_for(lambda k: _all_registered(k, self.expected, since), REGISTRATION_TIMEOUT,
                                  "re-registration")
        except TimeoutError as exc:
            self.lost.append(f"after {after}: {exc}")


class Scraper:
    """Scrapes /metrics every SCRAPE_SECONDS and checks each answer against the node."""

    def __init__(self, port: int, node: SimulatedNode):
        self._url = f"http://127.0.0.1:{port}{PATH}"
        self._node = node
        self._devices = {name: len(ids) for name, ids in expected_resources(node).items()}
        self.scrapes = self.unavailable = self.max_files = 0
        self.wrong: list[str] = []

    def run(self, deadline: float, stop: threading.Event) -> None:
        while not stop.wait(SCRAPE_SECONDS) and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self._url, timeout=5) as answer:
                    text = answer.read().decode()
            except OSError:
                self.unavailable += 1
                continue
            self.scrapes += 1
            files = len(list(metrics_dir(self._node.run_dir).glob("*.db")))
            self.max_files = max(self.max_files, files)
            if files > MAX_METRICS_FILES:
                self.wrong.append(f"{files} value files after a scrape")
            for resource, count in self._devices.items():
                registered = text.count(f'rbln_device_plugin_registered{{resource="{resource}"}}')
                devices = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith("rbln_device_plugin_devices{") and f'"{resource}"' in line)
                if registered != 1 or devices > count:
                    self.wrong.append(f"{resource}: {registered} registered series, {devices:g} devices of {count}")


def _summary(plan: Plan, elapsed: float, tally: Tally, flapper: StatusFlapper, chaos: Chaos, scraper: Scraper,
             lines: list[str], well_formed: int, crashes: int, memory_rows: list[dict]) -> dict:
    growths = [row["growth_pct"] for row in memory_rows if row["growth_pct"] is not None]
    summary = {
        "benchmark": "soak",
        "minutes": plan.minutes,
        "allocates": tally.attempted,
        "allocates_per_s": round(tally.attempted / elapsed, 2),
        "allocated": tally.allocated,
        "refused_unhealthy": tally.refused_unhealthy,
        "unavailable": tally.unavailable,
        "skipped_client_busy": tally.skipped,
        "other_errors": len(tally.other_errors),
        "wrong_allocations": len(tally.wrong),
        "status_flips": sum(len(c) - 1 for c in flapper.changes.values()),
        "kubelet_restarts": chaos.restarts,
        "kills": chaos.kills,
        "lost_registrations": len(chaos.lost),
        "crashes": crashes,
        "stdout_lines": len(lines),
        "json_lines_pct": round(100.0 * well_formed / len(lines), 3) if lines else 0.0,
        "max_rss_growth_pct": max(growths) if growths else None,
        "scrapes": scraper.scrapes,
        "scrapes_unanswered": scraper.unavailable,
        "wrong_scrapes": len(scraper.wrong),
        "metrics_files_max": scraper.max_files,
        "goal": "0 crashes, 0 lost registrations, 0 wrong allocations or scrapes, 100% JSON lines, RSS growth < 5%",
    }
    summary["met"] = (crashes == 0 and not chaos.lost and not tally.wrong and not tally.other_errors
                      and not scraper.wrong and scraper.scrapes > 0 and summary["json_lines_pct"] == 100.0
                      and all(row["met"] is not False for row in memory_rows))
    return summary


def _drive(deadline: float, rng: random.Random, pid: int, kubelet, flapper: StatusFlapper, tally: Tally,
           memory: MemoryLog) -> None:
    """Until `deadline`: memory sampled, device status flapped and Allocate called, each at its pace."""
    clients = ThreadPoolExecutor(ALLOCATE_CLIENTS, thread_name_prefix="soak-client")
    pending: list = []
    next_flap = next_allocate = next_sample = time.monotonic()
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_sample:
                memory.sample(pid)
                next_sample = now + MEMORY_SAMPLE_SECONDS
            if now >= next_flap:
                flapper.step()
                next_flap = now + rng.uniform(0.5, 1.5) / len(FLAPPING)
            if now >= next_allocate:
                pending = [f for f in pending if not f.done()]
                if len(pending) < ALLOCATE_CLIENTS:
                    pending.append(clients.submit(_allocate_once, kubelet, flapper, tally,
                                                  random.Random(rng.random())))
                else:
                    tally.skipped += 1
                next_allocate += 1 / ALLOCATE_RATE
            time.sleep(max(0.0, min(next_flap, next_allocate, next_sample) - time.monotonic()))
    finally:
        clients.shutdown(wait=True)


def soak(plan: Plan) -> list[dict]:
    rng = random.Random(SEED)
    # A fixed port, as on a node: each watchdog that replaces a killed one listens on it again.
    port = common.free_port()
    with common.temporary_node(NodeSpec.parse(NODE)) as node, \
            common.running_stack(node, SCAN_INTERVAL, METRICS_PORT=str(port)) as (kubelet, stack):
        flapper = StatusFlapper(node, FLAPPING, random.Random(rng.random()))
        tally, memory = Tally(), MemoryLog()
        chaos = Chaos(stack.pid, kubelet, expected_resources(node), plan, random.Random(rng.random()))
        started = time.monotonic()
        deadline = started + plan.minutes * 60
        stop = threading.Event()
        chaos_thread = threading.Thread(target=chaos.run, args=(deadline, stop), name="soak-chaos")
        chaos_thread.start()
        scraper = Scraper(port, node)
        scraper_thread = threading.Thread(target=scraper.run, args=(deadline, stop), name="soak-scraper")
        scraper_thread.start()
        try:
            _drive(deadline, rng, stack.pid, kubelet, flapper, tally, memory)
        finally:
            stop.set()
            chaos_thread.join()
            scraper_thread.join()
        elapsed = time.monotonic() - started
        memory.sample(stack.pid)
        stack.stop()
        unexpected = [line for line in stack.stderr_lines if "not expected" in line and "exited:" in line]
        tracebacks = [line for line in stack.stderr_lines if line.startswith("Traceback")]
        lines = list(stack.raw_lines)
        well_formed = sum(_well_formed(line) for line in lines)
    memory_rows = memory.growth(plan.warm_up, MEMORY_MIN_SAMPLES)
    crashes = max(0, len(unexpected) - chaos.kills) + len(tracebacks)
    summary = _summary(plan, elapsed, tally, flapper, chaos, scraper, lines, well_formed, crashes, memory_rows)
    details = [{"benchmark": "soak/errors", "other_errors": tally.other_errors[:5], "wrong": tally.wrong[:5],
                "lost": chaos.lost[:5], "unexpected_exits": unexpected[:5], "tracebacks": len(tracebacks),
                "wrong_scrapes": scraper.wrong[:5]}] if (
        tally.other_errors or tally.wrong or chaos.lost or crashes or scraper.wrong) else []
    return [summary, *memory_rows, *details]


def run(quick: bool) -> list[dict]:
    return soak(Plan.for_minutes(1 if quick else 30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--minutes", type=float, default=30.0, help="length of the run (default 30; 3 is the short one)")
    group.add_argument("--quick", action="store_true", help="the one-minute CI version")
    args = parser.parse_args()
    for row in soak(Plan.for_minutes(1 if args.quick else args.minutes)):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
