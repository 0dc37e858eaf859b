"""A swarm worker: join, pull, train its round's inner steps, push the pseudo-gradient, repeat.

    rcswarm worker --coordinator HOST:PORT --token T [--device auto] [--tls-ca CA [--tls-cert C --tls-key K]]
    (the command line is cli/worker.py; the hivemind backend's loop is worker/hivemind_worker.py)

One round as the worker sees it: pull version v (checked against its SHA-256), switch to the
(sequence length, batch) the coordinator assigns for v if it differs, keep a copy θ_v, train as the
assignment paces it (issue #15: its `inner_steps`, or with `round_seconds` > 0 until that budget is
used, finishing the current step), push Δ = θ_v − θ_local compressed by the run's codec (with error
feedback when enabled) with the tokens and steps it trained, report the round's metrics, then wait
for version v+1. A late push is merged by the coordinator with a staleness weight (the answer says
so); a stale one (FAILED_PRECONDITION) drops Δ and re-syncs; NOT_FOUND (evicted, or the coordinator
restarted) re-joins, naming the run it trained for (a sweep sends it back there while that run wants
workers), and a finished update whose base version is still current after the re-join is pushed again; one that
had landed is pushed again as it was encoded while its version is current, and v+1 awaited, so that no round is
trained twice from one version. A re-join keeps the model, its inner optimizer, the data stream and the
error-feedback residual unless it lands in another run or the spec changed what shapes them (`rebuild_reason`). A
round whose Δ is not finite (diverged local training) is dropped with one WARNING line, the inner optimizer starts
afresh and θ is pulled again; MAX_DIVERGED_ROUNDS of them in a row end the worker.
Metric rows go to the run they were trained for or nowhere (`_join`, `_flush_previous`), their byte counters counting
what the membership sending them moved and spent in that run (`RunCounters`). Each join
returns a worker secret, kept in memory only (`Identity`) and sent on every later call of that
membership; a re-join replaces it. Stalls, restarts, capacity limits and broken streams are
retried by the client for `--patience-s` seconds
(`client.classify`). Only a refused join token, a refused identity (PERMISSION_DENIED: the
coordinator does not take this worker's secret for its id), a refused request, a run spec this
worker cannot build or whose model is above its limit (`--max-params`, worker/limits.py: counted before
anything is allocated), a git dataset outside its `--data-root` (worker/data_root.py), spent patience, a run of refused payloads or of diverged rounds end the worker, with one ERROR line saying why and exit status 1;
a finished run exits 0. A stop (SIGTERM or SIGINT in `rcswarm worker`) finishes the current step, sends
Leave and exits 0; a push or pull in flight is cancelled within 0.2 s of it, as it is once the coordinator stayed
silent for the patience (`CoordinatorClient._watched`; before, the attempt ran to `--transfer-timeout-s`). What a round trains is the `RoundTrainer`'s (train/round.py); this loop is the wire.
How the loop ended is typed (`Worker.end`, an `End`), so that whoever starts the worker again (the Ray actor,
worker/ray_worker.py) decides from the kind, not from the words of `exit_reason`.

With `[sync] overlap = true` (issue #29) the wire leaves the training thread: after H steps the worker
snapshots θ_pushed, hands Δ to an `Exchange` thread (push, metrics, await v+1, pull θ_{v+1} into a buffer)
and trains the next round's steps from θ_local meanwhile; at the first step boundary after θ_{v+1} landed it
merges θ ← θ_{v+1} + (θ_local − θ_pushed) (`RoundTrainer.rebase`) and the steps trained since the push
count toward the round it pushes next (Δ = θ_{v+1} − θ_local at its end). It waits only when a whole
round's steps are done before θ_{v+1} arrived. NOT_FOUND on the exchange thread (evicted, or the coordinator
restarted) is handed to the training thread, which joins again and finishes the exchange as the blocking path
does: the update in flight is pushed again while its base version is current, and the merge keeps the steps
trained since the push; a stale update is dropped and its residual restored as without overlap. Should the
re-join rebuild the model, the update and the steps since the push are dropped and θ_{v+1} is loaded, not merged.

With `--state-dir` and error feedback the residual is kept on disk for a restart (`sync/feedback_state.py`), written
before each push as it holds once that push lands, so that a residual is never sent twice (`Worker._push_deltas`).
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from enum import StrEnum

import grpc
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.wire import MAX_REFUSED_RUNS, MAX_VAL_LOSS, REFUSED_LEAVE, REFUSED_RUNS_REFUSAL
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream
from rcswarm.sync.feedback_state import (
    FEEDBACK_FILE,
    PUSHING,
    REFUSED,
    load_feedback,
    remove_feedback,
    save_feedback,
)
from rcswarm.sync.norm_bound import SEND_NORM_SHARE, update_norm_bound
from rcswarm.train.bptt.segment_store import SpillSpaceError
from rcswarm.train.inner import StepResult, preload_data, worker_data_seed
from rcswarm.train.round import (
    MAX_DIVERGED_ROUNDS,
    Diverged,
    RoundResult,
    RoundTrainer,
    StepRow,
    check_finite,
    held_out_seed,
    resolve_device,
)
from rcswarm.worker.client import (
    TRANSFER_POLL_S,
    Action,
    CoordinatorClient,
    Identity,
    RetriesExhausted,
    RetryPolicy,
    Stopped,
    Timeouts,
    classify,
    moved,
    wait_until,
)
from rcswarm.worker.data_root import dataset_problem
from rcswarm.worker.limits import ModelLimit
from rcswarm.worker.membership import Membership, end_previous, remove_membership, write_membership
from rcswarm.worker.options import WorkerOptions
from rcswarm.worker.startup import StartupMarks

log = logging.getLogger("rcswarm.worker")
AWAIT_WAIT_S = 2.0
# Heartbeats: a third of the lease the Join answered, within these bounds (`heartbeat_interval`); the lease assumed
# before a Join, or when the answer is not a positive number.
DEFAULT_LEASE_S = 10.0
MIN_HEARTBEAT_S = 0.2
MAX_HEARTBEAT_S = 60.0
# How often one finished update is pushed again after re-joins before it is dropped.
MAX_PUSH_REJOINS = 3
# Metric rows kept while ReportMetrics fails transiently (the newest; a few rounds' worth).
MAX_PENDING_METRICS = 4096
# The run spec's tables that shape the model, its inner optimizer and its data stream.
TRAINING_TABLES = ("model", "inner", "data")


class End(StrEnum):
    """How `Worker.run` ended (`Worker.end`; None while it runs). FINISHED: the run finished (exit 0); STOPPED: a stop
    came (exit 0); GAVE_UP: the coordinator stayed silent or unreachable past the patience (it may come back);
    REFUSED: an answer a new start would get again: the coordinator refused the join token, or a run spec this
    worker cannot train (`SpecRefused`, the coordinator's refusal of the runs it refused included; a window
    above its spill space); ERROR: any other end in error, which a new start might not meet again: another gRPC
    status (a refused request or identity), training that kept diverging, an exception out of the loop (then
    raised on)."""

    FINISHED = "finished"
    STOPPED = "stopped"
    GAVE_UP = "gave_up"
    REFUSED = "refused"
    ERROR = "error"


class Rejoin(Exception):
    """The coordinator no longer knows this worker (evicted or restarted)."""


class ExchangeRejoin(Rejoin):
    """NOT_FOUND met on an exchange thread, which may not join (a join may rebuild the model the training thread
    uses): the training thread joins and finishes the exchange (`Worker._finish_exchange`). `delivered`: whether
    the push had landed before."""

    def __init__(self, details: str, delivered: bool) -> None:
        super().__init__(details)
        self.delivered = delivered


class SpecRefused(RuntimeError):
    """The run spec the coordinator served cannot be built by this worker. `run_id` and `member`: the run and the
    membership the worker was placed in, when the refusal is of that run (`Worker._refuse_run` leaves it and asks a
    sweep for another); None for a refusal of the swarm as a whole."""

    def __init__(self, message: str, run_id: str | None = None, member: Identity | None = None) -> None:
        super().__init__(message)
        self.run_id, self.member = run_id, member


class RunCounters:
    """The cumulative counters a worker's metric rows carry (`COUNTERS`: bytes sent and received, compute and sync
    seconds): what the membership that sends them moved and spent in its run, so that the maxima of a run's
    memberships add up to what the run's workers moved and spent (`observe/report.summarize`), and a worker the
    sweep moved does not bring its earlier runs' bytes and seconds along.

    The client counts bytes from the process's start, the trainer and the worker count seconds from it; a row keeps
    its counts when it is made (`Worker._metric`), and the newest row of each report also counts what moved until
    the report (the round's push, which no later row of that run may carry: the sweep may move the worker on before
    its next pull). A row is sent with `base` taken off (`rows`): the counts when the worker entered the run it
    trains now (its first join, or a join that landed in another run: what came before belongs to the earlier run),
    or after a re-join into the same run the highest counts among the rows that run already stored from this worker
    (`delivered`): its earlier memberships' maxima cover what came before, and what came after them counts in the
    new membership. A worker that joins one run once sends its own counts (base 0). Rows are sent by the thread that
    owns `_pending` (the training thread, or the exchange thread while one runs); `joined` runs at a join, when no
    exchange runs."""

    COUNTERS = ("bytes_sent", "bytes_received", "compute_seconds", "sync_seconds")

    def __init__(self) -> None:
        zero = (0,) * len(self.COUNTERS)
        self.base: tuple[float, ...] = zero  # taken off the rows sent now, by COUNTERS
        self.stored: tuple[float, ...] = zero  # the highest counts among the rows its run stored from this worker

    def joined(self, same_run: bool, counts: tuple[float, ...]) -> None:
        """A join landed: in the run trained before (`same_run`) or in another (a first join included), with the
        counts (`COUNTERS`) `counts` now."""
        if same_run:
            self.base = self.stored
        else:
            self.base = self.stored = tuple(counts)

    def rows(self, rows: list[pb.Metric], counts: tuple[float, ...]) -> list[pb.Metric]:
        """Copies of `rows` (which hold the counts when each was made) as one report sends them, the counts being
        `counts` now: the newest row counts `counts`, and `base` is taken off, never below 0."""
        sent: list[pb.Metric] = []
        for index, row in enumerate(rows):
            copy = pb.Metric()
            copy.CopyFrom(row)
            for name, base, now in zip(self.COUNTERS, self.base, counts):
                value = getattr(row, name)
                if index == len(rows) - 1:
                    value = max(value, now)
                setattr(copy, name, max(value - base, 0))
            sent.append(copy)
        return sent

    def delivered(self, sent: list[pb.Metric]) -> None:
        """The current run stored `sent` (as `rows` made them)."""
        for row in sent:
            self.stored = tuple(max(stored, base + getattr(row, name))
                                for name, stored, base in zip(self.COUNTERS, self.stored, self.base))


def rebuild_reason(old: RunSpec | None, new: RunSpec, same_run: bool) -> str:
    """Why a join's run spec `new` needs the model, its inner optimizer, the data stream, the codec and the error
    feedback built anew over those built for `old` ("" when it does not): no model yet, another run (`same_run`
    false: its θ, optimizer state and residual are another run's), or a change to what shapes them: the tables
    TRAINING_TABLES, `run.seed` (the data streams' seeds) or the sync wire format (codec and its parameters, error
    feedback and its decay). What a restart may change (`coordinator/resume.RESTART_MUTABLE`: rounds, deadlines, the
    coordinator's defences, the pacing) needs none: the worker keeps its model, optimizer state and residual."""
    if old is None:
        return "no model is built yet"
    if not same_run:
        return "the join is into another run"
    changed = [table for table in TRAINING_TABLES if getattr(old, table) != getattr(new, table)]
    if old.run.seed != new.run.seed:
        changed.append("run.seed")
    if _wire(old) != _wire(new):
        changed.append("the sync wire format")
    return f"the run spec changed in {', '.join(changed)}" if changed else ""


def _wire(spec: RunSpec) -> tuple:
    """What of `[sync]` shapes the worker's codec and error feedback: both wire formats, error feedback, its decay."""
    sync = spec.sync
    return (codecs.WireFormat.from_sync(sync), codecs.WireFormat.from_sync(sync, downlink=True), sync.error_feedback,
            sync.error_decay)


# Statuses of a push the coordinator answered without taking the update (a definite refusal the worker does not
# retry): the error-feedback residual is put back before the error ends the worker.
REFUSING_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OUT_OF_RANGE})


def _is(err: BaseException, code: grpc.StatusCode) -> bool:
    return isinstance(err, grpc.RpcError) and err.code() == code


class _Either:
    """Set when any of the events is (the `stop` a round's training checks before each step)."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(event.is_set() for event in self.events)


class Exchange:
    """One overlapped round's wire work on its own thread (`Worker._exchange`): `done` is set when it ended,
    `wait` gives its result or raises what it raised."""

    def __init__(self, work, name: str) -> None:
        self.done = threading.Event()
        self._result = None
        self._error: BaseException | None = None
        self._work = work
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._result = self._work()
        except BaseException as exc:  # handed to the training thread by `wait`
            self._error = exc
        finally:
            self.done.set()

    def wait(self, stop: threading.Event | None = None, poll_s: float = TRANSFER_POLL_S):
        """The work's result once it ended (the client bounds it: deadlines, retries within the patience, stop), or
        Stopped within `poll_s` of `stop` being set while it still runs (`wait_until`, as the client's watch of a
        transfer in flight): a unary call of the work (a long poll) still runs to its deadline. The work goes on on
        its thread; the caller keeps it as the round in flight, which `Worker._leave` waits for (bounded) and ends by
        closing the channel, as for a stop that comes while the training thread trains."""
        if wait_until(self.done, poll_s, lambda: stop is not None and stop.is_set()):
            raise Stopped(f"{self.thread.name}: stopped while the round was on the wire")
        if self._error is not None:
            raise self._error
        return self._result

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def heartbeat_interval(lease_s: float) -> float:
    """Seconds between two heartbeats of a membership whose lease is `lease_s` (the Join's answer): a third of it,
    within [MIN_HEARTBEAT_S, MAX_HEARTBEAT_S]; DEFAULT_LEASE_S's third for a lease that is not a positive number
    (a NaN made every wait return at once: a thousand heartbeats a second)."""
    if not (math.isfinite(lease_s) and lease_s > 0):
        lease_s = DEFAULT_LEASE_S
    return min(max(lease_s / 3.0, MIN_HEARTBEAT_S), MAX_HEARTBEAT_S)


@dataclass(frozen=True)
class InFlight:
    """The overlapped round on the wire: its exchange, θ_pushed (CPU copies), its version and its pace, the
    update it carries (Δ and its tokens: pushed again after a re-join), and the model it was trained on
    (`Worker.builds` at the push: a join that rebuilt the model since makes θ_pushed another model's)."""

    exchange: Exchange
    pushed: dict[str, torch.Tensor]
    version: int
    steps: int
    budget_s: float
    deltas: dict[str, torch.Tensor]
    tokens: int
    build: int
    # What Δ may decode to (`Worker._send_bound`).
    send_bound: float


@dataclass(frozen=True)
class Encoded:
    """One update as `Worker._push_deltas` encoded it for the wire: its base version, header and chunks, and the
    error feedback that compressed it with its residual from before (`saved`; None without error feedback). An
    update that landed is pushed again as it is (`Worker._deliver_again`): compressing it again would apply the
    residual twice."""

    version: int
    header: pb.TensorHeader
    chunks: list[pb.TensorChunk]
    feedback: codecs.ErrorFeedback | None
    saved: dict[str, torch.Tensor] | None


@dataclass(frozen=True)
class Early:
    """The steps an overlapped round trained before its base θ_{v+1} arrived: tokens, count, seconds."""

    tokens: int
    steps: int
    seconds: float


class Worker:
    """One worker process's loop at a coordinator (the module docstring). `token` is the join token, kept beside
    the options (never in them); `stop`, when set, ends the loop after the current step.

    Threads: `run` and everything it calls run on the caller's thread; the heartbeat thread reads `identity`
    (replaced whole by each join) and keeps the newest assignment under `_assignment_lock`, which
    `_follow_assignment` reads under it too. With overlap, an `Exchange` thread runs `_exchange` (push, metrics,
    await, pull) while the training thread trains: no lock, a hand-over instead: while it runs, only it touches
    `_pending`, the error feedback, `_held`, `_encoded` and the client's transfers, and the training thread touches
    only the model, its optimizer and the rows it keeps locally; `Exchange.wait` hands the result (or the exception)
    back.
    """

    def __init__(self, options: WorkerOptions, token: str, stop: threading.Event | None = None,
                 previous: Membership | None = None) -> None:
        """`previous`: the membership of the process this one replaces, already ended (the command ends it before
        importing torch); without it, a `membership_file` is read and its membership ended when `run` starts."""
        self.startup = StartupMarks()
        self.startup.mark("imports")
        self.options = options
        self._previous = previous
        self.stop = stop or threading.Event()
        self.device = resolve_device(options.device)
        # The most parameters a run spec may ask this worker to build (checked before building, worker/limits.py).
        self.limit = ModelLimit.of(str(self.device), options.max_params, options.max_step_tokens)
        self.name = options.name or f"{socket.gethostname()}-{os.getpid()}"
        self.client = CoordinatorClient(
            options.coordinator, token, tls_ca=options.tls_ca, tls_cert=options.tls_cert, tls_key=options.tls_key,
            retry=RetryPolicy(max_elapsed_s=options.patience_s),
            timeouts=Timeouts(unary_s=options.rpc_timeout_s, transfer_s=options.transfer_timeout_s), stop=self.stop,
        )
        # The model, its inner optimizer and data stream, the step count and compute seconds (built at the join).
        self.trainer = RoundTrainer(self.device)
        self.sync_seconds = 0.0
        # Inner steps of the round being pushed (its assignment's count, or what its time budget allowed).
        self.round_steps = 0
        self.finished = False
        # Why `run` returned an exit status other than 0 ("" until then), and how the loop ended (`End`, None until
        # then): a process supervisor decides from it whether to start the worker again.
        self.exit_reason = ""
        self.end: End | None = None
        # This membership's id and worker secret, replaced whole by each join (the heartbeat thread reads it).
        self.identity = Identity()
        self.lease_s = DEFAULT_LEASE_S
        self.spec: RunSpec | None = None
        self.run_id = ""
        self.data_seed: int | None = None  # None until the data stream of the current run started
        # Metric rows not yet stored, all trained for run `_pending_run` (a run stores only its own rows).
        self._pending: list[pb.Metric] = []
        self._pending_run = ""
        # What the rows sent now take off the byte and second counters (`RunCounters`: this membership's run only).
        self._counters = RunCounters()
        # (version, parameters) pulled last, bit for bit: lets the coordinator send a delta.
        self._held: tuple[int, dict[str, torch.Tensor]] | None = None
        # The coordinator's newest assignment (highest version), set from any response that carries one.
        self._assignment: pb.TrainingAssignment | None = None
        self._assignment_owner = ""  # the worker_id (membership) the held assignment came with
        self._assignment_lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        # Overlap: the round on the wire (its exchange, θ_pushed, its version and pace), None when nothing travels.
        self._inflight: InFlight | None = None
        # How many times the model was built, and for which run (`_build_model`; `rebuild_reason` decides at a join).
        self.builds = 0
        self._built_for = ""
        # The update `_push_deltas` encoded last (pushed again as it is after a re-join, `_finish_exchange`).
        self._encoded: Encoded | None = None
        # Rounds in a row whose Δ was not finite (`_diverged`).
        self._diverged_rounds = 0
        # The runs this worker refused (run id → why), named at every join so that a sweep places it in another.
        self._refused_runs: dict[str, str] = {}
        # Set by the heartbeat thread when the coordinator said this membership's run no longer takes its updates
        # (a NOT_FOUND with the MOVED_KEY trailer: the run finished or was stopped, or the sweep moved the worker):
        # the round in training stops and the worker joins again. Cleared at each join; `_moved_why` says why.
        self._moved = threading.Event()
        self._moved_why = ""
        # Orders the heartbeat's check-and-set of `_moved` against a join's new identity and clearing of it, so a
        # late answer about the old membership never stops the new one's round.
        self._moved_lock = threading.Lock()

    @property
    def gave_up(self) -> bool:
        """Whether the loop ended because the coordinator stayed silent or unreachable past the patience."""
        return self.end is End.GAVE_UP

    @property
    def model(self) -> torch.nn.Module | None:
        """The run's model (None before the first join)."""
        return self.trainer.model

    @property
    def step(self) -> int:
        """Inner steps trained so far, over every run this process joined."""
        return self.trainer.step

    @property
    def worker_id(self) -> str:
        """The id of the current membership ("" before a join and after the run finished)."""
        return self.identity.worker_id

    def run(self) -> int:
        """Train until the run finishes or a stop is requested; returns the exit code (`exit_reason` says why
        when it is not 0, `end` how it ended, set also when an exception leaves the loop)."""
        try:
            self._take_over()
            self._join_placed()
            while not self.stop.is_set() and not self.finished:
                refusal: SpecRefused | None = None
                try:
                    self._round()
                except Rejoin as exc:
                    log.warning("%s; joining again", exc)
                    self._join_placed()
                except SpecRefused as exc:
                    refusal = exc.with_traceback(None)
                except torch.OutOfMemoryError as exc:
                    refusal = self._out_of_memory(exc)
                except Diverged as exc:
                    if self._diverged_rounds >= MAX_DIVERGED_ROUNDS:
                        return self._exit(End.ERROR, f"{self.name} exits: the local training diverged "
                                          f"{self._diverged_rounds} rounds in a row ({exc}); lower inner.lr or check "
                                          "the data")
                    self._recover(exc)
                if refusal is not None:  # out of the handler: the failed round's frames (and tensors) are gone
                    self._refuse_run(refusal)
                    self._join_placed()
        except Stopped:
            pass
        except RetriesExhausted as exc:
            if not self.stop.is_set():
                return self._exit(End.GAVE_UP, f"{self.name} gives up: {exc}")
            log.info("%s: stopped while retrying (%s)", self.name, exc)  # a stop wins over a spent patience
        except SpecRefused as exc:
            return self._exit(End.REFUSED, f"{self.name} cannot train this run: {exc}")
        except SpillSpaceError as exc:
            return self._exit(End.REFUSED, f"{self.name} cannot train this window: {exc}")
        except grpc.RpcError as err:
            _, reason = classify(err.code())
            end = End.REFUSED if err.code() == grpc.StatusCode.UNAUTHENTICATED else End.ERROR
            return self._exit(end, f"{self.name} exits: {reason}: {err.code().name}: {err.details()}")
        except Exception:
            self.end = End.ERROR
            raise
        finally:
            self._leave()
        self.end = End.FINISHED if self.finished else End.STOPPED
        return 0

    def _exit(self, end: End, reason: str) -> int:
        """Log why the worker ends (one ERROR line), keep it as `exit_reason` and its kind as `end`; exit status 1."""
        log.error("%s", reason)
        self.exit_reason, self.end = reason, end
        return 1

    def _take_over(self) -> None:
        """With a membership file: end the membership of the process this one replaces (unless the command did) and
        build that run's model and load its data now, before joining makes the open round wait for this worker."""
        path = self.options.membership_file
        previous = self._previous
        if previous is None and path is not None:
            previous = end_previous(path, self.options.coordinator, self.options.tls(), self.options.rpc_timeout_s)
        if previous is None:
            return
        try:
            spec = RunSpec.from_json(previous.run_spec_json)
            refused = dataset_problem(spec, self.options.data_root) or self.limit.problem(spec)
        except (ValueError, KeyError) as exc:
            log.info("%s: the previous membership's run spec is not built ahead (%s)", self.name, exc)
            return
        if refused:
            return  # refused at the join, with its reason
        failed = self._build_failure(spec, preload=True)
        if failed:  # the join builds it again and refuses the run, with its reason (before: a traceback)
            self.trainer.model = self.trainer.optimizer = None
            self._free_device_memory()
            log.info("%s: the previous membership's run spec is not built ahead (%s)", self.name, failed)
            return
        self.spec = spec
        self._built_for = previous.run_id
        self.startup.mark("built ahead")

    def _join_placed(self) -> int | None:
        """`_join`, again for as long as the run it lands in is one this worker cannot train (`_refuse_run`: left, and
        named at the next join so that a sweep places it in another run). SpecRefused when it cannot go on: the
        coordinator placed it in a run it refused before (a single run, or a coordinator that does not read the
        refused runs), MAX_REFUSED_RUNS were refused, or the refusal is of the swarm as a whole."""
        while True:
            try:
                return self._join()
            except SpecRefused as exc:
                self._refuse_run(exc)

    def _refuse_run(self, exc: SpecRefused) -> None:
        """The run `exc` names cannot be trained here (its model or windows above this worker's limits, its dataset
        outside the data root): leave its membership, saying why, and remember it for the next join. Before, the
        worker ended: a sweep over L up to 100,000 lost every worker whose memory held only the shorter lengths it
        could have trained. Re-raises `exc` when it names no run, or one refused before, or MAX_REFUSED_RUNS are."""
        if exc.run_id is None or exc.run_id in self._refused_runs or len(self._refused_runs) >= MAX_REFUSED_RUNS:
            raise exc
        self._refused_runs[exc.run_id] = str(exc)
        log.warning("%s: %s; leaving run %s and asking for another", self.name, exc, exc.run_id)
        if exc.member is not None:
            self._leave_refused(exc.member, str(exc))
        if self.options.membership_file is not None:  # no file naming a run this worker left: a restarted process
            self._record_membership(None)             # built it ahead again (and out of memory, raised)
        self.identity = Identity()
        self._free_device_memory()

    def _free_device_memory(self) -> None:
        """Give back what a refused run held (its failed round's tensors, once nothing refers to them) before the next
        run's model is built: a collection, and on CUDA the allocator's cached blocks."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _out_of_memory(self, exc: torch.OutOfMemoryError) -> SpecRefused:
        """A round that ran out of device memory, as a refusal of its run: in a sweep the worker then trains a length
        that fits. Before, the error ended the process with a traceback, and a restarted one was placed in the same
        run again. The error's frames are cleared here (they hold the failed step's tensors); the caller refuses the
        run once out of its handler, and `_refuse_run` gives the memory back before the next run's model is built."""
        traceback.clear_frames(exc.__traceback__)
        inflight, self._inflight = self._inflight, None
        if inflight is not None:  # the overlapped round on the wire ends first (its client calls are bounded)
            try:
                inflight.exchange.wait()
            except Exception as error:  # its update is dropped with the run either way
                log.info("%s: the round on the wire ended with %s", self.name, error)
        data = self.trainer.data
        shape = f" at seq_len {data.seq_len:,} × batch {data.batch_size:,}" if data is not None else ""
        return SpecRefused(f"out of memory on {self.device} training run {self.run_id}{shape}: {first_line(exc)}",
                           self.run_id, self.identity)

    def _leave_refused(self, member: Identity, why: str = "placed in a run it refused") -> None:
        """End the membership `member` of a run this worker refused: one attempt (its lease ends it otherwise)."""
        if not member.worker_id:
            return
        try:
            self.client.leave(member, f"{REFUSED_LEAVE}{why}")
        except grpc.RpcError as err:
            log.info("%s: the leave of %s failed (%s)", self.name, member.worker_id, err.code().name)

    def _join(self) -> int | None:
        """Join the swarm (building the model when the spec is new); the version it serves, None when finished.

        A re-join first delivers the rows still pending under the membership they were trained in (a run that
        moved this worker still takes them), names the run it trained for and that membership with its worker secret
        (`identity`, in memory), so that a sweep sends it back there when it may and the new membership takes over
        what the ended one had (its delivered versions, its place in the open round), and drops the rows that are left
        when it lands in another run: they belong to no other run. A process started anew names nothing: it ended
        the membership its --membership-file records (`_take_over`) and joins as a new member.
        """
        previous = self.identity
        if previous.worker_id:
            self._flush_previous(previous)
        try:
            run_id = self.run_id if previous.worker_id else ""
            response = self.client.join(self.name, str(self.device), os.getpid(), run_id, previous,
                                        list(self._refused_runs))
        except grpc.RpcError as err:
            if _is(err, grpc.StatusCode.FAILED_PRECONDITION) and err.details().startswith(REFUSED_RUNS_REFUSAL):
                raise SpecRefused(f"{'; '.join(self._refused_runs.values())} (no other run: {err.details()})") from err
            if _is(err, grpc.StatusCode.FAILED_PRECONDITION):
                log.info("%s: %s", self.name, err.details())
                self.identity, self.finished = Identity(), True
                return None
            raise
        member = Identity.of(response)
        if response.run_id in self._refused_runs:  # placed again where it cannot train: nowhere else to go
            self._leave_refused(member)
            raise SpecRefused(f"the coordinator placed this worker in run {response.run_id} again, which it refused: "
                              f"{self._refused_runs[response.run_id]}")
        try:
            spec = RunSpec.from_json(response.run_spec_json)
        except ValueError as exc:
            raise SpecRefused(f"the run spec of {response.run_id} is invalid here: {exc}", response.run_id,
                              member) from exc
        unreadable = dataset_problem(spec, self.options.data_root)
        if unreadable:  # on every join: a spec changed in its dataset alone builds nothing anew
            raise SpecRefused(f"the run spec of {response.run_id} is refused: {unreadable}", response.run_id, member)
        with self._moved_lock:
            self.identity = member
            self._moved.clear()
        same_run = bool(self.run_id) and self.run_id == response.run_id
        self._counters.joined(same_run, self._counts())
        self.run_id, self.lease_s = response.run_id, response.lease_seconds
        if self._pending and self._pending_run != self.run_id:
            log.warning("%s: %d metric rows trained for run %s dropped: that run no longer knows this worker, "
                        "which now trains %s", self.name, len(self._pending), self._pending_run, self.run_id)
            self._pending = []
        if self.options.membership_file is not None:
            self._record_membership(Membership(self.options.coordinator, response.run_id, response.worker_id,
                                               response.worker_secret, response.run_spec_json))
        self.startup.mark("join")
        self._held = None
        if self._heartbeat is None:
            # Beat from now on: building the model and loading the data may outlast the lease.
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
            self._heartbeat.start()
        with self._assignment_lock:
            self._assignment = response.assignment if response.HasField("assignment") else None
            self._assignment_owner = response.worker_id
        rebuild = rebuild_reason(self.spec if self.model is not None else None, spec,
                                 self._built_for == response.run_id)
        if rebuild:
            try:
                too_large = self.limit.problem(spec)
            except (ValueError, KeyError) as exc:
                raise SpecRefused(f"cannot build the model or data of {response.run_id}: {exc}", response.run_id,
                                  member) from exc
            if too_large:
                raise SpecRefused(f"the run spec of {response.run_id} is refused before allocating: {too_large}",
                                  response.run_id, member)
            self.spec, self.data_seed = spec, None
            if self.builds:
                log.info("%s: the model, inner optimizer, data stream and error feedback are built anew for %s: %s",
                         self.name, response.run_id, rebuild)
            failed = self._build_failure(spec)
            if failed:
                raise SpecRefused(f"cannot build the model of {response.run_id}: {failed}", response.run_id, member)
            self._built_for = response.run_id
        elif spec != self.spec:
            log.info("%s: the run spec of %s changed in what its model and training do not depend on; the model, "
                     "inner optimizer and error feedback are kept", self.name, response.run_id)
            self.spec = spec
        if self.data_seed is None:
            try:
                self._start_data(spec, response.data_seed)
            except (ValueError, KeyError) as exc:
                raise SpecRefused(f"cannot build the model or data of {response.run_id}: {exc}", response.run_id,
                                  member) from exc
            self.startup.mark("model and data")
        log.info("%s joined %s as %s at version %d", self.name, self.run_id, self.worker_id, response.version)
        return response.version

    def _build_failure(self, spec: RunSpec, preload: bool = False) -> str:
        """Build `spec`'s model (`_build_model`; with `preload`, also load its data now): "" when built, else why
        not, in one line (a spec this process cannot build, or out of device memory). Out of memory is said out of
        its handler, with the error's frames cleared: they hold the partial model."""
        failed = ""
        try:
            self._build_model(spec)
            if preload:
                preload_data(spec.data)
        except (ValueError, KeyError) as exc:
            failed = str(exc)
        except torch.OutOfMemoryError as exc:
            traceback.clear_frames(exc.__traceback__)
            failed = f"out of memory on {self.device}: {first_line(exc)}"
        return failed

    def _build_model(self, spec: RunSpec) -> None:
        """The run's model, inner optimizer and codec (the data stream waits for the join's data seed)."""
        self.trainer.build(spec)
        self.builds += 1
        self.codec = codecs.WireFormat.from_sync(spec.sync)
        # The round's step's format (sparse: at sync.downlink_density): what a pulled step's header must carry.
        self.step_codec = codecs.WireFormat.from_sync(spec.sync, downlink=True)
        self.error_feedback = codecs.ErrorFeedback(spec.sync.error_decay) if spec.sync.error_feedback else None

    def _start_data(self, spec: RunSpec, data_seed: int) -> None:
        """The data stream of this membership's data seed, at its assignment's (seq_len, batch); the error-feedback
        residual saved for this run (`_resume_feedback`)."""
        self.data_seed = worker_data_seed(spec.run.seed, data_seed)
        assignment = self._assignment
        seq_len, batch = spec.data.seq_len, spec.data.batch_size
        if assignment is not None and assignment.seq_len > 0 and assignment.batch_size > 0:
            seq_len, batch = assignment.seq_len, assignment.batch_size
        self.trainer.follow(seq_len, batch, self.data_seed)
        self._resume_feedback()

    def _resume_feedback(self) -> None:
        """With --state-dir: take the error-feedback residual a previous process of this worker saved for this run
        (`sync.feedback_state`), so a restart keeps what it has not sent yet; else start from zero, saying why (a
        WARNING when a file is there but another run's, setting's or model's, unreadable or not finite). The file
        never holds a residual an update that may have landed carried (`_push_deltas`), so it is taken as it is."""
        if self.error_feedback is None or self.options.state_dir is None:
            return
        shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        residuals, why = load_feedback(self.options.state_dir, self.run_id, self.codec, self.error_feedback.decay, shapes)
        if residuals is None:
            # A file that is there but not this run's, setting's or model's is dropped: a WARNING; no file: INFO.
            there = (self.options.state_dir / FEEDBACK_FILE).exists()
            log.log(logging.WARNING if there else logging.INFO, "%s: error feedback starts from zero: %s%s", self.name,
                    why, "; the file is not used" if there else "")
            return
        self.error_feedback.restore(residuals)
        log.info("%s: resumed the error feedback of %s (residual norm %.4g)%s", self.name, self.run_id,
                 self.error_feedback.residual_norm(), f", {why}" if why else "")

    def _call(self, fn, *args):
        """Run an RPC, turning NOT_FOUND into Rejoin."""
        try:
            return fn(*args)
        except grpc.RpcError as err:
            if _is(err, grpc.StatusCode.NOT_FOUND):
                raise Rejoin(err.details()) from err
            raise

    def _note_assignment(self, response, worker_id: str) -> None:
        """Keep the response's assignment if it is at least as new as the one held.

        `worker_id` is the membership the call was made for: an answer that arrives after the
        worker moved to another run (a late heartbeat of the old run) is dropped.
        """
        if not response.HasField("assignment"):
            return
        with self._assignment_lock:
            if worker_id != self._assignment_owner:
                return
            if self._assignment is None or response.assignment.version >= self._assignment.version:
                self._assignment = response.assignment

    def _follow_assignment(self, version: int) -> pb.TrainingAssignment | None:
        """At a round boundary: switch to the coordinator's (seq_len, batch) for `version` if it differs.

        An assignment made before `version` existed is refreshed with a heartbeat first. Without
        any (an older coordinator) the run spec's data.seq_len and data.batch_size apply.
        """
        with self._assignment_lock:
            assignment = self._assignment
        if assignment is not None and assignment.version < version:
            identity = self.identity
            self._note_assignment(self._call(self.client.heartbeat, identity), identity.worker_id)
            with self._assignment_lock:
                assignment = self._assignment
        data = self.spec.data
        seq_len, batch = (assignment.seq_len, assignment.batch_size) if assignment is not None else (data.seq_len, data.batch_size)
        if seq_len < 1 or batch < 1:
            raise RuntimeError(f"the coordinator assigned seq_len {seq_len}, batch {batch}: expected positive sizes")
        too_large = self.limit.window_problem(seq_len, batch, f"the coordinator's assignment for version {version}")
        if too_large:
            raise SpecRefused(f"{too_large}; refused before allocating", self.run_id, self.identity)
        if self.trainer.follow(seq_len, batch, self.data_seed + version):
            why = assignment.reason if assignment is not None else "the run spec"
            log.info("%s: from version %d: seq_len %d, batch %d (%s)", self.worker_id, version, seq_len, batch, why)
        return assignment

    def _pace(self, assignment: pb.TrainingAssignment | None) -> tuple[int, float]:
        """(most steps, time budget in seconds or 0) for this round from the assignment; without one (an
        older coordinator) inner.steps, step-boxed."""
        if assignment is None or assignment.inner_steps <= 0:
            return self.spec.inner.steps, 0.0
        return assignment.inner_steps, max(assignment.round_seconds, 0.0)

    def _round(self) -> None:
        if self.spec.sync.overlap:
            self._overlapped_round()
            return
        sync_started = time.perf_counter()
        version = self._pull()
        steps, budget = self._pace(self._follow_assignment(version))
        self.sync_seconds += time.perf_counter() - sync_started
        base = self.trainer.snapshot()
        self._held = (version, base)
        if not self.startup.reported:
            self.startup.mark("pulled")
            self.startup.reported = True
            log.info("%s trains version %d, %s", self.worker_id, version, self.startup.describe())
        trained = self.trainer.train(version, steps, budget_s=budget, stop=_Either(self.stop, self._moved),
                                     step=self._train_step, on_schedule=self._log_schedule)
        self._keep([self._metric(row) for row in trained.rows])
        if trained.stopped:
            self._check_moved(version, trained.steps)
            return
        sync_started = time.perf_counter()
        self.round_steps = trained.steps
        run_id = self.run_id
        accepted = self._push(version, base, trained.tokens)
        try:
            self._flush_metrics()
            if accepted:
                self._await(version + 1)
            else:
                self._await_past(version, run_id)
        except Rejoin as exc:
            if not accepted:
                raise
            self._rejoin_after_delivery(version, trained.tokens, exc)
        finally:
            self.sync_seconds += time.perf_counter() - sync_started

    def _rejoin_after_delivery(self, version: int, tokens: int, exc: Rejoin) -> None:
        """The blocking path met NOT_FOUND after its update from `version` landed (evicted, or the coordinator
        restarted): join again and, while `version` is still current in the same run, push the update again as it
        was encoded and await v+1 (`_deliver_again`, as `_finish_exchange` does), so that the next round does not
        train from `version` a second time (its push would be ALREADY_EXISTS and its progress and residual lost)."""
        run_id, build = self.run_id, self.builds
        log.warning("%s; joining again after the update of version %d landed", exc, version)
        current = self._join()
        if self.finished or self.run_id != run_id or self.builds != build or current is None or current > version:
            return
        if self._deliver_again(version, tokens):
            self._await(version + 1)

    def _overlapped_round(self) -> None:
        """One round with `[sync] overlap` (the module docstring): start from the merge of the round in flight (or a
        pull when none travels), train what is left of the round's steps, hand Δ to a new exchange and return; the
        next call trains while it travels."""
        started = self._merge_inflight()
        if started is None:
            return
        version, base, early = started
        steps, budget = self._pace(self._follow_assignment(version))
        if not self.startup.reported:
            self.startup.mark("pulled")
            self.startup.reported = True
            log.info("%s trains version %d, %s", self.worker_id, version, self.startup.describe())
        left_s = budget - early.seconds if budget > 0 else 0.0
        trained = RoundResult(0, 0, (), False)
        if steps > early.steps and (budget <= 0 or left_s > 0 or early.steps == 0):
            trained = self.trainer.train(version, steps - early.steps, budget_s=max(left_s, 0.0),
                                         stop=_Either(self.stop, self._moved), step=self._train_step,
                                         on_schedule=self._log_schedule)
        self._keep([self._metric(row) for row in trained.rows])
        if trained.stopped:
            self._check_moved(version, early.steps + trained.steps)
            return
        self.round_steps = early.steps + trained.steps
        deltas = self.trainer.delta(base)
        self._check_finite(version, deltas)
        pushed = self.trainer.snapshot()
        tokens = early.tokens + trained.tokens
        send_bound = self._send_bound(base)
        exchange = Exchange(functools.partial(self._exchange, version, deltas, tokens, send_bound), f"exchange-{version}")
        self._inflight = InFlight(exchange, pushed, version, steps, budget, deltas, tokens, self.builds, send_bound)

    def _exchange(
        self, version: int, deltas: dict[str, torch.Tensor], tokens: int, send_bound: float
    ) -> tuple[int, dict, str] | None:
        """The wire's side of an overlapped round, on the exchange thread: push Δ (no re-join here: NOT_FOUND raises
        ExchangeRejoin to the training thread), report the metrics kept so far, await v+1 and pull it into a buffer;
        (version, θ, its SHA-256), or None when the run finished or a stop came."""
        run_id = self.run_id
        try:
            accepted = self._push_deltas(version, deltas, tokens, send_bound, rejoin=False)
        except Rejoin as exc:
            raise ExchangeRejoin(str(exc), delivered=False) from exc
        try:
            self._flush_metrics()
            return self._fetch_next(version, accepted, stale_in=run_id)
        except Rejoin as exc:
            raise ExchangeRejoin(str(exc), delivered=accepted) from exc

    def _fetch_next(self, version: int, accepted: bool, stale_in: str | None = None) -> tuple[int, dict, str] | None:
        """After the push of `version`'s update: await v+1 if it was accepted, or past `version` if run `stale_in`
        refused it stale (`_await_past`), then pull the newest θ into a buffer (`_fetch`); None when the run
        finished or a stop came."""
        if accepted:
            self._await(version + 1)
        elif stale_in is not None:
            self._await_past(version, stale_in)
        if self.finished or self.stop.is_set():
            return None
        return self._fetch()

    def _finish_exchange(self, inflight: InFlight, rejoin: ExchangeRejoin) -> tuple[int, dict, str] | None:
        """The exchange met NOT_FOUND (evicted, or the coordinator restarted): join again here and finish it, as the
        blocking path does (`_deliver`), then pull the newest θ for the merge.

        An update not yet delivered is pushed again while the worker is in the same run (the coordinator says
        whether it landed before, is merged late or is stale: then it is dropped, its residual restored), and v+1
        is awaited once it is accepted. An update delivered before the NOT_FOUND is pushed again as it was encoded
        while its version is still current (`_deliver_again`): the coordinator answers ALREADY_EXISTS when it kept
        it (an eviction; it carried the ended membership's delivered version over) or takes it (a restart lost it
        with its open round), and v+1 is awaited: pulling θ_v again would train a second round from v, whose push
        the coordinator then answers ALREADY_EXISTS, and its progress and residual would be lost. A join that
        rebuilt the model (`rebuild_reason`) drops the update: it was trained on a model this worker no longer
        has. None when the run finished, a stop came or the join moved this worker to another run (the next
        round pulls afresh)."""
        run_id = self.run_id
        log.warning("%s; joining again to finish the round in flight (version %d)", rejoin, inflight.version)
        current = self._join()
        if self.finished or self.run_id != run_id:
            return None
        accepted, stale_in = False, None
        if self.builds != inflight.build:
            log.warning("%s: the update of version %d was trained on a model the re-join replaced; dropped",
                        self.worker_id, inflight.version)
        elif not rejoin.delivered:
            accepted = self._push_deltas(inflight.version, inflight.deltas, inflight.tokens, inflight.send_bound)
            stale_in = run_id
        elif current is not None and current <= inflight.version:
            accepted = self._deliver_again(inflight.version, inflight.tokens)
        return self._fetch_next(inflight.version, accepted, stale_in)

    def _deliver_again(self, version: int, tokens: int) -> bool:
        """Push the update from `version`, which had landed before a NOT_FOUND, again as it was encoded (`_encoded`:
        its residual is not applied twice); whether it is delivered. When it is not (stale, or dropped after
        re-joins) the residual it was compressed with is put back, as `_push_deltas` does."""
        encoded = self._encoded
        if encoded is None or encoded.version != version:
            log.warning("%s: the update of version %d is no longer held; version %d is not awaited",
                        self.worker_id, version, version + 1)
            return False
        log.info("%s: the update of version %d landed before the membership ended and version %d is still current; "
                 "pushed again under the new membership", self.worker_id, version, version)
        delivered = False
        try:
            delivered = self._deliver(encoded.version, tokens, encoded.header, encoded.chunks)
        finally:
            feedback = encoded.feedback
            if not delivered and feedback is not None and feedback is self.error_feedback:
                feedback.restore(encoded.saved)
        if not delivered and encoded.feedback is self.error_feedback:
            self._save_feedback(encoded.feedback, version, REFUSED)
        return delivered

    def _merge_inflight(self) -> tuple[int, dict[str, torch.Tensor], Early] | None:
        """The start of an overlapped round: train the next round's steps while the round in flight travels (at most
        that round's steps and budget), wait for its θ_{v+1} and merge it (None when the run finished or a stop
        came). Without a round in flight: pull θ_v (blocking)."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            sync_started = time.perf_counter()
            version = self._pull()
            self.sync_seconds += time.perf_counter() - sync_started
            base = self.trainer.snapshot()
            self._held = (version, base)
            return version, base, Early(0, 0, 0.0)
        exchange = inflight.exchange
        early_started = time.perf_counter()
        try:
            early = self.trainer.train(inflight.version + 1, inflight.steps, budget_s=inflight.budget_s,
                                       stop=_Either(self.stop, exchange.done, self._moved), step=self._train_step,
                                       on_schedule=self._log_schedule)
        except torch.OutOfMemoryError:
            self._inflight = inflight  # its exchange still runs: `_out_of_memory` waits for it to end
            raise
        early_seconds = time.perf_counter() - early_started
        sync_started = time.perf_counter()
        try:
            fetched = exchange.wait(self.stop)
        except ExchangeRejoin as rejoin:
            fetched = rejoin
        except Stopped:
            self._inflight = inflight  # still on the wire: `_leave` waits for it (bounded), `_end_threads` joins it
            raise
        finally:
            self.sync_seconds += time.perf_counter() - sync_started
            self._keep([self._metric(row) for row in early.rows])
        if isinstance(fetched, ExchangeRejoin):
            sync_started = time.perf_counter()
            try:
                fetched = self._finish_exchange(inflight, fetched)
            finally:
                self.sync_seconds += time.perf_counter() - sync_started
        if fetched is None or self.stop.is_set():
            return None
        version, tensors, digest = fetched
        self._held = (version, tensors)
        if self.builds != inflight.build:
            # A re-join rebuilt the model: θ_pushed is another model's, and θ_{v+1} + (θ_local − θ_pushed) garbage.
            self.trainer.load(tensors)
            self._keep([self._metric(self.trainer.row(version, float("nan"), 0), param_sha256=digest,
                                     **self._held_out(version))])
            log.warning("%s loaded version %d (sha256 %s): the model was built anew at the re-join, so the %d steps "
                        "trained since the push are dropped", self.worker_id, version, digest[:12], early.steps)
            return version, tensors, Early(0, 0, 0.0)
        self.trainer.rebase(tensors, inflight.pushed)
        self._keep([self._metric(self.trainer.row(version, float("nan"), 0), param_sha256=digest,
                                 **self._held_out(version, tensors))])
        log.info("%s merged version %d (sha256 %s) with %d steps trained since the push", self.worker_id, version,
                 digest[:12], early.steps)
        return version, tensors, Early(early.tokens, early.steps, early_seconds)

    def _train_step(self) -> StepResult:
        """One inner step on the next batch (a test subclass slows it down to model a slower device)."""
        return self.trainer.inner_step()

    def _log_schedule(self, schedule: str) -> None:
        log.info("%s: core checkpointing at L=%d: %s", self.worker_id, self.trainer.data.seq_len, schedule)

    def _counts(self) -> tuple[float, ...]:
        """The counters of `RunCounters.COUNTERS` now: the client's bytes, the trainer's compute and this worker's
        sync seconds."""
        return (self.client.bytes_sent, self.client.bytes_received, self.trainer.compute_seconds, self.sync_seconds)

    def _metric(self, row: StepRow, **fields) -> pb.Metric:
        """The row as the coordinator records it, with this worker's sync seconds and its client's byte counters so
        far (sent with the bytes and seconds of earlier runs and memberships taken off: `RunCounters`)."""
        return pb.Metric(
            version=row.version, step=row.step, seq_len=row.seq_len, batch=row.batch, loss=row.loss, tokens=row.tokens,
            wall_time=row.wall_time, compute_seconds=row.compute_seconds, sync_seconds=self.sync_seconds,
            bytes_sent=self.client.bytes_sent, bytes_received=self.client.bytes_received, **fields,
        )

    def _fetch(self) -> tuple[int, dict[str, torch.Tensor], str]:
        """Pull the newest θ into a buffer: (version, θ on the CPU, its SHA-256); a payload that disagrees with the
        model's shapes is refused and pulled again."""
        expected = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        pull = functools.partial(self.client.pull, expected=expected, repull=True, wire_format=self.step_codec)
        version, tensors = self._call(pull, self.identity, self.run_id, self._held)
        tensors = {name: tensor.detach().cpu() for name, tensor in tensors.items()}
        return version, tensors, tensor_stream.params_sha256(tensors).hex()

    def _pull(self) -> int:
        """Pull θ_v into the model (`_fetch`)."""
        version, tensors, digest = self._fetch()
        self.trainer.load(tensors)
        self._keep([self._metric(self.trainer.row(version, float("nan"), 0), param_sha256=digest,
                                 **self._held_out(version))])
        log.info("%s pulled version %d (sha256 %s)", self.worker_id, version, digest[:12])
        return version

    def _held_out(self, version: int, params: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """With `[run] eval_every` = k > 0 and k dividing `version`: the held-out loss of θ_v (the model, or `params`
        when the model holds more than θ_v) and its seconds, as the pull row's fields (issue #30); else none."""
        every = self.spec.run.eval_every
        if every <= 0 or version % every:
            return {}
        started = time.perf_counter()
        run = self.spec.run
        loss = self.trainer.held_out_loss(run.eval_batches, seed=held_out_seed(run.eval_set, version), params=params)
        if not 0 < loss <= MAX_VAL_LOSS:  # a diverged θ: no point of the curve (and NaN fails this too)
            log.warning("%s: held-out loss of version %d is %r: not reported", self.worker_id, version, loss)
            return {}
        return {"val_loss": loss, "val_seconds": time.perf_counter() - started}

    def _check_finite(self, version: int, deltas: dict[str, torch.Tensor]) -> None:
        """Raise Diverged, counting the round in `_diverged_rounds`, when Δ holds a NaN or an infinity (it names the
        first such tensor and how many of its values); else the count starts again from 0. Called on the training
        thread, once a round, before its Δ leaves it (`_push`, `_overlapped_round`)."""
        try:
            check_finite(version, deltas)
        except Diverged:
            self._diverged_rounds += 1
            raise
        self._diverged_rounds = 0

    def _recover(self, exc: Diverged) -> None:
        """After a round whose Δ was not finite (`Diverged`): drop the round (nothing was pushed, the error-feedback
        residual is as before it), start the inner optimizer afresh (its moments hold the divergence too) and pull θ
        in full at the next round, which trains the current version again; one WARNING line."""
        self.trainer.reset_optimizer()
        self._held = None
        log.warning("%s: %s; the round is dropped, the inner optimizer starts afresh and θ is pulled again (%d of %d "
                    "such rounds in a row before the worker exits)", self.worker_id or self.name, exc,
                    self._diverged_rounds, MAX_DIVERGED_ROUNDS)

    def _push(self, version: int, base: dict[str, torch.Tensor], tokens: int) -> bool:
        """Encode and deliver Δ = θ_v − θ_local; False when it was stale (dropped, residual restored). A Δ that is not
        finite raises Diverged before anything is compressed or sent (`_check_finite`)."""
        deltas = self.trainer.delta(base)
        self._check_finite(version, deltas)
        return self._push_deltas(version, deltas, tokens, self._send_bound(base))

    def _send_bound(self, base: dict[str, torch.Tensor]) -> float:
        """The most an update trained from θ `base` may decode to: with error feedback SEND_NORM_SHARE of the hard
        bound the coordinator holds it to (sync/norm_bound.py; the feedback keeps the rest), so that a residual
        grown over many rounds (a sparse codec's unsent entries) never gets an honest update refused; without, no
        cap (an honest update is under half the bound, and a capped one's rest would be lost)."""
        if self.error_feedback is None:
            return math.inf
        return SEND_NORM_SHARE * update_norm_bound(self.spec, base)[0]

    def _push_deltas(
        self, version: int, deltas: dict[str, torch.Tensor], tokens: int, send_bound: float, rejoin: bool = True
    ) -> bool:
        """Encode and deliver `deltas` (checked finite by the caller) with error feedback's update decoding to at
        most `send_bound` (`_send_bound`); False when it was stale (dropped, residual restored).

        The residual restored is the one this push compressed with: a re-join on the way that moved the worker to
        another run built that run's own (`_prepare`), which keeps what it loaded.

        With `--state-dir` the residual file (`_save_feedback`) is written before the push, holding the residual as
        it is once this push lands, and written again with the residual put back when the push is refused (answered
        stale, or dropped after re-joins). Why this order is the one that never sends a residual twice: the push may
        land without the worker hearing it (the last pusher of a round is answered only once the round closed; a
        kill, or a full disk, in that window), and a residual that a landed update carried must never be resumed.
        So at every moment the file holds (a) the residual after the last update that may have landed, or (b) after
        a refusal the residual put back, no update of which landed. A process that ends with the push unanswered
        (killed, its patience spent, stopped: the client cancels a push in flight then, which may have landed or
        not) leaves (a): if that push did land, the restart resumes exactly what
        is left to send; if it did not, the restart lacks what the push carried of the earlier residual (its own Δ
        is lost with the round either way), which the resume line and docs/RELIABILITY.md state. A save that fails
        removes the file (a restart then starts from zero, logged), never leaving an older residual behind."""
        block = self.spec.sync.block_size
        feedback = self.error_feedback
        if feedback is not None:
            saved = feedback.snapshot()
            encoded = feedback.compress(deltas, self.codec, block, max_norm=send_bound)
            if feedback.last_scale < 1.0:
                log.info("%s: the update of version %d is scaled by %.3g to the most it may carry, norm %.4g (%g of "
                         "the coordinator's norm bound); the error-feedback residual keeps the rest (norm %.4g)",
                         self.worker_id, version, feedback.last_scale, send_bound, SEND_NORM_SHARE,
                         feedback.residual_norm())
        else:
            saved, encoded = None, None
        header, chunks = tensor_stream.build_payload(
            deltas, codec=self.codec, run_id=self.run_id, version=version, block_size=block, encoded=encoded,
            chunk_size=tensor_stream.UPLOAD_CHUNK_SIZE,
        )
        self._encoded = Encoded(version, header, chunks, feedback, saved)
        self._save_feedback(feedback, version, PUSHING)
        delivered, refused = False, True  # refused: the coordinator answered that the update was not taken
        try:
            delivered = self._deliver(version, tokens, header, chunks, rejoin)
        except BaseException as err:  # a refusal raised (it ends the worker): the file says so before the exit
            refused = isinstance(err, grpc.RpcError) and err.code() in REFUSING_CODES
            raise
        finally:
            if not delivered and feedback is not None and feedback is self.error_feedback:
                feedback.restore(saved)
                if refused:
                    self._save_feedback(feedback, version, REFUSED)
        return delivered

    def _save_feedback(self, feedback: codecs.ErrorFeedback | None, version: int, held: str) -> None:
        """With `--state-dir`: write `feedback`'s residual (this run's) to the state dir's file, saved for the update
        from `version` (`held`: PUSHING before its push, REFUSED after it was refused). A save that fails (a full
        disk, OSError) logs one WARNING and the worker goes on; the file is removed, since the residual it holds
        may be one the update about to be pushed carries (a restart then starts from zero, the WARNING says what
        it loses); should it not even be removed, the WARNING says to remove it before a restart."""
        directory = self.options.state_dir
        if feedback is None or directory is None:
            return
        try:
            save_feedback(directory, self.run_id, self.codec, feedback, version, held)
        except OSError as exc:
            problem = remove_feedback(directory)
            if problem:
                fate = (f"it could not be removed either ({problem}): it may hold a residual the update of version "
                        f"{version} carries; remove it before restarting this worker")
            else:
                fate = (f"it is removed: a restart before the next save starts from zero (residual norm "
                        f"{feedback.residual_norm():.4g} lost)")
            log.warning("%s: the error-feedback residual of %s could not be saved in %s (%s); %s", self.worker_id or
                        self.name, self.run_id, directory, exc, fate)

    def _deliver(self, version: int, tokens: int, header: pb.TensorHeader, chunks: list[pb.TensorChunk],
                 rejoin: bool = True) -> bool:
        """Push one update until it lands; False when it is stale.

        Transient failures are retried by the client (the update is kept meanwhile). On NOT_FOUND
        the worker joins again (naming the membership that ended) and, while it is in the same run, pushes the
        same update under its new id, even when the version moved: the coordinator, which carries the ended
        membership's last delivered and pulled versions over to the new one (after its own restart, the delivered
        version of the rounds it committed), says whether an earlier attempt landed (ALREADY_EXISTS: the residual
        left after it is kept), the update is merged late, or it is stale.
        """
        steps = self.round_steps
        for _ in range(MAX_PUSH_REJOINS + 1):
            identity = self.identity
            meta = pb.UpdateMeta(
                worker_id=identity.worker_id, worker_secret=identity.worker_secret, base_version=version, tokens=tokens,
                inner_steps=steps,
            )
            try:
                response = self.client.push(meta, header, chunks)
            except grpc.RpcError as err:
                if _is(err, grpc.StatusCode.ALREADY_EXISTS):
                    return True
                if _is(err, grpc.StatusCode.FAILED_PRECONDITION):
                    log.warning("%s: %s", self.worker_id, err.details())
                    return False
                if not _is(err, grpc.StatusCode.NOT_FOUND):
                    raise
                if not rejoin:
                    raise Rejoin(err.details()) from err
                run_id = self.run_id
                log.warning("%s; joining again to deliver the update of version %d", err.details(), version)
                if self._join() is None or self.run_id != run_id:
                    log.warning("%s: the update of version %d is for a run this worker no longer trains after the "
                                "re-join; dropped", self.name, version)
                    return False
                continue
            if response.staleness > 0:
                log.info("%s: the update of version %d (%d steps) was merged late into round %d of %s, weight %.3f",
                         self.worker_id, version, steps, response.round_version, self.run_id, response.staleness_weight)
            else:
                log.info("%s pushed round %d of %s (%d steps, %d reports so far)", self.worker_id,
                         response.round_version, self.run_id, steps, response.reports)
            return True
        log.warning("%s: the update of version %d was refused %d times after re-joins; dropped", self.name, version, MAX_PUSH_REJOINS + 1)
        return False

    def _await(self, min_version: int) -> None:
        while not self.stop.is_set():
            identity = self.identity
            response = self._call(self.client.await_version, identity, min_version, AWAIT_WAIT_S)
            self._note_assignment(response, identity.worker_id)
            if response.run_state == pb.RUN_STATE_FINISHED:
                self.finished = True
                return
            if response.version >= min_version:
                return

    def _await_past(self, version: int, run_id: str) -> None:
        """After the update of `version` was refused stale: while the coordinator still serves `version` (its round
        closing, or a run stopped or finished), an update trained from it again would be refused again, so wait for
        v+1 (`_await`: it also ends at the run's finish, and a sweep's stopped run moves the worker with NOT_FOUND).
        A newer version, or an older one (a coordinator that resumed from an older checkpoint), is pulled at once.
        Before, the worker pulled `version` again at once and trained and pushed in a loop (2,016 refused pushes in
        40 s from a pruned run's worker). Not after a re-join into another run (`run_id` was the update's)."""
        identity = self.identity
        if self.finished or not identity.worker_id or self.run_id != run_id:  # a re-join found the run over, or moved
            return
        response = self._call(self.client.await_version, identity, version + 1, 0.0)
        self._note_assignment(response, identity.worker_id)
        if response.run_state == pb.RUN_STATE_FINISHED:
            self.finished = True
        elif response.version == version:
            self._await(version + 1)

    def _keep(self, rows: list[pb.Metric]) -> None:
        """Rows trained now, for the current membership's run, to send with the next report."""
        self._pending.extend(rows)
        self._pending_run = self.run_id

    def _report_batch(self) -> list[pb.Metric]:
        """The oldest pending rows, at most what the run takes from a worker at one version
        (`RunSpec.metric_rows_per_round`): a larger batch would be refused whole, every time."""
        cap = self.spec.metric_rows_per_round() if self.spec is not None else len(self._pending)
        return self._pending[:cap]

    def _flush_metrics(self) -> None:
        """Send the oldest pending metrics (`_report_batch`), unless the worker holds no membership; one attempt
        (training never waits on metrics). A transient failure (the coordinator's time budget among them) keeps the
        rows for the next report (the newest MAX_PENDING_METRICS), a refusal drops them: one WARNING line either
        way, without a traceback. NOT_FOUND re-joins."""
        identity = self.identity
        if not (self._pending and identity.worker_id):
            return
        batch = self._report_batch()
        sent = self._counters.rows(batch, self._counts())
        try:
            self.client.report_metrics(identity, sent, self._pending_run)
        except grpc.RpcError as err:
            action, reason = classify(err.code())
            if action is Action.REJOIN:
                raise Rejoin(err.details()) from err
            rows = len(self._pending)
            if action is Action.RETRY:
                self._pending = self._pending[-MAX_PENDING_METRICS:]
                fate = f"{len(self._pending)} kept for the next report" + (
                    f", {rows - len(self._pending)} oldest dropped" if rows > len(self._pending) else "")
            else:
                self._pending, fate = self._pending[len(batch):], f"{len(batch)} dropped"
            log.warning("%s: ReportMetrics failed: %s: %s (%s); of %d metric rows %s", self.worker_id,
                        err.code().name, err.details(), reason, rows, fate)
            return
        self._counters.delivered(sent)
        self._pending = self._pending[len(batch):]

    def _record_membership(self, membership: Membership | None) -> None:
        """Write `membership` to --membership-file (None: remove it), best effort: the file only lets a restarted
        process end this membership, so a failed write (a full disk, a removed directory) is one WARNING, the stale
        file removed where it can be, and the worker trains on (it ended with an uncaught OSError)."""
        path = self.options.membership_file
        try:
            if membership is None:
                remove_membership(path)
            else:
                write_membership(path, membership)
            return
        except OSError as exc:
            log.warning("%s: the membership file %s could not be %s (%s); training on without it", self.name, path,
                        "removed" if membership is None else "written", exc)
        if membership is not None:  # a stale file would name the membership this one replaced
            try:
                remove_membership(path)
            except OSError:
                pass

    def _flush_previous(self, previous: Identity) -> None:
        """Before a re-join: the oldest pending rows (`_report_batch`) under the membership that trained them; kept
        when the coordinator no longer knows it (NOT_FOUND: restarted, or evicted) or did not answer (one attempt, as
        every report); dropped with one WARNING when it refuses them, as `_flush_metrics` drops them (metrics are
        best effort: a refused report ended the worker here, at a sweep's move or a pruned run's re-join)."""
        if not self._pending:
            return
        batch = self._report_batch()
        sent = self._counters.rows(batch, self._counts())
        try:
            self.client.report_metrics(previous, sent, self._pending_run)
        except grpc.RpcError as err:
            if classify(err.code())[0] is Action.FATAL:
                self._pending = self._pending[len(batch):]
                log.warning("%s: ReportMetrics of the membership it leaves refused: %s: %s; %d metric rows dropped",
                            self.worker_id, err.code().name, err.details(), len(batch))
            return
        self._counters.delivered(sent)
        self._pending = self._pending[len(batch):]

    def _heartbeat_loop(self) -> None:
        logged: set[str] = set()  # the kinds of unexpected errors logged (`_heartbeat_error`)
        while not self.stop.wait(heartbeat_interval(self.lease_s)):
            identity = self.identity
            try:
                response = self.client.heartbeat(identity)
                self._note_assignment(response, identity.worker_id)
                if response.run_state == pb.RUN_STATE_FINISHED:
                    self.finished = True
            except grpc.RpcError as err:
                with self._moved_lock:
                    if moved(err) and identity.worker_id and identity.worker_id == self.identity.worker_id:
                        self._moved_why = err.details() or "moved"
                        self._moved.set()
                log.debug("heartbeat failed: %s", err)
            except (RetriesExhausted, Stopped) as exc:
                log.debug("heartbeat failed: %s", exc)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive one bad beat (`_heartbeat_error`)
                self._heartbeat_error(exc, logged)

    def _heartbeat_error(self, exc: Exception, logged: set[str]) -> None:
        """An unexpected error in one beat (neither a gRPC status nor the client's give-up or stop: a malformed
        answer, a bug in handling one). The thread is started once per process (`_join`), so before, such an error
        ended it for good: the lease lapsed, the coordinator evicted the worker and every later call met NOT_FOUND
        and joined again. It keeps beating instead: one beat's error says nothing about the next, and an error that
        does repeat before the call is made costs what it cost before (the lease lapses and the training thread's
        calls re-join), while the worker neither exits nor floods its log. The first error of each kind is one
        WARNING line with its traceback, later ones of that kind DEBUG lines; after the stop (the channel closing
        under the beat) DEBUG only."""
        kind = type(exc).__name__
        if self.stop.is_set() or kind in logged:
            log.debug("heartbeat failed: %s: %s", kind, exc)
            return
        logged.add(kind)
        log.warning("%s: a heartbeat failed unexpectedly (%s: %s); beating on (later %s errors are logged at DEBUG)",
                  self.name, kind, exc, kind, exc_info=exc)

    def _check_moved(self, version: int, steps: int) -> None:
        """After a round's training stopped early: Rejoin when it stopped because the heartbeat heard that this
        membership's run no longer takes its updates (`_moved`), so that the worker joins again without pushing.
        Before, it trained the round to its end and pushed an update that was dropped (a pruned run's workers: up to
        a whole round, 23 minutes of an H100 in examples/frame_git_gpu.toml)."""
        if self._moved.is_set() and not self.stop.is_set():
            raise Rejoin(f"{self._moved_why} (the round from version {version} stopped after {steps} steps)")

    def _leave(self) -> None:
        self.stop.set()
        if self._inflight is not None:
            self._inflight.exchange.join(self.options.rpc_timeout_s)
        try:
            if self.worker_id:
                self._flush_metrics()
                self.client.leave(self.identity, "finished" if self.finished else "stopped")
                log.info("%s left the swarm", self.worker_id)
                if self.options.membership_file is not None:
                    self._record_membership(None)
        except (grpc.RpcError, Rejoin, RetriesExhausted, Stopped) as exc:
            log.warning("leave failed: %s", exc)
        finally:
            # Also without a membership (a run that finished under a re-join): the heartbeat thread may still beat.
            self.client.close()
            self._end_threads()

    def _end_threads(self) -> None:
        """Wait (bounded) for the heartbeat thread and an overlapped round's exchange to end, after `stop` is set and
        the channel closed: closing cancels a call in flight, whose retry then sees `stop`. A daemon thread still
        inside a gRPC call when the interpreter exits aborted the process (SIGABRT, "terminate called without an
        active exception") after a clean leave."""
        threads = [t for t in (self._heartbeat, self._inflight.exchange.thread if self._inflight else None) if t]
        for thread in threads:
            thread.join(self.options.rpc_timeout_s)
            if thread.is_alive():
                log.warning("%s: its %s thread did not end within %gs", self.name, thread.name, self.options.rpc_timeout_s)
