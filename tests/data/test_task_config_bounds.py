"""Diagnostic and typing configs refuse, naming the field, sizes that hung or exhausted memory in the sampler and
probabilities that left the jump law no normaliser (fuzz review, 2026-11-29); the bounds leave every real use."""

from __future__ import annotations

import pytest

from rcswarm.data.diagnostics import FRJTConfig, MazeConfig, MQARConfig, S5Config, make_task
from rcswarm.data.diagnostics.base import MAX_EXAMPLE_TOKENS, MAX_VOCAB
from rcswarm.data.diagnostics.frjt import MAX_DEPTH
from rcswarm.data.frames import TypingConfig


@pytest.mark.parametrize(
    "config_type, key, value",
    [
        (FRJTConfig, "label_pool", MAX_VOCAB + 1),
        (FRJTConfig, "max_depth", MAX_DEPTH + 1),
        (FRJTConfig, "ops_per_block", 2**31),
        (FRJTConfig, "p_near", 5e-324),
        (FRJTConfig, "p_near", 1e-17),
        (MazeConfig, "num_moves", MAX_EXAMPLE_TOKENS // 2 + 1),
        (MQARConfig, "vocab_size", MAX_VOCAB + 1),
        (MQARConfig, "seq_len", MAX_EXAMPLE_TOKENS + 1),
        (MQARConfig, "num_kv_pairs", 2**31),
        (S5Config, "max_length", MAX_EXAMPLE_TOKENS + 1),
        (S5Config, "min_length", 2**31),
    ],
)
def test_a_size_past_the_bound_is_refused_naming_the_field(config_type, key, value):
    extra = {"label_pool": 4096} if key == "max_depth" else {}
    with pytest.raises(ValueError, match=rf"^{config_type.__name__}\.{key}={value!r}: expected"):
        config_type(**{key: value, **extra})


@pytest.mark.parametrize(
    "name, config",
    [
        ("frjt", {"label_pool": MAX_DEPTH, "min_depth": MAX_DEPTH, "max_depth": MAX_DEPTH}),
        ("frjt", {"p_near": 1e-15}),
        ("frjt", {"max_depth": 1, "ops_per_block": (MAX_EXAMPLE_TOKENS - 1 - 7) // 3}),
        ("maze", {"num_moves": 4096}),
        ("mqar", {"vocab_size": MAX_VOCAB, "seq_len": 4096}),
        ("s5", {"max_length": 4096}),
    ],
)
def test_configs_at_or_near_the_bounds_sample_within_their_token_bound(name, config):
    task = make_task(name, **config)
    batch = task.batch(1, seed=3)
    assert batch.tokens.shape[1] <= task.config.max_tokens <= MAX_EXAMPLE_TOKENS
    assert int(batch.tokens.max()) < task.vocab.vocab_size


def test_a_typing_minimum_longer_than_any_document_names_min_document_chars():
    """Before: TypingFrameSource refused it as "TypingConfig.n_documents=64: expected at most 0"."""
    with pytest.raises(ValueError, match=r"^TypingConfig\.min_document_chars=2147483648: expected at most 111 "):
        TypingConfig(rows=8, cols=16, char_vocab=128, min_document_chars=2**31)
    assert TypingConfig(rows=8, cols=16, char_vocab=128, min_document_chars=111).max_document_chars == 111
