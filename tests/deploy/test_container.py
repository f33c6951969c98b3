"""The image recipe (deploy/container/Dockerfile, its Makefile, .dockerignore), checked without a container engine.

deploy/validate.sh adds hadolint; test_entrypoint.py builds the wheel from the .dockerignore'd context and runs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.deploy import ROOT, load_deploy_module, project_version

image_context = load_deploy_module("image_context")
instructions = image_context.instructions
DOCKERFILE = image_context.DOCKERFILE
MAKEFILE = ROOT / "deploy" / "container" / "Makefile"


def test_two_stages_on_a_slim_python_base():
    stages = [args for keyword, args in instructions() if keyword == "FROM"]
    assert len(stages) == 2
    assert stages[0] == "python:${PYTHON_VERSION}-slim AS build"
    assert stages[1] == "python:${PYTHON_VERSION}-slim"
    assert ("ARG", "PYTHON_VERSION=3.12") in instructions()


def test_first_stage_builds_the_wheel_without_dependencies_and_the_final_stage_installs_it():
    runs = [args for keyword, args in instructions() if keyword == "RUN"]
    assert any(re.search(r"\bpip wheel\b.*--no-deps\b.*\s\.$", run) for run in runs), runs
    assert any("pip install" in run and "/wheels/*.whl" in run and "from=build" in run for run in runs), runs


def test_exec_form_entrypoint_runs_the_stack():
    entrypoints = [args for keyword, args in instructions() if keyword == "ENTRYPOINT"]
    assert entrypoints == ['["rbln-device-plugin", "run"]']
    assert not [args for keyword, args in instructions() if keyword == "CMD"]


def test_oci_labels():
    labels = " ".join(args for keyword, args in instructions() if keyword == "LABEL")
    found = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', labels))
    assert found["org.opencontainers.image.vendor"] == "Rebellions"
    assert found["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert found["org.opencontainers.image.version"] == "${VERSION}"
    assert found["org.opencontainers.image.title"]
    assert found["org.opencontainers.image.description"]
    # Where and from which commit the image was built is known to the builder only (the Makefile's --label).
    assert "org.opencontainers.image.source" not in found and "org.opencontainers.image.revision" not in found


def test_version_argument_defaults_to_the_project_version():
    assert ("ARG", f"VERSION={project_version()}") in instructions()


@pytest.mark.parametrize(("path", "excluded"), [
    (".git/HEAD", True),
    (".venv/bin/python", True),
    (".ci/venv/bin/python", True),
    ("scanner/__pycache__/main.cpython-312.pyc", True),
    (".pytest_cache/v/cache/nodeids", True),
    ("bench/results/run.json", True),
    ("dist/rbln_device_plugin-0.1.0.tar.gz", True),
    ("deploy/helm/k8s-device-plugin-chart/values.yaml", True),
    ("docs/operations.md", True),
    ("pyproject.toml", False),
    ("README.md", False),
    ("supervisor.conf", False),
    ("shared/cli.py", False),
    ("shared/deviceplugin/v1beta1/api_pb2.py", False),
    ("scanner/main.py", False),
    ("resource_worker/main.py", False),
    ("kubelet_watchdog/main.py", False),
    ("simulator/node.py", False),
    ("protos/generate.py", False),
])
def test_dockerignore_keeps_out_only_what_the_wheel_does_not_need(path, excluded):
    rules = image_context.load_patterns(ROOT / ".dockerignore")
    assert image_context.excluded(path, rules) is excluded


def _make(*args: str) -> str:
    make = shutil.which("make")
    assert make, "GNU make is needed to check deploy/container/Makefile"
    result = subprocess.run([make, "-n", "-f", str(MAKEFILE), *args], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_makefile_builds_with_the_repository_root_as_context_and_pushes_on_request():
    out = _make("build", "IMAGE_NAME=registry.example/rbln/k8s-device-plugin", "VERSION=v1.2.3",
                "PUSH_ON_BUILD=true")
    assert f"--file {DOCKERFILE}" in out
    assert "--build-arg VERSION=v1.2.3" in out
    assert "--tag registry.example/rbln/k8s-device-plugin:v1.2.3" in out
    assert str(ROOT) in [line.strip() for line in out.splitlines()]
    assert out.strip().splitlines()[-1] == "docker push registry.example/rbln/k8s-device-plugin:v1.2.3"


def test_makefile_does_not_push_by_default_and_tags_the_project_version():
    out = _make("build")
    assert "push" not in out
    assert f"--tag rebellions/k8s-device-plugin:{project_version()}" in out


def test_makefile_labels_only_the_source_and_revision_it_is_given():
    assert "org.opencontainers.image.source" not in _make("build")
    out = _make("build", "SOURCE_URL=https://git.example/npu/device-plugin", "REVISION=0123abc")
    assert "--label org.opencontainers.image.source=https://git.example/npu/device-plugin" in out
    assert "--label org.opencontainers.image.revision=0123abc" in out
    assert "org.opencontainers.image.revision" not in _make("build", "REVISION=")
