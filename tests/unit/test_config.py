import pathlib

import pytest

from shared.config import MAX_SCAN_INTERVAL_SECONDS, OPTIONS, SUPERVISOR_SOCKET_WHILE_BINDING, ConfigError, Settings
from shared.durations import format_duration, parse_duration
from shared.kubelet.plugin_socket import longest_socket_name, new_socket_name
from shared.resources import Resource


@pytest.mark.parametrize("text,seconds", [
    ("500ms", 0.5), ("5s", 5.0), ("1m", 60.0), ("1m30s", 90.0), ("1.5s", 1.5), ("2h", 7200.0),
    ("300us", 0.0003), ("0", 0.0), ("10ns", 1e-8),
])
def test_go_durations_parse(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "abc", "", "5x", "-", "s", "1.s5"])
def test_bad_durations_are_rejected(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(5, "5s"), (0.5, "500ms"), (60, "1m"), (90, "1m30s")])
def test_durations_render_like_go(seconds, text):
    assert format_duration(seconds) == text


def test_defaults_follow_the_contract():
    settings = Settings.from_environ({"NODE_NAME": "node-a"})
    assert settings.cdi_root == pathlib.Path("/var/run/cdi")
    assert settings.kubelet_device_plugin_path == pathlib.Path("/var/lib/kubelet/device-plugins")
    assert settings.kubelet_socket == pathlib.Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert settings.healthcheck_port == 51515
    assert settings.metrics_port == 51516
    assert settings.kubelet_pod_resources_socket == pathlib.Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert settings.device_scan_interval == 5.0
    assert settings.otlp_endpoint == ""
    assert settings.use_generic_resource_name is True
    assert settings.sysfs_root == pathlib.Path("/sys")
    assert settings.dev_root == pathlib.Path("/dev")
    assert settings.rbln_smi is None
    assert settings.rsd_lock_file == pathlib.Path("/var/run/rbln-rsd-group.lock")
    assert settings.run_dir == pathlib.Path("/run/rbln-device-plugin")
    assert settings.log_dir == pathlib.Path("/var/log/rbln-device-plugin")
    assert settings.node_name == "node-a"


def test_environment_overrides_and_empty_values():
    settings = Settings.from_environ({"DEVICE_SCAN_INTERVAL": "250ms", "HEALTHCHECK_PORT": "-1",
                                      "METRICS_PORT": "-1", "KUBELET_POD_RESOURCES_SOCKET": "/k/pr.sock",
                                      "RBLN_DEVICE_PLUGIN_LOG_DIR": "", "RBLN_SMI": "/opt/rbln-smi"})
    assert settings.device_scan_interval == 0.25
    assert settings.healthcheck_port == -1
    assert settings.metrics_port == -1
    assert settings.kubelet_pod_resources_socket == pathlib.Path("/k/pr.sock")
    assert settings.log_dir is None
    assert settings.rbln_smi == pathlib.Path("/opt/rbln-smi")
    assert settings.node_name  # falls back to the host name


# What the original's flag package made of these (checked against Go's strconv.ParseInt(text, 0, 64)).
@pytest.mark.parametrize("text,port", [
    ("51515", 51515), ("-1", -1), ("+5", 5), ("0", 0), ("0x1F90", 8080), ("0o17", 15), ("010", 8),
    ("0_10", 8), ("1_0", 10), ("0b101", 5), ("0x_1f", 31), ("-0x10", -16), (" 9090 ", 9090),
])
def test_healthcheck_port_reads_go_integers(text, port):
    assert Settings.from_environ({"HEALTHCHECK_PORT": text}).healthcheck_port == port


@pytest.mark.parametrize("text", ["08080", "1__0", "_1", "1_", "0x", "0o", "1e3", "0b2", "+-1", "\u0663", ""])
def test_healthcheck_port_refuses_what_go_refuses(text):
    with pytest.raises(ConfigError, match=r"HEALTHCHECK_PORT.*not an integer"):
        Settings.from_environ({"HEALTHCHECK_PORT": text})


@pytest.mark.parametrize("text,value", [
    ("true", True), ("True", True), ("TRUE", True), ("t", True), ("T", True), ("1", True),
    ("false", False), ("False", False), ("FALSE", False), ("f", False), ("F", False), ("0", False),
    ("", False),  # set but empty: false, as the original read it
])
def test_use_generic_resource_name_reads_go_booleans(text, value):
    settings = Settings.from_environ({"USE_GENERIC_RESOURCE_NAME": text})
    assert settings.use_generic_resource_name is value
    assert settings.log_fields()["useGenericResourceName"] is value


@pytest.mark.parametrize("env,value,fragment", [
    ("USE_GENERIC_RESOURCE_NAME", "yes", "not a boolean"),
    ("USE_GENERIC_RESOURCE_NAME", " true", "not a boolean"),
    ("USE_GENERIC_RESOURCE_NAME", "tRuE", "not a boolean"),
    ("DEVICE_SCAN_INTERVAL", "5", "missing unit"),
    ("DEVICE_SCAN_INTERVAL", "0s", "outside the range 100ms to 24h"),
    ("DEVICE_SCAN_INTERVAL", "-5s", "outside the range 100ms to 24h"),
    ("DEVICE_SCAN_INTERVAL", "99ms", "outside the range 100ms to 24h"),
    ("DEVICE_SCAN_INTERVAL", "1000h", "outside the range 100ms to 24h"),
    ("DEVICE_SCAN_INTERVAL", "9" * 400 + "h", "outside the range 100ms to 24h"),
    ("HEALTHCHECK_PORT", "http", "not an integer"),
    ("HEALTHCHECK_PORT", "70000", "above 65535 (the range is 0 to 65535; a negative number turns it off)"),
    ("METRICS_PORT", "metrics", "not an integer"),
    ("METRICS_PORT", "65536", "above 65535"),
    ("KUBELET_POD_RESOURCES_SOCKET", "", "must not be empty"),
    ("SYSFS_ROOT", "", "must not be empty"),
    # A plugin socket name is 54 bytes: with the slash, a 53-byte directory is one too many.
    ("KUBELET_DEVICE_PLUGIN_PATH", "/" + "k" * 52, "108 bytes for rbln-device-plugin-rebellions-ai-npu-vf"),
    # supervisord binds supervisor.sock.<pid> first: 23 bytes with a 7-digit pid.
    ("RBLN_DEVICE_PLUGIN_RUN_DIR", "/" + "r" * 83, "supervisor.sock.4194304; a unix socket path has at most 107"),
])
def test_bad_settings_name_the_variable(env, value, fragment):
    with pytest.raises(ConfigError) as caught:
        Settings.from_environ({env: value})
    message = str(caught.value)
    assert env in message and fragment in message and "\n" not in message


def test_the_ends_of_the_scan_interval_range_are_accepted():
    assert Settings.from_environ({"DEVICE_SCAN_INTERVAL": "100ms"}).device_scan_interval == 0.1
    assert Settings.from_environ({"DEVICE_SCAN_INTERVAL": "24h"}).device_scan_interval == MAX_SCAN_INTERVAL_SECONDS
    assert Settings.from_environ({"DEVICE_SCAN_INTERVAL": "1m30s"}).device_scan_interval == 90


def test_socket_directories_up_to_the_unix_limit_are_accepted():
    settings = Settings.from_environ({"KUBELET_DEVICE_PLUGIN_PATH": "/" + "k" * 51,
                                      "RBLN_DEVICE_PLUGIN_RUN_DIR": "/" + "r" * 82})
    assert len(str(settings.kubelet_device_plugin_path / longest_socket_name())) == 107
    assert len(str(settings.run_dir / SUPERVISOR_SOCKET_WHILE_BINDING)) == 107
    assert len(new_socket_name(Resource.NPU_VF4)) == len(longest_socket_name())


def test_the_startup_record_shows_every_setting():
    fields = Settings.from_environ({"NODE_NAME": "node-a", "METRICS_PORT": "9400"}).log_fields()
    assert fields["metricsPort"] == 9400
    assert fields["kubeletPodResourcesSocket"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert len(fields) == len(OPTIONS)


@pytest.mark.parametrize(("value", "expected"), [
    ("", None),  # the default: no node labels
    ("/etc/kubernetes/node-feature-discovery/features.d/rbln-features",
     pathlib.Path("/etc/kubernetes/node-feature-discovery/features.d/rbln-features")),
    ("features.d/rbln-features", pathlib.Path("features.d/rbln-features")),
])
def test_the_nfd_feature_file_is_off_by_default_and_a_path_otherwise(value, expected):
    assert Settings.from_environ({"NFD_FEATURE_FILE": value}).nfd_feature_file == expected


@pytest.mark.parametrize(("value", "fragment"), [
    ("/etc/features.d/.rbln-features", "NFD ignores a feature file whose name starts with a dot"),
    ("/etc/features.d/", "must name a file, not a directory"),
    ("/etc/features.d/..", "must name a file, not a directory"),
])
def test_a_feature_file_nfd_would_not_read_is_refused(value, fragment):
    with pytest.raises(ConfigError, match="NFD_FEATURE_FILE") as caught:
        Settings.from_environ({"NFD_FEATURE_FILE": value})
    assert fragment in str(caught.value)


def test_dra_settings_default_to_the_kubelet_s_paths_and_device_plugin_mode():
    from shared.config import ResourceApi

    settings = Settings.from_environ({"NODE_NAME": "node-a"})
    assert settings.resource_api is ResourceApi.DEVICE_PLUGIN
    assert settings.dra_socket == pathlib.Path("/var/lib/kubelet/plugins/npu.rebellions.ai/dra.sock")
    assert settings.dra_registration_socket == pathlib.Path(
        "/var/lib/kubelet/plugins_registry/npu.rebellions.ai-reg.sock")
    assert settings.kubeconfig is None
    dra = Settings.from_environ({"RESOURCE_API": "dra", "KUBECONFIG": "/etc/kube/config"})
    assert dra.resource_api is ResourceApi.DRA and dra.kubeconfig == pathlib.Path("/etc/kube/config")


@pytest.mark.parametrize(("env", "named"), [
    ({"RESOURCE_API": "both"}, "RESOURCE_API"),
    ({"RESOURCE_API": "DRA"}, "RESOURCE_API"),
    ({"KUBELET_PLUGINS_PATH": ""}, "KUBELET_PLUGINS_PATH"),
    ({"KUBELET_PLUGINS_PATH": "/" + "p" * 90}, "KUBELET_PLUGINS_PATH"),
    ({"KUBELET_PLUGIN_REGISTRY_PATH": "/" + "r" * 90}, "KUBELET_PLUGIN_REGISTRY_PATH"),
])
def test_bad_dra_settings_stop_the_process_with_one_line_naming_them(env, named):
    with pytest.raises(ConfigError) as refused:
        Settings.from_environ(env)
    assert str(refused.value).startswith(f"invalid {named} ") and "\n" not in str(refused.value)
