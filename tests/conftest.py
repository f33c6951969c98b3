import os

import pytest

from tests.support.fixtures import short_tmp  # noqa: F401
from tests.support.suites import OWN_RUNNERS, SUITES, suite_of

# The conformance scenarios drive the stack with the real kubelet's device manager: they need root and
# a Go build, so tests/conformance/run.sh runs them with their own configuration, never this run.
# tests/nfd and tests/cdi likewise: their run.sh builds real NFD programs and the CDI reference library's checker.
# tests/dra likewise: its run.sh builds kube-apiserver, etcd and the kubelet's DRA manager.
collect_ignore = list(OWN_RUNNERS)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test with its suite (by directory, before -m selects): `-m unit` runs the unit tests alone."""
    suite = suite_of(item.path)
    if suite is None:
        return
    if suite not in SUITES:
        raise pytest.UsageError(f"{item.nodeid}: tests/{suite} is not a suite of tests/support/suites.py; "
                                "add it there and its marker to pyproject.toml")
    item.add_marker(suite)


# CI runs the same examples every time, so a landing never depends on luck; local runs keep exploring.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
