"""A coordinator restart right after a round closed with a worker's update, before the answer reached the worker, does
not make that worker send its error-feedback residual twice (a review's finding): the real worker in this process, a
real coordinator on loopback (gRPC on 127.0.0.1) over a real SQLite state dir, restarted on the same port.

The last pusher of a round is answered only once the round closed and committed. A coordinator that dies in that
window took the membership with it: the worker's re-push under its new membership was stale (not pulled by it) and
the worker put back the residual the landed update had carried, which it then sent again (the residual left after
the landed update lost). Each committed round now records its reporters in its transaction, and a re-join naming the
membership whose update landed takes over its delivered version: the re-push is ALREADY_EXISTS and the residual after
the landed update is kept."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
import torch

from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from rcswarm.worker import Worker
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.worker import _options

# error_decay 1: the worker's residual keeps all that its messages did not carry, so (sum of the updates it
# delivered) = (sum of what the coordinator decoded from its messages) + (its residual), up to float32 rounding.
SPARSE = {"codec": "sparse", "sparse_chunk": 256, "density": 0.05, "value_bits": 2, "error_decay": 1.0}
# The round whose close the first coordinator dies after (committed as version DIES_AFTER + 1).
DIES_AFTER = 1


class Tapped(SwarmCoordinator):
    """The real coordinator, keeping what it decoded from each update it accepted (`received`, its base version and
    tensors). With `dies` it dies right after a push of its closed round DIES_AFTER and committed it: that push is
    not answered (it waits until the test stopped the server, `release`), nor is anything after it."""

    def __init__(self, spec, store: StateStore, received: list[tuple[int, dict[str, torch.Tensor]]],
                 dies: bool = False) -> None:
        super().__init__(spec, store)
        self.received = received
        self.dies = dies
        self.died = threading.Event()
        self.release = threading.Event()

    def push(self, requests):
        messages: list[pb.PushUpdateRequest] = []

        def tap():
            for message in requests:
                messages.append(message)
                yield message

        response = super().push(tap())
        header = next(m.header for m in messages if m.WhichOneof("part") == "header")
        meta = next(m.meta for m in messages if m.WhichOneof("part") == "meta")
        receiver = tensor_stream.PayloadReceiver(header, expected=self.shapes)
        for message in messages:
            if message.WhichOneof("part") == "chunk":
                receiver.add(message.chunk)
        self.received.append((meta.base_version, receiver.finish()))
        if self.dies and self.version > DIES_AFTER and not self.died.is_set():
            self.died.set()
            self.release.wait(60)
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "the coordinator died before answering")
        return response


class Counting(Worker):
    """The real worker, keeping the update of every version it delivered (`sent`, as computed before compression),
    each answer (base version, delivered) and each membership."""

    def __init__(self, options) -> None:
        super().__init__(options, TOKEN)
        self.sent: dict[int, dict[str, torch.Tensor]] = {}
        self.answers: list[tuple[int, bool]] = []
        self.memberships: list[str] = []

    def _join(self):
        version = super()._join()
        self.memberships.append(self.worker_id)
        return version

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True) -> bool:
        kept = {name: delta.detach().clone() for name, delta in deltas.items()}
        delivered = super()._push_deltas(version, deltas, tokens, send_bound, rejoin)
        self.answers.append((version, delivered))
        if delivered:
            self.sent[version] = kept
        return delivered


def start(spec, state_dir: Path, received, dies: bool = False, port: int = 0) -> RunningCoordinator:
    store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
    return RunningCoordinator(Tapped(spec, store, received, dies), TOKEN, port=port).start()


def _sum(tensors: list[dict[str, torch.Tensor]], names) -> dict[str, torch.Tensor]:
    return {name: sum((t[name].double() for t in tensors), torch.zeros(())) for name in names}


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap"])
def test_a_restart_after_the_close_before_the_answer_sends_no_residual_twice(tmp_path: Path, overlap: bool) -> None:
    """Blocking, the push's NOT_FOUND re-joins in `_deliver`; with overlap the exchange hands it to the training
    thread (`_finish_exchange`), which pushes the update again: both are answered ALREADY_EXISTS."""
    spec = tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 2}, sync={**SPARSE, "overlap": overlap},
                     coordinator={"lease_s": 10.0, "max_wait_s": 1.0})
    received: list[tuple[int, dict[str, torch.Tensor]]] = []
    running = start(spec, tmp_path / "state", received, dies=True)
    port, first = running.port, running.coordinator
    worker = Counting(_options(f"127.0.0.1:{port}", patience_s=60.0))
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        wait_for(first.died.is_set, 60, f"round {DIES_AFTER} to close")
        running.stop(grace=0.2)  # the answer of the push that closed the round never leaves
        first.release.set()
        running = start(spec, tmp_path / "state", received, port=port)
        # The restarted coordinator resumed after the close: the update landed.
        assert running.coordinator.version == DIES_AFTER + 1
        wait_for(lambda: len(worker.sent) >= DIES_AFTER + 3 or not thread.is_alive(), 60, "rounds after the restart")
    finally:
        worker.stop.set()
        thread.join(timeout=30)
        running.stop(grace=0.2)
    assert result == [0]
    assert len(worker.memberships) >= 2, "the worker did not join again after the restart"
    # The update that closed round DIES_AFTER reached the coordinator once, before the restart.
    assert [base for base, _ in received].count(DIES_AFTER) == 1
    # Its re-push under the new membership is answered "already delivered", not stale: no update is answered stale.
    assert (DIES_AFTER, False) not in worker.answers, f"the landed update was answered stale: {worker.answers}"
    # Every update the coordinator decoded was one the worker counts as delivered, and the worker's residual holds
    # exactly what they did not carry: nothing sent twice, nothing lost (before the fix the residual the landed update
    # carried was put back and sent again; the difference was that update's message).
    assert sorted({base for base, _ in received}) == sorted(worker.sent)
    names = list(first.shapes)
    delivered = _sum(list(worker.sent.values()), names)
    carried = _sum([tensors for _, tensors in received], names)
    residual = worker.error_feedback.snapshot()
    for name in names:
        torch.testing.assert_close(carried[name] + residual[name].double(), delivered[name], rtol=0, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: what the coordinator received plus the residual "
                                                            f"is not what the worker delivered: {m}")
