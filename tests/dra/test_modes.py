"""A node serves its NPUs one way only: a stack in one mode refuses to start, in one line, while the other
mode's sockets of a live instance are there (KEP-5004 forbids a node to offer the same NPUs both ways)."""

from __future__ import annotations

import os
import subprocess

from simulator.kubelet import KubeletSimulator
from simulator.stack import RUN_COMMAND

NPU = "rebellions.ai/npu"


def refused(environ: dict[str, str]) -> list[str]:
    run = subprocess.run(RUN_COMMAND, env=environ, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    return run.stderr.splitlines()


def test_a_device_plugin_stack_refuses_to_start_on_a_node_the_dra_worker_serves(serve, cluster):
    serving = serve("1", {"rbln0"})
    (line,) = refused({**os.environ, **serving.dra_node.env(cluster), "RESOURCE_API": "device-plugin"})
    assert line.startswith("rbln-device-plugin run: RESOURCE_API=device-plugin, but a live DRA plugin serves")
    # The DRA worker serves on, undisturbed.
    assert serving.kubelet.registered() and set(serving.kubelet.published_devices()) == {"rbln0"}


def test_the_dra_worker_refuses_to_start_on_a_node_the_device_plugin_serves(make_node, kubelet_factory, cluster,
                                                                              start_stack):
    dra_node = make_node("1")
    kubelet = kubelet_factory(dra_node)
    device_plugins = KubeletSimulator(dra_node.node.plugin_dir)
    device_plugins.start()
    try:
        start_stack(dra_node, RESOURCE_API="device-plugin")
        device_plugins.wait_for(lambda k: NPU in k.resources(), 30, f"{NPU} registered by the device plugin")
        (line,) = refused({**os.environ, **dra_node.env(cluster)})
        assert line.startswith("rbln-device-plugin run: RESOURCE_API=dra, but a live device plugin serves")
        assert not kubelet.registered() and kubelet.slices() == []
    finally:
        device_plugins.stop()
