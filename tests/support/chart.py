"""The Helm chart rendered by the real helm (from deploy/tools.py); when helm cannot be had, the test fails with
the reason."""

from __future__ import annotations

import functools
import pathlib
import subprocess

import pytest
import yaml

from tests.support.deploy import ROOT, load_deploy_module

CHART = ROOT / "deploy" / "helm" / "k8s-device-plugin-chart"
RELEASE = "k8s-device-plugin"
NAMESPACE = "rbln-system"

tools = load_deploy_module("tools")
manifest_checks = load_deploy_module("manifest_checks")


@functools.cache
def _helm_or_problem() -> tuple[str | None, str]:
    """Looked up once per session, a failure too: every chart test then fails at once with the same reason."""
    try:
        return str(tools.helm()), ""
    except tools.ToolError as exc:
        return None, str(exc)


def helm_binary() -> str:
    path, problem = _helm_or_problem()
    if path is None:
        pytest.fail(f"helm is needed to test the chart: {problem}", pytrace=False)
    return path


def run_helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)


@functools.cache
def _render(args: tuple[str, ...]) -> tuple[dict, ...]:
    result = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.35.0",
                       *args)
    assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(*sets: str, values: pathlib.Path | None = None, strings: tuple[str, ...] = (),
           api_versions: tuple[str, ...] = ()) -> list[dict]:
    """Documents of `helm template`; `sets` are --set KEY=VALUE, `strings` --set-string KEY=VALUE,
    `api_versions` the APIs the cluster is said to serve (--api-versions)."""
    args: list[str] = [arg for api in api_versions for arg in ("--api-versions", api)]
    if values is not None:
        args += ["--values", str(values)]
    for item in sets:
        args += ["--set", item]
    for item in strings:
        args += ["--set-string", item]
    return [dict(doc) for doc in _render(tuple(args))]


# The API group of NFD's NodeFeatureRule: a cluster with NFD serves it, and the chart renders its rule then.
NFD_API = ("nfd.k8s-sigs.io/v1alpha1",)
