"""The DRA harness's tooling, without Go: it (and the cluster harness) pins the conformance harness's
k8s.io/kubernetes release with that release's staging replaces, and tests/dra/run.sh on a machine without Go
says so in one line."""

import os
import pathlib
import re
import subprocess

import pytest

from tests.conformance.pin_kubelet import HARNESS, staging_version

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRA_HARNESS = ROOT / "tests" / "dra" / "harness"


def kubernetes_release(harness: pathlib.Path) -> str:
    (release,) = re.findall(r"^\s+k8s\.io/kubernetes (v\S+)$", (harness / "go.mod").read_text(), re.M)
    return release


# The cluster harness (tests/cluster/harness: the control plane and the kubelet in one program) is pinned alike.
@pytest.mark.parametrize("harness", [DRA_HARNESS, ROOT / "tests" / "cluster" / "harness"], ids=["dra", "cluster"])
def test_the_harness_pins_the_conformance_harness_release_and_its_staging_replaces(harness):
    release = kubernetes_release(harness)
    assert release == kubernetes_release(HARNESS)
    replaces = re.findall(r"^\s+(k8s\.io/\S+) => (\S+) (\S+)$", (harness / "go.mod").read_text(), re.M)
    assert replaces and all(old == new and version == staging_version(release) for old, new, version in replaces)


def test_dra_run_sh_without_go_says_so_in_one_line_and_fails():
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.access(f"{d}/go", os.X_OK))
    result = subprocess.run(["bash", str(ROOT / "tests" / "dra" / "run.sh")],
                            env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "tests/dra/run.sh: Go is not installed; the DRA harness (k8s.io/kubernetes, etcd) needs Go to build"]
