"""Tests of the model registry and the residual LSTM LM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rcswarm.data.text import ByteWindowSampler, load_stdlib_corpus
from rcswarm.models import registry
from rcswarm.models.lstm_lm import ResidualLSTMConfig, ResidualLSTMLM


def test_lstm_lm_is_registered_with_its_presets() -> None:
    assert "lstm_lm" in registry.list_models()
    entry = registry.get("lstm_lm")
    assert entry.config_cls is ResidualLSTMConfig
    assert set(entry.presets) == {"tiny", "small", "base10m", "base50m"}
    assert entry.description


def test_unknown_model_names_the_name_and_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'no_such_model'.*lstm_lm"):
        registry.get("no_such_model")
    with pytest.raises(ValueError, match="no_such_model"):
        registry.build_model("no_such_model", "tiny")


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ValueError, match=r"'huge'.*base10m.*small.*tiny"):
        registry.make_config("lstm_lm", "huge")


def test_unknown_override_key_names_key_and_fields() -> None:
    with pytest.raises(ValueError, match=r"'d_modle'.*'vocab_size', 'd_model'"):
        registry.make_config("lstm_lm", "tiny", {"d_modle": 64})


def test_invalid_override_value_is_rejected_by_config_validation() -> None:
    with pytest.raises(ValueError, match=r"dropout=1\.5"):
        registry.make_config("lstm_lm", "tiny", {"dropout": 1.5})
    with pytest.raises(ValueError, match=r"n_layers=0"):
        registry.make_config("lstm_lm", "tiny", {"n_layers": 0})


def test_duplicate_registration_is_rejected() -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get("lstm_lm"))


def test_make_config_applies_preset_then_overrides() -> None:
    config = registry.make_config("lstm_lm", "small", {"dropout": 0.1, "n_layers": 3})
    assert config == ResidualLSTMConfig(d_model=192, n_layers=3, dropout=0.1)


def test_presets_are_read_only() -> None:
    with pytest.raises(TypeError):
        registry.get("lstm_lm").presets["tiny"]["d_model"] = 999  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"vocab_size": 0}, r"vocab_size=0.*positive int"),
        ({"d_model": -4}, r"d_model=-4.*positive int"),
        ({"mlp_ratio": 2.5}, r"mlp_ratio=2\.5.*positive int"),
        ({"dropout": -0.1}, r"dropout=-0\.1.*0 <= dropout < 1"),
        ({"tie_embeddings": 1}, r"tie_embeddings=1.*bool"),
    ],
)
def test_config_validation_messages(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ResidualLSTMConfig(**kwargs)


def test_seeded_build_is_bit_identical_and_seed_dependent() -> None:
    a = registry.build_model("lstm_lm", "tiny", seed=7)
    b = registry.build_model("lstm_lm", "tiny", seed=7)
    c = registry.build_model("lstm_lm", "tiny", seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["embed.weight"], sc["embed.weight"])
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in c.named_parameters()]


def test_seeded_build_leaves_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    registry.build_model("lstm_lm", "tiny", seed=0)
    assert torch.equal(torch.rand(4), expected)


def test_invalid_seed_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"seed=-1"):
        registry.build_model("lstm_lm", "tiny", seed=-1)


def test_parameters_are_float32_and_tied_head_has_no_extra_parameters() -> None:
    tied = registry.build_model("lstm_lm", "tiny", seed=0)
    untied = registry.build_model("lstm_lm", "tiny", {"tie_embeddings": False}, seed=0)
    assert all(p.dtype == torch.float32 for p in tied.parameters())
    config = tied.config
    assert registry.parameter_count(untied) - registry.parameter_count(tied) == (
        config.vocab_size * config.d_model
    )
    assert not any(name.startswith("head") for name, _ in tied.named_parameters())
    assert "head.weight" in dict(untied.named_parameters())


def test_output_shape_and_dtype() -> None:
    model = registry.build_model("lstm_lm", "tiny", {"n_layers": 2}, seed=0)
    inputs = torch.randint(0, 256, (3, 17))
    logits = model(inputs)
    assert logits.shape == (3, 17, model.config.vocab_size)
    assert logits.dtype == torch.float32
    with pytest.raises(ValueError, match=r"\(17,\).*\[batch, time\]"):
        model(inputs[0])


def test_lstm_lm_is_causal() -> None:
    model = registry.build_model("lstm_lm", "tiny", {"n_layers": 2}, seed=0).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (2, 24), generator=generator)
    changed = inputs.clone()
    t = 10
    changed[:, t] = (changed[:, t] + 1) % 256
    with torch.no_grad():
        before, after = model(inputs), model(changed)
    assert torch.equal(before[:, :t], after[:, :t])
    assert not torch.allclose(before[:, t], after[:, t])


def test_streaming_with_state_matches_one_call() -> None:
    model = registry.build_model("lstm_lm", "tiny", {"n_layers": 2}, seed=0).eval()
    inputs = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(inputs)
        first, state = model(inputs[:, :12], return_state=True)
        second, _ = model(inputs[:, 12:], state=state, return_state=True)
    torch.testing.assert_close(torch.cat([first, second], dim=1), full)


def test_tiny_model_loss_falls_on_stdlib_text() -> None:
    corpus = load_stdlib_corpus(max_bytes=500_000)
    train = ByteWindowSampler(corpus, seq_len=64, batch_size=16, seed=0)
    val_inputs, val_targets = ByteWindowSampler(
        corpus, seq_len=64, batch_size=64, seed=1, split="val"
    ).next_batch()
    model = registry.build_model("lstm_lm", "tiny", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def val_loss() -> float:
        with torch.no_grad():
            logits = model(val_inputs)  # [B, T, V]
            return F.cross_entropy(logits.flatten(0, 1), val_targets.flatten()).item()

    initial = val_loss()
    assert abs(initial - torch.log(torch.tensor(256.0)).item()) < 0.1
    for _ in range(50):
        inputs, targets = train.next_batch()
        logits = model(inputs)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    final = val_loss()
    assert final < initial - 1.5, (initial, final)


def test_base10m_has_about_ten_million_parameters() -> None:
    model = registry.build_model("lstm_lm", "base10m")
    count = registry.parameter_count(model)
    assert 9_000_000 <= count <= 11_000_000, count
    assert isinstance(model, ResidualLSTMLM)


def test_model_rejects_wrong_config_type() -> None:
    with pytest.raises(TypeError, match="ResidualLSTMConfig"):
        ResidualLSTMLM({"d_model": 32})  # type: ignore[arg-type]
