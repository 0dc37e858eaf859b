"""The training layer: the masked cross-entropy, one optimizer step, the inner optimizer and data streams.

A worker runs H inner steps of full backpropagation through time over its assigned
sequence length (the whole window is one autograd graph, or streaming BPTT with
`bptt_chunk` > 0, with core checkpointing when `memory_budget_mb` > 0: the schedule is
chosen from the budget at each step and reported in `StepResult.schedule`, and the batch
comes from the sampler's lazy `next_window()` where it has one), with AdamW (default) or
SGD. `masked_cross_entropy` is the one loss of every model trained on token targets
(worker, the launcher's evaluation, the diagnostics bench) and `train_step` the one
optimizer step the worker and the bench share.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from rcswarm.config.runspec import DataSection, InnerSection
from rcswarm.data.diagnostics import IGNORE_INDEX, DiagnosticTask, make_task
from rcswarm.data.frames import FrameWindowSpec, GitFrameSource, TensorWindow, TypingConfig, TypingFrameSource
from rcswarm.data.frames.git_editor import N_STYLES as GIT_FRAME_STYLES
from rcswarm.data.text import ByteWindowSampler, load_stdlib_corpus
from rcswarm.models.protocols import SegmentStepModel, StepModel
from rcswarm.train.bptt.checkpointed import CheckpointPlan
from rcswarm.train.bptt.stats import StreamingStats
from rcswarm.train.bptt.streaming import streaming_backward

VAL_SEED_OFFSET = 1 << 40
MIB = 1 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class StepResult:
    """One inner step: its loss, the scored target positions it trained on, its wall time.

    `schedule` describes the core checkpointing schedule the step used ("" without it).
    """

    loss: float
    tokens: int
    seconds: float
    schedule: str = ""


def make_inner_optimizer(model: nn.Module, inner: InnerSection) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if inner.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=inner.lr, betas=(inner.beta1, inner.beta2), weight_decay=inner.weight_decay)
    if inner.optimizer == "sgd":
        return torch.optim.SGD(params, lr=inner.lr, weight_decay=inner.weight_decay)
    raise ValueError(f"inner.optimizer = {inner.optimizer!r}: expected 'adamw' or 'sgd'")


class DiagnosticSampler:
    """Batches of a diagnostic task: (tokens [B, T], targets [B, T]) with IGNORE_INDEX where unscored.

    Batch i of split s is `task.batch(batch_size, seed=…)` for a seed derived from (seed, s, i),
    so every process draws the same stream; "val" never overlaps "train".
    """

    def __init__(self, task: DiagnosticTask, batch_size: int, seed: int, split: str = "train") -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r}: expected 'train' or 'val'")
        self.task, self.batch_size = task, batch_size
        self._base = (seed % 2**31) * 2 + (split == "val")
        self._index = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.task.batch(self.batch_size, seed=self._base * 1_000_003 + self._index)
        self._index += 1
        return batch.tokens, batch.targets


def make_task_from(data: DataSection) -> DiagnosticTask:
    return make_task(data.task, **data.task_config)


def make_typing_source(data: DataSection, seed: int, split: str, model_config: Any) -> TypingFrameSource:
    """Typing frames shaped for the frame model whose config is `model_config`."""
    geometry = ("rows", "cols", "char_vocab", "action_vocab")
    if model_config is None or not all(hasattr(model_config, name) for name in geometry):
        raise ValueError(f'data.source = "typing" needs a frame model (config fields {geometry}); got {model_config!r}')
    config = TypingConfig.fitting(*(getattr(model_config, name) for name in geometry), **data.task_config)
    window_seed = seed + (VAL_SEED_OFFSET if split == "val" else 0)
    return TypingFrameSource(config, FrameWindowSpec(data.batch_size, data.seq_len, window_seed))


def make_git_source(data: DataSection, seed: int, split: str, model_config: Any) -> GitFrameSource:
    """Windows of a `rcswarm data frames` dataset for the frame model whose config is `model_config`.

    Split "train" reads the training histories, "val" the held-out ones (`GitFrameSource`'s `split`).
    """
    dataset = data.task_config.get("dataset")
    if not dataset:
        raise ValueError('data.source = "git" needs [data.task_config] dataset = "DIR" (made by `rcswarm data frames`)')
    window_seed = seed + (VAL_SEED_OFFSET if split == "val" else 0)
    source = GitFrameSource(dataset, FrameWindowSpec(data.batch_size, data.seq_len, window_seed),
                            char_vocab=model_config.char_vocab, split=split)
    fits = (
        source.geometry == (model_config.rows, model_config.cols)
        and source.action_vocab_size <= model_config.action_vocab
        and GIT_FRAME_STYLES <= model_config.n_styles
    )
    if not fits:
        raise ValueError(
            f"dataset {dataset}: frames {source.geometry}, {source.action_vocab_size} action tokens, "
            f"{GIT_FRAME_STYLES} styles; the model has rows, cols = {(model_config.rows, model_config.cols)}, "
            f"action_vocab = {model_config.action_vocab}, n_styles = {model_config.n_styles}"
        )
    return source


def make_sampler(
    data: DataSection, seed: int, split: str = "train", model_config: Any = None
) -> ByteWindowSampler | DiagnosticSampler | TypingFrameSource | GitFrameSource:
    """The training (or held-out) batch stream of `data`; frame sources take the model's geometry."""
    if data.source == "diag":
        return DiagnosticSampler(make_task_from(data), data.batch_size, seed, split)
    if data.source == "typing":
        return make_typing_source(data, seed, split, model_config)
    if data.source == "git":
        return make_git_source(data, seed, split, model_config)
    corpus = load_stdlib_corpus(data.max_bytes or None)
    return ByteWindowSampler(
        corpus=corpus, seq_len=data.seq_len, batch_size=data.batch_size, seed=seed, split=split,
        val_fraction=data.val_fraction,
    )


def worker_data_seed(run_seed: int, data_seed: int) -> int:
    """A distinct, reproducible data stream per (run, worker slot)."""
    return (run_seed * 1_000_003 + data_seed * 7_919) % (2**63)


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against targets [B, T] over the positions not IGNORE_INDEX."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def backward_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, bptt_chunk: int = 0) -> float:
    """Accumulate the gradients of one batch's loss and return its value: the masked cross-entropy.

    With `bptt_chunk` > 0 the model must be a StepModel (per-step encoder + core) and the
    loss is its `core_loss`: the gradients come from streaming BPTT, equal to plain
    autograd's, in memory flat in the window length.
    """
    if bptt_chunk > 0:
        if not isinstance(model, StepModel):
            raise ValueError(f"inner.bptt_chunk = {bptt_chunk} needs a model with encode() and core_loss(); got {type(model).__name__}")
        loss_value, _ = streaming_backward(model, (inputs, targets), bptt_chunk)
        return loss_value
    loss = masked_cross_entropy(model(inputs), targets)  # model: [B, T, ...] -> [B, T, V]
    loss.backward()
    return loss.item()


def _optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, backward: Callable[[], T]
) -> T:
    """Zero the gradients, run `backward` (which accumulates them), clip, step; what `backward` returned."""
    optimizer.zero_grad(set_to_none=True)
    result = backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return result


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
    grad_clip: float, bptt_chunk: int = 0,
) -> float:
    """One optimizer step on the batch (inputs [B, T, ...], targets [B, T]): gradients, clipping, step; the loss."""
    return _optimizer_step(model, optimizer, grad_clip, lambda: backward_loss(model, inputs, targets, bptt_chunk))


def checkpoint_plan(memory_budget_mb: float) -> CheckpointPlan | None:
    """The core checkpointing plan of `[inner] memory_budget_mb` (None for 0: paged streaming)."""
    if memory_budget_mb <= 0:
        return None
    return CheckpointPlan(budget_bytes=max(1, int(memory_budget_mb * MIB)))


def checkpointed_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any, grad_clip: float, bptt_chunk: int,
    plan: CheckpointPlan,
) -> tuple[float, StreamingStats]:
    """One optimizer step with core checkpointing on the sampler's next window (lazy where it can be)."""
    if not isinstance(model, SegmentStepModel):
        raise ValueError(
            f"inner.memory_budget_mb > 0 needs a model with encode(), core_loss() and core_segment(); "
            f"got {type(model).__name__}"
        )
    window = sampler.next_window() if hasattr(sampler, "next_window") else TensorWindow(*sampler.next_batch())
    return _optimizer_step(
        model, optimizer, grad_clip, lambda: streaming_backward(model, window, bptt_chunk, checkpoints=plan)
    )


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The context an inner step runs in: torch.autocast(bfloat16) on `device` for "bf16", nothing for "fp32"."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"inner.precision = {precision!r}: expected 'fp32' or 'bf16'")


def inner_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any, grad_clip: float,
    device: torch.device, bptt_chunk: int = 0, memory_budget_mb: float = 0.0, precision: str = "fp32",
) -> StepResult:
    """One `train_step` on the sampler's next batch, on `device`, timed, with the scored tokens counted.

    Streaming BPTT (`bptt_chunk` > 0) leaves the inputs on the host; it moves each chunk itself.
    With `memory_budget_mb` > 0 it checkpoints the core (`checkpointed_step`). With `precision`
    "bf16" the forward and backward passes (recomputations included) run under `autocast`; the
    clipping and the optimizer step see the float32 gradients either way.
    """
    started = time.perf_counter()
    plan = checkpoint_plan(memory_budget_mb) if bptt_chunk > 0 else None
    if plan is not None:
        with autocast(device, precision):
            loss_value, stats = checkpointed_step(model, optimizer, sampler, grad_clip, bptt_chunk, plan)
        return StepResult(loss_value, stats.scored, time.perf_counter() - started, stats.schedule)
    inputs, targets = sampler.next_batch()  # [B, T, ...], [B, T]
    targets = targets.to(device)
    if bptt_chunk <= 0:
        inputs = inputs.to(device)
    with autocast(device, precision):
        loss_value = train_step(model, optimizer, inputs, targets, grad_clip, bptt_chunk)
    scored = int((targets != IGNORE_INDEX).sum())
    return StepResult(loss=loss_value, tokens=scored, seconds=time.perf_counter() - started)
