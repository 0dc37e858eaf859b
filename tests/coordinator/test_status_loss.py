"""The status's latest loss is the active members' (review of the observation layer, 2026-11-28): a membership that
ended (left, evicted) is listed for `coordinator.forget_after_s`, and its loss was averaged in meanwhile (a worker
evicted for diverging held the dashboard's loss panel, `/metrics`' rcswarm_loss and `rcswarm status` up for minutes).
"""

from __future__ import annotations

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds
from tests.helpers.specs import tiny_spec


def report(coordinator: SwarmCoordinator, member: pb.JoinResponse, loss: float) -> None:
    metric = pb.Metric(version=0, step=1, seq_len=32, batch=4, loss=loss, tokens=128, wall_time=1.0)
    coordinator.report_metrics(pb.ReportMetricsRequest(**creds(member), metrics=[metric]))


def test_the_latest_loss_is_the_active_members_and_an_ended_ones_only_when_none_is_active(tmp_path) -> None:
    coordinator = SwarmCoordinator(tiny_spec(), StateStore(tmp_path, durable=False))
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a", device="cpu", pid=1))
        b = coordinator.join(pb.JoinRequest(worker_name="b", device="cpu", pid=2))
        report(coordinator, a, 9.0)
        report(coordinator, b, 2.0)
        assert coordinator.status().latest_loss == 5.5
        coordinator.leave(pb.LeaveRequest(**creds(a)))
        status = coordinator.status()
        assert [(w.name, w.state) for w in status.workers] == [("b", pb.WORKER_STATE_ACTIVE), ("a", pb.WORKER_STATE_LEFT)]
        assert status.latest_loss == 2.0
        # Once every member left (the run's end), the last losses listed still show.
        coordinator.leave(pb.LeaveRequest(**creds(b)))
        assert coordinator.status().latest_loss == 5.5
    finally:
        coordinator.close()
