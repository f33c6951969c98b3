"""The per-claim CDI spec: one CDI device per allocated device, named `<claimUID>-<device>`, written
atomically into CDI_ROOT at Prepare and removed at Unprepare (docs/dra.md#prepare-and-unprepare).

Kind `k8s.npu.rebellions.ai/npu` as the Go driver's, file `k8s.npu.rebellions.ai-npu_<claimUID>.json`: the
claim UID in every name keeps a runtime's CDI cache from ever serving a stale device.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from shared.atomic_file import write_atomically
from shared.cdi_spec import check_spec
from shared.cdi_spec_dirs import parse_spec_text
from shared.config import DRA_DRIVER
from shared.device_nodes import CONTAINER_RSD_PATH, DeviceNode

VENDOR = f"k8s.{DRA_DRIVER}"
CLASS = "npu"
KIND = f"{VENDOR}/{CLASS}"
_SPEC_PREFIX = f"{VENDOR}-{CLASS}_"
_RSD_HOST_PATH = re.compile(r"/dev/rsd([0-9]+)")
# Host paths of device nodes, and device names that may start with a digit (a UID's), came in CDI 0.5.0.
CDI_VERSION = "0.5.0"


def device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_name(claim_uid: str, device: str) -> str:
    return f"{KIND}={device_name(claim_uid, device)}"


def spec_path(cdi_root: pathlib.Path, claim_uid: str) -> pathlib.Path:
    return cdi_root / f"{VENDOR}-{CLASS}_{claim_uid}.json"


def claim_spec(claim_uid: str, nodes: dict[str, Sequence[DeviceNode]]) -> dict:
    """The spec of one claim: for each device its own device nodes (the claim's RSD group among them)."""
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": [
        {"name": device_name(claim_uid, device), "containerEdits": {"deviceNodes": [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions} for n in device_nodes]}}
        for device, device_nodes in sorted(nodes.items())]}


def write_claim_spec(cdi_root: pathlib.Path, claim_uid: str, nodes: dict[str, Sequence[DeviceNode]]) -> pathlib.Path:
    """Write the claim's spec, checked as the CDI library would read it first; OSError or SpecError."""
    text = json.dumps(claim_spec(claim_uid, nodes), indent=1).encode()
    check_spec(parse_spec_text(text))
    path = spec_path(cdi_root, claim_uid)
    cdi_root.mkdir(parents=True, exist_ok=True)
    # Not flushed to disk: CDI_ROOT is /var/run/cdi, a tmpfs, and a spec outliving a reboot would name an RSD
    # group that no longer exists. The rename alone makes it appear whole to a runtime.
    write_atomically(path, text, mode=0o644, durable=False)
    return path


def remove_claim_spec(cdi_root: pathlib.Path, claim_uid: str) -> None:
    spec_path(cdi_root, claim_uid).unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class ClaimSpec:
    """What a claim's spec on the node says: which devices the claim has and which RSD group they share."""

    path: pathlib.Path
    claim_uid: str
    devices: tuple[str, ...]
    rsd_group: int | None
    """None for an admin-access claim's spec: its devices' own nodes only."""


def claim_spec_paths(cdi_root: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """(claim UID, path) of every claim spec in CDI_ROOT."""
    for path in sorted(cdi_root.glob(f"{_SPEC_PREFIX}*.json")):
        yield path.name.removeprefix(_SPEC_PREFIX).removesuffix(".json"), path


def read_claim_spec(path: pathlib.Path, claim_uid: str) -> ClaimSpec:
    """A spec `write_claim_spec` wrote, read back; OSError, or ValueError naming what is not as it wrote it."""
    spec = json.loads(path.read_bytes())
    try:
        return _claim_spec_of(path, claim_uid, spec)
    except (AttributeError, TypeError) as exc:  # a part that is not the JSON type the spec has there
        raise ValueError(f"malformed: {type(exc).__name__}: {exc}") from None


def _claim_spec_of(path: pathlib.Path, claim_uid: str, spec: Any) -> ClaimSpec:
    if not isinstance(spec, dict) or spec.get("kind") != KIND:
        raise ValueError(f"not a spec of kind {KIND}")
    devices, groups = [], set()
    for device in spec.get("devices") or []:
        name = str(device.get("name"))
        if not name.startswith(f"{claim_uid}-"):
            raise ValueError(f"device {name!r} is not one of claim {claim_uid}")
        devices.append(name.removeprefix(f"{claim_uid}-"))
        for node in (device.get("containerEdits") or {}).get("deviceNodes") or []:
            found = _RSD_HOST_PATH.fullmatch(str(node.get("hostPath")))
            if node.get("path") == CONTAINER_RSD_PATH and found:
                groups.add(int(found.group(1)))
    if not devices or len(groups) > 1:
        raise ValueError(f"{len(devices)} devices in {len(groups)} RSD groups, not one group or none")
    return ClaimSpec(path, claim_uid, tuple(sorted(devices)), groups.pop() if groups else None)
