"""Pushes and metrics across a checkpoint fallback (review, finding 1), on in-process coordinators.

A coordinator served version 3, stopped, and version 3's file was damaged: the restart resumes θ_2 and serves it as
version 4 (state/store.py, `load_current`). Workers that held θ_3 push updates trained from it: each is refused with
FAILED_PRECONDITION (the worker drops it, pulls and trains on), where the coordinator answered INVALID_ARGUMENT
("does not exist yet", which ends the worker) or, once another worker had closed a round into a new version 3,
merged it on time into a θ it was not trained from. No version number names two θs across the restart."""

from __future__ import annotations

import grpc

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds, deltas_of, previous, pull_all, push, refusal_of
from tests.helpers.specs import tiny_spec
from tests.helpers.state import read_state
from tests.helpers.verified_state import checkpoint, flip_bytes

SPEC = tiny_spec(run={"rounds": 20}, sync={"codec": "fp32", "max_update_norm": 100.0, "max_staleness": 3},
                 coordinator={"keep_checkpoints": 3, "durable": False})


def open_run(state_dir) -> SwarmCoordinator:
    return SwarmCoordinator(SPEC, StateStore(state_dir, SPEC.coordinator.keep_checkpoints, durable=False))




class Served:
    """Every (version, θ digest) the coordinators served: a version number must name one θ."""

    def __init__(self) -> None:
        self.digests: dict[int, bytes] = {}

    def note(self, coordinator: SwarmCoordinator) -> None:
        known = self.digests.setdefault(coordinator.version, coordinator.param_sha256)
        assert known == coordinator.param_sha256, f"version {coordinator.version} names two θs"


def served_up_to_version_3(state_dir, served: Served) -> None:
    """Two workers train rounds 0..2; version 3 is served (both pull it), then the coordinator stops."""
    coordinator = open_run(state_dir)
    try:
        a, b = (coordinator.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b"))
        served.note(coordinator)
        for round_ in range(3):
            for member in (a, b):
                pull_all(coordinator, member)
                assert push(coordinator, member, deltas_of(coordinator, 1e-3 * (round_ + 1)), 64).accepted
            assert coordinator.version == round_ + 1
            served.note(coordinator)
        for member in (a, b):
            pull_all(coordinator, member)
    finally:
        coordinator.close()


def test_updates_trained_from_a_version_set_aside_are_refused_as_stale_and_no_version_is_reused(tmp_path) -> None:
    served = Served()
    served_up_to_version_3(tmp_path, served)
    flip_bytes(checkpoint(tmp_path, 3))
    coordinator = open_run(tmp_path)
    try:
        # θ_2 under a version no worker holds another θ for.
        assert coordinator.version == 4 and coordinator.param_sha256 == served.digests[2]
        served.note(coordinator)
        # Repro A: worker a re-joins and pushes its update trained from θ_3: FAILED_PRECONDITION, which the
        # worker meets by dropping it and pulling (INVALID_ARGUMENT ended it).
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        refusal = refusal_of(lambda: push(coordinator, a, deltas_of(coordinator, 1e-3), 64, version=3))
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal.message
        assert "set aside" in refusal.message and "versions 3..3" in refusal.message
        coordinator.leave(pb.LeaveRequest(**creds(a)))
        # Repro B: worker b closes the open round alone; then a re-joins and pushes its update from θ_3 again.
        b = coordinator.join(pb.JoinRequest(worker_name="b"))
        pull_all(coordinator, b)
        assert push(coordinator, b, deltas_of(coordinator, 2e-3), 64).accepted
        assert coordinator.version == 5
        served.note(coordinator)
        a = coordinator.join(pb.JoinRequest(worker_name="a", **previous(a)))
        refusal = refusal_of(lambda: push(coordinator, a, deltas_of(coordinator, 1e-3), 64, version=3))
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal.message
        # a pulls and trains on: its update from the current version is taken.
        pull_all(coordinator, a)
        assert push(coordinator, a, deltas_of(coordinator, 1e-3), 64).accepted
        assert coordinator.workers[a.worker_id].stale_updates == 1
        stale = [event.reason for event in read_state(tmp_path, lambda store: store.events("stale"))]
        assert len(stale) == 2 and all("trained from version 3" in reason for reason in stale)
    finally:
        coordinator.close()


def test_metric_rows_of_a_version_set_aside_are_not_stored(tmp_path) -> None:
    """Rows trained from θ_3 before the restart reach the coordinator after it: θ_3 no longer exists in the run, so
    they are not stored (as before, when the run's version was below theirs); rows of the new version 4 are, and
    its held-out reports are not mixed with version 3's."""
    served_up_to_version_3(tmp_path, Served())
    flip_bytes(checkpoint(tmp_path, 3))
    coordinator = open_run(tmp_path)
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="a"))
        length = SPEC.data.seq_len
        rows = [pb.Metric(version=3, step=1, seq_len=length, loss=3.0, tokens=8, val_loss=2.0),
                pb.Metric(version=4, step=1, seq_len=length, loss=2.5, tokens=8, val_loss=1.5)]
        assert coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=rows)).stored == 1
    finally:
        coordinator.close()
    assert [(row.version, row.loss) for row in read_state(tmp_path, lambda store: store.metric_rows())] == [(4, 2.5)]
    held_out = read_state(tmp_path, lambda store: store.held_out_losses())
    assert [(record.version, record.loss) for record in held_out] == [(4, 1.5)]


def test_an_update_from_a_version_that_does_not_exist_yet_is_a_failed_precondition(tmp_path) -> None:
    """The worker pulls and re-syncs on FAILED_PRECONDITION; INVALID_ARGUMENT ended it."""
    coordinator = open_run(tmp_path)
    try:
        member = coordinator.join(pb.JoinRequest(worker_name="ahead"))
        refusal = refusal_of(lambda: push(coordinator, member, deltas_of(coordinator, 1e-3), 64, version=5))
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "update for version 5 which does not exist yet (newest 0)" in refusal.message
        assert push(coordinator, member, deltas_of(coordinator, 1e-3), 64).accepted
    finally:
        coordinator.close()
