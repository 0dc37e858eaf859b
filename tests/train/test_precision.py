"""`[inner] precision = "bf16"`: the inner step under torch.autocast(bfloat16), here on the CPU (the same code path a
CUDA worker takes; no GPU on this machine): plain autograd, paged streaming BPTT and core checkpointing give finite
float32 gradients that agree with each other to bf16 rounding and with the float32 step to a few percent."""

from __future__ import annotations

import math

import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.train.inner import autocast, inner_step, make_inner_optimizer, make_sampler

MODES = {"plain": (0, 0.0), "paged": (4, 0.0), "checkpointed": (4, 0.003)}


def _grads_after_one_step(mode: str, precision: str) -> tuple[float, dict[str, torch.Tensor], torch.nn.Module]:
    bptt_chunk, budget = MODES[mode]
    spec = RunSpec.from_dict({
        "model": {"name": "frame", "preset": "tiny"},
        "data": {"source": "typing", "seq_len": 24, "batch_size": 2, "task_config": {"n_documents": 4}},
        "inner": {"bptt_chunk": bptt_chunk, "memory_budget_mb": budget, "precision": precision, "lr": 1e-12},
    })
    model = registry.build_model("frame", "tiny", seed=0)
    sampler = make_sampler(spec.data, seed=1, model_config=model.config)
    optimizer = make_inner_optimizer(model, spec.inner)
    result = inner_step(model, optimizer, sampler, 0.0, torch.device("cpu"), bptt_chunk, budget, precision)
    assert result.tokens == 48 and math.isfinite(result.loss)
    return result.loss, {name: p.grad.clone() for name, p in model.named_parameters()}, model


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads.values()])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_bf16_steps_agree_across_bptt_modes_and_with_float32() -> None:
    reference_loss, reference, _ = _grads_after_one_step("plain", "fp32")
    plain_loss, plain, model = _grads_after_one_step("plain", "bf16")
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(g).all() for g in plain.values())
    assert plain_loss != reference_loss  # bf16 really ran
    assert abs(plain_loss - reference_loss) < 0.02 * reference_loss
    assert _relative(flat(plain), flat(reference)) < 0.03  # measured 0.006
    for mode in ("paged", "checkpointed"):
        loss, grads, _ = _grads_after_one_step(mode, "bf16")
        assert abs(loss - plain_loss) < 1e-2 * plain_loss, mode
        assert _relative(flat(grads), flat(plain)) < 0.01, mode  # measured 0.0015


def test_precision_is_validated_and_fp32_is_no_autocast() -> None:
    assert RunSpec.from_dict({"inner": {"precision": "bf16"}}).inner.precision == "bf16"
    with pytest.raises(ValueError, match=r"inner\.precision = 'fp16' is invalid: expected one of \('fp32', 'bf16'\)"):
        RunSpec.from_dict({"inner": {"precision": "fp16"}})
    with autocast(torch.device("cpu"), "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="inner.precision = 'int4'"):
        autocast(torch.device("cpu"), "int4")
