"""worker-dra's DRA service: a preparer that raises (a bug) costs the claims it was asked about, answered with
an error each, and never the call, the other claims of an Unprepare, or the worker."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dra_worker.prepare import ClaimRef
from dra_worker.servicer import DraPlugin
from shared.kubelet.dra.v1 import api_pb2 as v1_pb2
from shared.kubelet.dra.v1beta1 import api_pb2 as v1beta1_pb2
from shared.observability.metrics import Recorder
from shared.observability.tracing import AllocationTracer


class RaisingPreparer:
    """Raises for the claim with UID "bad"; every other claim is unprepared."""

    def __init__(self) -> None:
        self.unprepared: list[str] = []

    def prepare(self, claims: Sequence[ClaimRef]) -> dict:
        raise KeyError("bad")

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
        if any(ref.uid == "bad" for ref in claims):
            raise KeyError("bad")
        self.unprepared += [ref.uid for ref in claims]
        return {ref.uid: None for ref in claims}


def _claims(pb2, *uids: str) -> list:
    return [pb2.Claim(namespace="ns", uid=uid, name=f"claim-{uid}") for uid in uids]


@pytest.mark.parametrize("pb2", [v1_pb2, v1beta1_pb2])
def test_a_raising_preparer_answers_every_claim_with_an_error(pb2):
    preparer = RaisingPreparer()
    changes: list[bool] = []
    plugin = DraPlugin(preparer, "node-a", AllocationTracer(), Recorder(None),  # type: ignore[arg-type]
                       on_change=lambda: changes.append(True))

    prepared = plugin.prepare(pb2.NodePrepareResourcesRequest(claims=_claims(pb2, "a", "bad")), None, pb2)
    assert sorted(prepared.claims) == ["a", "bad"]
    assert all(prepared.claims[uid].error.startswith("internal error: KeyError") for uid in ("a", "bad"))
    assert all(not prepared.claims[uid].devices for uid in ("a", "bad"))

    unprepared = plugin.unprepare(pb2.NodeUnprepareResourcesRequest(claims=_claims(pb2, "a", "bad", "c")), None, pb2)
    assert sorted(unprepared.claims) == ["a", "bad", "c"]
    assert unprepared.claims["bad"].error.startswith("internal error: KeyError")
    assert unprepared.claims["a"].error == unprepared.claims["c"].error == ""
    assert preparer.unprepared == ["a", "c"]
    assert changes == [True, True]
