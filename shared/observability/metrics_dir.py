"""Where the processes' metric value files are, and their clearing at the stack's start: apart from the
recorder (shared/observability/metrics.py), so that `rbln-device-plugin run`, which only clears them before it
execs supervisord, does not load what recording needs (some 15 ms of its start)."""

from __future__ import annotations

import pathlib
import shutil

from shared.config import RUN_DIR_ENV
from shared.fs.safe_open import ensure_private_dir

METRICS_DIR_NAME = "metrics"


def metrics_dir(run_dir: pathlib.Path) -> pathlib.Path:
    """Where the processes' value files are: inside the private run dir."""
    return run_dir / METRICS_DIR_NAME


def reset_metrics_dir(run_dir: pathlib.Path, enabled: bool) -> None:
    """At the start of the stack: no value file of an earlier run may count again (a container restarted
    in the same pod finds its run dir as it left it)."""
    directory = metrics_dir(run_dir)
    if directory.exists():
        shutil.rmtree(directory)
    if enabled:
        ensure_private_dir(directory, RUN_DIR_ENV)
