"""Fixtures of the CDI reference-library checks: the Go checker (built by tests/cdi/run.sh) and the
integration fixtures that run the real stack on a simulated node with the kubelet simulator."""

from __future__ import annotations

import os

import pytest

from tests.cdi.reference import CHECKER_ENV, ReferenceLibrary
from tests.support.fixtures import kubelet, make_node, node_root, start_stack  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(CHECKER_ENV):
        raise pytest.UsageError(f"{CHECKER_ENV} is not set: run these checks with tests/cdi/run.sh, which builds "
                                "the CDI reference-library checker")


@pytest.fixture(scope="session")
def reference() -> ReferenceLibrary:
    return ReferenceLibrary.from_environ()
