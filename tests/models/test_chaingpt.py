"""Tests of rcswarm.models.chaingpt: shapes, causality, determinism, the M = 1 RWKV-7
reference, the Appendix F parameter formula, the depth schedule, adaptive depth, config
validation and a short training run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rcswarm.models import registry
from rcswarm.models.chaingpt import (
    ChainGPT,
    ChainGPTConfig,
    RWKVProduct,
    parameter_count_formula,
)
from rcswarm.models.chaingpt.attention import rope_inverse_frequencies

TINY = dict(registry.get("chaingpt").presets["tiny"])


def tiny(**overrides: object) -> ChainGPTConfig:
    return ChainGPTConfig(**{**TINY, **overrides})


def build(seed: int = 0, **overrides: object) -> ChainGPT:
    return registry.build_model("chaingpt", "tiny", overrides, seed=seed)


def test_registered_with_presets() -> None:
    assert "chaingpt" in registry.list_models()
    assert {"tiny", "180m", "0.5b", "1.5b"} <= set(registry.get("chaingpt").presets)


def test_shapes_train_and_eval() -> None:
    model = build()
    inputs = torch.randint(0, 32, (2, 11))
    assert model(inputs).shape == (2, 11, 32)
    model.eval()
    assert model(inputs).shape == (2, 11, 32)
    classes = build(num_classes=5)
    assert classes(inputs).shape == (2, 11, 5)


def test_causal_with_recurrent_depth() -> None:
    model = build(recur_iters=3, grad_iters=1).eval()
    inputs = torch.randint(0, 32, (2, 14))
    changed = inputs.clone()
    changed[:, 9:] = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        before, after = model(inputs), model(changed)
    torch.testing.assert_close(before[:, :9], after[:, :9], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_deterministic_build_by_seed() -> None:
    first, second, other = build(seed=3), build(seed=3), build(seed=4)
    names = [name for name, _ in first.named_parameters()]
    assert names == [name for name, _ in second.named_parameters()]
    for (_, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters()))
    assert all(p.dtype == torch.float32 for p in first.parameters())


def _randomize(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.4 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))


def _rwkv7_reference(layer: RWKVProduct, h: torch.Tensor) -> torch.Tensor:
    """Hand-written RWKV-7 time-mix, per token and head (Peng et al. 2025, Eqs. of Section 4)."""
    batch, length, d = h.shape
    heads, dh = layer.heads, layer.head_dim
    mix = {name: layer.mix[name] for name in ("r", "w", "k", "v", "a", "g")}
    state = torch.zeros(batch, heads, dh, dh, dtype=h.dtype)
    previous = torch.zeros(batch, d, dtype=h.dtype)
    outputs = []
    for t in range(length):
        x_t = h[:, t]
        x = {name: x_t + (previous - x_t) * mu for name, mu in mix.items()}
        previous = x_t
        r = x["r"] @ layer.receptance.weight.T
        log_log = -F.softplus(-(layer.w0 + torch.tanh(x["w"] @ layer.w1) @ layer.w2)) - 0.5
        w = torch.exp(-torch.exp(log_log))
        k = x["k"] @ layer.key.weight.T
        v = x["v"] @ layer.value.weight.T + x["v"] @ layer.value_down[0] @ layer.value_up[0]
        kappa_raw = k + x["k"] @ layer.key_b_down[0] @ layer.key_b_up[0]
        k_c = k + x["k"] @ layer.key_c_down[0] @ layer.key_c_up[0]
        a = torch.sigmoid(layer.step_bias_b[0] + x["a"] @ layer.beta_b_down[0] @ layer.beta_b_up[0])
        a_c = torch.sigmoid(layer.step_bias_b[0] + x["a"] @ layer.beta_c_down[0] @ layer.beta_c_up[0])
        k_tilde = k_c * (1 + (a_c - 1) * layer.k_ac)
        g = torch.sigmoid(x["g"] @ layer.g1) @ layer.g2
        split = lambda z: z.view(batch, heads, dh)
        r_h, w_h, v_h, kt_h, a_h = map(split, (r, w, v, k_tilde, a))
        kappa = split(kappa_raw)
        kappa = kappa / kappa.norm(dim=-1, keepdim=True)
        transition = torch.diag_embed(w_h) - kappa[..., :, None] * (a_h * kappa)[..., None, :]
        state = state @ transition + v_h[..., :, None] * kt_h[..., None, :]
        y = (state @ r_h[..., None])[..., 0]  # [B, H, dh]
        mean = y.mean(-1, keepdim=True)
        var = y.var(-1, unbiased=False, keepdim=True)
        normed = ((y - mean) / torch.sqrt(var + dh * 1e-5)).reshape(batch, d)
        normed = normed * layer.norm.weight + layer.norm.bias
        bonus = ((r_h * kt_h * layer.r_k).sum(-1, keepdim=True) * v_h).reshape(batch, d)
        outputs.append(((normed + bonus) * g) @ layer.output.weight.T)
    return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("naive", [False, True])
def test_single_substep_is_rwkv7_time_mix(naive: bool) -> None:
    config = tiny(substeps=1, naive_kernels=naive, kernel_chunk_size=4)
    torch.manual_seed(0)
    layer = RWKVProduct(config).double()
    _randomize(layer, seed=1)
    h = torch.randn(2, 9, config.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(layer(h), _rwkv7_reference(layer, h), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_embeddings": True},
        {"share_step_bias": False, "substeps": 3},
        {"num_classes": 7, "layer_division": "C141"},
        {"n_q_heads": 4, "n_kv_heads": 2, "layer_division": "C010", "d_mlp": 48},
    ],
)
def test_parameter_formula_matches_module(overrides: dict[str, object]) -> None:
    config = tiny(**overrides)
    model = ChainGPT(config)
    assert parameter_count_formula(config) == registry.parameter_count(model)


def test_appendix_f_rwkv_term_with_separate_biases() -> None:
    config = tiny(share_step_bias=False)
    d, m = config.d_model, config.substeps
    expected = (
        4 * d * d + 2 * d * (config.decay_rank + config.gate_rank) + 6 * m * d * config.lora_rank
        + 4 * m * d * config.a_rank + (2 * m + 11) * d
    )
    assert registry.parameter_count(RWKVProduct(config)) == expected


def test_grad_iters_zero_refused() -> None:
    with pytest.raises(ValueError, match=r"ChainGPTConfig\.grad_iters=0: expected a positive int"):
        tiny(grad_iters=0)
    with pytest.raises(ValueError, match=r"ChainGPTConfig\.grad_iters=0"):
        tiny(grad_iters=0, depth_sampling="uniform")


# The Table 7 presets (180m and up) are too big to build in a unit test.
SMALL_PRESETS = [name for name in registry.get("chaingpt").presets if name in ("tiny", "small")]


@pytest.mark.parametrize("depth_sampling", ["fixed", "uniform"])
@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_train_backward_reaches_every_parameter(preset: str, depth_sampling: str) -> None:
    model = registry.build_model("chaingpt", preset, {"depth_sampling": depth_sampling}, seed=0).train()
    torch.manual_seed(0)
    inputs = torch.randint(0, model.config.vocab_size, (2, 9))  # [B, T]
    logits = model(inputs)  # [B, T, V]
    F.cross_entropy(logits.flatten(0, 1), inputs.flatten()).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_truncated_backprop_equals_manual_schedule() -> None:
    model = build(recur_iters=3, grad_iters=1).train()
    inputs = torch.randint(0, 32, (2, 8))
    model(inputs).square().mean().backward()
    automatic = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    h0 = model.prelude(inputs)
    with torch.no_grad():
        x = model.iterate(model.iterate(h0, h0), h0)
    model.decode(model.iterate(x, h0)).square().mean().backward()
    for auto, parameter in zip(automatic, model.parameters()):
        if auto is None:
            assert parameter.grad is None
        else:
            torch.testing.assert_close(auto, parameter.grad, rtol=1e-5, atol=1e-6)


def test_uniform_depth_sampling_bounds() -> None:
    model = build(recur_iters=4, grad_iters=2, depth_sampling="uniform").train()
    torch.manual_seed(0)
    for _ in range(20):
        no_grad, with_grad = model.depth_schedule()
        assert 1 <= no_grad + with_grad <= 4 and with_grad == min(2, no_grad + with_grad)


def test_adaptive_depth_stops_early_on_constant_entropy() -> None:
    model = build(recur_iters=6).eval()
    with torch.no_grad():
        model.head.weight.zero_()
    inputs = torch.randint(0, 32, (3, 8))
    out = model.adaptive_forward(inputs, threshold=0.0, interval=1)
    assert out.iterations.tolist() == [2, 2, 2]
    out = model.generate_depth(inputs, threshold=0.0, interval=2, max_iterations=5)
    assert out.iterations.tolist() == [3, 3, 3]


def test_adaptive_depth_respects_cap_and_matches_forward() -> None:
    model = build(recur_iters=3).eval()
    inputs = torch.randint(0, 32, (2, 8))
    out = model.adaptive_forward(inputs, threshold=-math.inf, max_iterations=4)
    assert out.iterations.tolist() == [4, 4]
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(inputs, iterations=4))


def test_adaptive_depth_per_sample_logits() -> None:
    model = build(recur_iters=5).eval()
    inputs = torch.randint(0, 32, (4, 8))
    out = model.adaptive_forward(inputs, threshold=0.05, schedule="inv_sqrt")
    assert ((out.iterations >= 2) & (out.iterations <= 5)).all()
    with torch.no_grad():
        for b, used in enumerate(out.iterations.tolist()):
            expected = model(inputs[b : b + 1], iterations=used)[0]
            torch.testing.assert_close(out.logits[b], expected, rtol=1e-4, atol=1e-5)


def test_rope_frequency_scaling() -> None:
    plain = rope_inverse_frequencies(8, 10000.0, 1.0, 1.0, 32.0)
    torch.testing.assert_close(plain, 1.0 / 10000.0 ** (torch.arange(4, dtype=torch.float64) / 4))
    scaled = rope_inverse_frequencies(8, 10000.0, 4.0, 1.0, 32.0)
    beta = 1.0 + 31.0 * torch.arange(4, dtype=torch.float64) / 4
    torch.testing.assert_close(scaled, plain / (1.0 + 3.0 / beta))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 0}, "d_model"),
        ({"rwkv_head_dim": 5}, "rwkv_head_dim"),
        ({"attn_head_dim": 15}, "attn_head_dim"),
        ({"n_kv_heads": 3}, "n_kv_heads"),
        ({"layer_division": "C1x1"}, "layer_division"),
        ({"layer_division": "C101"}, "layer_division"),
        ({"grad_iters": 5, "recur_iters": 4}, "grad_iters"),
        ({"grad_iters": -1}, "grad_iters"),
        ({"depth_sampling": "poisson"}, "depth_sampling"),
        ({"rope_alpha": 0.0}, "rope_alpha"),
        ({"num_classes": 0}, "num_classes"),
        ({"tie_embeddings": True, "num_classes": 3}, "tie_embeddings"),
        ({"share_step_bias": 1}, "share_step_bias"),
    ],
)
def test_config_validation_names_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"ChainGPTConfig\.{field}="):
        tiny(**overrides)


def test_adamw_reduces_loss_on_copy_task() -> None:
    model = build(seed=0, vocab_size=8, recur_iters=2, grad_iters=1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)

    def loss_once() -> torch.Tensor:
        prefix = torch.randint(1, 8, (8, 5), generator=generator)
        sequence = torch.cat([prefix, torch.zeros(8, 1, dtype=torch.long), prefix], dim=1)  # [8, 11]
        logits = model(sequence[:, :-1])[:, 5:]  # predict the copy
        return F.cross_entropy(logits.reshape(-1, 8), sequence[:, 6:].reshape(-1))

    losses = []
    for _ in range(25):
        loss = loss_once()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1


def test_two_substeps_chunked_equals_naive_kernel() -> None:
    torch.manual_seed(0)
    chunked = RWKVProduct(tiny(substeps=2, kernel_chunk_size=4)).double()
    _randomize(chunked, seed=3)
    naive = RWKVProduct(tiny(substeps=2, naive_kernels=True)).double()
    naive.load_state_dict(chunked.state_dict())
    h = torch.randn(2, 10, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(chunked(h), naive(h), rtol=1e-9, atol=1e-9)


def test_tiny_chaingpt_learns_mqar_far_above_chance() -> None:
    """A one-block ChainGPT (RWKV-Product + SGSA, M = 2) learns a small MQAR task: held-out
    accuracy at the query positions reaches >= 3x chance, chance being 1 / (number of value
    tokens) (targets are always value tokens; 1 / vocab would be a weaker baseline)."""
    from rcswarm.data.diagnostics import make_task

    task = make_task("mqar", vocab_size=32, seq_len=24, num_kv_pairs=2, placement="nearby")
    chance = 1.0 / (task.config.vocab_size - task.config.first_value_id)  # 1/15
    model = build(seed=0, layer_division="C010", recur_iters=1, grad_iters=1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    held_out = task.batch(256, seed=10**6)  # training seeds are 1 .. 300

    def accuracy() -> float:
        model.eval()
        with torch.no_grad():
            predicted = model(held_out.tokens).argmax(-1)
        model.train()
        return (predicted[held_out.mask] == held_out.targets[held_out.mask]).float().mean().item()

    assert accuracy() < 2 * chance  # untrained: about chance
    best = 0.0
    for step in range(1, 301):
        tokens, targets, _ = task.batch(32, seed=step)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            best = max(best, accuracy())
            if best >= 0.5:
                break
    assert best >= 3 * chance, f"held-out accuracy {best:.3f} vs chance {chance:.3f}"


def test_prelude_and_adaptive_forward_check_their_inputs() -> None:
    model = build().eval()
    with pytest.raises(ValueError, match=r"inputs has shape \(2, 0\): expected time >= 1"):
        model.prelude(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"dtype torch\.float32: expected \[batch, time\] integer ids"):
        model.adaptive_forward(torch.zeros(2, 3))
    empty = torch.zeros(0, 6, dtype=torch.long)  # [B = 0, T]
    assert model.prelude(empty).shape == (0, 6, 32)
    out = model.adaptive_forward(empty)
    assert out.logits.shape == (0, 6, 32) and out.iterations.shape == (0,)
