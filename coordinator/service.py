"""The coordinator's state machine behind the gRPC service: membership, pace, serving θ, status.

`SwarmCoordinator` owns the global parameters, the outer optimizer's momentum, the version
counter, the membership table and the open round. Every RPC handler in server.py calls one
method here (through a `RunGroup`, sweep.py); a refused call raises `Refusal` carrying the gRPC
status code and a message. Its update intake is intake.py, its round close close.py, its value types
and limits records.py, its start resume.py (the package's docstring lists every module). The class
docstring states the call contract: which lock each method takes, and from which thread.

Identity. Join returns a worker secret (`WORKER_SECRET_BYTES` random bytes) bound to the new
worker id; the membership keeps only its SHA-256, never the secret, which is not logged, stored or
shown. Every later call of that worker carries the secret and is checked under the lock before
anything changes (`_authenticated`): none -> UNAUTHENTICATED, an id that is not a member ->
NOT_FOUND (join again), a secret that is not this id's -> PERMISSION_DENIED, so one worker can
neither act for nor evict another. Memberships live in memory only: after a restart every worker
gets NOT_FOUND and joins again with a new secret. A join's transaction stores the secret's SHA-256 too
(`StateStore.record_join`, `joined_digest`), never the secret.

Join numbers. Each join is numbered from the run's count of joins: its data seed (`JoinResponse.data_seed`, which a
worker's sampler follows) and the N of its id (`<prefix>w<N>-<hex>`). The join's transaction stores the count
(`StateStore.JOINS_KEY`) and a restart resumes from it (`StateStore.joins`; an older state dir from the joins it
recorded), so no join after a restart gets the seed of an earlier membership and replays its windows (before, every
process counted from 0: a restarted swarm retrained the same windows in the same order). A join undone before its
answer left (`_unadmit`) gives its number to the next join: no worker ever held it.

Re-joins. A join may name an ended membership (`previous_worker_id`: after an eviction, a lost answer, a restart, a
sweep's move) and takes over what that membership had (below) only when it carries that membership's own worker
secret (`previous_worker_secret`), checked in one place (`_claimed`, `records.claimed_membership`) against the digest
of the membership in memory, else the digest its join stored. Without it, or with another, the join is admitted as
a first join naming nothing (one WARNING line naming the id), so a join token's holder naming another worker's
membership takes none of its versions, its place in the open round, its curriculum entry or its landed update.

Places. `coordinator.max_workers` bounds the memberships that take part in the open round, not only the active
ones: a membership that ended (left, evicted, reassigned) with an update still in the open round holds its place
until that round closes (`decide_place`). Before, one join-token holder joined, pushed and left under ever new ids
and put any number of updates into one round (50 with max_workers = 2 in 1.6 s), enough to outvote the honest
update in the direction check. A re-join naming that ended membership (still in memory) with its secret takes
its place over: it carries over the versions it delivered (`_carry_over`), so it adds no second update to the
round, and a worker that crashed after its push and restarts at once trains on; one that names nothing, or a spare,
waits for the round to close (RESOURCE_EXHAUSTED with the place-retry trailer). The intake's cap (`round_room`) is
the second line.

Updates that landed before a restart. Each committed round records its reporters, the memberships whose update it
counted, in the transaction that commits it (close.py `close_reporters`, `StateStore.commit_version`). A re-join
naming a membership that memory no longer holds (a restart, or one forgotten), with the secret whose digest the
store holds for it, takes over the delivered version the store recorded for it (`_landed`), so the re-push of an
update whose answer the restart lost is ALREADY_EXISTS, not stale, and the worker keeps the error-feedback residual
that update left instead of sending the one it carried again.

Heterogeneous swarms (issue #15). Each worker's `TrainingAssignment` carries its pace for the version:
its inner-step count, or a time-boxed round's budget (`decisions.decide_pace`, from the workers'
measured seconds per step: the compute seconds between consecutive metric rows, the median of its
last STEP_SAMPLES). Per worker the coordinator counts tokens trained (its metrics), tokens applied
(its updates an outer step used), late updates merged and stale updates refused; GetStatus reports them.

What the coordinator keeps is bounded: metric values are range-checked (a row's tokens at most one step's)
and each worker's metric rows budgeted per round and over time (intake.py), the metrics table keeps the
newest `coordinator.max_metric_rows` rows (state/store.py); ended memberships are forgotten after
`coordinator.forget_after_s` (SQLite keeps their history); GetStatus lists the active workers
and only the most recent ended ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping

import grpc

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import curriculum as curricula
from rcswarm.coordinator import decisions
from rcswarm.coordinator.close import RoundCloser
from rcswarm.coordinator.guards import call_time_left
from rcswarm.coordinator.intake import (
    UpdateIntake,
    check_metrics,
    first_part,
    receive_update,
    require_secret,
    set_aside,
    without_diverged_loss,
)
from rcswarm.coordinator.liveness import LivenessClock
from rcswarm.coordinator.records import (
    INT64_MAX,
    PULL_ATTEMPTS,
    STATUS_ENDED_WORKERS,
    STATUS_ROUNDS,
    WORKER_SECRET_BYTES,
    LazyPullPayload,
    OpenRound,
    Refusal,
    Reservation,
    Traffic,
    WorkerRecord,
    claimed_membership,
)
from rcswarm.coordinator.resume import resume
from rcswarm.observe import traffic
from rcswarm.observe.analysis import run_lengths
from rcswarm.observe.summary import run_summary
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import MAX_REFUSALS, REFUSED_LEAVE, printable
from rcswarm.state.errors import StoreError
from rcswarm.state.store import JOINS_KEY, StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream

log = logging.getLogger("rcswarm.coordinator")


# The longest the health thread waits for a run's lock (`round_progress`): every holder releases it within
# moments unless a write under it hangs (a stalled volume), which the ticker's record then shows.
PROGRESS_WAIT_S = 1.0

# A hold of (or wait for) a run's lock longer than lease_s / LOCK_STALL_BEATS, a worker's heartbeat interval, held
# up at least one heartbeat: the coordinator stalled on its own lock or disk, and `tick` gives the members not heard
# since the grace of a stall (`_note_lock_stall`).
LOCK_STALL_BEATS = 3

# A handler whose wait for the run's lock is bounded by its call's deadline (`_hold`) gives up this long before it,
# so that its UNAVAILABLE reaches the caller before the caller's own deadline does.
LOCK_WAIT_MARGIN_S = 0.1
# A join seated with less than this left to its call's deadline could not answer in time: undone instead
# (`_check_join_time`).
JOIN_ANSWER_MARGIN_S = 0.01


class RunLog(logging.LoggerAdapter):
    """The coordinator's logger for one run: every line names its run ("run R: ..."), a sweep's several runs
    logging into one process."""

    def process(self, msg: object, kwargs: dict) -> tuple[str, dict]:
        return f"run {self.extra['run_id']}: {msg}", kwargs


# The run_state key of the workers that refused the run (`SwarmCoordinator.refusals`), a JSON list of [name, when, why].
REFUSALS_KEY = "refusals"


def stored_refusals(stored: str | None) -> dict[str, tuple[float, str]]:
    """The refusals REFUSALS_KEY holds, oldest first ({} when unset; entries that are not [name, when, why] are
    skipped: a count to show, which no decision reads)."""
    try:
        rows = json.loads(stored) if stored else []
    except ValueError:
        return {}
    if not isinstance(rows, list):
        return {}
    return {row[0]: (float(row[1]), row[2]) for row in rows if isinstance(row, list) and len(row) == 3
            and isinstance(row[0], str) and isinstance(row[1], (int, float)) and isinstance(row[2], str)}


@dataclasses.dataclass
class PendingJoin:
    """A join admitted under the run's lock (`SwarmCoordinator._admit`) whose rows are being stored without it: what
    its later steps (`_store_join`, then `_seat` or `_unadmit`) need. Owned by the joining thread."""

    worker: WorkerRecord  # the membership, not yet in `workers`
    response: pb.JoinResponse  # its answer, built (so it can be) before anything was written
    events: list[tuple[str, str]]  # (kind, reason) rows of the join's transaction
    now: float  # when it was admitted (its rows' time, `joined_at`)
    previous: str  # the membership it names with that membership's secret (`_claimed`), or ""
    previous_active: bool  # whether that one was active at admission (then nothing is taken over)
    taking_over: str | None  # the ended membership whose place in the open round it takes over
    round_version: int  # the open round at admission
    places_before: dict[str, str] | None  # that round's `_place_of` map before the join took a place over in it
    reason: str  # the admission's
    moved: dict[str, str]  # the run_state values its transaction writes (a moved curriculum entry), or {}
    curriculum_before: curricula.CurriculumState  # the curriculum state before the move
    curriculum_moved: curricula.CurriculumState  # ... and right after it
    saves: int  # the tracker's `saves` at admission
    reservation: Reservation | None  # a sweep's place held for it until it is seated (`_seat` marks it), or None


class SwarmCoordinator:
    """One run's coordinator: membership, the open round, θ, the outer momentum and the version.

    Two parts of it live in their own modules, owned by it and bound by its contract: `intake`
    (`UpdateIntake`, intake.py: the checks and records of pushes and metric reports) and `closer`
    (`RoundCloser`, close.py: the round close and the state only closes write).

    Threads. gRPC handler threads, many at once, call the RPC methods (`join`, `heartbeat`,
    `leave`, `pull`, `await_version`, `push`, `report_metrics`, `status`); the server's ticker
    thread calls `tick`; a `RunGroup` (sweep.py) also calls `owns_credential`, `knows`, `claim`, `load`,
    `active_workers`, `membership_state`, `reassign` and `summary` from handler threads, and the dashboard's thread
    `status` and `summary`. The constructor runs before any of them, `close` after all have stopped.

    Locks. One lock, `_lock`, guards all mutable state: the membership table, the open round,
    θ, the momentum, the version and its pull payloads, `peer_version`, the run's totals, the pace,
    the curriculum tracker, and the closer's state (the close under way, the aggregation's memory,
    the buffers the last close left for the next); the closer's `decode_scratch`, and the broadcast
    residual while a close runs, belong to the closing thread. `_version_changed` is a condition on
    that same lock: `await_version`, `pull` and a push for a closing round wait on it (which releases
    the lock while waiting); publishing a new version or undoing a failed close notifies every waiter.
    The lock is not reentrant. What needs no shared state runs outside it: reading a PushUpdate stream
    and decoding and validating its payload, checking metric values, streaming pull chunks, writing
    metric rows, reading closed rounds from the store, and a close's heavy work. The store has its own
    lock and is called with or without this one; a `RunGroup` takes its lock before a run's, never the
    other way round. `_join_lock` orders the joins of the run (`join`): a join holds it from its admission
    to its membership's entry, across its store write, and takes `_lock` only briefly before and after.

    Writes. A store write under `_lock` (a SQLite transaction and, with `durable`, an fsync) stalls every
    call of the run for its length, so none is made under it. The events of ended memberships (Leave,
    evictions, reassignments), stalls and the intake's stale, dropped and late updates, the full pulls'
    count, the refusals and the curriculum's saves and events (its first pull's start, a close's decision in
    `publish`, a hivemind run's steps; `CurriculumTracker`, its state's JSON taken when posted) are posted
    under the lock to an outbox (`_post`, `_post_event`) and written once it is released (`flush`;
    `_outbox_lock`, taken without `_lock`, orders the flushes, so rows are written in the order posted, and a
    call that posted returns after its rows were written). A crash between the two loses those rows (events,
    counters, a curriculum decision: a restart resumes the curriculum saved last, as after a save that
    failed), never a round's commit nor a join. A join's one transaction (`StateStore.record_join`, with the
    `_landed` read before it) is written between two holds of the lock, under `_join_lock` alone (`join`: admit
    under the lock, write, then enter the membership under the lock, or undo the admission if the write
    failed), so it is stored before its answer is sent, a failed one leaves nothing, and only the next join
    waits for it. A hold of the lock longer than a worker's heartbeat interval (measured in `_locked`), or a
    wait for it that long by the ticker, counts as a stall of the coordinator (no write makes one any more;
    a hold by a store read, CPU starvation or a bug still may): `tick` gives the members not heard since the
    grace of a stall (`_note_lock_stall`). A handler's first wait for the lock (`_hold`,
    `_locked(bounded=True)`), and a join's for `_join_lock`, ends by its call's deadline
    (`guards.call_time_left`): UNAVAILABLE, which workers retry; the ticker's, a close's publication and a
    handler's later waits (after it changed something) are not bounded.

    The call contract, method by method: who may call it, and the lock ("takes": takes `_lock` itself,
    so call it without; "held": call it with `_lock` held; "none": never takes it). "A due close":
    `closer.begin` under the lock, then `closer.finish` after releasing it.

      method                                   called from                    lock
      join                                     gRPC handler threads           takes `_join_lock` (bounded), reads
                                                                              the named membership's stored
                                                                              digest (`joined_digest`), then takes
                                                                              `_lock` (bounded) to admit; none while
                                                                              it writes (`record_join`, one
                                                                              transaction); takes (enters, or undoes
                                                                              a failed write or one its deadline
                                                                              ended), may post; flushes
      heartbeat                                gRPC handler threads           takes (bounded); no write
      status                                   handlers, the dashboard        takes (bounded in a handler); no write
      await_version                            handlers                       takes (bounded); waits on `_version_changed`
      leave                                    handlers                       takes (bounded), posts; flushes; then a
                                                                              due close
      reassign                                 handlers, through a RunGroup   takes, posts; flushes; then a due close
      stop                                     the ticker, through a RunGroup takes (after writing the store)
      lift_stop                                a RunGroup's constructor       takes (after writing the store)
      tick                                     the ticker thread              takes, posts; flushes without waiting
                                                                              for another flush; then a due close
      push                                     handlers                       takes (meta; bounded), none (payload),
                                                                              takes (record; bounded; may wait on
                                                                              `_version_changed`), posts; flushes;
                                                                              then a due close
      pull                                     handlers                       a generator: takes in `_pick_payload`
                                                                              (bounded; may wait on
                                                                              `_version_changed`; the first posts
                                                                              the curriculum's start), flushes; none
                                                                              while it streams; takes (count),
                                                                              posts; flushes
      report_metrics                           handlers                       takes (member; bounded), none (values),
                                                                              takes (count; bounded), none (rows),
                                                                              takes (totals; a hivemind run's
                                                                              curriculum steps post), flushes
      owns_credential, knows, membership_state any thread (a RunGroup, the    none: a snapshot of one entry
                                               server's guard)
      claim                                    any thread (a RunGroup's join) none: a snapshot of one entry; reads
                                                                              the store's read connection
      active_workers, load                     any thread (a RunGroup)        takes
      round_progress                           the server's health thread     takes (waits at most a second)
      summary                                  any thread                     takes, through `status` unless given one
      curriculum, closing, shown_version,      any thread                     none: snapshots
        finished, stopped, ended
      flush                                    any thread without `_lock`     takes `_outbox_lock`, then `_lock` only
                                                                              to take the rows; writes without it
      close                                    the owner, all others stopped  flushes; none besides
      _pick_payload                            `pull`                         takes (bounded), may post; flushes
      _locked, _hold, _acquire                 the methods above              take (the context managers release it)
      _joining                                 `join`                         takes `_join_lock` (bounded), never
                                                                              `_lock`
      _admit, _seat, _unadmit                  `join`, `_join_lock` held      `_admit` takes (bounded; a re-join may
                                                                              wait on `_version_changed`); `_seat`,
                                                                              `_unadmit`: held (may post a curriculum
                                                                              save); `_seat` marks a sweep's
                                                                              reservation seated
      _claimed                                 `_admit` (held), `claim`       held, or none (a snapshot)
      _store_join, _landed                     `join`, `_join_lock` held      none: reads and writes the store
                                                                              (flushes first after a curriculum move)
      _write_event, _save_pulls,               `flush`                        none (`_outbox_lock` held): the writes
        _save_refusals                                                        of posted rows
      every other method named _...            the lock's holder              held (`_wait_for_close` waits on
                                                                              `_version_changed`); `_post`,
                                                                              `_post_event`: post, never write
      intake.check_meta, token_bound,          push, report_metrics           held (`check_meta` may wait on
        refuse_stale, refuse_outlier,                                         `_version_changed`; the stale, dropped
        record, count_metric_rows                                             and late events are posted)
      closer.begin, closer.publish             the caller of a due close      held (`publish` posts, the
                                                                              curriculum step's save and events too)
      closer.finish                            that caller, lock released     none; takes it to publish the close
                                                                              or to undo a failed one, then flushes
      closer.compute                           `closer.finish`                none; one close at a time (`under_way`)

    `on_membership_end` (the server's `CallGate.end_worker`) is called from `_end_membership`, lock held; it
    takes only the gate's own lock. Lock order: a RunGroup's lock, then `_join_lock`, then `_outbox_lock`, then
    `_lock`, then the store's; `_outbox_lock` is never taken with `_lock` held, nor `_join_lock` with either (a
    RunGroup's join places the worker under its lock and calls `join` after releasing it).

    Membership. `workers` holds every membership still in memory, `_active` the active ones (all
    that admission, eviction and round closing look at) and `_ended` the ended ones in the order
    they ended; `tick` forgets those ended longer than `coordinator.forget_after_s` ago.

    Closing a round never holds `_lock` for its heavy work (close.py). While `closer.under_way` is set the
    closing thread alone may change θ, the momentum, the version and `broadcast_feedback`; the calls that
    wait for the new version are named above, the others go on.
    """

    def __init__(
        self, spec: RunSpec, store: StateStore, clock: Callable[[], float] = time.time, worker_prefix: str = ""
    ) -> None:
        """Resume the run committed in `store`, or start it at version 0; the caller then serves it. `clock` gives
        the time of leases, round deadlines and records: a process serving workers passes a started
        `LivenessClock` (liveness.py), whose stalls `tick` gives members a grace for; tests pass a fake."""
        self.spec = spec
        self.worker_prefix = worker_prefix
        self.store = store
        self.clock = clock
        # The stalls of a LivenessClock `tick` has seen, and when the coordinator resumed from the latest (its clock).
        self._stalls_seen = 0
        self._resumed_at: float | None = None
        # Told (worker_id, reason) when a membership is left or evicted, under `_lock`: the server's call gate
        # ends that worker's calls still running (guards.py `CallGate.end_worker`). None: nobody is told.
        self.on_membership_end: Callable[[str, str], None] | None = None
        self._lock = threading.Lock()
        self._version_changed = threading.Condition(self._lock)
        # Held by a join from its admission to its membership's entry, across its store write (`join`): one at a time.
        self._join_lock = threading.Lock()
        # The outbox: store writes posted under `_lock` ((key or None, write) in the order posted; a keyed one
        # replaces an earlier one of its key), written by `flush` once the lock is released, in that order;
        # `_outbox_lock` orders the flushes (taken without `_lock`, which it then takes briefly to take the rows).
        self._outbox: list[tuple[str | None, Callable[[], None]]] = []
        self._outbox_lock = threading.Lock()
        self._posts = 0  # writes ever posted (under `_lock`): whether a `_locked` block posted any
        # The longest measured hold of `_lock` since `tick` last looked (`_locked`), seconds; under `_lock`.
        self._long_hold_s = 0.0
        # Workers that left because they cannot train this run (a Leave whose reason begins REFUSED_LEAVE): name →
        # (when, why), the newest MAX_REFUSALS, kept in the store too (under `_lock`; `summary` counts them).
        self.refusals = stored_refusals(store.get(REFUSALS_KEY))
        self.membership = decisions.MembershipOptions(
            spec.coordinator.lease_s, spec.coordinator.max_workers, spec.coordinator.forget_after_s
        )
        self.metric_options = decisions.MetricOptions(spec.metric_rows_per_round(), spec.coordinator.metric_rows_per_s)
        sync = spec.sync
        self.round_options = decisions.RoundOptions(
            sync.round_deadline_s, sync.min_reports, sync.max_staleness, sync.round == "steps" and sync.adaptive_steps
        )
        self.pace_options = decisions.PaceOptions(
            sync.round, spec.inner.steps, sync.step_cap(spec.inner.steps), sync.round_seconds, sync.min_steps,
            sync.adaptive_steps, sync.round_deadline_s,
        )
        self.staleness = decisions.StalenessOptions(sync.max_staleness, sync.staleness_exponent)
        # How much each worker trains from the current version; decided again at each close and metric report.
        self.pace = decisions.decide_pace({}, self.pace_options)
        self.codec = codecs.codec_from_name(spec.sync.codec)
        # The codec with its parameters: what a sparse update must carry, and what the compressed step is sent in
        # (sparse: at sync.downlink_density).
        self.wire_format = codecs.WireFormat.from_sync(spec.sync)
        self.step_format = codecs.WireFormat.from_sync(spec.sync, downlink=True)
        self.broadcast_feedback = codecs.ErrorFeedback(spec.sync.error_decay)
        # (from_version, header, chunks) of the compressed step to the current version.
        self._delta_payload: tuple[int, pb.TensorHeader, list[pb.TensorChunk]] | None = None
        resumed = resume(spec, store, self.broadcast_feedback, self.codec)
        self.run_id, self.params, self.momentum, self.version = (
            resumed.run_id, resumed.params, resumed.momentum, resumed.version
        )
        self.shapes = {name: tuple(t.shape) for name, t in self.params.items()}
        # The versions a fallback set aside (state/store.py `load_current`; fixed once resumed): updates trained from
        # them are refused and their metric rows not stored (intake.py, "Set-aside versions").
        self.rejected_versions = tuple(store.rejected_versions())
        # The lengths this run ever assigns (None: a diagnostic task sets its own): a metric row trained at another
        # is refused (`check_metrics`).
        self.lengths = run_lengths(spec)
        # Every log line of this run (its rounds, memberships and refusals) names it.
        self.log = RunLog(log, {"run_id": self.run_id})
        self.outliers = decisions.OutlierOptions(spec.sync.outlier_evict_after, spec.sync.outlier_window)
        self.closer = RoundCloser(self)
        self.intake = UpdateIntake(self)
        # Every membership still in memory, in join order; the active ones; the ended ones in the order they ended.
        self.workers: dict[str, WorkerRecord] = {}
        self._active: dict[str, WorkerRecord] = {}
        self._ended: dict[str, WorkerRecord] = {}
        # The run's count of joins, the number of its newest (each join's data seed and the N of its id `w<N>-…` is
        # the count + 1), counted on from the one stored with the last join (`StateStore.joins`; under `_lock`): a
        # restart hands out no data seed an earlier membership had, so no new worker replays another's windows.
        self._joins = store.joins(worker_prefix)
        # (round version, update owner -> the membership holding its place): a re-join that took over the place of an
        # ended membership holding one in that round (`_place_holders`); reset when the round changes.
        self._place_of: tuple[int, dict[str, str]] = (-1, {})
        self.round = OpenRound(self.version, self.clock(), budget_s=self.pace.round_seconds)
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
        self.tracker = curricula.CurriculumTracker(spec, store, post=self._post, post_event=self._post_event)
        # Why this run was stopped before its rounds: a sweep pruned it (`[sweep] prune`, issue #30) or its wall-time
        # budget was used (`[run] minutes`; lifted at a restart whose budget no longer ends it, `lift_stop`); None
        # while it goes on.
        self.stopped: str | None = store.get("stopped")
        self.param_sha256 = tensor_stream.params_sha256(self.params)
        self._pull_payload = LazyPullPayload(self.params, self.run_id, self.version, self.param_sha256)
        # Bytes of updates received and pulls served (issue #28), for GetStatus; the full pulls of earlier lives too.
        # The step pulls' count too: the run summary's downlink divides their bytes by it (observe/traffic.py).
        full_bytes, full_count = traffic.full_pulls(store.get(traffic.FULL_PULLS_KEY))
        step_bytes, step_count = traffic.step_pulls(store.get(traffic.STEP_PULLS_KEY))
        self.traffic = Traffic(4 * sum(t.numel() for t in self.params.values()), down_bytes=step_bytes,
                               pulls=step_count, full_pull_bytes=full_bytes, full_pulls=full_count)
        # Whether the last write of the pulls' counts failed (`_save_pulls`) and of an event row
        # (`_write_event`): each warned once per failing spell (both written by `flush`, under `_outbox_lock`).
        self._pulls_unsaved = False
        self._events_unsaved = False

    @property
    def curriculum(self) -> curricula.CurriculumState:
        """The curriculum's persisted state (any thread; a snapshot, immutable)."""
        return self.tracker.state

    @property
    def closing(self) -> bool:
        """Whether a round close is under way (any thread, without the lock: a snapshot that may be stale)."""
        return self.closer.under_way is not None

    @property
    def shown_version(self) -> int:
        """The run's version: this coordinator's, or with sync.backend = "hivemind" the newest its workers report."""
        return self.peer_version if self.spec.sync.backend == "hivemind" else self.version

    @property
    def finished(self) -> bool:
        """Whether the run committed its last round or was stopped (any thread, with or without the lock)."""
        return self.stopped is not None or (self.spec.run.rounds > 0 and self.shown_version >= self.spec.run.rounds)

    @property
    def ended(self) -> str:
        """Why the run is finished, in words ("" while it goes on): the reason it was stopped (pruned, its wall-time
        budget), else its rounds done (any thread; a snapshot)."""
        stopped = self.stopped
        if stopped is not None:
            return f"the run was stopped: {stopped}"
        return f"the run has finished its {self.spec.run.rounds} rounds" if self.finished else ""

    def _run_state(self) -> int:
        """The run's state for a reply (lock held)."""
        return pb.RUN_STATE_FINISHED if self.finished else pb.RUN_STATE_RUNNING

    def _member(self, worker_id: str) -> WorkerRecord:
        """The active membership of `worker_id` (lock held); NOT_FOUND otherwise."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is unknown here; join again")
        if not worker.active:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is no longer a member ({worker.reason}); "
                          "join again", moved=worker.state == pb.WORKER_STATE_REASSIGNED)
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
            self.log.warning("refused %s for worker %s (%s): the worker secret is not its own", what, worker.worker_id,
                             worker.name)
            raise Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what} refused: the worker secret is not the one worker {worker.worker_id!r} got at its join",
            )
        return worker

    def _assignment(self, worker: WorkerRecord) -> pb.TrainingAssignment:
        """What `worker` trains from the current version, with its pace (lock held)."""
        assignment = self.tracker.assignment(self.shown_version, worker.assigned, worker.worker_id)
        assignment.inner_steps = self.pace.steps_for(worker.worker_id)
        assignment.round_seconds = self.pace.round_seconds
        return assignment

    def _decide_pace(self) -> None:
        """Decide the pace again from the active workers' step times, their claimed steps checked against the
        coordinator's clock first (`WorkerRecord.check_steps`), a time-boxed budget capped by sync.round_deadline_s; a
        time-boxed open round keeps the longest budget it was given (lock held). A decision that raises is logged and
        the pace stays: it never fails the metric report or the close that asked for it."""
        try:
            now = self.clock()
            for worker in self._active.values():
                worker.check_steps(now)
            measured = {w.worker_id: w.step_seconds() for w in self._active.values()}
            self.pace = decisions.decide_pace({k: v for k, v in measured.items() if v is not None}, self.pace_options)
        except Exception:
            self.log.exception("the pace decision failed; the pace stays: %s", self.pace.reason)
            return
        self.round.budget_s = max(self.round.budget_s, self.pace.round_seconds)

    def join(self, request: pb.JoinRequest, placed: str = "",
             reservation: Reservation | None = None) -> pb.JoinResponse:
        """Admit a worker and return its new worker secret, keeping only the secret's SHA-256 (handler
        thread). `placed`: why a sweep placed the worker in this run, stored as an "assign" event with the join's own;
        `reservation`: the place the sweep held for it, marked seated when the membership enters (`_seat`).

        A re-join takes over what the membership it names had only with that membership's worker secret
        (`previous_worker_secret`): the digest its join stored is read first (`StateStore.joined_digest`, no lock),
        and `_admit` decides under the lock (`_claimed`); a join naming another's membership is admitted naming none.

        A join's rows are stored in one transaction (`StateStore.record_join`) before its answer is sent, and that
        write is made without `_lock`, in three steps, the joins of the run one at a time (`_join_lock`, taken first,
        its wait bounded by the call's deadline):

        1. `_admit` (`_lock`, bounded): decide the admission, build the membership and the answer, reserve what a
           re-join takes over: the curriculum entry (`CurriculumTracker.rejoin`; a lift onto the run's rung is one of
           the join's events, so a join whose write fails leaves no word of it) and the place of the ended membership
           in the open round (`_place_of`, so that a close begun during the write counts the new membership among
           the round's reporters). The membership is not in `workers` yet: no other call sees it.
        2. `_store_join` (no `_lock`): read the update the named membership landed before (`_landed`) and write the
           join's transaction. Heartbeats, pushes, closes, leaves and evictions go on meanwhile.
        3. `_seat` (`_lock`, not bounded: the join is stored): enter the membership, with what may have changed
           since step 1 taken into account (a round closed: the current version and assignment). A write that failed
           (`_unadmit`) instead gives back what step 1 reserved and the error reaches the caller: no membership, no
           count, no row, no moved entry or place, and the worker may join again. So does a join whose call has
           (nearly) run out of time before or after its write (`_check_join_time`: DEADLINE_EXCEEDED, its stored rows
           ended by a "leave" event): seated, it was a member its worker never learnt of, counted against
           coordinator.max_workers and waited for by every round until its lease expired.

        Step 1's decision stays valid at step 3: no other join runs in between, and what else may run (a Leave, an
        eviction, a round close, a reassignment, a stop) only frees places; a run that finished meanwhile admits it
        as it admits a worker that joined just before its last close (its next call learns the run is over)."""
        with self._joining():
            stored = self.store.joined_digest(request.previous_worker_id)
            pending = self._admit(request, placed, stored, reservation)
            try:
                self._check_join_time(pending, "before its write")
                landed = self._store_join(pending)
            except BaseException:
                with self._locked():
                    self._unadmit(pending)
                raise
            with self._locked():
                try:
                    self._check_join_time(pending, "after its write")
                except Refusal:
                    self._unadmit(pending, stored=True)
                    raise
                return self._seat(pending, landed)

    def _check_join_time(self, pending: PendingJoin, when: str) -> None:
        """Refuse a join (DEADLINE_EXCEEDED) whose call has less than JOIN_ANSWER_MARGIN_S left
        (`guards.call_time_left`; outside a call, never): its answer would reach a caller that gave up, and a
        membership seated then is one the worker never learns of, counted against coordinator.max_workers and waited
        for by every round until its lease expires. The caller undoes the admission (`_unadmit`). The margin is
        well below the shortest deadline a worker gives a call (--rpc-timeout-s >= 0.1 s): with the locks' 0.1 s
        margin, every join of a worker at that floor was refused."""
        left = call_time_left()
        if left is not None and left < JOIN_ANSWER_MARGIN_S:
            raise Refusal(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"join of {pending.worker.name} undone {when}: {max(left, 0.0) * 1000:.1f} ms were left to "
                          f"the call's deadline, less than the {JOIN_ANSWER_MARGIN_S * 1000:g} ms its answer needs "
                          "to arrive; retry with a longer deadline")

    @contextlib.contextmanager
    def _joining(self) -> Iterator[None]:
        """`_join_lock` for the block (taken without `_lock`), its wait bounded by the call's deadline as `_acquire`'s:
        a join waits for the one storing its rows, never a heartbeat or any other call."""
        left = call_time_left()
        if left is None:
            self._join_lock.acquire()
        elif not self._join_lock.acquire(timeout=max(left - LOCK_WAIT_MARGIN_S, 0.0)):
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"run {self.run_id} is busy (another join's write took until "
                                                       "the call's deadline: a slow disk?); retry")
        try:
            yield
        finally:
            self._join_lock.release()

    def _admit(self, request: pb.JoinRequest, placed: str, stored: bytes | None,
               reservation: Reservation | None) -> PendingJoin:
        """Step 1 of `join` (`_join_lock` held; takes `_lock`, bounded): the admission decided, the membership and its
        answer built, a re-join's curriculum entry moved (in memory; the join's transaction stores it) and the place
        it takes over given to it. Refused: nothing changed. Writes nothing. The membership the join names counts
        only with its own secret (`_claimed`; `stored`: the digest its join stored, read by `join`). A re-join naming
        an ended membership while a round closes first waits for the close (at most `coordinator.max_wait_s`, as a
        pull does): that round may count the ended membership's update, and the close's reporters
        (`close_reporters`, committed with it) were taken when it began, so the join reads them from the store
        (`_landed`) once committed."""
        with self._locked(measure=False, bounded=True):  # measure=False: it may wait on `_version_changed`
            previous = self._claimed(request, stored)
            named = self.workers.get(previous)
            if named is not None and not named.active and self.closer.under_way is not None:
                self._wait_for_close(self.spec.coordinator.max_wait_s)
            now = self.clock()
            views = self._active_views()
            decision = decisions.decide_admission(now, views, self.finished, self.membership, self.ended)
            holders = self._place_holders()
            taking_over = self._held_place(previous, holders)
            if decision.ok and (holders or taking_over):
                decision = decisions.decide_place(now, views, holders, self.round.version, self.membership, taking_over)
            if not decision.ok:
                if self.finished:
                    raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"join refused: {decision.reason}")
                raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"join refused: {decision.reason}",
                              place_retry_s=decisions.place_retry_s(self.membership))
            worker_id = f"{self.worker_prefix}w{self._joins + 1}-{secrets.token_hex(4)}"
            name = printable(request.worker_name[:128]) or worker_id
            secret = secrets.token_bytes(WORKER_SECRET_BYTES)
            worker = WorkerRecord(
                worker_id, name, printable(request.device[:64]), now, now, self.version, secret_sha256=hashlib.sha256(secret).digest()
            )
            worker.assigned = self.tracker.worker_length([w.assigned.seq_len for w in self._active.values()
                                                          if w.assigned is not None])
            events = [("join", f"{name}: {decision.reason}")]
            if worker.assigned is not None:
                events.append(("assign", worker.assigned.reason))
            if placed:
                events.append(("assign", placed))
            previous_active = previous in self._active
            if not previous_active:
                self._carry_over(worker, self.workers.get(previous))
            # Nothing changes before the answer is built: one that could not be (an int32 field out of range, before the
            # run spec bounded them) refuses the join and leaves no moved curriculum entry behind.
            curriculum = self.tracker.state
            try:
                moved, lifted = ({}, "") if previous_active else self.tracker.rejoin(worker_id, previous)
                response = pb.JoinResponse(
                    worker_id=worker_id, run_id=self.run_id, run_spec_json=self.spec.to_json(), version=self.version,
                    lease_seconds=self.membership.lease_s, data_seed=self._joins + 1,
                    assignment=self._assignment(worker), worker_secret=secret,
                )
            except BaseException:
                self.tracker.state = curriculum
                raise
            if lifted:  # stored with the join (`record_join`), never without it
                events.append(("curriculum", lifted))
            places_before = None
            if taking_over is not None:
                places = self._place_of[1]  # the open round's (`_place_holders` above)
                places_before = dict(places)
                for owner in {*self.round.reports, *self.round.late}:
                    if places.get(owner, owner) == taking_over:
                        places[owner] = worker_id
            return PendingJoin(worker, response, events, now, previous, previous_active, taking_over,
                               self.round.version, places_before, decision.reason, moved, curriculum,
                               self.tracker.state, self.tracker.saves, reservation)

    def _claimed(self, request: pb.JoinRequest, stored: bytes | None) -> str:
        """The membership a join names when it carries that membership's own worker secret, else "" (the one decision,
        `records.claimed_membership`, against the digest of the membership in memory, else `stored`: the digest its
        join stored, `StateStore.joined_digest`). A name this run knows, sent without its secret or with another,
        is logged (one WARNING with the id, never a secret): the join is admitted as a first join, taking over no
        versions, place, curriculum entry or landed update. `_admit` calls it with `_lock` held; `claim` without (a
        snapshot of one entry, as `knows`: a membership's digest never changes)."""
        named = self.workers.get(request.previous_worker_id)
        known = named.secret_sha256 if named is not None else stored
        previous = claimed_membership(request, known)
        if request.previous_worker_id and not previous and known:
            self.log.warning("join of %s names membership %s without that membership's worker secret: admitted as a "
                             "new member, taking nothing of it over", printable(request.worker_name[:128]),
                             request.previous_worker_id)
        return previous

    def _store_join(self, pending: PendingJoin) -> tuple[int, int] | None:
        """Step 2 of `join` (`_join_lock` held, `_lock` not): store the join's rows in one transaction
        (`StateStore.record_join`), with the run's count of joins (`JOINS_KEY`: its number, which a restart resumes
        from), and return the update the named membership landed (`_landed`). A join that moved a
        curriculum entry first writes the rows posted before it (`flush`): a save posted before step 1, without
        the moved entry, written after the join's would lose it (saves posted since hold it)."""
        if pending.moved:
            self.flush()
        landed = self._landed(pending.previous, pending.previous_active)
        run_state = {**pending.moved, JOINS_KEY: str(pending.response.data_seed)}
        self.store.record_join(pending.worker.worker_id, pending.events, pending.now, reported=landed,
                               run_state=run_state, secret_sha256=pending.worker.secret_sha256)
        return landed

    def _unadmit(self, pending: PendingJoin, stored: bool = False) -> None:
        """Step 3 of a `join` whose write failed, or that its call's deadline ends (`_check_join_time`) (lock held):
        the place it took over goes back to the ended membership while its round is open (a close begun meanwhile
        committed the new id among its reporters: an id nobody holds, harmless); the curriculum entry it moved goes
        back, exactly as it was when nothing moved the state since, else onto the state as it is now
        (`CurriculumTracker.unjoin`), then saved if a save was made meanwhile (it held the moved entry). Nothing else
        had changed. `stored`: the join's transaction was written (`record_join`): the entry it moved is saved back,
        a "leave" event ends the membership in the events, and its secret's digest and any landed round it was
        entered among stay, naming an id no worker holds (a restart seats no membership from the store: a worker
        joins again). The membership was never in `workers`: no count, place or expected report of it. Its number (data
        seed) is the next join's too: its answer never left, so no worker trains with that seed or holds that id (a
        restart after its stored count numbers on above it, as after any other join)."""
        if pending.places_before is not None and self._place_of[0] == pending.round_version == self.round.version:
            self._place_of = (pending.round_version, pending.places_before)
        if stored:
            self._post_event(pending.worker.worker_id, "leave", "join undone: its call's deadline passed before it "
                                                                "was answered", self.clock())
        if not pending.moved:
            return
        if self.tracker.state is pending.curriculum_moved:
            self.tracker.state = pending.curriculum_before
        else:
            self.tracker.unjoin(pending.worker.worker_id, pending.previous)
        if stored or self.tracker.saves != pending.saves:
            self.tracker.save()

    def _seat(self, pending: PendingJoin, landed: tuple[int, int] | None) -> pb.JoinResponse:
        """Step 3 of `join` (lock held; the join is stored): enter the membership as active and return its answer.
        What changed since `_admit` is taken in: its lease starts now, it reports to the current version's round,
        the answer names the current version and assignment, and the curriculum state is saved again when a save
        was made meanwhile (the join's transaction, with the state as it was at step 1, may have overwritten it)."""
        worker, response = pending.worker, pending.response
        worker.last_seen = self.clock()
        worker.base_version = max(worker.base_version, self.version)
        if landed is not None:
            worker.accepted_version = max(worker.accepted_version, landed[1])
        try:
            assignment = self._assignment(worker)
            response.version = self.version
            response.assignment.CopyFrom(assignment)
        except Exception:  # the answer built at step 1 stands: the join is stored and is not undone
            self.log.exception("join of %s: its answer names the assignment of version %d", worker.worker_id,
                               response.version)
        if pending.moved and self.tracker.saves != pending.saves:
            self.tracker.save()
        self._joins += 1
        self.workers[worker.worker_id] = self._active[worker.worker_id] = worker
        if pending.reservation is not None:  # counted from now on as a member, no longer as a place held (`load`)
            pending.reservation.seated = True
        self.log.info("join: %s (%s) as %s at version %d: %s", worker.name, worker.device, worker.worker_id,
                      self.version, pending.reason)
        return response

    def _carry_over(self, worker: WorkerRecord, ended: WorkerRecord | None) -> None:
        """A re-join naming its ended membership (`ended`, still in memory, named with its own secret: `_claimed`):
        the new one takes over the versions it last delivered, pulled and trains from (lock held). An update whose
        push landed but whose answer was lost before the eviction is then a duplicate when pushed again under the new
        id (ALREADY_EXISTS, not a second copy in the round, which does not wait for the new membership either), and
        one trained from the pulled version may still be merged late."""
        if ended is None:
            return
        worker.accepted_version = ended.accepted_version
        worker.pulled_version = ended.pulled_version
        worker.base_version = max(worker.base_version, ended.base_version)

    def _landed(self, previous_worker_id: str, active: bool) -> tuple[int, int] | None:
        """(round version, base version) of the newest committed round that counted an update of the ended
        membership a re-join names (`StateStore.reported`), or None (reads the store). The store knows it
        where memory does not: after a coordinator restart, a worker whose update closed the last round before it
        heard the answer joins again naming that membership and pushes the update again; it landed, so the push is
        a duplicate (ALREADY_EXISTS) and the worker keeps the error-feedback residual left after it, where "stale"
        made it put back the residual the landed update had carried (sent twice). The join enters the new
        membership among that round's reporters (`StateStore.record_join`), so a second restart knows it too.
        `previous_worker_id` is the membership the join named with its own secret (`_claimed`: after a restart, the
        digest its join stored), or "": another worker's landed update is never taken over. None for an active
        membership (`active`, as `_admit` saw it under the lock: a worker cannot take over a live one). `join`'s step
        2 (`_join_lock` held, `_lock` not: the read takes the store's writer lock, which a close's commit may hold a
        while)."""
        if not previous_worker_id or active:
            return None
        return self.store.reported(previous_worker_id)

    def _place_holders(self) -> set[str]:
        """The memberships holding a place in the open round by an update in it (lock held): each update's owner,
        or the re-join that took its place over (`join`), active or not."""
        version, places = self._place_of
        if version != self.round.version:
            places = {}
            self._place_of = (self.round.version, places)
        return {places.get(owner, owner) for owner in (*self.round.reports, *self.round.late)}

    def _held_place(self, previous_worker_id: str, holders: Collection[str]) -> str | None:
        """`previous_worker_id` when a re-join naming it (with its secret, `_claimed`) takes over its place in the
        open round (lock held): an ended membership still in memory (its versions are carried over, `_carry_over`)
        that holds one."""
        previous = self.workers.get(previous_worker_id)
        if previous is None or previous.active or previous_worker_id not in holders:
            return None
        return previous_worker_id

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        """Renew a lease (handler thread; takes `_lock`, bounded by the call's deadline)."""
        with self._hold():
            worker = self._authenticated("Heartbeat", request.worker_id, request.worker_secret)
            worker.last_seen = self.clock()
            return pb.HeartbeatResponse(
                version=self.version, run_state=self._run_state(), lease_seconds=self.membership.lease_s,
                assignment=self._assignment(worker),
            )

    def leave(self, request: pb.LeaveRequest) -> pb.LeaveResponse:
        """End a membership at once; may close the round (handler thread; takes `_lock`, writes its event rows after
        releasing it, `flush`)."""
        with self._locked(bounded=True):
            worker = self._authenticated("Leave", request.worker_id, request.worker_secret)
            why = printable(request.reason[:200])
            self._end_membership(worker, pb.WORKER_STATE_LEFT, "leave", f"left: {why or 'no reason given'}")
            if why.startswith(REFUSED_LEAVE):
                self._note_refusal(worker.name, why.removeprefix(REFUSED_LEAVE))
            close = self.closer.begin()
        self.closer.finish(close)
        return pb.LeaveResponse()

    def _end_membership(self, worker: WorkerRecord, state: int, kind: str, reason: str, now: float | None = None) -> None:
        """End an active membership: record, event row (posted: written once the lock is released), log line (lock
        held)."""
        now = self.clock() if now is None else now
        worker.active, worker.state, worker.reason, worker.ended_at = False, state, reason, now
        del self._active[worker.worker_id]
        self._ended[worker.worker_id] = worker
        self._version_changed.notify_all()
        if self.on_membership_end is not None and state != pb.WORKER_STATE_REASSIGNED:
            self.on_membership_end(worker.worker_id, reason)
        self._post_event(worker.worker_id, kind, reason, now)
        self.log.info("%s: %s (%s) at version %d: %s", kind, worker.worker_id, worker.name, self.version, reason)

    def _acquire(self, bounded: bool) -> None:
        """Take `_lock`. `bounded` (a handler's first look, before it changed anything): within the deadline of the
        call the thread serves (`guards.call_time_left`), less LOCK_WAIT_MARGIN_S, else refused UNAVAILABLE (workers
        retry it), so that a handler does not stay blocked on a lock held by a slow write past the time its caller
        gave up; without a call (the ticker, the dashboard, a test) as long as it takes."""
        left = call_time_left() if bounded else None
        if left is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(left - LOCK_WAIT_MARGIN_S, 0.0)):
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"run {self.run_id} is busy (its lock stayed held until the "
                                                       "call's deadline: a slow write?); retry")

    @contextlib.contextmanager
    def _hold(self) -> Iterator[None]:
        """`_lock` for a handler's first look, its wait bounded by the call's deadline (`_acquire`); nothing posted."""
        self._acquire(bounded=True)
        try:
            yield
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def _locked(self, measure: bool = True, wait: bool = True, bounded: bool = False) -> Iterator[None]:
        """Hold `_lock` for the block, then, once it is released, write what the block posted (`flush(wait)`), also
        when the block raised. With `measure` (a block that never waits on `_version_changed`) a hold longer than the one
        `tick` saw last is noted for it (`_long_hold_s`): whatever kept the lock that long (no store write is made
        under it; a slow read, a starved process) held up the heartbeats queued behind it."""
        posted = False
        self._acquire(bounded)
        try:
            taken, before = time.monotonic(), self._posts
            try:
                yield
            finally:
                posted = self._posts > before
                if measure:
                    self._long_hold_s = max(self._long_hold_s, time.monotonic() - taken)
                self._lock.release()
        finally:
            if posted:
                self.flush(wait)

    def _post(self, key: str | None, write: Callable[[], None]) -> None:
        """Post a store write to the outbox (lock held): `flush` runs it once the lock is released. A keyed write
        (a run_state value) replaces an earlier one of the same key not written yet. `write` handles its own
        failure (best effort: these are events, counters and the curriculum's saves, never a round's commit or a
        join)."""
        self._outbox.append((key, write))
        self._posts += 1

    def _post_event(self, worker_id: str, kind: str, reason: str, now: float) -> None:
        """Post an events row for what already happened in memory (an ended membership, a stall, a stale, dropped
        or late update; lock held): `_write_event` writes it once the lock is released."""
        self._post(None, lambda: self._write_event(worker_id, kind, reason, now))

    def flush(self, wait: bool = True) -> None:
        """Write the outbox (any thread, `_lock` not held; takes `_outbox_lock`, and `_lock` only to take the rows).

        Ordering: rows are written in the order they were posted under `_lock` (one flush at a time); a call that
        posted rows and flushed with `wait` returns after they were written (or their failure logged), so a Leave's
        event is in the store when its answer is sent. Rows written directly (a close's commit; a join's, unless it
        moved a curriculum entry, `_store_join`) may get lower rowids than rows posted before them; each row keeps
        the time of its change in memory. A crash between the change in memory and its flush loses the rows posted
        (events and counters: the pulls' counts, the refusals; the curriculum's newest save); memberships are
        memory only, and nothing a round commits or a join stores goes through here.
        Without `wait` (the ticker) a flush under way elsewhere is left to write them: it looks again when done."""
        first = wait  # with `wait`, once at least: rows this call posted may be in the hands of a flush under way
        while first or self._outbox:
            first = False
            if not self._outbox_lock.acquire(blocking=wait):
                return
            try:
                with self._lock:
                    posted, self._outbox = self._outbox, []
                last = {key: index for index, (key, _) in enumerate(posted) if key is not None}
                for index, (key, write) in enumerate(posted):
                    if key is not None and last[key] != index:
                        continue
                    try:
                        write()
                    except Exception:  # a write's own failure is handled in it; this is a bug, and the rest go on
                        self.log.exception("a posted store write failed")
            finally:
                self._outbox_lock.release()

    def _write_event(self, worker_id: str, kind: str, reason: str, now: float) -> None:
        """Write a posted events row, best effort (`flush`, `_outbox_lock` held): a failed write (a full disk) is one
        WARNING until a write succeeds again, never the error of the tick or call that did it, which would otherwise
        stop closing rounds; the log line stays."""
        try:
            self.store.add_event(worker_id, kind, reason, now)
        except StoreError as error:
            if not self._events_unsaved:
                self.log.warning("an event was not saved (%s); events are logged only until a write succeeds", error)
            self._events_unsaved = True
            return
        if self._events_unsaved:
            self.log.info("events are saved again")
            self._events_unsaved = False

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
        message = pb.PullParametersResponse(header=header)
        served = message.ByteSize()
        yield message
        for chunk in chunks:
            message = pb.PullParametersResponse(chunk=chunk)
            served += message.ByteSize()
            yield message
        with self._locked():
            self.traffic.count_down(self.workers.get(request.worker_id), served, full=payload is not None)
            values = {traffic.FULL_PULLS_KEY: traffic.full_pulls_value(self.traffic.full_pull_bytes,
                                                                       self.traffic.full_pulls),
                      traffic.STEP_PULLS_KEY: traffic.step_pulls_value(self.traffic.down_bytes, self.traffic.pulls)}
            self._post(traffic.STEP_PULLS_KEY, lambda: self._save_pulls(values))

    def _save_pulls(self, values: dict[str, str]) -> None:
        """Keep the full and step pulls' counts (`values`, counted under the lock; the newest posted replaces an
        older one not written yet) in the store, best effort (`flush`, after the pull released the lock): the pull
        it counts was served, so a failed write (a full disk) is one WARNING until a write succeeds again, never the
        pull's error; the counts stay in memory and the next pull writes them."""
        try:
            self.store.set_many(values)
        except StoreError as error:
            if not self._pulls_unsaved:
                self.log.warning("the pulls' counts were not saved (%s); pulls are served, the counts are kept in "
                                 "memory and saved again at the next pull", error)
            self._pulls_unsaved = True
            return
        if self._pulls_unsaved:
            self.log.info("the pulls' counts are saved again")
            self._pulls_unsaved = False

    def _pick_payload(
        self, request: pb.PullParametersRequest
    ) -> tuple[LazyPullPayload | None, pb.TensorHeader | None, list[pb.TensorChunk]]:
        """For `pull` (takes `_lock`): the current version's full payload, or the compressed step's header and
        chunks when the worker holds the version before. The run's first pull posts the curriculum's start
        (`CurriculumTracker.start`), written once the lock is released."""
        with self._locked(measure=False, bounded=True):
            self._check_tensors_served(
                "PullParameters", self._authenticated("PullParameters", request.worker_id, request.worker_secret))
            self._wait_for_close(self.spec.coordinator.max_wait_s)
            worker = self._authenticated("PullParameters", request.worker_id, request.worker_secret)
            if request.version not in (0, self.version):
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"version {request.version} is not served; the newest is {self.version}",
                )
            worker.last_seen = self.clock()
            worker.pulled_version = self.version
            # A membership that delivered its update for this version (its own, or one a re-join took over) is not
            # waited for again: before, a re-join that took over a delivered update and pulled its version again made
            # the round wait for it until its deadline (its id is not the update's, and its push is a duplicate).
            worker.base_version = self.version + 1 if worker.accepted_version >= self.version else self.version
            if not self.round.started:
                self.round.opened_at, self.round.started = worker.last_seen, True
            if self._serving_since is None:
                self._serving_since = worker.last_seen
            self.tracker.start(worker.last_seen)
            delta = self._delta_payload
            if delta is not None and request.HasField("have_version") and request.have_version == delta[0]:
                return None, delta[1], delta[2]
            return self._pull_payload, None, []

    def _check_tensors_served(self, rpc: str, worker: WorkerRecord) -> None:
        """Refuse `rpc` (a push or a pull) of an authenticated `worker` in a run whose workers average peer to peer
        (sync.backend = "hivemind": this coordinator is their control plane and holds no θ of theirs): a worker
        started without --backend hivemind trained and pushed rounds that closed on their own (review of the Helm
        chart, 2026-11-28). Reads the spec only."""
        if self.spec.sync.backend == "hivemind":
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, (
                f"{rpc} refused to {worker.name}: run {self.run_id} averages peer to peer (sync.backend = "
                '"hivemind"): its coordinator takes no updates and serves no parameters; start the worker with '
                "--backend hivemind --initial-peers ADDR (docs/DEPLOY.md)"))

    def _wait_for_close(self, limit_s: float) -> None:
        """While a close runs, wait for its publication (or failure), at most `limit_s` (lock held; waiting
        on `_version_changed` releases it)."""
        deadline = time.monotonic() + limit_s
        while self.closer.under_way is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._version_changed.wait(timeout=left)

    def await_version(self, request: pb.AwaitVersionRequest, time_remaining: float) -> pb.AwaitVersionResponse:
        """Long poll until the version reaches `min_version` (handler thread; takes `_lock` and waits on
        `_version_changed`, which releases it while waiting), at most `coordinator.max_wait_s`, or until the
        membership ends (`_end_membership` wakes the waiters)."""
        wait_s = min(max(request.wait_ms, 0) / 1000.0, self.spec.coordinator.max_wait_s, max(time_remaining - 0.2, 0.0))
        deadline = time.monotonic() + wait_s
        with self._hold():
            worker = self._authenticated("AwaitVersion", request.worker_id, request.worker_secret)
            worker.last_seen = self.clock()
            while self.version < request.min_version and not self.finished and worker.active:
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
        with self._locked(measure=False, bounded=True):
            worker = self._authenticated("PushUpdate", meta.worker_id, meta.worker_secret)
            self._check_tensors_served("PushUpdate", worker)
            self.intake.check_meta(worker, meta)
            bound, why = self.closer.norm_bound
        header = first_part(requests, "header").header
        deltas, norm, size = receive_update(header, requests, self.shapes, self.run_id, meta.base_version, self.wire_format)
        with self._locked(measure=False, bounded=True):
            worker = self._authenticated("PushUpdate", meta.worker_id, meta.worker_secret)
            lateness = self.intake.check_meta(worker, meta)
            if norm > bound:
                self.intake.refuse_outlier(worker, f"update rejected: global L2 norm {norm:.4g} exceeds {why}")
            self.intake.record(worker, meta, lateness, norm, deltas)
            self.traffic.count_up(worker, size + pb.PushUpdateRequest(meta=meta).ByteSize())
            reports = len(self.round.reports) + len(self.round.late)
            round_version = self.round.version
            close = self.closer.begin()
        self.closer.finish(close)
        return pb.PushUpdateResponse(
            accepted=True, round_version=round_version, reports=reports, staleness=lateness.staleness,
            staleness_weight=lateness.weight,
        )

    def report_metrics(self, request: pb.ReportMetricsRequest) -> pb.ReportMetricsResponse:
        """Store a batch of metrics, all or none (handler thread): rows of this run only (`request.run_id`, when
        given; another run's are refused). Takes `_lock` to check the worker and its secret, checks the values
        without it (so only a member makes the coordinator read a large batch; a row's tokens at most one step's),
        takes it again for the membership and the worker's budget (`intake.count_metric_rows`), writes the rows
        after releasing it (a refused write gives the rows back to the budget; a trained step's row whose (worker,
        version, step) is stored already is not stored again, `StateStore.add_new_metrics`, but counts against the
        budget), then takes it a third time for the totals and the curriculum's measurements (with sync.backend =
        "hivemind" also the curriculum steps of the rounds the swarm closed since the last report,
        `_follow_peer_rounds`): nothing is counted that was not stored."""
        require_secret("ReportMetrics", request.worker_id, request.worker_secret)
        with self._hold():
            self._reporter(request.worker_id, request.worker_secret)
            step_tokens = self.intake.step_token_bound()
            # The versions this run served (the workers' own, peer to peer, with the hivemind backend).
            served = self.version if self.spec.sync.backend != "hivemind" else INT64_MAX
        if request.run_id and request.run_id != self.run_id:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, (
                f"ReportMetrics: {len(request.metrics)} rows trained for run {request.run_id!r} sent by worker "
                f"{request.worker_id!r} of run {self.run_id!r}: a run stores only its own rows"
            ))
        check_metrics(request.metrics, step_tokens, self.lengths)
        now = self.clock()
        # Rows no round of this run can take are not kept, and `stored` says how many were: training past a finite
        # run's last round (a worker that pulled the final version before it heard the run finished), and rows of a
        # version this run has not served (a confused client), or of one a fallback set aside (their θ no longer exists
        # in this run: a coordinator that resumed from an older checkpoint, intake.py "Set-aside versions").
        last = self.spec.run.rounds
        metrics = [without_diverged_loss(m) for m in request.metrics
                   if not ((last > 0 and m.version >= last and m.tokens > 0) or m.version > served
                           or set_aside(self.rejected_versions, m.version) is not None)]
        with self._hold():
            worker = self._reporter(request.worker_id, request.worker_secret)
            counted_at = self.intake.count_metric_rows(worker, len(request.metrics))
        rows = [
            (self.run_id, request.worker_id, m.version, m.step, m.seq_len, m.batch, m.loss, m.tokens, m.wall_time,
             m.compute_seconds, m.sync_seconds, m.bytes_sent, m.bytes_received, m.param_sha256, now)
            for m in metrics
        ]
        try:
            # The held-out losses measured along the way ([run] eval_every) ride on pull rows; the store keeps each
            # worker's first report of a version (a few of them) and takes their median (StateStore.add_metrics).
            held_out = [(m.version, m.val_loss, m.val_seconds, request.worker_id, now)
                        for m in metrics if m.val_loss > 0]
            fresh = self.store.add_new_metrics(rows, self.spec.coordinator.max_metric_rows, held_out)
        except BaseException:
            with self._lock:
                self.intake.refund_metric_rows(worker, counted_at, len(request.metrics))
            raise
        # A trained step's row the worker reported before (its report retried after the answer was lost) is not
        # stored again, and not counted again: its loss once in its step's mean, its tokens once in the totals.
        metrics = [metric for metric, new in zip(metrics, fresh) if new]
        with self._locked():  # a hivemind run's curriculum steps write under it (`_follow_peer_rounds`): measured
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
        return pb.ReportMetricsResponse(stored=len(metrics))

    def _follow_peer_rounds(self, now: float, reported: int) -> None:
        """sync.backend = "hivemind": the workers' reported version grew from `reported` to `peer_version`, so the
        swarm closed rounds `reported` .. `peer_version` − 1 peer to peer; take the curriculum step a round close
        takes (`RoundCloser.publish`) for each round not decided yet (`CurriculumTracker.advance_through`), with the
        measurements of the rows just counted. The budget's clock starts at the first report (there is no pull).
        A failed step is logged and L stays (lock held)."""
        first = max(reported, self.tracker.state.decided_version + 1)
        if first >= self.peer_version:
            return
        try:
            self.tracker.start(now)
            self.tracker.advance_through(now, first, self.peer_version - 1, list(self._active))
        except Exception:
            self.log.exception("rounds %d..%d of the hivemind swarm: the curriculum decision failed; L stays", first,
                          self.peer_version - 1)

    def _reporter(self, worker_id: str, secret: bytes) -> WorkerRecord:
        """The worker whose metrics are accepted (lock held): an active member, or one a sweep moved to another
        run (its rows of this run still belong here), either with its own worker secret (`_authenticated`);
        NOT_FOUND for an unknown, left or evicted worker."""
        worker = self.workers.get(worker_id)
        if worker is not None and worker.state == pb.WORKER_STATE_REASSIGNED:
            return self._owned("ReportMetrics", worker, secret)
        return self._authenticated("ReportMetrics", worker_id, secret)

    def status(self) -> pb.GetStatusResponse:
        """The run's GetStatus reply (handler thread, the dashboard's thread; takes `_lock` for the live
        state, reads the closed rounds from the store after releasing it; a handler's wait is bounded by its call's
        deadline)."""
        with self._hold():
            now = self.clock()
            # The active members' latest losses: an ended membership (kept `forget_after_s` for the status) would
            # hold an evicted or departed worker's loss in the mean; the kept ones only once none is active.
            losses = ([w.last_loss for w in self._active.values() if math.isfinite(w.last_loss)]
                      or [w.last_loss for w in self.workers.values() if math.isfinite(w.last_loss)])
            elapsed = now - self._serving_since if self._serving_since is not None else 0.0
            response = pb.GetStatusResponse(
                run_id=self.run_id, version=self.shown_version, run_state=self._run_state(), target_rounds=self.spec.run.rounds,
                latest_loss=sum(losses) / len(losses) if losses else math.nan,
                tokens_per_second=self.total_tokens / elapsed if elapsed > 0 else 0.0,
                param_sha256=self.param_sha256.hex(), total_tokens=min(self.total_tokens, INT64_MAX),
                curriculum=self.tracker.status(now, self.shown_version), applied_tokens=min(self.applied_tokens, INT64_MAX),
                pace=self.pace.reason,
            )
            self.traffic.fill(response)
            utilizations = []
            for w in self._listed_workers():
                utilization = w.utilization()
                if utilization is not None:
                    utilizations.append(utilization)
                response.workers.add(
                    worker_id=w.worker_id, name=w.name, state=w.state, base_version=w.base_version,
                    seconds_since_heartbeat=now - w.last_seen, device=w.device, reason=w.reason,
                    assignment=self._assignment(w), clipped_updates=w.clipped_updates, stale_updates=w.stale_updates,
                    dropped_updates=w.dropped_updates, outlier_rounds=sum(1 for _, flag in w.recent if flag),
                    outlier=w.outlier, late_updates=w.late_updates, trained_tokens=min(w.trained_tokens, INT64_MAX),
                    applied_tokens=min(w.applied_tokens, INT64_MAX), step_seconds=w.step_seconds() or 0.0,
                    run_id=self.run_id,
                    round_bytes_up=w.round_bytes_up, round_bytes_down=w.round_bytes_down,
                    utilization=utilization or 0.0,
                )
            response.utilization = sum(utilizations) / len(utilizations) if utilizations else 0.0
            current = self.round
            open_round = pb.RoundStatus(
                version=current.version, reports=len(current.reports) + len(current.late),
                tokens=sum(u.tokens for u in current.reports.values()) + sum(late.tokens for late in current.late.values()),
                opened_at=current.opened_at, dropped=current.dropped, run_id=self.run_id,
            )
        for r in self.store.recent_rounds(STATUS_ROUNDS):
            response.rounds.add(
                version=r.version, reports=r.reports, tokens=r.tokens, opened_at=r.opened_at, closed_at=r.closed_at,
                close_reason=r.close_reason, update_norm=r.update_norm, clipped=r.clipped, dropped=r.dropped,
                aggregation=r.aggregation, run_id=self.run_id,
            )
        response.rounds.append(open_round)
        return response

    def _listed_workers(self) -> list[WorkerRecord]:
        """The memberships GetStatus lists (lock held): every active one, then the STATUS_ENDED_WORKERS
        that ended last, oldest first, so the reply stays far below the message limit."""
        ended = list(itertools.islice(reversed(self._ended.values()), STATUS_ENDED_WORKERS))
        return [*self._active.values(), *reversed(ended)]

    def round_progress(self, wait_s: float = PROGRESS_WAIT_S) -> decisions.RoundProgress | None:
        """The open round as the health service judges it (`decisions.decide_progress`; the health thread;
        takes `_lock`, waiting at most `wait_s`: None when it is held longer, so that a holder stuck in a write
        never stops the health thread, whose tick record then says the ticker stalled). A round nobody pulled
        yet has been open for 0 s."""
        if not self._lock.acquire(timeout=wait_s):
            return None
        try:
            current = self.round
            open_s = self.clock() - current.opened_at if current.started else 0.0
            return decisions.RoundProgress(
                self.run_id, open_s, self.spec.sync.round_deadline_s + current.budget_s,
                len(current.reports) + len(current.late), self.spec.coordinator.health_round_deadlines,
            )
        finally:
            self._lock.release()

    def close(self) -> None:
        """Write the outbox (`flush`), then close the store; once the server and the ticker have stopped (takes
        `_lock` only to take the outbox's rows)."""
        self.flush()
        self.store.close()

    # The three reads below identify a caller (the server's guard, a RunGroup's routing) without `_lock`, so a run
    # whose lock is held (a write under it) stalls no call of another run's worker: each reads one entry of `workers`
    # (a dict lookup, atomic) and that record's fields, a snapshot that may be a moment old. Whatever the call then
    # does, its run checks again under its lock (`_authenticated`).

    def owns_credential(self, worker_id: str, secret: bytes) -> bool:
        """Whether `worker_id` is an active member whose worker secret is `secret` (any thread; none: a snapshot)."""
        worker = self.workers.get(worker_id)
        return worker is not None and worker.active and worker.owns(secret)

    def claim(self, request: pb.JoinRequest) -> str:
        """The membership of this run `request` names with that membership's own worker secret, else "" (`_claimed`,
        a WARNING for a name this run knows sent without its secret) (any thread; none: a snapshot of one entry, and a
        read of the digest the store holds for the id, which counts when memory no longer holds it). A sweep's
        placement asks it (sweep.py `RunGroup.join`)."""
        return self._claimed(request, self.store.joined_digest(request.previous_worker_id))

    def knows(self, worker_id: str) -> bool:
        """Whether `worker_id` joined this run and is still in memory, active or not (any thread; none: a
        snapshot)."""
        return worker_id in self.workers

    def membership_state(self, worker_id: str) -> int:
        """Membership `worker_id`'s state, WORKER_STATE_UNSPECIFIED when not in memory (any thread; none: a
        snapshot)."""
        worker = self.workers.get(worker_id)
        return pb.WORKER_STATE_UNSPECIFIED if worker is None else worker.state

    def active_workers(self) -> int:
        """The number of active workers (any thread; takes `_lock`)."""
        with self._lock:
            return len(self._active)

    def load(self, reservations: Collection[Reservation], taking_over: str = "") -> tuple[int, int, int]:
        """(active workers, the places of `coordinator.max_workers` taken in the open round: the active workers and
        the ended memberships whose update is in it (`decisions.decide_place`), how many of `reservations`, a sweep's
        joins placed here, are not seated yet), under one hold of `_lock`, which `_seat` marks a reservation under: a
        join seated meanwhile counts once, as a member (any thread, a RunGroup's `_loads`; takes `_lock`).
        `taking_over`: the membership a join names with its secret; its place is not counted when the join would take
        it over here (`_held_place`, as the join's `decide_place` counts it: an ended membership still in memory)."""
        with self._lock:
            holders = self._place_holders()
            held = holders - set(self._active) - {self._held_place(taking_over, holders)}
            return len(self._active), len(self._active) + len(held), sum(1 for r in reservations if not r.seated)

    def reassign(self, worker_id: str, reason: str) -> None:
        """End a worker's membership here because a sweep moves it to another run; may close the round
        (handler thread, from a RunGroup without its lock; takes `_lock`, writes its event row after releasing it)."""
        with self._locked():
            self._end_membership(self._member(worker_id), pb.WORKER_STATE_REASSIGNED, "reassign", reason)
            close = self.closer.begin()
        self.closer.finish(close)

    def stop(self, reason: str, kind: str = "prune", saved: Mapping[str, str] | None = None) -> None:
        """End the run before its rounds: its sweep pruned it (`kind` "prune") or its wall-time budget is used
        ("budget"). It counts as finished from now on (and after a restart, but for a budget's stop that the restarted
        spec's budget no longer makes: `lift_stop`), its long polls wake, and its workers move on as a finished run's
        do (the ticker, through a RunGroup; writes the store, then takes `_lock`). Its closed rounds and metric rows
        stay. `saved`: run_state values stored with the stop (a budget's stop: the seconds the run was served by
        then, coordinator/sweep.py `SERVED_AT_STOP_KEY`); the stop, they and its event are one transaction
        (`StateStore.record_run_state`): a failed write leaves none of them, and the run goes on."""
        self.store.record_run_state(kind, reason, self.clock(), values={"stopped": reason, **(saved or {})})
        with self._lock:
            self.stopped = reason
            self._version_changed.notify_all()

    def lift_stop(self, reason: str) -> None:
        """Undo the run's stop at a start (a RunGroup's constructor: a run ended at its wall-time budget that the
        restarted spec's budget no longer ends, `forecasts.decide_budget_resume`): its stored stop removed with a
        "budget" event saying why (`reason`), in one transaction (`StateStore.record_run_state`), so a failed write
        leaves it stopped without a word of a resume, and a start after it decides again; it trains on from now as a
        run whose rounds were raised does (takes `_lock` after writing)."""
        self.store.record_run_state("budget", reason, self.clock(), unset=("stopped",))
        with self._lock:
            self.stopped = None

    def _note_refusal(self, name: str, why: str) -> None:
        """Count worker `name` among those that refused this run, with `why` (lock held; the store's copy is posted,
        `_save_refusals`); the oldest beyond MAX_REFUSALS is forgotten."""
        self.refusals.pop(name, None)
        self.refusals[name] = (self.clock(), why)
        if len(self.refusals) > MAX_REFUSALS:
            del self.refusals[next(iter(self.refusals))]
        value = json.dumps([[n, when, text] for n, (when, text) in self.refusals.items()])
        self._post(REFUSALS_KEY, lambda: self._save_refusals(name, value))

    def _save_refusals(self, name: str, value: str) -> None:
        """Write the refusals (`value`, the newest with `name`'s) posted by `_note_refusal`, best effort (`flush`):
        a count to show, not the run's state (the Leave it came with has ended the membership)."""
        try:
            self.store.set_many({REFUSALS_KEY: value})
        except StoreError as error:
            self.log.warning("the refusal of %s was not saved (%s); it is counted until this coordinator stops", name,
                             error)

    def summary(self, status: pb.GetStatusResponse | None = None) -> pb.RunSummary:
        """This run in one line, from `status` when the caller already has it (else takes `_lock` via `status`), with
        the workers that refused it (takes `_lock`; a handler's wait bounded by its call's deadline, as `status`)."""
        summary = run_summary(self.spec, status or self.status())
        with self._hold():
            summary.refused_by = len(self.refusals)
            summary.last_refusal = next(reversed(self.refusals.values()))[1] if self.refusals else ""
        return summary

    def tick(self) -> None:
        """Evict expired workers and persistent outliers, forget long-ended ones and close the round if it is
        due (the ticker thread, every TICK_S; takes `_lock`, writes its event rows after releasing it without waiting
        for another flush, and closes a round as `RoundCloser.finish` says). A stall of the coordinator itself, its
        clock's (`_note_stall`) or on its own lock (`_note_lock_stall`: the ticker waited for the lock, or a holder
        kept it, longer than a heartbeat interval), gives the members not heard since a grace first."""
        asked = time.monotonic()
        with self._locked(wait=False):
            waited = time.monotonic() - asked
            now = self.clock()
            self._note_stall(now)
            self._note_lock_stall(now, max(waited, self._long_hold_s))
            self._long_hold_s = 0.0
            for worker_id, reason in decisions.decide_evictions(now, self._active_views(), self.membership,
                                                                self._resumed_at):
                self._end_membership(self._active[worker_id], pb.WORKER_STATE_EVICTED, "evict", f"evicted: {reason}", now)
            self._evict_outliers(now)
            forgotten = decisions.decide_forgetting(now, (w.view() for w in self._ended.values()), self.membership,
                                                    len(self._ended))
            for worker_id, _ in forgotten:
                del self._ended[worker_id], self.workers[worker_id]
            if forgotten:
                self.log.debug("forgot %d ended memberships (%s)", len(forgotten), forgotten[-1][1])
            close = self.closer.begin()
        self.closer.finish(close)

    def _note_stall(self, now: float) -> None:
        """With a LivenessClock: if it saw a stall since the last tick, the coordinator resumed now; members not
        heard since get a grace (`decisions.decide_evictions`), and the stall is an event (lock held)."""
        if not isinstance(self.clock, LivenessClock):
            return
        beat = self.clock.stalls
        if beat.stalls > self._stalls_seen:
            self._stalls_seen, self._resumed_at = beat.stalls, now
            grace = self.membership.lease_s + self.membership.stall_grace_s
            self._post_event("", "stall", f"{beat.reason}; members not heard since have {grace:.1f} s", now)

    def _note_lock_stall(self, now: float, stalled_s: float) -> None:
        """The ticker waited `stalled_s` for the lock, or a holder kept it that long (`_locked`; lock held): longer
        than a worker's heartbeat interval (lease_s / LOCK_STALL_BEATS), the heartbeats queued behind it were held
        up as by a stall of the coordinator, so the coordinator resumed now, as `_note_stall` says, whether or not
        they or this tick took the lock first once it was released."""
        if stalled_s <= self.membership.lease_s / LOCK_STALL_BEATS:
            return
        self._resumed_at = now
        grace = self.membership.lease_s + self.membership.stall_grace_s
        self._post_event("", "stall", f"the run's lock was held {stalled_s:.1f} s (a slow read under it?); members "
                                      f"not heard since have {grace:.1f} s", now)

    def _evict_outliers(self, now: float) -> None:
        """End the membership of every active worker `decide_outlier_evictions` names (lock held)."""
        outliers = decisions.decide_outlier_evictions((w.outlier_view() for w in self._active.values()), self.outliers)
        for worker_id, reason in outliers:
            self._end_membership(self._active[worker_id], pb.WORKER_STATE_EVICTED, "evict", f"evicted: {reason}", now)

