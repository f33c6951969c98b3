"""The fence (shared/fence/): each workaround of a dependency's internals names the version it was checked
against, that version is pinned exactly in pyproject.toml and the container's lock, and it is the one installed;
and no module outside the fence touches those internals."""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib
import re

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FENCE = ROOT / "shared" / "fence"
PRODUCT = ("shared", "scanner", "resource_worker", "kubelet_watchdog", "dra_worker", "rbln_device_plugin",
           "simulator")
# The private names the fenced modules use: nowhere else in the product.
INTERNALS = ("_asyncio_loop", "signal_receiver", "stop_groups", "get_socket_map", "mmap_dict", "change_state")
MODULES = sorted(path.stem for path in FENCE.glob("*.py") if path.stem != "__init__")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {_normal(match[1]): match[2] for match in (re.fullmatch(r"([\w.-]+)==([\w.]+)", d) for d in dependencies)
            if match}


def _locked() -> dict[str, str]:
    lock = (ROOT / "deploy" / "container" / "requirements.lock").read_text()
    return {_normal(name): version for name, version in re.findall(r"^([\w.-]+)==([\w.]+)", lock, re.M)}


def test_the_fence_holds_the_four_workarounds():
    assert MODULES == ["loguru_asyncio", "prometheus_value_files", "supervisord_started", "supervisord_wakeup"]


@pytest.mark.parametrize("module", MODULES)
def test_a_fenced_module_is_checked_against_the_pinned_locked_and_installed_version(module):
    distribution, version = importlib.import_module(f"shared.fence.{module}").CHECKED_AGAINST
    assert _pins().get(_normal(distribution)) == version, f"pyproject.toml pins {distribution}=={version}"
    assert _locked().get(_normal(distribution)) == version, f"requirements.lock holds {distribution}=={version}"
    installed = importlib.metadata.version(distribution)
    assert installed == version, (
        f"{distribution} {installed} is installed; shared/fence/{module}.py was checked against {version}: "
        "read the new version's internals, measure again, then move CHECKED_AGAINST and the pins")


def test_no_module_outside_the_fence_touches_the_internals():
    outside = [path for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
               if FENCE not in path.parents]
    found = [f"{path.relative_to(ROOT)}: {name}" for path in outside for name in INTERNALS if name in path.read_text()]
    assert found == []
