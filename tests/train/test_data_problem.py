"""`data_problem`: a run whose workers could not build its data for its model is refused before anything starts.

Each case was accepted before: the workers left the swarm at their first step ("cannot build the model or data")
and `rcswarm run` ended in a traceback from its final evaluation, or the step failed inside the model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.train.inner import data_problem, make_sampler


def spec_of(model: dict, data: dict) -> RunSpec:
    return RunSpec.from_dict({"model": model, "data": data})


LSTM = {"name": "lstm_lm", "preset": "small"}
FRAME = {"name": "frame", "preset": "small"}


@pytest.mark.parametrize(
    "model, data, expected",
    [
        (LSTM, {"source": "diag", "task": "copy"}, "data.task = 'copy' is invalid: expected one of ['frjt', 'maze', 'mqar', 's5']"),
        (LSTM, {"source": "diag", "task": "s5", "task_config": {"bogus": 1}},
         "data.task_config = {'bogus': 1} is invalid for task 's5': S5Config.bogus: unknown field"),
        (LSTM, {"source": "diag", "task": "s5", "task_config": {"max_length": -3}},
         "data.task_config = {'max_length': -3} is invalid for task 's5': S5Config.max_length=-3"),
        # mqar's 8,192 tokens into a 256-token embedding: an index error inside the first step.
        (LSTM, {"source": "diag", "task": "mqar"},
         "data.task = 'mqar' has 8192 tokens: the model's vocab_size = 256 is too small; "
         "expected [model.overrides] vocab_size >= 8192"),
        # maze's 1,024 target cells into 256 logits: the same inside the loss.
        (LSTM, {"source": "diag", "task": "maze"},
         "data.task = 'maze' has 1024 target classes: the model has 256 logits a position; "
         "expected [model.overrides] num_classes (or vocab_size) >= 1024"),
        ({"name": "psm", "preset": "tiny", "overrides": {"num_classes": 8}}, {"source": "diag", "task": "s5"},
         "data.task = 's5' has 120 target classes: the model has 8 logits a position"),
        (FRAME, {"source": "diag", "task": "s5"}, "data.source = 'diag' trains a token model, and FrameModelConfig is not one"),
        (FRAME, {"source": "stdlib"}, "data.source = 'stdlib' trains a token model, and FrameModelConfig is not one"),
        ({**LSTM, "overrides": {"vocab_size": 100}}, {"source": "stdlib"},
         'data.source = "stdlib" trains on bytes: expected [model.overrides] vocab_size >= 256, got 100'),
        (FRAME, {"source": "typing", "task_config": {"rows": 3, "bogus": 2}},
         "data.task_config = {'rows': 3, 'bogus': 2} is invalid: unknown keys ['bogus', 'rows'] with source = \"typing\""),
        (FRAME, {"source": "typing", "task_config": {"n_documents": 0}}, "TypingConfig.n_documents=0"),
        (LSTM, {"source": "typing"}, "data.source = 'typing' needs a frame model"),
        (LSTM, {"source": "git", "task_config": {"dataset": "somewhere"}}, "data.source = 'git' needs a frame model"),
    ],
)
def test_data_a_worker_cannot_build_is_refused_with_the_key_named(model, data, expected):
    problem = data_problem(spec_of(model, data))
    assert problem is not None and expected in problem, problem


@pytest.mark.parametrize(
    "model, data",
    [
        (LSTM, {"source": "stdlib"}),
        (LSTM, {"source": "diag", "task": "s5", "task_config": {"max_length": 8}}),
        ({**LSTM, "overrides": {"vocab_size": 8192}}, {"source": "diag", "task": "mqar"}),
        (LSTM, {"source": "diag", "task": "mqar", "task_config": {"vocab_size": 256, "seq_len": 64}}),
        ({"name": "psm", "preset": "tiny", "overrides": {"vocab_size": 7, "num_classes": 1024}}, {"source": "diag", "task": "maze"}),
        (FRAME, {"source": "typing", "task_config": {"n_documents": 4}}),
        (FRAME, {"source": "git", "task_config": {"dataset": "on/the/workers/disk"}}),  # opened where a worker reads it
    ],
)
def test_data_a_worker_can_build_passes_and_its_first_batch_fits_the_model(model, data):
    spec = spec_of(model, data)
    assert data_problem(spec) is None
    if data["source"] == "git":
        return
    config = registry.make_config(spec.model.name, spec.model.preset, spec.model.overrides)
    sampler = make_sampler(spec.data, seed=0, model_config=config)
    assert sampler is not None


def test_the_launcher_opens_the_git_dataset_its_workers_would_read(tmp_path):
    spec = spec_of(FRAME, {"source": "git", "task_config": {"dataset": str(tmp_path / "none")}})
    assert data_problem(spec) is None
    problem = data_problem(spec, open_dataset=True)
    assert problem is not None and "manifest.json: no such file" in problem


def test_a_worker_building_the_data_gets_the_same_error(tmp_path):
    """The worker's own check (make_sampler) is the one `data_problem` runs: a spec served by an older
    coordinator that did not check still fails with the message, not inside the model."""
    spec = spec_of(LSTM, {"source": "diag", "task": "mqar"})
    config = registry.make_config("lstm_lm", "small", {})
    with pytest.raises(ValueError, match="vocab_size = 256 is too small"):
        make_sampler(spec.data, seed=0, model_config=config)


@pytest.mark.parametrize("command", ["coordinator", "run"])
def test_the_coordinator_and_the_launcher_refuse_it_before_writing_anything(command, tmp_path, capsys):
    from rcswarm.cli import coordinator as coordinator_cli
    from rcswarm.cli import run as run_cli

    config = tmp_path / "run.toml"
    config.write_text(spec_of(LSTM, {"source": "diag", "task": "mqar"}).to_toml())
    out = tmp_path / "out"
    if command == "coordinator":
        status = coordinator_cli.main(["--config", str(config), "--state-dir", str(out), "--port", "0", "--token", "t"])
    else:
        status = run_cli.main([str(config), "--run-dir", str(out)])
    assert status == 2
    assert f"rcswarm {command}: data.task = 'mqar' has 8192 tokens:" in capsys.readouterr().err
    assert not out.exists()


TRANSFORMER = {"name": "transformer", "preset": "tiny"}  # max_len 128


def spec_with(model: dict, data: dict, **tables: dict) -> RunSpec:
    return RunSpec.from_dict({"model": model, "data": data, **tables})


@pytest.mark.parametrize(
    "spec, expected",
    [
        # 10 logits for 256 byte targets: "Target 112 is out of bounds" inside the first step's loss.
        (spec_with({"name": "lstm", "preset": "tiny", "overrides": {"num_classes": 10}}, {"source": "stdlib"}),
         '[model.overrides] num_classes = 10: data.source = "stdlib" predicts the next byte; expected num_classes >= 256'),
        # Windows past the position table: a ValueError inside the first step (or the first held-out loss).
        (spec_with(TRANSFORMER, {"seq_len": 256}),
         "data.seq_len = 256: model 'transformer' takes windows of at most max_len = 128 positions"),
        (spec_with(TRANSFORMER, {"seq_len": 64}, run={"eval_seq_len": 200}), "run.eval_seq_len = 200: model"),
        (spec_with(TRANSFORMER, {"seq_len": 64}, curriculum={"schedule": [[0, 64, 4], [10, 256, 2]]}),
         "curriculum.schedule = [[0, 64, 4], [10, 256, 2]]: model 'transformer' takes windows of at most max_len = 128"),
        (spec_with(TRANSFORMER, {"seq_len": 64}, curriculum={"worker_seq_lens": [64, 129]}),
         "curriculum.worker_seq_lens = [64, 129]: model"),
        (spec_with(TRANSFORMER, {"seq_len": 64}, curriculum={"policy": "adaptive", "seq_lens": [64, 512],
                                                           "alpha_inf": 1.0, "tau": 1.0}),
         "curriculum.seq_lens = [64, 512]: model"),
        (spec_with(TRANSFORMER, {"seq_len": 64}, sweep={"seq_lens": [64, 512]}), "sweep.seq_lens = [64, 512]: model"),
        # A 20-byte held-out split: "the 'val' split has 20 bytes" at the worker's first evaluation.
        (spec_with(LSTM, {"seq_len": 32, "max_bytes": 20000, "val_fraction": 0.001}),
         "data.max_bytes = 20000 with data.val_fraction = 0.001 leaves a held-out split of 20 bytes, shorter than a "
         "window of 32 positions and its next byte; expected a split of at least 33 bytes"),
        (spec_with(LSTM, {"seq_len": 32, "max_bytes": 20000}, run={"eval_seq_len": 1000}),
         "leaves a held-out split of 1000 bytes, shorter than a window of 1000 positions"),
        (spec_with(LSTM, {"seq_len": 32, "max_bytes": 2000}, sweep={"seq_lens": [32, 2048]}, run={"eval_seq_len": 32}),
         "leaves a training split of 1900 bytes, shorter than a window of 2048 positions"),
        # Streaming BPTT of a model without encode()/core_loss(): refused inside the first step.
        (spec_with({"name": "lstm_lm", "preset": "tiny"}, {"seq_len": 16}, inner={"bptt_chunk": 4}),
         "inner.bptt_chunk = 4: streaming BPTT needs a model with encode() and core_loss() (a StepModel), and model "
         "'lstm_lm' (ResidualLSTMLM) is not one"),
    ],
)
def test_a_run_that_fails_at_its_workers_first_step_is_refused_with_the_key_named(spec, expected):
    """Each was accepted by the pre-run check and failed at every worker's first step (review of the models and
    training loop, 2026-11-28)."""
    problem = data_problem(spec)
    assert problem is not None and expected in problem, problem


@pytest.mark.parametrize(
    "spec",
    [
        spec_with(TRANSFORMER, {"seq_len": 128}),
        spec_with({**TRANSFORMER, "overrides": {"max_len": 256}}, {"seq_len": 256}),
        # data.seq_len trains nothing in a sweep, nor under a curriculum with its own held-out length.
        spec_with(TRANSFORMER, {"seq_len": 256}, sweep={"seq_lens": [64, 128]}),
        spec_with(TRANSFORMER, {"seq_len": 256}, curriculum={"schedule": [[0, 64, 4], [10, 128, 2]]},
                  run={"eval_seq_len": 128}),
        spec_with(TRANSFORMER, {"source": "diag", "task": "s5", "seq_len": 256}),  # the task sets its lengths
        spec_with({"name": "lstm", "preset": "tiny", "overrides": {"num_classes": 300}}, {"source": "stdlib"}),
        spec_with(FRAME, {"source": "typing"}, inner={"bptt_chunk": 4, "memory_budget_mb": 8.0}),
        # The held-out split takes the held-out windows only: 999 bytes hold run.eval_seq_len = 998.
        spec_with(LSTM, {"seq_len": 32, "max_bytes": 19980}, run={"eval_seq_len": 998},
                  curriculum={"schedule": [[0, 32, 4], [10, 4096, 1]]}),
    ],
)
def test_a_run_its_workers_can_train_passes(spec):
    assert data_problem(spec) is None


def test_core_checkpointing_needs_a_segment_step_model(monkeypatch):
    """memory_budget_mb > 0 of a StepModel without core_segment() failed at the first step; a builder that is not a
    class is looked at through a model built on the meta device."""
    from tests.helpers.bptt import DropoutStepModel

    get = registry.get
    monkeypatch.setattr(registry, "get", lambda name: dataclasses.replace(get(name), build=lambda config: DropoutStepModel()))
    streaming = spec_with(FRAME, {"source": "typing"}, inner={"bptt_chunk": 4})
    assert data_problem(streaming) is None
    checkpointed = spec_with(FRAME, {"source": "typing"}, inner={"bptt_chunk": 4, "memory_budget_mb": 8.0})
    problem = data_problem(checkpointed)
    assert problem is not None and problem.startswith(
        "inner.memory_budget_mb = 8.0: core checkpointing needs a model with encode(), core_loss() and core_segment() "
        "(a SegmentStepModel), and model 'frame' (DropoutStepModel) is not one"), problem


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml")),
                         ids=lambda path: path.name)
def test_every_example_config_passes_the_checks(path: Path) -> None:
    """The configs the docs point users at are runs the checks let through (each new check is tried on them)."""
    assert data_problem(RunSpec.from_toml(path)) is None
