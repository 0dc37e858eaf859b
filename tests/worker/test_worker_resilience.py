"""Workers ride out stalls and refuse hostile pulls: real gRPC servers on loopback, real processes.

Covers issue 13's findings 1 (a worker exited on any DEADLINE_EXCEEDED) and 7 (a pull header
made the worker allocate what it claimed), and the rules the worker follows: which statuses
are retried, re-joined or fatal; a finished update survives a stall and a re-join; only a
refused token, a refused spec or spent patience end a worker, each with one ERROR line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import tracemalloc
import types
from concurrent import futures
from typing import Iterator

import grpc
import pytest
import torch

from rcswarm.models import registry
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream
from rcswarm.worker import Worker
from rcswarm.worker.client import Action, CoordinatorClient, Identity, RetriesExhausted, RetryPolicy, Timeouts, classify
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.wire import push
from tests.helpers.worker import FaultBeforeFirstPush, _options, run_until

# What a hostile header claims: 2^26 float32 values, 256 MiB, for one tensor.
HUGE = 1 << 26
# Python-level memory a refused pull may use, far below what the header claims.
PEAK_BOUND = 64 << 20
# The membership the hostile server hands out.
HOSTILE_MEMBER = Identity("h1", b"h" * 32)


def test_classify_sorts_every_status_code():
    transient = {
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
    }
    for code in grpc.StatusCode:
        action, reason = classify(code)
        assert reason, code
        if code in transient:
            assert action is Action.RETRY, code
        elif code == grpc.StatusCode.NOT_FOUND:
            assert action is Action.REJOIN
        else:
            assert action is Action.FATAL, code
    assert "token" in classify(grpc.StatusCode.UNAUTHENTICATED)[1]


def test_worker_options_name_a_bad_patience():
    with pytest.raises(ValueError, match="--patience-s 0"):
        _options("127.0.0.1:1", patience_s=0)
    with pytest.raises(ValueError, match="--rpc-timeout-s -1"):
        _options("127.0.0.1:1", rpc_timeout_s=-1)


class Hostile(pb_grpc.CoordinatorServicer):
    """A server speaking the real wire: joins like a coordinator, then serves bad pulls or stalls.

    `header` is what PullParameters sends (and nothing after it); `stall_s` delays the first
    `stalls` heartbeats; `spec_json` is the run spec Join serves. Handlers run on gRPC's threads.
    """

    def __init__(self, spec_json: str, header: pb.TensorHeader | None = None, stall_s: float = 0.0, stalls: int = 0):
        self.spec_json, self.header, self.stall_s = spec_json, header, stall_s
        self.stalls_left = stalls
        self.pulls = 0
        self.lock = threading.Lock()

    def Join(self, request, context):
        return pb.JoinResponse(
            worker_id=HOSTILE_MEMBER.worker_id, worker_secret=HOSTILE_MEMBER.worker_secret, run_id="hostile",
            run_spec_json=self.spec_json, lease_seconds=10.0,
        )

    def Heartbeat(self, request, context):
        with self.lock:
            stall, self.stalls_left = self.stalls_left > 0, self.stalls_left - 1
        if stall:
            time.sleep(self.stall_s)
        return pb.HeartbeatResponse(version=0, lease_seconds=10.0)

    def Leave(self, request, context):
        return pb.LeaveResponse()

    def PullParameters(self, request, context) -> Iterator[pb.PullParametersResponse]:
        with self.lock:
            self.pulls += 1
        yield pb.PullParametersResponse(header=self.header)


@contextlib.contextmanager
def serve(servicer: Hostile) -> Iterator[str]:
    """Serve `servicer` on a loopback port; its HOST:PORT."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=0.2).wait(timeout=5)


def model_shapes() -> dict[str, tuple[int, ...]]:
    spec = tiny_spec()
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def hostile_header(shapes: dict[str, tuple[int, ...]], how: str) -> pb.TensorHeader:
    """A self-consistent fp32 header (sizes, CRC count) that claims a 256 MiB tensor."""
    claimed = dict(shapes)
    if how == "huge shape":
        claimed[next(iter(shapes))] = (HUGE,)
    else:
        claimed["extra.weight"] = (HUGE,)
    infos = [pb.TensorInfo(name=n, dtype=pb.DTYPE_FLOAT32, shape=s, num_bytes=4 * int(torch.Size(s).numel())) for n, s in claimed.items()]
    total = sum(info.num_bytes for info in infos)
    chunk = tensor_stream.MAX_CHUNK_SIZE
    return pb.TensorHeader(
        run_id="hostile", version=1, codec=pb.CODEC_FP32, tensors=infos, total_bytes=total, chunk_size=chunk,
        chunk_crc32=[0] * -(-total // chunk),
    )


@pytest.mark.parametrize("how", ["huge shape", "extra tensor"])
def test_a_hostile_pull_header_is_refused_before_allocation(how):
    shapes = model_shapes()
    with serve(Hostile(tiny_spec().to_json(), hostile_header(shapes, how))) as target:
        client = CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=2.0))
        tracemalloc.start()
        try:
            with pytest.raises(tensor_stream.PayloadError) as refused:
                client.pull(HOSTILE_MEMBER, "hostile", expected=shapes)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            client.close()
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MiB allocated for a refused pull"
    named = next(iter(shapes)) if how == "huge shape" else "extra.weight"
    assert refused.value.tensor == named and named in str(refused.value)


class MeasuredPulls(Worker):
    """The real worker, tracing the Python memory its pulls allocate (from its first pull on: the
    model and data are built before, untraced)."""

    peak = 0

    def _pull(self) -> int:
        if not tracemalloc.is_tracing():
            tracemalloc.start()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            return super()._pull()
        finally:
            self.peak = max(self.peak, tracemalloc.get_traced_memory()[1] - before)


def test_the_worker_refuses_a_hostile_pull_repulls_then_gives_up(caplog):
    shapes = model_shapes()
    hostile = Hostile(tiny_spec().to_json(), hostile_header(shapes, "huge shape"))
    with serve(hostile) as target:
        worker = MeasuredPulls(_options(target, patience_s=1.5, rpc_timeout_s=2.0), TOKEN)
        try:
            with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
                code = worker.run()
        finally:
            tracemalloc.stop()
    assert code == 1
    assert 0 < worker.peak < PEAK_BOUND, f"{worker.peak / 2**20:.0f} MiB allocated for refused pulls"
    assert hostile.pulls >= 2, "a refused pull is retried"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "gives up" in errors[0] and f"expected {shapes[next(iter(shapes))]}" in errors[0], errors


class BlockedBeats(Hostile):
    """Hostile pulls, a lease of 0.3 s and heartbeats that hang until `release` is set (at most 30 s)."""

    def __init__(self, spec_json: str, header: pb.TensorHeader) -> None:
        super().__init__(spec_json, header)
        self.release = threading.Event()
        self.beats = 0

    def Join(self, request, context):
        response = super().Join(request, context)
        response.lease_seconds = 0.3
        return response

    def Heartbeat(self, request, context):
        with self.lock:
            self.beats += 1
        self.release.wait(30)
        return pb.HeartbeatResponse(version=0, lease_seconds=0.3)


def test_the_heartbeat_thread_has_ended_when_the_worker_returns():
    # A beat still in flight on a daemon thread when the process exits aborted a worker after a clean leave
    # (SIGABRT, "terminate called without an active exception"): run() now returns only once the thread ended.
    hostile = BlockedBeats(tiny_spec().to_json(), hostile_header(model_shapes(), "huge shape"))
    with serve(hostile) as target:
        worker = Worker(_options(target, patience_s=1.5, rpc_timeout_s=10.0), TOKEN)
        try:
            started = time.monotonic()
            assert worker.run() == 1
            took = time.monotonic() - started
            assert hostile.beats >= 1, "a beat was in flight when the worker gave up"
            assert worker._heartbeat is not None and not worker._heartbeat.is_alive()
            assert took < 8.0, f"{took:.1f}s: the beat in flight is cancelled, not waited out to its 10 s deadline"
        finally:
            hostile.release.set()


def test_a_spec_the_worker_cannot_build_ends_it_with_its_reason(caplog):
    spec = tiny_spec().to_dict()
    spec["model"]["preset"] = "no-such-preset"
    with serve(Hostile(json.dumps(spec))) as target:
        with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
            code = Worker(_options(target, patience_s=2.0), TOKEN).run()
    assert code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot train this run" in errors[0] and "no-such-preset" in errors[0], errors


def test_deadline_exceeded_is_retried_within_the_patience():
    hostile = Hostile(tiny_spec().to_json(), stall_s=1.0, stalls=2)
    with serve(hostile) as target:
        client = CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=10.0), timeouts=Timeouts(unary_s=0.3))
        assert client.heartbeat(HOSTILE_MEMBER).lease_seconds == 10.0
        client.close()
        impatient = CoordinatorClient(target, TOKEN, retry=RetryPolicy(max_elapsed_s=0.5), timeouts=Timeouts(unary_s=0.3))
        hostile.stalls_left = 100
        started = time.monotonic()
        with pytest.raises(RetriesExhausted, match="DEADLINE_EXCEEDED") as gave_up:
            impatient.heartbeat(HOSTILE_MEMBER)
        impatient.close()
        hostile.stalls_left = 0
    assert time.monotonic() - started < 3.0 and "patience 0.5s" in str(gave_up.value)


def test_an_update_outlives_a_rejoin_while_it_is_current(start_coordinator, caplog):
    local = start_coordinator(tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 3}))
    client = local.client()

    def forget(worker: Worker) -> None:
        client.leave(worker.identity, "forgotten")

    worker = FaultBeforeFirstPush(_options(local.target, patience_s=10.0), forget)
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        code = run_until(worker, lambda w: len(w.pushes) >= 2, 60)
    assert code == 0
    (version, delivered), _ = worker.pushes[:2]
    assert delivered and worker.pushes[1][0] == version + 1, worker.pushes
    assert any("joining again to deliver the update" in r.getMessage() for r in caplog.records)
    rounds = {r.version: r for r in client.status().rounds}
    assert rounds[version].reports == 1 and rounds[version].closed_at > 0
    client.close()


class _AnswerLost(grpc.RpcError):
    """What the client sees when a push landed and its answer did not come back in time."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded (the answer was lost)"


class LandedThenEvicted(Worker):
    """The real worker whose first push lands, after which its membership is evicted (its lease ran out while it was
    cut off; `meanwhile` may close the round too) and the push's answer is lost: the client retries, meets
    NOT_FOUND, and the worker joins again. Records (base version, delivered, the residual at the end is the one
    its compression left: not the one from before the push, whose part the coordinator already has)."""

    def __init__(self, options, service, meanwhile) -> None:
        super().__init__(options, TOKEN)
        self.service, self.meanwhile = service, meanwhile
        self.pushes: list[tuple[int, bool, bool]] = []

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True):
        feedback = self.error_feedback
        compress, compressed = feedback.compress, {}

        def recording(*args, **kwargs):
            encoded = compress(*args, **kwargs)
            compressed.update(feedback.snapshot())  # what this push leaves out: the residual to keep once it lands
            return encoded

        feedback.compress = recording
        if not self.pushes:
            self._lose_the_answer()
        try:
            delivered = super()._push_deltas(version, deltas, tokens, send_bound, rejoin)
        finally:
            feedback.compress = compress
        end = feedback.snapshot()
        kept = bool(compressed) and end.keys() == compressed.keys() and all(torch.equal(end[k], compressed[k]) for k in end)
        self.pushes.append((version, delivered, kept))
        return delivered

    def _lose_the_answer(self) -> None:
        real = self.client.stub.PushUpdate

        def once(messages, **kwargs):
            self.client.stub.PushUpdate = real
            real(messages, **kwargs)  # it lands
            with self.service._lock:
                member = self.service._active[self.identity.worker_id]
                self.service._end_membership(member, pb.WORKER_STATE_EVICTED, "evict", "evicted: its lease ran out")
            self.meanwhile()
            raise _AnswerLost()

        self.client.stub.PushUpdate = types.SimpleNamespace(future=once)  # the client pushes with `.future`


@pytest.mark.parametrize("round_closes", [False, True], ids=["round-open", "round-closed"])
def test_a_push_that_landed_before_an_eviction_counts_once(start_coordinator, round_closes, caplog):
    """The push's answer is lost and the worker is evicted before its retry: it joins again naming the ended
    membership, whose versions the new one takes over, and its second push of the same update is a duplicate
    (ALREADY_EXISTS): one report of it in the round, and its residual is not put back to be sent again. Before, the
    open round counted it twice (a new id), and a closed one made the worker restore the residual it had sent."""
    local = start_coordinator(tiny_spec(run={"rounds": 0, "workers": 2}, inner={"steps": 2},
                                        sync={"round_deadline_s": 60.0, "codec": "int8", "error_feedback": True}))
    client = local.client()
    bystander = client.join("bystander", "cpu", 1)
    client.pull(bystander, bystander.run_id)
    beating = threading.Event()
    threading.Thread(target=lambda: [client.heartbeat(bystander) for _ in iter(lambda: beating.wait(1.0), True)],
                     daemon=True).start()

    def bystander_pushes() -> None:
        push(client, bystander, {n: torch.zeros(s) for n, s in local.service.shapes.items()}, tokens=10)

    worker = LandedThenEvicted(_options(local.target, patience_s=10.0), local.service,
                               bystander_pushes if round_closes else lambda: None)
    try:
        with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
            code = run_until(worker, lambda w: len(w.pushes) >= 1, 60)
        assert code == 0
        version, delivered, kept = worker.pushes[0]
        assert (version, delivered, kept) == (0, True, True), worker.pushes
        assert any("joining again to deliver the update" in r.getMessage() for r in caplog.records)
        if not round_closes:
            assert client.status().version == 0  # the round waits for the bystander, not for the new membership
            bystander_pushes()
        wait_for(lambda: client.status().version >= 1, 30, "round 0's close")
        round_zero = next(r for r in client.status().rounds if r.version == 0)
        assert round_zero.reports == 2, round_zero  # the worker's update once, the bystander's
    finally:
        beating.set()
        client.close()


class MovedToAnotherRun(Worker):
    """The real worker whose first push ends with a re-join that put it into another run, as a sweep or a coordinator
    serving a new run on the same address does: that run's error feedback (here holding a residual it loaded) replaces
    the old one, and the push reports the update dropped."""

    def __init__(self, options) -> None:
        super().__init__(options, TOKEN)
        self.loaded: dict[str, torch.Tensor] = {}
        self.results: list[tuple[bool, dict[str, torch.Tensor]]] = []

    def _deliver(self, version, tokens, header, chunks, rejoin=True):
        if not self.results:
            # The other run's residual as it loaded it (the same model here, so that training goes on).
            self.loaded = {name: torch.full(tuple(t.shape), 1e-4) for name, t in self.model.named_parameters()}
            moved = codecs.ErrorFeedback(self.error_feedback.decay)
            moved.restore(self.loaded)
            self.error_feedback = moved
            return False
        return super()._deliver(version, tokens, header, chunks, rejoin)

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True):
        delivered = super()._push_deltas(version, deltas, tokens, send_bound, rejoin)
        self.results.append((delivered, self.error_feedback.snapshot()))
        return delivered


def test_a_dropped_update_restores_its_residual_into_its_own_run_only(start_coordinator):
    """The residual put back after a dropped push is the old run's: it goes into the error feedback it came from, not
    into the one of the run the worker moved to (a leak of one run's updates into another, or, with other shapes, a
    ValueError at its next push that ended the worker with a traceback)."""
    local = start_coordinator(tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 2},
                                        sync={"codec": "int8", "error_feedback": True}))
    worker = MovedToAnotherRun(_options(local.target, patience_s=10.0))
    assert run_until(worker, lambda w: len(w.results) >= 1, 60) == 0
    delivered, residuals = worker.results[0]
    assert delivered is False and residuals.keys() == worker.loaded.keys()
    assert all(torch.equal(residuals[name], worker.loaded[name]) for name in residuals)


class StoppedBeforeFirstPush(Worker):
    """The real worker, whose run the coordinator stops (`stop()`) before its first push; records each push's
    (base version, delivered)."""

    def __init__(self, options, stop_run) -> None:
        super().__init__(options, TOKEN)
        self.stop_run = stop_run
        self.pushes: list[tuple[int, bool]] = []

    def _push_deltas(self, version, deltas, tokens, send_bound, rejoin=True) -> bool:
        if not self.pushes:
            self.stop_run()
        delivered = super()._push_deltas(version, deltas, tokens, send_bound, rejoin)
        self.pushes.append((version, delivered))
        return delivered


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap"])
def test_a_worker_refused_stale_at_the_version_still_served_does_not_train_it_again(start_coordinator, overlap):
    """Refused "stale update: the run was stopped at version v", the worker pulled v again at once, trained and pushed
    in a loop (2,016 refused pushes in 40 s) until a heartbeat, a lease third later, said the run was over. It now
    waits past v: a stopped run answers that it finished, and the worker ends after one push."""
    local = start_coordinator(tiny_spec(run={"rounds": 0, "workers": 1}, inner={"steps": 2},
                                        sync={"overlap": overlap}, coordinator={"lease_s": 60.0}))
    worker = StoppedBeforeFirstPush(_options(local.target, patience_s=10.0),
                                    lambda: local.service.stop("the test stops the run", kind="stop"))
    started = time.monotonic()
    code = run_until(worker, lambda w: len(w.pushes) >= 3, 15)
    assert code == 0 and worker.finished, worker.exit_reason
    assert worker.pushes == [(0, False)], worker.pushes
    assert time.monotonic() - started < 15
