"""The round close: from a round's updates to the next version, served.

A close runs in three steps (`RoundCloser`), and only the first and the last hold the
coordinator's `_lock`:

1. `begin` (lock held), called by whichever call makes the close due (`push`, `leave`, `tick`,
   `reassign`): `decisions.decide_round_close` says the open round is due, so its reports are
   frozen (`OpenRound.closing`) and what the close reads is taken as a snapshot (`RoundClose`).
2. `compute` (without the lock, on the calling thread): the aggregate of the round's updates and
   of the late ones merged into it (the direction check, then `sync.aggregation`, in sorted worker
   order), the outer Nesterov step (`sync.outer.outer_step`, the one both backends share), the
   compressed step every worker holding θ_v can rebuild bit for bit, the checkpoint written with its
   digest in one pass and the SQLite commit (with the dropped and flagged updates' events, the
   reference norms and the round's reporters, `close_reporters`), and the payloads of the new version
   (`ClosedRound`).
3. `publish` (lock held): serve the committed version, open the next round, note how each update
   fared, decide the pace, evict persistent outliers, wake the waiters of `_version_changed`, advance
   the curriculum. The round is open before any of these can fail, and one that raises (a store
   refusing an events row) is logged: a committed version never leaves the run behind.

`finish` runs steps 2 and 3 once the caller released the lock; a failed step 2 restores the broadcast
residual, reopens the round and wakes the waiters, so the next tick retries it. One close at a time:
while `under_way` is set, the closing thread alone changes θ, the momentum, the version and the
broadcast residual. A close writes its results into what the close before left unread (`SpareBuffers`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import aggregation, decisions
from rcswarm.coordinator.records import (
    REFERENCE_NORMS_KEY,
    ClosedRound,
    LateUpdate,
    LazyPullPayload,
    OpenRound,
    RoundClose,
    SpareBuffers,
)
from rcswarm.coordinator.resume import optimizer_state
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import outer, tensor_stream
from rcswarm.sync.norm_bound import update_norm_bound

if TYPE_CHECKING:
    from rcswarm.coordinator.service import SwarmCoordinator


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


def close_reporters(round_: OpenRound, places: Mapping[str, str]) -> dict[str, int]:
    """worker_id -> the newest base version of its updates in the closing round `round_` (its on-time updates were
    trained from the round's version, a late one from that less its staleness), for every membership whose update
    the round counts: each update's owner and the re-join that took its place over (`places`), which carried the
    owner's delivered version. Committed with the round (`StateStore.commit_version`), they let a restarted
    coordinator answer such a membership's re-push "already delivered" (service.py `join`). Pure."""
    bases = {owner: round_.version for owner in round_.reports}
    for owner, item in round_.late.items():
        bases[owner] = max(bases.get(owner, -1), round_.version - item.lateness.staleness)
    for owner, base in list(bases.items()):
        holder = places.get(owner)
        if holder is not None and holder != owner:
            bases[holder] = max(bases.get(holder, -1), base)
    return bases


def load_norm_history(spec: RunSpec, store: StateStore) -> tuple[tuple[float, ...], ...]:
    """The reference norms of the last `sync.reference_rounds` rounds, as stored (the constructor)."""
    stored = json.loads(store.get(REFERENCE_NORMS_KEY) or "[]")
    history = tuple(tuple(float(n) for n in norms) for norms in stored if isinstance(norms, list))
    return history[len(history) - spec.sync.reference_rounds:] if spec.sync.reference_rounds else ()


class RoundCloser:
    """The close pipeline of one `SwarmCoordinator`, and the state only closes write.

    It is a part of the coordinator kept in its own module: it reads and writes the run's state
    (θ, the momentum, the version, its payloads, the open round, the members' counts) under the
    run's `_lock`, as `SwarmCoordinator`'s call contract says, and owns under that same lock the
    close under way (`under_way`), the aggregation's memory (`norm_history`, `norm_bound`,
    `previous_average`) and the buffers the last close left for the next (`spare`);
    `decode_scratch` belongs to the closing thread.
    """

    def __init__(self, run: SwarmCoordinator) -> None:
        """The closes of `run`, whose θ and store are ready (its constructor)."""
        self.run = run
        self.aggregation_options = aggregation.AggregationOptions.from_sync(run.spec.sync)
        self.norm_history = load_norm_history(run.spec, run.store)
        # The previous round's aggregate: centered_clip's starting point (None after a start).
        self.previous_average: outer.Tensors | None = None
        self.norm_bound = update_norm_bound(run.spec, run.params)
        # The close under way (set by `begin`, cleared when it is published or failed).
        self.under_way: RoundClose | None = None
        # What the last published close left unread (the closing thread writes into it; None before one).
        self.spare: SpareBuffers | None = None
        # Scratch buffers held updates decode into during a close (`aggregation.decoding_into`; the closing
        # thread alone uses them, one close at a time).
        self.decode_scratch: list[torch.Tensor] = []

    def begin(self) -> RoundClose | None:
        """With the lock held: if no close runs and the decision says the open round is due, freeze its reports,
        mark the close begun and return what it reads; else None. The caller passes the answer to `finish` once
        it released the lock."""
        run = self.run
        if run.finished or self.under_way is not None:
            return None
        now = run.clock()
        decision = decisions.decide_round_close(now, run.round.view(), run._active_views(), run.round_options)
        if not decision.ok:
            return None
        run.round.closing = True
        places_version, places = run._place_of
        self.under_way = RoundClose(
            run.round, decision.reason, now, run.params, run.momentum, run.broadcast_feedback.snapshot(),
            self.norm_history, self.previous_average, self.spare,
            dict(places) if places_version == run.round.version else {},
        )
        return self.under_way

    def finish(self, close: RoundClose | None) -> None:
        """Without the lock: compute and commit the close `begin` began, then publish it under `_lock`.
        On failure the round reopens with its reports, the residual is restored, and the error propagates."""
        if close is None:
            return
        run = self.run
        try:
            closed = self.compute(close)
        except BaseException:
            with run._locked():
                run.broadcast_feedback.restore(close.saved_feedback)
                close.round.closing = False
                self.under_way = None
                run._version_changed.notify_all()
            raise
        with run._locked():  # writes the rows `publish` posted (evicted outliers' events) once released
            self.publish(close, closed)

    def compute(self, close: RoundClose) -> ClosedRound:
        """The heavy part of a close, without the lock (the closing thread owns the broadcast residual): the
        aggregate (the direction check, then `sync.aggregation`) in sorted worker order, the outer step, the
        compressed step, the checkpoint written with its digest in one pass and the SQLite commit (with the
        dropped and flagged updates' events, counted in the round's record, and the reference norms), and both
        payloads of the new version."""
        run, watch = self.run, Stopwatch()
        spec, feedback = run.spec, run.broadcast_feedback
        version, block = close.round.version, spec.sync.block_size
        late = [close.round.late[k] for k in sorted(close.round.late)]
        reports = [close.round.reports[k] for k in sorted(close.round.reports)] + [item.update for item in late]
        trained = [u.tokens for u in reports[:len(reports) - len(late)]] + [item.tokens for item in late]
        # centered_clip keeps the aggregate for the next round: it is neither written into a spare nor consumed.
        recycle = self.aggregation_options.method != "centered_clip"
        spare = close.spare if recycle else None
        with watch.piece("average"), aggregation.decoding_into(reports, self.decode_scratch):
            result = aggregation.aggregate(
                reports, self.aggregation_options, [n for norms in close.history for n in norms], close.previous,
                None if spare is None else spare.residual,
            )
            average = result.average
        with watch.piece("norm"):
            norm = tensor_stream.global_norm(average)
        with watch.piece("outer step"):
            target, momentum = outer.outer_step(
                close.params, close.momentum, average, spec.outer,
                spare_momentum=None if close.spare is None else close.spare.momentum, consume_average=recycle,
            )
        with watch.piece("compressed step"):
            params, encoded_step = outer.compressed_step(
                close.params, target, run.step_format, block, feedback, consume_target=True,
                spare_params=None if close.spare is None else close.spare.released_params(),
            )
        record = RoundRecord(
            version=version, opened_at=close.round.opened_at, closed_at=close.decided_at, reports=len(reports),
            tokens=sum(trained), close_reason=close.reason + late_summary(late), update_norm=norm,
            param_sha256="", clipped=result.clipped, dropped=close.round.dropped + result.dropped,
            aggregation=result.summary, steps=close.round.steps,
        )
        keep = spec.sync.reference_rounds
        history = (*close.history, result.accepted_norms)[-keep:] if keep else ()
        with watch.piece("commit"):
            run.store.commit_version(
                run.run_id, version + 1, params, optimizer_state(momentum, feedback, run.codec), record,
                run_state={REFERENCE_NORMS_KEY: json.dumps([list(norms) for norms in history])},
                events=[(o.worker_id, o.action, f"round {version}: {o.reason}", close.decided_at)
                        for o in result.outcomes if o.flagged],
                reporters=close_reporters(close.round, close.places),
            )
            sha = run.store.committed_digest(version + 1)
            record = dataclasses.replace(record, param_sha256=sha.hex())
            for o in result.outcomes:
                if o.action == "dropped":
                    run.log.warning("round %d: update of %s dropped: %s", version, o.worker_id, o.reason)
        with watch.piece("norm bound"):
            norm_bound = update_norm_bound(spec, params)
        with watch.piece("step payload"):
            header, chunks = tensor_stream.build_payload(
                params, codec=run.step_format, run_id=run.run_id, version=version + 1, block_size=block,
                encoded=encoded_step,
            )
            header.delta_from_version = version
            header.result_sha256 = sha
        full = LazyPullPayload(params, run.run_id, version + 1, sha)
        applied = applied_tokens(reports, trained, result.outcomes)
        return ClosedRound(
            params, momentum, sha, full, (header, chunks), record, watch.seconds, result, history, norm_bound, applied
        )

    def publish(self, close: RoundClose, closed: ClosedRound) -> None:
        """Serve the committed version and open the next round, then note how each update fared, decide the pace,
        evict persistent outliers, wake the waiters and advance the curriculum (lock held).

        The version is committed, so nothing after serving it may leave the run behind: the next round is open and
        the close no longer under way before any step that can fail, a step that raises (the pace decision, an
        eviction whose event row the store refuses, the curriculum) is logged and the others go on, and the waiters
        of `_version_changed` are woken whatever happens."""
        run, version = self.run, close.round.version
        self.spare = SpareBuffers(run.momentum, close.saved_feedback, run.params, run._pull_payload)
        run.params, run.momentum, run.version = closed.params, closed.momentum, version + 1
        run.param_sha256 = closed.param_sha256
        run._pull_payload = closed.pull_payload
        run._delta_payload = (version, *closed.step_payload)
        run.round = OpenRound(version + 1, run.clock(), started=True, budget_s=run.pace.round_seconds)
        self.under_way = None
        self.norm_history, self.norm_bound = closed.history, closed.norm_bound
        self.previous_average = closed.aggregate.average if self.aggregation_options.method == "centered_clip" else None
        run.last_close_seconds = closed.seconds
        try:
            for worker_id, tokens in closed.applied.items():
                run.applied_tokens += tokens
                if worker_id in run.workers:
                    run.workers[worker_id].applied_tokens += tokens
            for o in closed.aggregate.outcomes:
                worker = run.workers.get(o.worker_id)
                if worker is not None:
                    worker.note_round(version, o.action if o.flagged else "", o.reason, run.outliers.window)
            self._carry_on(version, "the pace decision (the pace stays)", lambda: self._pace_round(run))
            self._carry_on(version, "evicting outliers", lambda: run._evict_outliers(run.clock()))
        finally:
            run._version_changed.notify_all()
        # One short line per round, naming its run; the close's pieces and the aggregation's account at DEBUG (the
        # rounds table and `rcswarm status` keep the latter).
        run.log.info("round %d closed, version %d served: %s; %d reports, %d tokens, %.3f s", version, version + 1,
                     close.reason.removeprefix(f"round {version}: "), closed.record.reports, closed.record.tokens,
                     sum(closed.seconds.values()))
        pieces = ", ".join(f"{name} {seconds:.3f}" for name, seconds in closed.seconds.items())
        run.log.debug("round %d: close pieces (s): %s; %s", version, pieces, closed.record.aggregation)
        # The version is committed and served; a failed curriculum step keeps the current L.
        self._carry_on(version, "the curriculum decision (L stays)",
                       lambda: run.tracker.advance(close.decided_at, version, list(run._active)))

    @staticmethod
    def _pace_round(run: SwarmCoordinator) -> None:
        """Decide the pace of the round a close just opened: its budget is the new pace's (lock held)."""
        run._decide_pace()
        run.round.budget_s = run.pace.round_seconds

    def _carry_on(self, version: int, what: str, step: Callable[[], object]) -> None:
        """Run one step of publishing round `version`'s close; one that raises is logged with what it was, and the
        run goes on on the version already served (lock held)."""
        try:
            step()
        except Exception:
            self.run.log.exception("round %d: %s failed after version %d was served; the run goes on", version, what,
                                   version + 1)
