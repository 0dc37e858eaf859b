"""`rcswarm bench diag` end to end on tiny models, and a diagnostic task trained by a swarm."""

import json
import subprocess
import sys

import pytest

from rcswarm.cli import bench as diag_bench
from rcswarm.config.runspec import RunSpec
from rcswarm.train.inner import make_sampler


def test_bench_diag_writes_table_plot_and_swarm_configs(tmp_path):
    out = tmp_path / "diag"
    code = diag_bench.main([
        "--task", "s5", "--models", "lstm:tiny", "psm:tiny+chunk_size=2", "transformer:tiny",
        "--max-steps", "3", "--eval-examples", "16", "--batch-size", "8", "--task-arg", "max_length=8",
        "--eval-arg", "min_length=10", "--eval-arg", "max_length=12", "--out", str(out),
    ])
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in report["results"]] == ["lstm:tiny", "psm:tiny+chunk_size=2", "transformer:tiny"]
    for result in report["results"]:
        assert result["train"]["steps"] == 3
        assert set(result["eval"]["by_group"]) == {"10", "11", "12"}  # evaluated beyond the training lengths
        assert 0.0 <= result["eval"]["token_accuracy"] <= 1.0
    assert (out / "accuracy.png").stat().st_size > 1000
    assert "length=10" in (out / "results.md").read_text()
    spec = RunSpec.from_toml(out / "swarm" / "psm-tiny-chunk_size-2.toml")
    assert spec.data.source == "diag" and spec.model.overrides["chunk_size"] == 2
    assert spec.model.overrides["num_classes"] == 120


def test_bench_diag_rejects_bad_arguments(tmp_path, capsys):
    assert diag_bench.main(["--task", "s5", "--models", "lstm_lm", "--max-steps", "1", "--out", str(tmp_path)]) == 2
    assert "num_classes" in capsys.readouterr().err
    assert diag_bench.main(["--task", "s5", "--models", "lstm", "--task-arg", "nope=1", "--out", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err


def test_diag_sampler_is_deterministic_and_splits_differ():
    spec = RunSpec.from_dict({"data": {"source": "diag", "task": "mqar", "batch_size": 4,
                                       "task_config": {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4}}})
    a, b = make_sampler(spec.data, 7), make_sampler(spec.data, 7)
    val = make_sampler(spec.data, 7, split="val")
    first = a.next_batch()
    assert all((x == y).all() for x, y in zip(first, b.next_batch(), strict=True))
    assert not (first[0] == val.next_batch()[0]).all()
    assert not (first[0] == a.next_batch()[0]).all()


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
