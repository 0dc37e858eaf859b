"""Real swarms: a coordinator on loopback and real worker processes, with faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.coordinator import free_port
from tests.helpers.processes import logs_of, start_coordinator_process, train_to_the_end, worker_env
from tests.helpers.rounds import assert_bases_match, coordinator_digests, round_losses, worker_digests
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow


def test_three_workers_train_in_lockstep(start_coordinator, spawn_worker):
    spec = tiny_spec(run={"rounds": 4}, inner={"steps": 8}, sync={"codec": "int8", "min_reports": 3})
    local = start_coordinator(spec)
    version0 = local.service.param_sha256.hex()
    status = train_to_the_end(local, spawn_worker, 3)
    assert status.version == 4 and status.run_state == pb.RUN_STATE_FINISHED
    assert all(w.state == pb.WORKER_STATE_LEFT for w in status.workers)
    assert [r.reports for r in status.rounds if r.closed_at] == [3, 3, 3, 3]
    # Every worker's parameters after each pull equal the coordinator's, bit for bit.
    assert_bases_match(local.state_dir, version0, 4)
    losses = round_losses(local.state_dir)
    assert losses[-1] < losses[0] - 0.3, losses


def test_a_killed_worker_is_dropped_at_the_round_deadline(start_coordinator, spawn_worker, tmp_path):
    # Late updates are refused (max_staleness = 0), so a round's reports are its on-time updates only: a worker slow
    # to start cannot add a late report to a later round.
    spec = tiny_spec(run={"rounds": 6}, inner={"steps": 20}, coordinator={"lease_s": 120.0},
                     sync={"round_deadline_s": 6.0, "max_staleness": 0})
    local = start_coordinator(spec)
    marker = tmp_path / "hung.txt"
    # The worker that dies hangs right before its push of a round (from version 1 on) and is killed there: its
    # update of that round never lands, however the kill falls (a kill timed from outside raced its push).
    doomed = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.paced_worker", "--hang-from", "1", "--marker", str(marker),
         "--coordinator", local.target, "--name", "doomed"],
        env=worker_env(), stdout=open(tmp_path / "doomed.log", "wb"), stderr=subprocess.STDOUT,
    )
    try:
        procs = [spawn_worker(local.target, f"w{i}") for i in range(2)]
        wait_for(marker.exists, 180, "the doomed worker to finish training a round")
        killed_in = int(marker.read_text())
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        for proc in procs:
            assert proc.wait(timeout=180) == 0, logs_of(procs)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(timeout=10)
    rounds = [r for r in local.client().status().rounds if r.closed_at]
    summary = [(r.version, r.reports, r.close_reason) for r in rounds]
    assert len(rounds) == 6
    # Its round waited for it until the deadline and closed with the two survivors' updates.
    (hung,) = [r for r in rounds if r.version == killed_in]
    assert "deadline" in hung.close_reason and hung.reports == 2 and hung.closed_at - hung.opened_at >= 6.0, summary
    # After the kill the run goes on with the two survivors: its later rounds wait for them alone.
    later = [r for r in rounds if r.version > killed_in]
    assert later and all(r.reports == 2 and "all 2 active workers reported" in r.close_reason for r in later), summary


def test_coordinator_restart_resumes_and_workers_reconnect(tmp_path, spawn_worker):
    spec = tiny_spec(run={"rounds": 30}, inner={"steps": 40}, sync={"min_reports": 2})
    config = write_spec(spec, tmp_path / "run.toml")
    state_dir, port = tmp_path / "state", free_port()
    log_path = tmp_path / "coordinator.log"
    coordinator = start_coordinator_process(config, state_dir, port, log_path)
    try:
        client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN, retry=RetryPolicy(max_elapsed_s=60.0))
        procs = [spawn_worker(f"127.0.0.1:{port}", f"w{i}") for i in range(2)]
        wait_for(lambda: client.status().version >= 2, 120, "two rounds", interval=0.02)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=10)
        store = StateStore(state_dir)
        persisted = int(store.get("version"))
        store.close()
        assert persisted >= 2
        time.sleep(1.0)
        coordinator = start_coordinator_process(config, state_dir, port, log_path)
        status = client.status()
        assert status.version == persisted, "the restarted coordinator must resume at the persisted version"
        assert status.param_sha256 == coordinator_digests(state_dir)[persisted]
        for proc in procs:
            assert proc.wait(timeout=240) == 0, logs_of(procs) + log_path.read_text()
        final = client.status()
        assert final.version == 30 and final.run_state == pb.RUN_STATE_FINISHED
        # Bit-identical replicas across the restart too (the broadcast residual was persisted).
        reported, expected = worker_digests(state_dir), coordinator_digests(state_dir)
        assert all(reported[v] == {expected[v]} for v in range(1, 30) if v in reported)
        assert len(reported) >= 25
        assert any(w.state == pb.WORKER_STATE_LEFT for w in final.workers)
        client.close()
    finally:
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)


def test_sigterm_leaves_cleanly(start_coordinator, spawn_worker):
    local = start_coordinator(tiny_spec(run={"rounds": 0}))
    proc = spawn_worker(local.target, "leaver")
    client = local.client()
    wait_for(lambda: client.status().total_tokens > 0, 120, "the worker to train")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, logs_of([proc])
    (worker,) = client.status().workers
    assert worker.state == pb.WORKER_STATE_LEFT and "stopped" in worker.reason


def test_joining_a_finished_run_exits_cleanly_and_a_spare_waits_for_a_place(start_coordinator, spawn_worker):
    local = start_coordinator(tiny_spec(run={"rounds": 1}, coordinator={"max_workers": 1}))
    first = spawn_worker(local.target, "first")
    assert first.wait(timeout=120) == 0, logs_of([first])
    late = spawn_worker(local.target, "late")
    assert late.wait(timeout=60) == 0, logs_of([late])
    assert "finished" in Path(late.log_path).read_text()

    # A full swarm: the spare waits for a place past its patience (the coordinator answers), and takes the place
    # once its holder has not been heard for a lease.
    busy = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"max_workers": 1, "lease_s": 4.0}))
    holder = busy.client()
    holder.join("holder", "cpu", 1)
    spare = spawn_worker(busy.target, "spare", "--patience-s", "2")
    wait_for(lambda: "waiting for a place" in Path(spare.log_path).read_text(), 60, "the spare to wait for a place")
    wait_for(lambda: holder.status().total_tokens > 0, 120, "the spare to take the place and train")
    spare.send_signal(signal.SIGTERM)
    assert spare.wait(timeout=30) == 0, logs_of([spare])
    log_text = Path(spare.log_path).read_text()
    assert log_text.count("waiting for a place") == 1 and "max_workers=1" in log_text, log_text
    assert "gave up" not in log_text
    holder.close()


def test_rcswarm_run_end_to_end(tmp_path):
    spec = tiny_spec(run={"rounds": 3, "workers": 2})
    config = write_spec(spec, tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli.main", "run", str(config), "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["workers"] == 2
    assert summary["val_loss_final"] < summary["val_loss_initial"]
    assert summary["bytes_sent_per_round"] > 0 and 0 < summary["sync_share"] < 1
    assert (run_dir / "final.safetensors").exists() and (run_dir / "state" / "state.sqlite").exists()
    assert "share of wall time synchronizing" in result.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "hangup"])
def test_ctrl_c_stops_every_process(tmp_path, sig):
    """Ctrl-C, and a closed terminal or dropped ssh session (SIGHUP: the workers and the coordinator, in sessions of
    their own, trained on with nobody to stop them), stop every process and end with the summary."""
    spec = tiny_spec(run={"rounds": 1000, "workers": 2})
    config = write_spec(spec, tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli.main", "run", str(config), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for(lambda: _round_reached(run_dir, 1), 120, "the first round")
        launcher.send_signal(sig)
        output, _ = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + sig, output  # 130 for Ctrl-C, 129 for SIGHUP
    assert f"stopped by {sig.name}" in output
    table = json.loads((run_dir / "processes.json").read_text())
    pids = [table["coordinator"], *table["workers"]]
    assert len(pids) == 3 and not [pid for pid in pids if _alive(pid)], "processes outlived the launcher"


def _round_reached(run_dir, version: int) -> bool:
    db = run_dir / "state" / "state.sqlite"
    if not db.exists():
        return False
    store = StateStore(run_dir / "state")
    try:
        return int(store.get("version") or 0) >= version
    finally:
        store.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
