"""A worker's metric rows carry the bytes and seconds of the run they are stored in only, all of them
(`worker.RunCounters`).

The client counts bytes from the process's start. Before, each row carried those counts as they were when it was
made, so (1) a worker a sweep moved from one run (length) to another brought its earlier run's bytes into the next
run's rows, and the run summary (`observe/report.summarize`: the sum over memberships of their maxima) counted them
there again: the demo sweep reported at L=16 2 × the full pulls' bytes received per round (0.8× fp32 down); and (2)
the round's push, made after its rows, reached a row of that run only with the next pull, which a worker the sweep
moves on does not make: at L=4 an int8 uplink read 7.9× below fp32 (int8 is ~3.8×).

The real `Worker` joins, keeps and reports its rows through a fake client that answers joins into the runs the test
names and records every report, so the test sets exactly what moved on the wire when.
"""

from __future__ import annotations

import dataclasses

import grpc

from rcswarm.observe.report import summarize
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.worker import Worker
from rcswarm.worker.worker import RunCounters
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import _options


class NotFound(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.NOT_FOUND

    def details(self) -> str:
        return "unknown worker"


class Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return "metrics refused: metrics[0].loss = -1.0 is out of range"


class Wire:
    """The worker's client, faked: `joins` is the run each next Join lands in; byte counters the test moves; every
    stored report as (run_id, worker_id, rows); reports from a membership in `forgotten` fail with NOT_FOUND, from
    one in `refusing` with INVALID_ARGUMENT."""

    def __init__(self, joins: list[str]) -> None:
        self.joins = list(joins)
        self.bytes_sent = self.bytes_received = 0
        self.stored: list[tuple[str, str, list[pb.Metric]]] = []
        self.forgotten: set[str] = set()
        self.refusing: set[str] = set()
        self.members = 0
        self.spec_json = tiny_spec().to_json()

    def join(self, name: str, device: str, pid: int, run_id: str = "", previous: object = None,
             refused: tuple[str, ...] = ()) -> pb.JoinResponse:
        self.members += 1
        return pb.JoinResponse(worker_id=f"w{self.members}", worker_secret=b"s" * 32, run_id=self.joins.pop(0),
                               run_spec_json=self.spec_json, version=0, lease_seconds=3000.0, data_seed=1)

    def report_metrics(self, member, metrics: list[pb.Metric], run_id: str) -> None:
        if member.worker_id in self.forgotten:
            raise NotFound()
        if member.worker_id in self.refusing:
            raise Refused()
        self.stored.append((run_id, member.worker_id, list(metrics)))

    def heartbeat(self, member) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse()

    def close(self) -> None:
        pass


def moved_worker(joins: list[str]) -> tuple[Worker, Wire]:
    worker = Worker(_options("127.0.0.1:1"), TOKEN)
    worker.client.close()
    wire = Wire(joins)
    worker.client = wire
    return worker, wire


def row(worker: Worker, step: int) -> None:
    """A training row kept now (its bytes: the client's counters at this moment)."""
    worker._keep([worker._metric(dataclasses.replace(worker.trainer.row(0, 3.0, 128), step=step))])


def maxima(wire: Wire) -> dict[tuple[str, str], tuple[int, int]]:
    """(run, membership) -> its rows' (max bytes_sent, max bytes_received): what every reader of the store takes."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for run_id, worker_id, rows in wire.stored:
        sent, received = out.get((run_id, worker_id), (0, 0))
        out[run_id, worker_id] = (max([sent, *(r.bytes_sent for r in rows)]),
                                  max([received, *(r.bytes_received for r in rows)]))
    return out


def test_a_worker_moved_to_another_run_reports_that_runs_bytes_only() -> None:
    """Each round as the worker runs it: pull (a pull row), train (a training row), push, report."""
    worker, wire = moved_worker(["sweep-L4", "sweep-L16", "sweep-L16"])
    try:
        worker._join()  # L=4, membership w1: a full pull, then a step
        for step, (pulled, pushed) in enumerate([(1_000, 300), (100, 250)]):
            wire.bytes_received += pulled
            row(worker, 2 * step)
            row(worker, 2 * step + 1)
            wire.bytes_sent += pushed
            worker._flush_metrics()
        worker._join()  # L=4 finished: the sweep moves it to L=16 (membership w2), where it pulls θ in full
        wire.bytes_received += 5_000
        row(worker, 4)
        row(worker, 5)
        wire.bytes_sent += 700
        worker._flush_metrics()
        wire.bytes_received += 800  # a step pulled; its row is kept, then the coordinator forgets w2
        row(worker, 6)
        wire.forgotten.add("w2")
        worker._join()  # re-joins L=16 (w3): the kept row goes under w3
        row(worker, 7)
        wire.bytes_sent += 60
        worker._flush_metrics()
    finally:
        worker.stop.set()
        worker._end_threads()
    totals = maxima(wire)
    # One worker in one run reports its client's counters, a report's newest row those of the report (its push in).
    assert totals["sweep-L4", "w1"] == (550, 1_100)
    # In L=16: 5,000 + 800 bytes received, 700 + 60 sent, each counted by one membership; nothing of L=4's.
    assert totals["sweep-L16", "w2"] == (700, 5_000)
    assert totals["sweep-L16", "w3"] == (60, 800)
    per_run = {run: tuple(sum(v[i] for (r, _), v in totals.items() if r == run) for i in (0, 1))
               for run in ("sweep-L4", "sweep-L16")}
    assert per_run == {"sweep-L4": (550, 1_100), "sweep-L16": (760, 5_800)}


def test_the_run_summary_of_a_moved_workers_rows_counts_the_runs_traffic_once(tmp_path) -> None:
    """The rows such a worker sends, stored as the coordinator stores them, summed by `summarize`."""
    worker, wire = moved_worker(["sweep-L4", "sweep-L16"])
    try:
        # In each run: a pull (received), a row, a push (sent), a row, the report.
        for first_step, (received, sent) in ((1, (1_000, 300)), (3, (5_000, 700))):
            worker._join()
            wire.bytes_received += received
            row(worker, first_step)
            wire.bytes_sent += sent
            row(worker, first_step + 1)
            worker._flush_metrics()
    finally:
        worker.stop.set()
        worker._end_threads()
    store = StateStore(tmp_path / "L16")
    try:
        store.add_metrics([("sweep-L16", worker_id, m.version, m.step, m.seq_len, m.batch, m.loss, m.tokens,
                            m.wall_time, m.compute_seconds, m.sync_seconds, m.bytes_sent, m.bytes_received, "",
                            100.0 + m.step)
                           for run_id, worker_id, rows in wire.stored if run_id == "sweep-L16" for m in rows])
        summary = summarize(store)
    finally:
        store.close()
    assert (summary.bytes_sent_per_round, summary.bytes_received_per_round) == (700, 5_000)


def test_run_counters_take_off_what_an_earlier_run_or_membership_counted() -> None:
    counts = RunCounters()
    counts.joined(False, (0, 0, 0.0, 0.0))
    first = counts.rows([pb.Metric(bytes_sent=0, bytes_received=100), pb.Metric(bytes_sent=0, bytes_received=100)],
                        (10, 100, 0.0, 0.0))  # a push of 10 bytes after the rows were made: the newest row counts it
    assert [(m.bytes_sent, m.bytes_received) for m in first] == [(0, 100), (10, 100)]
    counts.delivered(first)
    counts.joined(False, (15, 120, 0.0, 0.0))  # another run: from the join on
    moved = counts.rows([pb.Metric(bytes_sent=20, bytes_received=220, loss=2.5)], (20, 220, 0.0, 0.0))
    assert [(m.bytes_sent, m.bytes_received, m.loss) for m in moved] == [(5, 100, 2.5)]
    counts.delivered(moved)
    counts.joined(True, (30, 300, 0.0, 0.0))  # the same run again: from its newest stored row on
    again = counts.rows([pb.Metric(bytes_sent=30, bytes_received=300)], (30, 300, 0.0, 0.0))
    assert [(m.bytes_sent, m.bytes_received) for m in again] == [(10, 80)]
    assert counts.rows([pb.Metric(bytes_sent=1, bytes_received=1)], (1, 1, 0.0, 0.0))[0].bytes_sent == 0  # never < 0


def test_a_worker_moved_to_another_run_reports_that_runs_compute_and_sync_seconds_only() -> None:
    """Before, the rows of a moved worker carried its compute and sync seconds from process start: in the next run its
    compute utilization (compute seconds over the membership's wall span) and sync share counted the earlier run's."""
    worker, wire = moved_worker(["sweep-L4", "sweep-L16"])
    try:
        worker._join()
        worker.trainer.compute_seconds, worker.sync_seconds = 40.0, 10.0
        row(worker, 1)
        worker._flush_metrics()
        worker._join()  # the sweep moves it on
        worker.trainer.compute_seconds, worker.sync_seconds = 45.0, 11.0
        row(worker, 2)
        worker.sync_seconds = 12.5  # the round's push, after the row: the report's newest row counts it
        worker._flush_metrics()
    finally:
        worker.stop.set()
        worker._end_threads()
    seconds = {(run, member): [(m.compute_seconds, m.sync_seconds) for m in rows] for run, member, rows in wire.stored}
    assert seconds == {("sweep-L4", "w1"): [(40.0, 10.0)], ("sweep-L16", "w2"): [(5.0, 2.5)]}


def test_rows_the_left_membership_is_refused_are_dropped_at_the_rejoin_not_fatal(caplog) -> None:
    """A re-join first reports the rows pending under the membership it leaves (`_flush_previous`); a refusal there
    (INVALID_ARGUMENT: a coordinator that bounds a field this worker's rows break) ended the worker, where the same
    refusal of a plain report drops the rows with a WARNING. Now the rows are dropped here too, and the re-join goes
    on."""
    worker, wire = moved_worker(["sweep-L4", "sweep-L16"])
    try:
        worker._join()  # membership w1
        row(worker, 0)
        wire.refusing.add("w1")
        with caplog.at_level("WARNING"):
            worker._join()  # moved to L=16 (w2): w1's pending row is refused, dropped
        assert worker.identity.worker_id == "w2" and worker._pending == []
        assert "ReportMetrics of the membership it leaves refused: INVALID_ARGUMENT" in caplog.text
        row(worker, 1)
        worker._flush_metrics()
    finally:
        worker.stop.set()
        worker._end_threads()
    assert [(run, member, [r.step for r in rows]) for run, member, rows in wire.stored] == [("sweep-L16", "w2", [1])]
