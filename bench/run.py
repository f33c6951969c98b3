"""Run every benchmark and print one table (also written to bench/results/latest.json).

    python bench/run.py [--quick] [--only NAME ...]

Each benchmark is a module of this folder exposing `run(quick: bool) -> list[dict]`;
a row has a "benchmark" name, figures (`p50_ms`, `p99_ms`, `max_ms`, others), and
optionally a "goal" text and whether it was "met" (True, False, or None: undecided).
A module not written yet is reported as missing; one that raises as failed; neither
stops the others. Timing never changes the exit status: it is 0 unless the command
line is wrong. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import pathlib
import sys
import time
import traceback

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common

BENCHMARKS = ("placement_bench", "scan_cost", "allocate_latency", "health_propagation", "reregistration",
              "idle_cost", "scrape_cost", "edge_attacks", "soak", "cdi_check", "dra", "stack_lifecycle")
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "latest.json"
_COLUMNS = (("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("max_ms", "max ms"))
_NOT_FIGURES = {"benchmark", "goal", "met", *(key for key, _ in _COLUMNS)}
_MET = {True: "yes", False: "NO", None: "?"}
_MAX_ERROR = 300


def run_benchmark(name: str, quick: bool) -> dict:
    """{"name", "status": ok | missing | failed, "seconds", "rows", "error"} for one module."""
    started = time.monotonic()
    outcome: dict = {"name": name, "status": "ok", "rows": [], "error": None}
    if importlib.util.find_spec(f"bench.{name}") is None:
        outcome.update(status="missing", error=f"bench/{name}.py does not exist yet")
    else:
        try:
            rows = importlib.import_module(f"bench.{name}").run(quick)
            if not isinstance(rows, list) or not all(isinstance(r, dict) and "benchmark" in r for r in rows):
                raise TypeError("run() must return a list of dicts, each with a 'benchmark' key")
            outcome["rows"] = rows
        except (Exception, SystemExit) as exc:  # one benchmark's failure must not stop the others
            traceback.print_exc(file=sys.stderr)
            outcome.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:_MAX_ERROR])
    outcome["seconds"] = round(time.monotonic() - started, 1)
    return outcome


def _figure(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def table(outcomes: list[dict]) -> str:
    lines = []
    for outcome in outcomes:
        if outcome["status"] != "ok":
            lines.append([outcome["name"], "", "", "", "", "", f"{outcome['status']}: {outcome['error']}"])
        for row in outcome["rows"]:
            figures = "  ".join(f"{key}={_figure(value)}" for key, value in row.items() if key not in _NOT_FIGURES)
            lines.append([str(row["benchmark"]), *(_figure(row.get(key, "")) for key, _ in _COLUMNS),
                          str(row.get("goal", "")), _MET[row["met"]] if "met" in row else "", figures])
    header = ["benchmark", *(title for _, title in _COLUMNS), "goal", "met", "figures"]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header) - 1)]
    rendered = []
    for line in [header, *lines]:
        # Every column but the last (the figures) is padded: `widths` has one entry fewer than a line.
        cells = [cell.rjust(width) if 1 <= i <= 3 else cell.ljust(width)
                 for i, (cell, width) in enumerate(zip(line, widths, strict=False))]
        rendered.append("  ".join([*cells, line[-1]]).rstrip())
    return "\n".join(rendered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short mode CI runs (fewer calls, shorter windows)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, metavar="NAME",
                        help=f"run only these, of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    names = [name for name in BENCHMARKS if not args.only or name in args.only]

    machine = common.machine()
    started = datetime.datetime.now(datetime.timezone.utc)
    outcomes = []
    for name in names:
        print(f"bench: running {name} ...", file=sys.stderr, flush=True)
        outcomes.append(run_benchmark(name, args.quick))
        print(f"bench: {name} {outcomes[-1]['status']} in {outcomes[-1]['seconds']} s", file=sys.stderr, flush=True)

    print(f"Machine: {machine['nproc']} CPUs, {machine['cpu']}, Python {machine['python']}, "
          f"Linux {machine['kernel']}; load {machine['load_1m']} at start; mode: {'quick' if args.quick else 'full'}")
    print(table(outcomes))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": machine, "quick": args.quick, "started": started.isoformat(),
                                   "benchmarks": outcomes}, indent=1, default=str) + "\n")
    print(f"Results written to {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
