"""RoundTrainer.held_out_loss (issue #30): the fixed held-out set (the first batches of one stream of the held-out
split, drawn once), the loss at given parameters without changing the model's own, and the same number the
launcher's final evaluation gives for the same θ."""

from __future__ import annotations

import torch

from rcswarm.train.round import RoundTrainer
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
