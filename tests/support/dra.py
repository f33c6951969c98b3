"""What the worker-dra unit tests share: a simulated node's inventory as worker-dra sees it, and claims."""

from __future__ import annotations

import pathlib
from typing import Any

from dra_worker.inventory import InventoryState
from scanner.discovery import scan
from shared.channels import inventory_protocol
from shared.config import DRA_DRIVER
from shared.node.rbln_smi import RblnSmi
from simulator.node import NodeSpec, PfSpec, SimulatedNode, build_node

NODE = "node-a"


def simulated_node(tmp_path: pathlib.Path, spec: NodeSpec | None = None) -> SimulatedNode:
    return build_node(tmp_path / "node", spec or NodeSpec((PfSpec(), PfSpec(), PfSpec(vf_mode="vf4"))))


def feed(state: InventoryState, node: SimulatedNode, seq: int = 1, cdi_resolvable: bool = True) -> None:
    """One scan of the node, handed in as the scanner's three snapshots would be."""
    result = scan(RblnSmi(node.rbln_smi), node.sysfs_root)
    for resource, devices in result.inventories.items():
        state.on_inventory(inventory_protocol.InventoryMessage(resource, "epoch", seq, 0, devices, result.error,
                                                               cdi_resolvable, result.driver_version))


def claim(uid: str, devices: list[str], name: str | None = None, namespace: str = "default",
          pool: str = NODE, driver: str = DRA_DRIVER, request: str = "npus") -> dict[str, Any]:
    """A ResourceClaim as the API server returns it, allocated to `devices`."""
    return {"metadata": {"name": name or f"claim-{uid}", "namespace": namespace, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]}}}}


class ClaimStore:
    """The claims the API server holds, by namespace/name; a missing one is a 404."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.reads = 0

    def add(self, body: dict[str, Any]) -> dict[str, Any]:
        self.claims[f"{body['metadata']['namespace']}/{body['metadata']['name']}"] = body
        return body

    def get_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        from dra_worker.kube import ApiFailure

        self.reads += 1
        try:
            return self.claims[f"{namespace}/{name}"]
        except KeyError:
            raise ApiFailure(f"get ResourceClaim {namespace}/{name}: 404 NotFound", 404) from None
