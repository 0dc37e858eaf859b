"""A diagnostic task, and the frame model with streaming BPTT, trained by a local swarm (`rcswarm run` in its own
process)."""

import json
import subprocess
import sys

import pytest

from rcswarm.config.runspec import RunSpec


def run_local_swarm(spec: RunSpec, tmp_path) -> dict:
    """`rcswarm run` on this spec in a subprocess; the run's summary.json."""
    config = tmp_path / "run.toml"
    config.write_text(spec.to_toml())
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli.main", "run", str(config), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.slow
def test_a_swarm_trains_a_diagnostic_task(tmp_path):
    spec = RunSpec.from_dict({
        "run": {"name": "diag", "rounds": 3, "workers": 2},
        "model": {"name": "lstm", "preset": "tiny", "overrides": {"vocab_size": 121, "num_classes": 120}},
        "data": {"source": "diag", "task": "s5", "task_config": {"max_length": 8}, "batch_size": 8},
        "inner": {"steps": 5, "lr": 1e-2},
    })
    summary = run_local_swarm(spec, tmp_path)
    assert summary["rounds"] == 3 and summary["tokens"] > 0


@pytest.mark.slow
def test_a_swarm_trains_the_frame_model_with_streaming_bptt(tmp_path):
    spec = RunSpec.from_dict({
        "run": {"name": "frames", "rounds": 2, "workers": 2},
        "model": {"name": "frame", "preset": "tiny"},
        "data": {"source": "typing", "seq_len": 12, "batch_size": 2, "task_config": {"n_documents": 8}},
        "inner": {"steps": 3, "lr": 3e-3, "bptt_chunk": 4},
    })
    summary = run_local_swarm(spec, tmp_path)
    assert summary["rounds"] == 2 and summary["tokens"] == 2 * 2 * 3 * 2 * 12
