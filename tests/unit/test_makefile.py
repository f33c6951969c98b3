"""The fast loop: the root Makefile runs the steps of .ci/run with the same commands (never a list of its own),
the README names every target, and the suite markers select one suite alone."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.suites import OWN_RUNNERS, SUITES, TESTS

ROOT = TESTS.parent
# Targets that are not one step of .ci/run: the fast loop is a part of the test step, ci is .ci/run itself.
NOT_A_STEP = ("help", "test-fast", "ci")


def recipes() -> dict[str, list[str]]:
    """Each target of the Makefile and its recipe lines."""
    targets: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if match := re.match(r"^([a-z][a-z-]*):", line):
            current = targets.setdefault(match[1], [])
        elif line.startswith("\t") and current is not None:
            current.append(line.strip())
        elif not line.strip():
            current = None
    return targets


def test_every_step_target_runs_a_command_of_ci_exactly():
    ci_lines = {line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()}
    steps = {target: lines for target, lines in recipes().items() if target not in NOT_A_STEP}
    assert {"lint", "test", "deploy", "conformance", "dra", "nfd", "cdi"} <= set(steps)
    assert {target: [line for line in lines if line not in ci_lines] for target, lines in steps.items()} == {
        target: [] for target in steps}


def test_ci_is_ci_run_and_test_fast_is_the_unit_suite():
    assert recipes()["ci"] == ["bash .ci/run"]
    assert recipes()["test-fast"] == ["python -m pytest -m unit -n auto"]


def test_the_readme_development_section_names_every_target():
    development = (ROOT / "README.md").read_text().split("\n## Development\n", 1)[1].split("\n### ", 1)[0]
    named = set(re.findall(r"`make ([a-z-]+)`", development))
    assert named == set(recipes())


def test_every_suite_directory_is_marked_or_has_its_own_runner(pytestconfig):
    registered = {marker.split(":")[0] for marker in pytestconfig.getini("markers")}
    assert set(SUITES) <= registered
    with_tests = {path.parent.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    assert with_tests == set(SUITES) | set(OWN_RUNNERS)


def test_the_unit_marker_selects_the_unit_suite_alone():
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "-m", "unit"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert ids and all(test_id.startswith("tests/unit/") for test_id in ids)
    assert f"tests/unit/{__name__.rsplit('.', 1)[-1]}.py::test_the_unit_marker_selects_the_unit_suite_alone" in ids
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", collected.stdout), collected.stdout[-300:]
