"""The kubelet's plugin registration service: who this plugin is, and the kubelet's verdict on it."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable

from loguru import logger

from dra_worker.health import SUPPORTED_SERVICES as HEALTH_SERVICES
from shared.config import DRA_DRIVER
from shared.pluginregistration.v1 import api_pb2, api_pb2_grpc

PLUGIN_TYPE = "DRAPlugin"
# The kubelet takes the first DRA service it supports (v1 first, v1beta1 for kubelets before 1.34), and
# the first health service it supports (v1 from 1.37 on; v1alpha1 before, and accepted through 1.39).
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", *HEALTH_SERVICES)


class RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: pathlib.Path, on_change: Callable[[], None] = lambda: None):
        self._endpoint = endpoint
        self.registered = threading.Event()
        """Set while the kubelet's last verdict was a registration."""
        self.on_change = on_change
        """Called after each verdict (the status file, which readiness reads, is written at once)."""

    def GetInfo(self, request, context):
        return api_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRA_DRIVER, endpoint=str(self._endpoint),
                                  supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request, context):
        if request.plugin_registered:
            self.registered.set()
            logger.info("Registered with the kubelet", driver=DRA_DRIVER, endpoint=str(self._endpoint))
        else:
            self.registered.clear()
            logger.error("Kubelet refused the DRA plugin registration", driver=DRA_DRIVER,
                         err=request.error or "no reason given")
        self.on_change()
        return api_pb2.RegistrationStatusResponse()
