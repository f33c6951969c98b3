import fcntl
import json
import os
import pathlib
import stat
import subprocess

import pytest

from simulator.node import NodeSpec, PfSpec, SimulatedNode, build_node
from simulator.smi_state import CHANGE_LOCK


def smi(node: SimulatedNode, *args: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    # An empty environment and a foreign cwd: the stand-in must not depend on either.
    return subprocess.run([str(node.rbln_smi), *args], env={}, cwd="/", capture_output=True, text=True,
                          timeout=timeout)


def listing(node: SimulatedNode, *args: str) -> list[dict]:
    result = smi(node, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["devices"]


def change(node: SimulatedNode, *args: str) -> subprocess.CompletedProcess:
    """A group change made the right way: under the flock on the RSD lock file."""
    with open(node.lock_file) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return smi(node, "group", *args)


@pytest.fixture
def mixed(tmp_path: pathlib.Path) -> SimulatedNode:
    return build_node(tmp_path / "node", NodeSpec.parse("2:vf4,2"))


# Specs

def test_parse_counts_and_modes():
    assert [pf.vf_mode for pf in NodeSpec.parse("2:vf4,2").pfs] == ["vf4", "vf4", "none", "none"]
    assert [pf.num_vfs for pf in NodeSpec.parse("1:vf1, 1:vf2, 1:none").pfs] == [1, 2, 0]
    assert NodeSpec.parse("4") == NodeSpec.uniform(4)


@pytest.mark.parametrize("text", ["", "x", "2:vf3x", "2:", ":vf4", "2:vf4:1", "-1", "1:vf999"])
def test_parse_rejects_bad_text(text):
    with pytest.raises(ValueError, match="node spec"):
        NodeSpec.parse(text)


def test_uniform_spreads_over_numa_nodes_and_switches():
    spec = NodeSpec.uniform(8, numa_nodes=2, switches=4)
    assert [pf.numa_node for pf in spec.pfs] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [pf.switch for pf in spec.pfs] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("fields", [{"vf_mode": "vf8x"}, {"vf_mode": -1}, {"vf_mode": True},
                                    {"numa_node": -1}, {"switch": -1}])
def test_pf_spec_rejects_bad_fields(fields):
    with pytest.raises(ValueError):
        PfSpec(**fields)


# Layout

def test_layout_and_environment(mixed):
    root = mixed.root
    assert mixed.devices() == ["rbln0", "rbln1", "rbln2", "rbln3",
                               "rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3", "rbln1-0", "rbln1-1", "rbln1-2", "rbln1-3"]
    assert [d.npu for d in mixed.inventory] == list(range(12))
    for name in ["rsd0", *mixed.devices()]:
        assert (root / "dev" / name).is_file()
    assert stat.S_IMODE(mixed.run_dir.stat().st_mode) == 0o700
    assert mixed.lock_file.is_file() and mixed.cdi_root.is_dir() and mixed.plugin_dir.is_dir()
    assert os.access(mixed.rbln_smi, os.X_OK)
    env = mixed.env()
    assert env["SYSFS_ROOT"] == str(root / "sys") and env["RBLN_SMI"] == str(mixed.rbln_smi)
    assert env["KUBELET_DEVICE_PLUGIN_PATH"] == str(root / "device-plugins")
    assert env["RBLN_RSD_LOCK_FILE"] == str(root / "rsd.lock")
    assert env["RBLN_DEVICE_PLUGIN_RUN_DIR"] == str(root / "run")
    assert env["RBLN_DEVICE_PLUGIN_LOG_DIR"] == str(root / "log") and env["HEALTHCHECK_PORT"] == "-1"
    assert env["KUBELET_POD_RESOURCES_SOCKET"] == str(root / "pod-resources" / "kubelet.sock")
    assert env["METRICS_PORT"] == "-1"  # no port taken: stacks of several tests may run at once
    assert env["DEVICE_SCAN_INTERVAL"] == "200ms" and mixed.env("1s")["DEVICE_SCAN_INTERVAL"] == "1s"
    paths = {k: v for k, v in env.items() if k not in ("HEALTHCHECK_PORT", "METRICS_PORT", "DEVICE_SCAN_INTERVAL")}
    assert all(v.startswith(f"{root}/") for v in paths.values())


def test_build_refuses_a_dir_holding_a_node(mixed):
    with pytest.raises(FileExistsError):
        build_node(mixed.root, NodeSpec.uniform(1))


def test_bus_links_resolve_into_a_pci_forest(mixed):
    sysfs = mixed.sysfs_root
    for device in mixed.inventory:
        link = sysfs / "bus" / "pci" / "devices" / device.bus_id
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        resolved = pathlib.Path(os.path.realpath(link))
        parts = resolved.relative_to(sysfs / "devices").parts
        assert parts == device.pci_path and parts[0] == "pci0000:00" and len(parts) == 5  # root port, switch x2, PF
        for depth in (2, 3, 4):  # every bridge is a PCI function too
            assert (sysfs / "bus" / "pci" / "devices" / parts[depth - 1]).resolve() == sysfs.joinpath("devices",
                                                                                                     *parts[:depth])
    rbln0, rbln2 = mixed.device("rbln0"), mixed.device("rbln2")
    assert rbln0.pci_path[1] != rbln2.pci_path[1]  # two switches, each under its own root port
    assert mixed.device("rbln0").pci_path[:3] == mixed.device("rbln1").pci_path[:3]


def test_sriov_attributes(mixed):
    devices = mixed.sysfs_root / "bus" / "pci" / "devices"
    pf, plain = mixed.device("rbln0"), mixed.device("rbln2")
    assert (devices / pf.bus_id / "sriov_numvfs").read_text() == "4\n"
    assert (devices / plain.bus_id / "sriov_numvfs").read_text() == "0\n"
    for j in range(4):
        vf = mixed.device(f"rbln0-{j}")
        assert vf.bus_id == f"{pf.bus_id[:-1]}{j + 1}" and vf.parent == "rbln0"
        vf_dir = (devices / vf.bus_id).resolve()
        assert vf_dir.parent == (devices / pf.bus_id).resolve().parent  # beside the PF
        assert os.readlink(devices / vf.bus_id / "physfn") == f"../{pf.bus_id}"
        assert (devices / vf.bus_id / "physfn").resolve() == (devices / pf.bus_id).resolve()
        assert not (devices / vf.bus_id / "sriov_numvfs").exists()
        assert (devices / pf.bus_id / f"virtfn{j}").resolve() == vf_dir
    assert not (devices / plain.bus_id / "physfn").exists()


def test_vfs_beyond_seven_use_the_next_device_numbers(tmp_path):
    node = build_node(tmp_path, NodeSpec((PfSpec(vf_mode=9),)))
    assert [d.bus_id[-4:] for d in node.inventory[1:]] == ["00.1", "00.2", "00.3", "00.4", "00.5", "00.6", "00.7",
                                                           "01.0", "01.1"]


def test_numa_files_and_status(tmp_path):
    node = build_node(tmp_path, NodeSpec((PfSpec(numa_node=1), PfSpec(numa_node=None, vf_mode="vf1"))))
    devices = node.sysfs_root / "bus" / "pci" / "devices"
    assert (devices / node.device("rbln0").bus_id / "numa_node").read_text() == "1\n"
    assert not (devices / node.device("rbln1").bus_id / "numa_node").exists()
    assert not (devices / node.device("rbln1-0").bus_id / "numa_node").exists()
    assert node.status_file("rbln0").read_text() == "0\n"
    assert not node.status_file("rbln1-0").exists()
    node.set_status("rbln1-0", 4)
    assert node.status_file("rbln1-0").read_text() == "4\n"
    node.set_status("rbln0", "n/a")
    assert node.status_file("rbln0").read_text() == "n/a"
    node.set_status("rbln0", b"\x00\xff")
    assert node.status_file("rbln0").read_bytes() == b"\x00\xff"
    node.set_status("rbln0", None)
    assert not node.status_file("rbln0").exists()
    node.set_status("rbln0", None)  # already absent: fine


def test_shared_sids_put_pfs_on_one_card(tmp_path):
    node = build_node(tmp_path, NodeSpec((PfSpec(sid="card-a"), PfSpec(sid="card-a"), PfSpec())))
    sids = {d["device"]: d["sid"] for d in listing(node, "-j")}
    assert sids["rbln0"] == sids["rbln1"] == "card-a" and sids["rbln2"] not in ("card-a", "")


# rbln-smi inventory

def test_inventory_schema(mixed):
    devices = listing(mixed, "-j")
    assert [d["device"] for d in devices] == mixed.devices()
    document = json.loads(smi(mixed, "-j").stdout)
    assert isinstance(document["KMD_version"], str)
    for entry, device in zip(devices, mixed.inventory, strict=True):
        assert entry["npu"] == device.npu and entry["group_id"] == "0" and entry["status"] == "normal"
        assert entry["name"] == "RBLN-CA25" and entry["sid"] == device.sid and entry["uuid"] and entry["fw_ver"]
        assert entry["pci"]["bus_id"] == device.bus_id and entry["pci"]["numa_node"] == "0"
        assert set(entry["pci"]) == {"dev", "bus_id", "numa_node", "link_speed", "link_width"}
        assert set(entry["memory"]) == {"used", "total"} and int(entry["memory"]["total"]) > 0
    assert len({e["uuid"] for e in devices}) == len(devices)


def test_unknown_numa_is_minus_one(tmp_path):
    node = build_node(tmp_path, NodeSpec((PfSpec(numa_node=None),)))
    assert listing(node, "-j")[0]["pci"]["numa_node"] == "-1"


def test_grouped_listing_mixes_types(mixed):
    devices = listing(mixed, "-g", "-j")
    assert [d["device"] for d in devices] == mixed.devices()
    assert {type(d["group_id"]) for d in devices} == {int, str}
    assert {type(d["npu"]) for d in devices} == {int, str}
    assert all(int(d["group_id"]) == 0 and int(d["npu"]) == i for i, d in enumerate(devices))


def test_removed_devices_leave_the_listings_only(mixed):
    mixed.remove_device("rbln2")
    mixed.remove_device("rbln2")
    assert "rbln2" not in [d["device"] for d in listing(mixed, "-j")]
    assert "rbln2" not in [d["device"] for d in listing(mixed, "-g", "-j")]
    assert (mixed.dev_root / "rbln2").exists() and mixed.status_file("rbln2").exists()
    mixed.restore_device("rbln2")
    assert [d["device"] for d in listing(mixed, "-j")] == mixed.devices()
    with pytest.raises(KeyError):
        mixed.remove_device("rbln99")


def test_unknown_command_line_is_a_usage_error(mixed):
    for args in [(), ("-x",), ("group",), ("group", "-c", "1"), ("group", "-d", "1", "-d", "2")]:
        result = smi(mixed, *args)
        assert result.returncode == 2 and "usage" in result.stderr


# RSD groups

def test_group_create_and_destroy(mixed):
    result = change(mixed, "-c", "1", "-a", "2,3")
    assert result.returncode == 0, result.stderr
    assert change(mixed, "-c", "2", "-a", "4").returncode == 0
    assert mixed.rsd_groups() == {0: [0, 1, 5, 6, 7, 8, 9, 10, 11], 1: [2, 3], 2: [4]}
    assert (mixed.dev_root / "rsd1").is_file() and (mixed.dev_root / "rsd2").is_file()
    groups = {d["device"]: int(d["group_id"]) for d in listing(mixed, "-g", "-j")}
    assert groups["rbln2"] == groups["rbln3"] == 1 and groups["rbln0-0"] == 2 and groups["rbln0-1"] == 0
    assert change(mixed, "-d", "1,2").returncode == 0
    assert mixed.rsd_groups() == {0: list(range(12))}
    assert not (mixed.dev_root / "rsd1").exists() and not (mixed.dev_root / "rsd2").exists()
    assert (mixed.dev_root / "rsd0").exists()
    assert mixed.lock_violations() == []


@pytest.mark.parametrize("args,message", [
    (("-d", "0"), "group 0 is the default group"),
    (("-d", "7"), "group 7 does not exist"),
    (("-d", "1,x"), "invalid group id list"),
    (("-c", "0", "-a", "2"), "group id 0 is invalid"),
    (("-c", "5", "-a", "99"), "npu 99 does not exist"),
    (("-c", "5", "-a", "2,2"), "names a device twice"),
    (("-c", "5", "-a", ""), "invalid npu list"),
    (("-c", "5", "-a", "0"), "npu 0 hosts VFs"),
    (("-c", "3", "-a", "2"), "group 3 already exists"),
    (("-c", "5", "-a", "3"), "npu 3 is already in group 3"),
])
def test_group_errors_change_nothing(mixed, args, message):
    assert change(mixed, "-c", "3", "-a", "3").returncode == 0
    before = mixed.rsd_groups()
    result = change(mixed, *args)
    assert result.returncode == 1 and message in result.stderr and result.stdout == ""
    assert mixed.rsd_groups() == before
    assert sorted(p.name for p in mixed.dev_root.glob("rsd*")) == ["rsd0", "rsd3"]


def test_removed_device_cannot_join_a_group(mixed):
    mixed.remove_device("rbln3")
    result = change(mixed, "-c", "1", "-a", "3")
    assert result.returncode == 1 and "npu 3 does not exist" in result.stderr


def test_destroy_is_all_or_nothing(mixed):
    assert change(mixed, "-c", "1", "-a", "2").returncode == 0
    assert change(mixed, "-d", "1,4").returncode == 1
    assert mixed.rsd_groups()[1] == [2]


# Call log and lock discipline

def test_group_change_without_the_flock_is_a_violation(mixed):
    assert smi(mixed, "group", "-c", "1", "-a", "2").returncode == 0
    [violation] = mixed.lock_violations()
    assert violation["argv"] == ["group", "-c", "1", "-a", "2"]
    assert violation["lock_held"] is False and violation["overlap"] is False
    assert change(mixed, "-d", "1").returncode == 0
    assert len(mixed.lock_violations()) == 1


def test_a_missing_lock_file_means_the_lock_was_not_held(mixed):
    mixed.lock_file.unlink()
    assert smi(mixed, "group", "-c", "1", "-a", "2").returncode == 0
    assert mixed.lock_violations()[0]["lock_held"] is False


def test_overlapping_group_changes_are_violations(mixed):
    # Holding the stand-in's change lock is exactly what a concurrent group change does.
    with open(mixed.state_dir / CHANGE_LOCK, "w") as concurrent:
        fcntl.flock(concurrent, fcntl.LOCK_EX)
        assert change(mixed, "-c", "1", "-a", "2").returncode == 0
    [violation] = mixed.lock_violations()
    assert violation["lock_held"] is True and violation["overlap"] is True
    assert change(mixed, "-c", "2", "-a", "3").returncode == 0
    assert len(mixed.lock_violations()) == 1


def test_calls_are_recorded(mixed):
    listing(mixed, "-j")
    change(mixed, "-c", "1", "-a", "2")
    change(mixed, "-d", "9")
    calls = mixed.smi_calls()
    assert [c["command"] for c in calls] == ["inventory", "create", "destroy"]
    assert all(c["start"] <= c["end"] for c in calls)
    assert [c["exit"] for c in calls] == [0, 0, 1] and "group 9 does not exist" in calls[2]["error"]
    assert "lock_held" not in calls[0] and calls[1]["lock_held"] is True


# Faults

def test_hang(mixed):
    mixed.set_smi_fault("hang", commands=["inventory"])
    with subprocess.Popen([str(mixed.rbln_smi), "-j"], stdout=subprocess.PIPE) as proc:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        proc.kill()
    [call] = mixed.smi_calls()
    assert call["fault"] == "hang" and call["end"] is None
    assert listing(mixed, "-g", "-j")  # the other commands still answer


def test_hung_group_change_changes_nothing(mixed):
    mixed.set_smi_fault("hang", commands=["create"])
    with open(mixed.lock_file) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with subprocess.Popen([str(mixed.rbln_smi), "group", "-c", "1", "-a", "2"]) as proc:
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)
            proc.kill()
    assert mixed.rsd_groups() == {0: list(range(12))}


def test_garbage_and_truncated_output(mixed):
    full = smi(mixed, "-j").stdout
    mixed.set_smi_fault("garbage")
    result = smi(mixed, "-j")
    assert result.returncode == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)
    mixed.set_smi_fault("truncated", commands=["groups"])
    assert smi(mixed, "-j").stdout == full
    result = smi(mixed, "-g", "-j")
    assert result.returncode == 0 and 0 < len(result.stdout) < len(full)
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


def test_exit_fault(mixed):
    mixed.set_smi_fault("exit", commands=["create", "inventory"])
    result = smi(mixed, "-j")
    assert result.returncode != 0 and result.stdout == "" and "simulated failure" in result.stderr
    assert change(mixed, "-c", "1", "-a", "2").returncode != 0
    assert mixed.rsd_groups() == {0: list(range(12))}
    mixed.set_smi_fault(None)
    assert smi(mixed, "-j").returncode == 0
    assert change(mixed, "-c", "1", "-a", "2").returncode == 0


def test_slow_fault_delays_then_works(mixed):
    mixed.set_smi_fault("slow", commands=["create"], delay=0.3)
    assert change(mixed, "-c", "1", "-a", "2").returncode == 0
    [call] = mixed.smi_calls()
    assert call["end"] - call["start"] >= 0.3 and mixed.rsd_groups()[1] == [2]


def test_fault_arguments_are_checked(mixed):
    with pytest.raises(ValueError, match="unknown fault"):
        mixed.set_smi_fault("explode")
    with pytest.raises(ValueError, match="unknown rbln-smi commands"):
        mixed.set_smi_fault("hang", commands=["topo"])


def test_a_node_without_devices(tmp_path):
    node = build_node(tmp_path, NodeSpec.parse("0"))
    assert node.devices() == [] and listing(node, "-j") == [] and node.rsd_groups() == {0: []}
