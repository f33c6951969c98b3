"""The kubelet's DRA services, v1 and v1beta1: the same implementation behind both (their messages are the same
shape in two proto packages). Every claim of a request gets an answer; nothing a request holds ends the
worker or fails the whole call."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import grpc
from loguru import logger

from dra_worker.claim_status import ClaimStatusWriter
from dra_worker.prepare import ClaimRef, ClaimResult, Preparer, elapsed_ms
from shared.dra.v1 import api_pb2 as v1_pb2
from shared.dra.v1 import api_pb2_grpc as v1_grpc
from shared.dra.v1beta1 import api_pb2 as v1beta1_pb2
from shared.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from shared.metrics import Recorder, Result
from shared.tracing import AllocationTracer

# Far above any pod's claims; a request with more is refused whole, before any API read.
MAX_CLAIMS_PER_REQUEST = 256


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in claims]


class DraPlugin:
    """What both services do, on plain values; `pb2` builds the answer in the caller's proto package."""

    def __init__(self, preparer: Preparer, pool: str, tracer: AllocationTracer, metrics: Recorder,
                 on_change: Any = lambda: None, claim_status: ClaimStatusWriter | None = None):
        self._preparer = preparer
        self._claim_status = claim_status
        self._pool = pool
        self._tracer = tracer
        self._metrics = metrics
        self._on_change = on_change

    def prepare(self, request: Any, context: grpc.ServicerContext, pb2: ModuleType) -> Any:
        started = time.monotonic()
        if len(request.claims) > MAX_CLAIMS_PER_REQUEST:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(request.claims)} claims in one request; at most {MAX_CLAIMS_PER_REQUEST}")
        refs = _refs(request.claims)
        response = pb2.NodePrepareResourcesResponse()
        with self._tracer.prepare(len(refs)) as trace:
            try:
                results = self._preparer.prepare(refs)
            except Exception as exc:  # a bug must cost the call's claims, never the worker or the whole call
                logger.opt(exception=True).error("Claim preparation failed", claimUID="", claim="",
                                                 err=f"{type(exc).__name__}: {exc}", durationMs=elapsed_ms(started))
                results = {ref.uid: ClaimResult(error=f"internal error: {type(exc).__name__}: {exc}") for ref in refs}
            for ref in refs:
                result = results[ref.uid]
                answer = response.claims[ref.uid]
                device_ids = [d.device for d in result.devices]
                host_rsd = f"/dev/rsd{result.rsd_group}" if result.rsd_group is not None else None
                trace.claim(ref.uid, f"{ref.namespace}/{ref.name}", device_ids, host_rsd, result.error)
                if result.error is not None:
                    answer.error = result.error
                    logger.error("Claim preparation failed", claimUID=ref.uid, claim=f"{ref.namespace}/{ref.name}",
                                 err=result.error, durationMs=elapsed_ms(started))
                    self._metrics.prepares(Result.FAILURE, time.monotonic() - started)
                    continue
                for device in result.devices:
                    answer.devices.add(request_names=list(device.requests), pool_name=self._pool,
                                       device_name=device.device, cdi_device_ids=list(device.cdi_device_ids))
                logger.info("Prepared claim", claimUID=ref.uid, claim=f"{ref.namespace}/{ref.name}",
                            deviceIDs=device_ids, rsdGroup=host_rsd, durationMs=elapsed_ms(started))
                if result.prepared_now and self._claim_status is not None:
                    self._claim_status.write(ref.namespace, ref.name, ref.uid, device_ids, result.rsd_group)
                self._metrics.prepares(Result.SUCCESS, time.monotonic() - started)
        self._on_change()
        return response

    def unprepare(self, request: Any, context: grpc.ServicerContext, pb2: ModuleType) -> Any:
        started = time.monotonic()
        if len(request.claims) > MAX_CLAIMS_PER_REQUEST:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(request.claims)} claims in one request; at most {MAX_CLAIMS_PER_REQUEST}")
        refs = _refs(request.claims)
        response = pb2.NodeUnprepareResourcesResponse()
        for ref in refs:
            failure: Exception | None = None
            try:
                error = self._preparer.unprepare([ref])[ref.uid]
            except Exception as exc:  # as in prepare: a bug costs this claim, never the others or the worker
                failure, error = exc, f"internal error: {type(exc).__name__}: {exc}"
            answer = response.claims[ref.uid]
            if error is not None:
                answer.error = error
                logger.opt(exception=failure).error("Claim unpreparation failed", claimUID=ref.uid, err=error,
                                                    durationMs=elapsed_ms(started))
            else:
                logger.info("Unprepared claim", claimUID=ref.uid, durationMs=elapsed_ms(started))
        self._on_change()
        return response


class DraServiceV1(v1_grpc.DRAPluginServicer):
    def __init__(self, plugin: DraPlugin):
        self._plugin = plugin

    def NodePrepareResources(self, request, context):
        return self._plugin.prepare(request, context, v1_pb2)

    def NodeUnprepareResources(self, request, context):
        return self._plugin.unprepare(request, context, v1_pb2)


class DraServiceV1beta1(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, plugin: DraPlugin):
        self._plugin = plugin

    def NodePrepareResources(self, request, context):
        return self._plugin.prepare(request, context, v1beta1_pb2)

    def NodeUnprepareResources(self, request, context):
        return self._plugin.unprepare(request, context, v1beta1_pb2)


def add_services(server: grpc.Server, plugin: DraPlugin) -> None:
    v1_grpc.add_DRAPluginServicer_to_server(DraServiceV1(plugin), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DraServiceV1beta1(plugin), server)
