"""The run spec: what a run trains and how it synchronizes, shared by coordinator and workers.

A run is described by a TOML file (RUN.toml) whose tables map onto the dataclasses below.
The coordinator reads it, validates it, and hands it to every worker in JoinResponse as
JSON; the worker validates it again with the same code. Every dataclass validates itself:
an unknown key or a bad value raises ValueError naming the key (as `table.key`) and value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

# The longest name a run has (run.name, a sweep's <name>-L<length> included) and the longest run id: the name, "-" and
# 8 hex digits (coordinator/resume.py); a Join naming a longer refused run is refused (coordinator/sweep.py).
MAX_RUN_NAME_CHARS = 128
MAX_RUN_ID_CHARS = MAX_RUN_NAME_CHARS + 9
CODECS = ("fp32", "bf16", "int8", "sparse", "lowbit")
# What each sync backend's wire can carry: hivemind's all-reduce averages dense parts in its reducers, where
# a sparse update's entries would be summed into a dense part and cut again without error feedback.
BACKEND_CODECS = {"coordinator": CODECS, "hivemind": ("fp32", "bf16", "int8", "lowbit")}
INNER_OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("fp32", "bf16")
DATA_SOURCES = ("stdlib", "diag", "typing", "git")
CURRICULUM_POLICIES = ("fixed", "adaptive")
# The [curriculum] keys of the adaptive policy's law and budget, refused at other than their defaults under "fixed".
ADAPTIVE_ONLY = ("law_from", "alpha_inf", "tau", "amplitude", "budget_seconds")
AGGREGATIONS = ("mean", "clipped_mean", "trimmed_mean", "centered_clip")
SYNC_BACKENDS = ("coordinator", "hivemind")
ROUND_KINDS = ("steps", "time")
# The most versions a late update may lag behind (sync.max_staleness).
MAX_STALENESS_LIMIT = 16
MAX_RUN_MINUTES = 1e7  # [run] minutes: about 19 years, past any run (and its rounds' horizon fits SQLite)
MAX_EVAL_BATCHES = 64  # [run] eval_batches: a small held-out set, a few batches
EVAL_SETS = ("fixed", "rotating")  # [run] eval_set
# The sparse codec lags the dense codecs in its first rounds (error feedback delivers late what top-k leaves out) and
# then catches up (issue #28; docs/PERFORMANCE.md "Compression": lstm_lm small, 2 workers, plain averaging, density
# 0.02, 2-bit values, error_decay 0.95). SPARSE_CATCH_UP_ROUNDS: (H, the rounds after which it was within 0.5 % of
# int8 at inner.steps ≤ H): H = 10 by round 60 (the 1,500-step runs' curves), H = 50 after 120 rounds (6,000 steps,
# SPARSE_CAUGHT_UP_OVER_INT8, seeds 0 and 1). Above the last H only 10 rounds of H = 200 were run. The frame model
# (tiny, typing) took longer: behind int8 at round 400 of H = 10, ahead from 480 (SPARSE_FRAME_AHEAD_ROUND), 69 %
# below it at 800 (one seed). `RunSpec.cautions`
# names the lag of a run with fewer rounds: SPARSE_PENALTY_BY_ROUNDS, (rounds, H, held-out over fp32) of the
# 1,500-step runs (H = 200: 2,000 steps, over int8, the only dense codec run there with plain averaging).
SPARSE_CATCH_UP_ROUNDS = ((10, 60), (50, 120))
# With more than SPARSE_MATCHED_WORKERS workers at H above the first entry's: 4 workers at H = 50 (1-bit values, the
# step at d 0.04) were +0.60 % and +0.72 % over int8 after 120 rounds and +0.02 % after SPARSE_CROWD_CATCH_UP_ROUNDS.
SPARSE_CROWD_CATCH_UP_ROUNDS = 240
SPARSE_CAUGHT_UP_OVER_INT8 = (0.0024, 0.0047)
SPARSE_FRAME_AHEAD_ROUND = 480
SPARSE_PENALTY_BY_ROUNDS = ((10, 200, 0.31), (30, 50, 0.073), (50, 30, 0.036), (75, 20, 0.020))
# ... and with 2 workers: with 4 at H = 10 it lost SPARSE_PENALTY_4_WORKERS over int8 (seeds 0 and 1; the step of N
# workers holds up to N × density of each chunk; the downlink sends density of it). A downlink at run.workers ×
# density (sync.downlink_density = 0.08) ended at SPARSE_DENSE_DOWNLINK_OVER_INT8, the step
# SPARSE_DENSE_DOWNLINK_RATIO× below fp32 instead of SPARSE_DEFAULT_RATIO× (with the Elias–Fano offsets, sync/codec.py).
SPARSE_MATCHED_WORKERS = 2
SPARSE_PENALTY_4_WORKERS = (0.021, 0.012)
SPARSE_DENSE_DOWNLINK_OVER_INT8 = (0.0004, -0.0067)
SPARSE_DENSE_DOWNLINK_RATIO = 51
SPARSE_DEFAULT_RATIO = 154  # density 0.02, 2-bit values, chunks of 4096
# ... or, ≥ 100× below fp32 both ways, 1-bit values with the step at SPARSE_ONE_BIT_DOWNLINK: SPARSE_ONE_BIT_OVER_INT8
# with 4 workers (seeds 0, 1 and 2, H = 10; the uplink 170×, the downlink 100× below fp32).
SPARSE_ONE_BIT_DOWNLINK = 0.04
SPARSE_ONE_BIT_OVER_INT8 = (0.0055, -0.0045, -0.0032)
SPARSE_ONE_BIT_MAX_WORKERS = 4


# The most characters of a value a refusal quotes: a 10^5-character run.name or data.source was echoed whole.
MAX_SHOWN_CHARS = 200


def _cut(text: str, size: int) -> str:
    """`text` cut to MAX_SHOWN_CHARS characters, followed by "… (`size` characters)" when longer."""
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS]}… ({size:,} characters)"


def shown(value: Any) -> str:
    """`repr(value)` for a message, cut to MAX_SHOWN_CHARS characters (and the value's length said) when longer."""
    text = repr(value)
    return _cut(text, len(value) if isinstance(value, str) else len(text))


def _fail(key: str, value: Any, expected: str) -> None:
    raise ValueError(f"{_cut(key, len(key))} = {shown(value)} is invalid: expected {expected}")


# The most levels of arrays and tables a run config may nest (a free-form table's values: [model.overrides],
# [data.task_config]): ~900 levels ended in a RecursionError (a traceback from `rcswarm run`, a bare message naming no
# file from `rcswarm coordinator`), and 400 were taken, then to_toml() failed. No model or task config nests more than
# a few.
MAX_TABLE_DEPTH = 32
NESTED_TOO_DEEPLY = f"is nested too deeply: expected arrays and tables nested at most {MAX_TABLE_DEPTH} levels deep"
# The largest value of an int32 protobuf field.
INT32_MAX = 2**31 - 1
# Every integer key fits a 64-bit signed integer (SQLite INTEGER, protobuf int64): a larger one was accepted and then
# overflowed where the coordinator stored or sent it.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The longest duration a seconds key may give (MAX_RUN_MINUTES in seconds, about 19 years): waits and deadlines past
# about 9e9 s overflow the platform's time_t (threading's waits raise OverflowError).
MAX_SECONDS = MAX_RUN_MINUTES * 60
# The largest multiple of measured times hivemind.timeout_factor may set (a timeout it makes stays a waitable one).
MAX_TIMEOUT_FACTOR = 1000.0
# The kinds of coordinator calls [coordinator] max_calls and max_calls_per_peer bound (coordinator/guards.RPC_KINDS).
CALL_KINDS = ("membership", "query", "long_poll", "pull", "push")


# The largest learning rate, inner (AdamW's) or outer (on averaged deltas): an outer lr of 1e300 overflowed θ and
# every round close failed; an inner one above float32's range killed the worker thread in AdamW; 1 is plain
# averaging, DiLoCo's outer lr is 0.7 and an AdamW lr above 1 already diverges.
MAX_LR = 10.0
# The smallest learning rate, inner or outer: 5e-324 (and every rate below about 1e-9) was accepted and trained
# nothing, since float32 θ + lr·step rounds back to θ once lr·|step| < |θ|·2^-24 (AdamW's step is about lr per
# coordinate): below MIN_LR no coordinate of |θ| >= 2e-3 moves (the shipped inits are normal(0, 0.02) and larger).
MIN_LR = 1e-10
# The smallest sync.centered_clip_tau (a multiple of the reference norm R) and sync.max_update_norm other than 0 (an
# L2 norm): 5e-324 was accepted. Each iteration of centered clipping moves the aggregate by at most τ R towards a
# worker, so below 1e-3 even the most iterations (100) move it less than 0.1 R from where it started (the previous
# round's aggregate) and the workers' updates are all but ignored; an update norm bound below 1e-6 refuses every
# update that changes θ, however small the model and lr.
MIN_CENTERED_CLIP_TAU = 1e-3
MIN_UPDATE_NORM = 1e-6
# The most inner steps H of a round (sync.max_steps: 10× it): 2**31 - 1 steps passed, overflowed the assignment's
# int32 and every Join failed; H = 500 is DiLoCo's, and the automatic norm and token bounds grow with H.
MAX_INNER_STEPS = 100_000
# The smallest held-out share of the text corpus: 5e-324 left the "val" split 0 bytes and the held-out evaluation
# ended the worker.
MIN_VAL_FRACTION = 0.001
# The most workers one run admits, and calls of one kind a coordinator runs at once: both size its RPC thread pool
# (every kind at its limit plus a reserve of max_workers per kind), so 2**63 - 1 made the pool unbounded.
MAX_WORKERS = 4096
MAX_CALLS = 4096


def _check_at_most(obj: Any, table: str, name: str, high: float) -> None:
    value = getattr(obj, name)
    if value > high:
        _fail(f"{table}.{name}", value, f"at most {high:,g}")


def _check_lr(obj: Any, table: str) -> None:
    """`table`.lr is a learning rate in [MIN_LR, MAX_LR]."""
    _check_positive(obj, table, "lr")
    _check_at_most(obj, table, "lr", MAX_LR)
    if obj.lr < MIN_LR:
        _fail(f"{table}.lr", obj.lr, f"at least {MIN_LR:g} (MIN_LR: below it a step rounds away in float32 θ, and "
                                     "nothing trains)")


def _check_positive(obj: Any, table: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            _fail(f"{table}.{name}", value, "a positive number")


# The shortest a seconds key may be where a shorter one breaks the run rather than tuning it (a review of finite
# values the spec took, 2026-11-28; each measured with 5e-324 s or the value named):
MIN_SECONDS = {
    # heartbeats come every lease/3, at least 0.2 s apart: a shorter lease evicted every worker at every tick
    # (47 joins and 93 evictions in 10 s)
    "coordinator.lease_s": 0.5,
    # the worker's await loop does not sleep between long polls: 125 AwaitVersion calls where 7 did
    "coordinator.max_wait_s": 0.1,
    # a parameter stream idle this long is cancelled: every pull ended DEADLINE_EXCEEDED at once, forever
    "coordinator.stream_idle_s": 1.0,
    # the ticker runs every 0.2 s: health reported NOT_SERVING at every probe, and Kubernetes restarts such a pod
    "coordinator.health_stall_s": 1.0,
    # the averager's declare loop spun (6,800 DHT stores in 5 s) and records expired before anyone read them
    "hivemind.state_declare_s": 0.1,
    "hivemind.record_ttl_s": 1.0,
    "hivemind.min_allreduce_s": 0.5,
    "hivemind.request_timeout_s": 0.1,
}


def _check_seconds(obj: Any, table: str, *names: str, positive: bool = True) -> None:
    """Each of `names` is a duration in seconds: finite, at most MAX_SECONDS, and > 0 (`positive`) or >= 0, or at
    least its MIN_SECONDS."""
    for name in names:
        value = getattr(obj, name)
        floor = MIN_SECONDS.get(f"{table}.{name}")
        low = value >= floor if floor is not None else value > 0 if positive else value >= 0
        if not (math.isfinite(value) and low and value <= MAX_SECONDS):
            least = f">= {floor:g}" if floor is not None else "> 0" if positive else ">= 0"
            _fail(f"{table}.{name}", value, f"a number of seconds {least} and at most {MAX_SECONDS:g}")


# Set while a spec written earlier is read back (`RunSpec.from_json`: a state dir's stored spec, the spec a
# coordinator hands its workers): `_refuse_unused` then takes an inert key at its default instead of refusing it.
_READING_BACK: ContextVar[bool] = ContextVar("rcswarm_reading_back_spec", default=False)


@contextmanager
def _reading_back() -> Iterator[None]:
    token = _READING_BACK.set(True)
    try:
        yield
    finally:
        _READING_BACK.reset(token)


def _refuse_unused(section: Any, table: str, names: tuple[str, ...], when: str, why: str) -> None:
    """Refuse each key of `names` in [`table`] (the dataclass `section`) that is set off its default where the caller
    found it has no effect: taken and ignored, such a key misled whoever set it into thinking it steered the run.
    `when` names the setting that makes it inert (`unless sync.codec = "sparse"`), `why` says why it does nothing;
    the refusal reads `table.key = value is invalid: expected the default (D) <when> (<why>)`. The rules of keys
    that do nothing go through here: ADAPTIVE_ONLY's, the [hivemind] table's, SyncSection's, [sweep]'s and
    outer.nesterov's. A spec read back (`RunSpec.from_json`), written by an rcswarm before a rule or by a peer of
    another version, takes such a key at its default instead: it did nothing there either, so its run reads the
    same, resumes, and compares equal to a config that dropped the key."""
    fields = {f.name: f for f in dataclasses.fields(section)}
    for name in names:
        spec_field = fields[name]
        default = spec_field.default if spec_field.default is not dataclasses.MISSING else spec_field.default_factory()
        value = getattr(section, name)
        if value != default and _READING_BACK.get():
            object.__setattr__(section, name, default)
        elif value != default:
            _fail(f"{table}.{name}", value, f"the default ({default!r}) {when} ({why})")


@dataclass(frozen=True)
class RunSection:
    """Identity and length of the run."""

    name: str = "demo"
    seed: int = 0
    # Outer rounds to train; 0 = until stopped.
    rounds: int = 40
    # Worker processes `rcswarm run` starts on this machine.
    workers: int = 2
    # A wall-time budget in minutes from the run's first round (issue #30; 0 = none): the coordinator ends the run when
    # it is used (as run.rounds does), forecasts the loss at its end and prunes at fractions of it. `rcswarm run
    # --minutes` sets it.
    minutes: float = 0.0
    # A loss whose wall time the forecasts predict (issue #30; 0 = none).
    target_loss: float = 0.0
    # Held-out loss along the way (issue #30): every `eval_every` versions (0 = off) each worker measures the
    # θ_v it pulled on `eval_batches` batches of the held-out split and reports it.
    eval_every: int = 0
    eval_batches: int = 2
    # Which batches (EVAL_SETS): "fixed", the split's first `eval_batches` batches at every version (smooth curves;
    # but a set this small reads off the split's loss by its own sampling error, an offset no forecast can know), or
    # "rotating", version v's own batches (every worker measuring θ_v draws the same ones), so that error is
    # independent from one point to the next and a fit of the curve averages it out.
    eval_set: str = "fixed"
    # The window length of that held-out set and of the launcher's final evaluation (0 = data.seq_len): one value
    # across runs at different lengths (a sweep, a curriculum) puts every held-out curve on the same windows.
    eval_seq_len: int = 0

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            _fail("run.name", self.name, "a non-empty name of letters, digits, '-', '_' or '.'")
        if len(self.name) > MAX_RUN_NAME_CHARS:
            _fail("run.name", self.name, f"at most {MAX_RUN_NAME_CHARS} characters (it has {len(self.name)})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            _fail("run.seed", self.seed, f"an integer between 0 and {2**63 - 1}")
        if self.rounds < 0:
            _fail("run.rounds", self.rounds, "an integer >= 0 (0 = until stopped)")
        if not 1 <= self.workers <= 64:
            _fail("run.workers", self.workers, "an integer between 1 and 64")
        if isinstance(self.minutes, bool) or not (isinstance(self.minutes, (int, float)) and math.isfinite(self.minutes)
                                                  and 0 <= self.minutes <= MAX_RUN_MINUTES):
            _fail("run.minutes", self.minutes, f"a number of minutes between 0 and {MAX_RUN_MINUTES:g} (0 = none)")
        if not (math.isfinite(self.target_loss) and self.target_loss >= 0):
            _fail("run.target_loss", self.target_loss, "a finite loss >= 0 (0 = none)")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 0:
            _fail("run.eval_every", self.eval_every, "an integer number of versions >= 0 (0 = off)")
        if (isinstance(self.eval_batches, bool) or not isinstance(self.eval_batches, int)
                or not 1 <= self.eval_batches <= MAX_EVAL_BATCHES):
            _fail("run.eval_batches", self.eval_batches, f"an integer between 1 and {MAX_EVAL_BATCHES}")
        if self.eval_set not in EVAL_SETS:
            _fail("run.eval_set", self.eval_set, f"one of {', '.join(map(repr, EVAL_SETS))}")
        if isinstance(self.eval_seq_len, bool) or not isinstance(self.eval_seq_len, int) or self.eval_seq_len < 0:
            _fail("run.eval_seq_len", self.eval_seq_len, "an integer window length >= 0 (0 = data.seq_len)")


@dataclass(frozen=True)
class ModelSection:
    """Which registered model, which preset, which overrides of its config."""

    name: str = "lstm_lm"
    preset: str = "small"
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            _fail("model.name", self.name, "a registered model name")
        if not self.preset:
            _fail("model.preset", self.preset, "a preset name of the model")


@dataclass(frozen=True)
class DataSection:
    """Training data: the source and the window shape each inner step trains on.

    source "stdlib": byte windows of the standard library's .py files (seq_len, max_bytes,
    val_fraction apply). source "diag": a diagnostic task of rcswarm.data.diagnostics named
    by `task`, configured by the [data.task_config] table (the task sets its own lengths).
    source "typing": windows of seq_len frames of the fully observable typing task for the
    frame model (rcswarm.data.frames); [data.task_config] sets TypingConfig fields, and the
    frame geometry comes from the model's config. source "git": windows of a dataset built by
    `rcswarm data frames` from a repository's history; [data.task_config] dataset = "DIR", and
    the model's rows, cols, n_styles and action_vocab must fit the dataset.
    """

    source: str = "stdlib"
    task: str = ""
    task_config: dict[str, Any] = field(default_factory=dict)
    seq_len: int = 256
    batch_size: int = 8
    # Bytes of the corpus to use; 0 = all of it.
    max_bytes: int = 0
    val_fraction: float = 0.05

    def __post_init__(self) -> None:
        if self.source not in DATA_SOURCES:
            _fail("data.source", self.source, f"one of {DATA_SOURCES}")
        if (self.source == "diag") != bool(self.task):
            _fail("data.task", self.task, 'a task name with source = "diag", and none otherwise')
        if self.source == "git":
            self._check_git_task_config()
        if self.source == "stdlib" and self.task_config:
            _fail("data.task_config", self.task_config, 'no keys with source = "stdlib" (it has no task to configure)')
        _check_positive(self, "data", "seq_len", "batch_size")
        if self.max_bytes < 0:
            _fail("data.max_bytes", self.max_bytes, "an integer >= 0 (0 = all)")
        if not MIN_VAL_FRACTION <= self.val_fraction < 0.5:
            _fail("data.val_fraction", self.val_fraction, f"a number in [{MIN_VAL_FRACTION:g}, 0.5)")

    def _check_git_task_config(self) -> None:
        """source "git" reads one key, [data.task_config] dataset: a non-empty path (checked here, where the
        coordinator refuses the config; whether it holds a dataset is checked where a worker opens it)."""
        if not isinstance(self.task_config, dict):
            _fail("data.task_config", self.task_config, 'a table with dataset = "DIR" with source = "git"')
        dataset = self.task_config.get("dataset")
        if not isinstance(dataset, str) or not dataset.strip():
            _fail("data.task_config.dataset", dataset,
                  'the path of a dataset made by `rcswarm data frames` (a non-empty string) with source = "git"')
        unknown = sorted(set(self.task_config) - {"dataset"})
        if unknown:
            _fail("data.task_config", self.task_config, f'only the key "dataset" with source = "git" (not {unknown})')


@dataclass(frozen=True)
class InnerSection:
    """The worker's local optimizer and the number H of inner steps between syncs."""

    optimizer: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    steps: int = 25
    # Streaming BPTT for models with a per-step encoder (the frame model): the encoder is
    # recomputed this many steps at a time. 0 = plain autograd over the whole window.
    bptt_chunk: int = 0
    # Core checkpointing (issue #19) with bptt_chunk > 0: MiB for the core states and frame
    # embeddings kept across a window; the worker picks the schedule (every state, else
    # binomial) and spills embeddings to disk beyond it. 0 = page the core's saved tensors.
    memory_budget_mb: float = 0.0
    # "bf16": the inner steps' forward and backward run under torch.autocast(bfloat16) on the
    # worker's device (CUDA, or the CPU); parameters, gradients and the optimizer stay float32.
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            _fail("inner.precision", self.precision, f"one of {PRECISIONS}")
        if self.optimizer not in INNER_OPTIMIZERS:
            _fail("inner.optimizer", self.optimizer, f"one of {INNER_OPTIMIZERS}")
        _check_lr(self, "inner")
        _check_positive(self, "inner", "steps")
        _check_at_most(self, "inner", "steps", MAX_INNER_STEPS)
        # AdamW's decoupled decay multiplies θ by 1 − lr·wd each step (SGD's adds lr·wd·θ to the step: the same
        # factor): at lr·wd >= 1 it flips or zeroes θ, and 1e300 blew θ up while the worker blamed inner.lr.
        if not (self.weight_decay >= 0 and self.lr * self.weight_decay < 1):
            _fail("inner.weight_decay", self.weight_decay,
                  f"a number >= 0 with inner.lr × inner.weight_decay < 1 (inner.lr = {self.lr:g}: below "
                  f"{1 / self.lr:g}; each step multiplies θ by 1 − inner.lr × inner.weight_decay, which must stay in "
                  "(0, 1])")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                _fail(f"inner.{name}", getattr(self, name), "a number in [0, 1)")
        if self.grad_clip < 0:
            _fail("inner.grad_clip", self.grad_clip, "a number >= 0 (0 = no clipping)")
        if self.bptt_chunk < 0:
            _fail("inner.bptt_chunk", self.bptt_chunk, "an integer >= 0 (0 = plain autograd)")
        if not (math.isfinite(self.memory_budget_mb) and self.memory_budget_mb >= 0):
            _fail("inner.memory_budget_mb", self.memory_budget_mb, "a finite number >= 0 (0 = no core checkpointing)")
        if self.memory_budget_mb > 0 and self.bptt_chunk == 0:
            _fail("inner.memory_budget_mb", self.memory_budget_mb, "0 unless inner.bptt_chunk > 0 (core checkpointing is part of streaming BPTT)")


@dataclass(frozen=True)
class OuterSection:
    """The outer optimizer on averaged deltas: SGD, with (Nesterov) momentum when `momentum` > 0.

    The default is plain averaging (lr 1, no momentum), chosen from the outer-step grid of issue #28
    (benchmarks/compression_bench.py, docs/PERFORMANCE.md "Compression"): within 1% of the best step for fp32
    and int8 at H = 10 and 50, and the only one under which the sparse codec trains; DiLoCo's Nesterov step
    (lr 0.7, momentum 0.9) ended 2-10% worse dense and diverged with the sparse codec there."""

    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        _check_lr(self, "outer")
        if not 0.0 <= self.momentum < 1.0:
            _fail("outer.momentum", self.momentum, "a number in [0, 1)")


@dataclass(frozen=True)
class SyncSection:
    """How pseudo-gradients travel, when a round closes, and how much one worker can move θ.

    Bounded influence (coordinator/aggregation.py has the formulas and the reasons for the defaults):
    * `max_update_norm`: the hard bound on one update's global L2 norm; a larger update is refused.
      0 = automatic: twice the most an honest worker's inner optimizer can move θ in a round's steps
      (inner.steps; time-boxed rounds: the step cap) (`sync/norm_bound.py`), or 1e4
      where no such bound exists (SGD without gradient clipping).
    * `bound_tokens`: refuse an update claiming more tokens than its assignment allows
      (batch × seq_len × inner.steps of the round it trained; for data.source = "diag", whose task
      sets its own lengths, data.seq_len stands for the most scored positions of one sequence).
    * `aggregation`: how the round's updates are combined: "mean" (token-weighted, the plain
      DiLoCo average), "clipped_mean" (the default: each update's norm clipped to `clip_factor`
      × the reference norm, the median of this round's and the last `reference_rounds` rounds'
      norms), "trimmed_mean" (per coordinate, the `trim_fraction` largest and smallest values
      dropped) or "centered_clip" (Karimireddy et al. 2021, radius `centered_clip_tau` ×
      the reference norm, `centered_clip_iterations` iterations).
    * `min_cosine`: the direction check before the aggregation: an update whose cosine with at
      least half of the round's other updates is below it is dropped (at most a minority of the
      round; rounds of fewer than 3 updates are not checked); -1 turns the check off.
    * `outlier_evict_after` K and `outlier_window` M: a worker whose update was clipped, trimmed
      as an outlier, dropped or refused in K of its last M rounds is evicted (0 = never; flagged always).
    * `backend`: "coordinator" (updates go through the coordinator, the default) or "hivemind"
      (workers average peer to peer with hivemind, worker/hivemind_sync.py; the coordinator's
      aggregation options above do not apply there).

    Codecs (sync/codec.py; issue #28): `codec` is "fp32", "bf16", "int8" (blocks of `block_size`),
    "lowbit" (blockwise absmax at `value_bits` = 2 or 4 bits, blocks of `block_size`) or "sparse" (per
    chunk of `sparse_chunk` values the `density` × chunk largest in magnitude, at `value_bits` = 1..8
    bits each; the coordinator sends the round's step at `downlink_density`, 0 = `density`). The
    coordinator backend carries all five in both directions; hivemind's all-reduce all
    but "sparse" (`BACKEND_CODECS`). `error_decay` β: the workers' and the coordinator's error feedback
    carry β × what was not sent into the next round (1 = all of it; SparseLoCo uses 0.95). Measured
    (docs/PERFORMANCE.md "Compression"): "sparse" matched fp32 up to inner.steps = 10 and lost 2-31% above, and
    diverged under outer momentum; such configs are valid, and `RunSpec.cautions` (logged by the coordinator at
    start) says so.

    Heterogeneous swarms (issue #15; decisions.decide_pace and decide_staleness have the rules):
    * `round`: "steps" (every worker trains inner.steps steps, or with `adaptive_steps` its own
      count from its measured speed so that all finish together) or "time" (every worker trains
      until the round's budget of `round_seconds` is used, finishing its current step, at most
      `max_steps` steps; the budget grows so that the slowest worker completes `min_steps`).
      With "time" the round's deadline is the budget plus `round_deadline_s`.
    * `max_staleness`: an update trained from a version at most this many versions old (from a
      version this worker pulled) is merged into the open round with its tokens weighted by
      (1 + staleness)^(−`staleness_exponent`); older ones are refused. 0 = refuse every late update.

    `overlap` (issue #29; coordinator backend only): after pushing Δ a worker goes on training from its
    local θ while the round closes and θ_{v+1} travels, then merges θ ← θ_{v+1} + (θ_local − θ_pushed)
    (docs/ARCHITECTURE.md, "Overlapped rounds"); false = push, wait for v+1, pull, train.
    """

    codec: str = "int8"
    block_size: int = 256
    error_feedback: bool = True
    # codec = "sparse": the fraction of each chunk of sparse_chunk values sent; "sparse" and "lowbit": bits per value.
    density: float = 0.02
    # codec = "sparse": the fraction of each chunk of the round's step the coordinator sends (the downlink); 0 = density.
    # The step of N workers holds up to N × density of each chunk (docs/PERFORMANCE.md "Compression").
    downlink_density: float = 0.0
    value_bits: int = 2
    sparse_chunk: int = 4096
    # Error feedback's decay β (workers and coordinator): the next round carries β × what was not sent.
    error_decay: float = 1.0
    # A round closes at this many seconds after it opened if at least one worker reported.
    round_deadline_s: float = 120.0
    # Before its deadline a round closes only once at least this many workers reported.
    min_reports: int = 1
    # Largest accepted global L2 norm of one worker's pseudo-gradient; 0 = automatic (above).
    max_update_norm: float = 0.0
    bound_tokens: bool = True
    aggregation: str = "clipped_mean"
    clip_factor: float = 2.0
    trim_fraction: float = 0.2
    centered_clip_tau: float = 1.0
    centered_clip_iterations: int = 3
    # Rounds of accepted update norms the reference norm looks back on besides the round's own.
    reference_rounds: int = 4
    # Drop an update whose cosine with at least half of the other updates is below this; -1 = off.
    min_cosine: float = 0.0
    outlier_evict_after: int = 0
    outlier_window: int = 5
    # "steps" (step-boxed rounds) or "time" (time-boxed rounds of round_seconds).
    round: str = "steps"
    round_seconds: float = 30.0
    # The fewest steps the slowest worker trains per round (adaptive steps, the time budget).
    min_steps: int = 1
    # Step-boxed rounds: assign each worker its own step count from its measured speed.
    adaptive_steps: bool = False
    # Time-boxed rounds: the most steps one worker trains per round; 0 = 10 × inner.steps.
    max_steps: int = 0
    # Versions a late update may lag and still be merged (weighted); older ones are refused.
    max_staleness: int = 1
    staleness_exponent: float = 0.5
    backend: str = "coordinator"
    # Train on while a round travels and closes; merge θ_{v+1} with the progress made since the push.
    overlap: bool = False

    def __post_init__(self) -> None:
        self._check_pace()
        if self.backend not in SYNC_BACKENDS:
            _fail("sync.backend", self.backend, f"one of {SYNC_BACKENDS}")
        if not isinstance(self.overlap, bool):
            _fail("sync.overlap", self.overlap, "true or false")
        if self.overlap and self.backend != "coordinator":
            _fail("sync.overlap", self.overlap, 'false with sync.backend = "hivemind" (overlap is the coordinator backend\'s)')
        if self.codec not in CODECS:
            _fail("sync.codec", self.codec, f"one of {CODECS}")
        if not 1 <= self.block_size <= 1 << 16:
            _fail("sync.block_size", self.block_size, "an integer between 1 and 65536")
        self._check_codec()
        _check_positive(self, "sync", "min_reports")
        if not self.centered_clip_tau >= MIN_CENTERED_CLIP_TAU:
            _fail("sync.centered_clip_tau", self.centered_clip_tau,
                  f"a multiple of the reference norm >= {MIN_CENTERED_CLIP_TAU:g} (below it the aggregate barely moves)")
        _check_seconds(self, "sync", "round_deadline_s")
        if not self.clip_factor >= 1.0:
            _fail("sync.clip_factor", self.clip_factor, "a number >= 1 (a multiple of the reference norm)")
        if not (self.max_update_norm == 0 or self.max_update_norm >= MIN_UPDATE_NORM):
            _fail("sync.max_update_norm", self.max_update_norm,
                  f"an L2 norm >= {MIN_UPDATE_NORM:g}, or 0 (automatic; below {MIN_UPDATE_NORM:g} every update is refused)")
        if self.aggregation not in AGGREGATIONS:
            _fail("sync.aggregation", self.aggregation, f"one of {AGGREGATIONS}")
        if not 0.0 <= self.trim_fraction < 0.5:
            _fail("sync.trim_fraction", self.trim_fraction, "a number in [0, 0.5)")
        if not 1 <= self.centered_clip_iterations <= 100:
            _fail("sync.centered_clip_iterations", self.centered_clip_iterations, "an integer between 1 and 100")
        if not -1.0 <= self.min_cosine < 1.0:
            _fail("sync.min_cosine", self.min_cosine, "a number in [-1, 1) (a cosine; -1 turns the direction check off)")
        if not 0 <= self.reference_rounds <= 1000:
            _fail("sync.reference_rounds", self.reference_rounds, "an integer between 0 and 1000")
        if not 1 <= self.outlier_window <= 1000:
            _fail("sync.outlier_window", self.outlier_window, "an integer between 1 and 1000")
        if not 0 <= self.outlier_evict_after <= self.outlier_window:
            _fail("sync.outlier_evict_after", self.outlier_evict_after,
                  f"an integer between 0 (never) and sync.outlier_window = {self.outlier_window}")
        self._refuse_unused_keys()

    def _refuse_unused_keys(self) -> None:
        """Keys off their defaults where nothing reads them (`_refuse_unused`; a review of keys accepted and ignored,
        2026-11-29). Each rule is what the code that reads the key does: a hivemind peer trains inner.steps every
        round (worker/hivemind_worker.py) and averages by all-reduce, so the coordinator's pace, staleness and
        aggregation never run; `step_cap` and the time budget read max_steps and round_seconds only in time-boxed
        rounds, and `decide_pace` reads adaptive_steps only in step-boxed ones; `WireFormat.from_sync` reads density
        and downlink_density for the sparse codec only and value_bits for the sparse and low-bit codecs only;
        `aggregation.combine` reads trim_fraction under trimmed_mean only, and clip_factor under clipped_mean and
        (through the reference norms it caps) centered_clip only. error_decay decays the residuals of the workers'
        error feedback (none without sync.error_feedback) and of the coordinator's downlink (none with the hivemind
        backend, and always zero with the lossless fp32 codec); with a lossy coordinator downlink it still acts."""
        if self.backend == "hivemind":
            _refuse_unused(self, "sync", ("round", "adaptive_steps", "max_staleness", "aggregation", "min_steps",
                                          "clip_factor", "staleness_exponent"),
                           'with sync.backend = "hivemind"', "hivemind peers train inner.steps every round and average by "
                           "all-reduce: the coordinator's pace, staleness and aggregation rules never run")
        if self.round == "steps":
            _refuse_unused(self, "sync", ("max_steps", "round_seconds"), 'unless sync.round = "time"',
                           "only a time-boxed round has a time budget and a step cap")
            if not self.adaptive_steps:
                _refuse_unused(self, "sync", ("min_steps",), 'unless sync.round = "time" or sync.adaptive_steps',
                               "step-boxed rounds of fixed steps train inner.steps; only a time budget or adaptive "
                               "step counts have a floor")
        else:
            _refuse_unused(self, "sync", ("adaptive_steps",), 'with sync.round = "time"', "a time-boxed round's "
                           "budget sets every worker's steps; adaptive step counts are for step-boxed rounds")
        if self.codec != "sparse":
            _refuse_unused(self, "sync", ("density", "downlink_density"), 'unless sync.codec = "sparse"',
                           f"the {self.codec} codec sends every value, both ways; only the sparse codec sends a "
                           "fraction of each chunk")
        if self.codec not in ("sparse", "lowbit"):
            _refuse_unused(self, "sync", ("value_bits",), 'unless sync.codec = "sparse" or "lowbit"',
                           f"the {self.codec} codec's values have a fixed width")
        if self.aggregation != "trimmed_mean":
            _refuse_unused(self, "sync", ("trim_fraction",), 'unless sync.aggregation = "trimmed_mean"',
                           f"{self.aggregation} trims nothing")
        if self.aggregation in ("mean", "trimmed_mean"):
            _refuse_unused(self, "sync", ("clip_factor",), 'unless sync.aggregation = "clipped_mean" or "centered_clip"',
                           f"{self.aggregation} clips nothing")
        if not self.error_feedback and (self.backend == "hivemind" or self.codec == "fp32"):
            setting, downlink = (('sync.backend = "hivemind"', "has no coordinator downlink") if self.backend == "hivemind"
                                 else ('sync.codec = "fp32"', "sends a lossless downlink"))
            _refuse_unused(self, "sync", ("error_decay",), f"with sync.error_feedback = false and {setting}",
                           f"no worker keeps a residual, and the run {downlink}: no residual is left to decay")

    @property
    def step_density(self) -> float:
        """The fraction of each chunk of the round's step the coordinator sends: downlink_density, or density if 0."""
        return self.downlink_density or self.density

    def _check_codec(self) -> None:
        """The codec's own keys, and whether the backend's wire carries it."""
        if not (math.isfinite(self.density) and 0.0 < self.density <= 1.0):
            _fail("sync.density", self.density, "a fraction in (0, 1] of each chunk's values")
        if not (math.isfinite(self.downlink_density) and 0.0 <= self.downlink_density <= 1.0):
            _fail("sync.downlink_density", self.downlink_density,
                  "a fraction in (0, 1] of each chunk of the round's step, or 0 (= sync.density)")
        if not 2 <= self.sparse_chunk <= 1 << 16:
            _fail("sync.sparse_chunk", self.sparse_chunk, "an integer between 2 and 65536")
        if not 1 <= self.value_bits <= 8:
            _fail("sync.value_bits", self.value_bits, "an integer between 1 and 8")
        if self.codec == "lowbit" and self.value_bits not in (2, 4):
            _fail("sync.value_bits", self.value_bits, '2 or 4 with sync.codec = "lowbit" (codes that tile a byte)')
        if not (math.isfinite(self.error_decay) and 0.0 <= self.error_decay <= 1.0):
            _fail("sync.error_decay", self.error_decay, "a number in [0, 1] (1 = carry all that was not sent)")
        if self.codec == "sparse" and not self.error_feedback:
            _fail("sync.error_feedback", self.error_feedback,
                  'true with sync.codec = "sparse" (without it every entry not sent is lost)')
        carried = BACKEND_CODECS.get(self.backend, CODECS)
        if self.codec not in carried:
            _fail("sync.codec", self.codec, f"one of {carried} with sync.backend = {self.backend!r}: its all-reduce "
                  "averages dense parts, where sparse entries would be summed and cut again without error feedback")

    def _check_pace(self) -> None:
        """The heterogeneous-swarm keys (round, budgets, staleness)."""
        if self.round not in ROUND_KINDS:
            _fail("sync.round", self.round, f"one of {ROUND_KINDS}")
        _check_positive(self, "sync", "min_steps")
        _check_seconds(self, "sync", "round_seconds")
        if not 0 <= self.max_steps <= 10 * MAX_INNER_STEPS:
            _fail("sync.max_steps", self.max_steps, f"an integer in [0, {10 * MAX_INNER_STEPS:,}] (0 = 10 × inner.steps)")
        if not 0 <= self.max_staleness <= MAX_STALENESS_LIMIT:
            _fail("sync.max_staleness", self.max_staleness, f"an integer between 0 (refuse late updates) and {MAX_STALENESS_LIMIT}")
        if not (math.isfinite(self.staleness_exponent) and 0.0 <= self.staleness_exponent <= 10.0):
            _fail("sync.staleness_exponent", self.staleness_exponent, "a number in [0, 10] (0 = no discount)")

    def step_cap(self, inner_steps: int) -> int:
        """The most inner steps one worker trains in a round: inner.steps when step-boxed, else
        sync.max_steps (0: 10 × inner.steps)."""
        if self.round == "steps":
            return inner_steps
        return self.max_steps or 10 * inner_steps


@dataclass(frozen=True)
class HivemindSection:
    """The rules of the hivemind backend (worker/hivemind_sync.py, docs/DEPLOY.md "On hivemind").

    Only meaningful with sync.backend = "hivemind"; a section that differs from these defaults is
    refused with the coordinator backend. Each peer applies its own rules, so peers of one swarm
    should read them from one RUN.toml (a coordinator hands its own to the workers that join it).
    """

    # Δ̄ of a group is refused (the step skipped) when ‖Δ̄‖ > trust_factor × ‖Δ_local‖: an honest
    # token-weighted mean is at most the largest honest norm, so 4 leaves room for groupmates whose
    # honest Δ is larger than this peer's.
    trust_factor: float = 4.0
    # ... and when its cosine with this peer's own Δ is below min_cosine (issue #31: a groupmate pulling the other
    # way; with weights bounded by the run's batch × seq_len × inner.steps). -1 turns the direction check off.
    min_cosine: float = 0.0
    # A peer farther than this from the highest-version majority (in units of one round's step,
    # `hivemind_sync.drift`) re-syncs. int8 codec error is ~0.01 step per round, a missed round ≈ 1.
    drift_tolerance: float = 0.25
    # The all-reduce timeout is timeout_factor × the slowest of the last timer_window measured
    # all-reduces; a peer waits for its group timeout_factor × its own training time of the round.
    timeout_factor: float = 3.0
    timer_window: int = 5
    # The all-reduce timeout's floor (its sender timeout a quarter, its reducer timeout half of it):
    # a tiny model's all-reduce takes 0.01-0.3 s, but a peer starved of CPU on a loaded machine stalls
    # between chunks: on a 2-core box under load, a 2.5 s sender timeout dropped an honest peer.
    min_allreduce_s: float = 20.0
    # The all-reduce timeout before any all-reduce was measured.
    initial_allreduce_s: float = 60.0
    # How long a peer waits for a would-be leader's answer, and past its matchmaking window for the group's start
    # (hivemind's request_timeout; at least half the window). A follower that gives up while its leader still counts
    # it may be a ghost in the leader's group, whose all-reduce then waits its sender timeout for parts that never
    # come (docs/RELIABILITY.md, "a ghost follower"): 1 s, before, was too short for a loaded host. Longer only
    # delays the rare matchmaking deadlock hivemind breaks with it (two peers asking each other at once).
    request_timeout_s: float = 5.0
    # How often a peer declares its state for late joiners (hivemind's default, 30 s, made
    # `load_state_from_peers` find nobody for that long).
    state_declare_s: float = 2.0
    # How long the DHT keeps a peer's digest and metrics records.
    record_ttl_s: float = 600.0
    # How long a peer waits for its round's group's digests before judging its drift, and at the last
    # version how long it then serves its state for a peer that re-syncs.
    settle_s: float = 10.0
    state_grace_s: float = 3.0

    def __post_init__(self) -> None:
        if not self.trust_factor > 1.0:
            _fail("hivemind.trust_factor", self.trust_factor, "a number > 1 (a multiple of the local update's norm)")
        if not -1.0 <= self.min_cosine < 1.0:
            _fail("hivemind.min_cosine", self.min_cosine, "a cosine in [-1, 1) (-1: no direction check)")
        if not 1.0 <= self.timeout_factor <= MAX_TIMEOUT_FACTOR:
            _fail("hivemind.timeout_factor", self.timeout_factor,
                  f"a number between 1 and {MAX_TIMEOUT_FACTOR:g} (a multiple of measured times)")
        if not 1 <= self.timer_window <= 1000:
            _fail("hivemind.timer_window", self.timer_window, "an integer between 1 and 1000 (all-reduces)")
        _check_positive(self, "hivemind", "drift_tolerance")
        _check_seconds(self, "hivemind", "min_allreduce_s", "initial_allreduce_s", "request_timeout_s",
                       "state_declare_s", "record_ttl_s")
        _check_seconds(self, "hivemind", "settle_s", "state_grace_s", positive=False)
        if not self.initial_allreduce_s >= self.min_allreduce_s:
            _fail("hivemind.initial_allreduce_s", self.initial_allreduce_s,
                  f"seconds >= hivemind.min_allreduce_s = {self.min_allreduce_s}")

    def describe(self) -> str:
        """The rules as one log line: `key value, ...`."""
        return ", ".join(f"{f.name} {getattr(self, f.name):g}" for f in dataclasses.fields(self))


@dataclass(frozen=True)
class CoordinatorSection:
    """Membership and serving limits of the coordinator."""

    lease_s: float = 15.0
    max_workers: int = 64
    # Longest a worker's AwaitVersion call may block on the server.
    max_wait_s: float = 10.0
    # Checkpoints kept in the state dir besides the newest.
    keep_checkpoints: int = 2
    # fsync each version's checkpoint and SQLite commit before serving it (survives power
    # loss). false keeps the atomic rename and survives a crash of the process only.
    durable: bool = True
    # Metric rows one worker may report while one version is current; more are refused.
    # 0 = the larger of 64 and 4 × (inner.steps + 2) (see RunSpec.metric_rows_per_round).
    max_metrics_per_round: int = 0
    # Metric rows per second one worker's budget refills with (at most max_metrics_per_round at once); 0 = no
    # budget over time. An honest worker writes one row per inner step and one per pull: the tiny test LSTM on an
    # idle 2-core machine about 330 rows/s (a millisecond step), so the default leaves it 3x.
    metric_rows_per_s: float = 1024.0
    # Metric rows the state dir keeps; beyond it the oldest rows are deleted (the dashboard's curves and totals
    # come from aggregates that keep them). 0 = no limit.
    max_metric_rows: int = 4_000_000
    # Seconds a worker that left or was evicted stays in memory (and in GetStatus); SQLite keeps it.
    forget_after_s: float = 300.0
    # Calls of one kind (membership, query, long_poll, pull, push) the server runs at once; beyond
    # it a call is refused with RESOURCE_EXHAUSTED. A kind not listed keeps its default
    # (32, 16, 64, 16, 16); `rcswarm coordinator --max-calls KIND=N` overrides both.
    max_calls: dict[str, int] = field(default_factory=dict)
    # Fair share: calls of one kind one worker runs at once, and calls of one kind from one peer host without
    # a worker's credential (Join, GetStatus; a kind not listed: half of its max_calls). Every active worker's
    # first call of a kind is admitted even when the kind is at max_calls (a reserve of max_workers per kind).
    max_calls_per_worker: int = 2
    max_calls_per_peer: dict[str, int] = field(default_factory=dict)
    # A stream that carries no message for this long is cancelled (--stream-idle-s overrides).
    stream_idle_s: float = 10.0
    # Health says NOT_SERVING when no coordinator tick completed for this long (--health-stall-s overrides).
    health_stall_s: float = 60.0
    # Health also says NOT_SERVING while updates wait in a round that is open for more than this many round
    # deadlines (sync.round_deadline_s, plus a time-boxed round's budget) without closing.
    health_round_deadlines: float = 3.0

    def __post_init__(self) -> None:
        _check_positive(self, "coordinator", "max_workers")
        _check_at_most(self, "coordinator", "max_workers", MAX_WORKERS)
        _check_seconds(self, "coordinator", "lease_s", "max_wait_s", "forget_after_s", "stream_idle_s", "health_stall_s")
        for table in ("max_calls", "max_calls_per_peer"):
            for kind, limit in getattr(self, table).items():
                if kind not in CALL_KINDS:
                    _fail(f"coordinator.{table}", {kind: limit}, f"a kind of call among {', '.join(CALL_KINDS)}")
                if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CALLS:
                    _fail(f"coordinator.{table}.{kind}", limit, f"an integer in [1, {MAX_CALLS}]")
        if isinstance(self.max_calls_per_worker, bool) or not 1 <= self.max_calls_per_worker <= MAX_CALLS:
            _fail("coordinator.max_calls_per_worker", self.max_calls_per_worker, f"an integer in [1, {MAX_CALLS}]")
        if not (math.isfinite(self.health_round_deadlines) and self.health_round_deadlines >= 1):
            _fail("coordinator.health_round_deadlines", self.health_round_deadlines, "a number >= 1")
        if self.keep_checkpoints < 0:
            _fail("coordinator.keep_checkpoints", self.keep_checkpoints, "an integer >= 0")
        if self.max_metrics_per_round < 0:
            _fail("coordinator.max_metrics_per_round", self.max_metrics_per_round, "an integer >= 0 (0 = automatic)")
        if not (math.isfinite(self.metric_rows_per_s) and (self.metric_rows_per_s == 0 or self.metric_rows_per_s >= 1)):
            # Below one row a second, a worker's metrics were refused "retry in inf s" after its first batch.
            _fail("coordinator.metric_rows_per_s", self.metric_rows_per_s,
                  "a number of rows per second >= 1, or 0 for no budget")
        if self.max_metric_rows < 0:
            _fail("coordinator.max_metric_rows", self.max_metric_rows, "an integer >= 0 (0 = no limit)")


@dataclass(frozen=True)
class SweepSection:
    """Several runs in one coordinator that differ in sequence length (Section 10.5).

    Empty `seq_lens` = no sweep. `batch_sizes`, when given, pairs one batch size with each
    length; `constant_tokens` instead keeps batch × L at data.batch_size × seq_lens[0]
    (Appendix I). Each run gets its own parameters and outer optimizer.
    """

    seq_lens: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    constant_tokens: bool = False
    # Issue #30: stop a length whose forecast is confidently worse than the best's, at these fractions of the
    # budget (run.rounds, else run.minutes), and move its workers to the others (coordinator/forecasts.py,
    # decide_prune).
    prune: bool = False
    prune_at: list[float] = field(default_factory=lambda: [0.25, 0.5])

    def __post_init__(self) -> None:
        if any(length < 1 for length in self.seq_lens) or len(set(self.seq_lens)) != len(self.seq_lens):
            _fail("sweep.seq_lens", self.seq_lens, "distinct positive integers")
        if self.batch_sizes and (len(self.batch_sizes) != len(self.seq_lens) or min(self.batch_sizes) < 1):
            _fail("sweep.batch_sizes", self.batch_sizes, f"{len(self.seq_lens)} positive integers, one per length")
        if self.batch_sizes and self.constant_tokens:
            _fail("sweep.constant_tokens", self.constant_tokens, "false when sweep.batch_sizes is given")
        fractions = self.prune_at
        if not fractions or not all(0 < f < 1 for f in fractions) or any(a >= b for a, b in pairwise(fractions)):
            _fail("sweep.prune_at", fractions, "increasing fractions of the budget (run.rounds, else run.minutes) in (0, 1)")
        if self.prune and len(self.seq_lens) < 2:
            _fail("sweep.prune", self.prune, "false unless sweep.seq_lens names 2 or more lengths")
        if not self.prune:
            _refuse_unused(self, "sweep", ("prune_at",), "unless sweep.prune = true", "nothing is pruned")
        if not self.seq_lens:
            _refuse_unused(self, "sweep", ("constant_tokens",), "unless sweep.seq_lens names lengths",
                           "without a sweep there is no length to derive a batch for")


@dataclass(frozen=True)
class CurriculumSection:
    """Who decides each worker's (sequence length, batch size): the coordinator, by one of these.

    policy "fixed" (default), one of:
      * `schedule` rows [from_step, seq_len, batch_size], from_step ascending and the first 0:
        every worker training from global version v uses the row in force at the run step v starts
        after (config/run_step.py: the steps the run's rounds trained before v; v × inner.steps when step-boxed);
      * `worker_seq_lens`: workers of one run train different lengths; a joining worker gets the
        length furthest below its share of the active workers (a length listed k times has k
        shares; ties: the earlier in the list), i.e. round-robin in join order while nobody leaves;
      * neither: data.seq_len and data.batch_size throughout.
    policy "adaptive": every worker trains the run's current rung of the ladder `seq_lens`,
    starting at the first; at each round close the coordinator lengthens to the next rung once
    the fitted law (Section 10.5, Eq. 11) predicts the longer length's loss below the current
    one's, at the wall time reached, within `budget_seconds`. The law is `alpha_inf`, `tau` and
    `amplitude` (α(s) = α∞(1 − e^(−s/τ)), A constant), or fitted from `law_from`, a previous
    run directory or metrics file as read by `rcswarm fit` (in a TOML file, relative to that
    file; fitted again when the coordinator restarts).

    With `constant_tokens` the batch of a length L is round(data.batch_size × L₀ / L), L₀ the
    first of `worker_seq_lens` or `seq_lens` (batch × L fixed, as in a sweep); otherwise
    data.batch_size.
    """

    policy: str = "fixed"
    schedule: list[list[int]] = field(default_factory=list)
    worker_seq_lens: list[int] = field(default_factory=list)
    constant_tokens: bool = False
    seq_lens: list[int] = field(default_factory=list)
    budget_seconds: float = 3600.0
    alpha_inf: float = 0.0
    tau: float = 0.0
    amplitude: float = 1.0
    law_from: str = ""
    # Issue #30, adaptive only: also lengthen once the current rung's forecast (the law E + A·x^(−β) fitted to
    # its own rounds) gains less than this many nats over the rest of the budget at its measured pace, even at
    # its interval's optimistic end (0 = off).
    forecast_gain: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in CURRICULUM_POLICIES:
            _fail("curriculum.policy", self.policy, f"one of {CURRICULUM_POLICIES}")
        steps = [row[0] if len(row) == 3 else None for row in self.schedule]
        if any(len(row) != 3 or min(row[1:]) < 1 for row in self.schedule):
            _fail("curriculum.schedule", self.schedule, "rows [from_step, seq_len, batch_size] with positive sizes")
        if self.schedule and (steps[0] != 0 or any(b <= a for a, b in pairwise(steps))):
            _fail("curriculum.schedule", self.schedule, "from_step starting at 0 and strictly increasing")
        if any(length < 1 for length in self.worker_seq_lens):
            _fail("curriculum.worker_seq_lens", self.worker_seq_lens, "positive integers")
        if any(length < 1 for length in self.seq_lens) or any(b <= a for a, b in zip(self.seq_lens, self.seq_lens[1:])):
            _fail("curriculum.seq_lens", self.seq_lens, "strictly increasing positive integers")
        _check_positive(self, "curriculum", "amplitude")
        _check_seconds(self, "curriculum", "budget_seconds")
        for name in ("alpha_inf", "tau"):
            if getattr(self, name) < 0:
                _fail(f"curriculum.{name}", getattr(self, name), "a number >= 0")
        if self.schedule and self.worker_seq_lens:
            _fail("curriculum.worker_seq_lens", self.worker_seq_lens, "empty when curriculum.schedule is given")
        if not (math.isfinite(self.forecast_gain) and self.forecast_gain >= 0):
            _fail("curriculum.forecast_gain", self.forecast_gain, "a finite number of nats >= 0 (0 = off)")
        if self.policy == "fixed":
            if self.seq_lens:
                _fail("curriculum.seq_lens", self.seq_lens, 'empty unless curriculum.policy = "adaptive"')
            if self.forecast_gain:
                _fail("curriculum.forecast_gain", self.forecast_gain, '0 unless curriculum.policy = "adaptive"')
            # The law and its budget steer the adaptive policy only: set under "fixed" they were taken and ignored.
            _refuse_unused(self, "curriculum", ADAPTIVE_ONLY, 'unless curriculum.policy = "adaptive"',
                           "only the adaptive policy uses it")
            if not self.worker_seq_lens:  # `batch_for` derives batches of these lengths only
                _refuse_unused(self, "curriculum", ("constant_tokens",),
                               "unless curriculum.worker_seq_lens or curriculum.seq_lens names lengths",
                               "without them every batch is data.batch_size or a schedule row's")
            return
        if self.schedule:
            _fail("curriculum.schedule", self.schedule, 'empty with curriculum.policy = "adaptive"')
        if self.worker_seq_lens:
            _fail("curriculum.worker_seq_lens", self.worker_seq_lens, 'empty with curriculum.policy = "adaptive"')
        if len(self.seq_lens) < 2:
            _fail("curriculum.seq_lens", self.seq_lens, 'a ladder of at least 2 lengths with curriculum.policy = "adaptive"')
        if self.law_from and (self.alpha_inf or self.tau):
            _fail("curriculum.law_from", self.law_from, "empty when curriculum.alpha_inf and curriculum.tau give the law")
        if not self.law_from:
            _check_positive(self, "curriculum", "alpha_inf", "tau")

    @property
    def adaptive(self) -> bool:
        return self.policy == "adaptive"

    def batch_for(self, seq_len: int, default_batch: int) -> int:
        """The batch size at `seq_len` under `constant_tokens` (worker_seq_lens and the ladder)."""
        lengths = self.seq_lens or self.worker_seq_lens
        if not (self.constant_tokens and lengths):
            return default_batch
        return max(1, round(default_batch * lengths[0] / seq_len))

    def at(self, step: int, default: tuple[int, int]) -> tuple[int, int]:
        """(seq_len, batch_size) the fixed schedule puts in force at inner step `step`."""
        current = default
        for from_step, seq_len, batch_size in self.schedule:
            if step >= from_step:
                current = (seq_len, batch_size)
        return current


@dataclass(frozen=True)
class RunSpec:
    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    inner: InnerSection = field(default_factory=InnerSection)
    outer: OuterSection = field(default_factory=OuterSection)
    sync: SyncSection = field(default_factory=SyncSection)
    coordinator: CoordinatorSection = field(default_factory=CoordinatorSection)
    sweep: SweepSection = field(default_factory=SweepSection)
    curriculum: CurriculumSection = field(default_factory=CurriculumSection)
    hivemind: HivemindSection = field(default_factory=HivemindSection)

    def __post_init__(self) -> None:
        self._check_hivemind()
        self._check_wire_ints()
        curriculum = self.curriculum
        varied = ("seq_lens" if curriculum.adaptive else "worker_seq_lens" if curriculum.worker_seq_lens
                  else "schedule" if curriculum.schedule else "")
        if varied and self.is_sweep:
            _fail("sweep.seq_lens", self.sweep.seq_lens, f"empty when curriculum.{varied} is given")
        if self.is_sweep and self.sync.backend == "hivemind":  # taken before, and every hivemind worker exited 2
            _fail("sweep.seq_lens", self.sweep.seq_lens, 'empty with sync.backend = "hivemind": a hivemind swarm trains '
                                                         "one run (a sweep's runs are the coordinator backend's)")
        if self.outer.momentum == 0:
            # Nesterov's step θ − η(Δ̄ + μb) is plain SGD's θ − ηb at μ = 0 (sync/outer.py). Refused in a run spec,
            # not in OuterSection, which stays a formula's parameters (tests take the Nesterov path at μ = 0).
            _refuse_unused(self.outer, "outer", ("nesterov",), "unless outer.momentum > 0",
                           "without momentum the Nesterov step is the plain one")
        longest = max((f"{self.run.name}-L{length}" for length in self.sweep.seq_lens), key=len, default="")
        if len(longest) > MAX_RUN_NAME_CHARS:
            _fail("run.name", self.run.name, f"at most {MAX_RUN_NAME_CHARS} characters with the sweep's suffix: its run "
                                             f"{longest!r} has {len(longest)}")
        if self.sweep.prune and self.run.rounds == 0 and self.run.minutes == 0:
            _fail("sweep.prune", self.sweep.prune, "false without a budget: run.rounds = 0 and run.minutes = 0 (it "
                                                   "prunes at fractions of the rounds, or of the minutes)")
        if varied and self.data.source == "diag":
            _fail(f"curriculum.{varied}", getattr(curriculum, varied), 'empty with data.source = "diag" (the task sets its lengths)')
        if self.sync.min_reports > self.coordinator.max_workers:
            _fail("sync.min_reports", self.sync.min_reports,
                  f"at most coordinator.max_workers = {self.coordinator.max_workers} (more reports than workers never "
                  "come: every round would wait for its deadline)")
        if self.sync.min_steps > self.sync.step_cap(self.inner.steps):
            _fail("sync.min_steps", self.sync.min_steps,
                  f"at most the steps a round allows ({self.sync.step_cap(self.inner.steps)}: inner.steps when "
                  'sync.round = "steps", else sync.max_steps)')

    def _check_wire_ints(self) -> None:
        """Lengths, batch sizes and steps travel as int32 (TrainingAssignment, UpdateMeta): larger ones are refused
        here instead of failing every Join."""
        curriculum = self.curriculum
        for key, values in (
            ("data.seq_len", [self.data.seq_len]), ("data.batch_size", [self.data.batch_size]),
            ("inner.steps", [self.inner.steps]), ("sweep.seq_lens", list(self.sweep.seq_lens)),
            ("sweep.batch_sizes", list(self.sweep.batch_sizes)),
            ("curriculum.seq_lens", list(curriculum.seq_lens)),
            ("curriculum.worker_seq_lens", list(curriculum.worker_seq_lens)),
            ("curriculum.schedule", [value for row in curriculum.schedule for value in row[1:]]),
        ):
            if any(value > INT32_MAX for value in values):
                _fail(key, values if len(values) > 1 else values[0], f"values up to {INT32_MAX} (the wire's int32)")
        lengths = curriculum.seq_lens or curriculum.worker_seq_lens
        for length in lengths:  # the batches constant_tokens derives (a second Join failed on one, before)
            batch = curriculum.batch_for(length, self.data.batch_size)
            if batch > INT32_MAX:
                _fail("curriculum.constant_tokens", curriculum.constant_tokens,
                      f"batches up to {INT32_MAX} (the wire's int32): data.batch_size {self.data.batch_size} × "
                      f"{lengths[0]} / {length} is a batch of {batch:,} at length {length}")
        for index, length in enumerate(self.sweep.seq_lens):  # and those the sweep's constant_tokens derives
            batch = self._sweep_batch(index)
            if batch > INT32_MAX:
                _fail("sweep.constant_tokens", self.sweep.constant_tokens,
                      f"batches up to {INT32_MAX} (the wire's int32): data.batch_size {self.data.batch_size} × "
                      f"{self.sweep.seq_lens[0]} / {length} is a batch of {batch:,} at length {length}")

    def _check_hivemind(self) -> None:
        """[hivemind] keys apply to the hivemind backend only: set with another backend, they are refused."""
        if self.sync.backend != "hivemind":
            _refuse_unused(self.hivemind, "hivemind", tuple(f.name for f in dataclasses.fields(HivemindSection)),
                           'unless sync.backend = "hivemind"', f"sync.backend is {self.sync.backend!r}")

    def cautions(self) -> list[str]:
        """Settings that are valid but were measured to cost loss (issue #28, docs/PERFORMANCE.md "Compression"), one
        sentence each; the coordinator logs them as warnings when it starts. Empty when none applies."""
        notes = []
        if self.sync.codec == "sparse":
            notes += self._sparse_rounds_cautions()
        dense_enough = min(1.0, self.run.workers * self.sync.density)
        one_bit_measured = (self.sync.value_bits == 1 and self.run.workers <= SPARSE_ONE_BIT_MAX_WORKERS
                            and self.sync.step_density >= SPARSE_ONE_BIT_DOWNLINK * (1 - 1e-9))
        if (self.sync.codec == "sparse" and self.run.workers > SPARSE_MATCHED_WORKERS and not one_bit_measured
                and self.sync.step_density < dense_enough * (1 - 1e-9)):
            notes.append(f'sync.codec = "sparse" with run.workers = {self.run.workers} and sync.downlink_density = '
                         f"{self.sync.downlink_density:g} (the step at {self.sync.step_density:g}): the sparse codec "
                         f"matched fp32 with {SPARSE_MATCHED_WORKERS} workers; with 4 at H = 10 its held-out loss was "
                         f"{' and '.join(f'+{p:.1%}' for p in SPARSE_PENALTY_4_WORKERS)} over int8 (2 seeds): the round's "
                         "step holds up to N x sync.density of each chunk and the downlink sends sync.downlink_density "
                         f"of it. Set sync.downlink_density = {dense_enough:g} (run.workers x sync.density: "
                         f"{' and '.join(f'{p:+.1%}' for p in SPARSE_DENSE_DOWNLINK_OVER_INT8)} over int8 at 4 workers, "
                         f"the downlink {SPARSE_DENSE_DOWNLINK_RATIO}x below fp32 instead of {SPARSE_DEFAULT_RATIO}x), "
                         f"or, >= 100x below fp32 both ways, sync.value_bits = 1 with sync.downlink_density = "
                         f"{SPARSE_ONE_BIT_DOWNLINK:g} (up to {SPARSE_ONE_BIT_MAX_WORKERS} workers: "
                         f"{', '.join(f'{p:+.2%}' for p in SPARSE_ONE_BIT_OVER_INT8)} over int8 at 4, 3 seeds)")
        if self.sync.codec == "sparse" and self.sync.error_feedback and self.sync.error_decay == 1.0:
            notes.append('sync.codec = "sparse" with sync.error_decay = 1.0: every sparse measurement used 0.95 (as '
                         "SparseLoCo does); without decay the held-out loss was 3.7% worse at H = 50 (1.8517 against "
                         "1.7864); set sync.error_decay = 0.95")
        if self.sync.codec == "sparse" and self.outer.momentum > 0:
            notes.append(f'sync.codec = "sparse" with outer.momentum = {self.outer.momentum}: the sparse codec '
                         "diverged under a momentum outer step (held-out 3.81 against 1.64 with plain averaging at "
                         "H = 10): the momentum re-applies the error feedback's delayed mass; use outer.momentum = 0")
        return notes

    def _sparse_rounds_cautions(self) -> list[str]:
        """The sparse codec's lag in a run of too few rounds for its H, or at an H never run long (`cautions`)."""
        h, rounds = self.inner.steps, self.run.rounds
        needed = next((r for most_h, r in SPARSE_CATCH_UP_ROUNDS if h <= most_h), None)
        crowd = self.run.workers > SPARSE_MATCHED_WORKERS and h > SPARSE_CATCH_UP_ROUNDS[0][0]
        if needed is not None and crowd:
            needed = max(needed, SPARSE_CROWD_CATCH_UP_ROUNDS)
        if needed is not None and not 0 < rounds < needed:
            return []
        lag = ", ".join(f"+{penalty:.1%} after {r} rounds of H = {at_h}" for r, at_h, penalty in SPARSE_PENALTY_BY_ROUNDS)
        caught_up = (f"it caught up within 0.5% of int8 by round {SPARSE_CATCH_UP_ROUNDS[0][1]} at H = "
                     f"{SPARSE_CATCH_UP_ROUNDS[0][0]} and after {SPARSE_CATCH_UP_ROUNDS[1][1]} rounds at H = "
                     f"{SPARSE_CATCH_UP_ROUNDS[1][0]} ({', '.join(f'{p:+.2%}' for p in SPARSE_CAUGHT_UP_OVER_INT8)}, 2 seeds; "
                     f"lstm_lm small; the frame model tiny was ahead of int8 only from round {SPARSE_FRAME_AHEAD_ROUND} "
                     f"at H = {SPARSE_CATCH_UP_ROUNDS[0][0]})")
        if needed is None:
            return [f'sync.codec = "sparse" with inner.steps = {h}: the sparse codec was measured up to H = '
                    f"{SPARSE_CATCH_UP_ROUNDS[-1][0]} inner steps per round; it lags the dense codecs in its first rounds "
                    f"({lag}; density 0.02, 2 bits) and {caught_up}. Use inner.steps <= {SPARSE_CATCH_UP_ROUNDS[-1][0]}, "
                    "or int8 (within 0.3% of fp32 at H = 10 to 50)"]
        return [f'sync.codec = "sparse" with run.rounds = {rounds} at inner.steps = {h}: the sparse codec lags the dense '
                f"codecs in its first rounds (error feedback delivers late what top-k leaves out: {lag}; density 0.02, "
                f"2 bits) and {caught_up}"
                + (f"; with 4 workers at H = 50 it took between {SPARSE_CATCH_UP_ROUNDS[1][1]} and {SPARSE_CROWD_CATCH_UP_ROUNDS} rounds" if crowd else "")
                + f". Run at least {needed} rounds, or use int8 (within 0.3% of fp32 at H = 10 to 50)"]

    @property
    def is_sweep(self) -> bool:
        return bool(self.sweep.seq_lens)

    def metric_rows_per_round(self) -> int:
        """The metric rows a worker may report per round: coordinator.max_metrics_per_round, or when 0
        the larger of 64 and 4 × (steps + 2) (a worker reports one row per step and one per pull: steps + 1;
        4 × leaves room for a late round's rows and a retried report), steps the most a round allows
        (`SyncSection.step_cap`)."""
        return self.coordinator.max_metrics_per_round or max(64, 4 * (self.sync.step_cap(self.inner.steps) + 2))

    def sweep_runs(self) -> list[RunSpec]:
        """The runs of a sweep (this spec alone if it is not one), each with its own L and batch."""
        if not self.is_sweep:
            return [self]
        runs = []
        for index, length in enumerate(self.sweep.seq_lens):
            runs.append(dataclasses.replace(
                self,
                run=dataclasses.replace(self.run, name=f"{self.run.name}-L{length}"),
                data=dataclasses.replace(self.data, seq_len=length, batch_size=self._sweep_batch(index)),
                sweep=SweepSection(),
            ))
        return runs

    def training_windows(self) -> list[tuple[str, int, int]]:
        """(key, seq_len, batch) of every window a run of this spec can train: each run's of a sweep; else the
        curriculum's (the adaptive ladder or curriculum.worker_seq_lens, at the batches constant_tokens derives, or
        each schedule row, the first from step 0) or data.seq_len × data.batch_size without one."""
        curriculum, data = self.curriculum, self.data
        if self.is_sweep:
            return [("sweep.seq_lens", length, self._sweep_batch(index)) for index, length in enumerate(self.sweep.seq_lens)]
        lengths = curriculum.seq_lens or curriculum.worker_seq_lens
        if lengths:
            key = "curriculum.seq_lens" if curriculum.seq_lens else "curriculum.worker_seq_lens"
            return [(key, length, curriculum.batch_for(length, data.batch_size)) for length in lengths]
        if curriculum.schedule:
            return [("curriculum.schedule", seq_len, batch) for _, seq_len, batch in curriculum.schedule]
        return [("data.seq_len", data.seq_len, data.batch_size)]

    def largest_window(self) -> tuple[str, int, int]:
        """The window of `training_windows` with the most positions (the first of equals)."""
        return max(self.training_windows(), key=lambda window: window[1] * window[2])

    def _sweep_batch(self, index: int) -> int:
        """The batch of the sweep's run `index`: sweep.batch_sizes', the one sweep.constant_tokens derives, or
        data.batch_size."""
        if self.sweep.batch_sizes:
            return self.sweep.batch_sizes[index]
        if self.sweep.constant_tokens:
            return max(1, round(self.data.batch_size * self.sweep.seq_lens[0] / self.sweep.seq_lens[index]))
        return self.data.batch_size

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSpec:
        return _build(cls, data, "")

    @classmethod
    def from_toml(cls, path: str | Path) -> RunSpec:
        """The run spec of the TOML file at `path`; ValueError naming the file when it cannot be read or parsed (a
        parser's RecursionError and an integer past Python's digit limit included), or naming the key that is wrong."""
        path = Path(path)
        try:
            try:
                with path.open("rb") as handle:
                    data = tomllib.load(handle)
            except FileNotFoundError:
                raise ValueError(f"run config {str(path)!r} does not exist") from None
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"run config {str(path)!r} is not valid TOML: {exc}") from None
            except ValueError as exc:  # int() of more than sys.get_int_max_str_digits() digits
                raise ValueError(f"run config {str(path)!r} cannot be read: {exc}") from None
            except OSError as exc:
                raise ValueError(f"run config {str(path)!r} cannot be read: {exc.strerror or exc}") from None
            curriculum = data.get("curriculum")
            law_from = curriculum.get("law_from") if isinstance(curriculum, dict) else None
            if isinstance(law_from, str) and law_from and _text_problem(law_from) is None:
                # Relative to the config file, and absolute from here on (the launcher copies the spec elsewhere).
                curriculum["law_from"] = str((path.parent / curriculum["law_from"]).resolve())
            return cls.from_dict(data)
        except RecursionError:  # the parser's, or a refusal's repr of what it parsed
            raise ValueError(f"run config {str(path)!r} {NESTED_TOO_DEEPLY}") from None

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        """The run spec of JSON `text` (what a coordinator hands its workers, what a state dir stores); ValueError
        naming the run spec when it cannot be parsed (nested too deeply, an integer past Python's digit limit
        included), or naming the key. A key that does nothing in it is taken at its default (`_refuse_unused`)."""
        try:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"run spec is not valid JSON: {exc}") from None
            except ValueError as exc:  # int() of more than sys.get_int_max_str_digits() digits
                raise ValueError(f"run spec cannot be read: {exc}") from None
            with _reading_back():
                return cls.from_dict(data)
        except RecursionError:
            raise ValueError(f"run spec {NESTED_TOO_DEEPLY}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        lines: list[str] = []
        for table, values in self.to_dict().items():
            if ((table == "sweep" and self.sweep == SweepSection()) or (table == "curriculum" and self.curriculum == CurriculumSection())
                    or (table == "hivemind" and self.hivemind == HivemindSection())):
                continue
            nested = {k: v for k, v in values.items() if isinstance(v, dict)}
            lines.append(f"[{table}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if k not in nested]
            for key, sub in nested.items():
                lines.append(f"\n[{table}.{key}]")
                lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in sub.items()]
            lines.append("")
        return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def _toml_key(key: str) -> str:
    """`key` as a TOML key: bare when it may be one, else quoted."""
    return key if key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key) else _toml_string(key)


def _toml_string(text: str) -> str:
    """`text` as an ASCII TOML basic string: quotes and backslashes escaped, control characters, DEL and non-ASCII
    characters as \\uXXXX, and those beyond the BMP as \\UXXXXXXXX (json.dumps wrote them as surrogate pairs, which
    TOML refuses, and left DEL bare, which TOML refuses too)."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _text_problem(text: str) -> str | None:
    """Why `text` cannot be a config string (None: it can): TOML files are UTF-8, so a lone surrogate (an undecodable
    byte of a path, or a JSON escape) cannot be written back to one, and a NUL ends a path at the OS."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "valid Unicode text (no lone surrogates: a TOML file is UTF-8)"
    if "\x00" in text:
        return "text without NUL characters"
    return None


def _check_table_value(value: Any, key: str, depth: int = 0) -> None:
    """A value of a free-form table ([model.overrides], [data.task_config]) at `depth` levels below the table: one
    TOML can write (a string, integer, number, boolean, or an array or table of them, nested at most MAX_TABLE_DEPTH
    levels), so that the spec round-trips through JSON and TOML; the model's or the task's own config checks what it
    means."""
    if isinstance(value, (list, tuple, Mapping)) and depth > MAX_TABLE_DEPTH:
        raise ValueError(f"{_cut(key, len(key))} {NESTED_TOO_DEEPLY}")
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem is not None:
            _fail(key, value, problem)
    elif isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        _fail(key, value, f"an integer between {INT64_MIN} and {INT64_MAX}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_table_value(item, f"{key}[{i}]", depth + 1)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            if not isinstance(name, str):
                _fail(key, value, "a table whose keys are strings")
            _check_table_value(item, f"{key}.{name}", depth + 1)
    elif not isinstance(value, (bool, int, float)):
        _fail(key, value, "a string, number, boolean, array or table (TOML has no null)")


def _build(cls: type, data: Any, prefix: str) -> Any:
    """Instantiate dataclass `cls` from a mapping, checking keys and value types."""
    where = prefix or "the run config"
    if not isinstance(data, Mapping):
        _fail(where, data, "a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ValueError(f"unknown key {shown(key)} in {where}; expected one of {sorted(names)}")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(hints[name], value, key)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            _fail(key, value, "a list")
        return [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            _fail(key, value, "a table")
        _check_table_value(value, key)
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            _fail(key, value, "true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(key, value, "an integer")
        if not INT64_MIN <= value <= INT64_MAX:
            _fail(key, value, f"an integer between {INT64_MIN} and {INT64_MAX} (64 bits)")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            _fail(key, value, "a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            _fail(key, value, "a string")
        problem = _text_problem(value)
        if problem is not None:
            _fail(key, value, problem)
        return value
    assert not isinstance(hint, types.UnionType), f"unsupported field type {hint} for {key}"
    raise AssertionError(f"unsupported field type {hint} for {key}")
