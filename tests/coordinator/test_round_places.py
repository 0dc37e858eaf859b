"""What one round takes, over real gRPC on loopback: places held by ended memberships' updates, the cap on a round's
updates, stale refusals recorded once per worker and round, a finished run's final version, negative base versions.

A join-token holder once joined, pushed and left under ever new ids and put 50 updates into one round of a run with
coordinator.max_workers = 2 (the direction check then dropped the honest update); a member repeating a stale push
grew the events table by one row per refusal (2,382 rows, 4.4 MB in 5 s); a push for a finished run's final version
was answered accepted and never applied; base_version = -1 was answered ALREADY_EXISTS ("already delivered").
"""

from __future__ import annotations

import grpc
import pytest
import torch

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.transport import PLACE_RETRY_KEY
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import tensor_stream
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state
from tests.helpers.wire import Wire, push, pushed_and_left, small_deltas


def _update(wire: Wire, local, worker_id: str, version: int, value: float = 1e-3, tokens: int = 640) -> list:
    """The PushUpdate messages of `worker_id`'s update of `value` in every coordinate, trained from `version`."""
    deltas = {name: torch.full(shape, value) for name, shape in local.service.shapes.items()}
    header, chunks = tensor_stream.build_payload(deltas, codec=wire.format, run_id=local.service.run_id, version=version)
    meta = pb.UpdateMeta(**wire.creds(worker_id), base_version=version, tokens=tokens, inner_steps=1)
    return [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header),
            *(pb.PushUpdateRequest(chunk=c) for c in chunks)]


def _push(wire: Wire, local, worker_id: str, version: int, value: float = 1e-3) -> pb.PushUpdateResponse:
    return wire.call("PushUpdate", iter(_update(wire, local, worker_id, version, value)), timeout=30.0)


def _refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _open_round(wire: Wire) -> pb.RoundStatus:
    return wire.call("GetStatus", pb.GetStatusRequest()).rounds[-1]


def _churn(wire: Wire, local, cycles: int) -> tuple[int, list[grpc.RpcError]]:
    """One token holder's join -> push (on time, no pull) -> leave cycles, each under a new id naming none: the
    updates accepted and the refusals met."""
    accepted, refusals = 0, []
    for i in range(cycles):
        worker_id = None
        try:
            worker_id = wire.join(f"sybil{i}")
            accepted += _push(wire, local, worker_id, local.service.version, -1e-3).accepted
        except grpc.RpcError as error:
            refusals.append(error)
        finally:
            if worker_id is not None:
                wire.call("Leave", pb.LeaveRequest(**wire.creds(worker_id), reason="bye"))
    return accepted, refusals


def test_join_push_leave_churn_puts_at_most_max_workers_updates_into_a_round(start_coordinator):
    """max_workers = 2, an honest worker that pulled version 0: 20 join/push/leave cycles of one token holder get one
    update into round 0 (before: all 20); the others are refused a place (RESOURCE_EXHAUSTED with the place-retry
    trailer, naming max_workers and the round). The honest update closes the round, which frees the places."""
    local = start_coordinator(tiny_spec(sync={"codec": "int8"}, coordinator={"max_workers": 2, "lease_s": 30.0}))
    wire = Wire(local.target)
    try:
        honest = wire.join("honest")
        wire.pull(honest)
        accepted, refusals = _churn(wire, local, 20)
        assert accepted == 1 and len(refusals) == 19
        for refusal in refusals:
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_workers=2" in refusal.details() and "round 0" in refusal.details()
            assert PLACE_RETRY_KEY in dict(refusal.trailing_metadata() or ())
        assert _open_round(wire).reports == 1
        theta = {k: v.clone() for k, v in local.service.params.items()}
        assert _push(wire, local, honest, 0).accepted
        status = wire.call("GetStatus", pb.GetStatusRequest())
        assert status.version == 1 and status.rounds[-2].reports == 2 and status.rounds[-2].dropped == 0
        # Two updates, one each way: the honest one is not outvoted (before: 20 flips dropped it, θ moved their way).
        step = sum(float((theta[k] - v).sum()) for k, v in local.service.params.items())
        assert step >= -1e-6
        # Round 0 closed: its ended member's place is free again.
        assert wire.join("after")
    finally:
        wire.close()


def test_a_worker_that_rejoins_naming_its_ended_membership_takes_its_place_over(start_coordinator):
    """Honest churn under max_workers = 2: a spare waits while an ended membership's update holds its place in the
    open round, but a worker that pushed and crashed (its membership ended) re-joins at once naming it and is
    admitted into that place; its update is not taken twice (ALREADY_EXISTS). A re-join crashing again passes the
    place on to the next naming it (not to one naming the first, whose place it took). Once round 0 closes, the
    worker trains on in round 1."""
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0},
                                        coordinator={"max_workers": 2, "lease_s": 30.0}))
    client = local.client()
    wire = Wire(local.target)

    def refused_place(request: pb.JoinRequest) -> None:
        refused = _refusal(lambda: wire.call("Join", request))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1 ended memberships whose updates are in the open round 0, of max_workers=2" in refused.details()

    try:
        a, b = pushed_and_left(client, local)
        refused_place(pb.JoinRequest(worker_name="spare"))
        again = client.join("a", "cpu", 1, run_id=a.run_id, previous=a)
        with pytest.raises(grpc.RpcError) as duplicate:
            push(client, again, small_deltas(local))
        assert duplicate.value.code() == grpc.StatusCode.ALREADY_EXISTS
        client.leave(again, "crashed again")
        refused_place(pb.JoinRequest(worker_name="a-twice", previous_worker_id=a.worker_id,
                                    previous_worker_secret=a.worker_secret))
        third = client.join("a", "cpu", 1, run_id=a.run_id, previous=again)
        assert push(client, b, small_deltas(local)).accepted
        status = client.status()
        assert status.version == 1 and status.rounds[-2].reports == 2
        client.pull(third, third.run_id)
        assert push(client, third, small_deltas(local), version=1).accepted
        assert client.status().rounds[-1].reports == 1
    finally:
        wire.close()
        client.close()


class _AdmitsLikeBefore(SwarmCoordinator):
    """The real coordinator with admission as it was: no place held by an ended membership's update."""

    def _place_holders(self) -> set[str]:
        return set()


def test_a_round_takes_at_most_max_workers_on_time_updates(start_coordinator):
    """The intake's own cap, with admission counting only active workers (as before): the churn's third on-time
    update to round 0 is refused RESOURCE_EXHAUSTED naming the cap, and the round holds two."""
    local = start_coordinator(tiny_spec(sync={"codec": "int8"}, coordinator={"max_workers": 2, "lease_s": 30.0}),
                              service=_AdmitsLikeBefore)
    wire = Wire(local.target)
    try:
        honest = wire.join("honest")
        wire.pull(honest)
        accepted, refusals = _churn(wire, local, 5)
        assert accepted == 2 and len(refusals) == 3
        for refusal in refusals:
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "round 0 already holds 2 on-time updates" in refusal.details()
            assert "coordinator.max_workers = 2" in refusal.details()
        assert _open_round(wire).reports == 2
    finally:
        wire.close()


def test_repeated_stale_pushes_are_each_refused_and_recorded_once_per_round(start_coordinator):
    """A member repeating a stale push is refused every time (FAILED_PRECONDITION, counted in GetStatus), and the
    events table gets one `stale` row for it per round, not one per refusal."""
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0}))
    wire = Wire(local.target)
    try:
        a = wire.join("a")
        wire.pull(a)
        assert _push(wire, local, a, 0).accepted
        late = wire.join("late")
        meta_only = [pb.PushUpdateRequest(meta=pb.UpdateMeta(**wire.creds(late), base_version=0, tokens=1))]
        for _ in range(30):
            refused = _refusal(lambda: wire.call("PushUpdate", iter(meta_only)))
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "stale" in refused.details()
        status = wire.call("GetStatus", pb.GetStatusRequest())
        assert {w.worker_id: w.stale_updates for w in status.workers}[late] == 30
        for member in (a, late):
            assert _push(wire, local, member, 1).accepted
        assert wire.call("GetStatus", pb.GetStatusRequest()).version == 2
        refused = _refusal(lambda: wire.call("PushUpdate", iter(meta_only)))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        wire.close()
    events = read_state(local.state_dir, lambda store: store.events("stale"))
    assert [e.worker_id for e in events] == [late, late]
    assert "global version is 1" in events[0].reason
    assert "update from version 0 after this worker's update from version 1 was taken" in events[1].reason


def test_an_update_for_a_finished_runs_final_version_is_refused(start_coordinator):
    """run.rounds = 1: after round 0 closed the run is finished, and a push trained from its final version 1 is
    refused as stale naming that the run finished (before: accepted = True, held in a round that never closes)."""
    local = start_coordinator(tiny_spec(run={"rounds": 1}, sync={"codec": "fp32", "max_update_norm": 100.0}))
    wire = Wire(local.target)
    try:
        a = wire.join("a")
        wire.pull(a)
        assert _push(wire, local, a, 0).accepted
        status = wire.call("GetStatus", pb.GetStatusRequest())
        assert status.version == 1 and status.run_state == pb.RUN_STATE_FINISHED
        wire.pull(a)
        refused = _refusal(lambda: _push(wire, local, a, 1))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "finished at version 1" in refused.details()
        assert _open_round(wire).reports == 0
    finally:
        wire.close()


@pytest.mark.parametrize("base_version", [-1, -5, -(2**63)])
def test_a_negative_base_version_is_invalid_before_anything_is_recorded(start_coordinator, base_version):
    """base_version < 0 is no version: INVALID_ARGUMENT naming base_version and what is expected, with nothing
    recorded (before: -1 from a worker that delivered nothing was ALREADY_EXISTS "already delivered", which a
    client takes as landed; -5 a stale refusal, counted and recorded)."""
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0}))
    wire = Wire(local.target)
    try:
        a = wire.join("a")
        wire.pull(a)
        meta = pb.UpdateMeta(**wire.creds(a), base_version=base_version, tokens=1)
        refused = _refusal(lambda: wire.call("PushUpdate", iter([pb.PushUpdateRequest(meta=meta)])))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"base_version = {base_version}: expected a version >= 0" in refused.details()
        status = wire.call("GetStatus", pb.GetStatusRequest())
        assert [w.stale_updates for w in status.workers] == [0] and status.rounds[-1].reports == 0
        assert _push(wire, local, a, 0).accepted
    finally:
        wire.close()
    assert read_state(local.state_dir, lambda store: store.events("stale")) == []
