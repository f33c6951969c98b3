"""CDI specs as the CDI reference library reads them (the Go library containerd and CRI-O link), as plain
functions on plain data: is a spec valid, which devices does it define, and does a set of specs resolve a
qualified device name (`vendor/class=name`).

A spec arrives as a tree of dicts, lists, `Scalar`s and None (a YAML null), made by shared/cdi/spec_dirs.py
from a JSON or YAML file. The library decodes every spec with a strict YAML decoder into Go structs: an
unknown or repeated key, a list where a scalar belongs, a quoted number where an integer belongs, all make
the whole file invalid, and so they do here. What a valid spec still has to satisfy follows the library's
checks: a known `cdiVersion`, at least the version the spec's features need, a `kind` of valid vendor and
class names, valid container edits, and devices with valid, distinct names and edits of their own.

Resolving follows the library's cache: the valid specs of every directory define devices; a device that two
specs of one directory define is a conflict, and the library then drops it altogether.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any


class SpecError(ValueError):
    """The spec is not one the CDI library accepts; the message says what is wrong, as the library would."""


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A scalar as written: its text, and whether it was quoted (a quoted scalar is always a string)."""

    text: str
    quoted: bool = False


Tree = Any  # dict[str, Tree] | list[Tree] | Scalar | None

# The versions the library knows, newest first, and the oldest one a spec may still declare.
VERSIONS = ("1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0")
EARLIEST_VERSION = "0.3.0"
HOOK_NAMES = frozenset({"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"})
DEVICE_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})
NO_PERMISSIONS = "none"

# -- decoding: the Go structs of the spec, as a strict YAML decoder fills them -----------------------------

_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?")
_TRUE = frozenset({"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y"})
_FALSE = frozenset({"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N"})
Decoder = Callable[[Tree, str], Any]


def _string(value: Tree, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, Scalar):
        raise SpecError(f"{where}: expected a string")
    return value.text


def _integer_value(text: str) -> int | None:
    """A plain scalar's integer, as the decoder reads one into an integer field: a YAML integer, or a
    float cut to its integer part; None if it is neither."""
    try:
        if _INT.fullmatch(text):
            digits = text.lstrip("+-").replace("_", "")
            if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
                digits = "0o" + digits[1:]  # YAML 1.1's octal, which the decoder still reads
            return int(digits, 0) * (-1 if text.startswith("-") else 1)
        if _FLOAT.fullmatch(text):
            return int(float(text.replace("_", "")))
    except (ValueError, OverflowError):
        pass
    return None


def _integer(low: int, high: int) -> Decoder:
    def decode(value: Tree, where: str) -> int:
        if value is None:
            return 0
        if not isinstance(value, Scalar) or value.quoted:
            raise SpecError(f"{where}: expected an integer")
        number = _integer_value(value.text)
        if number is None:
            raise SpecError(f"{where}: {value.text[:40]!r} is not an integer")
        if not low <= number <= high:
            raise SpecError(f"{where}: {number} is out of range")
        return number

    return decode


_INT64 = _integer(-(2**63), 2**63 - 1)
_UINT32 = _integer(0, 2**32 - 1)


def _boolean(value: Tree, where: str) -> bool:
    if value is None:
        return False
    if isinstance(value, Scalar) and not value.quoted and value.text in _TRUE | _FALSE:
        return value.text in _TRUE
    raise SpecError(f"{where}: expected a boolean")


def _list_of(item: Decoder) -> Decoder:
    def decode(value: Tree, where: str) -> list[Any] | None:
        if value is None:
            return None
        if not isinstance(value, list):
            raise SpecError(f"{where}: expected a list")
        return [item(entry, f"{where}[{index}]") for index, entry in enumerate(value)]

    return decode


def _string_map(value: Tree, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping")
    return {key: _string(entry, f"{where}.{key}") for key, entry in value.items()}


def _struct(fields: Mapping[str, Decoder], pointer: bool = False) -> Decoder:
    """A Go struct (or, with `pointer`, a pointer to one, which a null leaves nil): every key must be a field."""
    def decode(value: Tree, where: str) -> dict[str, Any] | None:
        if value is None:
            return None if pointer else {name: field(None, f"{where}.{name}") for name, field in fields.items()}
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected a mapping")
        unknown = [key for key in value if key not in fields]
        if unknown:
            raise SpecError(f"{where}: field {unknown[0][:40]!r} is not a field of a CDI spec here")
        return {name: field(value.get(name), f"{where}.{name}") for name, field in fields.items()}

    return decode


def _optional(decode: Decoder) -> Decoder:
    """A pointer to a scalar: None when absent or null."""
    return lambda value, where: None if value is None else decode(value, where)


_STRINGS = _list_of(_string)
_DEVICE_NODE = _struct({"path": _string, "hostPath": _string, "type": _string, "major": _INT64, "minor": _INT64,
                        "fileMode": _optional(_UINT32), "permissions": _string, "uid": _optional(_UINT32),
                        "gid": _optional(_UINT32)}, pointer=True)
_MOUNT = _struct({"hostPath": _string, "containerPath": _string, "options": _STRINGS, "type": _string},
                 pointer=True)
_HOOK = _struct({"hookName": _string, "path": _string, "args": _STRINGS, "env": _STRINGS,
                 "timeout": _optional(_INT64)}, pointer=True)
_INTEL_RDT = _struct({"closID": _string, "l3CacheSchema": _string, "memBwSchema": _string, "schemata": _STRINGS,
                      "enableMonitoring": _boolean}, pointer=True)
_NET_DEVICE = _struct({"hostInterfaceName": _string, "name": _string}, pointer=True)
_EDITS = _struct({"env": _STRINGS, "deviceNodes": _list_of(_DEVICE_NODE), "netDevices": _list_of(_NET_DEVICE),
                  "hooks": _list_of(_HOOK), "mounts": _list_of(_MOUNT), "intelRdt": _INTEL_RDT,
                  "additionalGids": _list_of(_UINT32)})
_DEVICE = _struct({"name": _string, "annotations": _string_map, "containerEdits": _EDITS})
_SPEC = _struct({"cdiVersion": _string, "kind": _string, "annotations": _string_map,
                 "devices": _list_of(_DEVICE), "containerEdits": _EDITS})

# -- names -------------------------------------------------------------------------------------------------


def _is_letter(char: str) -> bool:
    return "a" <= char <= "z" or "A" <= char <= "Z"


def _is_alphanumeric(char: str) -> bool:
    return _is_letter(char) or "0" <= char <= "9"


def _name_error(name: str, first: Callable[[str], bool], inner: str, what: str) -> str | None:
    if not name:
        return f"empty {what}"
    if not first(name[0]):
        return f"{what} {name[:80]!r} starts with neither a letter nor a digit" if first is _is_alphanumeric \
            else f"{what} {name[:80]!r} does not start with a letter"
    if len(name) > 1:
        bad = next((c for c in name[1:-1] if not (_is_alphanumeric(c) or c in inner)), None)
        if bad is not None:
            return f"{what} {name[:80]!r} has the character {bad!r}"
        if not _is_alphanumeric(name[-1]):
            return f"{what} {name[:80]!r} does not end with a letter or digit"
    return None


def vendor_or_class_error(name: str, what: str) -> str | None:
    """Why the CDI library refuses `name` as a vendor or class name, or None."""
    return _name_error(name, _is_letter, "_-.", what)


def device_name_error(name: str) -> str | None:
    """Why the CDI library refuses `name` as a device name, or None."""
    return _name_error(name, _is_alphanumeric, "_-.:", "device name")


def split_kind(kind: str) -> tuple[str, str]:
    """(vendor, class) of a spec's kind, cut at its first `/` as the library cuts it; vendor '' without one."""
    vendor, slash, device_class = kind.partition("/")
    return (vendor, device_class) if slash and vendor and device_class else ("", kind)


def parse_qualified_name(device: str) -> tuple[str, str, str]:
    """(vendor, class, name) of a qualified CDI device name `vendor/class=name`; SpecError if it is not one."""
    qualifier, equals, name = device.partition("=")
    vendor, device_class = split_kind(qualifier) if equals and qualifier and name and device[0] != "/" \
        else ("", "")
    for error in (vendor_or_class_error(vendor, "vendor"), vendor_or_class_error(device_class, "class"),
                  device_name_error(name)):
        if error is not None:
            raise SpecError(f"{device[:120]!r} is not a qualified CDI device name: {error}")
    return vendor, device_class, name


# -- validation ------------------------------------------------------------------------------------------


def _all_edits(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec["containerEdits"], *(device["containerEdits"] for device in spec["devices"] or ())]


def required_version(spec: dict[str, Any]) -> str:
    """The oldest cdiVersion that has every feature the spec uses."""
    edits = _all_edits(spec)
    rdts = [e["intelRdt"] for e in edits if e["intelRdt"] is not None]
    devices = spec["devices"] or []
    if any(r["schemata"] is not None or r["enableMonitoring"] for r in rdts) or any(e["netDevices"] for e in edits):
        return "1.1.0"
    if rdts or any(e["additionalGids"] for e in edits):
        return "0.7.0"
    if spec["annotations"] or any(d["annotations"] for d in devices) or "." in spec["kind"].partition("/")[2]:
        return "0.6.0"
    if any(d["name"][:1].isdigit() and d["name"][:1].isascii() for d in devices) or \
            any(node["hostPath"] for e in edits for node in e["deviceNodes"] or () if node is not None):
        return "0.5.0"
    if any(mount["type"] for e in edits for mount in e["mounts"] or () if mount is not None):
        return "0.4.0"
    return EARLIEST_VERSION


def _check_version(spec: dict[str, Any]) -> None:
    declared = spec["cdiVersion"].removeprefix("v")
    if declared not in VERSIONS:
        raise SpecError(f"invalid cdiVersion {spec['cdiVersion'][:40]!r}")
    needed = required_version(spec)
    if VERSIONS.index(needed) < VERSIONS.index(declared):
        raise SpecError(f"cdiVersion {declared} is too old: the spec needs at least {needed}")


def _env_error(env: Iterable[str] | None) -> str | None:
    return next((f"invalid environment variable {v[:80]!r}" for v in env or () if v.find("=") <= 0), None)


def _edits_error(edits: dict[str, Any]) -> str | None:
    """Why the library refuses these container edits, or None; in the library's order of checks."""
    errors: list[str | None] = [_env_error(edits["env"])]
    for node in edits["deviceNodes"] or ():
        errors.append("a device node is null" if node is None else
                      "a device node has an empty path" if not node["path"] else
                      f"device node {node['path'][:80]!r} has the invalid type {node['type'][:8]!r}"
                      if node["type"] not in DEVICE_NODE_TYPES else
                      f"device node {node['path'][:80]!r} has a negative device number"
                      if node["major"] < 0 or node["minor"] < 0 else
                      f"device node {node['path'][:80]!r} has invalid permissions {node['permissions'][:8]!r}"
                      if node["permissions"] not in ("", NO_PERMISSIONS) and node["permissions"].strip("rwm")
                      else None)
    for hook in edits["hooks"] or ():
        errors.append("a hook is null" if hook is None else
                      f"invalid hook name {hook['hookName'][:40]!r}" if hook["hookName"] not in HOOK_NAMES else
                      f"hook {hook['hookName']!r} has an empty path" if not hook["path"] else
                      _env_error(hook["env"]))
    for mount in edits["mounts"] or ():
        errors.append("a mount is null" if mount is None else
                      "a mount has an empty host path" if not mount["hostPath"] else
                      "a mount has an empty container path" if not mount["containerPath"] else None)
    rdt = edits["intelRdt"]
    if rdt is not None and rdt["closID"] != "/" and (len(rdt["closID"]) >= 4096 or rdt["closID"] in (".", "..")
                                                     or "/" in rdt["closID"] or "\n" in rdt["closID"]):
        errors.append("invalid intelRdt closID")
    hosts: set[str] = set()
    names: set[str] = set()
    for net in edits["netDevices"] or ():
        errors.append("a net device is null" if net is None else
                      "a net device has an empty hostInterfaceName" if not net["hostInterfaceName"] else
                      "a net device has an empty name" if not net["name"] else
                      f"net device host interface {net['hostInterfaceName'][:40]!r} is named twice"
                      if net["hostInterfaceName"] in hosts else
                      f"net device name {net['name'][:40]!r} is used twice" if net["name"] in names else None)
        if net is not None:
            hosts.add(net["hostInterfaceName"])
            names.add(net["name"])
    return next((error for error in errors if error is not None), None)


def _edits_empty(edits: dict[str, Any]) -> bool:
    return not any(edits[key] for key in ("env", "deviceNodes", "hooks", "mounts", "additionalGids",
                                          "netDevices")) and edits["intelRdt"] is None


@dataclasses.dataclass(frozen=True)
class SpecDevices:
    """What a valid spec defines: its kind and its devices' qualified names."""

    kind: str
    devices: frozenset[str]


def check_spec(tree: Tree) -> SpecDevices:
    """The devices a spec defines; SpecError if the CDI library would refuse the spec."""
    if tree is None:
        raise SpecError("no spec data")
    spec = _SPEC(tree, "spec")
    assert spec is not None
    vendor, device_class = split_kind(spec["kind"])
    _check_version(spec)
    kind_error = vendor_or_class_error(vendor, "vendor") or vendor_or_class_error(device_class, "class")
    if kind_error is not None:
        raise SpecError(f"kind {spec['kind'][:80]!r}: {kind_error}")
    edits_error = _edits_error(spec["containerEdits"])
    if edits_error is not None:
        raise SpecError(edits_error)
    names: set[str] = set()
    for device in spec["devices"] or ():
        name = device["name"]
        error = device_name_error(name) or \
            ("the device has empty container edits" if _edits_empty(device["containerEdits"]) else None) or \
            _edits_error(device["containerEdits"]) or (f"device {name!r} is defined twice" if name in names else None)
        if error is not None:
            raise SpecError(f"device {name[:80]!r}: {error}")
        names.add(name)
    if not names:
        raise SpecError("the spec defines no device")
    return SpecDevices(spec["kind"], frozenset(f"{vendor}/{device_class}={name}" for name in names))


# -- resolving -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadedSpec:
    """One spec file as read: its path, the index of its directory among the spec dirs, and either the
    devices it defines or why it is refused."""

    path: str
    dir_index: int
    devices: SpecDevices | None = None
    error: str | None = None


def load(path: str, dir_index: int, tree: Tree) -> LoadedSpec:
    try:
        return LoadedSpec(path, dir_index, devices=check_spec(tree))
    except SpecError as exc:
        return LoadedSpec(path, dir_index, error=str(exc))


@dataclasses.dataclass(frozen=True)
class Resolution:
    device: str
    defined_in: tuple[str, ...]
    """The valid specs that define the device."""
    conflict: tuple[str, ...] = ()
    """Specs of one directory that both define it: the library then resolves it nowhere."""

    @property
    def resolvable(self) -> bool:
        return bool(self.defined_in) and not self.conflict


def resolve(device: str, specs: Iterable[LoadedSpec]) -> Resolution:
    """Whether the library's cache over these specs resolves `device`. Specs of a later directory override
    those of an earlier one, but two specs of the same directory defining it are a conflict that removes the
    device whatever the other directories hold."""
    defining = [spec for spec in specs if spec.devices is not None and device in spec.devices.devices]
    by_dir: dict[int, list[str]] = {}
    for spec in defining:
        by_dir.setdefault(spec.dir_index, []).append(spec.path)
    conflict = next((tuple(sorted(paths)) for paths in by_dir.values() if len(paths) > 1), ())
    return Resolution(device, tuple(spec.path for spec in defining), conflict)
