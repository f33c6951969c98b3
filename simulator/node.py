"""A simulated node in a directory: sysfs tree, device nodes, an `rbln-smi` stand-in and the stack's dirs.

Layout under the root:
    sys/        SYSFS_ROOT: devices/pci0000:00/... (see simulator.pci), bus/pci/devices/<BDF>
                (relative symlinks into devices/), class/rebellions/<PF>/status ("0\\n";
                VFs have no status file unless `set_status` writes one) and .../kernel_version
    dev/        DEV_ROOT: rbln<i>, rbln<i>-<j>, rsd0 and one rsd<G> per RSD group, regular files
    bin/rbln-smi  the stand-in (simulator.rbln_smi_standin)
    smi/        its private state: state.json, calls.jsonl, locks
    cdi/ (CDI_ROOT)  etc-cdi/ (the other CDI spec dir; none of the toolkit's specs unless a test writes one)
    device-plugins/  pod-resources/ (the kubelet simulator's)  run/ (0700)  log/  rsd.lock
Every file is plain data: any process may drive the node through a `SimulatedNode`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import uuid
from collections.abc import Iterable
from typing import Any

from simulator import smi_state
from simulator.pci import SimDevice, plan
from simulator.rbln_smi_standin import FAULTS
from simulator.spec import NodeSpec, PfSpec

__all__ = ["NodeSpec", "PfSpec", "SimDevice", "SimulatedNode", "build_node"]

# vendor 1eff device IDs (PF, VF), from the Rebellions pci.ids.
_PCI_IDS = {"RBLN-CA12": ("1120", "1121"), "RBLN-CA22": ("1220", "1221"), "RBLN-CA25": ("1250", "1251"),
            "RBLN-CR03": ("2030", "2031"), "RBLN-CR13": ("2130", "2131")}
KMD_VERSION = "1.3.73"
FW_VERSION = "1.0.17"
_MEMORY_BYTES = 16 * 1024**3
_PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent

_SCRIPT = """#!{python} -I
# rbln-smi stand-in of the simulated node at {root}; see simulator/rbln_smi_standin.py.
import sys
try:
    from simulator import rbln_smi_standin
except ImportError:
    sys.path.insert(0, {project_root!r})
    from simulator import rbln_smi_standin
sys.exit(rbln_smi_standin.main(sys.argv[1:], state_dir={state_dir!r}))
"""


@dataclasses.dataclass(frozen=True)
class SimulatedNode:
    root: pathlib.Path
    inventory: tuple[SimDevice, ...]
    """Every device, PFs first, in npu order; rbln-smi lists the ones not removed."""

    @property
    def sysfs_root(self) -> pathlib.Path:
        return self.root / "sys"

    @property
    def dev_root(self) -> pathlib.Path:
        return self.root / "dev"

    @property
    def rbln_smi(self) -> pathlib.Path:
        return self.root / "bin" / "rbln-smi"

    @property
    def cdi_root(self) -> pathlib.Path:
        return self.root / "cdi"

    @property
    def static_cdi_dir(self) -> pathlib.Path:
        """The node's other CDI spec dir (a real node's /etc/cdi)."""
        return self.root / "etc-cdi"

    @property
    def plugin_dir(self) -> pathlib.Path:
        return self.root / "device-plugins"

    @property
    def pod_resources_socket(self) -> pathlib.Path:
        """Where the kubelet simulator (on `plugin_dir`) serves the PodResources API."""
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def run_dir(self) -> pathlib.Path:
        return self.root / "run"

    @property
    def log_dir(self) -> pathlib.Path:
        return self.root / "log"

    @property
    def lock_file(self) -> pathlib.Path:
        return self.root / "rsd.lock"

    @property
    def state_dir(self) -> pathlib.Path:
        return self.root / "smi"

    def env(self, scan_interval: str = "200ms") -> dict[str, str]:
        """The stack's environment with every path inside the node, and no port taken (health and metrics
        off: stacks of several tests or benchmarks may run at once)."""
        return {
            "SYSFS_ROOT": str(self.sysfs_root),
            "DEV_ROOT": str(self.dev_root),
            "RBLN_SMI": str(self.rbln_smi),
            "CDI_ROOT": str(self.cdi_root),
            # Never the machine's own /etc/cdi.
            "CDI_SPEC_DIRS": f"{self.cdi_root}:{self.static_cdi_dir}",
            "KUBELET_DEVICE_PLUGIN_PATH": str(self.plugin_dir),
            "RBLN_RSD_LOCK_FILE": str(self.lock_file),
            "RBLN_DEVICE_PLUGIN_RUN_DIR": str(self.run_dir),
            "RBLN_DEVICE_PLUGIN_LOG_DIR": str(self.log_dir),
            "KUBELET_POD_RESOURCES_SOCKET": str(self.pod_resources_socket),
            # The kubelet's DRA dirs: the mode check looks for a DRA plugin's registration socket there.
            "KUBELET_PLUGINS_PATH": str(self.root / "plugins"),
            "KUBELET_PLUGIN_REGISTRY_PATH": str(self.root / "plugins_registry"),
            "HEALTHCHECK_PORT": "-1",
            "METRICS_PORT": "-1",
            "DEVICE_SCAN_INTERVAL": scan_interval,
        }

    def devices(self) -> list[str]:
        return [d.device for d in self.inventory]

    def device(self, device_id: str) -> SimDevice:
        for candidate in self.inventory:
            if candidate.device == device_id:
                return candidate
        raise KeyError(f"no device {device_id!r} on the simulated node")

    def status_file(self, device_id: str) -> pathlib.Path:
        return self.sysfs_root / "class" / "rebellions" / device_id / "status"

    def set_status(self, device_id: str, value: int | str | bytes | None) -> None:
        """Write the driver status file (an int becomes "<n>\\n"); None deletes it."""
        path = self.status_file(device_id)
        if value is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        data = value if isinstance(value, bytes) else (f"{value}\n" if isinstance(value, int) else value).encode()
        _replace(path, data)

    def kernel_version_file(self, device_id: str) -> pathlib.Path:
        return self.sysfs_root / "class" / "rebellions" / device_id / "kernel_version"

    def set_driver_version(self, version: str) -> None:
        """A driver upgrade: the version rbln-smi prints (`KMD_version`) and every PF's `kernel_version`."""
        with smi_state.update(str(self.state_dir)) as state:
            state["kmd_version"] = version
        for device in self.inventory:
            if not device.is_vf:
                _replace(self.kernel_version_file(device.device), f"{version}\n".encode())

    def remove_device(self, device_id: str) -> None:
        """Hide the device from rbln-smi output; its sysfs entries and /dev node stay."""
        self.device(device_id)
        with smi_state.update(str(self.state_dir)) as state:
            if device_id not in state["hidden"]:
                state["hidden"].append(device_id)

    def restore_device(self, device_id: str) -> None:
        self.device(device_id)
        with smi_state.update(str(self.state_dir)) as state:
            state["hidden"] = [d for d in state["hidden"] if d != device_id]

    def set_smi_fault(self, fault: str | None, commands: Iterable[str] = smi_state.COMMANDS,
                      delay: float = 1.0) -> None:
        """Make rbln-smi misbehave for `commands` (names in smi_state.COMMANDS); None clears.
        Faults: "hang", "slow" (sleeps `delay` s, then works), "exit", "garbage", "truncated"."""
        commands = list(commands)
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        unknown = set(commands) - set(smi_state.COMMANDS)
        if unknown:
            raise ValueError(f"unknown rbln-smi commands {sorted(unknown)}; known: {', '.join(smi_state.COMMANDS)}")
        with smi_state.update(str(self.state_dir)) as state:
            state["fault"] = None if fault is None else {"kind": fault, "commands": commands, "delay": delay}

    def rsd_groups(self) -> dict[int, list[int]]:
        """Current RSD groups, gid -> npus; group 0 holds every device in no other group."""
        return smi_state.group_members(smi_state.load(str(self.state_dir)))

    def smi_calls(self) -> list[dict[str, Any]]:
        """Every rbln-smi invocation so far: argv, environ, command, pid, start/end (epoch s), exit, error,
        fault; group changes also `lock_held` and `overlap`. A hung call has end and exit None."""
        return smi_state.read_calls(str(self.state_dir))

    def lock_violations(self) -> list[dict[str, Any]]:
        """Group changes made without the RSD flock held, or overlapping another change."""
        return [call for call in self.smi_calls()
                if call["command"] in smi_state.GROUP_CHANGES and (not call["lock_held"] or call["overlap"])]


def build_node(root: pathlib.Path, spec: NodeSpec, smi_python: str = sys.executable) -> SimulatedNode:
    """Create the node's files under `root` (created if needed; must not hold a node already).
    `smi_python` runs the rbln-smi stand-in: another interpreter with the simulator package where the
    node is used from elsewhere, such as a container's own Python when the node is mounted into it."""
    node = SimulatedNode(pathlib.Path(root).absolute(), plan(spec))
    node.root.mkdir(parents=True, exist_ok=True)
    node.sysfs_root.mkdir()  # FileExistsError: never mix two nodes in one dir
    _write_sysfs(node)
    for path in (node.dev_root, node.cdi_root, node.static_cdi_dir, node.log_dir, node.state_dir,
                 node.rbln_smi.parent):
        path.mkdir()
    node.plugin_dir.mkdir(exist_ok=True)  # a kubelet may already be serving there
    node.run_dir.mkdir(mode=0o700)
    node.run_dir.chmod(0o700)  # mkdir's mode is filtered by the umask
    for name in ["rsd0", *node.devices()]:
        (node.dev_root / name).touch()
    node.lock_file.touch()
    smi_state.save(str(node.state_dir), _initial_state(node))
    node.rbln_smi.write_text(_SCRIPT.format(python=smi_python, root=node.root, project_root=str(_PROJECT_ROOT),
                                            state_dir=str(node.state_dir)))
    node.rbln_smi.chmod(0o755)
    return node


def _replace(path: pathlib.Path, data: bytes) -> None:
    # Readers of sysfs-like files must never see a half-written value.
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


def _write_sysfs(node: SimulatedNode) -> None:
    devices_dir = node.sysfs_root / "devices"
    bus_dir = node.sysfs_root / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True)

    def make_function(path: tuple[str, ...], attributes: dict[str, str]) -> pathlib.Path:
        directory = devices_dir.joinpath(*path)
        directory.mkdir(parents=True)
        for name, value in attributes.items():
            (directory / name).write_text(f"{value}\n")
        (bus_dir / path[-1]).symlink_to(os.path.relpath(directory, bus_dir))
        return directory

    # Root ports and switch ports: every path segment between the host bridge and the endpoint.
    bridges = sorted({d.pci_path[:depth] for d in node.inventory for depth in range(2, len(d.pci_path))})
    for bridge in bridges:
        make_function(bridge, {"class": "0x060400"})
    for device in node.inventory:
        pf_id, vf_id = _PCI_IDS.get(device.product, ("0000", "0000"))
        device_id = f"0x{vf_id if device.is_vf else pf_id}"
        attributes = {"vendor": "0x1eff", "device": device_id, "class": "0x120000",
                      "subsystem_vendor": "0x1eff", "subsystem_device": device_id}
        if device.numa_node is not None:
            attributes["numa_node"] = str(device.numa_node)
        if not device.is_vf:
            attributes.update(sriov_totalvfs=str(max(4, device.num_vfs)), sriov_numvfs=str(device.num_vfs))
        directory = make_function(device.pci_path, attributes)
        if device.parent is not None:  # a VF
            (directory / "physfn").symlink_to(f"../{node.device(device.parent).bus_id}")
            continue
        vfs = [d for d in node.inventory if d.parent == device.device]
        for j, vf in enumerate(vfs):
            (directory / f"virtfn{j}").symlink_to(f"../{vf.bus_id}")
        node.set_status(device.device, 0)
        _replace(node.kernel_version_file(device.device), f"{KMD_VERSION}\n".encode())


def _smi_entry(device: SimDevice) -> dict[str, Any]:
    pf_id, vf_id = _PCI_IDS.get(device.product, ("0000", "0000"))
    memory = _MEMORY_BYTES // device.num_vfs if device.is_vf else _MEMORY_BYTES
    return {
        "npu": device.npu,
        "name": device.product,
        "device": device.device,
        "sid": device.sid,
        "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"rbln-simulator:{device.sid}:{device.device}")),
        "status": "normal",
        "fw_ver": FW_VERSION,
        "pci": {"dev": f"0x{vf_id if device.is_vf else pf_id}", "bus_id": device.bus_id,
                "numa_node": "-1" if device.numa_node is None else str(device.numa_node),
                "link_speed": "16GT/s", "link_width": "x16"},
        "memory": {"used": "0", "total": str(memory)},
    }


def _initial_state(node: SimulatedNode) -> dict[str, Any]:
    return {
        "kmd_version": KMD_VERSION,
        "lock_file": str(node.lock_file),
        "dev_root": str(node.dev_root),
        "devices": [{"entry": _smi_entry(d), "hosts_vfs": not d.is_vf and d.num_vfs > 0} for d in node.inventory],
        "hidden": [],
        "groups": {},
        "fault": None,
    }
