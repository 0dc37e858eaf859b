"""Security and bad input on a real gRPC server on loopback: tokens, deadlines, bad updates, TLS."""

from __future__ import annotations

import math

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.sync import codec, tensor_stream
from rcswarm.worker.client import CoordinatorClient, RetriesExhausted, RetryPolicy
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.wire import push, small_deltas


def status_code(excinfo: pytest.ExceptionInfo) -> grpc.StatusCode:
    return excinfo.value.code()


def _swarm(start_coordinator, codec_name):
    """A coordinator of a run in `codec_name` and two joined workers that pulled version 0."""
    local = start_coordinator(tiny_spec(sync={"max_update_norm": 100.0, "codec": codec_name}))
    client = local.client()
    members = []
    for name in ("a", "b"):
        joined = client.join(name, "cpu", 1)
        client.pull(joined, joined.run_id)
        members.append(joined)
    return local, client, members


@pytest.fixture
def swarm(start_coordinator):
    """An fp32 run (updates carry any float, NaN included) and two workers that pulled version 0."""
    local, client, members = _swarm(start_coordinator, "fp32")
    yield local, client, members
    client.close()


@pytest.fixture
def int8_swarm(start_coordinator):
    """An int8 run (the default codec) and two workers that pulled version 0."""
    local, client, members = _swarm(start_coordinator, "int8")
    yield local, client, members
    client.close()


def test_missing_or_wrong_token_is_unauthenticated(swarm):
    local, _, _ = swarm
    channel = grpc.insecure_channel(local.target)
    stub = pb_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as missing:
        stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert status_code(missing) == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        stub.GetStatus(pb.GetStatusRequest(), timeout=5, metadata=(("authorization", "Bearer nope"),))
    assert status_code(wrong) == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as prefix:
        stub.Join(pb.JoinRequest(), timeout=5, metadata=(("authorization", f"Bearer {TOKEN[:-1]}"),))
    assert status_code(prefix) == grpc.StatusCode.UNAUTHENTICATED
    channel.close()


def test_a_call_without_deadline_is_refused(swarm):
    local, _, _ = swarm
    channel = grpc.insecure_channel(local.target)
    stub = pb_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.GetStatus(pb.GetStatusRequest(), metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert status_code(excinfo) == grpc.StatusCode.INVALID_ARGUMENT
    assert "deadline" in excinfo.value.details()
    channel.close()


def test_health_service_answers_without_token(swarm):
    local, _, _ = swarm
    channel = grpc.insecure_channel(local.target)
    response = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="rcswarm.v1.Coordinator"), timeout=5
    )
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()


def _nan(local):
    deltas = small_deltas(local)
    name = list(deltas)[1]
    deltas[name].view(-1)[3] = math.nan
    return deltas, name, "non-finite"


def _inf(local):
    deltas = small_deltas(local)
    name = list(deltas)[0]
    deltas[name].view(-1)[0] = math.inf
    return deltas, name, "non-finite"


def _oversized(local):
    return small_deltas(local, value=10.0), None, "exceeds sync.max_update_norm"


def _misshaped(local):
    deltas = small_deltas(local)
    name = list(deltas)[2]
    deltas[name] = torch.zeros(deltas[name].numel() + 1)
    return deltas, name, "shape"


def _missing(local):
    deltas = small_deltas(local)
    name = list(deltas)[-1]
    del deltas[name]
    return deltas, name, name


def _extra(local):
    deltas = small_deltas(local)
    deltas["intruder.weight"] = torch.zeros(3)
    return deltas, "intruder.weight", "intruder.weight"


@pytest.mark.parametrize("make", [_nan, _inf, _oversized, _misshaped, _missing, _extra])
def test_bad_updates_are_rejected_and_change_nothing(swarm, make):
    local, client, (a, b) = swarm
    before = client.status()
    deltas, name, fragment = make(local)
    with pytest.raises(grpc.RpcError) as excinfo:
        push(client, a, deltas)
    assert status_code(excinfo) == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in excinfo.value.details()
    if name is not None:
        assert name in excinfo.value.details()
    after = client.status()
    assert after.param_sha256 == before.param_sha256 and after.version == 0
    assert after.rounds[-1].reports == 0
    # The round goes on: the same worker's valid update is still accepted, and both close it.
    assert push(client, a, small_deltas(local)).accepted
    push(client, b, small_deltas(local))
    assert client.status().version == 1


def test_corrupted_chunk_fails_its_checksum(swarm):
    local, client, (a, _) = swarm

    def flip(header, chunks):
        data = bytearray(chunks[0].data)
        data[10] ^= 0xFF
        chunks[0].data = bytes(data)

    with pytest.raises(grpc.RpcError) as excinfo:
        push(client, a, small_deltas(local), corrupt=flip)
    assert status_code(excinfo) == grpc.StatusCode.INVALID_ARGUMENT
    assert "CRC" in excinfo.value.details() or "crc" in excinfo.value.details()


def test_stale_future_duplicate_and_tokenless_updates(swarm):
    local, client, (a, b) = swarm
    with pytest.raises(grpc.RpcError) as future:
        push(client, a, small_deltas(local), version=5)
    # FAILED_PRECONDITION: the worker pulls and re-syncs (INVALID_ARGUMENT would end it).
    assert status_code(future) == grpc.StatusCode.FAILED_PRECONDITION and "does not exist yet" in future.value.details()
    with pytest.raises(grpc.RpcError) as no_tokens:
        push(client, a, small_deltas(local), tokens=0)
    assert status_code(no_tokens) == grpc.StatusCode.INVALID_ARGUMENT and "tokens" in no_tokens.value.details()
    assert push(client, a, small_deltas(local)).accepted
    with pytest.raises(grpc.RpcError) as duplicate:
        push(client, a, small_deltas(local))
    assert status_code(duplicate) == grpc.StatusCode.ALREADY_EXISTS
    push(client, b, small_deltas(local))
    assert client.status().version == 1
    # a's push retried after its round closed (its answer was lost): it landed, so ALREADY_EXISTS, not stale.
    with pytest.raises(grpc.RpcError) as retried:
        push(client, a, small_deltas(local), version=0)
    assert status_code(retried) == grpc.StatusCode.ALREADY_EXISTS and "already delivered" in retried.value.details()
    # A worker that did not deliver to round 0 is stale there.
    late = client.join("late", "cpu", 1)
    with pytest.raises(grpc.RpcError) as stale:
        push(client, late, small_deltas(local), version=0)
    assert status_code(stale) == grpc.StatusCode.FAILED_PRECONDITION
    assert "stale" in stale.value.details() and "global version is 1" in stale.value.details()
    # Lost work is visible per worker: counted in GetStatus (the dashboard and `rcswarm status` show it), an event.
    counts = {w.worker_id: w.stale_updates for w in client.status().workers}
    assert counts == {a.worker_id: 0, b.worker_id: 0, late.worker_id: 1}
    assert [e.worker_id for e in read_state(local.state_dir, lambda store: store.events("stale"))] == [late.worker_id]


def test_an_update_from_an_older_version_than_the_last_taken_is_a_refused_replay(start_coordinator):
    """A worker whose round-0 update was applied, which then delivers to round 1, must not get the round-0 update
    in again as a late one (one worker, two updates in a round: with two honest peers it would outvote one)."""
    local = start_coordinator(tiny_spec(sync={"codec": "fp32", "max_update_norm": 100.0, "max_staleness": 2}))
    client = local.client()
    try:
        a, b = (client.join(name, "cpu", 1) for name in ("a", "b"))
        for member in (a, b):
            client.pull(member, member.run_id)
            assert push(client, member, small_deltas(local)).accepted
        assert client.status().version == 1
        client.pull(b, b.run_id)
        assert push(client, a, small_deltas(local, 2e-3), version=1).accepted
        with pytest.raises(grpc.RpcError) as replay:
            push(client, a, small_deltas(local), version=0)
        assert status_code(replay) == grpc.StatusCode.FAILED_PRECONDITION
        assert "update from version 0 after this worker's update from version 1 was taken" in replay.value.details()
        status = client.status()
        assert status.version == 1 and status.rounds[-1].reports == 1
        assert {w.worker_id: w.stale_updates for w in status.workers}[a.worker_id] == 1
        # Round 1 closes with one update of each worker: θ moved by a's 2e-3 and b's 1e-3, not by a second 1e-3.
        before = {k: v.clone() for k, v in local.service.params.items()}
        assert push(client, b, small_deltas(local), version=1).accepted
        assert client.status().version == 2
        for name, theta in local.service.params.items():
            torch.testing.assert_close(theta, before[name] - 1.5e-3, rtol=0, atol=1e-6)
    finally:
        client.close()


def test_an_accepted_round_moves_the_parameters_by_the_outer_step(swarm):
    local, client, (a, b) = swarm
    before = {k: v.clone() for k, v in local.service.params.items()}
    push(client, a, small_deltas(local, 1e-3), tokens=100)
    push(client, b, small_deltas(local, 5e-3), tokens=300)
    # Δ̄ = (100·1e-3 + 300·5e-3)/400 = 4e-3; the default outer step (plain averaging, lr 1): θ − Δ̄.
    outer = local.service.spec.outer
    assert (outer.lr, outer.momentum) == (1.0, 0.0)
    for name, theta in local.service.params.items():
        torch.testing.assert_close(theta, before[name] - 4e-3, rtol=0, atol=1e-6)
    version, pulled = client.pull(a, a.run_id)
    assert version == 1
    assert tensor_stream.params_sha256(pulled).hex() == client.status().param_sha256


def test_int8_updates_are_accepted(int8_swarm):
    local, client, (a, _) = int8_swarm
    assert push(client, a, small_deltas(local)).accepted


@pytest.mark.parametrize(("run_codec", "sent", "fragment"), [
    # fp32 into an int8 run asks for 4× the bytes the run plans per update; sparse with block 1, keep 1 for 9.25×.
    ("int8", codec.WireFormat(pb.CODEC_FP32), "header codec CODEC_FP32 (1) is not allowed; expected one of CODEC_INT8_BLOCK"),
    ("int8", codec.WireFormat(pb.CODEC_SPARSE, 1, 1, 8), "header codec CODEC_SPARSE (4) is not allowed"),
    # The run's codec with a smaller block: 5 bytes a value at block 1.
    ("int8", codec.WireFormat(pb.CODEC_INT8_BLOCK, 1), "header format is CODEC_INT8_BLOCK (3): blocks of 1; this run's is"),
    ("fp32", codec.WireFormat(pb.CODEC_INT8_BLOCK), "expected one of CODEC_FP32"),
])
def test_an_update_in_another_format_than_the_runs_is_refused(start_coordinator, run_codec, sent, fragment):
    local, client, (a, b) = _swarm(start_coordinator, run_codec)
    try:
        with pytest.raises(grpc.RpcError) as excinfo:
            push(client, a, small_deltas(local), codec_id=sent)
        assert status_code(excinfo) == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in excinfo.value.details()
        assert client.status().rounds[-1].reports == 0
        # The same worker's update in the run's format is taken.
        assert push(client, a, small_deltas(local)).accepted
    finally:
        client.close()


def test_tls(start_coordinator, tmp_path):
    from rcswarm.coordinator import TLSFiles
    from rcswarm.coordinator.tls import write_self_signed

    cert, key = write_self_signed(tmp_path)
    local = start_coordinator(tiny_spec(), tls=TLSFiles(cert, key))
    secure = CoordinatorClient(f"localhost:{local.port}", TOKEN, tls_ca=cert, retry=RetryPolicy(max_elapsed_s=5.0))
    assert secure.join("tls", "cpu", 1).worker_id
    secure.close()
    plain = CoordinatorClient(f"localhost:{local.port}", TOKEN, retry=RetryPolicy(max_elapsed_s=1.0))
    with pytest.raises(RetriesExhausted):
        plain.join("plain", "cpu", 1)
    plain.close()


def test_a_worker_holding_the_previous_version_pulls_the_compressed_step(int8_swarm):
    local, client, (a, b) = int8_swarm
    _, held = client.pull(a, a.run_id)
    full_bytes = client.bytes_received
    push(client, a, small_deltas(local, 1e-3))
    push(client, b, small_deltas(local, -2e-3))
    before = client.bytes_received
    version, rebuilt = client.pull(a, a.run_id, have=(0, held))
    delta_bytes = client.bytes_received - before
    assert version == 1
    _, full = client.pull(b, b.run_id)
    assert all(torch.equal(rebuilt[k], full[k]) for k in full)
    # int8 is the run's codec: about a quarter of the float32 parameters.
    assert delta_bytes < 0.27 * (full_bytes / 2)
    # A stale holding gets the full parameters; a corrupted one fails its SHA-256 check.
    assert client.pull(a, a.run_id, have=(7, held))[0] == 1
    corrupted = {k: v.clone() for k, v in held.items()}
    next(iter(corrupted.values())).view(-1)[0] += 1.0
    with pytest.raises(tensor_stream.PayloadError, match="SHA-256"):
        client.pull(a, a.run_id, have=(0, corrupted))
