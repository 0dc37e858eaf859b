"""Tests of the baseline model families: lstm, transformer, ssm, sum."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
import torch.nn.functional as F

from rcswarm.models import baselines, registry
from rcswarm.models.baselines import (
    LSTMConfig,
    SSMConfig,
    SumConfig,
    TransformerConfig,
)
from rcswarm.models.baselines.ssm import parallel_scan, sequential_scan
from rcswarm.models.baselines.transformer import causal_attention, rope_rotate

FAMILIES = ["lstm", "transformer", "ssm", "sum"]
CONFIGS = {
    "lstm": LSTMConfig,
    "transformer": TransformerConfig,
    "ssm": SSMConfig,
    "sum": SumConfig,
}
VOCAB = 11

VARIANTS = [
    ("lstm", {}),
    ("transformer", {}),
    ("transformer", {"positions": "rope"}),
    ("transformer", {"window": 3}),
    ("transformer", {"window": 2, "positions": "rope"}),
    ("ssm", {"scan": "sequential"}),
    ("ssm", {"scan": "parallel"}),
    ("sum", {}),
    ("sum", {"reduction": "mean"}),
]
VARIANT_IDS = [
    f"{name}-{'-'.join(f'{k}={v}' for k, v in overrides.items()) or 'default'}"
    for name, overrides in VARIANTS
]


def _build(name: str, overrides: dict[str, object] | None = None) -> torch.nn.Module:
    """The tiny preset over VOCAB tokens, seed 0, in eval mode."""
    model = registry.build_model(name, "tiny", {"vocab_size": VOCAB, **(overrides or {})}, seed=0)
    return model.eval()


def _tokens(batch: int, time: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, time), generator=generator)


def _digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_all_families_are_registered_with_tiny_and_small_presets() -> None:
    models = registry.list_models()
    for name in FAMILIES:
        assert name in models
        entry = registry.get(name)
        assert entry.config_cls is CONFIGS[name]
        assert set(entry.presets) == {"tiny", "small"}
        assert entry.description


@pytest.mark.parametrize(
    ("name", "preset", "count"),
    [
        ("lstm", "tiny", 33_536),
        ("lstm", "small", 1_184_000),
        ("transformer", "tiny", 46_208),
        ("transformer", "small", 990_208),
        ("ssm", "tiny", 33_600),
        ("ssm", "small", 1_106_560),
        ("sum", "tiny", 35_776),
        ("sum", "small", 1_100_032),
    ],
)
def test_preset_parameter_counts_are_the_documented_ones(
    name: str, preset: str, count: int
) -> None:
    model = registry.build_model(name, preset, seed=0)
    assert registry.parameter_count(model) == count
    assert f"({count:,})" in baselines.__doc__


@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_output_shape_is_batch_time_vocab(name: str, overrides: dict[str, object]) -> None:
    model = _build(name, overrides)
    logits = model(_tokens(3, 7))
    assert logits.shape == (3, 7, VOCAB)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_num_classes_sets_the_output_width(name: str) -> None:
    model = _build(name, {"num_classes": 2})
    assert model.config.out_dim == 2
    assert model.config.vocab_size == VOCAB
    assert model(_tokens(3, 5)).shape == (3, 5, 2)
    state = model.init_state(3)
    assert model.step(_tokens(3, 1)[:, 0], state).shape == (3, 2)


@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_future_tokens_do_not_change_earlier_logits(
    name: str, overrides: dict[str, object]
) -> None:
    model = _build(name, overrides)
    inputs = _tokens(2, 12, seed=1)
    logits = model(inputs)
    for t0 in (0, 5, 11):
        changed = inputs.clone()
        changed[:, t0] = (changed[:, t0] + 1 + torch.arange(2)) % VOCAB
        changed_logits = model(changed)
        torch.testing.assert_close(changed_logits[:, :t0], logits[:, :t0], rtol=0.0, atol=1e-6)
        assert (changed_logits[:, t0] - logits[:, t0]).abs().max() > 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_build_with_seed_is_bit_identical(name: str) -> None:
    first = _digest(registry.build_model(name, "tiny", seed=3))
    assert _digest(registry.build_model(name, "tiny", seed=3)) == first
    assert _digest(registry.build_model(name, "tiny", seed=4)) != first


@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=VARIANT_IDS)
def test_streaming_steps_equal_the_full_forward(name: str, overrides: dict[str, object]) -> None:
    model = _build(name, overrides)
    inputs = _tokens(3, 10, seed=2)
    with torch.no_grad():
        full = model(inputs)  # [B, T, V]
        state = model.init_state(3)
        stepped = torch.stack([model.step(inputs[:, t], state) for t in range(10)], dim=1)
        chunk_state = model.init_state(3)
        chunks = (inputs[:, :4], inputs[:, 4:9], inputs[:, 9:])
        chunked = torch.cat([model(chunk, chunk_state) for chunk in chunks], dim=1)
    torch.testing.assert_close(stepped, full, rtol=0.0, atol=1e-5)
    torch.testing.assert_close(chunked, full, rtol=0.0, atol=1e-5)


def test_kv_cache_grows_without_window_and_is_bounded_with_one() -> None:
    inputs = _tokens(2, 9)
    dense = _build("transformer")
    cache = dense.init_cache(2)
    for t in range(9):
        dense.step(inputs[:, t], cache)
    assert cache.length == 9
    assert [k.shape for k in cache.keys] == [(2, 2, 9, 16)] * 2
    windowed = _build("transformer", {"window": 3})
    cache = windowed.init_cache(2)
    for t in range(9):
        windowed.step(inputs[:, t], cache)
    assert cache.length == 9
    assert [k.shape for k in cache.keys] == [(2, 2, 2, 16)] * 2
    assert [v.shape for v in cache.values] == [(2, 2, 2, 16)] * 2


def test_transformer_rejects_positions_beyond_max_len() -> None:
    model = _build("transformer", {"max_len": 6})
    with pytest.raises(ValueError, match="max_len=6"):
        model(_tokens(1, 7))
    cache = model.init_cache(1)
    model(_tokens(1, 6), cache)
    with pytest.raises(ValueError, match="max_len=6"):
        model.step(_tokens(1, 1)[:, 0], cache)


def _dense_masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int
) -> torch.Tensor:
    """Reference: explicit scores, band mask (queries are the last Tq keys), softmax."""
    n_queries, n_keys = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, Tq, Tk]
    query_pos = torch.arange(n_keys - n_queries, n_keys)[:, None]
    key_pos = torch.arange(n_keys)[None, :]
    visible = (key_pos <= query_pos) & (key_pos > query_pos - window)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # [B, H, Tq, Dh]


@pytest.mark.parametrize("window", [1, 2, 5, 16])
@pytest.mark.parametrize("n_queries", [12, 3, 1])
def test_sliding_window_attention_matches_dense_masked_reference(
    window: int, n_queries: int
) -> None:
    generator = torch.Generator().manual_seed(window * 100 + n_queries)
    q = torch.randn(2, 3, n_queries, 8, generator=generator)
    k = torch.randn(2, 3, 12, 8, generator=generator)
    v = torch.randn(2, 3, 12, 8, generator=generator)
    expected = _dense_masked_attention(q, k, v, window)
    torch.testing.assert_close(causal_attention(q, k, v, window), expected, rtol=0.0, atol=1e-5)


def test_full_causal_attention_matches_dense_masked_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 12, 8, generator=generator) for _ in range(3))
    expected = _dense_masked_attention(q, k, v, window=12)
    torch.testing.assert_close(causal_attention(q, k, v, None), expected, rtol=0.0, atol=1e-5)


def test_window_wider_than_the_sequence_equals_full_attention() -> None:
    inputs = _tokens(2, 10)
    full = _build("transformer")(inputs)
    wide = _build("transformer", {"window": 10})(inputs)
    torch.testing.assert_close(wide, full, rtol=0.0, atol=1e-5)


def test_sliding_window_limits_the_receptive_field() -> None:
    window, n_layers = 3, 2
    model = _build("transformer", {"window": window, "n_layers": n_layers})
    inputs = _tokens(2, 16)
    changed = inputs.clone()
    changed[:, 2] = (changed[:, 2] + 1) % VOCAB
    logits, changed_logits = model(inputs), model(changed)
    reach = 2 + n_layers * (window - 1)
    assert (changed_logits[:, reach] - logits[:, reach]).abs().max() > 1e-4
    torch.testing.assert_close(
        changed_logits[:, reach + 1 :], logits[:, reach + 1 :], rtol=0.0, atol=1e-6
    )


def test_ssm_parallel_and_sequential_scans_agree() -> None:
    generator = torch.Generator().manual_seed(0)
    decay = torch.rand(2, 13, 5, 4, generator=generator)
    drive = torch.randn(2, 13, 5, 4, generator=generator)
    h0 = torch.randn(2, 5, 4, generator=generator)
    c = torch.randn(2, 13, 4, generator=generator)
    y_seq, h_seq = sequential_scan(decay, drive, h0, c)
    y_par, h_par = parallel_scan(decay, drive, h0, c)
    torch.testing.assert_close(y_par, y_seq, rtol=0.0, atol=1e-5)
    torch.testing.assert_close(h_par, h_seq, rtol=0.0, atol=1e-5)
    h = h0
    for t in range(13):
        h = decay[:, t] * h + drive[:, t]
    torch.testing.assert_close(h_seq, h, rtol=0.0, atol=1e-6)
    torch.testing.assert_close(y_seq[:, -1], (h * c[:, -1, None, :]).sum(-1), rtol=0.0, atol=1e-5)
    inputs = _tokens(2, 9)
    torch.testing.assert_close(
        _build("ssm", {"scan": "parallel"})(inputs),
        _build("ssm", {"scan": "sequential"})(inputs),
        rtol=0.0,
        atol=1e-5,
    )


def _copy_first_token_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence: a token in 1..VOCAB-1, then blanks (0); the target is always that token."""
    first = torch.arange(1, VOCAB).repeat(2)  # [B]
    inputs = torch.zeros(first.shape[0], 10, dtype=torch.long)  # [B, T]
    inputs[:, 0] = first
    return inputs, first[:, None].expand_as(inputs)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_few_adamw_steps_reduce_the_copy_loss(name: str) -> None:
    model = registry.build_model(name, "tiny", {"vocab_size": VOCAB}, seed=0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs, targets = _copy_first_token_batch()
    losses = []
    for _ in range(25):
        logits = model(inputs)[:, 1:]  # [B, T - 1, V]
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 0.9 * math.log(VOCAB)
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize(
    ("name", "overrides", "pattern"),
    [
        ("lstm", {"n_layers": 0}, r"LSTMConfig\.n_layers=0: expected a positive int"),
        ("lstm", {"num_classes": 0}, r"LSTMConfig\.num_classes=0: expected a positive int"),
        ("lstm", {"vocab_size": True}, r"LSTMConfig\.vocab_size=True"),
        ("transformer", {"dropout": 1.0}, r"TransformerConfig\.dropout=1\.0"),
        ("transformer", {"n_heads": 3}, r"TransformerConfig\.n_heads=3: expected a divisor"),
        ("transformer", {"n_heads": 32, "positions": "rope"}, r"n_heads=32.*even head size"),
        ("transformer", {"window": 0}, r"TransformerConfig\.window=0"),
        ("transformer", {"positions": "alibi"}, r"TransformerConfig\.positions='alibi'"),
        ("transformer", {"max_len": -1}, r"TransformerConfig\.max_len=-1"),
        ("ssm", {"scan": "fast"}, r"SSMConfig\.scan='fast': expected one of"),
        ("ssm", {"d_state": 0}, r"SSMConfig\.d_state=0"),
        ("ssm", {"dt_max": 1e-4}, r"SSMConfig\.dt_max=0\.0001: expected >= dt_min"),
        ("ssm", {"dt_min": float("nan")}, r"SSMConfig\.dt_min=nan"),
        ("sum", {"reduction": "max"}, r"SumConfig\.reduction='max'"),
        ("sum", {"mlp_ratio": 1.5}, r"SumConfig\.mlp_ratio=1\.5"),
    ],
)
def test_config_validation_names_the_field(
    name: str, overrides: dict[str, object], pattern: str
) -> None:
    with pytest.raises(ValueError, match=pattern):
        registry.make_config(name, "tiny", overrides)


@pytest.mark.parametrize("name", FAMILIES)
def test_bad_inputs_and_mismatched_state_are_rejected(name: str) -> None:
    model = _build(name)
    with pytest.raises(ValueError, match=r"expected \[batch, time\] integer ids"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"expected \[batch, time\] integer ids"):
        model(_tokens(2, 3)[0])
    with pytest.raises(ValueError, match=r"expected \[batch\] integer ids"):
        model.step(_tokens(2, 3), model.init_state(2))
    with pytest.raises(ValueError, match=r"state has batch size 3: expected 2"):
        model(_tokens(2, 3), model.init_state(3))


@pytest.mark.parametrize("name", FAMILIES)
def test_models_reject_a_config_of_another_family(name: str) -> None:
    other = "sum" if name != "sum" else "lstm"
    with pytest.raises(TypeError, match=f"expected a {CONFIGS[name].__name__}"):
        registry.get(name).build(registry.make_config(other, "tiny"))


def test_rope_scores_depend_only_on_relative_position() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 1, 8, generator=generator)
    k = torch.randn(1, 2, 1, 8, generator=generator)

    def score(query_pos: int, key_pos: int) -> torch.Tensor:
        rq = rope_rotate(q, torch.tensor([query_pos]), 10000.0)
        rk = rope_rotate(k, torch.tensor([key_pos]), 10000.0)
        torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
        return (rq * rk).sum(-1)  # [1, 2, 1]

    torch.testing.assert_close(score(7, 3), score(104, 100), rtol=0.0, atol=1e-4)
    torch.testing.assert_close(score(0, 0), (q * k).sum(-1), rtol=0.0, atol=1e-6)
    assert (score(7, 3) - score(7, 5)).abs().max() > 1e-3
