"""A worker of the coordinator backend in a run that averages peer to peer (review of the Helm chart, 2026-11-28):
the coordinator of a `sync.backend = "hivemind"` run is its peers' control plane and holds no θ of theirs, yet a
worker started without --backend hivemind pulled, trained and pushed rounds that closed on their own. Its pull and
its push are refused (FAILED_PRECONDITION) with the flag to pass, and the worker ends saying so."""

from __future__ import annotations

import grpc
import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import Worker
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.wire import Wire
from tests.helpers.worker import _options, run_until

HIVEMIND = {"backend": "hivemind", "codec": "int8", "round_deadline_s": 20.0}


def test_a_coordinator_backend_worker_is_refused_by_a_hivemind_runs_coordinator(start_coordinator) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 3}, inner={"steps": 2}, sync=HIVEMIND))
    worker = Worker(_options(local.target), TOKEN)
    assert run_until(worker, lambda w: False, 60) == 1
    assert "averages peer to peer" in worker.exit_reason and "--backend hivemind" in worker.exit_reason
    assert local.service.version == 0 and not local.service.store.rounds()
    # The push too, on the wire, refused at its meta before any payload is read.
    wire = Wire(local.target)
    try:
        worker_id = wire.join("w")
        meta = pb.UpdateMeta(**wire.creds(worker_id), base_version=0, tokens=1)
        refused = wire.refusal("PushUpdate", iter([pb.PushUpdateRequest(meta=meta)]))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "averages peer to peer" in refused.details()
        with pytest.raises(grpc.RpcError) as pulled:
            list(wire.stub.PullParameters(pb.PullParametersRequest(**wire.creds(worker_id)), timeout=10.0,
                                          metadata=wire.metadata))
    finally:
        wire.channel.close()
    assert pulled.value.code() == grpc.StatusCode.FAILED_PRECONDITION
