"""The scanner's CDI check at every scan: what it costs while the spec dirs stay as they are, and when a spec
changes.

    python bench/cdi_check.py [--quick]

Runs scanner.cdi_watch.CdiWatch.check in this process, as the scan loop does, on two spec dirs: the CDI root
with the RBLN container toolkit's spec (YAML) and a static dir with 8 other vendors' specs (JSON).
- steady: a check when nothing changed since the last one (a stat of each dir and each file; the cached
  verdict), the state of almost every scan. The files' times are long past, as on a node.
- changed: a check right after the toolkit's spec was rewritten (its parse, YAML through libyaml, and the
  verdict anew).
Both as CPU of the checking thread (time.thread_time()). Goal: steady own CPU p99 <= 1 ms per scan.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from loguru import logger

from bench import common
from scanner.cdi_watch import CdiWatch
from shared.cdi.annotation import CdiAnnotation

CHECKS = 2000
QUICK_CHECKS = 200
STEADY_GOAL_MS = 1.0
TOOLKIT_SPEC = """---
cdiVersion: 0.5.0
kind: rebellions.ai/npu
containerEdits:
  env: [RBLN_VISIBLE_DEVICES=all]
  hooks:
  - {hookName: createContainer, path: /usr/local/bin/rbln-cdi-hook, args: [rbln-cdi-hook, update-ldcache]}
devices:
- name: runtime
  containerEdits:
    mounts:
""" + "".join(f"    - {{hostPath: /usr/lib/librbln-{i}.so, containerPath: /usr/lib/librbln-{i}.so, "
              f"options: [ro, nosuid, nodev, bind]}}\n" for i in range(20))


def _timed(work) -> float:
    started = time.thread_time()
    work()
    return (time.thread_time() - started) * 1000


def measure(checks: int) -> list[dict]:
    logger.remove()  # the verdict records are not what is measured
    with tempfile.TemporaryDirectory(prefix="rbln-bench-cdi-") as root:
        cdi_root, static = pathlib.Path(root, "cdi"), pathlib.Path(root, "etc-cdi")
        cdi_root.mkdir()
        static.mkdir()
        spec = cdi_root / "rbln.yaml"
        spec.write_text(TOOLKIT_SPEC)
        for index in range(8):
            (static / f"vendor{index}.json").write_text(json.dumps({
                "cdiVersion": "0.6.0", "kind": f"vendor{index}.example.com/dev",
                "devices": [{"name": f"d{n}", "containerEdits": {"env": [f"V={n}"]}} for n in range(4)]}))
        long_ago = time.time() - 3600
        for path in (spec, *static.iterdir(), cdi_root, static):
            os.utime(path, (long_ago, long_ago))
        # Files changed less than a second ago are read again (their times cannot tell two changes within
        # one tick apart); the inode times of these were just set, so the check's clock runs ahead.
        watch = CdiWatch([cdi_root, static], CdiAnnotation.ALWAYS, clock=lambda: time.time_ns() + 5 * 10**9)
        assert watch.check().resolvable
        steady = [_timed(watch.check) for _ in range(checks)]
        changed = []
        for index in range(max(1, checks // 20)):
            spec.write_text(TOOLKIT_SPEC.replace("RBLN_VISIBLE_DEVICES=all", f"RBLN_VISIBLE_DEVICES={index}"))
            changed.append(_timed(watch.check))
    steady_p99 = common.percentile(steady, 0.99)
    return [
        {"benchmark": "cdi-check/steady", "checks": checks, **common.spread(steady),
         "goal": f"own CPU p99 <= {STEADY_GOAL_MS:g} ms per scan", "met": steady_p99 <= STEADY_GOAL_MS},
        {"benchmark": "cdi-check/changed", "checks": len(changed), **common.spread(changed), "goal": "", "met": None},
    ]


def run(quick: bool) -> list[dict]:
    return measure(QUICK_CHECKS if quick else CHECKS)


if __name__ == "__main__":
    common.script_main(__doc__, run, f"{QUICK_CHECKS} checks instead of {CHECKS}")
