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
import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

from rcswarm.config.runspec import DataSection, InnerSection
from rcswarm.data.diagnostics import IGNORE_INDEX, TASKS, DiagnosticTask, make_task
from rcswarm.data.text import ByteWindowSampler, load_stdlib_corpus, split_boundary
from rcswarm.models.protocols import SegmentStepModel, StepModel
from rcswarm.train.bptt.checkpointed import CheckpointPlan
from rcswarm.train.bptt.encoder_chunks import chunk_bounds
from rcswarm.train.bptt.stats import StreamingStats
from rcswarm.train.bptt.streaming import streaming_backward

if TYPE_CHECKING:  # the frame sources are imported when a run trains on frames (a worker's start-up, issue #31)
    from rcswarm.config.runspec import RunSpec
    from rcswarm.data.frames import GitFrameSource, TypingConfig, TypingFrameSource

VAL_SEED_OFFSET = 1 << 40
BYTE_VOCAB = 256  # the token ids of the "stdlib" byte windows
FRAME_GEOMETRY = ("rows", "cols", "char_vocab", "action_vocab")  # the config fields frame sources are shaped by
MIB = 1 << 20
ADAMW_EPS = 1e-8  # torch.optim.AdamW's default
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


class InnerOptimizer:
    """The inner optimizer of `inner.optimizer`: AdamW (betas, weight decay, eps 1e-8) or plain SGD (no momentum)
    over the given parameters, run by torch's functional kernels (`torch.optim.adamw.adamw`,
    `torch.optim.sgd.sgd`) on the state torch.optim.AdamW and SGD keep, so the arithmetic is theirs bit for bit
    (tests/train/test_inner_optimizer.py). Not their classes: `torch.optim.Optimizer`'s first call imports
    torch._dynamo, 1.4–2.4 s of a worker's start-up on a 2-core host, paid after it joined, while its first
    round waited for it (issue #31, docs/RELIABILITY.md "Start-up").
    """

    def __init__(self, params: list[nn.Parameter], inner: InnerSection) -> None:
        if inner.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"inner.optimizer = {inner.optimizer!r}: expected 'adamw' or 'sgd'")
        self.params, self.inner = params, inner
        # Per parameter with a gradient so far: its step count (a float scalar on the CPU) and AdamW's two moments.
        self.steps: dict[nn.Parameter, torch.Tensor] = {}
        self.moments: dict[nn.Parameter, tuple[torch.Tensor, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (`set_to_none`, as the inner step always asks)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of the parameters that have a gradient."""
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in params]
        inner = self.inner
        if inner.optimizer == "sgd":
            sgd(params, grads, [None] * len(params), weight_decay=inner.weight_decay, momentum=0.0, lr=inner.lr,
                dampening=0.0, nesterov=False, maximize=False)
            return
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        for p in params:
            if p not in self.steps:
                self.steps[p] = torch.tensor(0.0, dtype=scalar)
                self.moments[p] = (torch.zeros_like(p, memory_format=torch.preserve_format),
                                   torch.zeros_like(p, memory_format=torch.preserve_format))
        adamw(params, grads, [self.moments[p][0] for p in params], [self.moments[p][1] for p in params], [],
              [self.steps[p] for p in params], amsgrad=False, beta1=inner.beta1, beta2=inner.beta2, lr=inner.lr,
              weight_decay=inner.weight_decay, eps=ADAMW_EPS, maximize=False)


def make_inner_optimizer(model: nn.Module, inner: InnerSection) -> InnerOptimizer:
    """The inner optimizer of `inner` over the model's trainable parameters."""
    return InnerOptimizer([p for p in model.parameters() if p.requires_grad], inner)


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


def make_task_from(data: DataSection, model_config: Any = None) -> DiagnosticTask:
    """The diagnostic task `data` names, checked to fit the token model whose config is `model_config` (its
    `vocab_size` covers the task's tokens, its logits a position its target classes; None: not checked)."""
    if data.task not in TASKS:
        raise ValueError(f"data.task = {data.task!r} is invalid: expected one of {sorted(TASKS)}")
    try:
        task = make_task(data.task, **data.task_config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"data.task_config = {data.task_config} is invalid for task {data.task!r}: {exc}") from None
    if model_config is None:
        return task
    vocab_size = _token_vocab(data, model_config)
    classes = getattr(model_config, "num_classes", None) or vocab_size  # the model's logits per position
    if vocab_size < task.vocab.vocab_size:
        raise ValueError(f"data.task = {data.task!r} has {task.vocab.vocab_size} tokens: the model's vocab_size = "
                         f"{vocab_size} is too small; expected [model.overrides] vocab_size >= {task.vocab.vocab_size}")
    if classes < task.vocab.num_classes:
        raise ValueError(f"data.task = {data.task!r} has {task.vocab.num_classes} target classes: the model has "
                         f"{classes} logits a position; expected [model.overrides] num_classes (or vocab_size) "
                         f">= {task.vocab.num_classes}")
    return task


def _token_vocab(data: DataSection, model_config: Any) -> int:
    """The vocabulary of the token model whose config is `model_config`; ValueError for a frame model."""
    vocab_size = getattr(model_config, "vocab_size", None)
    if _is_frame_model(model_config) or not isinstance(vocab_size, int):
        raise ValueError(f"data.source = {data.source!r} trains a token model, and {type(model_config).__name__} is not "
                         'one: a frame model trains on data.source = "typing" or "git"')
    return vocab_size


def _check_byte_model(data: DataSection, model_config: Any) -> None:
    """ValueError unless the model whose config is `model_config` (None: not checked) takes byte tokens and has a
    logit for every byte it is asked to predict."""
    if model_config is None:
        return
    vocab_size = _token_vocab(data, model_config)
    if vocab_size < BYTE_VOCAB:
        raise ValueError(f'data.source = "stdlib" trains on bytes: expected [model.overrides] vocab_size >= {BYTE_VOCAB}, '
                         f"got {model_config.vocab_size}")
    num_classes = getattr(model_config, "num_classes", None)
    if (num_classes or vocab_size) < BYTE_VOCAB:  # the model's logits per position
        raise ValueError(f"[model.overrides] num_classes = {num_classes}: data.source = \"stdlib\" predicts the next "
                         f"byte; expected num_classes >= {BYTE_VOCAB} (or unset: vocab_size)")


def _check_frame_model(data: DataSection, model_config: Any) -> None:
    """ValueError unless `model_config` is a frame model's (the config fields frame sources are shaped by)."""
    if not _is_frame_model(model_config):
        raise ValueError(f"data.source = {data.source!r} needs a frame model (config fields {FRAME_GEOMETRY}); "
                         f"got {model_config!r}")


def _is_frame_model(model_config: Any) -> bool:
    return model_config is not None and all(hasattr(model_config, name) for name in FRAME_GEOMETRY)


def typing_config_for(data: DataSection, model_config: Any) -> TypingConfig:
    """The typing task's config for the frame model whose config is `model_config`, [data.task_config] applied."""
    from rcswarm.data.frames import TypingConfig

    _check_frame_model(data, model_config)
    known = {f.name for f in dataclasses.fields(TypingConfig)} - set(FRAME_GEOMETRY)
    unknown = sorted(set(data.task_config) - known)
    if unknown:
        raise ValueError(f"data.task_config = {data.task_config} is invalid: unknown keys {unknown} with "
                         f'source = "typing"; expected some of {sorted(known)} (the geometry is the model\'s)')
    return TypingConfig.fitting(*(getattr(model_config, name) for name in FRAME_GEOMETRY), **data.task_config)


def make_typing_source(data: DataSection, seed: int, split: str, model_config: Any) -> TypingFrameSource:
    """Typing frames shaped for the frame model whose config is `model_config`."""
    from rcswarm.data.frames import FrameWindowSpec, TypingFrameSource

    window_seed = seed + (VAL_SEED_OFFSET if split == "val" else 0)
    return TypingFrameSource(typing_config_for(data, model_config), FrameWindowSpec(data.batch_size, data.seq_len, window_seed))


def make_git_source(data: DataSection, seed: int, split: str, model_config: Any) -> GitFrameSource:
    """Windows of a `rcswarm data frames` dataset for the frame model whose config is `model_config`.

    Split "train" reads the training histories, "val" the held-out ones (`GitFrameSource`'s `split`).
    """
    from rcswarm.data.frames import FrameWindowSpec, GitFrameSource
    from rcswarm.data.frames.git_editor import N_STYLES as GIT_FRAME_STYLES

    dataset = data.task_config.get("dataset")
    if not dataset:
        raise ValueError('data.source = "git" needs [data.task_config] dataset = "DIR" (made by `rcswarm data frames`)')
    _check_frame_model(data, model_config)
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
        return DiagnosticSampler(make_task_from(data, model_config), data.batch_size, seed, split)
    if data.source == "typing":
        return make_typing_source(data, seed, split, model_config)
    if data.source == "git":
        return make_git_source(data, seed, split, model_config)
    _check_byte_model(data, model_config)
    corpus = _stdlib_corpus(data.max_bytes or None)
    return ByteWindowSampler(
        corpus=corpus, seq_len=data.seq_len, batch_size=data.batch_size, seed=seed, split=split,
        val_fraction=data.val_fraction,
    )


def data_problem(spec: RunSpec, open_dataset: bool = False) -> str | None:
    """Why a worker could not build the data of `spec` for its model or train it as `[inner]` says (None: it can),
    found before anything starts: the diagnostic task and its config, the typing task's config, the byte vocabulary
    and output classes of "stdlib", every window length the run can ask against the model's max_len, and a model
    streaming BPTT (or core checkpointing) can train; with `open_dataset` (the launcher, whose workers share its
    disk) also the git dataset and its geometry. Cheap: the model is not built (its class is read from the
    registry)."""
    from rcswarm.models import registry

    data = spec.data
    try:
        model_config = registry.make_config(spec.model.name, spec.model.preset, spec.model.overrides)
        if data.source == "diag":
            make_task_from(data, model_config)
        elif data.source == "typing":
            typing_config_for(data, model_config)
        elif data.source == "git":
            _check_git_windows(spec, model_config) if open_dataset else _check_frame_model(data, model_config)
        else:
            _check_byte_model(data, model_config)
            _check_byte_splits(spec)
        _check_lengths(spec, model_config)
        _check_streaming_model(spec, model_config)
    except ValueError as exc:
        return str(exc)
    return None


def _asked_lengths(spec: RunSpec) -> list[tuple[str, Any, list[int]]]:
    """The window lengths a run of `spec` can ask of its model: (key, its value, the lengths it sets) for the training
    lengths (sweep.seq_lens in a sweep, whose runs replace data.seq_len; else the curriculum's — the adaptive ladder,
    curriculum.worker_seq_lens or the schedule's rows — or data.seq_len without one) and the held-out windows
    (run.eval_seq_len, else each run's data.seq_len). Empty for data.source = "diag", whose task sets its lengths."""
    if spec.data.source == "diag":
        return []
    curriculum, eval_seq_len, seq_len = spec.curriculum, spec.run.eval_seq_len, spec.data.seq_len
    asked: list[tuple[str, Any, list[int]]] = []
    if spec.is_sweep:
        asked.append(("sweep.seq_lens", spec.sweep.seq_lens, list(spec.sweep.seq_lens)))
    elif curriculum.seq_lens:
        asked.append(("curriculum.seq_lens", curriculum.seq_lens, list(curriculum.seq_lens)))
    elif curriculum.worker_seq_lens:
        asked.append(("curriculum.worker_seq_lens", curriculum.worker_seq_lens, list(curriculum.worker_seq_lens)))
    elif curriculum.schedule:
        asked.append(("curriculum.schedule", curriculum.schedule, [row[1] for row in curriculum.schedule]))
    if not spec.is_sweep and not (asked and eval_seq_len):  # data.seq_len trains, or sizes the held-out windows
        asked.append(("data.seq_len", seq_len, [seq_len]))
    if eval_seq_len:
        asked.append(("run.eval_seq_len", eval_seq_len, [eval_seq_len]))
    return asked


def _check_git_windows(spec: RunSpec, model_config: Any) -> None:
    """ValueError naming the key when the git dataset cannot give a window a run of `spec` asks (`_asked_lengths`):
    each training length of the training histories and, without run.eval_seq_len, of the held-out ones too (each
    run's held-out windows are its own length); run.eval_seq_len of the held-out ones. A sweep whose held-out split
    is shorter than one of its lengths passed, before, and its workers of that length died at their start."""
    eval_seq_len = spec.run.eval_seq_len
    for key, value, lengths in _asked_lengths(spec):
        splits = ("val",) if key == "run.eval_seq_len" else ("train",) if eval_seq_len else ("train", "val")
        for length in sorted(set(lengths)):
            for split in splits:
                try:
                    make_git_source(dataclasses.replace(spec.data, seq_len=length), 0, split, model_config)
                except ValueError as exc:
                    raise ValueError(f"{key} = {value!r}: windows of {length} frames: {exc}") from None


def _check_byte_splits(spec: RunSpec) -> None:
    """ValueError naming data.max_bytes and data.val_fraction when a split of a capped "stdlib" corpus (as
    `ByteWindowSampler` cuts it, assuming the stdlib holds max_bytes) is shorter than a window the run asks of it
    plus one byte: the held-out split its held-out windows (run.eval_seq_len, else each run's data.seq_len), the
    training split every length the run can train (`_asked_lengths`). Before, max_bytes = 20000 with val_fraction =
    0.001 left a 20-byte held-out split, and the worker died at its first evaluation (review, 2026-11-28)."""
    data = spec.data
    if not data.max_bytes:
        return
    trained = [length for key, _, lengths in _asked_lengths(spec) if key != "run.eval_seq_len" for length in lengths]
    held_out = ([spec.run.eval_seq_len] if spec.run.eval_seq_len else
                list(spec.sweep.seq_lens) if spec.is_sweep else [data.seq_len])
    boundary = split_boundary(data.max_bytes, data.val_fraction)
    for split, size, lengths in (("held-out", data.max_bytes - boundary, held_out), ("training", boundary, trained)):
        if lengths and size < max(lengths) + 1:
            raise ValueError(
                f"data.max_bytes = {data.max_bytes} with data.val_fraction = {data.val_fraction} leaves a {split} split "
                f"of {size} bytes, shorter than a window of {max(lengths)} positions and its next byte; expected a "
                f"split of at least {max(lengths) + 1} bytes (raise data.max_bytes or data.val_fraction)")


def _check_lengths(spec: RunSpec, model_config: Any) -> None:
    """ValueError naming the key when a length the run can ask (`_asked_lengths`) exceeds the model's `max_len` (the
    positions a model with a position table takes; models without one take any length)."""
    max_len = getattr(model_config, "max_len", None)
    if not isinstance(max_len, int):
        return
    for key, value, lengths in _asked_lengths(spec):
        if max(lengths) > max_len:
            raise ValueError(f"{key} = {value}: model {spec.model.name!r} takes windows of at most max_len = {max_len} "
                             f"positions; expected lengths <= {max_len} (or [model.overrides] max_len >= {max(lengths)})")


def _model_class(name: str, model_config: Any) -> type:
    """The class of the models registry entry `name` builds: its builder when that is a class, else the type of a
    model built from `model_config` on the meta device (shapes only; the caller's RNG state untouched)."""
    from rcswarm.models import registry

    build = registry.get(name).build
    if isinstance(build, type):
        return build
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return type(build(model_config))


def _check_streaming_model(spec: RunSpec, model_config: Any) -> None:
    """ValueError naming the key when `[inner]` asks for streaming BPTT (bptt_chunk > 0) of a model that is not a
    StepModel, or for core checkpointing (memory_budget_mb > 0) of one that is not a SegmentStepModel."""
    inner = spec.inner
    if inner.bptt_chunk <= 0:
        return
    cls = _model_class(spec.model.name, model_config)
    if not issubclass(cls, StepModel):
        raise ValueError(f"inner.bptt_chunk = {inner.bptt_chunk}: streaming BPTT needs a model with encode() and "
                         f"core_loss() (a StepModel), and model {spec.model.name!r} ({cls.__name__}) is not one; "
                         "expected inner.bptt_chunk = 0 (plain autograd) or a model such as \"frame\"")
    if inner.memory_budget_mb > 0 and not issubclass(cls, SegmentStepModel):
        raise ValueError(f"inner.memory_budget_mb = {inner.memory_budget_mb}: core checkpointing needs a model with "
                         f"encode(), core_loss() and core_segment() (a SegmentStepModel), and model "
                         f"{spec.model.name!r} ({cls.__name__}) is not one; expected inner.memory_budget_mb = 0")


@functools.lru_cache(maxsize=1)
def _stdlib_corpus(max_bytes: int | None) -> bytes:
    """The text corpus, read once per process (a walk of the standard library: 0.1–0.2 s) for every stream."""
    return load_stdlib_corpus(max_bytes)


def preload_data(data: DataSection) -> None:
    """Read what the data streams of `data` share (the text corpus) ahead of `make_sampler`."""
    if data.source == "stdlib":
        _stdlib_corpus(data.max_bytes or None)


def worker_data_seed(run_seed: int, data_seed: int) -> int:
    """A distinct, reproducible data stream per (run, worker slot)."""
    return (run_seed * 1_000_003 + data_seed * 7_919) % (2**63)


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against targets [B, T] over the positions not IGNORE_INDEX."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def loss_sum(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device, bptt_chunk: int = 0,
) -> tuple[float, int]:
    """The summed cross-entropy of `model` on one batch (inputs [B, L, ...], targets [B, L]) over the positions not
    IGNORE_INDEX, and their number, without gradients: the held-out loss's terms.

    A model trained in streaming chunks (`bptt_chunk` > 0 and a StepModel) is evaluated as it trains, `bptt_chunk`
    steps at a time (`_streamed_loss_sum`): the whole window at once would keep activations growing with L where
    its training's are flat. The value is the whole window's up to floating-point summation order. The inputs may
    stay on the host; each chunk is moved to `device`.
    """
    targets = targets.to(device)  # [B, L]
    scored = int((targets != IGNORE_INDEX).sum())
    if not scored:
        return 0.0, 0
    with torch.no_grad():
        if bptt_chunk > 0 and isinstance(model, StepModel):
            return _streamed_loss_sum(model, inputs, targets, device, bptt_chunk, scored), scored
        logits = model(inputs.to(device))  # [B, L, V]
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                                reduction="sum")
    return total.item(), scored


def _streamed_loss_sum(
    model: StepModel, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device, k: int, scored: int,
) -> float:
    """`loss_sum` of a StepModel k steps at a time (under no_grad): each chunk of inputs [B, k, ...] is encoded on
    its own; a SegmentStepModel's core then runs on the chunk's embeddings [B, k, D] from the state the chunk before
    left (`core_segment`), so nothing of size O(L) is kept; a plain StepModel's core needs the whole window's
    embeddings [B, L, D] (as the paged training keeps them) and its `core_loss`, the mean over the `scored`
    positions."""
    bounds = chunk_bounds(inputs.shape[1], k)
    if not isinstance(model, SegmentStepModel):
        embeddings = torch.cat([model.encode(inputs[:, a:b].to(device)) for a, b in bounds], dim=1)  # [B, L, D]
        return model.core_loss(embeddings, targets).item() * scored
    total = torch.zeros((), dtype=torch.float64, device=device)
    state = None
    for a, b in bounds:
        embeddings = model.encode(inputs[:, a:b].to(device))  # [B, k, D]
        chunk_sum, _, state = model.core_segment(embeddings, targets[:, a:b], state)  # state: the core's after b
        total += chunk_sum.double()
    return total.item()


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
    model: nn.Module, optimizer: InnerOptimizer | torch.optim.Optimizer, grad_clip: float, backward: Callable[[], T]
) -> T:
    """Zero the gradients, run `backward` (which accumulates them), clip, step; what `backward` returned."""
    optimizer.zero_grad(set_to_none=True)
    result = backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return result


def train_step(
    model: nn.Module, optimizer: InnerOptimizer | torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
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
    model: nn.Module, optimizer: InnerOptimizer | torch.optim.Optimizer, sampler: Any, grad_clip: float,
    bptt_chunk: int, plan: CheckpointPlan,
) -> tuple[float, StreamingStats]:
    """One optimizer step with core checkpointing on the sampler's next window (lazy where it can be)."""
    if not isinstance(model, SegmentStepModel):
        raise ValueError(
            f"inner.memory_budget_mb > 0 needs a model with encode(), core_loss() and core_segment(); "
            f"got {type(model).__name__}"
        )
    from rcswarm.data.frames import TensorWindow

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
    model: nn.Module, optimizer: InnerOptimizer | torch.optim.Optimizer, sampler: Any, grad_clip: float,
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
