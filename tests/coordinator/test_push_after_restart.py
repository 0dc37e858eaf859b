"""A re-push after a coordinator restart of an update that landed before it (a review's finding), on in-process
coordinators over a real SQLite state dir.

The last pusher of a round is answered once the round committed; a restart in that window lost the membership, and
the update pushed again under the re-join was refused as stale, so the worker put back the error-feedback residual
the landed update had carried. Each committed round now records its reporters (close.py `close_reporters`) and a
re-join naming one takes over its delivered version (service.py `_landed`): the re-push is ALREADY_EXISTS."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import grpc

from rcswarm.coordinator.close import close_reporters
from rcswarm.coordinator.records import OpenRound
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds, deltas_of, previous, pull_all, push, refusal_of
from tests.helpers.specs import tiny_spec

SPEC = tiny_spec(run={"rounds": 20}, sync={"codec": "fp32", "max_update_norm": 100.0},
                 coordinator={"durable": False})


def open_run(state_dir: Path) -> SwarmCoordinator:
    return SwarmCoordinator(SPEC, StateStore(state_dir, SPEC.coordinator.keep_checkpoints, durable=False))




def test_a_rejoin_after_a_restart_finds_its_landed_update_already_delivered(tmp_path: Path) -> None:
    coordinator = open_run(tmp_path)
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        pull_all(coordinator, a)
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), 64).accepted
        assert coordinator.version == 1  # the push closed round 0; its answer is what a restart would lose
    finally:
        coordinator.close()
    restarted = open_run(tmp_path)
    try:
        assert restarted.version == 1 and a.worker_id not in restarted.workers
        # Naming nothing, an update from version 0 is stale, as before: this coordinator cannot tell it landed.
        stranger = restarted.join(pb.JoinRequest(worker_name="stranger"))
        refusal = refusal_of(lambda: push(restarted, stranger, deltas_of(restarted, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal.message
        # Naming the membership whose update round 0 counted: already delivered, and nothing is recorded.
        again = restarted.join(pb.JoinRequest(worker_name="a", **previous(a)))
        refusal = refusal_of(lambda: push(restarted, again, deltas_of(restarted, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.ALREADY_EXISTS, refusal.message
        assert not restarted.round.reports and restarted.workers[again.worker_id].stale_updates == 0
        # It trains on from the version it pulls: taken.
        pull_all(restarted, again)
        assert push(restarted, again, deltas_of(restarted, 1e-3), 64).accepted is True
        restarted.leave(pb.LeaveRequest(**creds(stranger)))
    finally:
        restarted.close()
    # A second restart before that membership's answer: the re-join naming it finds the update it delivered in round
    # 1 (committed once the leave above ended the wait for the stranger).
    third = open_run(tmp_path)
    try:
        assert third.version == 2
        once_more = third.join(pb.JoinRequest(worker_name="a", **previous(again)))
        assert third.workers[once_more.worker_id].accepted_version == 1
        refusal = refusal_of(lambda: push(third, once_more, deltas_of(third, 1e-3), 64, version=1))
        assert refusal.code == grpc.StatusCode.ALREADY_EXISTS, refusal.message
    finally:
        third.close()


def test_a_rejoin_between_restarts_keeps_the_update_it_took_over(tmp_path: Path) -> None:
    """A re-join that took over a landed update (after one restart) and is then lost to a second restart before its
    re-push was answered: the re-join naming it still finds that update delivered (the alias its join entered)."""
    coordinator = open_run(tmp_path)
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        pull_all(coordinator, a)
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), 64).accepted
    finally:
        coordinator.close()
    restarted = open_run(tmp_path)
    try:
        second = restarted.join(pb.JoinRequest(worker_name="a", **previous(a)))
    finally:
        restarted.close()
    third = open_run(tmp_path)
    try:
        third_member = third.join(pb.JoinRequest(worker_name="a", **previous(second)))
        refusal = refusal_of(lambda: push(third, third_member, deltas_of(third, 1e-3), 64, version=0))
        assert refusal.code == grpc.StatusCode.ALREADY_EXISTS, refusal.message
    finally:
        third.close()


def test_a_rounds_reporters_are_its_updates_owners_with_their_newest_base_and_the_rejoins_in_their_places() -> None:
    round_ = OpenRound(5, 0.0)
    late = SimpleNamespace(lateness=SimpleNamespace(staleness=1))
    round_.reports.update({"a": object(), "b": object()})
    round_.late.update({"b": late, "c": late})
    # c ended after its late update; c2 joined again naming it and took its place over.
    assert close_reporters(round_, {"c": "c2"}) == {"a": 5, "b": 5, "c": 4, "c2": 4}
    assert close_reporters(OpenRound(0, 0.0), {}) == {}
