"""A node without hardware: the zero-hardware demo's node and the integration tests' fixtures.

    simulator.node               build_node(root, NodeSpec) -> SimulatedNode (sysfs, /dev, rbln-smi, dirs)
    simulator.rbln_smi_standin   the `rbln-smi` the node's bin/rbln-smi runs
    simulator.kubelet            KubeletSimulator: the kubelet side of the device plugin API

Nothing is imported here: the rbln-smi stand-in imports this package on every call.
"""
