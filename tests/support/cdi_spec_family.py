"""A seeded family of CDI specs: valid ones of every shape the CDI library accepts, and each made invalid by
one mutation from a catalogue of what the library refuses; plus edge cases whose verdict only the library
itself settles (the cross-check of tests/cdi holds shared/cdi/spec.py to it on all of them).

A case is a file name and its bytes, with the verdict expected by construction (None for an edge case) and
the qualified device names a valid one defines.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import yaml

VENDORS = ("rebellions.ai", "example.com", "a", "vendor-x_1", "Z9")
CLASSES = ("npu", "gpu", "c", "net-dev_2")
DOTTED_CLASSES = ("npu.v2", "k8s.x")  # a dot in the class needs cdiVersion 0.6.0
DEVICE_NAMES = ("runtime", "all", "rbln0", "a:b", "x.y-z_1", "R")
DIGIT_NAMES = ("0", "12", "3-a")  # a leading digit needs 0.5.0
HOOKS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    """File name, with its suffix (.json or .yaml)."""
    data: bytes
    valid: bool | None
    """By construction; None where only the library can say."""
    devices: frozenset[str] = frozenset()
    why: str = ""


def _edits(rng: random.Random, needs: set[str]) -> dict[str, Any]:
    """Non-empty container edits; `needs` collects the versions their features require."""
    edits: dict[str, Any] = {}
    kinds = rng.sample(("env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"),
                       rng.randint(1, 3))
    for kind in kinds:
        if kind == "env":
            edits["env"] = [f"RBLN_{i}={rng.choice(('all', '', 'a=b'))}" for i in range(rng.randint(1, 3))]
        elif kind == "deviceNodes":
            node: dict[str, Any] = {"path": f"/dev/rbln{rng.randint(0, 9)}"}
            if rng.random() < 0.5:
                node.update(type=rng.choice(("c", "b", "")), major=rng.randint(0, 511), minor=rng.randint(0, 255))
            if rng.random() < 0.3:
                node["permissions"] = rng.choice(("rw", "rwm", "r", "none"))
            if rng.random() < 0.3:
                node["hostPath"] = "/dev/rsd1"
                needs.add("0.5.0")
            if rng.random() < 0.2:
                node.update(uid=rng.randint(0, 2**32 - 1), gid=0, fileMode=0o660)
            edits["deviceNodes"] = [node]
        elif kind == "mounts":
            mount: dict[str, Any] = {"hostPath": "/usr/bin/rbln-smi", "containerPath": "/usr/bin/rbln-smi",
                                     "options": ["ro", "bind"]}
            if rng.random() < 0.3:
                mount["type"] = "bind"
                needs.add("0.4.0")
            edits["mounts"] = [mount]
        elif kind == "hooks":
            edits["hooks"] = [{"hookName": rng.choice(HOOKS), "path": "/usr/local/bin/rbln-cdi-hook",
                               "args": ["rbln-cdi-hook", "update-ldcache"], "env": ["A=1"]}]
        elif kind == "additionalGids":
            edits["additionalGids"] = [rng.randint(0, 65535)]
            needs.add("0.7.0")
        elif kind == "intelRdt":
            edits["intelRdt"] = {"closID": rng.choice(("clos1", "/"))}
            needs.add("0.7.0")
            if rng.random() < 0.3:
                edits["intelRdt"]["enableMonitoring"] = True
                needs.add("1.1.0")
        else:
            edits["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net1"}]
            needs.add("1.1.0")
    return edits


def valid_spec(rng: random.Random) -> tuple[dict[str, Any], frozenset[str]]:
    """A spec the library accepts, and the qualified names of its devices."""
    needs: set[str] = {"0.3.0"}
    vendor = rng.choice(VENDORS)
    if rng.random() < 0.2:
        device_class = rng.choice(DOTTED_CLASSES)
        needs.add("0.6.0")
    else:
        device_class = rng.choice(CLASSES)
    names = rng.sample(DEVICE_NAMES, rng.randint(1, 3))
    if rng.random() < 0.2:
        names.append(rng.choice(DIGIT_NAMES))
        needs.add("0.5.0")
    spec: dict[str, Any] = {"kind": f"{vendor}/{device_class}", "devices": []}
    for name in names:
        device: dict[str, Any] = {"name": name, "containerEdits": _edits(rng, needs)}
        if rng.random() < 0.15:
            device["annotations"] = {"rebellions.ai/note": "x"}
            needs.add("0.6.0")
        spec["devices"].append(device)
    if rng.random() < 0.5:
        spec["containerEdits"] = _edits(rng, needs)
    if rng.random() < 0.15:
        spec["annotations"] = {"owner": "toolkit"}
        needs.add("0.6.0")
    oldest = max(needs, key=VERSIONS.index)
    version = rng.choice(VERSIONS[VERSIONS.index(oldest):])
    spec = {"cdiVersion": ("v" if rng.random() < 0.1 else "") + version, **spec}
    return spec, frozenset(f"{vendor}/{device_class}={name}" for name in names)


def _device(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["devices"][0]


def _edits_of(spec: dict[str, Any]) -> dict[str, Any]:
    return _device(spec)["containerEdits"]


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        target: Any = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _add_edit(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda spec: _edits_of(spec).__setitem__(key, value)


# What the library refuses, one mutation each: (why, mutation).
MUTATIONS: tuple[tuple[str, Callable[[dict[str, Any]], None]], ...] = (
    ("unknown version", _set(("cdiVersion",), "0.9.0")),
    ("version not semver", _set(("cdiVersion",), "1.0")),
    ("empty version", _set(("cdiVersion",), "")),
    ("below the earliest version", _set(("cdiVersion",), "0.2.0")),
    ("annotations need 0.6.0", lambda s: (s.__setitem__("cdiVersion", "0.5.0"), s.__setitem__("annotations",
                                                                                               {"a": "b"}))),
    ("net devices need 1.1.0", lambda s: (s.__setitem__("cdiVersion", "1.0.0"),
                                          _edits_of(s).__setitem__("netDevices",
                                                                   [{"hostInterfaceName": "e", "name": "n"}]))),
    ("kind without a class", _set(("kind",), "rebellions.ai")),
    ("vendor starting with a digit", _set(("kind",), "1rebellions.ai/npu")),
    ("class with a space", _set(("kind",), "rebellions.ai/n pu")),
    ("class ending with a dash", _set(("kind",), "rebellions.ai/npu-")),
    ("class with a slash", _set(("kind",), "rebellions.ai/npu/x")),
    ("device name with a space", lambda s: _device(s).__setitem__("name", "run time")),
    ("device name starting with a dash", lambda s: _device(s).__setitem__("name", "-runtime")),
    ("device name ending with a colon", lambda s: _device(s).__setitem__("name", "runtime:")),
    ("empty device name", lambda s: _device(s).__setitem__("name", "")),
    ("non-ASCII device name", lambda s: _device(s).__setitem__("name", "runtimé")),
    ("a device twice", lambda s: s["devices"].append(copy.deepcopy(_device(s)))),
    ("no devices", _set(("devices",), [])),
    ("devices missing", lambda s: s.pop("devices")),
    ("a device without edits", lambda s: _device(s).__setitem__("containerEdits", {})),
    ("env without '='", _add_edit("env", ["RBLN_VISIBLE_DEVICES"])),
    ("env with an empty name", _add_edit("env", ["=all"])),
    ("device node without a path", _add_edit("deviceNodes", [{"type": "c"}])),
    ("device node of an unknown type", _add_edit("deviceNodes", [{"path": "/dev/x", "type": "x"}])),
    ("device node with a negative major", _add_edit("deviceNodes", [{"path": "/dev/x", "major": -1}])),
    ("device node with bad permissions", _add_edit("deviceNodes", [{"path": "/dev/x", "permissions": "rwx"}])),
    ("a null device node", _add_edit("deviceNodes", [None])),
    ("hook of an unknown name", _add_edit("hooks", [{"hookName": "preStart", "path": "/bin/true"}])),
    ("hook without a path", _add_edit("hooks", [{"hookName": "prestart"}])),
    ("mount without a host path", _add_edit("mounts", [{"containerPath": "/x"}])),
    ("mount without a container path", _add_edit("mounts", [{"hostPath": "/x"}])),
    ("intelRdt closID '..'", lambda s: (s.__setitem__("cdiVersion", "1.1.0"),
                                        _edits_of(s).__setitem__("intelRdt", {"closID": ".."}))),
    ("net devices with one host interface twice", lambda s: (s.__setitem__("cdiVersion", "1.1.0"), _edits_of(
        s).__setitem__("netDevices", [{"hostInterfaceName": "e", "name": "a"}, {"hostInterfaceName": "e",
                                                                               "name": "b"}]))),
    ("negative additional gid", lambda s: (s.__setitem__("cdiVersion", "0.7.0"),
                                           _edits_of(s).__setitem__("additionalGids", [-1]))),
    ("unknown top-level key", _set(("containerEdit",), {"env": ["A=1"]})),
    ("unknown device key", lambda s: _device(s).__setitem__("edits", {"env": ["A=1"]})),
    ("unknown edits key", _add_edit("devices", [])),
    ("devices as a mapping", lambda s: s.__setitem__("devices", {"runtime": _device(s)})),
    ("env as a string", _add_edit("env", "A=1")),
    ("device name as a list", lambda s: _device(s).__setitem__("name", ["runtime"])),
    ("major as a string", _add_edit("deviceNodes", [{"path": "/dev/x", "major": "1"}])),
    ("uid out of range", _add_edit("deviceNodes", [{"path": "/dev/x", "uid": 2**32}])),
    ("kind as a mapping", _set(("kind",), {"vendor": "rebellions.ai"})),
)

# Whole files the library refuses, whatever their spec would have been.
BROKEN_FILES: tuple[tuple[str, str, bytes], ...] = (
    ("empty file", "yaml", b""),
    ("null document", "yaml", b"null\n"),
    ("a list, not a spec", "json", b"[1, 2]\n"),
    ("not YAML", "yaml", b"cdiVersion: [0.5.0\n"),
    ("truncated JSON", "json", b'{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", "devices": [\n'),
    ("a key twice", "yaml", b"cdiVersion: 0.5.0\ncdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices:\n"
                            b"- name: runtime\n  containerEdits:\n    env: [A=1]\n"),
    ("a JSON key twice", "json", b'{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", "kind": "a/b", '
                                 b'"devices": [{"name": "runtime", "containerEdits": {"env": ["A=1"]}}]}'),
    ("not UTF-8", "yaml", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\xff\n"),
)

# What only the library can settle: the decoder's way with scalars and documents.
EDGE_FILES: tuple[tuple[str, str, bytes], ...] = (
    ("an integer device name", "yaml", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\ndevices:\n- name: 123\n"
                                       b"  containerEdits:\n    env: [A=1]\n"),
    ("a JSON integer device name", "json", b'{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", '
                                           b'"devices": [{"name": 7, "containerEdits": {"env": ["A=1"]}}]}'),
    ("a boolean device name", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ndevices:\n- name: yes\n"
                                      b"  containerEdits:\n    env: [A=1]\n"),
    ("a float version", "yaml", b"cdiVersion: 0.5\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                                b"  containerEdits:\n    env: [A=1]\n"),
    ("a float major", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                              b"  containerEdits:\n    deviceNodes: [{path: /dev/x, major: 1.0, minor: 0x10}]\n"),
    ("an octal minor", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                               b"  containerEdits:\n    deviceNodes: [{path: /dev/x, minor: 010}]\n"),
    ("a fractional major", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                                   b"  containerEdits:\n    deviceNodes: [{path: /dev/x, major: 1.5}]\n"),
    ("yes for a boolean", "yaml", b"cdiVersion: 1.1.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                                  b"  containerEdits:\n    intelRdt: {enableMonitoring: yes}\n"),
    ("a second document of junk", "yaml", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\ndevices:\n"
                                          b"- name: runtime\n  containerEdits:\n    env: [A=1]\n---\njunk: [\n"),
    ("YAML in a .json file", "json", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                                     b"  containerEdits:\n    env: [A=1]\n"),
    ("a null path", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                            b"  containerEdits:\n    deviceNodes: [{path: ~}]\n"),
    ("a quoted null path", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                                   b"  containerEdits:\n    deviceNodes: [{path: 'null'}]\n"),
    ("null edits", "yaml", b"cdiVersion: 0.3.0\nkind: rebellions.ai/npu\ncontainerEdits: null\ndevices:\n"
                           b"- name: runtime\n  containerEdits:\n    env: [A=1]\n"),
    ("a merge key", "yaml", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
                            b"  containerEdits: &e\n    env: [A=1]\n- name: all\n  containerEdits:\n    <<: *e\n"
                            b"    hooks: [{hookName: prestart, path: /x}]\n"),
    ("a merged device", "yaml", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\ndevices:\n- &d\n  name: runtime\n"
                                b"  containerEdits: {env: [A=1]}\n- <<: *d\n  name: all\n"),
    ("a merge of a list", "yaml", b"cdiVersion: 0.5.0\nkind: rebellions.ai/npu\ndevices:\n- &d\n  name: runtime\n"
                                  b"  containerEdits: {env: [A=1]}\n- <<: [*d]\n"),
    ("a JSON boolean device name", "json", b'{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", '
                                           b'"devices": [{"name": true, "containerEdits": {"env": ["A=1"]}}]}'),
    ("the toolkit's spec", "yaml", b"---\ncdiVersion: 0.5.0\nkind: rebellions.ai/npu\ncontainerEdits:\n"
                                   b"  env: [RBLN_VISIBLE_DEVICES=all]\n  hooks:\n  - hookName: createContainer\n"
                                   b"    path: /usr/local/bin/rbln-cdi-hook\n"
                                   b"    args: [rbln-cdi-hook, update-ldcache]\n"
                                   b"devices:\n- name: runtime\n  containerEdits:\n    mounts:\n"
                                   b"    - hostPath: /usr/bin/rbln-smi\n      containerPath: /usr/bin/rbln-smi\n"
                                   b"      options: [ro, nosuid, nodev, bind]\n- name: all\n  containerEdits:\n"
                                   b"    env: [RBLN_VISIBLE_DEVICES=all]\n"),
)


def encode(spec: Any, suffix: str) -> bytes:
    if suffix == "json":
        return json.dumps(spec).encode()
    return yaml.safe_dump(spec, sort_keys=False).encode()


def family(seed: int, count: int) -> Iterator[Case]:
    """`count` valid specs and as many mutated ones, then the broken and edge files."""
    rng = random.Random(seed)
    for index in range(count):
        spec, devices = valid_spec(rng)
        suffix = rng.choice(("json", "yaml"))
        yield Case(f"valid-{index}.{suffix}", encode(spec, suffix), True, devices)
        why, mutate = MUTATIONS[index % len(MUTATIONS)] if index < len(MUTATIONS) else rng.choice(MUTATIONS)
        broken = copy.deepcopy(spec)
        mutate(broken)
        yield Case(f"invalid-{index}.{suffix}", encode(broken, suffix), False, why=why)
    for index, (why, suffix, data) in enumerate(BROKEN_FILES):
        yield Case(f"broken-{index}.{suffix}", data, False, why=why)
    for index, (why, suffix, data) in enumerate(EDGE_FILES):
        yield Case(f"edge-{index}.{suffix}", data, None, why=why)
