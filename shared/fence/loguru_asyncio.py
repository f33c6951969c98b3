"""loguru's two asyncio hooks, with asyncio imported only when a coroutine sink first needs it.

loguru imports its module `loguru._asyncio_loop` unconditionally, and that module imports asyncio, which
brings ssl, subprocess and concurrent.futures with it. loguru calls the module's two functions only for
coroutine sinks, and the stack adds none; a process that loads grpc (a worker, worker-dra, the watchdog)
gets asyncio from grpc anyway, but the scanner needs none of it. `install` puts this module in loguru's
module's place before loguru is imported; the scanner's entry (scanner/__main__.py) is its one user.

What it buys, measured for issue 36 (2-core machine, Python 3.11, loguru 0.7.3): the scanner's Rss is
23.9 MiB with it and 29.2 MiB without (5.2 MiB of the tree's Rss, over the 3 MiB that keeps a workaround),
and asyncio's import costs the scanner 17-20 ms of its start (`-X importtime`), which is on the way to a
worker's first Register: the scanner's first scan starts the worker.

`importlib.util.LazyLoader` cannot do this job: loguru's module reads `asyncio.get_running_loop` while it is
imported, which would load a lazy asyncio at once.

It stands in only for the module it was written against, recognised by its source's length and CRC-32 (hashlib would
load OpenSSL's libcrypto, some 3 MiB of Rss, into processes that need none of it): another
loguru keeps its own module (and asyncio), and tests/unit/test_loguru_asyncio.py fails, so that whoever
upgrades loguru looks at the new module before adding its (length, CRC-32) here.

What it buys, measured on the stack as a node runs it (bench/stack_lifecycle.py --quick, 8-PF node, two runs
with it and two with `install` finding no known source; a 2-core machine shared with other work, so the start
times are too noisy to tell and the memory is the figure): the stack's Rss 186.9 -> 204.1 MiB and Pss
107-110 -> 118.5-120.9 MiB without it; the scanner and each worker without devices 5.5-5.8 MiB Rss (2.7-3.3 MiB
Pss) more; worker-npu and the watchdog, which load grpc (and so asyncio) anyway, the same. One process importing
loguru: 48.6 ms of CPU and 17.2 MiB Rss with it, 62.7 ms and 22.7 MiB without (median of 15).
Checked against loguru 0.7.3 (`CHECKED_AGAINST`, pinned exactly in pyproject.toml and the lock).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import zlib
from typing import Any

# The version whose internals this module was written against (shared/fence/__init__.py).
CHECKED_AGAINST = ("loguru", "0.7.3")
LOGURU_MODULE = "loguru._asyncio_loop"
# loguru/_asyncio_loop.py of loguru 0.7.3 (deploy/container/requirements.lock).
KNOWN_SOURCES = frozenset({(597, 2618393815)})


def get_task_loop(task: Any) -> Any:
    return task.get_loop()


def get_running_loop() -> Any:
    """The running event loop; RuntimeError when there is none, as asyncio's own function says."""
    import asyncio

    return asyncio.get_running_loop()


def _loguru_source() -> bytes | None:
    """The source of the `loguru._asyncio_loop` that `import loguru` would load (found as the import finds it)."""
    spec = importlib.util.find_spec("loguru")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        return (pathlib.Path(spec.submodule_search_locations[0]) / "_asyncio_loop.py").read_bytes()
    except OSError:
        return None


def install() -> bool:
    """Stand in for loguru's asyncio module if loguru is not imported yet and is the one this module knows;
    True if this module is (now) the one loguru uses. Called by a program's entry before any other import."""
    if "loguru" in sys.modules or LOGURU_MODULE in sys.modules:
        return sys.modules.get(LOGURU_MODULE) is sys.modules[__name__]
    source = _loguru_source()
    if source is None or (len(source), zlib.crc32(source)) not in KNOWN_SOURCES:
        return False
    sys.modules[LOGURU_MODULE] = sys.modules[__name__]
    return True
