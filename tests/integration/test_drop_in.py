"""What an operator replacing the original Go plugin relies on, on the real stack: its command line and
settings are accepted, their records keep the original's fields, and a kubelet restart cleans the CDI
root as the original's restart did. deploy/image_checks runs the original's command in the built image."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from shared.cdi.stale_specs import TRANSIENT_SPEC_PREFIX
from shared.config import ResourceApi
from shared.programs import expected_programs
from shared.resources import Resource
from simulator.stack import ENTRYPOINT, StackProcess

NPU = Resource.NPU.value
# Every node here has whole NPUs only: the scanner, worker-npu and the watchdog run.
PROGRAMS = expected_programs(ResourceApi.DEVICE_PLUGIN, [NPU])
START = "Starting rbln-device-plugin"
LEGACY_NAMES = "Legacy resource names are not supported; advertising the generic names"


def test_use_generic_resource_name_false_warns_once_and_changes_nothing_else(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node, USE_GENERIC_RESOURCE_NAME="false")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"}, timeout=30)
    starts = stack.wait_for_record(START, count=len(PROGRAMS))
    assert {r["process"]: r["useGenericResourceName"] for r in starts} == dict.fromkeys(PROGRAMS, False)
    (container,) = kubelet.allocate(NPU, [["rbln0"]]).container_responses
    assert dict(container.annotations) == {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}
    assert set(kubelet.resources()) == {NPU}
    stack.stop()
    (warning,) = stack.find(LEGACY_NAMES)
    assert (warning["level"], warning["process"]) == ("warn", "scanner")
    assert warning["resourceNames"] == [resource.value for resource in Resource]


def test_the_default_is_true_and_quiet(make_node, kubelet, start_stack):
    stack = start_stack(make_node("1"))
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    starts = stack.wait_for_record(START, count=len(PROGRAMS))
    assert {r["useGenericResourceName"] for r in starts} == {True}
    assert all({"logLevel", "logFormat", "version"} <= r.keys() for r in starts)
    stack.stop()
    assert not stack.find(LEGACY_NAMES)


def test_stale_transient_cdi_specs_are_removed_again_when_the_kubelet_restarts(make_node, kubelet, start_stack):
    node = make_node("1")
    stack = start_stack(node, RBLN_DEVICE_PLUGIN_LOG_LEVEL="debug")
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    stack.wait_for_record(START, count=len(PROGRAMS))
    # The watchdog watches kubelet.sock from before its first check: a restart earlier is not its to see.
    stack.wait_for_record("Probe state", process="watchdog")
    # Left by something else since the stack started (the start removed the earlier ones).
    stale = [node.cdi_root / f"{TRANSIENT_SPEC_PREFIX}{name}" for name in ("0.yaml", "claim-1.json")]
    kept = node.cdi_root / "rbln.yaml"  # the container toolkit's spec is not the plugin's to remove
    for path in (*stale, kept):
        path.write_text("cdiVersion: 0.5.0\n")
    kubelet.restart()
    stack.wait_for_record("Detected kubelet socket recreation; restarting device plugins")
    (removed,) = stack.wait_for_record("Removed stale CDI specs", process="watchdog")
    assert sorted(removed["paths"]) == sorted(map(str, stale))
    assert [path.exists() for path in (*stale, kept)] == [False, False, True]
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)


# The original's DaemonSet starts `rbln-device-plugin` with no subcommand (its image's own entrypoint
# replaced by `command:`), the settings in the environment its chart sets or as its flags.
ORIGINAL_COMMAND = [sys.executable, "-c", ENTRYPOINT]


def _original_chart_environment(node) -> dict[str, str]:
    return {"CDI_ROOT": str(node.cdi_root), "KUBELET_DEVICE_PLUGIN_PATH": str(node.plugin_dir),
            "USE_GENERIC_RESOURCE_NAME": "true", "HEALTHCHECK_PORT": "-1", "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
            "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json", "NODE_NAME": "original-node"}


def _serves_and_stops_on_sigterm(stack: StackProcess, node, kubelet) -> list[dict]:
    """The command became supervisord (same pid) and its stack served the kubelet until SIGTERM stopped
    all of it; returns the startup records."""
    try:
        kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"}, timeout=30)
        starts = stack.wait_for_record(START, count=len(PROGRAMS))
        assert {r["process"] for r in starts} == set(PROGRAMS)
        (container,) = kubelet.allocate(NPU, [["rbln1", "rbln0"]]).container_responses
        assert [d.container_path for d in container.devices] == ["/dev/rsd0", "/dev/rbln0", "/dev/rbln1"]
        assert (node.run_dir / "supervisord.pid").read_text().strip() == str(stack.pid)
    finally:
        code = stack.stop(signal.SIGTERM)
    assert code == 0, "\n".join(stack.stderr_lines[-20:])
    assert {r["process"] for r in stack.find("Shutdown signal received", signal="SIGTERM")} == set(PROGRAMS)
    return starts


def test_the_originals_command_with_its_environment_runs_the_stack(make_node, kubelet):
    node = make_node("2")
    environ = {**os.environ, **node.env("200ms"), **_original_chart_environment(node)}
    starts = _serves_and_stops_on_sigterm(StackProcess(environ, command=ORIGINAL_COMMAND).start(), node, kubelet)
    assert {(r["nodeName"], r["useGenericResourceName"], r["logLevel"], r["logFormat"]) for r in starts} == {
        ("original-node", True, "info", "json")}


def test_the_originals_command_with_its_flags_in_every_form_runs_the_stack(make_node, kubelet, node_root):
    node = make_node("2")
    # The environment points elsewhere: the flags win, as in the original.
    elsewhere = node_root / "elsewhere"
    environ = {**os.environ, **node.env("5s"), **_original_chart_environment(node),
               "CDI_ROOT": str(elsewhere / "cdi"), "KUBELET_DEVICE_PLUGIN_PATH": str(elsewhere / "plugins"),
               "USE_GENERIC_RESOURCE_NAME": "false", "HEALTHCHECK_PORT": "1"}
    flags = (f"--cdi-root={node.cdi_root}", "-kubelet-device-plugin-path", str(node.plugin_dir),
             "--healthcheck-port", "-1", "-device-scan-interval=200ms", "--otlp-endpoint=",
             "-use-generic-resource-name")
    stack = StackProcess(environ, extra_args=flags, command=ORIGINAL_COMMAND).start()
    starts = _serves_and_stops_on_sigterm(stack, node, kubelet)
    assert {(r["cdiRoot"], r["kubeletDevicePluginPath"], r["healthcheckPort"], r["deviceScanInterval"],
             r["useGenericResourceName"]) for r in starts} == {
        (str(node.cdi_root), str(node.plugin_dir), -1, "200ms", True)}
    assert not elsewhere.exists()


def test_the_originals_command_with_a_bad_flag_stops_with_one_line(make_node):
    node = make_node("1")
    result = subprocess.run([*ORIGINAL_COMMAND, "--use-generic-resource-name", "false"],
                            env={**os.environ, **node.env("200ms")}, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("rbln-device-plugin: arguments not supported: false") \
        and result.stderr.count("\n") == 1
