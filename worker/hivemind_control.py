"""The coordinator's control plane for a hivemind worker: Join, heartbeats, ReportMetrics, Leave — no tensors.

With `rcswarm worker --backend hivemind --coordinator HOST:PORT`, the worker joins the coordinator
as any worker does (the run spec, a data seed, its place in the status, the dashboard and the fits
come from there) but averages peer to peer. Every call after the join runs on this class's thread,
so a coordinator that is down or restarting never stalls training: metric rows wait in a bounded
queue (the oldest dropped past `MAX_PENDING`), NOT_FOUND (evicted, or a restarted coordinator)
joins again, and other failures are retried on the next beat. The coordinator shows the newest
version its workers report (`SwarmCoordinator.shown_version`). The newest TrainingAssignment of
the Join and Heartbeat answers is kept for the training thread (`assignment`), which applies it
at its next round boundary: under `curriculum.worker_seq_lens` the worker's own length, under the
adaptive policy the run's rung, which the coordinator moves as these ReportMetrics calls report
new versions (so a new rung arrives with the Heartbeat after the report that decided it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque

import grpc

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.client import (
    Action,
    CoordinatorClient,
    Identity,
    RetriesExhausted,
    RetryPolicy,
    Stopped,
    Timeouts,
    classify,
)

log = logging.getLogger("rcswarm.worker")
MAX_PENDING = 10_000
# Rows per ReportMetrics call: below coordinator.max_metrics_per_round (at least 64), so a backlog after an outage gets through.
BATCH = 48


class ControlPlane:
    """One membership at a coordinator. `join` runs on the caller's thread before training; `report`
    (training thread) only appends to `_pending` and `assignment` only reads `_assignment`, both under
    `_lock`; `_loop` (thread `control`) makes every other call, and under `_lock` takes each batch it sends out of
    `_pending` (`_beat`) and sets `_assignment`; `close` stops it and sends Leave."""

    def __init__(self, target: str, token: str, name: str, device: str, *, patience_s: float = 300.0,
                 rpc_timeout_s: float = 10.0, beat_s: float = 1.0, **tls: object) -> None:
        self.name, self.device, self.beat_s = name, device, beat_s
        self.stop = threading.Event()
        self.client = CoordinatorClient(target, token, retry=RetryPolicy(max_elapsed_s=patience_s),
                                        timeouts=Timeouts(unary_s=rpc_timeout_s), stop=self.stop, **tls)
        self.identity = Identity()
        self.run_id = ""
        self.lease_s = 10.0
        self._pending: deque[pb.Metric] = deque(maxlen=MAX_PENDING)
        self._lock = threading.Lock()
        self._assignment: pb.TrainingAssignment | None = None
        self._thread: threading.Thread | None = None
        self.joins = 0

    def join(self) -> pb.JoinResponse:
        """Join (retried within the patience); the response carries the run spec and the data seed. A re-join names
        the run it joined before, where a sweep sends it back."""
        response = self.client.join(self.name, self.device, os.getpid(), self.run_id, self.identity)
        self.identity, self.lease_s, self.run_id = Identity.of(response), response.lease_seconds, response.run_id
        self.joins += 1
        self._note(response)
        log.info("%s joined %s as %s (control plane only; averaging peer to peer)", self.name, response.run_id,
                 response.worker_id)
        return response

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="control", daemon=True)
        self._thread.start()

    def _note(self, response: pb.JoinResponse | pb.HeartbeatResponse) -> None:
        """Keep the answer's assignment (a restarted coordinator's answers replace the old one's)."""
        if response.HasField("assignment"):
            with self._lock:
                self._assignment = response.assignment

    def assignment(self) -> pb.TrainingAssignment | None:
        """The coordinator's newest assignment for this worker (None before any)."""
        with self._lock:
            return self._assignment

    def report(self, metrics: list[pb.Metric]) -> None:
        with self._lock:
            self._pending.extend(metrics)

    def _loop(self) -> None:
        while not self.stop.wait(min(self.beat_s, self.lease_s / 3.0)):
            try:
                self._beat()
            except Stopped:
                return
            except (grpc.RpcError, RetriesExhausted) as exc:
                code = exc.code() if isinstance(exc, grpc.RpcError) else None
                if code == grpc.StatusCode.NOT_FOUND:
                    log.warning("%s: the coordinator no longer knows %s; joining again", self.name, self.identity.worker_id)
                    self._rejoin()
                else:
                    log.warning("%s: the coordinator did not answer (%s); training goes on", self.name, exc)

    def _rejoin(self) -> None:
        try:
            self.join()
        except (grpc.RpcError, RetriesExhausted) as exc:
            log.warning("%s: joining again failed (%s); retrying on the next beat", self.name, exc)

    def _beat(self) -> None:
        """A heartbeat, then the pending rows in batches: each batch is taken out of the queue under `_lock` before it
        is sent, and stays out once it is stored or the coordinator refused it (`_report`); a call that raises (a
        transient failure or NOT_FOUND) puts it back at the head (`_put_back`). Before, the batch stayed in
        the queue while it travelled and was popped from the left afterwards: a `report` that overflowed the queue
        meanwhile had already dropped those rows from the left, so the pops dropped as many rows never sent
        (review 2026-12, F5)."""
        self._note(self.client.heartbeat(self.identity))
        while True:
            with self._lock:
                batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
            if not batch:
                return
            try:
                self._report(batch)
            except BaseException:
                self._put_back(batch)
                raise

    def _put_back(self, batch: list[pb.Metric]) -> None:
        """Return an unsent `batch` to the head of the queue, in order. Rows reported while it travelled may have
        filled the queue: the queue drops its oldest rows past MAX_PENDING as `report` does, and those are the
        batch's own oldest ones, so only the batch's newest rows that still fit go back (one WARNING says how many
        were dropped)."""
        with self._lock:
            room = MAX_PENDING - len(self._pending)
            kept = batch[len(batch) - room:] if room < len(batch) else batch
            self._pending.extendleft(reversed(kept))
        if len(kept) < len(batch):
            log.warning("%s: %d metric rows dropped: the queue filled (%d rows) while they were sent", self.name,
                        len(batch) - len(kept), MAX_PENDING)

    def _report(self, batch: list[pb.Metric]) -> None:
        """Send one batch of rows. A transient failure or NOT_FOUND raises (the batch stays for the next beat, after a
        re-join); a refusal (INVALID_ARGUMENT, ...) returns after one WARNING, so the batch is dropped: kept at the
        head of the queue, it was refused every beat and no later row was ever delivered."""
        try:
            self.client.report_metrics(self.identity, batch, self.run_id)
        except grpc.RpcError as err:
            action, reason = classify(err.code())
            if action in (Action.RETRY, Action.REJOIN):
                raise
            log.warning("%s: ReportMetrics refused: %s: %s (%s); %d metric rows dropped", self.name,
                        err.code().name, err.details(), reason, len(batch))

    def close(self, reason: str) -> None:
        """Stop the thread, send what is pending (one try) and Leave (its own try: a refused or failed report does not
        keep the membership until its lease runs out)."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            with self._lock:
                batch = list(self._pending)[:BATCH]
            if batch:
                self._report(batch)
        except grpc.RpcError as exc:
            log.warning("%s: the last metric rows were not delivered: %s", self.name, exc.code().name)
        try:
            self.client.leave(self.identity, reason)
        except grpc.RpcError as exc:
            log.warning("%s: leave failed: %s", self.name, exc.code().name)
        finally:
            self.client.close()
