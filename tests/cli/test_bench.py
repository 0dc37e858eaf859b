"""`rcswarm bench diag` end to end on tiny models, and a diagnostic task trained by a swarm."""

import json

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


def test_a_model_that_cannot_take_the_tasks_sequences_is_refused_before_any_trains(tmp_path, capsys):
    """The maze's 320 positions against the tiny transformer's max_len 128: it failed after the LSTM before it had
    trained its share of the budget; now nothing trains and nothing is written."""
    out = tmp_path / "out"
    code = diag_bench.main(["--task", "maze", "--models", "lstm:tiny", "transformer:tiny", "--budget-minutes", "5",
                            "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "model transformer:tiny cannot take the training task's sequences" in err and "max_len=128" in err
    assert not out.exists()


def test_a_swarm_config_of_a_task_scoring_more_than_the_default_seq_len_passes_the_runs_checks(tmp_path):
    """A diagnostic run's data.seq_len bounds the scored positions of one sequence (`scored_per_example`): the
    written config of a maze of 400 moves had the default 256, which `data_problem` refuses (review, 2026-11-29)."""
    from rcswarm.train.inner import data_problem

    out = tmp_path / "diag"
    assert diag_bench.main(["--task", "maze", "--models", "lstm:tiny", "--max-steps", "1", "--eval-examples", "2",
                            "--batch-size", "2", "--task-arg", "num_moves=400", "--out", str(out)]) == 0
    spec = RunSpec.from_toml(out / "swarm" / "lstm-tiny.toml")
    assert spec.data.seq_len == 400 and data_problem(spec) is None, data_problem(spec)
