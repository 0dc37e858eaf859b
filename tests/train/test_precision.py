"""`[inner] precision = "bf16"`: the inner step under torch.autocast(bfloat16), here on the CPU (the same code a
CUDA worker runs, but not the same autocast policy: CUDA's runs norms in float32 and cuDNN RNNs in float16, emulated
or guarded below; no GPU on this machine): plain autograd, paged streaming BPTT and core checkpointing give finite
float32 gradients that agree with each other to bf16 rounding and with the float32 step to a few percent; every
model family takes a bf16 step; every LSTM runs in float32 outside autocast."""

from __future__ import annotations

import math

import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.train.inner import autocast, inner_step, make_inner_optimizer, make_sampler

MODES = {"plain": (0, 0.0), "paged": (4, 0.0), "checkpointed": (4, 0.003)}
# The devices the steps run on: the CPU, and CUDA where there is one (its autocast policy is the one that matters).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _grads_after_one_step(mode: str, precision: str, device: str = "cpu",
                          ) -> tuple[float, dict[str, torch.Tensor], torch.nn.Module]:
    bptt_chunk, budget = MODES[mode]
    spec = RunSpec.from_dict({
        "model": {"name": "frame", "preset": "tiny"},
        "data": {"source": "typing", "seq_len": 24, "batch_size": 2, "task_config": {"n_documents": 4}},
        "inner": {"bptt_chunk": bptt_chunk, "memory_budget_mb": budget, "precision": precision, "lr": 1e-10},
    })
    model = registry.build_model("frame", "tiny", seed=0).to(device)
    sampler = make_sampler(spec.data, seed=1, model_config=model.config)
    optimizer = make_inner_optimizer(model, spec.inner)
    result = inner_step(model, optimizer, sampler, 0.0, torch.device(device), bptt_chunk, budget, precision)
    assert result.tokens == 48 and math.isfinite(result.loss)
    return result.loss, {name: p.grad.clone() for name, p in model.named_parameters()}, model


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads.values()])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_steps_agree_across_bptt_modes_and_with_float32(device: str) -> None:
    reference_loss, reference, _ = _grads_after_one_step("plain", "fp32", device)
    plain_loss, plain, model = _grads_after_one_step("plain", "bf16", device)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(g).all() for g in plain.values())
    assert plain_loss != reference_loss  # bf16 really ran
    assert abs(plain_loss - reference_loss) < 0.02 * reference_loss
    assert _relative(flat(plain), flat(reference)) < 0.03  # measured 0.006
    for mode in ("paged", "checkpointed"):
        loss, grads, _ = _grads_after_one_step(mode, "bf16", device)
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


class TokenBatches:
    """Random tokens below the model's vocabulary, 2 windows of 32 (the sampler protocol inner_step reads)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.generator = torch.Generator().manual_seed(0)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, self.vocab, (2, 33), generator=self.generator)
        return tokens[:, :-1], tokens[:, 1:]  # [B, T], [B, T]


def _bf16_token_step(name: str, preset: str, device: str = "cpu") -> tuple[torch.nn.Module, float]:
    """The model after one bf16 inner step on random tokens below its vocabulary, and the step's loss."""
    model = registry.build_model(name, preset, seed=0).to(device)
    vocab = next(m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding))
    spec = RunSpec.from_dict({"model": {"name": name, "preset": preset}, "inner": {"precision": "bf16"}})
    result = inner_step(model, make_inner_optimizer(model, spec.inner), TokenBatches(vocab), 1.0, torch.device(device),
                        0, 0.0, "bf16")
    return model, result.loss


BF16_MODELS = [(name, "tiny") for name in registry.list_models() if name != "frame"] + [("psm", "mqar")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "preset"), BF16_MODELS)
def test_every_token_model_takes_a_bf16_step(name: str, preset: str, device: str) -> None:
    """One inner step of each token model under bf16 autocast on bytes: finite loss and float32 gradients (the
    recurrence kernel and the scans get operands of one dtype: autocast hands them bf16 and float32 mixed)."""
    model, loss = _bf16_token_step(name, preset, device)
    assert math.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and bool(torch.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["frame", "lstm_lm", "lstm"])
def test_lstms_run_in_float32_outside_autocast(name: str, device: str) -> None:
    """Every nn.LSTM runs with autocast off on float32 input under bf16 autocast: on CUDA, autocast would run a
    cuDNN RNN in float16 whatever dtype it was given (models/precision.py)."""
    model = registry.build_model(name, "tiny", seed=0).to(device)
    seen: list[tuple[bool, torch.dtype]] = []
    for module in model.modules():
        if isinstance(module, torch.nn.LSTM):
            module.register_forward_pre_hook(
                lambda _, args: seen.append((torch.is_autocast_enabled(device), args[0].dtype)))
    source = "typing" if name == "frame" else "stdlib"
    spec = RunSpec.from_dict({
        "model": {"name": name, "preset": "tiny"},
        "data": {"source": source, "seq_len": 16, "batch_size": 2,
                 **({"task_config": {"n_documents": 4}} if name == "frame" else {"max_bytes": 200_000})},
        "inner": {"precision": "bf16"},
    })
    sampler = make_sampler(spec.data, seed=1, model_config=model.config)
    result = inner_step(model, make_inner_optimizer(model, spec.inner), sampler, 1.0, torch.device(device), 0, 0.0,
                        "bf16")
    assert math.isfinite(result.loss) and seen and set(seen) == {(False, torch.float32)}, seen


def test_chaingpt_takes_a_bf16_step_under_cuda_autocast_policy_for_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA autocast runs rms_norm in float32 (CPU autocast leaves it alone), so SGSA's q and k arrive in float32
    beside a bf16 v; emulated here by an rms_norm that returns float32, the step still runs (one dtype, v's)."""
    import torch.nn.functional as F

    honest = F.rms_norm
    monkeypatch.setattr(F, "rms_norm", lambda *args, **kwargs: honest(*args, **kwargs).float())
    assert math.isfinite(_bf16_token_step("chaingpt", "tiny")[1])


def test_chaingpt_qk_norm_gets_its_weight_in_the_inputs_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under bf16 autocast q and k come out of their projections in bf16; a float32 norm weight beside them keeps
    PyTorch off its fused rms_norm kernel (its warning on an H100, torch 2.11), so the weight comes in their dtype."""
    import torch.nn.functional as F

    honest, seen = F.rms_norm, []

    def recording(x, shape, weight=None, eps=None):
        seen.append((x.dtype, None if weight is None else weight.dtype))
        return honest(x, shape, weight, eps)

    monkeypatch.setattr(F, "rms_norm", recording)
    assert math.isfinite(_bf16_token_step("chaingpt", "tiny")[1])
    assert seen and all(weight == x for x, weight in seen) and (torch.bfloat16, torch.bfloat16) in seen, seen
