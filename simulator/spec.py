"""What a simulated node holds: its PFs, their SR-IOV mode, NUMA node, PCIe switch and card."""

from __future__ import annotations

import dataclasses
import re

VF_MODES = {"none": 0, "vf1": 1, "vf4": 4}
_GROUP = re.compile(r"^(\d+)(?::(\w+))?$")


@dataclasses.dataclass(frozen=True)
class PfSpec:
    vf_mode: str | int = "none"
    """"none", "vf1", "vf4", or a VF count (0..255) to simulate unsupported partitions such as 2."""
    numa_node: int | None = 0
    """None: no `numa_node` file in sysfs and rbln-smi says "-1"."""
    switch: int = 0
    """Index of the PCIe switch the PF hangs under; each switch gets its own root port."""
    sid: str | None = None
    """None: a SID of its own; PFs with equal SIDs sit on one card."""
    product: str = "RBLN-CA25"

    def __post_init__(self) -> None:
        if isinstance(self.vf_mode, bool) or not (
                self.vf_mode in VF_MODES or (isinstance(self.vf_mode, int) and 0 <= self.vf_mode <= 255)):
            raise ValueError(f"vf_mode {self.vf_mode!r} is not 'none', 'vf1', 'vf4' or a VF count 0..255")
        if self.numa_node is not None and self.numa_node < 0:
            raise ValueError(f"numa_node {self.numa_node} is negative; use None for unknown")
        if self.switch < 0:
            raise ValueError(f"switch {self.switch} is negative")

    @property
    def num_vfs(self) -> int:
        return VF_MODES[self.vf_mode] if isinstance(self.vf_mode, str) else self.vf_mode


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    pfs: tuple[PfSpec, ...]

    @classmethod
    def uniform(cls, num_pfs: int = 4, vf_mode: str | int = "none", numa_nodes: int = 1,
                switches: int = 2) -> NodeSpec:
        """`num_pfs` alike PFs spread in contiguous blocks over NUMA nodes and switches."""
        return cls(_spread([vf_mode] * num_pfs, numa_nodes, switches))

    @classmethod
    def parse(cls, text: str, numa_nodes: int = 1, switches: int = 2) -> NodeSpec:
        """CLI form: comma-separated `COUNT[:MODE]` groups, MODE `none` (default), `vf1`, `vf4` or
        `vfN`; e.g. "4", "2:vf4,2", "2:vf1". PFs are spread as by `uniform`."""
        modes: list[str | int] = []
        for group in text.replace(" ", "").split(","):
            match = _GROUP.match(group)
            if not match:
                raise ValueError(f"node spec {text!r}: {group!r} is not COUNT[:MODE], e.g. '2:vf4'")
            count, mode = int(match[1]), match[2] or "none"
            modes += [_parse_mode(mode, text)] * count
        return cls(_spread(modes, numa_nodes, switches))


def _parse_mode(mode: str, text: str) -> str | int:
    if mode in VF_MODES:
        return mode
    if mode.startswith("vf") and mode[2:].isdigit() and int(mode[2:]) <= 255:
        return int(mode[2:])
    raise ValueError(f"node spec {text!r}: mode {mode!r} is not none, vf1, vf4 or vfN")


def _spread(modes: list[str | int], numa_nodes: int, switches: int) -> tuple[PfSpec, ...]:
    if numa_nodes < 1 or switches < 1:
        raise ValueError(f"need at least one NUMA node and one switch, got {numa_nodes} and {switches}")
    count = len(modes)
    return tuple(PfSpec(vf_mode=mode, numa_node=i * numa_nodes // count, switch=i * switches // count)
                 for i, mode in enumerate(modes))
