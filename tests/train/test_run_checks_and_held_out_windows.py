"""Review of train/, 2026-11-29: a diagnostic run's data.seq_len below its task's scored positions per sequence (every
update refused by the coordinator's token bound), the held-out loss keeping whole frame windows (memory growing with
L), and a core checkpointing budget too small for one core state (refused only at the worker's first step)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from rcswarm.data.diagnostics import IGNORE_INDEX, make_task
from rcswarm.models import registry
from rcswarm.train import inner
from rcswarm.train.inner import data_problem, loss_sum, make_sampler
from rcswarm.train.round import HELD_OUT_SEED, RoundTrainer
from tests.helpers.specs import tiny_spec

MAZE_MODEL = {"name": "lstm_lm", "preset": "tiny", "overrides": {"vocab_size": 1100}}  # 1024 cells: classes


def test_a_diagnostic_seq_len_below_the_tasks_scored_positions_is_refused_naming_both():
    """num_moves = 400 with the default data.seq_len = 256 passed, and each update claimed 800 tokens against the
    coordinator's bound of batch × seq_len × steps = 512."""
    spec = tiny_spec(model=MAZE_MODEL, data={"source": "diag", "task": "maze", "seq_len": 256, "batch_size": 2,
                                             "task_config": {"num_moves": 400}})
    assert data_problem(spec) == (
        'data.seq_len = 256: with data.source = "diag" it bounds the scored positions of one sequence (the '
        "coordinator's token bound, batch × seq_len × steps), and task 'maze' scores up to 400 a sequence "
        "(data.task_config.num_moves = 400, data.task_config.scored = 'every_move'); expected data.seq_len >= 400")
    assert data_problem(dataclasses.replace(spec, data=dataclasses.replace(spec.data, seq_len=400))) is None
    final = dataclasses.replace(spec.data, seq_len=1, task_config={"num_moves": 400, "scored": "final"})
    assert data_problem(dataclasses.replace(spec, data=final)) is None  # one scored position a sequence
    # Without the coordinator's token bound nothing holds a diagnostic run to data.seq_len (review, 2026-11-29), and
    # a worker's sampler refuses no run for a bound its coordinator may not apply.
    unbound = dataclasses.replace(spec, sync=dataclasses.replace(spec.sync, bound_tokens=False))
    assert data_problem(unbound) is None
    assert make_sampler(spec.data, seed=0) is not None


def test_a_diagnostic_sweep_names_the_run_whose_seq_len_is_too_short():
    spec = tiny_spec(model=MAZE_MODEL, data={"source": "diag", "task": "maze", "seq_len": 200},
                     sweep={"seq_lens": [100, 200]})
    problem = data_problem(spec)
    assert problem is not None and problem.startswith(
        "sweep.seq_lens = [100, 200]: its run of data.seq_len = 100, data.batch_size = 4: data.seq_len = 100:"), problem
    assert problem.endswith("expected data.seq_len >= 160"), problem


@pytest.mark.parametrize("drawn", [False, True], ids=["from-config", "drawn-batch"])
@pytest.mark.parametrize(("task", "config"), [
    ("maze", {"num_moves": 10}), ("maze", {"num_moves": 10, "scored": "final"}),
    ("mqar", {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4}), ("s5", {"min_length": 6, "max_length": 6}),
    ("frjt", {}),
])
def test_the_scored_positions_per_example_are_those_the_task_scores(monkeypatch, task, config, drawn):
    """The per-task formula (and the drawn-batch count, for a task without one) is what a batch scores at most."""
    if drawn:
        monkeypatch.setattr(inner, "SCORED_PER_EXAMPLE", {})
    data = tiny_spec(data={"source": "diag", "task": task, "task_config": config, "seq_len": 64}).data
    built = make_task(task, **config)
    targets = built.batch(16, seed=3).targets  # [B, T]
    scored, _ = inner.scored_per_example(data, built)
    assert scored == int((targets != IGNORE_INDEX).sum(dim=1).max())


def frame_trainer(seq_len: int, bptt_chunk: int, memory_budget_mb: float = 0.0) -> RoundTrainer:
    """The tiny frame model (float64) on typing windows of `seq_len` frames, batch 2."""
    spec = tiny_spec(model={"name": "frame", "preset": "tiny"},
                     data={"source": "typing", "seq_len": seq_len, "batch_size": 2},
                     inner={"bptt_chunk": bptt_chunk, "memory_budget_mb": memory_budget_mb})
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=0).double()
    return trainer


def kept_arrays(batch: Any) -> list[int]:
    """The element counts of the tensors and arrays a cached held-out batch holds (its pair's, or its window's
    fields'; the shared source excluded)."""
    values = batch if isinstance(batch, tuple) else [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    return [int(np.asarray(value).size) if isinstance(value, np.ndarray) else value.numel()
            for value in values if isinstance(value, (np.ndarray, torch.Tensor))]


@pytest.mark.parametrize(("seq_len", "k"), [(40, 8), (37, 2), (150, 8)])
def test_the_held_out_set_of_a_checkpointed_frame_model_keeps_window_offsets_not_frames(seq_len, k):
    """The held-out set kept whole windows of frames ([1, L, 8, 16, 2] int64: 16 MiB at L = 16000), so evaluation's
    memory grew with L where training's (core checkpointing, windows read lazily) is flat; it keeps the windows'
    offsets ([B]) and reads them a core segment (8 k steps) at a time when measured, to the same number, bit for bit,
    as the windows read whole."""
    trainer = frame_trainer(seq_len, k, memory_budget_mb=1.0)
    loss = trainer.held_out_loss(2)
    held_out = trainer._held_out[1]
    assert len(held_out) == 2 and all(max(kept_arrays(batch)) <= 2 for batch in held_out), \
        [kept_arrays(batch) for batch in held_out]  # B = 2 offsets a window, nothing of size L
    sampler = make_sampler(trainer.spec.data, seed=HELD_OUT_SEED, split="val", model_config=trainer.model.config)
    trainer.model.eval()
    sums = [loss_sum(trainer.model, *sampler.next_batch(), torch.device("cpu"), k) for _ in range(2)]
    trainer.model.train()
    assert loss == sum(total for total, _ in sums) / sum(scored for _, scored in sums)
    whole = frame_trainer(seq_len, 0).held_out_loss(2)  # plain forward over the whole window
    assert abs(loss - whole) <= 1e-12 * whole, (loss, whole)
    assert trainer.held_out_loss(2) == loss  # from the cached windows again


def test_a_paged_frame_model_keeps_its_held_out_batches_as_its_training_reads_them():
    """Without core checkpointing training reads each window whole (`next_batch`), and so does the held-out set."""
    trainer = frame_trainer(40, 8)
    trainer.held_out_loss(2)
    assert all(isinstance(batch, tuple) for batch in trainer._held_out[1])


def tiny_budget_spec(memory_budget_mb: float) -> Any:
    return tiny_spec(model={"name": "frame", "preset": "tiny"}, data={"source": "typing", "seq_len": 200, "batch_size": 1},
                     inner={"steps": 1, "bptt_chunk": 4, "memory_budget_mb": memory_budget_mb})


def test_a_memory_budget_below_one_core_state_is_refused_before_the_run_naming_the_key():
    """memory_budget_mb = 0.0005 (524 bytes) passed the checks; the worker's first step (200 frames in chunks of 4:
    7 segments of 32) then raised "no core state fits the memory budget", a message not naming the key."""
    problem = data_problem(tiny_budget_spec(0.0005))
    assert problem is not None and problem.startswith(
        "inner.memory_budget_mb = 0.0005: data.seq_len: windows of 200 steps at batch 1: no core state fits the memory "
        "budget for 7 segments"), problem
    assert problem.endswith("expected inner.memory_budget_mb >= 0.000732421875 (1 core state(s) of 768 bytes)"), problem
    assert data_problem(tiny_budget_spec(768 / 2**20)) is None  # the minimum it names
    assert data_problem(dataclasses.replace(tiny_budget_spec(0.0005), data=dataclasses.replace(
        tiny_budget_spec(0.0005).data, seq_len=64))) is None  # 2 segments: no state need be kept


def test_the_frame_models_core_state_size_is_the_one_the_check_assumes():
    config = registry.make_config("frame", "tiny", {"n_main_layers": 3, "n_hidden": 40})
    model = registry.build_model("frame", "tiny", {"n_main_layers": 3, "n_hidden": 40}, seed=0)
    frames = torch.zeros((3, 2, config.rows, config.cols, 2), dtype=torch.long)  # [B, T, R, C, 2]
    with torch.no_grad():
        _, _, state = model.core_segment(model.encode(frames), None, None)
    assert inner.core_state_bytes(type(model), config, 3) == sum(t.numel() * t.element_size() for t in state)


def test_a_budget_the_checks_did_not_see_fails_the_step_naming_the_key():
    trainer = RoundTrainer(torch.device("cpu"))
    spec = tiny_budget_spec(0.0005)
    trainer.build(spec, model_seed=0)
    trainer.follow(200, 1, 0)
    with pytest.raises(ValueError) as failure:
        trainer.train(0, 1)
    assert str(failure.value).startswith("inner.memory_budget_mb = 0.0005: no core state fits the memory budget"), \
        str(failure.value)
    assert str(failure.value).endswith("expected inner.memory_budget_mb >= 0.000732421875 (1 core state(s) of 768 bytes)")
