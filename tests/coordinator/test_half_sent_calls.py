"""Half-sent calls and message floods on a real coordinator over loopback: unary calls whose request message never
comes (headers only) must not hold the server's threads, on the main port or the plaintext health port, and a push
cut into tiny chunks is refused on its header (guards.FirstMessages, sync/tensor_stream.py's chunk floor)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rcswarm.coordinator import CallLimits
from rcswarm.coordinator.guards import SERVICE_NAME
from rcswarm.coordinator.server import HEALTH_THREADS
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS, WORKER_ID_METADATA, WORKER_SECRET_METADATA
from rcswarm.sync import tensor_stream
from tests.helpers.benchmarks import load_benchmark
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.waiting import wait_for
from tests.helpers.wire import push, run_format, small_deltas

AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVING = health_pb2.HealthCheckResponse.SERVING


# The benchmark's half-sent calls (benchmarks/rpc_latency_bench.py), each held back at most this long.
HalfSent = load_benchmark("rpc_latency_bench.py").HalfSent
HOLD_S = 20.0


@pytest.fixture
def half_sent() -> Iterator[type[HalfSent]]:
    """`HalfSent` factory; every instance is closed at teardown."""
    made: list[HalfSent] = []

    def make(target: str) -> HalfSent:
        made.append(HalfSent(target, HOLD_S))
        return made[-1]

    yield make  # type: ignore[misc]
    for flood in made:
        flood.close()


def timed(call) -> float:
    """Seconds `call()` took (it raises if refused)."""
    started = time.monotonic()
    call()
    return time.monotonic() - started


def health(channel: grpc.Channel, timeout: float = 2.0) -> int:
    """The Coordinator service's status from one Check."""
    request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout).status


def test_half_sent_calls_without_a_token_leave_every_thread_limit_for_honest_calls(start_coordinator, half_sent):
    """More header-only calls than the pool has threads, with no token: GetStatus without a deadline (refused at
    once) and Heartbeat with one (waits under the first-message limit, then cancelled); meanwhile status, join, a
    member's heartbeat and health Check answer at once, and every half-sent call ends within first_message_s."""
    local = start_coordinator(tiny_spec(coordinator={"lease_s": 30.0}))
    limits = local.running.limits
    channel = grpc.insecure_channel(local.target, options=MESSAGE_SIZE_OPTIONS)
    try:
        stub = pb_grpc.CoordinatorStub(channel)
        member = stub.Join(pb.JoinRequest(worker_name="honest", device="cpu", pid=1), timeout=5, metadata=AUTH)
        flood = half_sent(local.target)
        count = limits.threads + 50
        flood.open(f"/{SERVICE_NAME}/GetStatus", count // 2)
        flood.open(f"/{SERVICE_NAME}/Heartbeat", count - count // 2, timeout=60.0)
        time.sleep(1.0)
        beat = pb.HeartbeatRequest(worker_id=member.worker_id, worker_secret=member.worker_secret)
        took = {
            "GetStatus": timed(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=3, metadata=AUTH)),
            "Join": timed(lambda: stub.Join(pb.JoinRequest(worker_name="late", device="cpu", pid=2), timeout=3,
                                            metadata=AUTH)),
            "Heartbeat": timed(lambda: stub.Heartbeat(beat, timeout=3, metadata=AUTH)),
            "health": timed(lambda: health(channel, timeout=3)),
        }
        assert max(took.values()) < 2.0, took
        assert local.running.gate.first_messages.waiting() <= limits.first_message_calls
        codes = flood.codes(within_s=limits.first_message_s + 3.0)
        # No token: refused before anything is read; the worker method waits for its message at most wait_s.
        assert codes[grpc.StatusCode.UNAUTHENTICATED] == count // 2, codes
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              grpc.StatusCode.DEADLINE_EXCEEDED}, codes
        # The handler threads end just after their clients saw the cancel.
        wait_for(lambda: local.running.gate.first_messages.waiting() == 0, 3.0, "the waiting calls' threads to end")
        assert stub.Heartbeat(beat, timeout=3, metadata=AUTH).version == 0
    finally:
        channel.close()


def test_half_sent_health_checks_leave_the_health_port_serving_probes(start_coordinator, half_sent):
    """More header-only Checks on the plaintext health port than it has threads: a probe still gets SERVING."""
    local = start_coordinator(tiny_spec(), health_port=0)
    target = f"127.0.0.1:{local.running.health_port}"
    flood = half_sent(target)
    flood.open("/grpc.health.v1.Health/Check", HEALTH_THREADS + 8)
    time.sleep(0.5)
    probe = grpc.insecure_channel(target)
    try:
        for _ in range(3):
            assert health(probe, timeout=2.0) == SERVING
            time.sleep(0.2)
    finally:
        probe.close()


def test_a_push_cut_into_one_byte_chunks_is_refused_on_its_header(start_coordinator):
    """A member's valid update in 1-byte chunks (the tiny model's ~100 KB: as many messages) is INVALID_ARGUMENT
    naming the chunk size at once, instead of being read message by message; an honest push then lands."""
    local = start_coordinator(tiny_spec(coordinator={"lease_s": 30.0}))
    client = local.client()
    channel = grpc.insecure_channel(local.target, options=MESSAGE_SIZE_OPTIONS)
    try:
        member = client.join("mallory", "cpu", 1)
        client.pull(member, member.run_id)
        deltas = small_deltas(local)
        honest, chunks = tensor_stream.build_payload(deltas, codec=run_format(member.run_spec_json),
                                                     run_id=member.run_id, version=0)
        blob = b"".join(chunk.data for chunk in chunks)
        header = pb.TensorHeader()
        header.CopyFrom(honest)
        header.chunk_size = 1
        del header.chunk_crc32[:]
        header.chunk_crc32.extend(zlib.crc32(blob[i:i + 1]) for i in range(len(blob)))
        assert len(blob) > 20_000

        def messages() -> Iterator[pb.PushUpdateRequest]:
            meta = pb.UpdateMeta(worker_id=member.worker_id, worker_secret=member.worker_secret, base_version=0,
                                 tokens=10, inner_steps=1)
            yield pb.PushUpdateRequest(meta=meta)
            yield pb.PushUpdateRequest(header=header)
            for index in range(len(blob)):
                yield pb.PushUpdateRequest(chunk=pb.TensorChunk(index=index, data=blob[index:index + 1]))

        credentials = ((WORKER_ID_METADATA, member.worker_id), (WORKER_SECRET_METADATA, member.worker_secret))
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.CoordinatorStub(channel).PushUpdate(messages(), timeout=8.0, metadata=AUTH + credentials)
        took = time.monotonic() - started
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
        assert "chunk_size is 1:" in refused.value.details()
        assert f"at least {tensor_stream.MIN_CHUNK_SIZE}" in refused.value.details()
        assert took < 4.0
        assert push(client, member, deltas).accepted
    finally:
        channel.close()
        client.close()


def test_first_message_limits_leave_threads_for_refusals_and_health() -> None:
    limits = CallLimits()
    assert limits.first_message_calls < limits.headroom and limits.headroom - limits.first_message_calls == 16
    with pytest.raises(ValueError, match="first_message_calls = 64 of headroom = 64"):
        CallLimits(first_message_calls=64)
    with pytest.raises(ValueError, match="first_message_s = 0"):
        CallLimits(first_message_s=0)
