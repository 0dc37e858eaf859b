"""Leases and round deadlines on the coordinator's own liveness (issue #31, finding 4), with fake clocks: a
coordinator frozen past the lease, or whose wall clock is stepped, evicts nobody and closes no round early;
a member that stays silent after the coordinator resumed is still evicted, with a reason saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.coordinator import SwarmCoordinator, decisions
from rcswarm.coordinator.liveness import Beat, LivenessClock, alive_seconds, decide_beat
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds
from tests.helpers.specs import tiny_spec


class FakeTime:
    """A monotonic and a wall clock that tests move by hand."""

    def __init__(self) -> None:
        self.mono, self.wall = 100.0, 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def test_decide_beat_counts_a_gap_beyond_the_stall_threshold_as_a_stall() -> None:
    beat = Beat(10.0)
    assert decide_beat(beat, 11.5, stall_s=2.0) == Beat(11.5)
    stalled = decide_beat(Beat(11.5), 24.5, stall_s=2.0)
    assert (stalled.at, stalled.stalled_s, stalled.stalls) == (24.5, 11.0, 1)
    assert "did not run for 13.0 s" in stalled.reason and "11.0 s of it are not counted" in stalled.reason
    # Between beats the clock runs at most stall_s past the latest one, and it is continuous across the beat.
    assert alive_seconds(Beat(11.5), 12.5, 2.0) == 12.5
    assert alive_seconds(Beat(11.5), 24.5, 2.0) == 13.5 == alive_seconds(stalled, 24.5, 2.0)
    assert alive_seconds(stalled, 25.0, 2.0) == 14.0


def test_the_liveness_clock_skips_stalls_and_ignores_wall_clock_steps() -> None:
    fake = FakeTime()
    clock = LivenessClock(stall_s=2.0, beat_s=0.1, monotonic=lambda: fake.mono, wall=lambda: fake.wall)
    start = clock()
    assert start == fake.wall
    for _ in range(10):
        fake.advance(0.1)
        clock.beat()
    assert clock() == pytest.approx(start + 1.0)
    fake.wall -= 3600.0  # an NTP step backwards, then forwards: nothing changes
    assert clock() == pytest.approx(start + 1.0)
    fake.wall += 7200.0
    assert clock() == pytest.approx(start + 1.0)
    fake.advance(13.0)  # SIGSTOP: no beat for 13 s
    assert clock() == pytest.approx(start + 3.0)
    assert clock.beat().stalls == 1 and clock() == pytest.approx(start + 3.0)
    fake.advance(0.5)
    assert clock() == pytest.approx(start + 3.5)
    with pytest.raises(ValueError, match="expected 0 < beat_s < stall_s"):
        LivenessClock(stall_s=1.0, beat_s=1.0)


def test_decide_evictions_gives_a_grace_after_the_coordinator_resumed() -> None:
    options = decisions.MembershipOptions(lease_s=5.0, max_workers=4, stall_grace_s=10.0)
    quiet = decisions.WorkerView("w1", last_seen=100.0, base_version=0, active=True)
    heard = decisions.WorkerView("w2", last_seen=110.0, base_version=0, active=True)
    assert [w for w, _ in decisions.decide_evictions(114.0, [quiet, heard], options)] == ["w1"]
    # Resumed at 106: w1 was not heard since and has 5 + 10 s from then; w2 was heard after and has its lease.
    assert decisions.decide_evictions(114.0, [quiet, heard], options, resumed_at=106.0) == []
    evicted = decisions.decide_evictions(121.5, [quiet, heard], options, resumed_at=106.0)
    assert [w for w, _ in evicted] == ["w1", "w2"]
    assert "15.5s since the coordinator resumed from a stall > lease 5.0s + grace 10.0s" in evicted[0][1]
    assert "no heartbeat for 11.5s > lease 5.0s" in evicted[1][1]


def test_a_frozen_coordinator_keeps_its_members_and_closes_no_round_early(tmp_path: Path) -> None:
    fake = FakeTime()
    clock = LivenessClock(stall_s=2.0, beat_s=0.1, monotonic=lambda: fake.mono, wall=lambda: fake.wall)
    spec = tiny_spec(coordinator={"lease_s": 5.0}, sync={"round_deadline_s": 5.0, "max_staleness": 0})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path, durable=False), clock=clock)
    try:
        a = creds(coordinator.join(pb.JoinRequest(worker_name="a")))
        b = creds(coordinator.join(pb.JoinRequest(worker_name="b")))
        for worker in (a, b):
            list(coordinator.pull(pb.PullParametersRequest(**worker)))
        fake.advance(1.0)
        clock.beat()
        coordinator.heartbeat(pb.HeartbeatRequest(**a))
        coordinator.heartbeat(pb.HeartbeatRequest(**b))
        # Frozen for 13 s, longer than the lease and the round deadline; then the ticker runs before the beat.
        fake.advance(13.0)
        coordinator.tick()
        clock.beat()
        coordinator.tick()
        status = coordinator.status()
        assert [w.state for w in status.workers] == [pb.WORKER_STATE_ACTIVE] * 2
        assert coordinator.round.version == 0 and not coordinator.closing
        assert [e.kind for e in coordinator.store.events("stall")] == ["stall"]
        # b comes back within the grace; a stays silent and is evicted once lease + grace have passed.
        for _ in range(80):
            fake.advance(0.1)
            clock.beat()
            coordinator.tick()
        coordinator.heartbeat(pb.HeartbeatRequest(**b))
        for _ in range(80):
            fake.advance(0.1)
            clock.beat()
            coordinator.heartbeat(pb.HeartbeatRequest(**b))
            coordinator.tick()
        states = {w.worker_id: (w.state, w.reason) for w in coordinator.status().workers}
        assert states[b["worker_id"]][0] == pb.WORKER_STATE_ACTIVE
        assert states[a["worker_id"]][0] == pb.WORKER_STATE_EVICTED
        assert "since the coordinator resumed from a stall" in states[a["worker_id"]][1]
    finally:
        coordinator.close()


def test_without_the_liveness_clock_the_same_freeze_evicts_everyone(tmp_path: Path) -> None:
    """The failure the issue measured, on the plain wall clock: the same 13 s evicts both members."""
    now = [1_700_000_000.0]
    spec = tiny_spec(coordinator={"lease_s": 5.0}, sync={"round_deadline_s": 5.0})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path, durable=False), clock=lambda: now[0])
    try:
        for name in ("a", "b"):
            coordinator.join(pb.JoinRequest(worker_name=name))
        now[0] += 13.0
        coordinator.tick()
        assert [w.state for w in coordinator.status().workers] == [pb.WORKER_STATE_EVICTED] * 2
    finally:
        coordinator.close()
