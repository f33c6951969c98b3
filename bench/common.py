"""Shared helpers of the bench scripts: the benchmark node, a running stack, percentiles, /proc readers.

Every benchmark runs on a simulated node (simulator/) through the kubelet simulator, with
the real `rbln-device-plugin run` stack (supervisord and all its programs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from rbln_device_plugin.simulate import expected_resources  # noqa: E402
from shared.resources import Resource  # noqa: E402
from simulator.kubelet import KubeletSimulator  # noqa: E402
from simulator.node import SimulatedNode, build_node  # noqa: E402
from simulator.spec import NodeSpec  # noqa: E402
from simulator.stack import StackProcess  # noqa: E402

START_TIMEOUT = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
VF64_RESOURCE = Resource.NPU_VF4.value


def vf64_spec() -> NodeSpec:
    """The issue's 64-device node: 16 PFs in vf4 mode over 2 NUMA nodes and 4 PCIe switches
    (rbln-smi lists 80 entries: the 16 PFs that host VFs, and their 64 VFs)."""
    return NodeSpec.uniform(16, "vf4", numa_nodes=2, switches=4)


# Figures


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest sample with at least `fraction` of the samples at or below it."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def spread(samples: Sequence[float], prefix: str = "") -> dict[str, float]:
    """p50, p99 and max of millisecond samples, as `<prefix>p50_ms` etc., rounded to microseconds."""
    return {f"{prefix}p50_ms": round(percentile(samples, 0.50), 3),
            f"{prefix}p99_ms": round(percentile(samples, 0.99), 3),
            f"{prefix}max_ms": round(max(samples), 3)}


def machine() -> dict[str, str | int]:
    """What the figures were measured on."""
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count() or 0, "cpu": model, "python": platform.python_version(),
            "kernel": platform.release(), "load_1m": round(os.getloadavg()[0], 2)}


def script_main(doc: str, run: Callable[[bool], list[dict]], quick_help: str) -> None:
    """The command line of a benchmark script run alone: `--quick`, then its rows, one JSON object a line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    for row in run(parser.parse_args().quick):
        print(json.dumps(row))


# A node and a running stack


@contextlib.contextmanager
def temporary_node(spec: NodeSpec) -> Iterator[SimulatedNode]:
    # A short path under /tmp: unix socket paths must stay under ~107 characters.
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-bench-", dir="/tmp"))
    try:
        yield build_node(root, spec)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def stack_environment(node: SimulatedNode, scan_interval: str, **env: str) -> dict[str, str]:
    """The stack's environment on `node`; the source tree is importable whatever the current directory."""
    environ = {**os.environ, **node.env(scan_interval), **env}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    return environ


@contextlib.contextmanager
def running_stack(node: SimulatedNode, scan_interval: str, **env: str) -> Iterator[tuple[KubeletSimulator,
                                                                                          StackProcess]]:
    """The kubelet simulator and the stack on `node`, once every resource of the node is registered
    with all its devices; both are stopped on exit."""
    expected = expected_resources(node)
    with KubeletSimulator(node.plugin_dir) as kubelet, \
            StackProcess(stack_environment(node, scan_interval, **env)) as stack:
        kubelet.wait_for(lambda k: all(name in k.resources() and k.resources()[name].connected
                                       and sorted(k.resources()[name].devices) == sorted(ids)
                                       for name, ids in expected.items()),
                         START_TIMEOUT, f"registration of {', '.join(sorted(expected))}")
        yield kubelet, stack


def free_port() -> int:
    """A TCP port nothing listens on now, for a stack that must keep one port across restarts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# /proc readers


@dataclasses.dataclass(frozen=True)
class CpuTimes:
    """Clock ticks from /proc/<pid>/stat: the process's own, and its reaped children's."""

    utime: int
    stime: int
    cutime: int
    cstime: int

    @property
    def own(self) -> int:
        return self.utime + self.stime

    @property
    def children(self) -> int:
        return self.cutime + self.cstime


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces): field 3 (state) first."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        text = handle.read()
    return text[text.rindex(")") + 2:].split()


def cpu_times(pid: int) -> CpuTimes:
    fields = _stat_fields(pid)
    # stat(5): utime, stime, cutime, cstime are fields 14-17; fields[0] is field 3.
    return CpuTimes(*(int(fields[i - 3]) for i in (14, 15, 16, 17)))


def own_cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` (all its threads, those that ended too; not its children) to the nanosecond:
    its CPU clock (clock_getcpuclockid(3)), where /proc/<pid>/stat rounds to clock ticks (10 ms), too coarse
    for an idle process. ProcessLookupError once it is gone."""
    # The kernel's clock id of a process's CPU clock: the pid's complement shifted, CPUCLOCK_SCHED (2).
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError as exc:
        raise ProcessLookupError(pid) from exc


def parent_pid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def start_ticks(pid: int) -> int:
    """When the process was forked, in clock ticks since boot (stat(5) field 22; an exec keeps it)."""
    return int(_stat_fields(pid)[22 - 3])


def stack_processes(supervisord: int) -> list[int]:
    """supervisord and its programs. Tools they run (rbln-smi) are not listed: their CPU is in
    their parent's cutime/cstime once reaped."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if parent_pid(int(entry)) == supervisord:
                    children.append(int(entry))
    return [supervisord, *sorted(children)]


def process_name(pid: int) -> str:
    """The stack's name for a process (supervisord or its program name), else its command line."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    if "supervisor.supervisord" in argv or any(a.endswith("supervisord") for a in argv):
        return "supervisord"
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        module = argv[argv.index("-m") + 1]
        if module == "resource_worker" and "--resource" in argv:
            return Resource(argv[argv.index("--resource") + 1]).process_name
        return {"kubelet_watchdog": "watchdog"}.get(module, module)
    return " ".join(argv)[:60]


@dataclasses.dataclass(frozen=True)
class Memory:
    """Kibibytes from /proc/<pid>/smaps_rollup: resident, proportional (shared pages split among sharers), and
    anonymous (the process's own: its heap, Python's objects, copied library data; not the libraries' code)."""

    rss_kb: int
    pss_kb: int
    anonymous_kb: int


def memory(pid: int) -> Memory:
    values = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Anonymous"):
                values[key] = int(rest.split()[0])
    return Memory(values["Rss"], values["Pss"], values["Anonymous"])
