"""Compute utilization (issue #29): inner-step seconds over wall seconds, per membership and from the store."""

import math

import pytest

from rcswarm.coordinator.records import WorkerRecord
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import WorkerUsage


def _record() -> WorkerRecord:
    return WorkerRecord(worker_id="w", name="w", device="cpu", joined_at=0.0, last_seen=0.0, base_version=0)


def test_a_membership_s_utilization_is_its_compute_over_its_wall_span():
    record = _record()
    assert record.utilization() is None
    # A process that trained 5 s before this membership (a re-join): its compute counts from the first row on.
    record.measure(pb.Metric(wall_time=10.0, compute_seconds=5.0, tokens=0))
    assert record.utilization() is None
    record.measure(pb.Metric(wall_time=12.0, compute_seconds=6.5, tokens=8))
    record.measure(pb.Metric(wall_time=14.0, compute_seconds=8.0, tokens=8))
    assert record.utilization() == pytest.approx(3.0 / 4.0)
    # Rows that arrive out of order do not move the latest mark back; a NaN row is ignored.
    record.measure(pb.Metric(wall_time=13.0, compute_seconds=7.0, tokens=8))
    record.measure(pb.Metric(wall_time=math.nan, compute_seconds=9.0, tokens=8))
    assert record.utilization() == pytest.approx(3.0 / 4.0)


def test_the_store_s_utilization_is_compute_over_the_wall_span_capped_at_one():
    usage = WorkerUsage("w", 0, 0, 1.0, 6.0, 10, 0.0, 1.0, first_wall_time=2.0, last_wall_time=10.0)
    assert usage.utilization == pytest.approx(0.75)
    assert math.isnan(WorkerUsage("w", 0, 0, 0.0, 0.0, 0, 0.0, 0.0).utilization)
    assert WorkerUsage("w", 0, 0, 0.0, 9.0, 0, 0.0, 0.0, 0.0, 3.0).utilization == 1.0
