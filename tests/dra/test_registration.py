"""The worker found and registered by the kubelet's own plugin manager and DRA manager, and what it tells them."""

from __future__ import annotations

import grpc

from shared.pluginregistration.v1 import api_pb2 as registration
from shared.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from tests.dra.dra_harness import DRIVER
from tests.support.waiting import wait_until

REGISTERED = "Registered with the kubelet"


def test_the_kubelet_registers_the_driver_with_the_v1_service_first_and_the_worker_hears_it(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    plugins = serving.dra_node.plugins
    with grpc.insecure_channel(f"unix://{serving.dra_node.registry / f'{DRIVER}-reg.sock'}") as channel:
        info = registration_grpc.RegistrationStub(channel).GetInfo(registration.InfoRequest(), timeout=5)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(plugins / DRIVER / "dra.sock"))
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                             "v1alpha1.DRAResourceHealth"]
    # The plugin manager's NotifyRegistrationStatus(registered) reached the worker once.
    serving.stack.wait_for_record(REGISTERED)
    assert not serving.stack.find("Kubelet refused the DRA plugin registration")
    # The kubelet's DRA manager chose the v1 service (the first it supports) to reach the driver.
    assert [line for line in serving.kubelet.log_lines("Registered DRA plugin")
            if f'driverName="{DRIVER}"' in line and 'chosenService="v1.DRAPlugin"' in line]


def test_a_restarted_kubelet_finds_the_driver_again_and_its_slices_come_back(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, stack = serving.kubelet, serving.stack
    before = {item["metadata"]["uid"] for item in kubelet.slices()}
    wipes = len(kubelet.log_lines("Deleted ResourceSlices"))

    kubelet.restart()
    # A kubelet start wipes the node's slices and re-reads plugins_registry: registered again, republished.
    wait_until(lambda: len(kubelet.log_lines("Deleted ResourceSlices")) > wipes, 30, "the node's slices wiped")
    wait_until(kubelet.registered, 30, "the driver registered with the restarted kubelet")
    stack.wait_for_record(REGISTERED, count=2)
    wait_until(lambda: {d for item in kubelet.slices() if item["metadata"]["uid"] not in before
                        for d in (x["name"] for x in item["spec"]["devices"])} == {"rbln0", "rbln1"}, 30,
               "new slices list both NPUs again")
