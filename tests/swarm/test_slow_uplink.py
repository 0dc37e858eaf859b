"""A worker's update crosses a slow uplink: the coordinator cancels a stream that brings no whole message for
`stream_idle_s`, so the chunk a worker uploads in (tensor_stream.UPLOAD_CHUNK_SIZE) must cross its link within that.
With 1 MiB chunks, before, an uplink below 0.84 Mbit/s (at the default 10 s) never delivered an update: every
attempt was cancelled at its first chunk, and its bytes kept the heartbeats waiting until the lease ran out.
Here the same ratio, scaled down: a real coordinator with `stream_idle_s` 1 s (its floor) behind a 512 KiB/s
loopback link."""

from __future__ import annotations

import grpc

from rcswarm.coordinator import CallLimits
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.protos.v1 import coordinator_pb2_grpc as pb_grpc
from rcswarm.protos.wire import MESSAGE_SIZE_OPTIONS, WORKER_ID_METADATA, WORKER_SECRET_METADATA
from rcswarm.sync import tensor_stream
from tests.helpers.coordinator import deltas_of
from tests.helpers.slow_link import link_proxy_module
from tests.helpers.specs import TOKEN, tiny_spec

IDLE_S = 1.0
LINK_BYTES_PER_S = 1 << 19  # a 1 MiB chunk takes 2 s (twice IDLE_S), an upload chunk 0.5 s (half of it)


def push_through(target: str, member: pb.JoinResponse, deltas, chunk_size: int) -> pb.PushUpdateResponse:
    """One PushUpdate attempt of `deltas` cut into chunks of `chunk_size` (no retry)."""
    header, chunks = tensor_stream.build_payload(deltas, codec=pb.CODEC_FP32, run_id=member.run_id, version=0,
                                                 chunk_size=chunk_size)
    meta = pb.UpdateMeta(worker_id=member.worker_id, worker_secret=member.worker_secret, base_version=0, tokens=128,
                         inner_steps=1)
    messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header),
                *(pb.PushUpdateRequest(chunk=chunk) for chunk in chunks)]
    metadata = (("authorization", f"Bearer {TOKEN}"), (WORKER_ID_METADATA, member.worker_id),
                (WORKER_SECRET_METADATA, member.worker_secret))
    with grpc.insecure_channel(target, options=MESSAGE_SIZE_OPTIONS) as channel:
        return pb_grpc.CoordinatorStub(channel).PushUpdate(iter(messages), timeout=60, metadata=metadata)


def test_an_update_in_upload_chunks_crosses_a_link_too_slow_for_one_mib_chunks(start_coordinator) -> None:
    # The pushes send no heartbeat: a lease outlasting both attempts at this link's rate.
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "small"}, sync={"codec": "fp32"}, coordinator={"lease_s": 120.0})
    local = start_coordinator(spec, limits=CallLimits(stream_idle_s=IDLE_S))
    lp = link_proxy_module()
    proxy = lp.LinkProxy(local.port, lp.Link(bandwidth_bps=8 * LINK_BYTES_PER_S))
    target = f"127.0.0.1:{proxy.start()}"
    try:
        with grpc.insecure_channel(local.target, options=MESSAGE_SIZE_OPTIONS) as channel:
            member = pb_grpc.CoordinatorStub(channel).Join(
                pb.JoinRequest(worker_name="slow", device="cpu", pid=1), timeout=10,
                metadata=(("authorization", f"Bearer {TOKEN}"),))
        deltas = deltas_of(local.service, 1e-4)
        assert sum(t.numel() for t in deltas.values()) * 4 > 4 * tensor_stream.MAX_CHUNK_SIZE  # several full chunks
        try:
            push_through(target, member, deltas, tensor_stream.MAX_CHUNK_SIZE)
            raise AssertionError("a 1 MiB chunk took 2 × stream_idle_s and was not cancelled")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "stream_idle_s" in err.details(), err
        response = push_through(target, member, deltas, tensor_stream.UPLOAD_CHUNK_SIZE)
        assert response.accepted, response
    finally:
        proxy.close()
