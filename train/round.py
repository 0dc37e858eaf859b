"""What one round trains: the local trainer every backend shares (`RoundTrainer`).

A worker's round, whatever carries θ between workers: start from θ_v (`snapshot` keeps the
base), switch the data stream to the round's (sequence length, batch) when it differs
(`follow`), run the round's inner steps (`train`: `steps` of them, or with a time budget > 0
until the budget is used, finishing the current step), and hand the backend
Δ = θ_v − θ_local (`delta`). The trainer owns the model on its device, the inner optimizer,
the data stream, the run-long step count and the compute seconds, and produces one `StepRow`
per inner step; the backends keep what is theirs: the coordinator backend (worker/worker.py)
pulls θ_v and pushes Δ over the wire, the hivemind backend (worker/hivemind_worker.py)
averages Δ peer to peer and applies the outer step, and each stamps its own sync time and
bytes on the rows it reports. A Δ with a NaN or an infinity is the local training's divergence (`check_finite`
raises `Diverged` before it leaves the worker); each backend drops such a round, starts the inner optimizer afresh
(`reset_optimizer`) and ends after MAX_DIVERGED_ROUNDS in a row. `held_out_loss` is the launcher's evaluation (cli/run.py) and the worker's
held-out loss along the way (`[run] eval_every`, issue #30): the first batches of one fixed stream of the
held-out split (HELD_OUT_SEED), drawn once and kept, or with `[run] eval_set = "rotating"` the stream of the
version measured (`held_out_seed`), in windows of `[run] eval_seq_len` (else data.seq_len).

Single-threaded: one training thread calls every method; a backend's other threads (the
heartbeat, Ray's `info`) only read `step`.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rcswarm.config.runspec import EVAL_SETS, DataSection, RunSpec
from rcswarm.data.frames.window import FrameWindow
from rcswarm.models import registry
from rcswarm.models.protocols import StepModel
from rcswarm.train.bptt.checkpointed import CheckpointPlan
from rcswarm.train.inner import (
    StepResult,
    inner_step,
    loss_sum,
    make_inner_optimizer,
    make_sampler,
    window_loss_sum,
)

# The stream of the held-out split every held-out loss is measured on: its first batches are the fixed held-out set.
HELD_OUT_SEED = 12345
# Rounds in a row whose Δ was not finite before a worker of either backend ends (lower inner.lr or check the data).
MAX_DIVERGED_ROUNDS = 3


class Diverged(RuntimeError):
    """A round's Δ holds non-finite values: the local training diverged (`check_finite`)."""

    def __init__(self, version: int, problem: str) -> None:
        super().__init__(f"the update of version {version} is not finite: {problem}")
        self.version = version


def check_finite(version: int, deltas: Mapping[str, torch.Tensor]) -> None:
    """Raise Diverged naming the first tensor of Δ (the update of `version`) that holds a NaN or an infinity, and how
    many of its values do."""
    for name, delta in deltas.items():
        finite = torch.isfinite(delta)
        if not bool(finite.all()):
            raise Diverged(version, f"{name!r} has {delta.numel() - int(finite.sum())} non-finite values of {delta.numel()}")


def held_out_seed(eval_set: str, version: int) -> int:
    """The held-out stream θ_v is measured on along the way: HELD_OUT_SEED's (the fixed set) for `[run] eval_set =
    "fixed"`, else version v's own, HELD_OUT_SEED + 1 + v (the same for every worker that measures θ_v, never the
    fixed set's)."""
    assert eval_set in EVAL_SETS and version >= 0, (eval_set, version)
    return HELD_OUT_SEED if eval_set == "fixed" else HELD_OUT_SEED + 1 + version


def resolve_device(name: str) -> torch.device:
    """The torch device of `--device NAME`: "auto" is CUDA when present, else the CPU; ValueError for a name that
    is not auto, cpu, cuda or cuda:N (torch's other types, such as mps or meta, on which rcswarm does not train: the
    rule of worker/options.py's `device_problem`, which a launcher without torch applies) or CUDA missing."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda") or name != name.strip():
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r}: CUDA is not available on this machine")
    return device


@dataclass(frozen=True)
class StepRow:
    """One metric row: a training step (loss, scored tokens) or a mark such as a pull (loss NaN, 0 tokens).

    `step` is the trainer's run-long step count, `wall_time` seconds since the trainer started,
    `compute_seconds` the inner steps' seconds so far; the backend adds its sync seconds and bytes.
    """

    version: int
    step: int
    loss: float
    tokens: int
    seq_len: int
    batch: int
    wall_time: float
    compute_seconds: float


@dataclass(frozen=True)
class RoundResult:
    """The inner steps of one round: their scored tokens, their count, their rows, and whether a stop cut it short."""

    tokens: int
    steps: int
    rows: tuple[StepRow, ...]
    stopped: bool


class RoundTrainer:
    """A worker's local trainer: the run's model on `device`, its inner optimizer, the data stream, the counters.

    `build` makes the model and optimizer of a run (again for a new run; the step count and the
    compute seconds go on), `follow` chooses the data stream, `train` runs one round's inner steps.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = time.perf_counter()
        self.step = 0
        self.compute_seconds = 0.0
        self.schedule = ""  # the core checkpointing schedule of the latest step ("" without it)
        self.spec: RunSpec | None = None
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.data: DataSection | None = None
        self.sampler = None
        self._held_out: tuple[int, list] | None = None  # (batches, `_draw_held_out`'s list) of the held-out set

    def build(self, spec: RunSpec, model_seed: int | None = None) -> nn.Module:
        """The run's model on the device (initialized from `model_seed`, else the global RNG) and its inner
        optimizer; the data stream waits for `follow`."""
        model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides, seed=model_seed)
        self.spec, self.model = spec, model.to(self.device)
        self.optimizer = make_inner_optimizer(self.model, spec.inner)
        self.data = self.sampler = self._held_out = None
        return self.model

    def reset_optimizer(self) -> None:
        """A fresh inner optimizer for the model: its moments and step counts dropped (after a diverged round they
        hold non-finite values)."""
        self.optimizer = make_inner_optimizer(self.model, self.spec.inner)

    def follow(self, seq_len: int, batch: int, seed: int) -> bool:
        """Train on windows of `seq_len` × `batch` from now on: a fresh stream of the run's data from `seed`
        when they differ from the current ones (or there is no stream yet). Whether it switched."""
        if self.data is not None and (seq_len, batch) == (self.data.seq_len, self.data.batch_size):
            return False
        self.data = dataclasses.replace(self.spec.data, seq_len=seq_len, batch_size=batch)
        self.sampler = make_sampler(self.data, seed, model_config=self.model.config)
        return True

    def inner_step(self) -> StepResult:
        """One inner step on the stream's next batch, as `[inner]` says (streaming BPTT, core checkpointing, precision)."""
        inner = self.spec.inner
        return inner_step(self.model, self.optimizer, self.sampler, inner.grad_clip, self.device, inner.bptt_chunk,
                          inner.memory_budget_mb, inner.precision)

    def row(self, version: int, loss: float, tokens: int) -> StepRow:
        """A metric row stamped now: the current step, window, wall time and compute seconds."""
        return StepRow(version, self.step, loss, tokens, self.data.seq_len, self.data.batch_size,
                       time.perf_counter() - self.started, self.compute_seconds)

    def train(
        self, version: int, steps: int, *, budget_s: float = 0.0, stop: threading.Event | None = None,
        step: Callable[[], StepResult] | None = None, on_schedule: Callable[[str], None] | None = None,
    ) -> RoundResult:
        """The inner steps of the round from `version`: `steps` of them or, with `budget_s` > 0, until `budget_s`
        seconds have passed since the first began (the current step finishes): at least one, at most `steps`.

        A set `stop` ends the round before its next step (`stopped`). `step` runs one inner step (default
        `inner_step`; a backend may pace it); its seconds count as compute. `on_schedule` hears each change of
        the core checkpointing schedule.
        """
        step = step or self.inner_step
        started = time.perf_counter()
        rows: list[StepRow] = []
        tokens, stopped = 0, False
        while len(rows) < steps:
            if stop is not None and stop.is_set():
                stopped = True
                break
            if budget_s > 0 and rows and time.perf_counter() - started >= budget_s:
                break
            step_started = time.perf_counter()
            result = step()
            if result.schedule != self.schedule:
                self.schedule = result.schedule
                if on_schedule is not None:
                    on_schedule(result.schedule)
            self.step += 1
            tokens += result.tokens
            self.compute_seconds += time.perf_counter() - step_started
            rows.append(self.row(version, result.loss, result.tokens))
        return RoundResult(tokens, len(rows), tuple(rows), stopped)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """θ by parameter name, copied to the CPU: a round's base θ_v."""
        return {name: p.detach().to("cpu", copy=True) for name, p in self.model.named_parameters()}

    def delta(self, base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Δ = θ_v − θ_local by parameter name, on the CPU (`base` is θ_v, as `snapshot` returned it)."""
        return {name: base[name] - p.detach().cpu() for name, p in self.model.named_parameters()}

    def rebase(self, new_base: Mapping[str, torch.Tensor], old_base: Mapping[str, torch.Tensor]) -> None:
        """Keep the progress made since `old_base` on top of `new_base`: θ ← new_base + (θ − old_base), per parameter
        in its dtype (the overlapped round's merge, `[sync] overlap`; docs/ARCHITECTURE.md "Overlapped rounds")."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                local = p.detach().cpu()
                p.copy_(new_base[name].to(local.dtype) + (local - old_base[name]))

    def load(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy the named tensors into the model's parameters (in place, on its device)."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in tensors.items():
                params[name].copy_(tensor)

    def held_out_loss(self, batches: int, seed: int = HELD_OUT_SEED,
                      params: Mapping[str, torch.Tensor] | None = None) -> float:
        """Mean cross-entropy per scored position (batches that score more positions weigh more) of the model (at
        `params`, θ by name, when given; its own parameters are put back after) on the first `batches` batches of the
        run's held-out split (stream `seed`) in windows of `[run] eval_seq_len` (0: data.seq_len), data.batch_size
        each, in eval mode (no dropout; the model's mode is put back after); the batches of the default stream are
        drawn once and kept. A model trained with streaming BPTT (`[inner] bptt_chunk` > 0) is evaluated bptt_chunk
        steps at a time, carrying its core's state (`window_loss_sum`): memory flat in the window length, as its
        training's (where training reads its windows lazily, so do these: `_draw_held_out`)."""
        if seed == HELD_OUT_SEED and self._held_out is not None and self._held_out[0] >= batches:
            held_out = self._held_out[1][:batches]
        else:
            held_out = self._draw_held_out(batches, seed)
            if seed == HELD_OUT_SEED:
                self._held_out = (batches, held_out)
        own = self.snapshot() if params is not None else None
        if params is not None:
            self.load(params)
        total, scored, training = 0.0, 0, self.model.training
        self.model.eval()  # no dropout: every worker's report of θ_v is the same number (the store takes their median)
        try:
            for batch in held_out:
                batch_sum, positions = self._batch_loss_sum(batch)
                total += batch_sum
                scored += positions
        finally:
            self.model.train(training)
            if own is not None:
                self.load(own)
        return total / scored if scored else math.nan

    def _reads_lazily(self) -> bool:
        """Whether training reads its windows lazily, a segment at a time (`checkpointed_step`: bptt_chunk > 0 and
        memory_budget_mb > 0 of a StepModel), and so the held-out loss may read its windows as it does."""
        inner = self.spec.inner
        return inner.bptt_chunk > 0 and inner.memory_budget_mb > 0 and isinstance(self.model, StepModel)

    def _draw_held_out(self, batches: int, seed: int) -> list:
        """The first `batches` batches of the held-out stream `seed` (windows of run.eval_seq_len, else data.seq_len):
        lazy `FrameWindow`s (their offsets) where the sampler has `next_window()` and training reads its windows
        lazily (`_reads_lazily`), read a segment at a time when measured (`_batch_loss_sum`); else (inputs [B, T, ...],
        targets [B, T]) pairs, as training's paged or plain steps materialize them. The same windows either way
        (`next_batch()` is `next_window()` read whole). Before, the frames were kept: [1, L, 8, 16, 2] int64, 16 MiB
        at L = 16000 of the tiny preset, and the held-out loss's memory grew with L (review, 2026-11-29)."""
        data = self.spec.data
        if self.spec.run.eval_seq_len:
            data = dataclasses.replace(data, seq_len=self.spec.run.eval_seq_len)
        sampler = make_sampler(data, seed=seed, split="val", model_config=self.model.config)
        if self._reads_lazily() and hasattr(sampler, "next_window"):
            return [sampler.next_window() for _ in range(batches)]
        return [sampler.next_batch() for _ in range(batches)]

    def _batch_loss_sum(self, batch: tuple[torch.Tensor, torch.Tensor] | FrameWindow) -> tuple[float, int]:
        """(summed loss, scored positions) of the model on one held-out batch of `_draw_held_out`: a lazy window read a
        core segment at a time (`CheckpointPlan.segment_steps_for`), as its training reads it."""
        k = self.spec.inner.bptt_chunk
        if isinstance(batch, tuple):  # inputs [B, T, ...], targets [B, T]
            return loss_sum(self.model, *batch, self.device, k)
        return window_loss_sum(self.model, batch, self.device, k, CheckpointPlan().segment_steps_for(k))
