"""Configuration shared by every process of the stack (docs/configuration.md).

Every setting has a flag on `rbln-device-plugin run`, an environment variable
and a default. `run` turns its flags into environment variables, and every
process reads the same environment through `Settings.from_environ`, so the
scanner, the workers and the watchdog can never disagree.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shared.cdi.annotation import CdiAnnotation
from shared.durations import format_duration, parse_duration
from shared.kubelet.plugin_socket import longest_socket_name

# The scanner's inventory channel (shared/channels/inventory_protocol.py): its two sockets in the run dir.
INVENTORY_UPDATES_SOCKET = "inventory-updates.ipc"
INVENTORY_SNAPSHOT_SOCKET = "inventory-snapshot.ipc"
# supervisord's control socket in the run dir (supervisor.conf names it too).
SUPERVISOR_SOCKET = "supervisor.sock"
# supervisord binds "<socket>.<its pid>" first and then links it to the socket's name: its longest
# form has the largest pid Linux hands out (PID_MAX_LIMIT, 2**22 on 64-bit).
SUPERVISOR_SOCKET_WHILE_BINDING = f"{SUPERVISOR_SOCKET}.{2**22}"
# A unix socket's path must fit sun_path (108 bytes) with its terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# Settings whose names appear in errors about the paths they give.
RUN_DIR_ENV = "RBLN_DEVICE_PLUGIN_RUN_DIR"
RSD_LOCK_FILE_ENV = "RBLN_RSD_LOCK_FILE"


class ConfigError(ValueError):
    """A setting has a value the stack cannot run with; the message names it."""


def _path(text: str) -> pathlib.Path:
    if not text:
        raise ValueError("must not be empty")
    return pathlib.Path(text)


def _optional_path(text: str) -> pathlib.Path | None:
    return pathlib.Path(text) if text else None


# Go's integer literals, as strconv.ParseInt(text, 0, 64) reads the original's port: decimal, 0x hex,
# 0o or a bare leading 0 octal, 0b binary, `_` between digits (Python's int checks where `_` may go).
_GO_INTEGER = re.compile(r"[+-]?(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|0[0-7_]*|[1-9][0-9_]*)")


def _go_integer(text: str) -> int:
    if not _GO_INTEGER.fullmatch(text):
        raise ValueError("not an integer")
    sign = -1 if text[0] == "-" else 1
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXoObB":
        digits = "0o" + digits[1:]
    try:
        return sign * int(digits, 0)
    except ValueError:
        raise ValueError("not an integer") from None


MAX_PORT = 65535
# The scan interval's range. Shorter, the scanner would do little else than run rbln-smi (a scan of 64
# devices takes about 30 ms); longer, liveness (three missed scans) and health changes would take more than
# three days to be noticed, and timers past it overflow what the libraries take (1000h does).
MIN_SCAN_INTERVAL_SECONDS = 0.1
MAX_SCAN_INTERVAL_SECONDS = 24 * 3600.0
SCAN_INTERVAL_RANGE = "100ms to 24h"


def _port(text: str) -> int:
    port = _go_integer(text.strip())
    if port > MAX_PORT:
        raise ValueError(f"above {MAX_PORT} (the range is 0 to {MAX_PORT}; a negative number turns it off)")
    return port


def _interval(text: str) -> float:
    seconds = parse_duration(text)
    if not MIN_SCAN_INTERVAL_SECONDS <= seconds <= MAX_SCAN_INTERVAL_SECONDS:
        raise ValueError(f"outside the range {SCAN_INTERVAL_RANGE}")
    return seconds


def _feature_file(text: str) -> pathlib.Path | None:
    """NFD_FEATURE_FILE: empty is off; NFD's local source reads every file of its directory but dotfiles."""
    if not text:
        return None
    path = pathlib.Path(text)
    if text.endswith("/") or path.name in ("", ".", ".."):
        raise ValueError("must name a file, not a directory")
    if path.name.startswith("."):
        raise ValueError("NFD ignores a feature file whose name starts with a dot")
    return path


E = TypeVar("E", bound=enum.Enum)


def _choice(kind: type[E]) -> Callable[[str], E]:
    """The parser of a setting that takes one of an enum's values."""
    def parse(text: str) -> E:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"not one of {', '.join(str(member.value) for member in kind)}") from None
    return parse


class ResourceApi(enum.Enum):
    """How the node's NPUs reach Kubernetes; never both ways on one node."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


class TaintEffect(enum.Enum):
    """DRA: the effect of the taint an Unhealthy device carries in its ResourceSlice."""

    NO_SCHEDULE = "NoSchedule"
    """New claims do not get the device; pods using it keep running."""
    NO_EXECUTE = "NoExecute"
    """As NoSchedule, and pods using the device are evicted."""
    NONE = "None"
    """Shown only: the device is allocated as if untainted."""


# The DRA driver's name (the kubelet plugin's name, the ResourceSlices' driver, the DeviceClasses' selector).
DRA_DRIVER = "npu.rebellions.ai"
DRA_SOCKET = "dra.sock"
DRA_REGISTRATION_SOCKET = f"{DRA_DRIVER}-reg.sock"
# With POD_UID each instance has sockets of its own (the kubelet takes several registrations of one driver and
# uses the newest): a surge upgrade's two instances on one node never share, or remove, each other's.
_POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
DRA_REGISTRATION_SOCKETS = re.compile(rf"{re.escape(DRA_DRIVER)}(-[A-Za-z0-9][A-Za-z0-9-]{{0,63}})?-reg\.sock")
"""The registration sockets of either naming scheme."""


def dra_socket_name(pod_uid: str) -> str:
    return f"dra-{pod_uid}.sock" if pod_uid else DRA_SOCKET


def dra_registration_socket_name(pod_uid: str) -> str:
    return f"{DRA_DRIVER}-{pod_uid}-reg.sock" if pod_uid else DRA_REGISTRATION_SOCKET


def _pod_uid(text: str) -> str:
    if text and not _POD_UID.fullmatch(text):
        raise ValueError("not a pod UID (letters, digits and '-', at most 64)")
    return text


# Stands for CDI_ROOT in CDI_SPEC_DIRS, whose default follows the CDI root.
CDI_ROOT_PLACEHOLDER = "$CDI_ROOT"


def _spec_dirs(text: str) -> tuple[str, ...]:
    dirs = tuple(part for part in text.split(":") if part)
    if not dirs:
        raise ValueError("names no directory")
    relative = next((d for d in dirs if not d.startswith("/") and d != CDI_ROOT_PLACEHOLDER), None)
    if relative is not None:
        raise ValueError(f"{relative!r} is not an absolute path")
    return dirs


def _endpoint(text: str) -> str:
    return text.strip()


# The spellings Go's strconv.ParseBool reads, which the original plugin took for its boolean flag.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """A boolean flag's value, as Go reads it: no other spelling, no surrounding space."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("not a boolean (true, false, 1, 0, t, f, in Go's spellings)")


def _env_bool(text: str) -> bool:
    """A boolean variable: as its flag, and empty for false (as the original read an empty variable)."""
    return parse_bool(text) if text else False


@dataclasses.dataclass(frozen=True)
class Option:
    field: str
    flag: str | None
    env: str
    default: str
    parse: Callable[[str], Any]
    help: str
    # A boolean flag may be given bare (`--flag`), which means true.
    boolean: bool = False


OPTIONS: tuple[Option, ...] = (
    Option("cdi_root", "--cdi-root", "CDI_ROOT", "/var/run/cdi", _path,
           "CDI spec directory; stale transient specs are removed at start and when the kubelet restarts"),
    Option("kubelet_device_plugin_path", "--kubelet-device-plugin-path", "KUBELET_DEVICE_PLUGIN_PATH",
           "/var/lib/kubelet/device-plugins", _path, "kubelet device plugin socket directory"),
    Option("healthcheck_port", "--healthcheck-port", "HEALTHCHECK_PORT", "51515", _port,
           "gRPC health service port; negative disables it"),
    Option("metrics_port", "--metrics-port", "METRICS_PORT", "51516", _port,
           "Prometheus /metrics (HTTP) port for the whole stack; negative disables it"),
    Option("device_scan_interval", "--device-scan-interval", "DEVICE_SCAN_INTERVAL", "5s", _interval,
           "how often devices and their health are rescanned (Go duration: 500ms, 5s, 1m)"),
    Option("otlp_endpoint", "--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "", _endpoint,
           "OTLP gRPC endpoint for allocation traces (host:port insecure, https://... TLS); empty disables"),
    Option("use_generic_resource_name", "--use-generic-resource-name", "USE_GENERIC_RESOURCE_NAME", "true",
           _env_bool, "accepted for the original plugin's command line; the resource names are always the "
           "generic ones, and false only logs a warning", boolean=True),
    Option("kubelet_pod_resources_socket", "--kubelet-pod-resources-socket", "KUBELET_POD_RESOURCES_SOCKET",
           "/var/lib/kubelet/pod-resources/kubelet.sock", _path,
           "kubelet PodResources API socket, asked by `status` which pod holds which device"),
    Option("sysfs_root", "--sysfs-root", "SYSFS_ROOT", "/sys", _path, "root of the sysfs tree"),
    Option("dev_root", "--dev-root", "DEV_ROOT", "/dev", _path, "where device nodes are looked up"),
    Option("rbln_smi", "--rbln-smi", "RBLN_SMI", "", _optional_path,
           "rbln-smi binary; empty searches the usual driver locations, then PATH"),
    Option("rsd_lock_file", "--rsd-lock-file", RSD_LOCK_FILE_ENV, "/var/run/rbln-rsd-group.lock", _path,
           "flock serialising RSD group changes across processes"),
    Option("run_dir", "--run-dir", RUN_DIR_ENV, "/run/rbln-device-plugin", _path,
           "private runtime directory (IPC sockets, supervisord socket)"),
    Option("log_dir", None, "RBLN_DEVICE_PLUGIN_LOG_DIR", "/var/log/rbln-device-plugin", _optional_path,
           "per-process rotated log files; empty disables"),
    Option("node_name", None, "NODE_NAME", "", str, "node name on traces and the startup log"),
    Option("nfd_feature_file", "--nfd-feature-file", "NFD_FEATURE_FILE", "", _feature_file,
           "node labels for Node Feature Discovery's local source, kept in this file; empty disables"),
    Option("cdi_annotation", "--cdi-annotation", "CDI_ANNOTATION", CdiAnnotation.ALWAYS.value,
           _choice(CdiAnnotation),
           "when Allocate returns the CDI annotation rebellions.ai/npu=runtime: always, when-resolvable (only "
           "while a spec in CDI_SPEC_DIRS defines it), never"),
    Option("cdi_spec_dirs", "--cdi-spec-dirs", "CDI_SPEC_DIRS", f"{CDI_ROOT_PLACEHOLDER}:/etc/cdi", _spec_dirs,
           "colon-separated CDI spec dirs searched for the annotation's device, as a runtime reads them "
           f"({CDI_ROOT_PLACEHOLDER} is CDI_ROOT)"),
    Option("resource_api", "--resource-api", "RESOURCE_API", ResourceApi.DEVICE_PLUGIN.value,
           _choice(ResourceApi),
           "how the NPUs are served: device-plugin (one worker per resource name) or dra (the DRA driver "
           f"{DRA_DRIVER}); never both on one node"),
    Option("kubelet_plugins_path", "--kubelet-plugins-path", "KUBELET_PLUGINS_PATH", "/var/lib/kubelet/plugins",
           _path, f"DRA: the kubelet's plugins dir; the DRA socket and the plugin's data are in {DRA_DRIVER}/ there"),
    Option("kubelet_plugin_registry_path", "--kubelet-plugin-registry-path", "KUBELET_PLUGIN_REGISTRY_PATH",
           "/var/lib/kubelet/plugins_registry", _path,
           f"DRA: the kubelet's plugin registry dir, where {DRA_REGISTRATION_SOCKET} is made"),
    Option("kubeconfig", None, "KUBECONFIG", "", _optional_path,
           "DRA: kubeconfig file for the API server; empty uses the pod's service account"),
    Option("dra_unhealthy_taint_effect", "--dra-unhealthy-taint-effect", "DRA_UNHEALTHY_TAINT_EFFECT",
           TaintEffect.NO_SCHEDULE.value, _choice(TaintEffect),
           "DRA: effect of the taint on an Unhealthy device: NoSchedule (no new claim gets it), NoExecute (pods "
           "using it are evicted too), None (shown only)"),
    Option("pod_uid", None, "POD_UID", "", _pod_uid,
           "DRA: this pod's UID, in the names of its sockets (surge upgrades); empty: the fixed names"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    cdi_root: pathlib.Path
    kubelet_device_plugin_path: pathlib.Path
    healthcheck_port: int
    metrics_port: int
    device_scan_interval: float
    otlp_endpoint: str
    use_generic_resource_name: bool
    kubelet_pod_resources_socket: pathlib.Path
    sysfs_root: pathlib.Path
    dev_root: pathlib.Path
    rbln_smi: pathlib.Path | None
    rsd_lock_file: pathlib.Path
    run_dir: pathlib.Path
    log_dir: pathlib.Path | None
    node_name: str
    nfd_feature_file: pathlib.Path | None
    cdi_annotation: CdiAnnotation
    cdi_spec_dirs: tuple[pathlib.Path, ...]
    resource_api: ResourceApi
    kubelet_plugins_path: pathlib.Path
    kubelet_plugin_registry_path: pathlib.Path
    kubeconfig: pathlib.Path | None
    dra_unhealthy_taint_effect: TaintEffect
    pod_uid: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for option in OPTIONS:
            text = environ.get(option.env, option.default)
            try:
                values[option.field] = option.parse(text)
            except ValueError as exc:
                raise ConfigError(f"invalid {option.env} {text!r}: {exc}") from None
        _check_socket_room(values["kubelet_device_plugin_path"], longest_socket_name(), "KUBELET_DEVICE_PLUGIN_PATH")
        run_dir_sockets = (INVENTORY_UPDATES_SOCKET, INVENTORY_SNAPSHOT_SOCKET, SUPERVISOR_SOCKET_WHILE_BINDING)
        _check_socket_room(values["run_dir"], max(run_dir_sockets, key=len), RUN_DIR_ENV)
        _check_socket_room(values["kubelet_plugins_path"] / DRA_DRIVER, dra_socket_name(values["pod_uid"]),
                           "KUBELET_PLUGINS_PATH")
        _check_socket_room(values["kubelet_plugin_registry_path"], dra_registration_socket_name(values["pod_uid"]),
                           "KUBELET_PLUGIN_REGISTRY_PATH")
        values["cdi_spec_dirs"] = tuple(values["cdi_root"] if d == CDI_ROOT_PLACEHOLDER else pathlib.Path(d)
                                        for d in values["cdi_spec_dirs"])
        if not values["node_name"]:
            values["node_name"] = socket.gethostname()
        return cls(**values)

    @property
    def kubelet_socket(self) -> pathlib.Path:
        return self.kubelet_device_plugin_path / "kubelet.sock"

    @property
    def dra_plugin_dir(self) -> pathlib.Path:
        """The DRA plugin's own dir: its socket and its data (the checkpoint)."""
        return self.kubelet_plugins_path / DRA_DRIVER

    @property
    def dra_socket(self) -> pathlib.Path:
        return self.dra_plugin_dir / dra_socket_name(self.pod_uid)

    @property
    def dra_registration_socket(self) -> pathlib.Path:
        return self.kubelet_plugin_registry_path / dra_registration_socket_name(self.pod_uid)

    def log_fields(self) -> dict[str, Any]:
        """The resolved configuration, as the startup record carries it."""
        return {
            "cdiRoot": str(self.cdi_root),
            "kubeletDevicePluginPath": str(self.kubelet_device_plugin_path),
            "healthcheckPort": self.healthcheck_port,
            "metricsPort": self.metrics_port,
            "deviceScanInterval": format_duration(self.device_scan_interval),
            "otlpEndpoint": self.otlp_endpoint,
            "useGenericResourceName": self.use_generic_resource_name,
            "kubeletPodResourcesSocket": str(self.kubelet_pod_resources_socket),
            "sysfsRoot": str(self.sysfs_root),
            "devRoot": str(self.dev_root),
            "rblnSmi": str(self.rbln_smi) if self.rbln_smi else "",
            "rsdLockFile": str(self.rsd_lock_file),
            "runDir": str(self.run_dir),
            "logDir": str(self.log_dir) if self.log_dir else "",
            "nodeName": self.node_name,
            "nfdFeatureFile": str(self.nfd_feature_file) if self.nfd_feature_file else "",
            "cdiAnnotation": self.cdi_annotation.value,
            "cdiSpecDirs": [str(d) for d in self.cdi_spec_dirs],
            "resourceApi": self.resource_api.value,
            "kubeletPluginsPath": str(self.kubelet_plugins_path),
            "kubeletPluginRegistryPath": str(self.kubelet_plugin_registry_path),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig else "",
            "draUnhealthyTaintEffect": self.dra_unhealthy_taint_effect.value,
            "podUID": self.pod_uid,
        }


def _check_socket_room(directory: pathlib.Path, longest_name: str, env: str) -> None:
    """ConfigError unless every socket the stack makes in `directory` has a path a unix socket can have:
    a longer one fails only when it is made, in a process that then restarts without end."""
    length = len(os.fsencode(directory / longest_name))
    if length > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(f"invalid {env} {str(directory)!r}: too long for the sockets made in it "
                          f"({length} bytes for {longest_name}; a unix socket path has at most "
                          f"{MAX_SOCKET_PATH_BYTES})")
