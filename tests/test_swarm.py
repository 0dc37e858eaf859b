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
from rcswarm.worker import CoordinatorClient, RetryPolicy
from tests.conftest import TOKEN, free_port, logs_of, sql, tiny_spec, wait_for, worker_env, write_spec

pytestmark = pytest.mark.slow


def worker_digests(state_dir) -> dict[int, set[str]]:
    """version -> the parameter digests workers reported right after pulling it."""
    rows = sql(state_dir, "SELECT version, param_sha256 FROM metrics WHERE param_sha256 != ''")
    digests: dict[int, set[str]] = {}
    for version, digest in rows:
        digests.setdefault(version, set()).add(digest)
    return digests


def coordinator_digests(state_dir) -> dict[int, str]:
    """version -> digest of the global parameters of that version (from the rounds that made them)."""
    rows = sql(state_dir, "SELECT version + 1, param_sha256 FROM rounds")
    return dict(rows)


def round_losses(state_dir) -> list[float]:
    rows = sql(state_dir, "SELECT version, AVG(loss) FROM metrics WHERE tokens > 0 GROUP BY version ORDER BY version")
    return [loss for _, loss in rows]


def test_three_workers_train_in_lockstep(start_coordinator, spawn_worker):
    spec = tiny_spec(run={"rounds": 4}, inner={"steps": 8}, sync={"codec": "int8", "min_reports": 3})
    local = start_coordinator(spec)
    version0 = local.service.param_sha256.hex()
    procs = [spawn_worker(local.target, f"w{i}") for i in range(3)]
    for proc in procs:
        assert proc.wait(timeout=180) == 0, logs_of(procs)
    status = local.client().status()
    assert status.version == 4 and status.run_state == pb.RUN_STATE_FINISHED
    assert all(w.state == pb.WORKER_STATE_LEFT for w in status.workers)
    assert [r.reports for r in status.rounds if r.closed_at] == [3, 3, 3, 3]
    # Every worker's parameters after each pull equal the coordinator's, bit for bit.
    reported = worker_digests(local.state_dir)
    expected = {0: version0, **coordinator_digests(local.state_dir)}
    for version in range(4):
        assert reported[version] == {expected[version]}, f"version {version}: {reported[version]} vs {expected[version]}"
    losses = round_losses(local.state_dir)
    assert losses[-1] < losses[0] - 0.3, losses


def test_a_killed_worker_is_dropped_at_the_round_deadline(start_coordinator, spawn_worker):
    spec = tiny_spec(run={"rounds": 6}, inner={"steps": 100}, coordinator={"lease_s": 120.0}, sync={"round_deadline_s": 6.0})
    local = start_coordinator(spec)
    procs = [spawn_worker(local.target, f"w{i}") for i in range(3)]
    client = local.client()
    killed_in = wait_for(lambda: client.status().version, 120, "round 0 to close")
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait(timeout=10)
    for proc in procs[1:]:
        assert proc.wait(timeout=180) == 0, logs_of(procs)
    rounds = [r for r in client.status().rounds if r.closed_at]
    assert len(rounds) == 6
    deadline_rounds = [r for r in rounds if "deadline" in r.close_reason and r.version >= killed_in]
    assert deadline_rounds, [(r.version, r.reports, r.close_reason) for r in rounds]
    first = deadline_rounds[0]
    assert first.reports == 2 and first.closed_at - first.opened_at >= 6.0
    # After the kill the run goes on with the two survivors.
    later = [r.reports for r in rounds if r.version > first.version]
    assert later and all(n == 2 for n in later), [(r.version, r.reports, r.close_reason) for r in rounds]


def start_coordinator_process(config, state_dir, port, log_path) -> subprocess.Popen:
    port_file = state_dir.parent / "port.json"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.coordinator", "--config", str(config), "--state-dir", str(state_dir),
         "--port", str(port), "--port-file", str(port_file)],
        env=worker_env(), stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,
    )
    wait_for(port_file.exists, 60, "the coordinator to serve")
    return proc


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


def test_joining_a_finished_run_exits_cleanly_and_a_full_swarm_refuses(start_coordinator, spawn_worker):
    local = start_coordinator(tiny_spec(run={"rounds": 1}, coordinator={"max_workers": 1}))
    first = spawn_worker(local.target, "first")
    assert first.wait(timeout=120) == 0, logs_of([first])
    late = spawn_worker(local.target, "late")
    assert late.wait(timeout=60) == 0, logs_of([late])
    assert "finished" in Path(late.log_path).read_text()

    busy = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"max_workers": 1}))
    holder = busy.client()
    holder.join("holder", "cpu", 1)
    refused = spawn_worker(busy.target, "refused", "--patience-s", "2")
    assert refused.wait(timeout=60) == 1
    assert "RESOURCE_EXHAUSTED" in Path(refused.log_path).read_text() and "max_workers=1" in Path(refused.log_path).read_text()
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


def test_ctrl_c_stops_every_process(tmp_path):
    spec = tiny_spec(run={"rounds": 1000, "workers": 2})
    config = write_spec(spec, tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli.main", "run", str(config), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for(lambda: _round_reached(run_dir, 1), 120, "the first round")
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, output
    assert "stopped by a signal" in output
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
