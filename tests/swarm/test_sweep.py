"""Sweeps: several runs in one coordinator, workers scheduled across them and moved between them."""

from __future__ import annotations

import io
import json
import urllib.request

from rich.console import Console

from rcswarm.cli import status as status_cli
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.sweep import SweepCoordinator, run_state_dir
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.processes import logs_of
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.waiting import wait_for


def test_a_sweep_trains_every_length_and_moves_workers(tmp_path, spawn_worker):
    base = tiny_spec(run={"rounds": 3}, inner={"steps": 4}, coordinator={"lease_s": 120.0})
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [8, 16], "batch_sizes": [2, 32]}})
    sweep = SweepCoordinator(spec, tmp_path / "state")
    running = RunningCoordinator(sweep, TOKEN, http_port=0).start()
    client = CoordinatorClient(f"127.0.0.1:{running.port}", TOKEN, retry=RetryPolicy(max_elapsed_s=30.0))
    try:
        # The L = 16 run finishes last, whatever the machine's load: a member that never trains holds its rounds
        # until the L = 8 run has finished and its workers moved (the second of two joins lands on L = 16).
        placeholder, holder = client.join("placeholder", "cpu", 1), client.join("holder", "cpu", 1)
        assert holder.run_id == sweep.runs[1].run_id
        client.leave(placeholder, "placed the holder")
        procs = [spawn_worker(f"127.0.0.1:{running.port}", f"w{i}") for i in range(3)]
        wait_for(lambda: any(w.state == pb.WORKER_STATE_REASSIGNED for w in sweep.status().workers), 240,
                 "a worker of the finished L = 8 run to move")
        client.leave(holder, "the L = 8 run finished")
        for proc in procs:
            assert proc.wait(timeout=240) == 0, logs_of(procs)
        status = sweep.status()
        assert status.run_state == pb.RUN_STATE_FINISHED
        printed = io.StringIO()
        status_cli.report(status, Console(file=printed, width=200))
        assert "runs of the sweep" in printed.getvalue() and "test-L16" in printed.getvalue()
        assert [(r.seq_len, r.batch_size, r.version) for r in status.runs] == [(8, 2, 3), (16, 32, 3)]
        with urllib.request.urlopen(running.dashboard.url + "api/status", timeout=20) as response:
            dashboard = json.loads(response.read())
    finally:
        client.close()
        running.stop(grace=0.5)
    for index, run_spec in enumerate(spec.sweep_runs()):
        state_dir = run_state_dir(tmp_path / "state", index, run_spec)
        seq_lens = {row.seq_len for row in read_state(state_dir, lambda store: store.metric_rows()) if row.tokens > 0}
        assigned = len(read_state(state_dir, lambda store: store.events("assign")))
        assert seq_lens == {run_spec.data.seq_len}
        assert assigned >= 1
    # Workers whose run finished first moved to the other run (a REASSIGNED membership).
    assert any(w.state == pb.WORKER_STATE_REASSIGNED for w in status.workers), [(w.worker_id, w.reason) for w in status.workers]
    # The dashboard shows both runs on their own steps (3 rounds of 4 inner steps), whichever workers trained them.
    assert [(r["seq_len"], r["version"], r["run_state"]) for r in dashboard["runs"]] == [(8, 3, "finished"), (16, 3, "finished")]
    assert [(r["metrics"]["steps"], r["metrics"]["last_step"], r["metrics"]["seq_lens"]) for r in dashboard["runs"]] == [
        (12, 12, [8]), (12, 12, [16])]
    reassigned = [w for w in dashboard["workers"] if w["state"] == "reassigned"]
    run_of = {r["seq_len"]: r["run_id"] for r in dashboard["runs"]}
    assert reassigned and all(w["reason"].startswith("reassigned") and w["run_id"] == run_of[w["run_seq_len"]]
                              for w in reassigned), reassigned


def test_rcswarm_run_runs_a_local_sweep_and_fits_it(tmp_path):
    import json
    import subprocess
    import sys

    base = tiny_spec(run={"rounds": 2, "workers": 3}, inner={"steps": 3})
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [4, 8, 16]}})
    config = tmp_path / "sweep.toml"
    config.write_text(spec.to_toml())
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli.main", "run", str(config), "--run-dir", str(tmp_path / "run")],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [r["seq_len"] for r in summary["runs"]] == [4, 8, 16]
    assert all(r["rounds"] == 2 for r in summary["runs"])
    assert "alpha" in summary["fit"] and "·L^(" in result.stdout
    # Issue #30: each run's forecasts as the coordinator made them (2 rounds: "not enough data", values null).
    for r in summary["runs"]:
        assert r["forecasts"] and r["pruning"] == [] and r["stopped"] is None
        assert all({"at_seconds", "predicted_val_loss", "low", "high"} <= set(f) for f in r["forecasts"])
        assert all(f["predicted_val_loss"] is None and "not enough data" in f["note"] for f in r["forecasts"])
    assert all((tmp_path / "run" / f"final-L{length}.safetensors").exists() for length in (4, 8, 16))


def test_a_fixed_curriculum_changes_length_and_batch_by_step(start_coordinator, spawn_worker):
    base = tiny_spec(run={"rounds": 4}, inner={"steps": 5})
    spec = base.from_dict({**base.to_dict(), "curriculum": {"schedule": [[0, 16, 4], [10, 32, 2]]}})
    local = start_coordinator(spec)
    worker = spawn_worker(local.target, "learner")
    assert worker.wait(timeout=180) == 0, logs_of([worker])
    tokens: dict[tuple[int, int, int], list[int]] = {}
    for row in read_state(local.state_dir, lambda store: store.metric_rows()):
        if row.tokens > 0:
            tokens.setdefault((row.version, row.seq_len, row.batch), []).append(row.tokens)
    rows = [(*key, min(trained), max(trained)) for key, trained in sorted(tokens.items())]
    assert rows == [(0, 16, 4, 64, 64), (1, 16, 4, 64, 64), (2, 32, 2, 64, 64), (3, 32, 2, 64, 64)]
