"""The adaptive curriculum with the hivemind backend (#17): the coordinator climbs the ladder from reported versions.

The workers close rounds peer to peer; the coordinator, their control plane, learns each new
version from their metric rows and takes the curriculum step a round close takes, once per
version. Unit level: a real SwarmCoordinator fed ReportMetrics, and a real HivemindWorker whose
ControlPlane joined a real coordinator on loopback. Process level: a coordinator, a bootstrap
peer and two `rcswarm worker --backend hivemind` processes, every peer on 127.0.0.1 only (default
suite); `rcswarm run` of such a swarm, which starts the coordinator itself (wide).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rcswarm.cli.run_hivemind import needs_coordinator
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from tests.helpers.coordinator import creds
from tests.helpers.processes import worker_env
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.state import read_state

pytest.importorskip("rcswarm.worker.hivemind_sync")
from rcswarm.worker import ControlPlane, HivemindWorker  # noqa: E402
from rcswarm.worker import hivemind_sync as hs  # noqa: E402
from tests.helpers.hivemind import PATIENT, REPLICA_TOLERANCE_PER_ROUND, assert_replicas_agree  # noqa: E402
from tests.helpers.specs import hivemind_spec  # noqa: E402

# A law under which the next rung is ahead a few steps into training (α∞ = 2, τ = 1 step), as in test_curriculum.
LADDER = {"policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 2.0, "tau": 1.0, "budget_seconds": 600.0}


def adaptive_spec(backend: str = "hivemind") -> RunSpec:
    return tiny_spec(run={"name": "hm", "rounds": 20}, sync={"backend": backend}, inner={"steps": 5},
                     data={"batch_size": 4}, curriculum=LADDER)


def round_rows(version: int, seq_len: int, step: int, compute: float) -> list[pb.Metric]:
    """A hivemind worker's report after the round from `version`: its 5 steps (0.01 s each), then the new version."""
    rows = [pb.Metric(version=version, step=step + k, seq_len=seq_len, batch=4, tokens=4 * seq_len, loss=5.0,
                      compute_seconds=compute + 0.01 * k) for k in range(1, 6)]
    return rows + [pb.Metric(version=version + 1, step=step + 5, seq_len=seq_len, batch=4, tokens=0, loss=math.nan,
                             compute_seconds=compute + 0.05)]


def curriculum_events(coordinator: SwarmCoordinator) -> list[str]:
    return [event.reason for event in read_state(coordinator.store.state_dir, lambda store: store.events("curriculum"))]


def test_reported_versions_take_the_curriculum_step_of_each_round_once(tmp_path: Path) -> None:
    now = [1000.0]
    coordinator = SwarmCoordinator(adaptive_spec(), StateStore(tmp_path), clock=lambda: now[0])
    try:
        a, b = (coordinator.join(pb.JoinRequest(worker_name=name)) for name in ("a", "b"))
        assert a.assignment.seq_len == 4 and coordinator.curriculum.started_at is None
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(a), metrics=round_rows(0, 4, 0, 0.0)))
        # Round 0 closed peer to peer: decided (elapsed 0 s, the clock starts at this first report), L stays.
        state = coordinator.curriculum
        assert (state.started_at, state.decided_version, state.rung) == (1000.0, 0, 0)
        assert len(curriculum_events(coordinator)) == 1 and "round 0: stays at L = 4" in curriculum_events(coordinator)[0]
        # b's rows of the same round report no new version: no second decision.
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(b), metrics=round_rows(0, 4, 0, 0.0)))
        assert len(curriculum_events(coordinator)) == 1
        now[0] = 1005.0
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(a), metrics=round_rows(1, 4, 5, 0.05)))
        assert (coordinator.curriculum.rung, coordinator.curriculum.decided_version) == (1, 1)
        assert "round 1: lengthens L = 4 -> 8" in curriculum_events(coordinator)[-1]
        beat = coordinator.heartbeat(pb.HeartbeatRequest(**creds(b)))
        assert (beat.assignment.seq_len, beat.assignment.batch_size) == (8, 4) and "lengthens" in beat.assignment.reason
        status = coordinator.status()
        assert (status.version, status.curriculum.rung, status.curriculum.seq_len) == (2, 1, 8)
        assert status.curriculum.seconds_per_step[4] == pytest.approx(0.01)
        # A jump of four versions (rows that waited out an outage): rounds 2..5 are decided; 2 stays (nothing
        # measured at L = 8) and 5 stands for 3 and 4, which would repeat it.
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(b), metrics=round_rows(5, 4, 5, 0.05)[-1:]))
        events = curriculum_events(coordinator)
        assert len(events) == 4 and [e.split(":")[0] for e in events[2:]] == ["round 2", "round 5"], events
        assert all("stays at L = 8: no seconds per step measured at L = 8" in e for e in events[2:])
        assert (coordinator.curriculum.rung, coordinator.curriculum.decided_version) == (1, 5)
        # A round's failed decision is logged and L stays; the rows are stored all the same.
        def failing(now: float, version: int, active: object = ()) -> None:
            raise RuntimeError(f"no decision at round {version}")

        coordinator.tracker.advance = failing
        stored = coordinator.report_metrics(pb.ReportMetricsRequest(**creds(a), metrics=round_rows(6, 8, 10, 0.1)))
        assert stored.stored == 6 and coordinator.curriculum.rung == 1 and coordinator.peer_version == 7
        assert coordinator.version == 0 and coordinator.applied_tokens == 0  # no round closed here, no tensor came
    finally:
        coordinator.close()
    # A restarted coordinator (peer_version 0 again) decides only the rounds after the last one decided.
    restarted = SwarmCoordinator(adaptive_spec(), StateStore(tmp_path), clock=lambda: now[0])
    try:
        c = restarted.join(pb.JoinRequest(worker_name="c"))
        assert c.assignment.seq_len == 8
        restarted.report_metrics(pb.ReportMetricsRequest(**creds(c), metrics=round_rows(6, 8, 0, 0.0)[-1:]))
        events = curriculum_events(restarted)
        assert len(events) == 5 and events[-1].startswith("round 6:") and restarted.curriculum.decided_version == 6
    finally:
        restarted.close()


def test_a_fixed_schedule_is_shown_at_the_version_the_workers_report(tmp_path: Path) -> None:
    """With the hivemind backend the coordinator's own version stays 0 (it closes no rounds): the assignment it
    shows and the status's curriculum follow the version its workers report, as each worker's schedule does."""
    spec = tiny_spec(run={"name": "hm", "rounds": 20}, sync={"backend": "hivemind"}, inner={"steps": 5},
                     data={"batch_size": 4}, curriculum={"schedule": [[0, 4, 4], [10, 8, 2]]})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path), clock=lambda: 1000.0)
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        assert (a.assignment.seq_len, a.assignment.batch_size) == (4, 4)
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(a), metrics=round_rows(1, 4, 5, 0.0)))
        beat = coordinator.heartbeat(pb.HeartbeatRequest(**creds(a)))
        assert coordinator.version == 0 and coordinator.peer_version == 2
        assert (beat.assignment.seq_len, beat.assignment.batch_size, beat.assignment.version) == (8, 2, 2)
        assert "step 10 (version 2)" in beat.assignment.reason
        assert coordinator.status().curriculum.seq_len == 8
    finally:
        coordinator.close()


def test_the_coordinator_backend_decides_at_its_own_closes_only(tmp_path: Path) -> None:
    now = [1000.0]
    coordinator = SwarmCoordinator(adaptive_spec("coordinator"), StateStore(tmp_path), clock=lambda: now[0])
    try:
        a = coordinator.join(pb.JoinRequest(worker_name="a"))
        coordinator.report_metrics(pb.ReportMetricsRequest(**creds(a), metrics=round_rows(0, 4, 0, 0.0)))
        assert curriculum_events(coordinator) == [] and coordinator.curriculum.decided_version == -1
    finally:
        coordinator.close()


def test_an_adaptive_hivemind_worker_needs_a_coordinator_and_trains_its_rung(start_coordinator: Any, tmp_path: Path) -> None:
    spec = adaptive_spec()
    options = hs.HivemindOptions()
    with pytest.raises(ValueError, match=r'curriculum.policy = "adaptive" \(seq_lens \[4, 8, 16\]\): a hivemind '
                                         r"worker needs --coordinator HOST:PORT"):
        HivemindWorker(spec, options)
    with pytest.raises(ValueError, match=r"sweep\.seq_lens = \[8, 16\] is invalid: expected empty with "
                                         r'sync\.backend = "hivemind"'):
        hivemind_spec(sweep={"seq_lens": [8, 16]})  # the run spec refuses it before any worker starts
    assert "adaptive curriculum over [4, 8, 16]" in needs_coordinator(spec)
    assert "worker_seq_lens = [16, 48]" in needs_coordinator(hivemind_spec(curriculum={"worker_seq_lens": [16, 48]}))
    assert needs_coordinator(hivemind_spec()) == ""
    local = start_coordinator(spec)
    now = [1000.0]
    local.service.clock = lambda: now[0]
    control = ControlPlane(local.target, TOKEN, "a", "cpu", patience_s=10.0)
    try:
        control.join()
        worker = HivemindWorker(spec, options, name="a", control=control, data_seed=1)
        assert worker._assigned()[:2] == (4, 4)
        worker._follow_assignment()
        data = worker.trainer.data
        assert (data.seq_len, data.batch_size) == (4, 4) and worker.trainer.sampler is not None
        control.report(round_rows(0, 4, 0, 0.0))
        control._beat()  # the heartbeat, then the rows: round 0 is decided at their report
        assert local.service.curriculum.decided_version == 0 and worker._assigned()[:2] == (4, 4)
        now[0] += 5.0
        control.report(round_rows(1, 4, 5, 0.05))
        control._beat()
        assert local.service.curriculum.rung == 1
        control._beat()  # the next heartbeat brings the new rung
        seq_len, batch, why = worker._assigned()
        assert (seq_len, batch) == (8, 4) and "adaptive rung 1 of [4, 8, 16]: lengthens L = 4 -> 8" in why
        worker._follow_assignment()
        assert (worker.trainer.data.seq_len, worker.trainer.data.batch_size) == (8, 4)
    finally:
        control.close("finished")


@pytest.mark.wide
def test_hivemind_workers_climb_the_coordinators_ladder_while_averaging_peer_to_peer(
        swarm: Any, start_coordinator: Any, tmp_path: Path) -> None:
    """Two hivemind workers with a coordinator as their control plane: the ladder 8 -> 16 advances at a
    reported version, the workers train 16 from a round boundary after it, and no tensor reaches the coordinator.
    About 30 s on the 2-core box (start-ups, 5 rounds, the last version's settling); 65 s under a benchmark's load."""
    spec = hivemind_spec(run={"name": "hm", "rounds": 5}, inner={"steps": 4}, curriculum={**LADDER, "seq_lens": [8, 16]},
                         hivemind=PATIENT)
    coordinator = start_coordinator(spec, tmp_path / "coordinator")
    peers = swarm(spec)
    procs = [peers.worker(name, "--coordinator", coordinator.target) for name in ("a", "b")]
    peers.wait(procs, timeout=200)
    service = coordinator.service
    status = service.status()
    assert status.version == 5 and status.curriculum.rung == 1 and status.curriculum.seq_len == 16, status.curriculum
    assert 8 in status.curriculum.seconds_per_step
    events = curriculum_events(service)
    assert any("lengthens L = 8 -> 16" in e for e in events), events
    lengthened = next(int(e.split(":")[0].removeprefix("round ")) for e in events if "lengthens" in e)
    for name in ("a", "b"):
        history = peers.summary(name)["history"]
        lengths = [h["seq_len"] for h in history]
        assert [h["version"] for h in history] == [1, 2, 3, 4, 5] and not any(h["skipped"] for h in history), history
        # 8 up to the round the decision followed, 16 from a later round boundary on, and never back.
        assert lengths == sorted(lengths) and lengths[lengthened] == 8 and lengths[-1] == 16, (lengthened, history)
    trained = {row.seq_len for row in read_state(coordinator.state_dir, lambda store: store.metric_rows()) if row.tokens > 0}
    assert sorted(trained) == [8, 16]
    # The coordinator closed no round and received no tensor: its θ is still version 0, no round row exists.
    assert service.version == 0 and service.applied_tokens == 0
    assert read_state(coordinator.state_dir, lambda store: store.rounds()) == []
    assert_replicas_agree(peers, ["a", "b"], 5 * REPLICA_TOLERANCE_PER_ROUND)


@pytest.mark.slow
@pytest.mark.wide
def test_rcswarm_run_starts_a_coordinator_for_an_adaptive_hivemind_swarm(tmp_path: Path, no_new_p2pd: None) -> None:
    spec = hivemind_spec(run={"name": "hm", "rounds": 5, "workers": 2}, inner={"steps": 4},
                         curriculum={**LADDER, "seq_lens": [8, 16]})
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "rcswarm.cli", "run", str(write_spec(spec, tmp_path / "run.toml")),
                           "--run-dir", str(run_dir)], env=worker_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = " ".join(done.stdout.split())  # rich wraps lines at the console's width
    assert "a coordinator on 127.0.0.1:" in printed and "the adaptive curriculum over [8, 16]" in printed, printed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "completed" and summary["rounds"] == 5 and len(summary["peers"]) == 2, summary
    # The coordinator's state dir: every worker's rows, the decisions, no round closed there.
    state = run_dir / "state"
    assert sorted({row.seq_len for row in read_state(state, lambda store: store.metric_rows()) if row.tokens > 0}) == [8, 16]
    assert any("lengthens L = 8 -> 16" in event.reason for event in read_state(state, lambda store: store.events("curriculum")))
    assert read_state(state, lambda store: store.rounds()) == []
    processes = json.loads((run_dir / "processes.json").read_text())
    assert processes["coordinator"] is not None and len(processes["workers"]) == 2
