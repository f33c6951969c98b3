"""The built image, run by a real Docker engine as a node runs it.

deploy/image_test.sh builds the image and runs this module with RBLN_IMAGE_UNDER_TEST (the image),
RBLN_IMAGE_BASE (the base it was built on), RBLN_IMAGE_TEST_LABEL (a label on every container started
here, so that the script can remove what a failed run left) and DOCKER (the client).

The node is the project's simulated node (sysfs tree, device nodes, an rbln-smi stand-in) with the
kubelet simulator on its device-plugins directory, both on this host. The node's directory is
bind-mounted into the container at the same path, so the paths in the stand-in and its state hold on
both sides; its sysfs tree read-only, as the chart mounts /sys. The stand-in is a Python script: in
the container it runs on the image's own interpreter, which has the simulator package (it ships in
the wheel for `rbln-device-plugin simulate`). The run dir is a memory-backed tmpfs, as the chart's
emptyDir. The settings the chart passes (health port, scan interval, log level and format) come from
the chart rendered by helm, and so do the probes. Containers have no network (--network none).

The tests on the running container share one container and run in file order: the last one stops it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
import tomllib
import yaml

from rbln_device_plugin.simulate import expected_resources
from simulator.kubelet import KubeletSimulator
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess
from tests.support.deploy import ROOT, load_deploy_module, project_version

tools = load_deploy_module("tools")

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
LABEL = f"rbln-device-plugin-image-test={os.environ.get('RBLN_IMAGE_TEST_LABEL', 'manual')}"
CHART = ROOT / "deploy" / "helm" / "k8s-device-plugin-chart"
# The stack's virtual environment in the image (deploy/container/Dockerfile).
IMAGE_VENV = "/opt/rbln-device-plugin"
IMAGE_PYTHON = f"{IMAGE_VENV}/bin/python"
NPU, VF1, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"
PROGRAMS = {"scanner", "worker-npu", "worker-npu-vf1", "worker-npu-vf4", "watchdog"}
MIXED_NODE = "2,1:vf1,1:vf4"
STOP_BUDGET_SECONDS = 10.0
DOCKER_TIMEOUT = 120


def docker(*args: str, timeout: float = DOCKER_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: these checks run from deploy/image_test.sh, which builds the image",
                    pytrace=False)
    return value


@pytest.fixture(scope="session")
def image() -> str:
    return _required_env("RBLN_IMAGE_UNDER_TEST")


@pytest.fixture(scope="session")
def base_image() -> str:
    return _required_env("RBLN_IMAGE_BASE")


@dataclasses.dataclass(frozen=True)
class ChartContainer:
    """The plugin container of the chart's default rendering."""

    env: dict[str, str]
    """Literal values only (NODE_NAME comes from the downward API)."""
    liveness: dict
    readiness: dict


@pytest.fixture(scope="session")
def chart() -> ChartContainer:
    rendered = subprocess.run([str(tools.helm()), "template", "image-test", str(CHART)],
                              capture_output=True, text=True, timeout=120, check=True).stdout
    (daemonset,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    return ChartContainer(env, container["livenessProbe"], container["readinessProbe"])


# --- The image itself --------------------------------------------------------------------------------

def _layers(reference: str) -> list[str]:
    return json.loads(docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", reference).stdout)


def test_the_image_is_its_base_plus_one_layer_holding_the_stack(image, base_image):
    layers, base = _layers(image), _layers(base_image)
    assert layers[:len(base)] == base and len(layers) == len(base) + 1
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    base_size = int(docker("image", "inspect", "--format", "{{.Size}}", base_image).stdout)
    print(f"\n{image}: {size / 1e6:.1f} MB in {len(layers)} layers; "
          f"the stack's layer {(size - base_size) / 1e6:.1f} MB on a {base_size / 1e6:.1f} MB base")


LEAN_CHECK = f"""
import glob, shutil
found = []
venv = {IMAGE_VENV!r}
for pattern in ("/src", "/wheels", "/locks", "/opt/build", "/root/.cache", venv + "/bin/pip*",
                venv + "/lib/python*/site-packages/pip", venv + "/lib/python*/site-packages/setuptools"):
    found += glob.glob(pattern)
found += [tool for tool in ("gcc", "cc", "c++", "make", "git") if shutil.which(tool)]
print("\\n".join(found))
"""


def test_the_image_holds_no_build_tools_caches_or_sources(image):
    result = docker("run", "--rm", "--network", "none", "--label", LABEL, "--entrypoint", IMAGE_PYTHON, image,
                    "-c", LEAN_CHECK)
    assert result.stdout.split() == []


def test_labels_name_the_image_and_its_revision(image):
    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout)
    assert labels["org.opencontainers.image.version"] == project_version()
    assert labels["org.opencontainers.image.vendor"] == "Rebellions"
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if revision.returncode == 0:  # a source tree without .git gets no revision label
        assert labels["org.opencontainers.image.revision"] == revision.stdout.strip()


CONTEXT_DOCKERFILE = "FROM scratch\nCOPY . /\n"
# What the build reads (.dockerignore's allowlist): `pip wheel .`'s inputs and the hashed locks.
BUILD_FILES = {"pyproject.toml", "README.md", "supervisor.conf",
               "deploy/container/requirements.lock", "deploy/container/build-requirements.lock"}


def test_the_build_context_holds_what_the_build_reads_and_nothing_else(tmp_path):
    """What Docker sends for the image, exported as files: .dockerignore as Docker applies it."""
    subprocess.run([DOCKER, "build", "--quiet", "--network", "none", "--file", "-",
                    "--output", f"type=local,dest={tmp_path}", str(ROOT)],
                   input=CONTEXT_DOCKERFILE, capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=True)
    sent = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    packages = tuple(f"{package}/" for package in
                     tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]
                     ["wheel"]["packages"])
    assert sorted(p for p in sent if p not in BUILD_FILES and not p.startswith(packages)) == []
    assert sorted(p for p in sent if "__pycache__" in p.split("/") or p.endswith((".pyc", ".pyo"))) == []
    assert sent >= BUILD_FILES
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", *packages], capture_output=True, text=True)
    if tracked.returncode == 0:  # a source tree without .git: the packages' files are not listed anywhere
        assert sorted(set(tracked.stdout.split()) - sent) == []


# --- The image running on a node ---------------------------------------------------------------------

@dataclasses.dataclass
class Container:
    name: str
    process: StackProcess
    """`docker run` attached: its stdout and stderr are the container's."""

    def exec(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return docker("exec", self.name, *argv, timeout=timeout)

    def state(self) -> dict:
        return json.loads(docker("inspect", "--format", "{{json .State}}", self.name).stdout)

    def programs(self) -> dict[str, dict]:
        """`rbln-device-plugin status --json` in the container, as an operator runs it with kubectl exec."""
        return json.loads(self.exec("rbln-device-plugin", "status", "--json").stdout)["processes"]

    def wait_running(self, timeout: float = 30) -> dict[str, dict]:
        """The programs once all are RUNNING (supervisord's name for up for startsecs)."""
        deadline = time.monotonic() + timeout
        while True:
            programs = self.programs()
            if all(program["state"] == "RUNNING" for program in programs.values()):
                return programs
            assert time.monotonic() < deadline, f"not all RUNNING after {timeout} s: {programs}"
            time.sleep(0.5)

    def host_processes(self) -> set[tuple[int, str]]:
        """(pid, start time) of every process in the container, seen from the host: PID 1 and its
        descendants (the start time tells a pid that was reused)."""
        root = self.state()["Pid"]
        parents: dict[int, int] = {}
        for entry in pathlib.Path("/proc").iterdir():
            if entry.name.isdigit():
                stat = _stat(int(entry.name))
                if stat is not None:
                    parents[int(entry.name)] = int(stat[1])
        members, grew = {root}, True
        while grew:
            grew = False
            for pid, parent in parents.items():
                if parent in members and pid not in members:
                    members.add(pid)
                    grew = True
        return {(pid, stat[19]) for pid in members if (stat := _stat(pid)) is not None}


def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat after the command name: state, ppid, ... (the start time at [19])."""
    return text[text.rindex(")") + 2:].split()


def _stat(pid: int) -> list[str] | None:
    try:
        return _stat_fields(pathlib.Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


@pytest.fixture(scope="module")
def node() -> Iterator[SimulatedNode]:
    # Short and outside the source tree: unix socket paths.
    path = pathlib.Path(tempfile.mkdtemp(prefix="rbln-img-", dir="/tmp"))
    try:
        yield build_node(path / "node", NodeSpec.parse(MIXED_NODE), smi_python=IMAGE_PYTHON)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def kubelet(node) -> Iterator[KubeletSimulator]:
    with KubeletSimulator(node.plugin_dir) as simulator:
        yield simulator


@contextlib.contextmanager
def running_container(image: str, node: SimulatedNode, environment: dict[str, str], run_dir: str,
                      entrypoint: Sequence[str] = ()) -> Iterator[Container]:
    """`docker run` of the image on the node, attached; `entrypoint` replaces the image's as a pod's
    `command:` does (its first word the program, the rest its arguments)."""
    name = f"rbln-image-test-{uuid.uuid4().hex[:8]}"
    command = [DOCKER, "run", "--name", name, "--label", LABEL, "--network", "none",
               "--mount", f"type=bind,source={node.root},target={node.root}",
               "--mount", f"type=bind,source={node.sysfs_root},target={node.sysfs_root},readonly",
               "--mount", f"type=tmpfs,target={run_dir},tmpfs-size=16m",
               *[arg for key, value in environment.items() for arg in ("--env", f"{key}={value}")],
               *(("--entrypoint", entrypoint[0]) if entrypoint else ()), image, *entrypoint[1:]]
    process = StackProcess({"PATH": os.environ["PATH"]}, command=command).start()
    try:
        yield Container(name, process)
    finally:
        docker("rm", "--force", name, check=False)
        process.stop()


def _chart_environment(chart: ChartContainer, node: SimulatedNode) -> dict[str, str]:
    """The chart's settings (log level and format, health and metrics ports, scan interval, run dir) with the
    node's paths."""
    return {**{k: v for k, v in chart.env.items() if k not in node.env()},
            **node.env(chart.env["DEVICE_SCAN_INTERVAL"]),
            "HEALTHCHECK_PORT": chart.env["HEALTHCHECK_PORT"], "METRICS_PORT": chart.env["METRICS_PORT"],
            "RBLN_DEVICE_PLUGIN_RUN_DIR": chart.env["RBLN_DEVICE_PLUGIN_RUN_DIR"], "NODE_NAME": "image-test-node"}


@pytest.fixture(scope="module")
def container(image, chart, node, kubelet) -> Iterator[Container]:
    with running_container(image, node, _chart_environment(chart, node),
                           chart.env["RBLN_DEVICE_PLUGIN_RUN_DIR"]) as running:
        yield running


def test_supervisord_is_pid_1(container):
    # The chart's termination signal reaches supervisord itself: `run` exec'd it, on the image's Python.
    container.process.wait_for_record("Starting rbln-device-plugin", count=len(PROGRAMS), timeout=60)
    argv = container.exec("cat", "/proc/1/cmdline").stdout.split("\0")[:-1]
    assert argv[:5] == [IMAGE_PYTHON, "-m", "supervisor.supervisord", "-n", "-c"]
    assert argv[5].startswith(f"{IMAGE_VENV}/lib/") and argv[5].endswith("/rbln_device_plugin/supervisor.conf")
    programs = container.wait_running()
    assert set(programs) == PROGRAMS
    # Each program is a child of PID 1: supervisord started it, nothing in between.
    for name, program in programs.items():
        assert _stat_fields(container.exec("cat", f"/proc/{program['pid']}/stat").stdout)[1] == "1", name


def test_every_resource_of_a_mixed_node_registers(container, node, kubelet):
    expected = expected_resources(node)
    assert set(expected) == {NPU, VF1, VF4}
    for resource, devices in expected.items():
        kubelet.wait_for_devices(resource, dict.fromkeys(devices, "Healthy"), timeout=60)
    assert {r.request.resource_name for r in kubelet.registrations if r.error is None} == set(expected)


def test_allocate_answers_with_the_group_device_and_the_cdi_annotation(container, node, kubelet):
    ids = ["rbln1", "rbln0"]
    (response,) = kubelet.allocate(NPU, [ids]).container_responses
    (gid,) = [g for g, npus in node.rsd_groups().items()
              if g != 0 and sorted(npus) == sorted(node.device(i).npu for i in ids)]
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/rsd0", f"/dev/rsd{gid}", "rw"), ("/dev/rbln0", "/dev/rbln0", "rw"), ("/dev/rbln1", "/dev/rbln1", "rw")]
    assert dict(response.annotations) == {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}
    # The group was made by the stand-in inside the container, under the flock on the node's lock file.
    assert node.lock_violations() == []


# The kubelet's gRPC probe: grpc.health.v1 Check of the probe's service on the pod's address and the
# probe's port, within timeoutSeconds, healthy only when SERVING. The image's own gRPC runtime is the client;
# it has no health stubs (the watchdog needs none), so the two one-field messages are written out here:
# HealthCheckRequest{service} and HealthCheckResponse{status}, status 1 being SERVING.
PROBE = """
import sys, grpc
port, service, timeout = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    reply = check(b"\\x0a" + bytes([len(service)]) + service, timeout=timeout)
print({b"\\x08\\x01": "SERVING", b"\\x08\\x02": "NOT_SERVING"}.get(reply, repr(reply)))
"""


@pytest.mark.parametrize("probe", ["liveness", "readiness"])
def test_the_chart_probes_are_answered_serving(container, chart, probe):
    spec = getattr(chart, probe)
    port, service = spec["grpc"]["port"], spec["grpc"]["service"]
    # As long as the kubelet would keep trying before it acts on a failure.
    deadline = time.monotonic() + spec["initialDelaySeconds"] + spec["periodSeconds"] * spec["failureThreshold"]
    while True:
        started = time.monotonic()
        result = docker("exec", container.name, IMAGE_PYTHON, "-c", PROBE, str(port), service,
                        str(spec["timeoutSeconds"]), check=False)
        answer = result.stdout.strip() if result.returncode == 0 else result.stderr.strip()
        if answer == "SERVING" or time.monotonic() > deadline:
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    assert answer == "SERVING", f"{probe} probe (service {service!r} on port {port}): {answer}"


SCRAPE = """
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode())
"""


def test_the_chart_metrics_port_serves_the_whole_stack(container, chart, node):
    port, expected = chart.env["METRICS_PORT"], expected_resources(node)
    lines = [f'rbln_device_plugin_registered{{resource="{resource}"}} 1.0' for resource in expected]
    # The watchdog's check refreshes the registrations every 2 s.
    deadline = time.monotonic() + 30
    while True:
        result = docker("exec", container.name, IMAGE_PYTHON, "-c", SCRAPE, port, check=False)
        page = result.stdout if result.returncode == 0 else result.stderr
        if all(line in page for line in lines) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [line for line in lines if line not in page] == [], page[-2000:]
    # The scanner's events too: one endpoint for every process.
    assert "rbln_device_plugin_scan_duration_seconds_count " in page


def test_a_worker_killed_in_the_container_is_restarted_and_registers_again(container, node, kubelet):
    before = container.programs()["worker-npu-vf4"]["pid"]
    registrations = kubelet.resources()[VF4].registrations
    # Inside the container, as `kubectl exec ... kill -9` would (sh's kill builtin).
    container.exec("sh", "-c", f"kill -KILL {before}")
    kubelet.wait_for(lambda k: k.resources()[VF4].registrations > registrations, timeout=60,
                     what="worker-npu-vf4 to register again")
    kubelet.wait_for_devices(VF4, dict.fromkeys(expected_resources(node)[VF4], "Healthy"), timeout=60)
    assert container.wait_running()["worker-npu-vf4"]["pid"] != before


def test_docker_stop_ends_the_stack_cleanly_within_10_s(container):
    processes = container.host_processes()
    assert len(processes) >= 1 + len(PROGRAMS)
    started = time.monotonic()
    docker("stop", "--time", str(int(STOP_BUDGET_SECONDS)), container.name, timeout=STOP_BUDGET_SECONDS + 30)
    elapsed = time.monotonic() - started
    code = container.process.wait(timeout=30)  # the attached client ends with the container
    state = container.state()
    assert (state["Status"], state["ExitCode"], code) == ("exited", 0, 0)
    assert elapsed < STOP_BUDGET_SECONDS, f"docker stop took {elapsed:.1f} s"
    assert [(pid, start) for pid, start in processes if (stat := _stat(pid)) is not None and stat[19] == start] == []
    # Every program stopped on the signal on its own: supervisord killed none after its stopwaitsecs.
    shutdowns = container.process.find("Shutdown signal received", signal="SIGTERM")
    assert {r["process"] for r in shutdowns} >= PROGRAMS
    assert not [line for line in container.process.stderr_lines if "with SIGKILL" in line]
    print(f"\ndocker stop: {elapsed:.2f} s")


def _is_record(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_stdout_carried_json_records_only(container):
    # Over the container's whole run, the worker's restart and the stop included.
    assert container.process.raw_lines
    assert [line for line in container.process.raw_lines if not _is_record(line)] == []
    for record in container.process.records:
        assert {"ts", "level", "msg", "process"} <= record.keys(), record


def test_stderr_had_no_crit_line(container):
    # CRIT is where alerting on logs starts: a clean start and stop must not reach it.
    assert [line for line in container.process.stderr_lines if " CRIT " in line] == []


def test_the_originals_command_line_runs_the_stack_in_the_image(image, chart, node, kubelet):
    """The original's DaemonSet replaces the entrypoint with `command: ["rbln-device-plugin"]` and passes
    its settings as flags: the same stack comes up, supervisord as PID 1, and stops cleanly."""
    registrations = {resource: state.registrations for resource, state in kubelet.resources().items()}
    flags = (f"--kubelet-device-plugin-path={node.plugin_dir}", "-cdi-root", str(node.cdi_root),
             "--healthcheck-port", chart.env["HEALTHCHECK_PORT"], "-use-generic-resource-name")
    with running_container(image, node, _chart_environment(chart, node), chart.env["RBLN_DEVICE_PLUGIN_RUN_DIR"],
                           entrypoint=("rbln-device-plugin", *flags)) as original:
        original.process.wait_for_record("Starting rbln-device-plugin", count=len(PROGRAMS), timeout=60)
        assert original.exec("cat", "/proc/1/cmdline").stdout.split("\0")[2:4] == ["supervisor.supervisord", "-n"]
        for resource in registrations:
            kubelet.wait_for(lambda k, r=resource: k.resources()[r].registrations > registrations[r], timeout=60,
                             what=f"{resource} to register from the original's command line")
        docker("stop", "--time", str(int(STOP_BUDGET_SECONDS)), original.name, timeout=STOP_BUDGET_SECONDS + 30)
        assert (original.process.wait(timeout=30), original.state()["ExitCode"]) == (0, 0)
    assert [line for line in original.process.raw_lines if not _is_record(line)] == []
