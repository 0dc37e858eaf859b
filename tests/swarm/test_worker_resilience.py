"""Workers ride out stalls, with real processes: a refused token ends a worker process with its message; a
SIGSTOPped coordinator process is ridden out; a push that times out against it is retried and lands."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rcswarm.worker import Worker
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.coordinator import free_port
from tests.helpers.processes import logs_of, start_coordinator_process
from tests.helpers.specs import TOKEN, tiny_spec, write_spec
from tests.helpers.waiting import wait_for
from tests.helpers.worker import FaultBeforeFirstPush, _options, run_until

FAST = ("--rpc-timeout-s", "1", "--transfer-timeout-s", "3", "--patience-s", "60")


def test_unauthenticated_ends_the_worker_with_its_message(start_coordinator, spawn_worker):
    local = start_coordinator(tiny_spec(run={"rounds": 0}))
    proc = spawn_worker(local.target, "intruder", "--token", "not-the-token", *FAST)
    assert proc.wait(timeout=60) == 1, logs_of([proc])
    log = Path(proc.log_path).read_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "UNAUTHENTICATED" in errors[0] and "join token" in errors[0], log
    assert "Traceback" not in log


def stall(pid: int, seconds: float):
    """A fault: SIGSTOP process `pid` now and SIGCONT it after `seconds`."""
    def fault(_worker: Worker) -> None:
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(seconds, os.kill, (pid, signal.SIGCONT)).start()
    return fault


@pytest.fixture
def coordinator_process(tmp_path: Path, request):
    """A real `python -m rcswarm.cli coordinator` process for one worker; (process, target, client, log).

    The run spec is the tiny one with 3 inner steps and the tables given by indirect parametrization.
    """
    spec = tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 3}, **getattr(request, "param", {}))
    config = write_spec(spec, tmp_path / "run.toml")
    port, log_path = free_port(), tmp_path / "coordinator.log"
    proc = start_coordinator_process(config, tmp_path / "state", port, log_path)
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN, retry=RetryPolicy(max_elapsed_s=30.0))
    try:
        yield proc, f"127.0.0.1:{port}", client, log_path
    finally:
        client.close()
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_sigstopped_coordinator_is_ridden_out(coordinator_process, spawn_worker):
    coordinator, target, client, log_path = coordinator_process
    worker = spawn_worker(target, "patient", *FAST)
    wait_for(lambda: client.status().version >= 2, 60, "two rounds", interval=0.05)
    before = client.status().version
    coordinator.send_signal(signal.SIGSTOP)
    try:
        time.sleep(4.0)  # past the worker's 1 s deadline and its 2 s long poll
    finally:
        coordinator.send_signal(signal.SIGCONT)
    wait_for(lambda: client.status().version >= before + 3, 30, "rounds to resume after the stall", interval=0.05)
    assert worker.poll() is None, logs_of([worker])
    log = Path(worker.log_path).read_text()
    # Which call meets the stall depends on timing: a retried one ("retrying"), or ReportMetrics, whose rows are
    # kept for the next report (seen once: the pull after it was answered just as the coordinator resumed).
    assert "DEADLINE_EXCEEDED" in log and ("retrying" in log or "kept for the next report" in log), log[-3000:]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, logs_of([worker])


# A round that waits for a second report until its deadline: a retried push whose earlier attempt
# landed (the coordinator answered after the client's deadline) meets the open round, ALREADY_EXISTS.
@pytest.mark.slow
@pytest.mark.parametrize("coordinator_process", [{"sync": {"min_reports": 2, "round_deadline_s": 6.0}}], indirect=True)
def test_a_push_that_times_out_is_retried_and_lands(coordinator_process, caplog):
    coordinator, target, client, _ = coordinator_process
    options = _options(target, rpc_timeout_s=1.0, transfer_timeout_s=1.0, patience_s=30.0)
    worker = FaultBeforeFirstPush(options, stall(coordinator.pid, 3.0))
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        code = run_until(worker, lambda w: len(w.pushes) >= 2, 60)
    assert code == 0
    (version, delivered), _ = worker.pushes[:2]
    assert delivered, worker.pushes
    assert any("PushUpdate: DEADLINE_EXCEEDED" in r.getMessage() for r in caplog.records)
    # The retried update was recorded: its round closed with this one report, and the worker trained on.
    rounds = {r.version: r for r in client.status().rounds}
    assert rounds[version].reports == 1 and rounds[version].closed_at > 0
    assert worker.pushes[1][0] == version + 1
