"""Update and metric intake: every reason the coordinator refuses a push or a metrics report, in one place.

A push (`SwarmCoordinator.push`) passes, in this order: its stream's first message must be the meta
(`first_part`); the worker secret (service.py, `_authenticated`); `UpdateIntake.check_meta` under the lock
(a negative base version: INVALID_ARGUMENT, before anything is recorded; a duplicate: ALREADY_EXISTS; tokens out of
range: INVALID_ARGUMENT; a stale update, one trained from a version a fallback set aside, or one for a finished or
stopped run: FAILED_PRECONDITION, counted and recorded as a `stale` event at most once per worker and round; a
version that does not exist yet: FAILED_PRECONDITION; a round that already holds `coordinator.max_workers` updates of
its kind: RESOURCE_EXHAUSTED; tokens above the assignment's bound); then, without the lock, `receive_update` decodes
and validates the payload (names, shapes, sizes, CRCs, finite values: INVALID_ARGUMENT); then under the lock again both
checks once more and the norm bound, and `UpdateIntake.record` puts it into the open round.

Bounded influence: an update is refused (INVALID_ARGUMENT, recorded as a `dropped` event,
`refuse_outlier`) when its tokens exceed its assignment's batch × seq_len × inner.steps
(`sync.bound_tokens`, `token_bound`; with `sync.overlap` the larger of its base version's assignment and the one
before, `trained_since`) or its norm the hard bound (`sync.max_update_norm`, 0 =
`norm_bound.automatic_norm_bound`). What the close then does with the kept ones is close.py's.

Late updates (issue #15): an update trained from a version this membership pulled, at most
`sync.max_staleness` versions old (`decisions.decide_staleness`), is kept in the open round's `late`
updates with its tokens weighted by the staleness weight; an older one is refused (FAILED_PRECONDITION
naming both versions). A push for a round that is closing waits for the close and then arrives late.

Updates a round holds. One round holds at most `coordinator.max_workers` on-time updates and as many late ones
(`round_room`, RESOURCE_EXHAUSTED naming the cap): one membership delivers at most one of each to a round, and
admission (service.py, `decide_place`) counts a membership that ended with an update still in the open round as
holding its place until that round closes, so a join-token holder can no longer put any number of updates into one
round by joining, pushing and leaving again and again under new ids. The cap is the second line of that defence.

Set-aside versions. A coordinator that resumed from an older verified checkpoint (state/store.py, `load_current`)
serves that θ under a new number, past every version it committed before, and the versions above the verified one
are set aside (`StateStore.rejected_versions`): their θ no longer exists in this run. An update trained from one is
refused with FAILED_PRECONDITION whatever its staleness (`set_aside`): the worker drops it, pulls and trains on, and
no update is merged into a θ whose ancestry does not hold the θ it was trained from. An update from a version that
does not exist yet (a worker ahead of a coordinator that lost versions some other way) is FAILED_PRECONDITION too:
the worker pulls and re-syncs, where INVALID_ARGUMENT would end it. Metric rows of a set-aside version are not stored.

Metrics: the rows of the run the request names (`ReportMetricsRequest.run_id`; another run's are refused with
FAILED_PRECONDITION, never stored here), at most MAX_METRICS_PER_REQUEST rows a request, each in range
(`metric_problem`, checked without the lock; its tokens at most one step's, `step_token_bound`; its held-out loss
at most observe/forecast.py MAX_LOSS, the one bound the forecasts, the fits' step means and the worker's held-out
losses share, and a loss above it stored as none, `without_diverged_loss`: a diverged step's; rows of a version the
run has not served are not stored, nor a trained step's row
its worker reported before, `StateStore.add_new_metrics`), and per worker at most
`coordinator.max_metrics_per_round` rows while one version is current and `coordinator.metric_rows_per_s` over
time (`count_metric_rows`, `decisions.decide_metric_rows`, RESOURCE_EXHAUSTED). The limits are records.py's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

import grpc
import torch

from rcswarm.coordinator import aggregation, decisions
from rcswarm.coordinator.records import (
    MAX_METRICS_PER_REQUEST,
    MAX_SHA256_HEX,
    MAX_TOKENS_PER_UPDATE,
    METRIC_LIMITS,
    METRIC_SECONDS,
    LateUpdate,
    Refusal,
    WorkerRecord,
)
from rcswarm.observe.forecast import MAX_LOSS
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream

if TYPE_CHECKING:
    from rcswarm.coordinator.service import SwarmCoordinator


def set_aside(rejected: Sequence[tuple[int, int]], version: int) -> tuple[int, int] | None:
    """The range of `rejected` (first, last each: the versions a fallback set aside) holding `version`, or None."""
    return next(((first, last) for first, last in rejected if first <= version <= last), None)


def round_room(on_time: bool, held: int, max_workers: int, version: int) -> decisions.Decision:
    """Whether the open round of `version`, which holds `held` updates of the kind of the one pushed (on time or
    late), takes one more: at most `max_workers` (`coordinator.max_workers`) of each kind, one per place."""
    kind = "on-time" if on_time else "late"
    if held >= max_workers:
        return decisions.Decision(False, (
            f"round {version} already holds {held} {kind} updates, the cap of coordinator.max_workers = "
            f"{max_workers}; retry once the round closed"))
    return decisions.Decision(True, f"round {version} holds {held} {kind} updates of at most {max_workers}")


def first_part(requests: Iterator[pb.PushUpdateRequest], part: str) -> pb.PushUpdateRequest:
    """The next message of a PushUpdate stream, which must carry `part`; refused otherwise."""
    message = next(requests, None)
    if message is None or message.WhichOneof("part") != part:
        found = None if message is None else message.WhichOneof("part")
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"PushUpdate stream: expected a {part} message, got {found}")
    return message


def require_secret(what: str, worker_id: str, secret: bytes) -> None:
    """Refuse a worker's call that carries no worker secret (UNAUTHENTICATED), before anything else."""
    if not secret:
        raise Refusal(grpc.StatusCode.UNAUTHENTICATED, f"{what} for worker {worker_id!r} carries no worker secret; join first")


def metric_problem(index: int, metric: pb.Metric, step_tokens: tuple[int, str] | None = None) -> str | None:
    """Why `metrics[index]` of a ReportMetrics request is out of range, or None when it is not; `step_tokens`
    (the most tokens one step trains, and why) bounds its tokens."""
    for name, limit in METRIC_LIMITS.items():
        value = getattr(metric, name)
        if not 0 <= value <= limit:
            return f"metrics[{index}].{name} = {value} is out of range: expected 0..{limit}"
    if step_tokens is not None and metric.tokens > step_tokens[0]:
        return (f"metrics[{index}].tokens = {metric.tokens} is out of range: one step trains at most "
                f"{step_tokens[0]} ({step_tokens[1]})")
    for name in METRIC_SECONDS:
        value = getattr(metric, name)
        if not (math.isfinite(value) and value >= 0):
            return f"metrics[{index}].{name} = {value!r} is out of range: expected a finite number >= 0"
    if metric.loss <= 0:
        # A loss <= 0 is no cross-entropy a step can measure, and one such row stored made every fit of the state dir
        # (rcswarm fit, the launcher's law, curriculum.law_from) refuse it whole.
        return f"metrics[{index}].loss = {metric.loss!r} is out of range: expected a number > 0, or NaN for none"
    if not (metric.val_loss == 0 or 0 < metric.val_loss <= MAX_LOSS):
        return (f"metrics[{index}].val_loss = {metric.val_loss!r} is out of range: expected a held-out loss in "
                f"(0, {MAX_LOSS:g}], or 0 for none")
    if not (math.isfinite(metric.val_seconds) and metric.val_seconds >= 0):
        return f"metrics[{index}].val_seconds = {metric.val_seconds!r} is out of range: expected a finite number >= 0"
    if len(metric.param_sha256) > MAX_SHA256_HEX:
        return f"metrics[{index}].param_sha256 has {len(metric.param_sha256)} characters: expected at most {MAX_SHA256_HEX}"
    return None


def without_diverged_loss(metric: pb.Metric) -> pb.Metric:
    """`metric` as stored: a loss above MAX_LOSS (+inf included) is a diverged step's, no point of a curve, and is
    stored as no loss (NaN), the row and its tokens kept. Refused, such a row took its whole report with it (the
    honest rows beside it), and before a re-join ended its worker (a refusal is fatal to a client); stored as sent,
    one of 1.7e308 made every fit of the state dir and the dashboard's /api/status and /metrics fail with
    OverflowError, in every later read."""
    if not metric.loss > MAX_LOSS:
        return metric
    stored = pb.Metric()
    stored.CopyFrom(metric)
    stored.loss = math.nan
    return stored


def check_metrics(metrics: Sequence[pb.Metric], step_tokens: tuple[int, str] | None = None,
                  lengths: Collection[int] | None = None) -> None:
    """Refuse a batch of too many metric rows or one with a row out of range, all of it (INVALID_ARGUMENT; no lock).
    `lengths`: the sequence lengths the run ever assigns (`analysis.run_lengths`; None: any); a training row
    (tokens > 0) at another length was trained for no assignment of this run, and a fit would take it as a length
    of its own (a worker reporting a few rows at each of hundreds of lengths once made every fit take seconds)."""
    if len(metrics) > MAX_METRICS_PER_REQUEST:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"{len(metrics)} metrics in one request: at most {MAX_METRICS_PER_REQUEST}")
    for index, metric in enumerate(metrics):
        problem = metric_problem(index, metric, step_tokens)
        if problem is None and lengths is not None and metric.tokens > 0 and metric.seq_len not in lengths:
            problem = (f"metrics[{index}].seq_len = {metric.seq_len}: not a length this run assigns "
                       f"(expected one of {sorted(lengths)})")
        if problem is not None:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"metrics refused: {problem}")


def receive_update(
    header: pb.TensorHeader, requests: Iterator[pb.PushUpdateRequest], shapes: dict[str, tuple[int, ...]],
    run_id: str, version: int, wire_format: codecs.WireFormat | None = None,
) -> tuple[aggregation.EncodedDeltas, float, int]:
    """Reassemble and validate a pseudo-gradient of the run's `shapes` in the run's `wire_format` (its codec and,
    for int8, sparse and low-bit, its block, density and bits: every worker encodes in it, and another format could
    ask for several times the memory the run plans per update before any chunk arrives); it, held encoded until
    the close, its global L2 norm and the bytes of its header and chunk messages (without the lock: nothing here
    touches shared state)."""
    size = pb.PushUpdateRequest(header=header).ByteSize()
    allowed = None if wire_format is None else (wire_format.codec,)
    try:
        receiver = tensor_stream.PayloadReceiver(
            header, expected=shapes, run_id=run_id, version=version, allowed_codecs=allowed, expected_format=wire_format
        )
        for message in requests:
            if message.WhichOneof("part") != "chunk":
                raise tensor_stream.PayloadError(f"expected a chunk message, got {message.WhichOneof('part')}")
            receiver.add(message.chunk)
            size += message.ByteSize()
        deltas, payload = receiver.finish_encoded()
        tensor_stream.check_finite(deltas)
    except tensor_stream.PayloadError as exc:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"update rejected: {exc}") from None
    return aggregation.EncodedDeltas(header, payload), tensor_stream.global_norm(deltas), size


class UpdateIntake:
    """The checks and records of one `SwarmCoordinator`'s update intake: a part of the coordinator kept in its
    own module. Every method reads and changes the run's open round and its members' counts with the run's `_lock`
    held, as `SwarmCoordinator`'s call contract says, and posts its events rows (stale, dropped, late) to the run's
    outbox (`SwarmCoordinator._post_event`), which the push writes once it released the lock: never a store write
    under the lock, and best effort (a full disk is a WARNING, not the push's error). Its own state, the workers whose stale
    refusal this round already recorded (`_stale_noted`), is guarded by that same lock."""

    def __init__(self, run: SwarmCoordinator) -> None:
        self.run = run
        # (version, worker ids): the round whose stale refusals were recorded, and whose (`refuse_stale`).
        self._stale_noted: tuple[int, set[str]] = (-1, set())

    def check_meta(self, worker: WorkerRecord, meta: pb.UpdateMeta) -> decisions.Lateness:
        """Refuse a stale, future, duplicate or out-of-range update, or one claiming more tokens than its
        assignment allows; else whether it is on time or late and its weight (lock held; may wait for a
        close, releasing it). A worker's update for a round it already delivered to is a
        duplicate (ALREADY_EXISTS: "it landed") even once that round closed: a push whose answer was
        lost is retried, and "stale" would make the worker keep the error-feedback residual it sent. One from an
        older version than its last accepted update's is refused as stale: replayed, it would count twice.
        A push for a closing round waits for the close (at most coordinator.max_wait_s) when late
        updates are merged, and then arrives late. A negative base version is no version at all (INVALID_ARGUMENT,
        before anything is recorded); a finished run's open round never closes, so no update is taken for it; a
        round that holds `coordinator.max_workers` updates of the kind takes no more (`round_room`)."""
        run = self.run
        if meta.base_version < 0:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"base_version = {meta.base_version}: expected a version >= 0 (the version the update was "
                          "trained from)")
        if meta.base_version == worker.accepted_version:
            raise Refusal(grpc.StatusCode.ALREADY_EXISTS,
                          f"worker {worker.worker_id} already delivered its update for round {meta.base_version}")
        if meta.base_version < worker.accepted_version:
            self.refuse_stale(worker, f"update from version {meta.base_version} after this worker's update from "
                                      f"version {worker.accepted_version} was taken: a worker's updates come from "
                                      "ever newer versions; pull and re-sync")
        rejected = set_aside(run.rejected_versions, meta.base_version)
        if rejected is not None:
            self.refuse_stale(worker, f"stale update: trained from version {meta.base_version}, which this run set "
                                      f"aside when it resumed from an older verified checkpoint (versions "
                                      f"{rejected[0]}..{rejected[1]}; the run goes on at version {run.version}): "
                                      "pull and re-sync")
        if meta.base_version > run.version:
            # FAILED_PRECONDITION: the worker pulls and re-syncs (INVALID_ARGUMENT would end it).
            self.run.log.info("%s (%s): update for version %d, which does not exist yet (newest %d)",
                              worker.worker_id, worker.name, meta.base_version, run.version)
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"update for version {meta.base_version} which does not exist yet (newest {run.version}); "
                "pull and re-sync",
            )
        if run.round.closing and run.staleness.max_staleness > 0:
            run._wait_for_close(run.spec.coordinator.max_wait_s)
            run._member(worker.worker_id)
        if run.stopped is not None:  # its open round never closes: an update taken now would never be applied
            self.refuse_stale(worker, f"stale update: the run was stopped at version {run.version} ({run.stopped}); "
                                      "join again")
        if run.finished:  # its open round never closes either: an update taken now would never be applied
            self.refuse_stale(worker, f"stale update: trained from version {meta.base_version} but the run "
                                      f"finished at version {run.version} (run.rounds = {run.spec.run.rounds}); "
                                      "no round takes updates any more")
        lateness = decisions.decide_staleness(meta.base_version, run.version, worker.pulled_version, run.staleness)
        if not lateness.ok:
            worker.base_version = max(worker.base_version, run.version)
            self.refuse_stale(worker, lateness.reason)
        if run.round.closing:
            self.refuse_stale(worker, f"stale update: round {run.version} is closing; pull version "
                                      f"{run.version + 1} once it is served")
        on_time = lateness.staleness == 0
        room = round_room(on_time, len(run.round.reports if on_time else run.round.late),
                          run.spec.coordinator.max_workers, run.version)
        if not room.ok:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"update refused: {room.reason}")
        if not 0 < meta.tokens <= MAX_TOKENS_PER_UPDATE:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"tokens = {meta.tokens}: expected 1..{MAX_TOKENS_PER_UPDATE}")
        if run.spec.sync.bound_tokens:
            allowed, why = self.token_bound(self.trained_since(meta.base_version))
            if meta.tokens > allowed:
                self.refuse_outlier(worker, f"tokens = {meta.tokens} exceed the {allowed} allowed: {why}")
        return lateness

    def trained_since(self, base_version: int) -> int:
        """The oldest version whose assignment an update from `base_version` may have trained steps under: its base,
        or with `sync.overlap` the one before (the steps a worker trains while round v travels count toward its update
        from v+1 but were trained under v's assignment; docs/ARCHITECTURE.md "Overlapped rounds")."""
        return max(0, base_version - 1) if self.run.spec.sync.overlap else base_version

    def token_bound(self, since: int | None = None) -> tuple[int, str]:
        """The most tokens an update to the current version trained from version `since` (None: the current one) may
        claim, and why (lock held).

        batch × seq_len × steps of the largest assignment workers train under at any version from `since` to this one
        (`CurriculumTracker.largest_assignment`: the adaptive curriculum's workers may train rungs of their own;
        steps: inner.steps, or sync.max_steps for time-boxed rounds, `SyncSection.step_cap`); with curriculum.worker_seq_lens
        the largest listed one's, because a worker that joins again mid-round pushes the update it trained
        under its previous membership's length.
        """
        run = self.run
        steps = run.spec.sync.step_cap(run.spec.inner.steps)
        batch, seq_len, where = self._largest_step(since)
        cap = "inner.steps" if run.spec.sync.round == "steps" else "sync.max_steps"
        return batch * seq_len * steps, f"batch {batch} × seq_len {seq_len} × {cap} {steps} of {where}; sync.bound_tokens = true"

    def step_token_bound(self) -> tuple[int, str]:
        """The most tokens one inner step trained from a version a late update may still come from (`token_bound`
        without the steps), and why: the bound on a metric row's tokens (lock held; a worker reports a round's rows
        after its push, so after the close; with `sync.overlap` the rows of steps trained while the previous round
        travelled, under that round's assignment, `trained_since`)."""
        run = self.run
        if run.spec.sync.backend == "hivemind":
            # Peers train at versions of their own, ahead of what they reported (and this run's own version stays 0):
            # the largest window of the run at any version. Before, the assignment at version 0 bounded every row,
            # so the first lengthening of curriculum.schedule had every later row refused.
            key, seq_len, batch = run.spec.largest_window()
            return batch * seq_len, f"batch {batch} × seq_len {seq_len}, the run's largest window ({key})"
        batch, seq_len, where = self._largest_step(self.trained_since(run.version - run.staleness.max_staleness - 1))
        return batch * seq_len, f"batch {batch} × seq_len {seq_len} of {where}"

    def _largest_step(self, since: int | None = None) -> tuple[int, int, str]:
        """(batch, seq_len, where from) of the largest step a worker trains from any version of `since` (None: the
        current one) to the current one (lock held)."""
        run = self.run
        data, section = run.spec.data, run.spec.curriculum
        if section.worker_seq_lens:
            _, seq_len, batch = run.spec.largest_window()
            where = "the largest assignment of curriculum.worker_seq_lens"
        else:
            since = run.version if since is None else max(0, min(since, run.version))
            current = run.tracker.largest_assignment(run.version, since)
            seq_len, batch = current.seq_len, current.batch_size
            where = (f"the assignment at version {run.version}" if since == run.version
                     else f"the largest assignment of versions {since}..{run.version}")
        diag = ' (data.source = "diag": data.seq_len bounds the scored positions of a sequence)' if data.source == "diag" else ""
        return batch, seq_len, where + diag

    def refuse_stale(self, worker: WorkerRecord, message: str) -> NoReturn:
        """Count a stale update of `worker`, record it (a `stale` event and a log line, once per worker and round:
        a member repeating a stale push must not grow the events table, which is never pruned), then refuse it with
        FAILED_PRECONDITION, every time (lock held)."""
        run = self.run
        worker.stale_updates += 1
        version, noted = self._stale_noted
        if version != run.version:
            version, noted = run.version, set()
            self._stale_noted = (version, noted)
        if worker.worker_id not in noted:
            noted.add(worker.worker_id)
            run._post_event(worker.worker_id, "stale", message, run.clock())
            run.log.info("%s (%s): %s", worker.worker_id, worker.name, message)
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, message)

    def refuse_outlier(self, worker: WorkerRecord, message: str) -> NoReturn:
        """Record an update refused for its norm or tokens (a `dropped` event, the round's and the worker's
        counts, once per worker and round) and raise its INVALID_ARGUMENT refusal (lock held)."""
        run = self.run
        version = run.version
        first = not (worker.recent and worker.recent[-1] == (version, "dropped"))
        if first:
            worker.note_round(version, "dropped", message, run.outliers.window)
            run.round.dropped += 1
            run._post_event(worker.worker_id, "dropped", f"round {version}: {message}", run.clock())
            self.run.log.warning("round %d: update of %s dropped: %s", version, worker.worker_id, message)
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, message)

    def record(
        self, worker: WorkerRecord, meta: pb.UpdateMeta, lateness: decisions.Lateness, norm: float,
        deltas: dict[str, torch.Tensor],
    ) -> None:
        """Put an accepted update into the open round: on time among its reports, late (its tokens
        weighted by the staleness weight, at least 1) among its late updates (lock held)."""
        run = self.run
        if lateness.staleness == 0:
            run.round.reports[worker.worker_id] = aggregation.Update(worker.worker_id, meta.tokens, norm, deltas)
            worker.base_version = run.version + 1
            cap = run.spec.sync.step_cap(run.spec.inner.steps)
            run.round.steps = max(run.round.steps, min(meta.inner_steps, cap))
        else:
            weighted = max(1, round(meta.tokens * lateness.weight))
            update = aggregation.Update(worker.worker_id, weighted, norm, deltas)
            run.round.late[worker.worker_id] = LateUpdate(update, meta.tokens, lateness)
            worker.late_updates += 1
            # It trains from the version it pulls next; until then this round does not wait for it.
            if worker.pulled_version < run.version:
                worker.base_version = run.version + 1
            run._post_event(worker.worker_id, "late", lateness.reason, run.clock())
            self.run.log.info("%s (%s): %s", worker.worker_id, worker.name, lateness.reason)
        worker.accepted_version = meta.base_version
        worker.last_seen = run.clock()

    def count_metric_rows(self, worker: WorkerRecord, rows: int) -> int:
        """Count `rows` against the worker's budget (`decisions.decide_metric_rows`) at the current version, or
        refuse them all with RESOURCE_EXHAUSTED (lock held); the version they were counted at."""
        run = self.run
        version = run.shown_version
        decision, worker.metric_budget = decisions.decide_metric_rows(
            run.clock(), version, worker.metric_budget, rows, run.metric_options)
        if not decision.ok:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"worker {worker.worker_id} {decision.reason}")
        return version

    def refund_metric_rows(self, worker: WorkerRecord, version: int, rows: int) -> None:
        """Give back `rows` counted at `version` that the store did not take (lock held)."""
        worker.metric_budget = decisions.refund_metric_rows(worker.metric_budget, version, rows, self.run.metric_options)
