"""Part (d) of the GPU check: a 2-worker swarm on the one device for a few rounds.

`rcswarm run` (a coordinator and two worker processes on loopback, workers on `--device auto`, so both on the
GPU when there is one) trains the tiny frame model on typing frames with streaming BPTT (the CUDA pager on a
GPU) and, on CUDA, bf16 autocast, for `rounds` DiLoCo rounds (windows of 256 frames, batch 8; on the CPU,
for tests, 32 frames, batch 4, float32). The row passes when the run completed every
round, both workers joined on the expected device (from the coordinator's log), every round closed with
finite losses and the held-out loss of the final parameters is below the initial one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rcswarm.cli.gpu_check.report import ERROR, FAIL, PASS, Row

JOINED = re.compile(r"join: (worker-\d+) \(([^)]*)\) as ")
# Seconds `rcswarm run` gets to stop its processes (its own budget ends the run this long before the timeout).
STOP_GRACE_S = 30.0
# The longest (d) runs: `rcswarm run` to completion.
TIMEOUT_S = 480.0
MIN_RUN_MINUTES = 0.5


def swarm_config(rounds: int, precision: str, seq_len: int = 256, batch: int = 8) -> str:
    """The run's TOML: 2 workers, the tiny frame model on typing frames, streaming BPTT, `precision`."""
    return f"""[run]
name = "gpu-check-swarm"
rounds = {rounds}
workers = 2

[model]
name = "frame"
preset = "tiny"

[data]
source = "typing"
seq_len = {seq_len}
batch_size = {batch}

[data.task_config]
n_documents = 16

[inner]
lr = 0.003
steps = 5
weight_decay = 0.0
bptt_chunk = 32
precision = "{precision}"

[sync]
codec = "int8"
round_deadline_s = 300
"""


def joined_devices(coordinator_log: str) -> dict[str, str]:
    """Worker name -> the device it joined with, from the coordinator's log lines."""
    return dict(JOINED.findall(coordinator_log))


def judge(summary: dict, devices: dict[str, str], expected_device: str, rounds: int) -> Row:
    """The row of a finished run from its summary.json and the devices the workers joined with."""
    ok_devices = len(devices) == 2 and all(d.startswith(expected_device) for d in devices.values())
    losses = (summary.get("first_round_loss"), summary.get("last_round_loss"))
    finite = all(isinstance(x, float) and math.isfinite(x) for x in losses)
    initial, final = summary.get("val_loss_initial"), summary.get("val_loss_final")
    learned = isinstance(initial, float) and isinstance(final, float) and final < initial
    completed = summary.get("outcome") == "completed" and summary.get("rounds") == rounds
    status = PASS if (ok_devices and finite and learned and completed) else FAIL
    value = f"{summary.get('rounds')} of {rounds} rounds, {summary.get('tokens_per_second', 0):,.0f} tok/s"
    detail = (f"workers on {sorted(devices.values()) or 'unknown'} (expected {expected_device}); "
              f"held-out loss {initial} → {final}; {summary.get('outcome_message', '')}")
    return Row("swarm", "2-worker swarm, tiny frame model", value, detail, status,
               {"summary": summary, "devices": devices, "expected_device": expected_device})


def stop(proc: subprocess.Popen, process_table: Path) -> None:
    """End `rcswarm run` (SIGTERM: it stops its coordinator and workers), and after STOP_GRACE_S kill it and every
    process its table lists (they run in sessions of their own, beyond the launcher's signals)."""
    proc.terminate()
    try:
        proc.communicate(timeout=STOP_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        proc.kill()
    try:
        table = json.loads(process_table.read_text())
    except (OSError, ValueError):
        table = {}
    for pid in [table.get("coordinator"), *table.get("workers", [])]:
        if isinstance(pid, int):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    proc.communicate()


def run_swarm(expected_device: str, rounds: int = 3, timeout: float = TIMEOUT_S, keep: Path | None = None) -> Row:
    """Part (d): write the config, run `rcswarm run` to completion (at most `timeout` s), judge the result."""
    precision = "bf16" if expected_device == "cuda" else "fp32"
    window = {"seq_len": 256, "batch": 8} if expected_device == "cuda" else {"seq_len": 32, "batch": 4}
    with tempfile.TemporaryDirectory(prefix="rcswarm-gpu-swarm-") as scratch:
        root = keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        config = root / "swarm.toml"
        config.write_text(swarm_config(rounds, precision, **window))
        run_dir = root / "run"
        # The launcher's own budget ends the run (every process) STOP_GRACE_S before the timeout; past the timeout
        # it is stopped, and what it started is killed: a swarm left training would skew the parts after it.
        minutes = max(MIN_RUN_MINUTES, (timeout - STOP_GRACE_S) / 60)
        proc = subprocess.Popen([sys.executable, "-m", "rcswarm.cli", "run", str(config), "--run-dir", str(run_dir),
                                 "--minutes", f"{minutes:.3f}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc, run_dir / "processes.json")
            return Row("swarm", "2-worker swarm, tiny frame model", "not finished", f"timed out after {timeout:g} s",
                       ERROR)
        summary_path = run_dir / "summary.json"
        if not summary_path.exists():
            tail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
            return Row("swarm", "2-worker swarm, tiny frame model", "failed", f"exit {proc.returncode}: {tail}", ERROR)
        log = (run_dir / "logs" / "coordinator.log").read_text(errors="replace")
        return judge(json.loads(summary_path.read_text()), joined_devices(log), expected_device, rounds)
