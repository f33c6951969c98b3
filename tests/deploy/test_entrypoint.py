"""The image's entrypoint, run the way the container runs it, without a container engine.

The wheel comes from the Dockerfile's first stage done without Docker (deploy/image_context.py: the
.dockerignore'd context, `pip wheel --no-deps`). It is installed the way the final stage installs it,
`pip install <wheel>` with its dependencies from the package index, into a new virtual environment
that sees neither the system's packages nor the source tree. So a module, a data file or a
dependency missing from the wheel's metadata fails here as it would in the image, instead of being
found in the development environment.

The ENTRYPOINT argv and the ENV of the image are read from the Dockerfile's final stage, the argv
resolved through PATH as a container runtime does, and started from a directory outside the source
tree against a simulated node, with the kubelet simulator listening on the node's kubelet.sock. So is
the command the original plugin's DaemonSet gives instead (`rbln-device-plugin`, no subcommand), with
the environment its chart sets or with its flags.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from simulator.kubelet import KubeletSimulator
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess
from tests.deploy import ROOT, load_deploy_module

image_context = load_deploy_module("image_context")

NPU = "rebellions.ai/npu"
PROGRAMS = {"scanner", "worker-npu", "worker-npu-vf1", "worker-npu-vf4", "watchdog"}
PACKAGES = ("shared", "scanner", "resource_worker", "kubelet_watchdog")
INSTALL_TIMEOUT_SECONDS = 600


@dataclasses.dataclass(frozen=True)
class InstalledImage:
    """The wheel installed in a clean virtual environment, as the image's final stage installs it."""

    venv: pathlib.Path
    version: str

    @property
    def bin_dir(self) -> pathlib.Path:
        return self.venv / "bin"

    @property
    def python(self) -> pathlib.Path:
        return self.bin_dir / "python"

    def environment(self, home: pathlib.Path) -> dict[str, str]:
        """The container's environment: the image's ENV, PATH leading to the installed console scripts
        (the python image's PATH starts with the directory pip installs them into), nothing inherited."""
        return {**image_context.image_environment(), "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
                "HOME": str(home)}


@pytest.fixture(scope="module")
def installed_image(tmp_path_factory) -> InstalledImage:
    work = tmp_path_factory.mktemp("image")
    wheel, problems = image_context.stage_one(work / "wheels")
    assert problems == []
    venv = work / "venv"
    # The test's interpreter may itself be a venv's: `venv` bases the new one on the base interpreter.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
         "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
    assert install.returncode == 0, f"pip install {wheel.name} into a clean venv failed:\n{install.stderr}"
    return InstalledImage(venv, version=wheel.name.split("-")[1])


@pytest.fixture
def container_dir() -> Iterator[pathlib.Path]:
    """Short (unix socket paths) and outside the source tree: the node, the working directory, HOME."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="rbln-ep-", dir="/tmp"))
    assert ROOT not in path.parents
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(container_dir) -> SimulatedNode:
    return build_node(container_dir / "node", NodeSpec.parse("2"))


@pytest.fixture
def kubelet(node) -> Iterator[KubeletSimulator]:
    with KubeletSimulator(node.plugin_dir) as simulator:
        yield simulator


def _cmdline(pid: int) -> list[str]:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _children(pid: int) -> dict[int, list[str]]:
    """pid -> argv of the live processes whose parent is `pid`."""
    children = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            parent = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
            if parent == pid:
                children[int(entry.name)] = _cmdline(int(entry.name))
        except (OSError, StopIteration):  # gone meanwhile, or a kernel thread
            continue
    return children


def test_the_installed_wheel_imports_from_the_venv_only(installed_image, container_dir):
    environ = installed_image.environment(container_dir)
    entrypoint = image_context.image_entrypoint()
    assert shutil.which(entrypoint[0], path=environ["PATH"]) == str(installed_image.bin_dir / entrypoint[0])
    probe = subprocess.run(
        [str(installed_image.python), "-c",
         f"import importlib; print(*(importlib.import_module(p).__file__ for p in {PACKAGES!r}), sep='\\n')"],
        cwd=container_dir, env=environ, capture_output=True, text=True, timeout=60, check=True)
    site_packages = installed_image.venv / "lib"
    assert [pathlib.Path(f).is_relative_to(site_packages) for f in probe.stdout.split()] == [True] * len(PACKAGES)


def _serves_as_supervisord_and_stops_on_sigterm(stack: StackProcess, installed_image: InstalledImage,
                                               node: SimulatedNode, kubelet: KubeletSimulator) -> list[dict]:
    """The started command became supervisord, on the installed copy's config, and its stack served the
    kubelet until SIGTERM stopped all of it cleanly. Returns the startup records."""
    try:
        kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"}, timeout=30)
        starts = stack.wait_for_record("Starting rbln-device-plugin", count=len(PROGRAMS))
        assert {r["process"] for r in starts} == PROGRAMS
        assert {r["version"] for r in starts} == {installed_image.version}

        (container,) = kubelet.allocate(NPU, [["rbln1", "rbln0"]]).container_responses
        (gid,) = [group for group in node.rsd_groups() if group != 0]
        assert [(d.container_path, d.host_path) for d in container.devices] == [
            ("/dev/rsd0", f"/dev/rsd{gid}"), ("/dev/rbln0", "/dev/rbln0"), ("/dev/rbln1", "/dev/rbln1")]
        assert dict(container.annotations) == {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}

        # The process the runtime started became supervisord (exec, same pid), on the installed copy's config.
        assert (node.run_dir / "supervisord.pid").read_text().strip() == str(stack.pid)
        python = str(installed_image.python)
        conf = _cmdline(stack.pid)[-1]
        assert _cmdline(stack.pid) == [python, "-m", "supervisor.supervisord", "-n", "-c", conf]
        assert pathlib.Path(conf).is_relative_to(installed_image.venv) and conf.endswith("/shared/supervisor.conf")
        # Its children are the stack's programs, run by the venv's interpreter.
        programs = _children(stack.pid)
        modules = sorted(argv[2] for argv in programs.values() if argv[:2] == [python, "-m"])
        assert modules == ["kubelet_watchdog", "resource_worker", "resource_worker", "resource_worker", "scanner"]
    finally:
        # What the runtime sends PID 1 when the pod is deleted.
        code = stack.stop(signal.SIGTERM)
    assert code == 0, "\n".join(stack.stderr_lines[-20:])
    assert {r["process"] for r in stack.find("Shutdown signal received", signal="SIGTERM")} == PROGRAMS
    assert not [pid for pid in programs if pathlib.Path(f"/proc/{pid}").exists()]
    assert not [r for r in stack.records if r["level"] == "error"]
    return starts


def test_entrypoint_execs_supervisord_which_serves_the_kubelet_and_stops_on_sigterm(
        installed_image, container_dir, node, kubelet):
    environ = {**installed_image.environment(container_dir), **node.env("200ms"), "NODE_NAME": "entrypoint-node"}
    stack = StackProcess(environ, command=image_context.image_entrypoint(), cwd=container_dir).start()
    _serves_as_supervisord_and_stops_on_sigterm(stack, installed_image, node, kubelet)


# The original plugin's DaemonSet: `command: ["rbln-device-plugin"]`, which replaces the image's
# ENTRYPOINT, and the environment its chart sets (here with the simulated node's paths).
ORIGINAL_COMMAND = ["rbln-device-plugin"]


def _original_chart_environment(node: SimulatedNode) -> dict[str, str]:
    return {"CDI_ROOT": str(node.cdi_root), "KUBELET_DEVICE_PLUGIN_PATH": str(node.plugin_dir),
            "USE_GENERIC_RESOURCE_NAME": "true", "HEALTHCHECK_PORT": "-1", "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
            "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json", "NODE_NAME": "original-node"}


def test_the_originals_command_with_its_environment_runs_the_stack(installed_image, container_dir, node, kubelet):
    environ = {**installed_image.environment(container_dir), **node.env("200ms"), **_original_chart_environment(node)}
    stack = StackProcess(environ, command=ORIGINAL_COMMAND, cwd=container_dir).start()
    starts = _serves_as_supervisord_and_stops_on_sigterm(stack, installed_image, node, kubelet)
    assert {(r["nodeName"], r["useGenericResourceName"], r["logLevel"], r["logFormat"]) for r in starts} == {
        ("original-node", True, "info", "json")}


def test_the_originals_command_with_its_flags_in_every_form_runs_the_stack(installed_image, container_dir, node,
                                                                           kubelet):
    # The environment points elsewhere: the flags win, as in the original.
    elsewhere = container_dir / "elsewhere"
    environ = {**installed_image.environment(container_dir), **node.env("5s"), **_original_chart_environment(node),
               "CDI_ROOT": str(elsewhere / "cdi"), "KUBELET_DEVICE_PLUGIN_PATH": str(elsewhere / "plugins"),
               "USE_GENERIC_RESOURCE_NAME": "false", "HEALTHCHECK_PORT": "1"}
    flags = (f"--cdi-root={node.cdi_root}", "-kubelet-device-plugin-path", str(node.plugin_dir),
             "--healthcheck-port", "-1", "-device-scan-interval=200ms", "--otlp-endpoint=",
             "-use-generic-resource-name")
    stack = StackProcess(environ, extra_args=flags, command=ORIGINAL_COMMAND, cwd=container_dir).start()
    starts = _serves_as_supervisord_and_stops_on_sigterm(stack, installed_image, node, kubelet)
    assert {(r["cdiRoot"], r["kubeletDevicePluginPath"], r["healthcheckPort"], r["deviceScanInterval"],
             r["useGenericResourceName"]) for r in starts} == {
        (str(node.cdi_root), str(node.plugin_dir), -1, "200ms", True)}
    assert not elsewhere.exists()


def test_the_originals_command_with_a_bad_flag_stops_with_one_line(installed_image, container_dir, node):
    environ = {**installed_image.environment(container_dir), **node.env("200ms")}
    result = subprocess.run([*ORIGINAL_COMMAND, "--use-generic-resource-name", "false"], env=environ,
                            cwd=container_dir, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("rbln-device-plugin: arguments not supported: false") \
        and result.stderr.count("\n") == 1
