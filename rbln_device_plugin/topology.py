"""`rbln-device-plugin topology`: the node's PCI forest as the placement policy sees it.

It runs one scan (rbln-smi and sysfs, exactly as the scanner does) and draws
PCI roots, the bridges NPUs share and the NPU endpoints, each annotated with
what placement weighs: resource, NUMA node, card (SID or parent PF) and the
status read now. `--json` gives the same for machines.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scanner.discovery import scan
from shared.config import ConfigError, Settings
from shared.node.device_health import judge
from shared.node.device_record import DeviceRecord, card_key
from shared.node.rbln_smi import RblnSmi
from shared.resources import Resource


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a tree")


def _describe(resource: Resource, record: DeviceRecord) -> dict[str, Any]:
    return {
        "device": record.device_id,
        "resource": resource.value,
        "busID": record.bus_id,
        "numaNode": record.numa_node,
        "card": card_key(record.sid, record.parent_pf),
        "sid": record.sid,
        "parentPF": record.parent_pf,
        "health": judge(None, record.status, record.observed_at_ns).health.value,
        "status": record.status.name,
        "pciPath": list(record.pci_path) if record.pci_path is not None else None,
    }


def _forest(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """Nested {segment: {"devices": [...], "children": {...}}} built from the path segments."""
    forest: dict[str, Any] = {}
    for device in devices:
        level = forest
        path = device["pciPath"]
        for depth, segment in enumerate(path):
            node = level.setdefault(segment, {"devices": [], "children": {}})
            if depth == len(path) - 1:
                node["devices"].append(device)
            level = node["children"]
    return forest


def _label(device: dict[str, Any]) -> str:
    numa = "?" if device["numaNode"] is None else device["numaNode"]
    card = f"VF of {device['parentPF']}" if device["parentPF"] else f"SID {device['sid'] or '-'}"
    return (f"{device['device']}  {device['resource']}  NUMA {numa}  {card}  "
            f"{device['health']} ({device['status']})")


def _draw(level: dict[str, Any], prefix: str, out: list[str]) -> None:
    items = sorted(level.items())
    for index, (segment, node) in enumerate(items):
        last = index == len(items) - 1
        names = "  ".join(_label(d) for d in node["devices"])
        out.append(f"{prefix}{'└── ' if last else '├── '}{segment}" + (f"  [{names}]" if names else ""))
        _draw(node["children"], prefix + ("    " if last else "│   "), out)


def run(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_environ()
    except ConfigError as exc:
        print(f"rbln-device-plugin topology: {exc}", file=sys.stderr)
        return 2
    result = scan(RblnSmi(settings.rbln_smi), settings.sysfs_root)
    if result.error is not None:
        print(f"rbln-device-plugin topology: device discovery failed: {result.error}", file=sys.stderr)
        return 1
    devices = [_describe(resource, record) for resource, records in result.inventories.items()
               for record in records]
    placed = [d for d in devices if d["pciPath"] is not None]
    unplaced = [d for d in devices if d["pciPath"] is None]
    excluded = [{"device": e.device, "reason": e.reason} for e in result.excluded]
    if args.json:
        json.dump({"forest": _forest(placed), "unreadablePciPath": unplaced, "excluded": excluded},
                  sys.stdout, indent=2)
        print()
        return 0
    lines: list[str] = []
    roots = _forest(placed)
    for root, node in sorted(roots.items()):
        lines.append(root)
        _draw(node["children"], "", lines)
    if unplaced:
        lines.append("PCI path unreadable (placed without PCI distance):")
        lines += [f"  {_label(d)}" for d in unplaced]
    if excluded:
        lines.append("Not advertised:")
        lines += [f"  {e['device']}: {e['reason']}" for e in excluded]
    print("\n".join(lines) if lines else "No Rebellions devices found.")
    return 0
