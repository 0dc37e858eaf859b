"""The operator's day (issue #33): a coordinator restarted on its state dir keeps every run's data clean; one
coordinator per state dir and port; the usual mistakes end at once with one line saying what was found."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from rcswarm.coordinator.sweep import run_state_dir
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.coordinator import free_port
from tests.helpers.processes import logs_of, start_coordinator_process, worker_env
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for


@pytest.mark.wide
def test_a_sweep_restarted_by_sigint_keeps_each_runs_rows_and_its_workers(tmp_path, spawn_worker):
    # Time-boxed rounds, so the runs keep pace (one worker each, a round 0.5 s at every length) and none finishes
    # before every worker re-joined after the restart (a worker's backoff can take seconds).
    base = tiny_spec(run={"rounds": 20}, inner={"steps": 20}, coordinator={"lease_s": 30.0},
                     sync={"round": "time", "round_seconds": 0.5})
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [4, 8, 16], "batch_sizes": [8, 4, 2]}})
    config, state_dir, port = write_spec(spec, tmp_path / "sweep.toml"), tmp_path / "state", free_port()
    log_path = tmp_path / "coordinator.log"
    coordinator = start_coordinator_process(config, state_dir, port, log_path)
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN, retry=RetryPolicy(max_elapsed_s=60.0))
    try:
        procs = [spawn_worker(f"127.0.0.1:{port}", f"w{i}") for i in range(3)]
        wait_for(lambda: all(r.version >= 2 for r in client.status().runs), 180, "two rounds in each run",
                 interval=0.05)
        # Mid-round: the workers are training, their rows of this round not yet reported.
        coordinator.send_signal(signal.SIGINT)
        assert coordinator.wait(timeout=30) == 0, log_path.read_text()
        coordinator = start_coordinator_process(config, state_dir, port, log_path)
        for proc in procs:
            assert proc.wait(timeout=300) == 0, logs_of(procs) + log_path.read_text()
    finally:
        client.close()
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=30)
    # Every run's metric rows were trained at its own length: none came from another run's worker.
    for index, run_spec in enumerate(spec.sweep_runs()):
        rows = read_state(run_state_dir(state_dir, index, run_spec), lambda store: store.metric_rows())
        strays = sorted({(r.worker_id, r.version, r.seq_len) for r in rows if r.seq_len != run_spec.data.seq_len})
        assert not strays, f"run {index} (L={run_spec.data.seq_len}) holds rows of another length: {strays}"
    # Each worker went back to the run it trained before the restart (both runs still wanted workers).
    logs = {proc.log_path.stem: proc.log_path.read_text() for proc in procs}
    for name, text in logs.items():
        runs = [line.split(" joined ", 1)[1].split(" as ", 1)[0] for line in text.splitlines() if " joined " in line]
        assert len(runs) >= 2 and runs[1] == runs[0], f"{name} joined {runs}"
    command = [sys.executable, "-m", "rcswarm.cli", "fit", str(state_dir), "--out", str(tmp_path / "fit.png")]
    fitted = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert fitted.returncode == 0 and "skipped" not in fitted.stderr, fitted.stdout + fitted.stderr


def _coordinator(config, state_dir, port) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config),
               "--state-dir", str(state_dir), "--port", str(port)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=worker_env())


def test_a_second_coordinator_is_refused_on_a_held_state_dir_a_port_in_use_and_a_config_of_other_runs(tmp_path):
    single = tiny_spec(run={"rounds": 0})
    sweep = single.from_dict({**single.to_dict(), "sweep": {"seq_lens": [8, 16]}})
    sweep_config, single_config = write_spec(sweep, tmp_path / "sweep.toml"), write_spec(single, tmp_path / "run.toml")
    state_dir, port = tmp_path / "state", free_port()
    first = start_coordinator_process(sweep_config, state_dir, port, tmp_path / "coordinator.log")
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN, retry=RetryPolicy(max_elapsed_s=30.0))
    try:
        holder = f"pid {first.pid} on {socket.gethostname()}, serving on 127.0.0.1:{port}"
        busy = _coordinator(sweep_config, state_dir, free_port())
        assert (busy.returncode, busy.stderr) == (1, (
            f"rcswarm coordinator: state dir {state_dir} is in use by another coordinator ({holder}); "
            "stop it first, or give this one another --state-dir\n")), busy.stderr
        # Each run's own state dir is held too.
        inner = _coordinator(single_config, state_dir / "run0-L8", free_port())
        assert inner.returncode == 1 and f"state dir {state_dir / 'run0-L8'} is in use" in inner.stderr, inner.stderr
        # The port is the first coordinator's alone (no SO_REUSEPORT): one line, and every status call reaches it.
        taken = _coordinator(single_config, tmp_path / "elsewhere", port)
        assert (taken.returncode, taken.stderr) == (1, (
            f"rcswarm coordinator: could not bind 127.0.0.1:{port}: Address already in use "
            "(another coordinator, or another program, uses it)\n")), taken.stderr
        # What that failed start created is gone: the next start there, its config changed, finds no unserved run.
        assert not (tmp_path / "elsewhere").exists() and not list(tmp_path.glob(".elsewhere.discarded-*"))
        assert {client.status().run_id for _ in range(6)} == {"test"}
    finally:
        client.close()
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=30) == 0
    # A restart with a config of other runs than the state dir holds is refused before anything is created.
    other = _coordinator(single_config, state_dir, free_port())
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    assert f"state dir {state_dir} holds a sweep's runs run0-L8, run1-L16, but the config describes one run" \
        in other.stderr
    assert not (state_dir / "state.sqlite").exists()
    assert "stopping: run test-L8-" in (tmp_path / "coordinator.log").read_text()


def test_a_worker_given_the_dashboards_port_or_a_url_or_a_config_it_ignores_ends_at_once(start_coordinator,
                                                                                         spawn_worker):
    local = start_coordinator(tiny_spec(run={"rounds": 0}), http_port=0)
    dashboard = f"127.0.0.1:{local.running.dashboard.port}"
    started = time.monotonic()
    lost = spawn_worker(dashboard, "lost")
    url = spawn_worker(f"http://{local.target}", "url")
    configured = spawn_worker(local.target, "configured", "--config", "run.toml")
    assert [lost.wait(timeout=60), url.wait(timeout=60), configured.wait(timeout=60)] == [1, 2, 2]
    assert time.monotonic() - started < 60  # not the 300 s of patience
    errors = [line for line in lost.log_path.read_text().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"{dashboard} answered, but not as a gRPC server" in errors[0], errors
    assert "retrying" not in lost.log_path.read_text()
    assert url.log_path.read_text().strip() == (
        f"rcswarm worker: --coordinator 'http://{local.target}': http:// is a URL scheme, but the coordinator speaks "
        f"gRPC, not HTTP: expected HOST:PORT (e.g. {local.target})")
    assert "--config: only with --backend hivemind" in configured.log_path.read_text()
    status = subprocess.run([sys.executable, "-m", "rcswarm.cli", "status", "--coordinator", dashboard],
                            capture_output=True, text=True, timeout=60, env=worker_env())
    assert status.returncode == 1 and status.stderr.startswith(f"rcswarm status: {dashboard} answered, but not as a "
                                                               "gRPC server"), status.stderr
