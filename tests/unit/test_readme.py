"""CI runs the README's test command, the README's first command is the zero-hardware demo, and its map of the
code names every module."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_install_and_simulate_then_tests():
    install_and_demo, tests = readme_commands()[:2]
    assert "pip install ." in install_and_demo and install_and_demo.endswith("rbln-device-plugin simulate")
    assert "pip install '.[test]'" in tests


def test_ci_runs_exactly_the_readme_test_command():
    test_command = readme_commands()[1].split("&&")[-1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


# The packages whose every module the README's map names; generated stubs are named by their directories.
MAPPED_PACKAGES = ("shared", "scanner", "resource_worker", "kubelet_watchdog", "dra_worker", "rbln_device_plugin",
                   "simulator")
GENERATED = ("shared/kubelet/deviceplugin/", "shared/kubelet/podresources/", "shared/kubelet/pluginregistration/",
             "shared/kubelet/dra/", "shared/kubelet/dra_health/", "shared/kubeapi/resource/")


def _map_entries() -> list[str]:
    code_map = (ROOT / "README.md").read_text().split("\n### Where the code is\n", 1)[1].split("\n#", 1)[0]
    return [path for line in code_map.splitlines() if line.startswith("- `")
            for path in re.findall(r"`([\w/]+(?:\.py|/))`", line.split(":", 1)[0])]


def test_the_module_map_names_every_module_once_and_nothing_else():
    modules = sorted(str(path.relative_to(ROOT)) for package in MAPPED_PACKAGES
                     for path in (ROOT / package).rglob("*.py")
                     if path.name not in ("__init__.py", "__main__.py") and not str(
                         path.relative_to(ROOT)).startswith(GENERATED))
    entries = _map_entries()
    assert sorted(entry for entry in entries if entry.endswith(".py")) == modules
    assert sorted(entry for entry in entries if entry.endswith("/")) == sorted(GENERATED)
    assert len(entries) == len(set(entries))
