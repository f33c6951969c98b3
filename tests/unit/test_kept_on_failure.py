"""The conformance and DRA suites' hooks: a failed scenario's directory is kept and named in the summary, a
passing one's removed. Run on a tiny suite of two scenarios by a pytest of its own."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONFTEST = '''
import pathlib
import pytest
from tests.support.kept_on_failure import (pytest_runtest_makereport, pytest_terminal_summary, scenario_dir,
                                           start_keeping)

def pytest_configure(config):
    start_keeping(config)

@pytest.fixture
def node_root(request):
    with scenario_dir(request, "rbln-kept-test-", on_failure=lambda root: (root / "extra.log").write_text("x")) as root:
        yield root
'''
SCENARIOS = '''
import pathlib

def test_passes(node_root):
    (pathlib.Path(__file__).parent / "passed.path").write_text(str(node_root))

def test_fails(node_root):
    (pathlib.Path(__file__).parent / "failed.path").write_text(str(node_root))
    assert False
'''


def test_a_failed_scenario_keeps_its_directory_and_names_it_and_a_passing_one_leaves_none(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_scenarios.py").write_text(SCENARIOS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    (kept,) = re.findall(r"kept for a failed scenario \(node, stack and kubelet logs\): (\S+)", run.stdout)
    kept_dir = pathlib.Path(kept)
    try:
        assert (tmp_path / "failed.path").read_text() == kept and (kept_dir / "extra.log").read_text() == "x"
        assert not pathlib.Path((tmp_path / "passed.path").read_text()).exists()
    finally:
        shutil.rmtree(kept_dir, ignore_errors=True)
