"""The NFD checks run only from tests/nfd/run.sh, which builds NFD's programs and names them."""

import os

import pytest

from tests.support.fixtures import short_tmp  # noqa: F401

REQUIRED = ("NFD_WORKER", "NFD_RULES", "NFD_CRDS")


def pytest_configure(config: pytest.Config) -> None:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        raise pytest.UsageError(f"{', '.join(missing)} not set: run the NFD checks with tests/nfd/run.sh, "
                                "which builds nfd-worker and nfd-rules")
