"""The image recipe (deploy/container/: Dockerfile, Makefile, hashed locks), checked without a container engine.

The image is built and run for real by deploy/image_test.sh (CI); deploy/validate.sh adds hadolint.
These are the properties a build on a developer's machine would not show: what the build reads
offline, what it is given, and whether the locks still match pyproject.toml.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.deploy import ROOT, project_version

CONTAINER_DIR = ROOT / "deploy" / "container"
DOCKERFILE = CONTAINER_DIR / "Dockerfile"
MAKEFILE = CONTAINER_DIR / "Makefile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\s*\\\n\s*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_no_syntax_directive_so_the_build_needs_no_frontend_image():
    # `# syntax=...` makes BuildKit pull a frontend from a registry before it reads anything else.
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE.read_text(), re.M | re.I)


def test_both_stages_on_one_base_given_as_a_build_argument_defaulting_to_python_slim():
    found = instructions()
    assert found[0] == ("ARG", "BASE_IMAGE=python:3.12-slim")  # before the first FROM: usable in every FROM
    assert [args for keyword, args in found if keyword == "FROM"] == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]


def test_dependencies_install_from_the_hashed_locks_as_wheels_only():
    runs = " ".join(args for keyword, args in instructions() if keyword == "RUN")
    for lock in ("build-requirements.lock", "requirements.lock"):
        assert re.search(rf"install --require-hashes --only-binary=:all: -r /locks/{lock}\b", runs), lock
    # The project's own wheel, built with the locked backend, adds nothing unlocked.
    assert "wheel --no-build-isolation --no-deps" in runs
    assert re.search(r"install --no-deps /wheels/\*\.whl", runs)
    assert " check" in runs


def test_the_runtime_stage_gets_the_stack_environment_only():
    final = instructions()[[keyword for keyword, _ in instructions()].index("FROM", 2):]
    assert [args for keyword, args in final if keyword in ("COPY", "ADD", "RUN")] == [
        "--from=build /opt/rbln-device-plugin /opt/rbln-device-plugin"]
    assert ("ENTRYPOINT", '["rbln-device-plugin", "run"]') in final  # exec form: supervisord becomes PID 1
    assert not [args for keyword, args in final if keyword == "CMD"]


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


def _pins(lock: str) -> dict[str, tuple[Requirement, list[str]]]:
    """name -> (the pinned requirement with its marker, its hashes) of one lock file."""
    text = re.sub(r"\\\n\s*", " ", (CONTAINER_DIR / lock).read_text())
    pins = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            requirement, *options = re.split(r"\s+(?=--hash=)", line)
            parsed = Requirement(requirement)
            pins[canonicalize_name(parsed.name)] = (parsed, [o.removeprefix("--hash=") for o in options])
    return pins


def _assert_locked(lock: str, requirements: list[str]) -> None:
    pins = _pins(lock)
    for name, (requirement, hashes) in pins.items():
        (specifier,) = requirement.specifier  # exactly one `==` pin
        assert specifier.operator == "==", f"{lock}: {requirement} is not pinned"
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{lock}: {name} hashes"
    for wanted in map(Requirement, requirements):
        pinned = pins.get(canonicalize_name(wanted.name))
        assert pinned, f"{lock} lacks {wanted.name}: run `bash deploy/container/lock.sh`"
        version = next(iter(pinned[0].specifier)).version
        assert wanted.specifier.contains(version, prereleases=True), (
            f"{lock} pins {wanted.name}=={version}, outside pyproject.toml's {wanted}: "
            "run `bash deploy/container/lock.sh`")


def test_the_runtime_lock_pins_every_dependency_of_pyproject_within_its_range():
    _assert_locked("requirements.lock", PYPROJECT["project"]["dependencies"])


def test_the_build_lock_pins_pip_and_the_build_backend_within_its_range():
    _assert_locked("build-requirements.lock", ["pip", *PYPROJECT["build-system"]["requires"]])


def test_the_locks_are_what_lock_sh_generates():
    for lock in ("requirements.lock", "build-requirements.lock"):
        assert "bash deploy/container/lock.sh" in (CONTAINER_DIR / lock).read_text().splitlines()[1], lock


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


def test_makefile_passes_a_base_image_only_when_given_one():
    assert "BASE_IMAGE" not in _make("build")  # the Dockerfile's default stands
    pinned = "python:3.12-slim@sha256:" + "0" * 64
    assert f"--build-arg BASE_IMAGE={pinned}" in _make("build", f"BASE_IMAGE={pinned}")


def test_makefile_labels_only_the_source_and_revision_it_is_given():
    assert "org.opencontainers.image.source" not in _make("build")
    out = _make("build", "SOURCE_URL=https://git.example/npu/device-plugin", "REVISION=0123abc")
    assert "--label org.opencontainers.image.source=https://git.example/npu/device-plugin" in out
    assert "--label org.opencontainers.image.revision=0123abc" in out
    assert "org.opencontainers.image.revision" not in _make("build", "REVISION=")


def test_makefile_lock_target_runs_the_lock_script():
    assert _make("lock").strip() == f"bash {CONTAINER_DIR / 'lock.sh'}"
