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
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

from rcswarm.config.runspec import DataSection, InnerSection
from rcswarm.data.diagnostics import IGNORE_INDEX, TASKS, DiagnosticTask, make_task
from rcswarm.data.frames.window import FrameWindow, TensorWindow
from rcswarm.data.text import ByteWindowSampler, load_stdlib_corpus, split_boundary
from rcswarm.models.protocols import SegmentStepModel, StepModel
from rcswarm.train.bptt.checkpointed import CheckpointPlan
from rcswarm.train.bptt.encoder_chunks import chunk_bounds
from rcswarm.train.bptt.schedule import MemoryBudgetError
from rcswarm.train.bptt.stats import StreamingStats
from rcswarm.train.bptt.streaming import streaming_backward

if TYPE_CHECKING:  # the frame sources are imported when a run trains on frames (a worker's start-up, issue #31)
    from rcswarm.config.runspec import RunSpec
    from rcswarm.data.frames import GitFrameSource, TypingConfig, TypingFrameSource

VAL_SEED_OFFSET = 1 << 40
BYTE_VOCAB = 256  # the token ids of the "stdlib" byte windows
FRAME_GEOMETRY = ("rows", "cols", "char_vocab", "action_vocab")  # the config fields frame sources are shaped by
MIB = 1 << 20
FLOAT32_BYTES = 4
ADAMW_EPS = 1e-8  # torch.optim.AdamW's default
MAX_TASK_BATCH_POSITIONS = 1 << 21  # a diagnostic batch's positions at most: the worker's --max-step-tokens default
CONFIG_FAILURES = (ZeroDivisionError, OverflowError, MemoryError)  # what a task config the checks missed raises
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
        try:
            batch = self.task.batch(self.batch_size, seed=self._base * 1_000_003 + self._index)
        except CONFIG_FAILURES as exc:  # a config its checks let through: a message naming it, not a traceback
            config = self.task.config
            changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                       if getattr(config, f.name) != f.default}
            raise _task_config_failure(self.task.name, changed, exc, "drawing a batch") from None
        self._index += 1
        return batch.tokens, batch.targets


def _task_config_failure(task: str, settings: dict[str, Any], exc: BaseException, doing: str) -> ValueError:
    """The ValueError for `exc` (one of CONFIG_FAILURES) that diagnostic task `task` raised while `doing`, naming
    the [data.task_config] keys set (`settings`: key -> value), the ones that can have caused it."""
    named = ", ".join(f"data.task_config.{key} = {value!r}" for key, value in sorted(settings.items()))
    return ValueError(f"{named or 'data.task_config (its defaults)'}: task {task!r} raised {type(exc).__name__} "
                      f"{doing} ({exc or 'no message'}); expected values the task can be built and sampled with")


def make_task_from(data: DataSection, model_config: Any = None) -> DiagnosticTask:
    """The diagnostic task `data` names, checked to fit the token model whose config is `model_config` (its
    `vocab_size` covers the task's tokens, its logits a position its target classes; None: not checked)."""
    if data.task not in TASKS:
        raise ValueError(f"data.task = {data.task!r} is invalid: expected one of {sorted(TASKS)}")
    try:
        task = make_task(data.task, **data.task_config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"data.task_config = {data.task_config} is invalid for task {data.task!r}: {exc}") from None
    except CONFIG_FAILURES as exc:  # one its config's checks missed (fuzz review, 2026-11-29)
        raise _task_config_failure(data.task, dict(data.task_config), exc, "building the task") from None
    longest = getattr(task.config, "max_tokens", 0)
    if data.batch_size * longest > MAX_TASK_BATCH_POSITIONS:
        lengths = ", ".join(f"data.task_config.{key} = {getattr(task.config, key)!r}"
                            for key in getattr(task.config, "length_fields", ()))
        raise ValueError(
            f"data.batch_size = {data.batch_size} with {lengths}: examples of up to {longest} tokens make "
            f"{data.batch_size * longest} positions a batch; expected at most {MAX_TASK_BATCH_POSITIONS} "
            "(lower data.batch_size or the task's lengths)")
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


SCORED_PER_EXAMPLE: dict[str, tuple[Callable[[Any], int], tuple[str, ...]]] = {
    "maze": (lambda config: config.num_moves if config.scored == "every_move" else 1, ("num_moves", "scored")),
    "mqar": (lambda config: config.num_kv_pairs, ("num_kv_pairs",)),
    "s5": (lambda config: config.max_length, ("max_length",)),
    "frjt": (lambda config: 1, ()),
}
"""Per diagnostic task: the most scored positions of one example as a function of its config, and the
[data.task_config] keys that set it (`scored_per_example`)."""


def scored_per_example(data: DataSection, task: DiagnosticTask) -> tuple[int, tuple[str, ...]]:
    """The most scored target positions one example of `task` has, and the [data.task_config] keys that set it: from
    the config (`SCORED_PER_EXAMPLE`), or for a task not listed there the most of one drawn batch of
    data.batch_size examples (its length keys named)."""
    if task.name in SCORED_PER_EXAMPLE:
        count, keys = SCORED_PER_EXAMPLE[task.name]
        return count(task.config), keys
    targets = task.batch(data.batch_size, seed=0).targets  # [B, T]
    return int((targets != IGNORE_INDEX).sum(dim=1).max()), tuple(getattr(task.config, "length_fields", ()))


def _check_scored_positions(data: DataSection, task: DiagnosticTask) -> None:
    """ValueError naming data.seq_len unless it covers the scored positions of one example of `task`: for
    data.source = "diag" it stands for them in the coordinator's token bound (batch × seq_len × steps, sync.bound_tokens),
    and a run below it had every update and metric row refused after it started (review, 2026-11-29: the maze's
    num_moves = 400 with the default seq_len 256 made updates of 800 tokens against a bound of 512)."""
    scored, keys = scored_per_example(data, task)
    if data.seq_len >= scored:
        return
    named = ", ".join(f"data.task_config.{key} = {getattr(task.config, key)!r}" for key in keys)
    raise ValueError(
        f"data.seq_len = {data.seq_len}: with data.source = \"diag\" it bounds the scored positions of one sequence "
        f"(the coordinator's token bound, batch × seq_len × steps), and task {data.task!r} scores up to {scored} "
        f"a sequence{f' ({named})' if named else ''}; expected data.seq_len >= {scored}")


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
    """The typing task's config for the frame model whose config is `model_config`, [data.task_config] applied;
    ValueError naming [model.overrides] n_styles or char_vocab when the model cannot embed the frames' cells
    (`_check_typing_cells`)."""
    from rcswarm.data.frames import TypingConfig

    _check_frame_model(data, model_config)
    known = {f.name for f in dataclasses.fields(TypingConfig)} - set(FRAME_GEOMETRY)
    unknown = sorted(set(data.task_config) - known)
    if unknown:
        raise ValueError(f"data.task_config = {data.task_config} is invalid: unknown keys {unknown} with "
                         f'source = "typing"; expected some of {sorted(known)} (the geometry is the model\'s)')
    config = TypingConfig.fitting(*(getattr(model_config, name) for name in FRAME_GEOMETRY), **data.task_config)
    _check_typing_cells(config, model_config)
    return config


def _check_typing_cells(config: TypingConfig, model_config: Any) -> None:
    """ValueError naming [model.overrides] n_styles or char_vocab unless the frame model whose config is
    `model_config` embeds every cell of typing frames of `config`: a style id below n_styles (the frames use
    N_STYLES), and a char id below char_vocab that is the character's own (the empty cell and the cursor are a space,
    id 32; a typed character is its code point mod char_vocab, and two characters of the charset sharing an id
    would make the frames ambiguous). Before, char_vocab = 3 or n_styles = 1 passed and the first step raised an
    IndexError in the embedding (fuzz review, 2026-11-29); the git source checks its styles itself."""
    from rcswarm.data.frames import N_STYLES

    if model_config.n_styles < N_STYLES:
        raise ValueError(f'[model.overrides] n_styles = {model_config.n_styles}: data.source = "typing" frames use '
                         f"{N_STYLES} styles (empty, text, cursor, status); expected n_styles >= {N_STYLES}")
    shown = sorted({ord(ch) for ch in config.charset if ch != "\n"} | {ord(" ")})  # what a cell can show
    char_vocab = model_config.char_vocab
    if char_vocab <= ord(" ") or len({code % char_vocab for code in shown}) < len(shown):
        raise ValueError(
            f'[model.overrides] char_vocab = {char_vocab}: data.source = "typing" types a charset of {len(shown)} '
            f"characters with code points up to {shown[-1]} into cells of (code point mod char_vocab); expected "
            f"char_vocab >= {shown[-1] + 1} (each character its own id)")


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
    found before anything starts: the diagnostic task and its config, the typing task's config, documents and
    stream length, the byte vocabulary, output classes and split sizes of "stdlib", every window length the run can
    ask against the model's max_len, and a model streaming BPTT (or core checkpointing) can train; with
    `open_dataset` (the launcher, whose workers share its disk) also the git dataset and its geometry. Cheap: the
    model is not built (its class is read from the registry); the stdlib corpus and typing documents are read once
    (0.1 s; up to ~3 s for thousands of typing documents)."""
    from rcswarm.models import registry

    data = spec.data
    try:
        model_config = registry.make_config(spec.model.name, spec.model.preset, spec.model.overrides)
        if data.source == "diag":
            _check_diag_runs(spec, model_config)
        elif data.source == "typing":
            _check_typing_windows(spec, typing_config_for(data, model_config))
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


def _check_diag_runs(spec: RunSpec, model_config: Any) -> None:
    """`make_task_from` of the data of each run of `spec`, and with `sync.bound_tokens` (the coordinator's token
    bound, which only then holds a diagnostic run to data.seq_len) `_check_scored_positions`: a sweep's runs replace
    data.seq_len and data.batch_size, and its error then names sweep.seq_lens and the run's length. Not the worker's
    sampler: a worker refuses no run for a bound its coordinator may not apply."""
    def check(data: DataSection) -> None:
        task = make_task_from(data, model_config)
        if spec.sync.bound_tokens:
            _check_scored_positions(data, task)

    if not spec.is_sweep:
        check(spec.data)
        return
    for run in spec.sweep_runs():
        try:
            check(run.data)
        except ValueError as exc:
            raise ValueError(f"sweep.seq_lens = {list(spec.sweep.seq_lens)}: its run of data.seq_len = "
                             f"{run.data.seq_len}, data.batch_size = {run.data.batch_size}: {exc}") from None


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


def _check_typing_windows(spec: RunSpec, config: TypingConfig) -> None:
    """ValueError naming the key when a window a run of `spec` asks (`_asked_lengths`) is longer than the typing
    stream of `config` (the documents' characters and an END each; training and held-out windows draw from the same
    stream), or naming n_documents (or min_document_chars) when the standard library has too few documents. Before,
    both passed and every worker died building its source (fuzz review, 2026-11-29)."""
    steps = _typing_stream_steps(config)
    for key, value, lengths in _asked_lengths(spec):
        if max(lengths) > steps:
            raise ValueError(f"{key} = {value}: windows of {max(lengths)} steps, longer than the typing stream's {steps} "
                             f"steps (data.task_config.n_documents = {config.n_documents} documents); expected lengths "
                             f"<= {steps} (or more documents)")


@functools.lru_cache(maxsize=4)
def _typing_stream_steps(config: TypingConfig) -> int:
    """The length of the typing stream of `config` (`TypingFrameSource.n_steps`), its documents loaded once."""
    from rcswarm.data.frames.typed_text import load_typing_documents

    return sum(len(document.text) + 1 for document in load_typing_documents(config))


def _check_byte_splits(spec: RunSpec) -> None:
    """ValueError naming the window's key, data.max_bytes and data.val_fraction when a split of the "stdlib" corpus
    (as `ByteWindowSampler` cuts the corpus the worker reads, `_stdlib_corpus`: min(max_bytes, the corpus), the whole
    corpus with max_bytes = 0) is shorter than a window the run asks of it plus one byte: the held-out split its
    held-out windows (run.eval_seq_len, else each run's data.seq_len), the training split every length the run can
    train (`_asked_lengths`). Before, max_bytes = 20000 with val_fraction = 0.001 left a 20-byte held-out split, and
    the worker died at its first evaluation (review, 2026-11-28); the check assumed the corpus holds max_bytes and
    skipped max_bytes = 0, so run.eval_seq_len = 700000 of the ~607 KB held-out split of the whole corpus (or
    data.seq_len = 16384 with val_fraction = 0.001), or max_bytes = 20000000 of the 12 MB corpus, passed and every
    worker died at its first held-out window (fuzz review, 2026-11-29)."""
    data, run = spec.data, spec.run
    corpus_bytes = len(_stdlib_corpus(data.max_bytes or None))  # what the workers' samplers cut; read once, cached
    boundary = split_boundary(corpus_bytes, data.val_fraction)
    if run.eval_seq_len:
        held_out = [("run.eval_seq_len", run.eval_seq_len, [run.eval_seq_len])]
    elif spec.is_sweep:
        held_out = [("sweep.seq_lens", spec.sweep.seq_lens, list(spec.sweep.seq_lens))]
    else:
        held_out = [("data.seq_len", data.seq_len, [data.seq_len])]
    trained = [asked for asked in _asked_lengths(spec) if asked[0] != "run.eval_seq_len"]
    if not data.max_bytes:
        source = f"data.max_bytes = 0 (the whole corpus, {corpus_bytes} bytes)"
    elif data.max_bytes > corpus_bytes:
        source = f"data.max_bytes = {data.max_bytes} (the corpus holds only {corpus_bytes} bytes)"
    else:
        source = f"data.max_bytes = {data.max_bytes}"
    capped = 0 < data.max_bytes < corpus_bytes
    for split, size, asked in (("held-out", corpus_bytes - boundary, held_out), ("training", boundary, trained)):
        for key, value, lengths in asked:
            longest = max(lengths)
            if size >= longest + 1:
                continue
            if split == "held-out":
                fix = "raise data.max_bytes or data.val_fraction" if capped else "raise data.val_fraction"
            else:
                fix = "raise data.max_bytes or lower data.val_fraction" if capped else "lower data.val_fraction"
            raise ValueError(
                f"{key} = {value}: {source} with data.val_fraction = {data.val_fraction} leaves a {split} split "
                f"of {size} bytes, shorter than a window of {longest} positions and its next byte; expected a "
                f"split of at least {longest + 1} bytes ({fix}, or shorten {key})")


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
    if inner.memory_budget_mb > 0:
        _check_memory_budget(spec, cls, model_config)


def _check_memory_budget(spec: RunSpec, cls: type, model_config: Any) -> None:
    """ValueError naming inner.memory_budget_mb when a window the run trains (`RunSpec.training_windows`) needs the
    checkpointing schedule to keep a core state and one does not fit the budget (`budget_failure`). Before, a
    budget of 0.0005 MiB passed and the worker's first step raised "no core state fits the memory budget" after it
    joined (review, 2026-11-29). Models whose state size is not known here (`core_state_bytes`) are not checked."""
    inner = spec.inner
    plan = checkpoint_plan(inner.memory_budget_mb)
    assert plan is not None
    failures = []
    for key, seq_len, batch in spec.training_windows():
        state_bytes = core_state_bytes(cls, model_config, batch)
        if state_bytes is None:
            return
        segments = math.ceil(seq_len / plan.segment_steps_for(inner.bptt_chunk))
        try:
            plan.resolve(segments, state_bytes, 0)
        except MemoryBudgetError as exc:
            failures.append((exc.needed_bytes, f"{key}: windows of {seq_len} steps at batch {batch}", exc))
    if failures:
        _, window, exc = max(failures, key=lambda failure: failure[0])
        raise budget_failure(inner.memory_budget_mb, exc, window)


def core_state_bytes(cls: type, model_config: Any, batch: int) -> int | None:
    """The bytes of one core state at `batch` of the SegmentStepModel class `cls` built from `model_config`: for the
    frame model, (h, c) of each of its n_main_layers LSTMs, each [1, B, n_hidden] float32 (they run in float32 under
    autocast too, `rcswarm.models.lstm_run`); None for a model whose state size is not known here."""
    from rcswarm.models.frame.model import FrameActionModel

    if not issubclass(cls, FrameActionModel):
        return None
    return 2 * model_config.n_main_layers * batch * model_config.n_hidden * FLOAT32_BYTES


def budget_failure(memory_budget_mb: float, exc: MemoryBudgetError, where: str = "") -> ValueError:
    """The ValueError naming inner.memory_budget_mb for a schedule's `exc` (`where`: the window it was for), with the
    least budget it needs when `exc` knows the state's size."""
    needed = exc.needed_bytes
    least = (f"expected inner.memory_budget_mb >= {needed / MIB} ({exc.states} core state(s) of {exc.state_bytes} "
             "bytes)" if needed else "expected a larger inner.memory_budget_mb")
    return ValueError(f"inner.memory_budget_mb = {memory_budget_mb}: {where + ': ' if where else ''}{exc}; {least}")


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
    steps at a time (`window_loss_sum`): the whole window at once would keep activations growing with L where
    its training's are flat. The value is the whole window's up to floating-point summation order. The inputs may
    stay on the host; each chunk is moved to `device`.
    """
    if bptt_chunk > 0 and isinstance(model, StepModel):
        return window_loss_sum(model, TensorWindow(inputs, targets), device, bptt_chunk)
    targets = targets.to(device)  # [B, L]
    scored = int((targets != IGNORE_INDEX).sum())
    if not scored:
        return 0.0, 0
    with torch.no_grad():
        logits = model(inputs.to(device))  # [B, L, V]
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                                reduction="sum")
    return total.item(), scored


def window_loss_sum(
    model: StepModel, window: FrameWindow, device: torch.device, k: int, read_steps: int | None = None,
) -> tuple[float, int]:
    """`loss_sum` of a StepModel on `window` (a FrameWindow: B windows of L steps, read `read_steps` steps at a time, a
    multiple of k, default k, as its streamed training reads them: a lazy window's steps and targets are never held
    whole), run k steps at a time under no_grad; the sum 0.0 where nothing is scored."""
    chunks = _window_chunks(window, k, read_steps or k)
    with torch.no_grad():
        if isinstance(model, SegmentStepModel):
            total, scored = _segment_loss_sum(model, chunks, device)
        else:
            total, scored = _core_loss_sum(model, chunks, device)
    return (total if scored else 0.0), scored


def _window_chunks(window: FrameWindow, k: int, read_steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The window's chunks of k steps in order, (steps [B, <= k, ...], targets [B, <= k]), each read of `read_steps`
    steps (a multiple of k: the chunks stay aligned with the window's) cut into them."""
    for start, stop in chunk_bounds(window.length, read_steps):
        steps, targets = window.chunk(start, stop)  # [B, stop - start, ...], [B, stop - start]
        for a, b in chunk_bounds(stop - start, k):
            yield steps[:, a:b], targets[:, a:b]


def _segment_loss_sum(
    model: SegmentStepModel, chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
) -> tuple[float, int]:
    """(summed loss, scored positions) of a SegmentStepModel over a window's `chunks` (`_window_chunks`): each chunk
    is encoded on its own and the core runs on its embeddings [B, k, D] from the state the chunk before left
    (`core_segment`), so nothing of size O(L) is kept."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    scored = torch.zeros((), dtype=torch.int64, device=device)
    state = None
    for steps, targets in chunks:  # [B, k, ...], [B, k]
        targets = targets.to(device)
        embeddings = model.encode(steps.to(device))  # [B, k, D]
        chunk_sum, _, state = model.core_segment(embeddings, targets, state)  # state: the core's after the chunk
        total += chunk_sum.double()
        scored += (targets != IGNORE_INDEX).sum()
    return total.item(), int(scored)


def _core_loss_sum(
    model: StepModel, chunks: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
) -> tuple[float, int]:
    """(summed loss, scored positions) of a plain StepModel over a window's `chunks` (`_window_chunks`): encoded a
    chunk at a time, its core over the whole window's embeddings [B, L, D] (as the paged training keeps them) and its
    `core_loss`, the mean over the scored positions."""
    embeddings, targets = [], []
    for steps, chunk_targets in chunks:  # [B, k, ...], [B, k]
        embeddings.append(model.encode(steps.to(device)))  # [B, k, D]
        targets.append(chunk_targets.to(device))
    whole = torch.cat(targets, dim=1)  # [B, L]
    scored = int((whole != IGNORE_INDEX).sum())
    if not scored:
        return 0.0, 0
    return model.core_loss(torch.cat(embeddings, dim=1), whole).item() * scored, scored


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
            try:
                loss_value, stats = checkpointed_step(model, optimizer, sampler, grad_clip, bptt_chunk, plan)
            except MemoryBudgetError as exc:
                raise budget_failure(memory_budget_mb, exc) from None
        return StepResult(loss_value, stats.scored, time.perf_counter() - started, stats.schedule)
    inputs, targets = sampler.next_batch()  # [B, T, ...], [B, T]
    targets = targets.to(device)
    if bptt_chunk <= 0:
        inputs = inputs.to(device)
    with autocast(device, precision):
        loss_value = train_step(model, optimizer, inputs, targets, grad_clip, bptt_chunk)
    scored = int((targets != IGNORE_INDEX).sum())
    return StepResult(loss=loss_value, tokens=scored, seconds=time.perf_counter() - started)
