"""What the coordinator holds and the limits it keeps: the value types of `SwarmCoordinator`'s state.

A refusal (`Refusal`: the gRPC status and message a caller sees), a membership (`WorkerRecord`) and the one
decision on whether a join may take an ended membership over (`claimed_membership`), a sweep's join placed in a run
and not yet seated (`Reservation`), the open round and the late updates merged into it (`OpenRound`, `LateUpdate`),
the stages of a round close (`RoundClose` when it begins, `ClosedRound` once computed and committed, `SpareBuffers`
the close leaves for the next), the lazily built pull payload of a version (`LazyPullPayload`), and the limits every
request is checked against. Nothing here takes the coordinator's lock: the types are read and changed under it by
service.py, intake.py and close.py, as `SwarmCoordinator`'s docstring says (a `Reservation`'s `seated` under its
run's lock); `LazyPullPayload` has a lock of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from rcswarm.coordinator import aggregation, decisions
from rcswarm.coordinator import curriculum as curricula
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import RoundRecord
from rcswarm.sync import outer, tensor_stream

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


# The most UTF-8 bytes of a refusal's message: it travels as the grpc-message trailer, percent-encoded (3 characters
# a byte past ASCII), whose metadata gRPC may refuse past 8 KiB (a soft limit: some calls then end RESOURCE_EXHAUSTED,
# which a worker retries, instead of the refusal), and it may echo what the caller sent (a worker id). 1,000
# characters of four-byte UTF-8, before, made 12 KB.
MAX_REFUSAL_BYTES = 1000


class Refusal(Exception):
    """A refused RPC: the status code and the message the caller sees (cut to MAX_REFUSAL_BYTES of UTF-8);
    `place_retry_s` > 0 for a join refused because every place is taken, sent as the PLACE_RETRY_KEY trailer (when to
    ask again); `moved` for a NOT_FOUND of a membership whose run no longer takes its updates (the MOVED_KEY
    trailer)."""

    def __init__(self, code: grpc.StatusCode, message: str, place_retry_s: float = 0.0, moved: bool = False) -> None:
        encoded = message.encode(errors="backslashreplace")
        if len(encoded) > MAX_REFUSAL_BYTES:
            kept = encoded[:MAX_REFUSAL_BYTES].decode(errors="ignore")  # a character cut in two is dropped
            message = f"{kept}… ({len(message) - len(kept):,} more characters)"
        super().__init__(message)
        self.code = code
        self.message = message
        self.place_retry_s = place_retry_s
        self.moved = moved


class Waiting:
    """Workers refused a place lately (a join refused for want of one): each worker name with the time until which
    it counts as waiting, three of its ask-again intervals after its last ask; at most `limit` names, the longest
    silent forgotten first, so a flood of names costs bounded memory. Any thread: every method takes `_lock`, held
    for the dict's update only."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._until: OrderedDict[str, float] = OrderedDict()

    def asked(self, name: str, now: float, retry_s: float) -> None:
        """`name` was refused a place at `now` and told to ask again after `retry_s`."""
        with self._lock:
            self._until.pop(name, None)
            self._until[name] = now + 3 * retry_s
            while len(self._until) > self.limit:
                self._until.popitem(last=False)

    def seated(self, name: str) -> None:
        """`name` joined: it waits no longer."""
        with self._lock:
            self._until.pop(name, None)

    def count(self, now: float) -> int:
        """How many names still count as waiting at `now` (the others are forgotten)."""
        with self._lock:
            for name in [name for name, until in self._until.items() if until <= now]:
                del self._until[name]
            return len(self._until)


def secret_matches(secret: bytes, secret_sha256: bytes | None) -> bool:
    """Whether `secret` is the worker secret whose SHA-256 is `secret_sha256` (constant-time compare of the digests;
    never for an empty or unknown digest)."""
    return bool(secret_sha256) and hmac.compare_digest(hashlib.sha256(secret).digest(), secret_sha256)


def claimed_membership(request: pb.JoinRequest, secret_sha256: bytes | None) -> str:
    """The ended membership a join may take over: `request.previous_worker_id` when `request.previous_worker_secret`
    is that membership's own worker secret, whose SHA-256 is `secret_sha256` (the membership in memory's, else the
    digest its join stored; None: neither knows the id); "" otherwise, and the join then names nothing. The one
    decision on the name: a join token's holder naming another worker's membership takes nothing of it over. Pure."""
    previous = request.previous_worker_id
    return previous if previous and secret_matches(request.previous_worker_secret, secret_sha256) else ""


@dataclass
class Reservation:
    """A sweep's join placed in a run whose `join` has not returned (sweep.py `RunGroup.join`): counted among that
    run's places until its membership is seated. `seated` is set by the run's `_seat` under the run's `_lock`, and read
    under that lock (`SwarmCoordinator.load`), so the hand-over counts the worker once; the rest is fixed."""

    run: int  # the run's position in the group
    until: float  # when it stops counting even if the join has not returned (the group's clock)
    seated: bool = False


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
    # Its metric rows counted at the current version and its time budget (`decisions.decide_metric_rows`).
    metric_budget: decisions.MetricBudget = field(default_factory=decisions.MetricBudget)
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
    # Seconds of its recent inner steps (each checked against the coordinator's clock, `check_steps`), and its
    # cumulative compute seconds at its last metric row.
    step_samples: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    last_compute: float | None = None
    # Seconds of the steps its rows claimed since the last `check_steps`, and when that check took some (the
    # coordinator's clock; None: none yet, its join is the start).
    claimed_steps: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    checked_at: float | None = None
    # Bytes of its last update as received and of its last pull as served (0 before one).
    round_bytes_up: int = 0
    round_bytes_down: int = 0
    # (wall time, compute seconds) of its first and its latest metric row, the worker's clock (issue #29).
    first_mark: tuple[float, float] | None = None
    last_mark: tuple[float, float] | None = None

    def step_seconds(self) -> float | None:
        """Its measured seconds per inner step (the median of its recent steps), None before any."""
        return statistics.median(self.step_samples) if self.step_samples else None

    def measure(self, metric: pb.Metric) -> None:
        """Count a metric row's tokens and, for a training step, the compute seconds it claims since the row before
        (lock held). A step of no time (two rows with the same compute_seconds) or of a time that is not a finite
        number measured nothing and is not kept; the others count once `check_steps` took them."""
        self.trained_tokens += metric.tokens
        if metric.tokens > 0 and self.last_compute is not None:
            step = metric.compute_seconds - self.last_compute
            if 0.0 < step < math.inf:
                self.claimed_steps.append(step)
        if math.isfinite(metric.compute_seconds):
            self.last_compute = metric.compute_seconds
        if math.isfinite(metric.wall_time) and math.isfinite(metric.compute_seconds):
            mark = (metric.wall_time, metric.compute_seconds)
            if self.first_mark is None:
                self.first_mark = mark
            if self.last_mark is None or mark[0] >= self.last_mark[0]:
                self.last_mark = mark

    def check_steps(self, now: float) -> None:
        """Take the steps claimed since the last check into its step time, each at most the seconds the coordinator's
        own clock saw pass since that check took steps (or since the join): no step of its rows took longer than the
        time between its reports, whatever compute_seconds says (lock held; `now` on the coordinator's clock).

        An honest step ran between its previous report and this one (give or take the time those reports spent on the
        wire), so it stays whole; a claim of 1e9 s a step counts as the seconds that passed."""
        if not self.claimed_steps:
            return
        since = now - (self.joined_at if self.checked_at is None else self.checked_at)
        if since > 0:
            self.step_samples.extend(min(step, since) for step in self.claimed_steps)
        self.claimed_steps.clear()
        self.checked_at = now

    def utilization(self) -> float | None:
        """The share of its wall time between its first and latest metric row spent in inner steps (compute seconds
        over wall seconds, the worker's clock; capped at 1), None before a span."""
        if self.first_mark is None or self.last_mark is None or self.last_mark[0] <= self.first_mark[0]:
            return None
        compute = self.last_mark[1] - self.first_mark[1]
        return min(max(compute / (self.last_mark[0] - self.first_mark[0]), 0.0), 1.0)

    def owns(self, secret: bytes) -> bool:
        """Whether `secret` is this membership's worker secret (`secret_matches`)."""
        return secret_matches(secret, self.secret_sha256)

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
    # update owner -> the re-join that took its place over in the round (service.py `_place_of`), when one did: both
    # memberships are the round's reporters (`close_reporters`).
    places: Mapping[str, str] = field(default_factory=dict)


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


def pull_payload(params: outer.Tensors, run_id: str, version: int, sha256: bytes) -> Payload:
    """The fp32 payload of the full θ of `version` (no lock: a pure function of its inputs)."""
    return tensor_stream.build_payload(params, codec=pb.CODEC_FP32, run_id=run_id, version=version, content_sha256=sha256)


@dataclass
class Traffic:
    """Bytes of the updates a coordinator received and the pulls it served, for GetStatus (issue #28).

    `fp32_bytes`: θ's tensors in float32, what one update or one pull moves uncompressed (the ratio's base).
    Per worker per round is per update and per pull of a round's step: each worker pushes once and pulls the step
    once a round. A full pull of θ (after a join or a missed round: float32 whatever the codec) is counted apart,
    in `full_pull_bytes` and `full_pulls`, so that the downlink's mean is the steady state (observe/traffic.py).
    Every method: the coordinator's `_lock` held.
    """

    fp32_bytes: int
    up_bytes: int = 0
    updates: int = 0
    down_bytes: int = 0
    pulls: int = 0
    full_pull_bytes: int = 0
    full_pulls: int = 0

    def count_up(self, worker: WorkerRecord | None, size: int) -> None:
        """An accepted update of `size` message bytes (lock held)."""
        self.up_bytes, self.updates = self.up_bytes + size, self.updates + 1
        if worker is not None:
            worker.round_bytes_up = size

    def count_down(self, worker: WorkerRecord | None, size: int, full: bool) -> None:
        """A pull streamed in full, `size` message bytes: θ itself when `full`, else a round's step (lock held)."""
        if full:
            self.full_pull_bytes, self.full_pulls = self.full_pull_bytes + size, self.full_pulls + 1
        else:
            self.down_bytes, self.pulls = self.down_bytes + size, self.pulls + 1
        if worker is not None:
            worker.round_bytes_down = size

    def fill(self, response: pb.GetStatusResponse) -> None:
        """Set the run's traffic fields of a GetStatus reply (lock held); the downlink's is the steps' mean."""
        response.fp32_bytes = self.fp32_bytes
        response.bytes_up_per_round = self.up_bytes / self.updates if self.updates else 0.0
        response.bytes_down_per_round = self.down_bytes / self.pulls if self.pulls else 0.0


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
