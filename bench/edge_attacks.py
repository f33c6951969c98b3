"""The probe and the scrape while a neighbour on the pod network attacks the watchdog's ports.

    python bench/edge_attacks.py [--quick]

The stack runs on the 64-device node with the health service and /metrics on (free ports). For each
attack (tests/support/hostile_tcp.py, tests/support/hostile_http2.py), run for 30 s (8 s quick) against the running
stack, a kubelet-like probe (a new connection, one `Check` of `liveness` with a 1 s deadline) is made
every 100 ms and a well-behaved scrape every 500 ms (5 s timeout). The attack runs in a process of its
own, as a neighbour's would:

- `edge/none`: no attack, for comparison.
- `edge/idle-tcp`: 1,000 TCP connections to the health port that never send a byte (200 quick),
  each opened again as soon as the server drops it.
- `edge/h2-streams`: 200 HTTP/2 streams (50 connections x 4) whose request never comes, on a
  flow-control window of zero, reopened when dropped.
- `edge/slowloris`: 50 clients on the metrics port sending a request one byte every 2 s.
- `edge/scrape-flood`: 4 clients scraping back to back.

Figures: `p50/p99/max ms` of the probes (a failed probe counts as the time it took to fail),
`probes_ok` of `probes`, `scrapes_ok` of `scrapes`, and what the attack did (`attack_opened`:
connections opened, reopened ones included). Goal: probe p99 <= 50 ms, every probe and scrape answered.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import pathlib
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import common
from shared.observability.metrics import PATH
from tests.support.hostile_http2 import CHECK_WITHOUT_REQUEST, ZeroWindowAttack
from tests.support.hostile_tcp import IdleConnections, ScrapeFlood, Slowloris

FULL_SECONDS, QUICK_SECONDS = 30.0, 8.0
PROBE_EVERY, SCRAPE_EVERY = 0.1, 0.5
PROBE_DEADLINE, SCRAPE_TIMEOUT = 1.0, 5.0
GOAL_MS = 50.0


def probe(port: int) -> tuple[float, bool]:
    """One probe as the kubelet makes it: milliseconds it took, and whether it said SERVING."""
    started = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="liveness"),
                                                               timeout=PROBE_DEADLINE)
            ok = answer.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            ok = False
    return (time.monotonic() - started) * 1000, ok


def scrape(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as answer:
            return answer.status == 200 and bool(answer.read())
    except OSError:
        return False


def _every(interval: float, seconds: float, action: Callable[[], object]) -> list:
    """`action`'s results, called every `interval` seconds (or back to back when it is slower) for `seconds`."""
    results = []
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        results.append(action())
        time.sleep(max(0.0, now + interval - time.monotonic()))
    return results


def _attack_in_child(make_attack: Callable[[], Any], stop, reports) -> None:
    with make_attack() as attack:
        stop.wait()
        reports.send(getattr(attack, "snapshot", lambda: None)())


@contextlib.contextmanager
def attacking(make_attack: Callable[[], Any]) -> Iterator[Callable[[], Any]]:
    """The attack `make_attack` makes, run in a process of its own (its threads must not take this
    process's interpreter from the probes) until the end of the block; yields what returns its report."""
    # Spawned, not forked: this process has gRPC's threads running.
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_attack_in_child, args=(make_attack, stop, sender), daemon=True)
    child.start()
    report: list[Any] = []

    def finish() -> Any:
        stop.set()
        report.append(receiver.recv() if receiver.poll(20) else None)
        return report[0]

    try:
        yield finish
    finally:
        if not report:
            finish()
        child.join(20)


def measure(name: str, make_attack: Callable[[], Any], seconds: float, health_port: int, url: str) -> dict:
    scrapes: list[bool] = []
    scraper = threading.Thread(target=lambda: scrapes.extend(_every(SCRAPE_EVERY, seconds, lambda: scrape(url))),
                               daemon=True)
    with attacking(make_attack) as finish:
        time.sleep(1.0)  # the attack in place before the first probe
        scraper.start()
        probes = _every(PROBE_EVERY, seconds, lambda: probe(health_port))
        scraper.join()
        report = finish()
    latencies = [ms for ms, _ in probes]
    spread = common.spread(latencies)
    ok = sum(1 for _, answered in probes if answered)
    row = {"benchmark": f"edge/{name}", **spread, "probes": len(probes), "probes_ok": ok,
           "scrapes": len(scrapes), "scrapes_ok": sum(scrapes), "seconds": seconds,
           "goal": f"probe p99 <= {GOAL_MS:g} ms, all answered",
           "met": spread["p99_ms"] <= GOAL_MS and ok == len(probes) and all(scrapes)}
    opened = getattr(report, "opened", getattr(report, "connections", None))
    if opened is not None:
        row["attack_opened"] = opened
    return row


def run(quick: bool) -> list[dict]:
    seconds = QUICK_SECONDS if quick else FULL_SECONDS
    idle = 200 if quick else 1000
    rows = []
    with common.temporary_node(common.vf64_spec()) as node, \
            common.running_stack(node, "5s", HEALTHCHECK_PORT=str(common.free_port()),
                                 METRICS_PORT=str(common.free_port())) as (_kubelet, stack):
        health_port = stack.wait_for_record("Health service listening")[0]["port"]
        metrics_port = stack.wait_for_record("Metrics endpoint listening")[0]["port"]
        url = f"http://127.0.0.1:{metrics_port}{PATH}"
        # Live once supervisord counts every program RUNNING (a second after its start).
        deadline = time.monotonic() + 30
        while not probe(health_port)[1]:
            if time.monotonic() > deadline:
                raise TimeoutError("liveness never became SERVING")
            time.sleep(0.2)
        attacks: tuple[tuple[str, Callable[[], Any]], ...] = (
            ("none", contextlib.nullcontext),
            ("idle-tcp", functools.partial(IdleConnections, health_port, idle)),
            ("h2-streams", functools.partial(ZeroWindowAttack, health_port, connections=50,
                                             streams=(CHECK_WITHOUT_REQUEST,) * 4)),
            ("slowloris", functools.partial(Slowloris, metrics_port, 50)),
            ("scrape-flood", functools.partial(ScrapeFlood, url, 4)))
        for name, make_attack in attacks:
            rows.append(measure(name, make_attack, seconds, health_port, url))
            print(f"bench: edge/{name} done", file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    common.script_main(__doc__, run, f"{QUICK_SECONDS:g} s per attack and 200 idle connections")
