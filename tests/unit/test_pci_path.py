import os

import pytest

from scanner.pci_path import PciPaths

DEVICE = "0000:03:00.0"
GOOD = ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", DEVICE)


def _device_dir(sysfs, *segments):
    path = sysfs.joinpath("devices", *segments)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _link(sysfs, bus_id, target):
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    link = links / bus_id
    # Relative, as the kernel makes them.
    link.symlink_to(os.path.relpath(target, links))
    return link


def test_good_path_gives_segments_from_root_to_device(tmp_path):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, *GOOD))
    assert PciPaths(tmp_path).resolve(DEVICE) == GOOD


def test_device_directly_below_root_port(tmp_path):
    segments = ("pci0000:80", "0000:80:01.0", "0000:81:00.0")
    _link(tmp_path, "0000:81:00.0", _device_dir(tmp_path, *segments))
    assert PciPaths(tmp_path).resolve("0000:81:00.0") == segments


def test_bus_id_compared_without_case(tmp_path):
    segments = ("pci0000:00", "0000:00:01.0", "0000:0A:00.0")
    _link(tmp_path, "0000:0a:00.0", _device_dir(tmp_path, *segments))
    assert PciPaths(tmp_path).resolve("0000:0a:00.0") == segments


def test_sysfs_root_reached_through_a_symlink(tmp_path):
    real = tmp_path / "real"
    _link(real, DEVICE, _device_dir(real, *GOOD))
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    assert PciPaths(alias).resolve(DEVICE) == GOOD


@pytest.mark.parametrize("bus_id", ["", "0000:03:00", "0000:03:00.8", "zzzz:03:00.0", "03:00.0",
                                    "0000:03:00.0/..", "../../../etc", "0000:003:00.0", " 0000:03:00.0",
                                    "0000:03:00.0\n"])
def test_malformed_bus_id(tmp_path, bus_id):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, *GOOD))
    assert PciPaths(tmp_path).resolve(bus_id) is None


def test_trailing_newline_in_names(tmp_path):
    # "$" would also match before a final newline; such names are not addresses.
    device = DEVICE + "\n"
    _link(tmp_path, device, _device_dir(tmp_path, "pci0000:00", "0000:00:01.0", device))
    assert PciPaths(tmp_path).resolve(device) is None


def test_missing_device_link(tmp_path):
    _device_dir(tmp_path, *GOOD)
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_dangling_device_link(tmp_path):
    _link(tmp_path, DEVICE, tmp_path.joinpath("devices", *GOOD))
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_path_outside_sysfs_devices(tmp_path):
    elsewhere = tmp_path / "elsewhere" / "pci0000:00" / DEVICE
    elsewhere.mkdir(parents=True)
    _link(tmp_path / "sys", DEVICE, elsewhere)
    assert PciPaths(tmp_path / "sys").resolve(DEVICE) is None


def test_path_escaping_through_dotdot_components(tmp_path):
    (tmp_path / "sys" / "devices").mkdir(parents=True)
    escape = tmp_path / "pci0000:00" / DEVICE
    escape.mkdir(parents=True)
    links = tmp_path / "sys" / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / DEVICE).symlink_to(f"../../../devices/../../pci0000:00/{DEVICE}")
    assert PciPaths(tmp_path / "sys").resolve(DEVICE) is None


def test_a_link_whose_text_names_another_directory_than_it_leads_to(tmp_path):
    """`sub/..` cancels as text, but the kernel follows `sub` first and ends one level higher:
    the device directory it reaches (outside sysfs) is not the one the text names (inside)."""
    sysfs = tmp_path / "sys"
    _device_dir(sysfs, *GOOD)
    _device_dir(tmp_path, *GOOD)
    links = sysfs / "bus" / "pci" / "devices"
    deeper = sysfs / "x" / "y" / "z"
    deeper.mkdir(parents=True)
    links.mkdir(parents=True)
    (links / "sub").symlink_to(deeper)
    (links / DEVICE).symlink_to("sub/../../../../devices/" + "/".join(GOOD))
    assert os.path.samefile(links / DEVICE, tmp_path.joinpath("devices", *GOOD))
    assert PciPaths(sysfs).resolve(DEVICE) is None


def test_a_scan_resolves_many_devices_under_one_root(tmp_path):
    other = ("pci0000:80", "0000:80:01.0", "0000:81:00.0")
    _link(tmp_path, DEVICE, _device_dir(tmp_path, *GOOD))
    _link(tmp_path, "0000:81:00.0", _device_dir(tmp_path, *other))
    paths = PciPaths(tmp_path)
    assert [paths.resolve(DEVICE), paths.resolve("0000:81:00.0"), paths.resolve("0000:82:00.0")] == [GOOD, other, None]


@pytest.mark.parametrize("segments", [
    ("platform", DEVICE),                              # no PCI root segment
    (DEVICE,),                                         # device straight below devices/
    ("pci0000", "0000:00:01.0", DEVICE),               # root segment malformed
    ("pcixxxx:00", "0000:00:01.0", DEVICE),
])
def test_no_pci_root_below_devices(tmp_path, segments):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, *segments))
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_link_to_the_root_itself(tmp_path):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, "pci0000:00"))
    assert PciPaths(tmp_path).resolve(DEVICE) is None


@pytest.mark.parametrize("intruder", ["usb1", "0000:01:00", "virtual", "0000:01:00.0x"])
def test_non_bdf_segment_between_root_and_device(tmp_path, intruder):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, "pci0000:00", "0000:00:01.0", intruder, DEVICE))
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_last_segment_is_another_device(tmp_path):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, "pci0000:00", "0000:00:01.0", "0000:04:00.0"))
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_file_instead_of_directory(tmp_path):
    parent = _device_dir(tmp_path, *GOOD[:-1])
    target = parent / DEVICE
    target.write_text("not a device\n")
    _link(tmp_path, DEVICE, target)
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_symlink_loop(tmp_path):
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (tmp_path / "devices").mkdir()
    (links / DEVICE).symlink_to("loop")
    (links / "loop").symlink_to(DEVICE)
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_symlink_loop_inside_devices(tmp_path):
    bridge = _device_dir(tmp_path, "pci0000:00", "0000:00:01.0")
    (bridge / DEVICE).symlink_to(DEVICE)
    _link(tmp_path, DEVICE, bridge / DEVICE)
    assert PciPaths(tmp_path).resolve(DEVICE) is None


def test_missing_sysfs_root(tmp_path):
    assert PciPaths(tmp_path / "absent").resolve(DEVICE) is None


def test_unreadable_path_affects_only_that_device(tmp_path):
    _link(tmp_path, DEVICE, _device_dir(tmp_path, *GOOD))
    _link(tmp_path, "0000:04:00.0", _device_dir(tmp_path, "platform", "0000:04:00.0"))
    assert PciPaths(tmp_path).resolve("0000:04:00.0") is None
    assert PciPaths(tmp_path).resolve(DEVICE) == GOOD
