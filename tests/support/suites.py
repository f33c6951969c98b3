"""The suites under tests/ and how each runs. The default run (`python -m pytest`) collects the suites of
SUITES and marks each test with its directory's name, so that one suite runs alone (`python -m pytest -m unit`
is the fast loop, `make test-fast`); the suites of OWN_RUNNERS need Go builds (some root too) and run only from
their run.sh, with their own pytest.ini."""

from __future__ import annotations

import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]
# The markers are registered in pyproject.toml ([tool.pytest.ini_options] markers; --strict-markers is on).
SUITES = ("unit", "deploy", "integration")
OWN_RUNNERS = ("conformance", "nfd", "cdi", "dra", "cluster")


def suite_of(path: pathlib.Path) -> str | None:
    """The suite a test file under tests/ belongs to (its first directory); None outside tests/."""
    try:
        return path.resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
