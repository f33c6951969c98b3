"""The conformance tooling, without Go: the kubelet pin, its staging replaces and the README agree, and
run.sh on a machine without Go says so in one line."""

import os
import pathlib
import re
import subprocess

import pytest

from tests.conformance.pin_kubelet import HARNESS, staging_replaces, staging_version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_staging_modules_follow_the_kubernetes_minor_and_patch():
    assert staging_version("v1.37.2") == "v0.37.2"
    assert staging_version("v1.38.0-beta.0") == "v0.38.0-beta.0"
    for bad in ("v2.1.0", "1.37.2", "v1.37", "v1.37.2 "):
        with pytest.raises(ValueError, match=r"not a k8s\.io/kubernetes release"):
            staging_version(bad)


def test_only_the_k8s_modules_required_at_v0_0_0_are_replaced():
    release_mod = {"Require": [
        {"Path": "k8s.io/api", "Version": "v0.0.0"},
        {"Path": "k8s.io/kubelet", "Version": "v0.0.0", "Indirect": True},
        {"Path": "k8s.io/utils", "Version": "v0.0.0-20260626114624-be93311217bd"},
        {"Path": "k8s.io/klog/v2", "Version": "v2.140.0"},
        {"Path": "github.com/example/v0", "Version": "v0.0.0"},
    ]}
    assert staging_replaces(release_mod, "v1.36.3") == {"k8s.io/api": "v0.36.3", "k8s.io/kubelet": "v0.36.3"}
    assert staging_replaces({}, "v1.36.3") == {}


def pinned_release() -> str:
    (release,) = re.findall(r"^\s+k8s\.io/kubernetes (v\S+)$", (HARNESS / "go.mod").read_text(), re.M)
    return release


def test_the_committed_replaces_are_the_pinned_releases_staging_versions():
    replaces = re.findall(r"^\s+(k8s\.io/\S+) => (\S+) (\S+)$", (HARNESS / "go.mod").read_text(), re.M)
    assert replaces and all(old == new and version == staging_version(pinned_release())
                            for old, new, version in replaces)


def test_the_readme_names_the_kubelet_release_the_stack_is_tested_against():
    assert f"the kubelet of Kubernetes {pinned_release()}" in (ROOT / "README.md").read_text()


def test_run_sh_without_go_says_so_in_one_line_and_fails():
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.access(f"{d}/go", os.X_OK))
    result = subprocess.run(["bash", str(ROOT / "tests" / "conformance" / "run.sh")],
                            env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "tests/conformance/run.sh: Go is not installed; the kubelet harness (k8s.io/kubernetes) needs Go to build"]


def test_cdi_run_sh_without_go_says_so_in_one_line_and_fails():
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.access(f"{d}/go", os.X_OK))
    result = subprocess.run(["bash", str(ROOT / "tests" / "cdi" / "run.sh")],
                            env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["tests/cdi/run.sh: Go is not installed; the CDI checker needs Go to build"]
