"""The metric queue of a hivemind worker's control plane (worker/hivemind_control.py) while the training thread reports
during a send (concurrency review 2026-12, F5): a batch leaves the queue before it is sent, so rows reported meanwhile
that overflow the bounded queue drop its oldest waiting rows, never the ones already sent nor the next ones to send;
a refused batch is dropped, and a batch that failed transiently goes back to the head, its oldest rows dropped with a
WARNING when the queue filled meanwhile."""

from __future__ import annotations

import logging
import threading

import grpc
import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import hivemind_control as hc

# The calls of one beat: stored, refused, stored, then a transient failure; and how many rows the training thread
# reports while each travels.
ANSWERS = (None, grpc.StatusCode.INVALID_ARGUMENT, None, grpc.StatusCode.UNAVAILABLE)
MEANWHILE = (hc.BATCH, hc.BATCH, hc.BATCH, hc.BATCH // 2)


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"a test's {self._code.name}"


class ReportingMeanwhile:
    """A client whose every ReportMetrics call lets the training thread (a real second thread) report new rows while
    the call travels (MEANWHILE), then answers as ANSWERS says; records the steps of the batches it stored."""

    def __init__(self, control: hc.ControlPlane) -> None:
        self.control, self.calls, self.stored = control, 0, []
        self.next_step = hc.MAX_PENDING

    def heartbeat(self, identity) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse()

    def report_metrics(self, identity, batch: list[pb.Metric], run_id: str) -> None:
        rows = [pb.Metric(step=self.next_step + i) for i in range(MEANWHILE[self.calls])]
        self.next_step += len(rows)
        training = threading.Thread(target=self.control.report, args=(rows,))
        training.start()
        training.join(timeout=5)
        assert not training.is_alive(), "report() blocked while a batch was being sent"
        code = ANSWERS[self.calls]
        self.calls += 1
        if code is not None:
            raise Failed(code)
        self.stored.extend(m.step for m in batch)


def test_rows_reported_during_a_send_at_a_full_queue_drop_no_unsent_row(caplog: pytest.LogCaptureFixture) -> None:
    control = hc.ControlPlane("127.0.0.1:1", "t", "w", "cpu")
    control.client.close()
    client = control.client = ReportingMeanwhile(control)
    control.report([pb.Metric(step=i) for i in range(hc.MAX_PENDING)])  # at its bound: the coordinator was away
    b = hc.BATCH
    with caplog.at_level(logging.WARNING, logger="rcswarm.worker"), pytest.raises(Failed):
        control._beat()
    assert client.calls == len(ANSWERS)
    # Batches 0 and 2 stored, whole and in order; batch 1 refused. Before, the rows reported during the first send
    # pushed the batch in flight out of the left end and its popleft()s then dropped batch 1 (steps 48..95) unsent.
    assert client.stored == [*range(b), *range(2 * b, 3 * b)]
    # Batch 3 failed after half a batch was reported meanwhile (into the room its own rows made): it goes back in
    # front of those rows, in order, but the queue keeps its bound and its newest rows, so it drops batch 3's oldest
    # half (the oldest rows of all), saying so.
    steps = [m.step for m in control._pending]
    newest = hc.MAX_PENDING + 3 * b + b // 2
    assert steps == list(range(newest - hc.MAX_PENDING, newest))
    assert steps[0] == 3 * b + b // 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "ReportMetrics refused: INVALID_ARGUMENT" in warnings[0] and f"{b} metric rows dropped" in warnings[0]
    assert (f"{b // 2} metric rows dropped: the queue filled ({hc.MAX_PENDING} rows) while they were sent"
            in warnings[1]), warnings

