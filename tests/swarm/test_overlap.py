"""Overlapped rounds in real swarms (`[sync] overlap`, issue #29): worker processes train while a round travels."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from rcswarm.observe.report import summarize
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.coordinator import free_port
from tests.helpers.processes import logs_of, start_coordinator_process, train_to_the_end
from tests.helpers.rounds import assert_bases_match, coordinator_digests, round_losses, worker_digests
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for


def _merges(log_path: Path) -> int:
    return log_path.read_text(errors="replace").count(" merged version ")


@pytest.mark.parametrize("codec", ["int8", "sparse"])
def test_two_overlapped_workers_train_and_their_bases_are_the_coordinators(start_coordinator, spawn_worker, tmp_path,
                                                                            codec):
    # Both directions compressed: the pull is the coordinator's compressed step from the held θ_v (sparse: its top
    # entries per chunk, the rest in the coordinator's residual), with error feedback on both sides.
    spec = tiny_spec(run={"rounds": 4}, inner={"steps": 8}, sync={"codec": codec, "min_reports": 2, "overlap": True})
    local = start_coordinator(spec)
    version0 = local.service.param_sha256.hex()
    status = train_to_the_end(local, spawn_worker, 2)
    assert status.version == 4 and status.run_state == pb.RUN_STATE_FINISHED
    assert [r.reports for r in status.rounds if r.closed_at] == [2, 2, 2, 2]
    # Compute utilization (issue #29): per membership in GetStatus, per run in the store's summary.
    assert all(0 < w.utilization <= 1 for w in status.workers) and 0 < status.utilization <= 1, status.workers
    assert 0 < read_state(local.state_dir, summarize).utilization <= 1
    # Versions 1..3 reached each worker by the overlapped merge (version 4 finished the run).
    assert [_merges(tmp_path / f"w{i}.log") for i in range(2)] == [3, 3]
    # The base each worker merged onto is the coordinator's θ_v bit for bit (the int8 pull is checked against its
    # SHA-256): the replicas differ from θ_v only by the local progress made since their push.
    assert_bases_match(local.state_dir, version0, 4)
    losses = round_losses(local.state_dir)
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.wide
def test_a_worker_killed_during_an_overlapped_round_is_survived(start_coordinator, spawn_worker):
    spec = tiny_spec(run={"rounds": 6}, inner={"steps": 8}, coordinator={"lease_s": 120.0},
                     sync={"codec": "int8", "min_reports": 2, "round_deadline_s": 6.0, "overlap": True})
    local = start_coordinator(spec)
    survivor, doomed = spawn_worker(local.target, "survivor"), spawn_worker(local.target, "doomed")
    # From its first push on an overlapped worker is always in an overlapped round: training or on the wire.
    wait_for(lambda: _merges(doomed.log_path) >= 1, 120, "the doomed worker's first merge")
    killed_at = local.client().status().version
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    assert survivor.wait(timeout=180) == 0, logs_of([survivor])
    status = local.client().status()
    assert status.version == 6 and status.run_state == pb.RUN_STATE_FINISHED
    rounds = [r for r in status.rounds if r.closed_at]
    summary = [(r.version, r.reports, r.close_reason) for r in rounds]
    # A round after the kill waited until its deadline and closed with the survivor's update alone.
    after = [r for r in rounds if r.version > killed_at]
    assert after and all(r.reports == 1 for r in after[1:]), summary
    assert any("deadline" in r.close_reason for r in after), summary
    expected = coordinator_digests(local.state_dir)
    reported = worker_digests(local.state_dir)
    for version in range(killed_at + 1, 6):
        assert expected[version] in reported[version], (version, summary)


def test_overlapped_workers_ride_out_a_coordinator_restart(tmp_path, spawn_worker):
    # The exchange thread meets NOT_FOUND (the restarted coordinator knows no one): the training thread joins again,
    # pulls afresh and overlaps again.
    spec = tiny_spec(run={"rounds": 12}, inner={"steps": 40}, sync={"min_reports": 2, "overlap": True})
    config = write_spec(spec, tmp_path / "run.toml")
    state_dir, port = tmp_path / "state", free_port()
    log_path = tmp_path / "coordinator.log"
    coordinator = start_coordinator_process(config, state_dir, port, log_path)
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN, retry=RetryPolicy(max_elapsed_s=60.0))
    try:
        procs = [spawn_worker(f"127.0.0.1:{port}", f"w{i}") for i in range(2)]
        wait_for(lambda: client.status().version >= 2, 120, "two rounds", interval=0.02)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=10)
        coordinator = start_coordinator_process(config, state_dir, port, log_path)
        for proc in procs:
            assert proc.wait(timeout=240) == 0, logs_of(procs) + log_path.read_text()
        final = client.status()
        assert final.version == 12 and final.run_state == pb.RUN_STATE_FINISHED
        reported, expected = worker_digests(state_dir), coordinator_digests(state_dir)
        assert all(reported[v] == {expected[v]} for v in range(1, 12) if v in reported)
        assert [_merges(tmp_path / f"w{i}.log") > 0 for i in range(2)] == [True, True]
        assert all("joining again" in (tmp_path / f"w{i}.log").read_text() for i in range(2)), logs_of(procs)
    finally:
        client.close()
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)


def test_a_late_joiner_overlaps_too(start_coordinator, spawn_worker, tmp_path):
    # An unbounded run, stopped once the late joiner merged twice: the run cannot end before it joined.
    spec = tiny_spec(run={"rounds": 0}, inner={"steps": 20}, sync={"codec": "int8", "min_reports": 2, "overlap": True})
    local = start_coordinator(spec)
    procs = [spawn_worker(local.target, f"w{i}") for i in range(2)]
    wait_for(lambda: local.client().status().version >= 2, 120, "two rounds")
    joined_after = local.client().status().version
    procs.append(spawn_worker(local.target, "late"))
    wait_for(lambda: _merges(tmp_path / "late.log") >= 2, 120, "the late joiner's second merge")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=60) == 0, logs_of(procs)
    rounds = [r for r in local.client().status().rounds if r.closed_at]
    # The late joiner pulled θ in full, then reported to the rounds after its join as the others did.
    assert max(r.reports for r in rounds if r.version > joined_after) == 3, [(r.version, r.reports) for r in rounds]
    reported, expected = worker_digests(local.state_dir), coordinator_digests(local.state_dir)
    assert all(reported[v] == {expected[v]} for v in expected if v in reported)
