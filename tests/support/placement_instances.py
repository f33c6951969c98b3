"""Placement instances drawn by hypothesis: PCI trees with leaves, endpoints and devices of no
path, NUMA nodes and RSD groups, the devices on offer and the ones a request must include."""

from __future__ import annotations

from hypothesis import strategies as st

from resource_worker.placement import Candidate


@st.composite
def placement_instances(draw):
    roots = [f"pci0000:{i:02x}" for i in range(draw(st.integers(1, 3)))]
    nodes = [(root,) for root in roots]
    for i in range(draw(st.integers(0, 7))):
        nodes.append(draw(st.sampled_from(nodes)) + (f"0000:{i + 1:02x}:00.0",))
    count = draw(st.integers(1, 10))
    node = {}
    for i in range(count):
        kind = draw(st.sampled_from(["leaf", "leaf", "leaf", "endpoint", "missing"]))
        base = draw(st.sampled_from(nodes))
        path = {"leaf": base + (f"0000:f{i:01x}:00.0",), "endpoint": base, "missing": None}[kind]
        device = f"d{draw(st.integers(0, 99)):02d}"
        if device not in node:
            node[device] = Candidate(device, draw(st.sampled_from([0, 0, 1, 2, None])),
                                     draw(st.sampled_from(["sid:A", "sid:B", "pf:C", None, None])), path)
    available = draw(st.lists(st.sampled_from(sorted(node)), min_size=1, max_size=12))
    mandatory = draw(st.lists(st.sampled_from(sorted(set(available))), max_size=3))
    return node, available, mandatory
