"""The coordinator's state machine behind the gRPC service: membership, rounds, outer steps.

`SwarmCoordinator` owns the global parameters, the outer optimizer's momentum, the version
counter, the membership table and the open round. Every RPC handler in server.py calls one
method here; a refused call raises `Refusal` carrying the gRPC status code and a message.
Decisions (admit, evict, forget, close a round) come from the pure functions in decisions.py; the
curriculum (each worker's sequence length and batch, the adaptive ladder) from the
`CurriculumTracker` of curriculum.py. The class docstring states which lock each method takes.

Identity. Join returns a worker secret (`WORKER_SECRET_BYTES` random bytes) bound to the new
worker id; the membership keeps only its SHA-256, never the secret, which is not logged, stored or
shown. Every later call of that worker carries the secret and is checked under the lock before
anything changes (`_authenticated`): none -> UNAUTHENTICATED, an id that is not a member ->
NOT_FOUND (join again), a secret that is not this id's -> PERMISSION_DENIED, so one worker can
neither act for nor evict another. Memberships live in memory only: after a restart every worker
gets NOT_FOUND and joins again with a new secret.

Bounded influence: an update is refused (INVALID_ARGUMENT, recorded as a `dropped` event) when its
tokens exceed its assignment's batch × seq_len × inner.steps (`sync.bound_tokens`) or its norm the
hard bound (`sync.max_update_norm`, 0 = `aggregation.automatic_norm_bound`); at the close an update
whose direction disagrees with the round's majority is dropped (`sync.min_cosine`, also a `dropped`
event) and the others are combined by `sync.aggregation` (aggregation.py); every update it drops or
flags is recorded as an event, counted in the round's record and the worker's status; a worker flagged in
`sync.outlier_evict_after` of its last `sync.outlier_window` rounds is evicted.

Heterogeneous swarms (issue #15). Each worker's `TrainingAssignment` carries its pace for the version:
its inner-step count, or a time-boxed round's budget (`decisions.decide_pace`, from the workers'
measured seconds per step: the compute seconds between consecutive metric rows, the median of its
last STEP_SAMPLES). A late update (trained from a version this membership pulled, at most
`sync.max_staleness` versions old; `decisions.decide_staleness`) is kept in the open round's `late`
updates with its tokens weighted by the staleness weight and goes through the same direction check
and aggregation as the round's own; an older one is refused (FAILED_PRECONDITION naming both
versions). A push for a round that is closing waits for the close and then arrives late. Per worker
the coordinator counts tokens trained (its metrics), tokens applied (its updates an outer step used),
late updates merged and stale updates refused; GetStatus reports them.

What the coordinator keeps in memory is bounded: metric values are range-checked and each
worker's metric rows per round capped; ended memberships are forgotten after
`coordinator.forget_after_s` (SQLite keeps their history); GetStatus lists the active workers
and only the most recent ended ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import itertools
import json
import logging
import math
import secrets
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NoReturn

import grpc
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import aggregation, decisions
from rcswarm.coordinator import curriculum as curricula
from rcswarm.models import registry
from rcswarm.observe.summary import run_summary
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer, tensor_stream

# Spec keys a restart on an existing state dir may change; any other change is refused.
RESTART_MUTABLE = (
    "run.rounds", "run.workers", "coordinator.", "sync.round_deadline_s", "curriculum.budget_seconds",
    # The coordinator's own defences against outliers; workers do not depend on them.
    "sync.max_update_norm", "sync.bound_tokens", "sync.aggregation", "sync.clip_factor", "sync.trim_fraction",
    "sync.centered_clip", "sync.reference_rounds", "sync.outlier_", "sync.min_cosine",
    # How rounds are paced and late updates weighted: the coordinator tells workers in their assignment.
    "sync.round", "sync.min_steps", "sync.adaptive_steps", "sync.max_steps", "sync.max_staleness",
    "sync.staleness_exponent",
)
# A worker's seconds per step are the median of its last this many measured steps.
STEP_SAMPLES = 16
# run_state key of the reference norms' history (JSON: one list of accepted norms per recent round).
REFERENCE_NORMS_KEY = "reference_norms"
MAX_TOKENS_PER_UPDATE = 10**12
MAX_METRICS_PER_REQUEST = 10_000
STATUS_ROUNDS = 20
# Ended memberships GetStatus lists besides the active ones: the most recently ended.
STATUS_ENDED_WORKERS = 64
INT64_MAX = 2**63 - 1
# Inclusive upper bounds of a metric's integer fields (all must be >= 0). One row is one inner
# step, so its tokens stay far below an update's, and no SUM over rows can reach 2^63.
METRIC_LIMITS = {
    "version": 2**53, "step": 2**53, "seq_len": 2**31 - 1, "batch": 2**31 - 1, "tokens": 10**9,
    "bytes_sent": 2**53, "bytes_received": 2**53,
}
# A metric's durations: finite and >= 0. Its loss: finite, or NaN for a row without one.
METRIC_SECONDS = ("wall_time", "compute_seconds", "sync_seconds")
MAX_SHA256_HEX = 64
# Times a pull starts over when the full payload it picked was released by a later close before it was built.
PULL_ATTEMPTS = 3
# Bytes of a worker secret (secrets.token_bytes).
WORKER_SECRET_BYTES = 32

Payload = tuple[pb.TensorHeader, list[pb.TensorChunk]]

log = logging.getLogger("rcswarm.coordinator")


class Refusal(Exception):
    """A refused RPC: the status code and the message the caller sees."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class WorkerRecord:
    """One membership: a worker from its join until it leaves, is evicted or is reassigned."""

    worker_id: str
    name: str
    device: str
    joined_at: float
    last_seen: float
    # The version whose round this worker reports to next.
    base_version: int
    active: bool = True
    state: int = pb.WORKER_STATE_ACTIVE
    reason: str = ""
    last_loss: float = math.nan
    # Set for a worker of curriculum.worker_seq_lens: its own length, batch and why.
    assigned: curricula.Assignment | None = None
    # When the membership ended (left, evicted, reassigned); None while active.
    ended_at: float | None = None
    # The version current when its metric rows were last counted, and how many it reported then.
    metrics_version: int = -1
    metrics_in_round: int = 0
    # Its updates the aggregation flagged, and those refused for their norm or tokens.
    clipped_updates: int = 0
    dropped_updates: int = 0
    # Its updates refused as stale (trained from an older version, or for a closing round): lost work.
    stale_updates: int = 0
    # (version, flag) of its recent rounds, oldest first ("" = kept as sent); the latest flag's reason.
    recent: list[tuple[int, str]] = field(default_factory=list)
    outlier: str = ""
    # The round of its last accepted update (-1: none): a retry of that push is a duplicate, not stale.
    accepted_version: int = -1
    # SHA-256 of the worker secret its Join returned (the secret itself is never kept).
    secret_sha256: bytes = field(default=b"", repr=False)
    # The version it last pulled (-1: none): it trains from it, so a late update from it can be merged.
    pulled_version: int = -1
    # Its late updates merged with a staleness weight; tokens it trained on and tokens an outer step applied.
    late_updates: int = 0
    trained_tokens: int = 0
    applied_tokens: int = 0
    # Seconds of its recent inner steps, and its cumulative compute seconds at its last metric row.
    step_samples: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    last_compute: float | None = None

    def step_seconds(self) -> float | None:
        """Its measured seconds per inner step (the median of its recent steps), None before any."""
        return statistics.median(self.step_samples) if self.step_samples else None

    def measure(self, metric: pb.Metric) -> None:
        """Count a metric row's tokens and, for a training step, its compute seconds (lock held)."""
        self.trained_tokens += metric.tokens
        if metric.tokens > 0 and self.last_compute is not None and metric.compute_seconds >= self.last_compute:
            self.step_samples.append(metric.compute_seconds - self.last_compute)
        self.last_compute = metric.compute_seconds

    def owns(self, secret: bytes) -> bool:
        """Whether `secret` is this membership's worker secret (constant-time compare of the digests)."""
        return bool(self.secret_sha256) and hmac.compare_digest(hashlib.sha256(secret).digest(), self.secret_sha256)

    def view(self) -> decisions.WorkerView:
        return decisions.WorkerView(
            self.worker_id, self.last_seen, self.base_version, self.active, self.ended_at, bool(self.step_samples)
        )

    def outlier_view(self) -> decisions.OutlierView:
        return decisions.OutlierView(self.worker_id, self.active, tuple(self.recent))

    def note_round(self, version: int, flag: str, reason: str, window: int) -> None:
        """Remember how its update of round `version` fared, once per round (lock held)."""
        if flag == "dropped":
            self.dropped_updates += 1
        elif flag:
            self.clipped_updates += 1
        if flag:
            self.outlier = f"round {version}: {flag}: {reason}"
        if self.recent and self.recent[-1][0] == version:
            self.recent[-1] = (version, self.recent[-1][1] or flag)
        else:
            self.recent.append((version, flag))
        del self.recent[:-window]


@dataclass
class OpenRound:
    """The round of `version`: the updates reported to it so far."""

    version: int
    # When the first worker started on this version: the close of the previous round, or
    # the first pull after the coordinator (re)started. The round deadline counts from here.
    opened_at: float
    started: bool = False
    # worker_id -> its update: tokens, norm, decoded pseudo-gradient
    reports: dict[str, aggregation.Update] = field(default_factory=dict)
    # Set when its close began: `reports` no longer changes and a push for this version is stale.
    closing: bool = False
    # Updates for this version refused for their norm or tokens.
    dropped: int = 0
    # worker_id -> a late update merged into this round: tokens weighted by its staleness, and how it fared.
    late: dict[str, LateUpdate] = field(default_factory=dict)
    # A time-boxed round's budget in seconds (0: step-boxed).
    budget_s: float = 0.0
    # The most inner steps an on-time update reported (UpdateMeta.inner_steps, at most the round's step cap).
    steps: int = 0

    def view(self) -> decisions.RoundView:
        return decisions.RoundView(self.version, self.opened_at, frozenset(self.reports), self.budget_s)


@dataclass(frozen=True)
class LateUpdate:
    """A late update in the round it was merged into: the update with its weighted tokens, the tokens it
    trained on, and its staleness decision."""

    update: aggregation.Update
    tokens: int
    lateness: decisions.Lateness


@dataclass(frozen=True)
class RoundClose:
    """A close that began: what it reads, taken under `_lock` when the decision was made.

    θ and the momentum are replaced, never mutated, so holding them is a snapshot; the round's
    reports are frozen by `OpenRound.closing`; `saved_feedback` restores the broadcast residual
    if the close fails.
    """

    round: OpenRound
    reason: str
    decided_at: float
    params: outer.Tensors
    momentum: outer.Tensors
    saved_feedback: outer.Tensors
    # The reference norms' history (one tuple per recent round) and the previous aggregate (centered_clip).
    history: tuple[tuple[float, ...], ...] = ()
    previous: outer.Tensors | None = None
    # Buffers nobody reads any more, which the close writes its results into (`SpareBuffers`).
    spare: SpareBuffers | None = None


@dataclass(frozen=True)
class SpareBuffers:
    """Full-size tensors a published close left unread, for the next close to write into instead of fresh memory
    (the same values; a fresh page costs more than the arithmetic written into it).

    `momentum`: the momentum the close replaced (only closes read the momentum); the next close writes the new
    momentum into it. `residual`: the broadcast residual the close replaced (only the closing thread reads
    residuals; the failed-close snapshot is the newer one); the next close writes the aggregate into it, the
    outer step its target over the aggregate, and the compressed step the new residual over that. `params`:
    the θ the close replaced, which a full pull may still be reading through its `LazyPullPayload`; the next
    close releases that payload (a pull that finds it released pulls the current version) and decodes its
    compressed step into θ's buffers, which become θ_{v+2} after the step is subtracted.
    """

    momentum: outer.Tensors
    residual: outer.Tensors
    # θ the close replaced, and its pull payload, which the next close releases before writing into θ.
    params: outer.Tensors | None = None
    payload: LazyPullPayload | None = None

    def released_params(self) -> outer.Tensors | None:
        """θ's buffers once its pull payload no longer reads them (the closing thread; takes the payload's lock)."""
        if self.payload is None:
            return None
        self.payload.release()
        return self.params


@dataclass(frozen=True)
class ClosedRound:
    """What a close produced outside the lock, committed to the store and ready to publish."""

    params: outer.Tensors
    momentum: outer.Tensors
    param_sha256: bytes
    pull_payload: LazyPullPayload
    step_payload: Payload
    record: RoundRecord
    # Seconds per piece of the close, in the order they ran.
    seconds: dict[str, float]
    aggregate: aggregation.Aggregate
    history: tuple[tuple[float, ...], ...]
    # The hard norm bound for updates to the new version, and why.
    norm_bound: tuple[float, str]
    # worker_id -> tokens of its updates the outer step applied (the direction check's drops are not).
    applied: dict[str, int] = field(default_factory=dict)


class Stopwatch:
    """Seconds spent in named pieces of work, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def piece(self, name: str) -> Iterator[None]:
        """Time the body of a `with` block as `name`."""
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start


def metric_problem(index: int, metric: pb.Metric) -> str | None:
    """Why `metrics[index]` of a ReportMetrics request is out of range, or None when it is not."""
    for name, limit in METRIC_LIMITS.items():
        value = getattr(metric, name)
        if not 0 <= value <= limit:
            return f"metrics[{index}].{name} = {value} is out of range: expected 0..{limit}"
    for name in METRIC_SECONDS:
        value = getattr(metric, name)
        if not (math.isfinite(value) and value >= 0):
            return f"metrics[{index}].{name} = {value!r} is out of range: expected a finite number >= 0"
    if math.isinf(metric.loss):
        return f"metrics[{index}].loss = {metric.loss!r} is out of range: expected a finite number, or NaN for none"
    if len(metric.param_sha256) > MAX_SHA256_HEX:
        return f"metrics[{index}].param_sha256 has {len(metric.param_sha256)} characters: expected at most {MAX_SHA256_HEX}"
    return None


def require_secret(what: str, worker_id: str, secret: bytes) -> None:
    """Refuse a worker's call that carries no worker secret (UNAUTHENTICATED), before anything else."""
    if not secret:
        raise Refusal(grpc.StatusCode.UNAUTHENTICATED, f"{what} for worker {worker_id!r} carries no worker secret; join first")


def pull_payload(params: outer.Tensors, run_id: str, version: int, sha256: bytes) -> Payload:
    """The fp32 payload of the full θ of `version` (no lock: a pure function of its inputs)."""
    return tensor_stream.build_payload(params, codec=pb.CODEC_FP32, run_id=run_id, version=version, content_sha256=sha256)


class LazyPullPayload:
    """The fp32 pull payload of one version's θ, built by its first full pull and then kept.

    Up-to-date workers pull the compressed step, so a close does not build it. Threads: any
    handler thread calls `get`, which takes this object's own `_lock` (never the coordinator's
    `_lock`; it is called without that one held), so concurrent first pulls build it once and the
    others wait for it. θ is replaced, not mutated, while it is current or one version old, so holding
    `params` is a snapshot until the closing thread `release`s this payload to reuse θ's buffers
    (`SpareBuffers`).
    """

    def __init__(self, params: outer.Tensors, run_id: str, version: int, sha256: bytes) -> None:
        """Keep what `pull_payload` needs; build nothing yet."""
        self._lock = threading.Lock()
        self._inputs: tuple[outer.Tensors, str, int, bytes] | None = (params, run_id, version, sha256)
        self._payload: Payload | None = None
        # Seconds the build took, None until it ran (for logs and benchmarks).
        self.build_seconds: float | None = None

    def get(self) -> Payload | None:
        """The header and chunks, building them on the first call (takes this object's `_lock`); None when the
        payload was released before anything built it (its θ is being overwritten: pull the current version)."""
        with self._lock:
            if self._payload is None and self._inputs is not None:
                started = time.perf_counter()
                self._payload = pull_payload(*self._inputs)
                self.build_seconds = time.perf_counter() - started
            return self._payload

    def release(self) -> None:
        """Stop reading θ (takes this object's `_lock`, so a build under way finishes first): a payload built keeps
        serving its chunks, one never built is never built (`get` answers None). θ's buffers are then free."""
        with self._lock:
            self._inputs = None


def late_summary(late: list[LateUpdate]) -> str:
    """The close reason's note on the late updates merged into the round ("" for none)."""
    if not late:
        return ""
    each = ", ".join(f"{item.update.worker_id} stale by {item.lateness.staleness} (weight {item.lateness.weight:.3f})"
                     for item in late)
    return f"; merged {len(late)} late update{'s' if len(late) != 1 else ''}: {each}"


def applied_tokens(
    updates: list[aggregation.Update], trained: list[int], outcomes: tuple[aggregation.Outcome, ...]
) -> dict[str, int]:
    """worker_id -> the trained tokens of its updates the aggregate used: all but those the direction
    check dropped (matched by worker and norm, since a worker may have an on-time and a late update)."""
    dropped = [(o.worker_id, o.norm) for o in outcomes if o.action == "dropped"]
    applied: dict[str, int] = {}
    for update, tokens in zip(updates, trained):
        key = (update.worker_id, update.norm)
        if key in dropped:
            dropped.remove(key)
            continue
        applied[update.worker_id] = applied.get(update.worker_id, 0) + tokens
    return applied


def spec_differences(old: RunSpec, new: RunSpec) -> list[str]:
    """Dotted keys whose values differ between two specs."""
    old_d, new_d = old.to_dict(), new.to_dict()
    return sorted(
        f"{table}.{key}"
        for table in old_d
        for key in set(old_d[table]) | set(new_d[table])
        if old_d[table].get(key) != new_d[table].get(key)
    )


def initial_parameters(spec: RunSpec) -> dict[str, torch.Tensor]:
    """The model's parameters at the run's seed, float32, in the model's order."""
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides, seed=spec.run.seed)
    return {name: p.detach().to(torch.float32).contiguous().clone() for name, p in model.named_parameters()}


def first_part(requests: Iterator[pb.PushUpdateRequest], part: str) -> pb.PushUpdateRequest:
    """The next message of a PushUpdate stream, which must carry `part`; refused otherwise."""
    message = next(requests, None)
    if message is None or message.WhichOneof("part") != part:
        found = None if message is None else message.WhichOneof("part")
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"PushUpdate stream: expected a {part} message, got {found}")
    return message


class SwarmCoordinator:
    """One run's coordinator: membership, the open round, θ, the outer momentum and the version.

    Threads. gRPC handler threads, many at once, call the RPC methods (`join`, `heartbeat`,
    `leave`, `pull`, `await_version`, `push`, `report_metrics`, `status`); the server's ticker
    thread calls `tick`; a `RunGroup` (sweep.py) also calls `knows`, `active_workers`, `reassign`
    and `summary` from handler threads. The constructor runs before any of them.

    Locks. One lock, `_lock`, guards all mutable state: the membership table, the open round,
    θ, the momentum, the version and its pull payloads, `peer_version`, the run's totals, the curriculum
    tracker, the aggregation's memory (`_norm_history`, `_previous_average`, `_norm_bound`) and the
    buffers the last close left for the next (`_spare`); `_decode_scratch` belongs to the closing
    thread. `_version_changed` is a condition on that same lock: `await_version` waits on it
    (which releases the lock while it waits) and publishing a new version notifies every waiter.
    The lock is not reentrant: a public method takes it itself and must be called without it
    held; a private method documented "lock held" must be called with it held. What needs no
    shared state runs outside it: reading a PushUpdate stream and decoding and validating its
    payload, checking metric values, streaming pull chunks, writing metric rows, reading closed
    rounds from the store.

    Membership. `workers` holds every membership still in memory, `_active` the active ones (all
    that admission, eviction and round closing look at) and `_ended` the ended ones in the order
    they ended; `tick` forgets those ended longer than `coordinator.forget_after_s` ago.

    Closing a round never holds `_lock` for its heavy work. Whichever call makes the close due
    (`push`, `leave`, `tick`, `reassign`) decides it under the lock (`_begin_close`: it freezes the
    round's reports and sets `_closing`), releases the lock, computes the average, the outer step,
    the compressed step, the digest and the payloads and commits the checkpoint and the SQLite
    row (`_compute_close`), then takes the lock again to publish the new version atomically and
    wake the waiters (`_publish_close`). `_closing` (read and written under `_lock`) makes it one
    close at a time: while it is set the closing thread alone may change θ, the momentum, the
    version and `broadcast_feedback`; a push for the closing version waits for the new version and is
    merged late (with `sync.max_staleness` = 0 it is stale at once); a pull waits for the
    new version (at most `coordinator.max_wait_s`); heartbeats, joins, leaves, long polls, metrics
    and status go on. A failed close restores the broadcast residual, reopens the round and wakes
    the waiters, so the next tick retries it. A close writes its results into what the close before
    left unread (`SpareBuffers`: the momentum, residual and θ of two versions back, θ once its pull
    payload is released, and a pull that finds its payload released starts over). The store
    has its own lock and is called with or without this one; a `RunGroup` takes its lock before a
    run's, never the other way round.
    """

    def __init__(
        self, spec: RunSpec, store: StateStore, clock: Callable[[], float] = time.time, worker_prefix: str = ""
    ) -> None:
        """Resume the run committed in `store`, or start it at version 0; the caller then serves it."""
        self.spec = spec
        self.worker_prefix = worker_prefix
        self.store = store
        self.clock = clock
        self._lock = threading.Lock()
        self._version_changed = threading.Condition(self._lock)
        self.membership = decisions.MembershipOptions(
            spec.coordinator.lease_s, spec.coordinator.max_workers, spec.coordinator.forget_after_s
        )
        self.metrics_per_round = spec.metric_rows_per_round()
        sync = spec.sync
        self.round_options = decisions.RoundOptions(
            sync.round_deadline_s, sync.min_reports, sync.max_staleness, sync.round == "steps" and sync.adaptive_steps
        )
        self.pace_options = decisions.PaceOptions(
            sync.round, spec.inner.steps, sync.step_cap(spec.inner.steps), sync.round_seconds, sync.min_steps,
            sync.adaptive_steps,
        )
        self.staleness = decisions.StalenessOptions(sync.max_staleness, sync.staleness_exponent)
        # How much each worker trains from the current version; decided again at each close and metric report.
        self.pace = decisions.decide_pace({}, self.pace_options)
        self.codec = codecs.codec_from_name(spec.sync.codec)
        self.broadcast_feedback = codecs.ErrorFeedback()
        # (from_version, header, chunks) of the compressed step to the current version.
        self._delta_payload: tuple[int, pb.TensorHeader, list[pb.TensorChunk]] | None = None
        self._load_or_create()
        self.shapes = {name: tuple(t.shape) for name, t in self.params.items()}
        self.aggregation_options = aggregation.AggregationOptions.from_sync(spec.sync)
        self.outliers = decisions.OutlierOptions(spec.sync.outlier_evict_after, spec.sync.outlier_window)
        self._norm_history = self._load_norm_history()
        # The previous round's aggregate: centered_clip's starting point (None after a start).
        self._previous_average: outer.Tensors | None = None
        self._norm_bound = self._update_norm_bound(self.params)
        # Every membership still in memory, in join order; the active ones; the ended ones in the order they ended.
        self.workers: dict[str, WorkerRecord] = {}
        self._active: dict[str, WorkerRecord] = {}
        self._ended: dict[str, WorkerRecord] = {}
        self._joins = 0
        self.round = OpenRound(self.version, self.clock(), budget_s=self.pace.round_seconds)
        self._closing: RoundClose | None = None
        # What the last published close left unread (the closing thread writes into it; None before one).
        self._spare: SpareBuffers | None = None
        # Scratch buffers held updates decode into during a close (`aggregation.decoding_into`; the closing
        # thread alone uses them, one close at a time).
        self._decode_scratch: list[torch.Tensor] = []
        # Seconds per piece of the last close (see ClosedRound.seconds), for logs and benchmarks.
        self.last_close_seconds: dict[str, float] = {}
        # Tokens reported to this process, and when it first served a pull: the live tokens/s.
        self.total_tokens = 0
        # sync.backend = "hivemind": the newest version workers report holding (they average peer to peer;
        # this coordinator closes no rounds and holds no tensors of theirs); `shown_version` reads it, and its
        # growth takes the curriculum steps of the swarm's rounds (`_follow_peer_rounds`).
        self.peer_version = 0
        # Tokens of the updates the outer steps of this process applied.
        self.applied_tokens = 0
        self._serving_since: float | None = None
        self.tracker = curricula.CurriculumTracker(spec, store)
        self.param_sha256 = tensor_stream.params_sha256(self.params)
        self._pull_payload = LazyPullPayload(self.params, self.run_id, self.version, self.param_sha256)

    @property
    def curriculum(self) -> curricula.CurriculumState:
        """The curriculum's persisted state (any thread; a snapshot, immutable)."""
        return self.tracker.state

    def _load_or_create(self) -> None:
        """Constructor only: θ, momentum and version from the last committed checkpoint, or a new run."""
        checkpoint = self.store.load_current()
        if checkpoint is None:
            self.run_id = f"{self.spec.run.name}-{secrets.token_hex(4)}"
            self.params = initial_parameters(self.spec)
            self.momentum = {k: torch.zeros_like(v) for k, v in self.params.items()}
            self.version = 0
            self.store.set_many({"spec_json": self.spec.to_json(), "param_names": json.dumps(list(self.params))})
            self.store.commit_version(self.run_id, 0, self.params, self._optimizer_state(self.momentum), None)
            return
        stored = RunSpec.from_json(self.store.get("spec_json") or "{}")
        changed = [k for k in spec_differences(stored, self.spec) if not k.startswith(RESTART_MUTABLE)]
        if changed:
            raise ValueError(
                f"state dir {self.store.state_dir} holds a run whose spec differs in {changed}; "
                "use a new state dir or the original config"
            )
        self.store.set_many({"spec_json": self.spec.to_json()})
        self.run_id = self.store.get("run_id") or ""
        names = json.loads(self.store.get("param_names") or "[]")
        momentum = checkpoint.state.get("outer_momentum", {})
        if sorted(names) != sorted(checkpoint.params) or sorted(names) != sorted(momentum):
            raise RuntimeError(f"checkpoint of version {checkpoint.version} in {self.store.state_dir} does not hold the run's parameters")
        # safetensors files do not keep insertion order; the wire order is the model's.
        self.params = {name: checkpoint.params[name] for name in names}
        self.momentum = {name: momentum[name] for name in names}
        self.broadcast_feedback.restore(checkpoint.state.get("broadcast_residual", {}))
        self.version = checkpoint.version

    def _load_norm_history(self) -> tuple[tuple[float, ...], ...]:
        """Constructor only: the reference norms of the last `sync.reference_rounds` rounds, as stored."""
        stored = json.loads(self.store.get(REFERENCE_NORMS_KEY) or "[]")
        history = tuple(tuple(float(n) for n in norms) for norms in stored if isinstance(norms, list))
        return history[len(history) - self.spec.sync.reference_rounds:] if self.spec.sync.reference_rounds else ()

    def _update_norm_bound(self, params: outer.Tensors) -> tuple[float, str]:
        """The hard bound on an update's norm trained from `params`, and why (no lock: pure)."""
        configured = self.spec.sync.max_update_norm
        if configured > 0:
            return configured, f"sync.max_update_norm = {configured:.4g}"
        # A bound needs no float64 sum: float32 norms per tensor, without full-size temporaries.
        norm = math.sqrt(sum(float(torch.linalg.vector_norm(t)) ** 2 for t in params.values()))
        parameters = sum(t.numel() for t in params.values())
        bound, why = aggregation.automatic_norm_bound(self.spec.inner, parameters, norm)
        return bound, f"the automatic sync.max_update_norm {why}"

    def _optimizer_state(self, momentum: outer.Tensors) -> dict[str, outer.Tensors]:
        """The outer optimizer's tensors to checkpoint with `momentum` (the closing thread, or the constructor)."""
        state = {"outer_momentum": momentum}
        residual = self.broadcast_feedback.snapshot()
        if residual and self.codec != pb.CODEC_FP32:
            state["broadcast_residual"] = residual
        return state

    @property
    def closing(self) -> bool:
        """Whether a round close is under way (any thread, without the lock: a snapshot that may be stale)."""
        return self._closing is not None

    @property
    def shown_version(self) -> int:
        """The run's version: this coordinator's, or with sync.backend = "hivemind" the newest its workers report."""
        return self.peer_version if self.spec.sync.backend == "hivemind" else self.version

    @property
    def finished(self) -> bool:
        """Whether the run committed its last round (any thread, with or without the lock)."""
        return self.spec.run.rounds > 0 and self.shown_version >= self.spec.run.rounds

    def _run_state(self) -> int:
        """The run's state for a reply (lock held)."""
        return pb.RUN_STATE_FINISHED if self.finished else pb.RUN_STATE_RUNNING

    def _member(self, worker_id: str) -> WorkerRecord:
        """The active membership of `worker_id` (lock held); NOT_FOUND otherwise."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is unknown here; join again")
        if not worker.active:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is no longer a member ({worker.reason}); join again")
        return worker

    def _authenticated(self, what: str, worker_id: str, secret: bytes) -> WorkerRecord:
        """The active membership of `worker_id` when `secret` is its own (lock held; changes nothing).
        UNAUTHENTICATED without a secret, NOT_FOUND for an id that is not a member, PERMISSION_DENIED
        (logged with the id, never the secret) for another worker's or a made-up secret."""
        require_secret(what, worker_id, secret)
        return self._owned(what, self._member(worker_id), secret)

    def _owned(self, what: str, worker: WorkerRecord, secret: bytes) -> WorkerRecord:
        """`worker` if `secret` is its worker secret; PERMISSION_DENIED otherwise (lock held)."""
        if not worker.owns(secret):
            log.warning("refused %s for worker %s (%s): the worker secret is not its own", what, worker.worker_id, worker.name)
            raise Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what} refused: the worker secret is not the one worker {worker.worker_id!r} got at its join",
            )
        return worker

    def _assignment(self, worker: WorkerRecord) -> pb.TrainingAssignment:
        """What `worker` trains from the current version, with its pace (lock held)."""
        assignment = self.tracker.assignment(self.shown_version, worker.assigned)
        assignment.inner_steps = self.pace.steps_for(worker.worker_id)
        assignment.round_seconds = self.pace.round_seconds
        return assignment

    def _decide_pace(self) -> None:
        """Decide the pace again from the active workers' step times; a time-boxed open round keeps the
        longest budget it was given (lock held)."""
        measured = {w.worker_id: w.step_seconds() for w in self._active.values()}
        self.pace = decisions.decide_pace({k: v for k, v in measured.items() if v is not None}, self.pace_options)
        if self.pace.round_seconds > self.round.budget_s:
            self.round.budget_s = self.pace.round_seconds

    def join(self, request: pb.JoinRequest) -> pb.JoinResponse:
        """Admit a worker and return its new worker secret, keeping only the secret's SHA-256 (handler
        thread; takes `_lock`)."""
        with self._lock:
            now = self.clock()
            decision = decisions.decide_admission(now, self._active_views(), self.finished, self.membership)
            if not decision.ok:
                code = grpc.StatusCode.FAILED_PRECONDITION if self.finished else grpc.StatusCode.RESOURCE_EXHAUSTED
                raise Refusal(code, f"join refused: {decision.reason}")
            self._joins += 1
            worker_id = f"{self.worker_prefix}w{self._joins}-{secrets.token_hex(4)}"
            name = request.worker_name[:128] or worker_id
            secret = secrets.token_bytes(WORKER_SECRET_BYTES)
            worker = WorkerRecord(
                worker_id, name, request.device[:64], now, now, self.version, secret_sha256=hashlib.sha256(secret).digest()
            )
            active = [w.assigned.seq_len for w in self._active.values() if w.assigned is not None]
            worker.assigned = self.tracker.assign_worker(worker_id, active, now)
            self.workers[worker_id] = self._active[worker_id] = worker
            self.store.add_event(worker_id, "join", f"{name}: {decision.reason}", now)
            log.info("join: %s (%s) as %s at version %d: %s", name, worker.device, worker_id, self.version, decision.reason)
            return pb.JoinResponse(
                worker_id=worker_id, run_id=self.run_id, run_spec_json=self.spec.to_json(), version=self.version,
                lease_seconds=self.membership.lease_s, data_seed=self._joins, assignment=self._assignment(worker),
                worker_secret=secret,
            )

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        """Renew a lease (handler thread; takes `_lock`)."""
        with self._lock:
            worker = self._authenticated("Heartbeat", request.worker_id, request.worker_secret)
            worker.last_seen = self.clock()
            return pb.HeartbeatResponse(
                version=self.version, run_state=self._run_state(), lease_seconds=self.membership.lease_s,
                assignment=self._assignment(worker),
            )

    def leave(self, request: pb.LeaveRequest) -> pb.LeaveResponse:
        """End a membership at once; may close the round (handler thread; takes `_lock`)."""
        with self._lock:
            worker = self._authenticated("Leave", request.worker_id, request.worker_secret)
            self._end_membership(worker, pb.WORKER_STATE_LEFT, "leave", f"left: {request.reason[:200] or 'no reason given'}")
            close = self._begin_close()
        self._finish_close(close)
        return pb.LeaveResponse()

    def _end_membership(self, worker: WorkerRecord, state: int, kind: str, reason: str, now: float | None = None) -> None:
        """End an active membership: record, event row, log line (lock held)."""
        now = self.clock() if now is None else now
        worker.active, worker.state, worker.reason, worker.ended_at = False, state, reason, now
        del self._active[worker.worker_id]
        self._ended[worker.worker_id] = worker
        self.store.add_event(worker.worker_id, kind, reason, now)
        log.info("%s: %s (%s) at version %d: %s", kind, worker.worker_id, worker.name, self.version, reason)

    def _active_views(self) -> list[decisions.WorkerView]:
        """Views of the active memberships, the only ones admission, eviction and round closing count (lock held)."""
        return [w.view() for w in self._active.values()]

    def pull(self, request: pb.PullParametersRequest) -> Iterator[pb.PullParametersResponse]:
        """The current θ, or the step to it (handler thread). A generator: it takes `_lock` when first
        iterated, waits on `_version_changed` (releasing the lock) while a round closes, at most
        `coordinator.max_wait_s`, so that a worker does not train from the version being replaced, picks the
        payload of the current version, and yields its chunks after releasing the lock. The full fp32 payload
        is built by the version's first full pull, after releasing the lock (`LazyPullPayload`); when the next
        close released it before it was built, the pull starts over at the then current version."""
        for _ in range(PULL_ATTEMPTS):
            full, header, chunks = self._pick_payload(request)
            payload = None if full is None else full.get()
            if full is None or payload is not None:
                break
        else:
            raise Refusal(grpc.StatusCode.UNAVAILABLE,
                          f"version {self.version} changed {PULL_ATTEMPTS} times while the pull read it; pull again")
        if payload is not None:
            header, chunks = payload
        yield pb.PullParametersResponse(header=header)
        for chunk in chunks:
            yield pb.PullParametersResponse(chunk=chunk)

    def _pick_payload(
        self, request: pb.PullParametersRequest
    ) -> tuple[LazyPullPayload | None, pb.TensorHeader | None, list[pb.TensorChunk]]:
        """For `pull` (takes `_lock`): the current version's full payload, or the compressed step's header and
        chunks when the worker holds the version before."""
        with self._lock:
            self._authenticated("PullParameters", request.worker_id, request.worker_secret)
            self._wait_for_close(self.spec.coordinator.max_wait_s)
            worker = self._authenticated("PullParameters", request.worker_id, request.worker_secret)
            if request.version not in (0, self.version):
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"version {request.version} is not served; the newest is {self.version}",
                )
            worker.last_seen = self.clock()
            worker.base_version = worker.pulled_version = self.version
            if not self.round.started:
                self.round.opened_at, self.round.started = worker.last_seen, True
            if self._serving_since is None:
                self._serving_since = worker.last_seen
            self.tracker.start(worker.last_seen)
            delta = self._delta_payload
            if delta is not None and request.HasField("have_version") and request.have_version == delta[0]:
                return None, delta[1], delta[2]
            return self._pull_payload, None, []

    def _wait_for_close(self, limit_s: float) -> None:
        """While a close runs, wait for its publication (or failure), at most `limit_s` (lock held; waiting
        on `_version_changed` releases it)."""
        deadline = time.monotonic() + limit_s
        while self._closing is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._version_changed.wait(timeout=left)

    def await_version(self, request: pb.AwaitVersionRequest, time_remaining: float) -> pb.AwaitVersionResponse:
        """Long poll until the version reaches `min_version` (handler thread; takes `_lock` and waits on
        `_version_changed`, which releases it while waiting), at most `coordinator.max_wait_s`."""
        wait_s = min(max(request.wait_ms, 0) / 1000.0, self.spec.coordinator.max_wait_s, max(time_remaining - 0.2, 0.0))
        deadline = time.monotonic() + wait_s
        with self._lock:
            worker = self._authenticated("AwaitVersion", request.worker_id, request.worker_secret)
            worker.last_seen = self.clock()
            while self.version < request.min_version and not self.finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._version_changed.wait(timeout=left)
            return pb.AwaitVersionResponse(version=self.version, run_state=self._run_state(), assignment=self._assignment(worker))

    def push(self, requests: Iterator[pb.PushUpdateRequest]) -> pb.PushUpdateResponse:
        """Record a worker's update; may close the round (handler thread). Takes `_lock` to check the
        meta (the worker secret first, before any payload is read), releases it to read and validate the
        payload, and takes it again to check both once more and record the update, on time or late. While
        a close of its round runs it waits on `_version_changed` (releasing the lock), at most
        `coordinator.max_wait_s`."""
        meta = first_part(requests, "meta").meta
        with self._lock:
            self._check_update_meta(self._authenticated("PushUpdate", meta.worker_id, meta.worker_secret), meta)
            bound, why = self._norm_bound
        header = first_part(requests, "header").header
        deltas, norm = self._receive_update(header, requests, meta.base_version)
        with self._lock:
            worker = self._authenticated("PushUpdate", meta.worker_id, meta.worker_secret)
            lateness = self._check_update_meta(worker, meta)
            if norm > bound:
                self._refuse_outlier(worker, f"update rejected: global L2 norm {norm:.4g} exceeds {why}")
            self._record_update(worker, meta, lateness, norm, deltas)
            reports = len(self.round.reports) + len(self.round.late)
            round_version = self.round.version
            close = self._begin_close()
        self._finish_close(close)
        return pb.PushUpdateResponse(
            accepted=True, round_version=round_version, reports=reports, staleness=lateness.staleness,
            staleness_weight=lateness.weight,
        )

    def _record_update(
        self, worker: WorkerRecord, meta: pb.UpdateMeta, lateness: decisions.Lateness, norm: float,
        deltas: dict[str, torch.Tensor],
    ) -> None:
        """Put an accepted update into the open round: on time among its reports, late (its tokens
        weighted by the staleness weight, at least 1) among its late updates (lock held)."""
        if lateness.staleness == 0:
            self.round.reports[worker.worker_id] = aggregation.Update(worker.worker_id, meta.tokens, norm, deltas)
            worker.base_version = self.version + 1
            cap = self.spec.sync.step_cap(self.spec.inner.steps)
            self.round.steps = max(self.round.steps, min(meta.inner_steps, cap))
        else:
            weighted = max(1, round(meta.tokens * lateness.weight))
            update = aggregation.Update(worker.worker_id, weighted, norm, deltas)
            self.round.late[worker.worker_id] = LateUpdate(update, meta.tokens, lateness)
            worker.late_updates += 1
            # It trains from the version it pulls next; until then this round does not wait for it.
            if worker.pulled_version < self.version:
                worker.base_version = self.version + 1
            self.store.add_event(worker.worker_id, "late", lateness.reason, self.clock())
            log.info("%s (%s): %s", worker.worker_id, worker.name, lateness.reason)
        worker.accepted_version = meta.base_version
        worker.last_seen = self.clock()

    def _refuse_stale(self, worker: WorkerRecord, message: str) -> NoReturn:
        """Count and record a stale update of `worker`, then refuse it with FAILED_PRECONDITION (lock held)."""
        worker.stale_updates += 1
        self.store.add_event(worker.worker_id, "stale", message, self.clock())
        log.info("%s (%s): %s", worker.worker_id, worker.name, message)
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _check_update_meta(self, worker: WorkerRecord, meta: pb.UpdateMeta) -> decisions.Lateness:
        """Refuse a stale, future, duplicate or out-of-range update, or one claiming more tokens than its
        assignment allows; else whether it is on time or late and its weight (lock held; may wait for a
        close, releasing it). A worker's update for a round it already delivered to is a
        duplicate (ALREADY_EXISTS: "it landed") even once that round closed: a push whose answer was
        lost is retried, and "stale" would make the worker keep the error-feedback residual it sent.
        A push for a closing round waits for the close (at most coordinator.max_wait_s) when late
        updates are merged, and then arrives late."""
        if meta.base_version == worker.accepted_version:
            raise Refusal(grpc.StatusCode.ALREADY_EXISTS,
                          f"worker {worker.worker_id} already delivered its update for round {meta.base_version}")
        if meta.base_version > self.version:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"update for version {meta.base_version} which does not exist yet (newest {self.version})",
            )
        if self.round.closing and self.staleness.max_staleness > 0:
            self._wait_for_close(self.spec.coordinator.max_wait_s)
            self._member(worker.worker_id)
        if self.finished and meta.base_version < self.version:
            self._refuse_stale(worker, f"stale update: trained from version {meta.base_version} but the run "
                                       f"finished at version {self.version}")
        lateness = decisions.decide_staleness(meta.base_version, self.version, worker.pulled_version, self.staleness)
        if not lateness.ok:
            worker.base_version = max(worker.base_version, self.version)
            self._refuse_stale(worker, lateness.reason)
        if self.round.closing:
            self._refuse_stale(worker, f"stale update: round {self.version} is closing; pull version "
                                       f"{self.version + 1} once it is served")
        if not 0 < meta.tokens <= MAX_TOKENS_PER_UPDATE:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"tokens = {meta.tokens}: expected 1..{MAX_TOKENS_PER_UPDATE}")
        if self.spec.sync.bound_tokens:
            allowed, why = self._token_bound()
            if meta.tokens > allowed:
                self._refuse_outlier(worker, f"tokens = {meta.tokens} exceed the {allowed} allowed: {why}")
        return lateness

    def _token_bound(self) -> tuple[int, str]:
        """The most tokens an update to the current version may claim, and why (lock held).

        batch × seq_len × steps of the assignment workers train under at this version (steps: inner.steps,
        or sync.max_steps for time-boxed rounds, `SyncSection.step_cap`); with curriculum.worker_seq_lens
        the largest listed one's, because a worker that joins again mid-round pushes the update it trained
        under its previous membership's length.
        """
        steps, data, section = self.spec.sync.step_cap(self.spec.inner.steps), self.spec.data, self.spec.curriculum
        if section.worker_seq_lens:
            options = [(length, section.batch_for(length, data.batch_size)) for length in section.worker_seq_lens]
            seq_len, batch = max(options, key=lambda option: option[0] * option[1])
            where = "the largest assignment of curriculum.worker_seq_lens"
        else:
            current = self.tracker.run_assignment(self.version)
            seq_len, batch = current.seq_len, current.batch_size
            where = f"the assignment at version {self.version}"
        diag = ' (data.source = "diag": data.seq_len bounds the scored positions of a sequence)' if data.source == "diag" else ""
        cap = "inner.steps" if self.spec.sync.round == "steps" else "sync.max_steps"
        return batch * seq_len * steps, (
            f"batch {batch} × seq_len {seq_len} × {cap} {steps} of {where}{diag}; sync.bound_tokens = true"
        )

    def _refuse_outlier(self, worker: WorkerRecord, message: str) -> None:
        """Record an update refused for its norm or tokens (a `dropped` event, the round's and the worker's
        counts, once per worker and round) and raise its INVALID_ARGUMENT refusal (lock held)."""
        version = self.version
        first = not (worker.recent and worker.recent[-1] == (version, "dropped"))
        if first:
            worker.note_round(version, "dropped", message, self.outliers.window)
            self.round.dropped += 1
            self.store.add_event(worker.worker_id, "dropped", f"round {version}: {message}", self.clock())
            log.warning("round %d: update of %s dropped: %s", version, worker.worker_id, message)
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, message)

    def _receive_update(
        self, header: pb.TensorHeader, requests: Iterator[pb.PushUpdateRequest], version: int
    ) -> tuple[aggregation.EncodedDeltas, float]:
        """Reassemble and validate a pseudo-gradient; it, held encoded until the close, and its global L2 norm
        (without the lock: nothing here touches shared state)."""
        try:
            receiver = tensor_stream.PayloadReceiver(header, expected=self.shapes, run_id=self.run_id, version=version)
            for message in requests:
                if message.WhichOneof("part") != "chunk":
                    raise tensor_stream.PayloadError(f"expected a chunk message, got {message.WhichOneof('part')}")
                receiver.add(message.chunk)
            deltas, payload = receiver.finish_encoded()
            tensor_stream.check_finite(deltas)
        except tensor_stream.PayloadError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"update rejected: {exc}") from None
        return aggregation.EncodedDeltas(header, payload), tensor_stream.global_norm(deltas)

    def report_metrics(self, request: pb.ReportMetricsRequest) -> pb.ReportMetricsResponse:
        """Store a batch of metrics, all or none (handler thread). Takes `_lock` to check the worker and its
        secret, checks the values without it (so only a member makes the coordinator read a large batch),
        takes it again for the membership, the per-round cap, the totals and the curriculum's measurements
        (with sync.backend = "hivemind" also the curriculum steps of the rounds the swarm closed since the last
        report, `_follow_peer_rounds`), and writes the rows after releasing it."""
        require_secret("ReportMetrics", request.worker_id, request.worker_secret)
        with self._lock:
            self._reporter(request.worker_id, request.worker_secret)
        if len(request.metrics) > MAX_METRICS_PER_REQUEST:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"{len(request.metrics)} metrics in one request: at most {MAX_METRICS_PER_REQUEST}")
        for index, metric in enumerate(request.metrics):
            problem = metric_problem(index, metric)
            if problem is not None:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"metrics refused: {problem}")
        now = self.clock()
        # Training past a finite run's last round (a worker that pulled the final version before it heard the
        # run finished) belongs to no round: those rows are not kept, and `stored` says how many were.
        last = self.spec.run.rounds
        metrics = [m for m in request.metrics if not (last > 0 and m.version >= last and m.tokens > 0)]
        with self._lock:
            worker = self._reporter(request.worker_id, request.worker_secret)
            self._count_metric_rows(worker, len(request.metrics))
            reported = self.peer_version
            for metric in metrics:
                self.peer_version = max(self.peer_version, metric.version)
                self.total_tokens += metric.tokens
                if math.isfinite(metric.loss) and metric.tokens > 0:
                    worker.last_loss = metric.loss
                self.tracker.measure(request.worker_id, metric)
                worker.measure(metric)
            if worker.active:
                self._decide_pace()
            if self.spec.sync.backend == "hivemind" and self.peer_version > reported:
                self._follow_peer_rounds(now, reported)
        rows = (
            (self.run_id, request.worker_id, m.version, m.step, m.seq_len, m.batch, m.loss, m.tokens, m.wall_time,
             m.compute_seconds, m.sync_seconds, m.bytes_sent, m.bytes_received, m.param_sha256, now)
            for m in metrics
        )
        return pb.ReportMetricsResponse(stored=self.store.add_metrics(rows))

    def _follow_peer_rounds(self, now: float, reported: int) -> None:
        """sync.backend = "hivemind": the workers' reported version grew from `reported` to `peer_version`, so the
        swarm closed rounds `reported` .. `peer_version` − 1 peer to peer; take the curriculum step a round close
        takes (`_publish_close`) for each round not decided yet (`CurriculumTracker.advance_through`), with the
        measurements of the rows just counted. The budget's clock starts at the first report (there is no pull).
        A failed step is logged and L stays (lock held)."""
        first = max(reported, self.tracker.state.decided_version + 1)
        if first >= self.peer_version:
            return
        try:
            self.tracker.start(now)
            self.tracker.advance_through(now, first, self.peer_version - 1)
        except Exception:
            log.exception("rounds %d..%d of the hivemind swarm: the curriculum decision failed; L stays", first,
                          self.peer_version - 1)

    def _reporter(self, worker_id: str, secret: bytes) -> WorkerRecord:
        """The worker whose metrics are accepted (lock held): an active member, or one a sweep moved to another
        run (its rows of this run still belong here), either with its own worker secret (`_authenticated`);
        NOT_FOUND for an unknown, left or evicted worker."""
        worker = self.workers.get(worker_id)
        if worker is not None and worker.state == pb.WORKER_STATE_REASSIGNED:
            return self._owned("ReportMetrics", worker, secret)
        return self._authenticated("ReportMetrics", worker_id, secret)

    def _count_metric_rows(self, worker: WorkerRecord, rows: int) -> None:
        """Count `rows` against the worker's cap for the current version, or refuse them all (lock held)."""
        if worker.metrics_version != self.shown_version:
            worker.metrics_version, worker.metrics_in_round = self.shown_version, 0
        if worker.metrics_in_round + rows > self.metrics_per_round:
            raise Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"worker {worker.worker_id} reported {worker.metrics_in_round} metric rows at version {self.version}; "
                f"{rows} more exceed coordinator.max_metrics_per_round = {self.metrics_per_round}",
            )
        worker.metrics_in_round += rows

    def status(self) -> pb.GetStatusResponse:
        """The run's GetStatus reply (handler thread, the dashboard's thread; takes `_lock` for the live
        state, reads the closed rounds from the store after releasing it)."""
        with self._lock:
            now = self.clock()
            losses = [w.last_loss for w in self.workers.values() if math.isfinite(w.last_loss)]
            elapsed = now - self._serving_since if self._serving_since is not None else 0.0
            response = pb.GetStatusResponse(
                run_id=self.run_id, version=self.shown_version, run_state=self._run_state(), target_rounds=self.spec.run.rounds,
                latest_loss=sum(losses) / len(losses) if losses else math.nan,
                tokens_per_second=self.total_tokens / elapsed if elapsed > 0 else 0.0,
                param_sha256=self.param_sha256.hex(), total_tokens=min(self.total_tokens, INT64_MAX),
                curriculum=self.tracker.status(now, self.shown_version), applied_tokens=min(self.applied_tokens, INT64_MAX),
                pace=self.pace.reason,
            )
            for w in self._listed_workers():
                response.workers.add(
                    worker_id=w.worker_id, name=w.name, state=w.state, base_version=w.base_version,
                    seconds_since_heartbeat=now - w.last_seen, device=w.device, reason=w.reason,
                    assignment=self._assignment(w), clipped_updates=w.clipped_updates, stale_updates=w.stale_updates,
                    dropped_updates=w.dropped_updates, outlier_rounds=sum(1 for _, flag in w.recent if flag),
                    outlier=w.outlier, late_updates=w.late_updates, trained_tokens=min(w.trained_tokens, INT64_MAX),
                    applied_tokens=min(w.applied_tokens, INT64_MAX), step_seconds=w.step_seconds() or 0.0,
                )
            current = self.round
            open_round = pb.RoundStatus(
                version=current.version, reports=len(current.reports) + len(current.late),
                tokens=sum(u.tokens for u in current.reports.values()) + sum(late.tokens for late in current.late.values()),
                opened_at=current.opened_at, dropped=current.dropped,
            )
        for r in self.store.recent_rounds(STATUS_ROUNDS):
            response.rounds.add(
                version=r.version, reports=r.reports, tokens=r.tokens, opened_at=r.opened_at, closed_at=r.closed_at,
                close_reason=r.close_reason, update_norm=r.update_norm, clipped=r.clipped, dropped=r.dropped,
                aggregation=r.aggregation,
            )
        response.rounds.append(open_round)
        return response

    def _listed_workers(self) -> list[WorkerRecord]:
        """The memberships GetStatus lists (lock held): every active one, then the STATUS_ENDED_WORKERS
        that ended last, oldest first, so the reply stays far below the message limit."""
        ended = list(itertools.islice(reversed(self._ended.values()), STATUS_ENDED_WORKERS))
        return [*self._active.values(), *reversed(ended)]

    def close(self) -> None:
        """Close the store; once the server and the ticker have stopped (no lock)."""
        self.store.close()

    def owns_credential(self, worker_id: str, secret: bytes) -> bool:
        """Whether `worker_id` is an active member whose worker secret is `secret` (any thread; takes `_lock`)."""
        with self._lock:
            worker = self.workers.get(worker_id)
            return worker is not None and worker.active and worker.owns(secret)

    def knows(self, worker_id: str) -> bool:
        """Whether `worker_id` joined this run and is still in memory, active or not (any thread; takes `_lock`)."""
        with self._lock:
            return worker_id in self.workers

    def active_workers(self) -> int:
        """The number of active workers (any thread; takes `_lock`)."""
        with self._lock:
            return len(self._active)

    def reassign(self, worker_id: str, reason: str) -> None:
        """End a worker's membership here because a sweep moves it to another run; may close the round
        (handler thread, from a RunGroup without its lock; takes `_lock`)."""
        with self._lock:
            self._end_membership(self._member(worker_id), pb.WORKER_STATE_REASSIGNED, "reassign", reason)
            close = self._begin_close()
        self._finish_close(close)

    def summary(self, status: pb.GetStatusResponse | None = None) -> pb.RunSummary:
        """This run in one line, from `status` when the caller already has it (else takes `_lock` via `status`)."""
        return run_summary(self.spec, status or self.status())

    def tick(self) -> None:
        """Evict expired workers and persistent outliers, forget long-ended ones and close the round if it is
        due (the ticker thread, every TICK_S; takes `_lock`, and closes a round as `_finish_close` says)."""
        with self._lock:
            now = self.clock()
            for worker_id, reason in decisions.decide_evictions(now, self._active_views(), self.membership):
                self._end_membership(self._active[worker_id], pb.WORKER_STATE_EVICTED, "evict", f"evicted: {reason}", now)
            self._evict_outliers(now)
            forgotten = decisions.decide_forgetting(now, (w.view() for w in self._ended.values()), self.membership)
            for worker_id, _ in forgotten:
                del self._ended[worker_id], self.workers[worker_id]
            if forgotten:
                log.debug("forgot %d ended memberships (%s)", len(forgotten), forgotten[-1][1])
            close = self._begin_close()
        self._finish_close(close)

    def _evict_outliers(self, now: float) -> None:
        """End the membership of every active worker `decide_outlier_evictions` names (lock held)."""
        outliers = decisions.decide_outlier_evictions((w.outlier_view() for w in self._active.values()), self.outliers)
        for worker_id, reason in outliers:
            self._end_membership(self._active[worker_id], pb.WORKER_STATE_EVICTED, "evict", f"evicted: {reason}", now)

    def _begin_close(self) -> RoundClose | None:
        """With the lock held: if no close runs and the decision says the open round is due, freeze its reports,
        mark the close begun and return what it reads; else None. The caller passes the answer to
        `_finish_close` once it released the lock."""
        if self.finished or self._closing is not None:
            return None
        now = self.clock()
        decision = decisions.decide_round_close(now, self.round.view(), self._active_views(), self.round_options)
        if not decision.ok:
            return None
        self.round.closing = True
        self._closing = RoundClose(
            self.round, decision.reason, now, self.params, self.momentum, self.broadcast_feedback.snapshot(),
            self._norm_history, self._previous_average, self._spare,
        )
        return self._closing

    def _finish_close(self, close: RoundClose | None) -> None:
        """Without the lock: compute and commit the close `_begin_close` began, then publish it under `_lock`.
        On failure the round reopens with its reports, the residual is restored, and the error propagates."""
        if close is None:
            return
        try:
            closed = self._compute_close(close)
        except BaseException:
            with self._lock:
                self.broadcast_feedback.restore(close.saved_feedback)
                close.round.closing = False
                self._closing = None
                self._version_changed.notify_all()
            raise
        with self._lock:
            self._publish_close(close, closed)

    def _compute_close(self, close: RoundClose) -> ClosedRound:
        """The heavy part of a close, without the lock (the closing thread owns `broadcast_feedback`): the
        aggregate (the direction check, then `sync.aggregation`) in sorted worker order, the outer step, the
        compressed step, the checkpoint written with its digest in one pass and the SQLite commit (with the
        dropped and flagged updates' events, counted in the round's record, and the reference norms), and both
        payloads of the new version."""
        watch = Stopwatch()
        version, block = close.round.version, self.spec.sync.block_size
        late = [close.round.late[k] for k in sorted(close.round.late)]
        reports = [close.round.reports[k] for k in sorted(close.round.reports)] + [item.update for item in late]
        trained = [u.tokens for u in reports[:len(reports) - len(late)]] + [item.tokens for item in late]
        # centered_clip keeps the aggregate for the next round: it is neither written into a spare nor consumed.
        recycle = self.aggregation_options.method != "centered_clip"
        spare = close.spare if recycle else None
        with watch.piece("average"), aggregation.decoding_into(reports, self._decode_scratch):
            result = aggregation.aggregate(
                reports, self.aggregation_options, [n for norms in close.history for n in norms], close.previous,
                None if spare is None else spare.residual,
            )
            average = result.average
        with watch.piece("norm"):
            norm = tensor_stream.global_norm(average)
        with watch.piece("outer step"):
            target, momentum = outer.outer_step(
                close.params, close.momentum, average, self.spec.outer,
                spare_momentum=None if close.spare is None else close.spare.momentum, consume_average=recycle,
            )
        with watch.piece("compressed step"):
            params, encoded_step = outer.compressed_step(
                close.params, target, self.codec, block, self.broadcast_feedback, consume_target=True,
                spare_params=None if close.spare is None else close.spare.released_params(),
            )
        record = RoundRecord(
            version=version, opened_at=close.round.opened_at, closed_at=close.decided_at, reports=len(reports),
            tokens=sum(trained), close_reason=close.reason + late_summary(late), update_norm=norm,
            param_sha256="", clipped=result.clipped, dropped=close.round.dropped + result.dropped,
            aggregation=result.summary, steps=close.round.steps,
        )
        keep = self.spec.sync.reference_rounds
        history = (*close.history, result.accepted_norms)[-keep:] if keep else ()
        with watch.piece("commit"):
            self.store.commit_version(
                self.run_id, version + 1, params, self._optimizer_state(momentum), record,
                run_state={REFERENCE_NORMS_KEY: json.dumps([list(norms) for norms in history])},
                events=[(o.worker_id, o.action, f"round {version}: {o.reason}", close.decided_at)
                        for o in result.outcomes if o.flagged],
            )
            sha = self.store.committed_digest(version + 1)
            record = dataclasses.replace(record, param_sha256=sha.hex())
            for o in result.outcomes:
                if o.action == "dropped":
                    log.warning("round %d: update of %s dropped: %s", version, o.worker_id, o.reason)
        with watch.piece("norm bound"):
            norm_bound = self._update_norm_bound(params)
        with watch.piece("step payload"):
            header, chunks = tensor_stream.build_payload(
                params, codec=self.codec, run_id=self.run_id, version=version + 1, block_size=block, encoded=encoded_step
            )
            header.delta_from_version = version
            header.result_sha256 = sha
        full = LazyPullPayload(params, self.run_id, version + 1, sha)
        applied = applied_tokens(reports, trained, result.outcomes)
        return ClosedRound(
            params, momentum, sha, full, (header, chunks), record, watch.seconds, result, history, norm_bound, applied
        )

    def _publish_close(self, close: RoundClose, closed: ClosedRound) -> None:
        """Serve the committed version, open the next round, note how each update fared and evict persistent
        outliers, wake the waiters, advance the curriculum (lock held)."""
        version = close.round.version
        self._spare = SpareBuffers(self.momentum, close.saved_feedback, self.params, self._pull_payload)
        self.params, self.momentum, self.version = closed.params, closed.momentum, version + 1
        self.param_sha256 = closed.param_sha256
        self._pull_payload = closed.pull_payload
        self._delta_payload = (version, *closed.step_payload)
        self._decide_pace()
        self.round = OpenRound(version + 1, self.clock(), started=True, budget_s=self.pace.round_seconds)
        self._closing = None
        for worker_id, tokens in closed.applied.items():
            self.applied_tokens += tokens
            if worker_id in self.workers:
                self.workers[worker_id].applied_tokens += tokens
        self.last_close_seconds = closed.seconds
        self._norm_history, self._norm_bound = closed.history, closed.norm_bound
        self._previous_average = closed.aggregate.average if self.aggregation_options.method == "centered_clip" else None
        for o in closed.aggregate.outcomes:
            worker = self.workers.get(o.worker_id)
            if worker is not None:
                worker.note_round(version, o.action if o.flagged else "", o.reason, self.outliers.window)
        self._evict_outliers(self.clock())
        self._version_changed.notify_all()
        pieces = ", ".join(f"{name} {seconds:.3f}" for name, seconds in closed.seconds.items())
        log.info(
            "round %d closed (%s): version %d served, %d reports, %d tokens, %.3fs (%s); %s", version, close.reason,
            version + 1, closed.record.reports, closed.record.tokens, sum(closed.seconds.values()), pieces,
            closed.record.aggregation,
        )
        try:
            self.tracker.advance(close.decided_at, version)
        except Exception:
            # The version is committed and served; a failed curriculum step keeps the current L.
            log.exception("round %d: the curriculum decision failed; L stays", version)
