"""A scenario's directory (node, stack and harness logs) kept when the scenario fails and named in the run's
summary: the conformance and DRA suites' hooks. A suite's conftest imports the two hooks and calls
`start_keeping` from its pytest_configure."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

KEPT = pytest.StashKey[list]()  # the config's: node dirs of failed scenarios
FAILED = pytest.StashKey[bool]()  # an item's: a phase of it failed


def start_keeping(config: pytest.Config) -> None:
    config.stash[KEPT] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for path in config.stash[KEPT]:
        terminalreporter.write_line(f"kept for a failed scenario (node, stack and kubelet logs): {path}")


@contextlib.contextmanager
def scenario_dir(request: pytest.FixtureRequest, prefix: str,
                 on_failure: Callable[[pathlib.Path], object] = lambda root: None) -> Iterator[pathlib.Path]:
    """A fresh directory under /tmp; once the scenario is over, removed, or (after `on_failure` added to it)
    kept when a phase of the scenario failed."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    yield root
    if request.node.stash.get(FAILED, False):
        on_failure(root)
        request.config.stash[KEPT].append(root)
    else:
        shutil.rmtree(root, ignore_errors=True)
