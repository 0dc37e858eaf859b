"""RoundTrainer.held_out_loss (issue #30): the fixed held-out set (the first batches of one stream of the held-out
split, drawn once), the loss at given parameters without changing the model's own, and the same number the
launcher's final evaluation gives for the same θ; with `[run] eval_seq_len` the same windows whatever length a run
trains; with `[run] eval_set = "rotating"` each version's own batches."""

from __future__ import annotations

import torch

from rcswarm.train.round import HELD_OUT_SEED, RoundTrainer, held_out_seed
from tests.helpers.specs import tiny_spec


def test_held_out_loss_at_given_parameters_leaves_the_model_as_it_was():
    spec = tiny_spec()
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=0)
    trainer.follow(spec.data.seq_len, spec.data.batch_size, seed=1)
    theta = trainer.snapshot()
    initial = trainer.held_out_loss(2)
    for _ in range(5):
        trainer.inner_step()
    trained = trainer.snapshot()
    assert trainer.held_out_loss(2) < initial  # the tiny LSTM learns within 5 steps
    # At θ (the pulled parameters) the loss is θ's, bit for bit, and the model keeps its trained parameters.
    assert trainer.held_out_loss(2, params=theta) == initial
    assert all(torch.equal(p, trained[name]) for name, p in trainer.snapshot().items())
    # The same set as a fresh trainer draws (the launcher's evaluation): its first 2 of 8 batches.
    fresh = RoundTrainer(torch.device("cpu"))
    fresh.build(spec, model_seed=0)
    assert fresh.held_out_loss(2) == initial
    assert fresh.held_out_loss(8) != initial


def test_runs_at_different_lengths_with_one_eval_seq_len_measure_the_same_windows():
    def trainer_at(seq_len: int, eval_seq_len: int) -> RoundTrainer:
        spec = tiny_spec(data={"seq_len": seq_len}, run={"eval_seq_len": eval_seq_len})
        trainer = RoundTrainer(torch.device("cpu"))
        trainer.build(spec, model_seed=0)
        trainer.follow(seq_len, spec.data.batch_size, seed=1)
        return trainer

    short, long = trainer_at(16, 48), trainer_at(64, 48)
    theta = short.snapshot()
    assert short.held_out_loss(2, params=theta) == long.held_out_loss(2, params=theta)
    assert [tuple(t.shape) for t, _ in short._held_out[1]] == [(4, 48)] * 2  # [B, eval_seq_len]
    for _ in range(3):  # training at its own length does not move the windows
        short.inner_step()
    assert short.held_out_loss(2, params=theta) == long.held_out_loss(2, params=theta)
    # Without it each run measures its own data.seq_len: other windows, another number for the same θ.
    assert trainer_at(16, 0).held_out_loss(2, params=theta) != trainer_at(64, 0).held_out_loss(2, params=theta)


def test_a_rotating_set_measures_each_version_on_its_own_batches_the_same_for_every_trainer():
    spec = tiny_spec(run={"eval_set": "rotating"})
    seeds = [held_out_seed("rotating", v) for v in range(50)]
    assert len(set(seeds)) == 50 and HELD_OUT_SEED not in seeds  # never the fixed set (the launcher's stream)
    assert held_out_seed("fixed", 7) == HELD_OUT_SEED

    def loss_of_version(version: int) -> float:
        trainer = RoundTrainer(torch.device("cpu"))
        trainer.build(spec, model_seed=0)
        return trainer.held_out_loss(2, seed=held_out_seed(spec.run.eval_set, version))

    assert loss_of_version(3) == loss_of_version(3)  # two workers measuring θ_3: the same batches, bit for bit
    losses = [loss_of_version(v) for v in range(4)]
    assert len(set(losses)) == 4  # the same θ on other batches: another number each version
    fixed = RoundTrainer(torch.device("cpu"))
    fixed.build(spec, model_seed=0)
    assert fixed.held_out_loss(2) not in losses


def test_a_model_with_dropout_is_measured_in_eval_mode_and_keeps_its_training_mode():
    """Every worker's report of θ_v must be the same number (the store takes their median): with dropout the held-out
    loss was measured in training mode, a random number above the model's loss."""
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "tiny", "overrides": {"dropout": 0.5}})
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=0)
    theta = trainer.snapshot()
    torch.manual_seed(1)
    first = trainer.held_out_loss(2, params=theta)
    torch.manual_seed(2)
    assert trainer.held_out_loss(2, params=theta) == first
    assert trainer.model.training  # put back for the next inner step


def test_the_held_out_loss_weighs_each_scored_position_once():
    """Diagnostic batches score different numbers of positions: the held-out loss was the mean of the batches' means
    (5.38007 against 5.37738 per position on s5; review of the models and training loop, 2026-11-28)."""
    import torch.nn.functional as F

    from rcswarm.data.diagnostics import IGNORE_INDEX

    spec = tiny_spec(model={"name": "lstm", "preset": "tiny"}, data={"source": "diag", "task": "s5"})
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=0)
    generator = torch.Generator().manual_seed(0)  # large random weights: batches' losses differ widely
    trainer.load({name: 3 * torch.randn(p.shape, generator=generator) for name, p in trainer.snapshot().items()})
    loss = trainer.held_out_loss(6)
    batches = trainer._held_out[1][:6]
    trainer.model.eval()
    with torch.no_grad():
        sums = [F.cross_entropy(trainer.model(inputs).flatten(0, 1).double(), targets.flatten(), reduction="sum",
                                ignore_index=IGNORE_INDEX).item() for inputs, targets in batches]
    counts = [int((targets != IGNORE_INDEX).sum()) for _, targets in batches]
    per_position, mean_of_means = sum(sums) / sum(counts), sum(s / c for s, c in zip(sums, counts)) / len(counts)
    assert abs(per_position - mean_of_means) > 1e-2, (counts, per_position, mean_of_means)  # the case it got wrong
    assert abs(loss - per_position) < 1e-5 * per_position


def frame_trainer(bptt_chunk: int) -> RoundTrainer:
    """The tiny frame model on typing windows of 40 frames, trained with streaming BPTT in chunks of `bptt_chunk`
    (0: plain autograd), in float64."""
    spec = tiny_spec(model={"name": "frame", "preset": "tiny"}, data={"source": "typing", "seq_len": 40, "batch_size": 2},
                     inner={"bptt_chunk": bptt_chunk})
    trainer = RoundTrainer(torch.device("cpu"))
    trainer.build(spec, model_seed=0).double()
    return trainer


def test_a_streaming_model_is_evaluated_in_chunks_with_the_whole_windows_loss(monkeypatch):
    """The held-out loss ran the whole window through the model at once: with `[inner] bptt_chunk` its memory grew with
    L where training's is flat (frame small, L = 1024: 2.9 GiB against 531 MiB; review of the models and training
    loop, 2026-11-28). It now runs bptt_chunk frames at a time, carrying the core's state, to the same number."""
    whole = frame_trainer(0).held_out_loss(2)  # the whole window through forward(), as before
    trainer = frame_trainer(8)
    model = trainer.model
    frames: list[int] = []
    encode, core_segment = model.encode, model.core_segment

    def recorded_encode(steps):
        frames.append(steps.shape[1])
        return encode(steps)

    def recorded_core_segment(embeddings, targets, state):
        frames.append(embeddings.shape[1])
        return core_segment(embeddings, targets, state)

    def whole_window(*args, **kwargs):
        raise AssertionError("the chunked evaluation ran the model's forward over the whole window")

    monkeypatch.setattr(model, "encode", recorded_encode)
    monkeypatch.setattr(model, "core_segment", recorded_core_segment)
    monkeypatch.setattr(model, "forward", whole_window)
    chunked = trainer.held_out_loss(2)
    assert frames and max(frames) == 8 and sum(frames) == 2 * 2 * 40  # 2 batches of 40 frames, encoded and run once
    assert abs(chunked - whole) <= 1e-12 * whole, (chunked, whole)
    assert model.training  # its training mode put back


def test_a_step_model_without_segments_is_encoded_in_chunks_and_its_core_run_once():
    """A StepModel without core_segment: encoded bptt_chunk steps at a time, its core over the whole window's
    embeddings (what its paged training keeps), the same sum as one pass."""
    import torch.nn.functional as F

    from rcswarm.train.inner import loss_sum
    from tests.helpers.bptt import DropoutStepModel

    torch.manual_seed(0)
    model = DropoutStepModel().double().eval()
    inputs = torch.randn(2, 11, 6, dtype=torch.float64)  # [B, L, 6]
    targets = torch.randint(0, 5, (2, 11))  # [B, L]
    targets[0, :4] = -100  # unscored
    encoded: list[int] = []
    encode = model.encode
    model.encode = lambda steps: encoded.append(steps.shape[1]) or encode(steps)
    total, scored = loss_sum(model, inputs, targets, torch.device("cpu"), bptt_chunk=3)
    assert encoded == [3, 3, 3, 2] and scored == 18
    with torch.no_grad():
        hidden, _ = model.core(encode(inputs))  # [B, L, 8]
        want = F.cross_entropy(model.head(hidden).transpose(1, 2), targets, reduction="sum").item()
    assert abs(total - want) <= 1e-12 * want
