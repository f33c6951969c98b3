"""The per-claim CDI spec: one CDI device per allocated device, named `<claimUID>-<device>`, written
atomically into CDI_ROOT at Prepare and removed at Unprepare (docs/dra.md#prepare-and-unprepare).

Kind `k8s.npu.rebellions.ai/npu` as the Go driver's, file `k8s.npu.rebellions.ai-npu_<claimUID>.json`: the
claim UID in every name keeps a runtime's CDI cache from ever serving a stale device.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

from shared.cdi.spec import check_spec
from shared.cdi.spec_dirs import parse_spec_text
from shared.config import DRA_DRIVER
from shared.fs.atomic_file import write_atomically
from shared.node.device_nodes import DeviceNode

VENDOR = f"k8s.{DRA_DRIVER}"
CLASS = "npu"
KIND = f"{VENDOR}/{CLASS}"
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
