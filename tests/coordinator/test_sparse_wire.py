"""The sparse codec on the real wire (issue #28): a coordinator on loopback, workers speaking gRPC.

Both directions are sparse: a worker pushes its update sparse and pulls the round's step sparse (the coordinator's
error feedback on it), rebuilt bit for bit; every malformed sparse payload is refused with INVALID_ARGUMENT before
anything is recorded; a poisoned sparse update (huge values at a few indices) is refused by the norm bound, and
with that bound lifted moves θ no more than one clipped worker's share; trimmed_mean and centered_clip, with the
direction check off too, keep θ near the honest round's.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import grpc
import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec, tensor_stream
from rcswarm.worker.client import receive_pull
from tests.helpers.sparse import FORMAT, SPARSE, TARGET, honest_deltas, joined, malformed, sparse_push

# These members speak the wire without heartbeats: a lease far beyond a test's length under any load.
LONG_LEASE = {"lease_s": 300.0}
from tests.helpers.specs import tiny_spec

# The round's step at sync.downlink_density: 0 = the uplink's density (5 of each 100), 0.2 = 4 × denser (20 of 100).
DOWNLINKS = {"the downlink at density": (0.0, FORMAT), "a downlink 4x denser": (0.2, codec.WireFormat(pb.CODEC_SPARSE, 100, 20, 2))}


@pytest.mark.parametrize("downlink, step_format", DOWNLINKS.values(), ids=DOWNLINKS)
def test_both_directions_are_sparse_and_replicas_rebuild_theta_bit_for_bit(start_coordinator, downlink, step_format) -> None:
    local = start_coordinator(tiny_spec(sync={**SPARSE, "downlink_density": downlink}, coordinator=LONG_LEASE))
    assert codec.WireFormat.from_sync(local.service.spec.sync, downlink=True) == step_format
    client, (a, b), theta0 = joined(local, ["a", "b"])
    full_pull = client.bytes_received / 2
    shapes = local.service.shapes
    sent_before = client.bytes_sent
    sparse_push(client, a, honest_deltas(shapes, 0))
    push_bytes = client.bytes_sent - sent_before
    sparse_push(client, b, honest_deltas(shapes, 1))
    if step_format != FORMAT:
        # The step carries the downlink's parameters: a receiver expecting the uplink's refuses it before allocating.
        with pytest.raises(tensor_stream.PayloadError, match=r"20 of 100 per chunk.*this run.s is CODEC_SPARSE \(4\): 5 of 100"):
            client.pull(a, a.run_id, have=(0, theta0), wire_format=FORMAT)
    before = client.bytes_received
    version, rebuilt = client.pull(a, a.run_id, have=(0, theta0), wire_format=step_format)
    step_bytes = client.bytes_received - before
    assert version == 1
    # The step moves its format's bytes: the encoded tensors plus the header and framing (under 2 kB here).
    encoded = sum(codec.encoded_size(t.numel(), step_format) for t in theta0.values())
    assert encoded < step_bytes < encoded + 2048
    _, full = client.pull(b, b.run_id)
    assert all(torch.equal(rebuilt[k], full[k]) for k in full), "a replica differs from the coordinator's θ"
    assert tensor_stream.params_sha256(rebuilt).hex() == client.status().param_sha256
    parameters = sum(t.numel() for t in theta0.values())
    # Up and down: far below fp32 (the tiny model's 15 small tensors each carry 8 bytes of scales per chunk and
    # the header names every tensor, so the ratio is smaller than a large model's).
    assert push_bytes < 4 * parameters / 10 and step_bytes < 4 * parameters / 10
    assert full_pull > 4 * parameters
    status = client.status()
    assert status.fp32_bytes == 4 * parameters
    by_id = {w.worker_id: w for w in status.workers}
    assert by_id[a.worker_id].round_bytes_up == push_bytes and by_id[a.worker_id].round_bytes_down == step_bytes
    assert 0 < status.bytes_up_per_round < 4 * parameters / 10
    assert status.bytes_down_per_round == step_bytes  # the one step pulled (the joins' pulls are full ones)
    client.close()


@pytest.mark.parametrize("name, corrupt, fragment", malformed(DOWNLINKS["a downlink 4x denser"][1], 8192),
                         ids=[m[0] for m in malformed(DOWNLINKS["a downlink 4x denser"][1], 8192)])
def test_a_malformed_step_at_the_downlink_density_is_refused_by_the_workers_receive(name, corrupt, fragment) -> None:
    """The worker's receive of a step in the downlink's format (tensor bytes corrupted, the chunks' CRCs recomputed)
    refuses it: the decode's checks hold at that format as at the uplink's (the pull test above has the good step)."""
    step_format = DOWNLINKS["a downlink 4x denser"][1]
    step = {TARGET: 1e-3 * torch.randn(8192, generator=torch.Generator().manual_seed(5))}
    header, chunks = tensor_stream.build_payload(step, codec=step_format, run_id="run", version=1)
    header.delta_from_version = 0  # a step, as the coordinator serves one
    _payload_corruption(corrupt)(header, chunks)
    responses = iter([pb.PullParametersResponse(header=header), *(pb.PullParametersResponse(chunk=c) for c in chunks)])
    with pytest.raises(tensor_stream.PayloadError, match=fragment):
        receive_pull(responses, "run", {TARGET: (8192,)}, step_format)


def _payload_corruption(corrupt_bytes):
    """Corrupt TARGET's bytes inside the payload and recompute the chunks' CRCs (the codec's check must catch it)."""
    def corrupt(header: pb.TensorHeader, chunks: list[pb.TensorChunk]) -> None:
        blob = b"".join(c.data for c in chunks)
        offset = 0
        for info in header.tensors:
            if info.name == TARGET:
                part = corrupt_bytes(blob[offset:offset + info.num_bytes])
                assert len(part) == info.num_bytes
                blob = blob[:offset] + part + blob[offset + info.num_bytes:]
                break
            offset += info.num_bytes
        size = header.chunk_size
        for index, chunk in enumerate(chunks):
            chunk.data = blob[index * size:(index + 1) * size]
        del header.chunk_crc32[:]
        header.chunk_crc32.extend(zlib.crc32(c.data) for c in chunks)
    return corrupt


def _header_field(field: str, value: int):
    def corrupt(header: pb.TensorHeader, chunks: list[pb.TensorChunk]) -> None:
        setattr(header, field, value)
    return corrupt


def _num_bytes(header: pb.TensorHeader, chunks: list[pb.TensorChunk]) -> None:
    header.tensors[0].num_bytes += 1


BAD = [
    *[(name, _payload_corruption(corrupt), fragment) for name, corrupt, fragment in malformed(FORMAT, 8192)],
    ("another density (sparse_keep)", _header_field("sparse_keep", 6), "this run's is CODEC_SPARSE"),
    ("other value bits", _header_field("value_bits", 4), "this run's is CODEC_SPARSE"),
    ("no entries kept", _header_field("sparse_keep", 0), "keeps 1..block_size"),
    ("a tensor's byte count", _num_bytes, "num_bytes"),
]


@pytest.mark.parametrize("name, corrupt, fragment", BAD, ids=[b[0] for b in BAD])
def test_every_malformed_sparse_payload_is_refused_on_the_wire_and_nothing_is_applied(
    start_coordinator, name, corrupt, fragment,
) -> None:
    local = start_coordinator(tiny_spec(sync=SPARSE, coordinator=LONG_LEASE))
    client, (a, b), _ = joined(local, ["a", "b"])
    before = client.status()
    deltas = honest_deltas(local.service.shapes, 0)
    with pytest.raises(grpc.RpcError) as refused:
        sparse_push(client, a, deltas, corrupt=corrupt)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in refused.value.details()
    after = client.status()
    assert (after.version, after.param_sha256, after.rounds[-1].reports) == (0, before.param_sha256, 0)
    # The round goes on: the same worker's valid update is taken, and both close it.
    assert sparse_push(client, a, deltas).accepted
    sparse_push(client, b, honest_deltas(local.service.shapes, 1))
    assert client.status().version == 1
    client.close()


def attack_deltas(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A poisoned sparse update: zero but for one chunk of TARGET whose kept entries are all 1e3."""
    deltas = {name: torch.zeros(shape) for name, shape in shapes.items()}
    deltas[TARGET].view(-1)[300:300 + FORMAT.keep] = 1e3
    return deltas


def one_round(start_coordinator, sync: dict[str, Any], attacker: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], Any]:
    """θ_0 and θ_1 of a round of 3 honest sparse updates (and the attacker's, pushed first), and the last status."""
    local = start_coordinator(tiny_spec(sync={**SPARSE, **sync}, coordinator=LONG_LEASE))
    names = ["honest0", "honest1", "honest2"] + (["attacker"] if attacker else [])
    client, members, theta0 = joined(local, names)
    refusal = None
    if attacker:
        try:
            sparse_push(client, members[-1], attack_deltas(local.service.shapes))
        except grpc.RpcError as exc:
            refusal = exc
            client.leave(members[-1], "refused")
    for index, member in enumerate(members[:3]):
        sparse_push(client, member, honest_deltas(local.service.shapes, index))
    _, theta1 = client.pull(members[0], members[0].run_id)
    status = client.status()
    client.close()
    return theta0, theta1, (status, refusal)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(torch.sum((a[k].double() - b[k].double()) ** 2)) for k in a))


def test_a_poisoned_sparse_update_is_refused_or_bounded(start_coordinator) -> None:
    theta0, honest, (status, _) = one_round(start_coordinator, {}, attacker=False)
    assert status.version == 1 and status.rounds[-2].dropped == 0, "the direction check dropped an honest sparse update"
    honest_step = distance(honest, theta0)
    # Default bounds: the automatic norm bound refuses it at the push (INVALID_ARGUMENT), θ_1 is the honest one.
    _, defended, (_, refusal) = one_round(start_coordinator, {}, attacker=True)
    assert refusal is not None and refusal.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "global L2 norm" in refusal.details()
    assert distance(defended, honest) == 0.0
    # The hard bound lifted: clipped_mean (or the direction check) bounds it to one worker's clipped share.
    _, clipped, (status, refusal) = one_round(start_coordinator, {"max_update_norm": 1e9}, attacker=True)
    assert refusal is None
    attacker = next(w for w in status.workers if w.name == "attacker")
    assert attacker.clipped_updates + attacker.dropped_updates == 1
    assert distance(clipped, honest) <= 3.0 * honest_step
    # Undefended (mean, no hard bound, no direction check) the same update moves θ thousands of honest steps.
    _, undefended, _ = one_round(start_coordinator, {"max_update_norm": 1e9, "aggregation": "mean", "min_cosine": -1.0},
                                 attacker=True)
    assert distance(undefended, honest) > 100 * honest_step


@pytest.mark.parametrize("aggregation", ["trimmed_mean", "centered_clip"])
def test_a_poisoned_sparse_update_is_bounded_by_the_robust_aggregators_alone(start_coordinator, aggregation) -> None:
    """The hard bound lifted and the direction check off: trimmed_mean drops the poisoned entries (each is the
    largest value of its coordinate) and centered_clip clips the update's distance to the centre to τ, so θ_1 stays
    near the honest θ_1 of the same aggregator; the plain mean moves it thousands of honest steps (test above)."""
    sync = {"max_update_norm": 1e9, "aggregation": aggregation, "min_cosine": -1.0}
    theta0, honest, (status, _) = one_round(start_coordinator, sync, attacker=False)
    assert status.version == 1
    honest_step = distance(honest, theta0)
    _, attacked, (status, refusal) = one_round(start_coordinator, sync, attacker=True)
    assert refusal is None and status.version == 1
    assert status.rounds[-2].aggregation.startswith(aggregation)
    assert distance(attacked, honest) <= 2.0 * honest_step
    largest = max(float((attacked[k] - theta0[k]).abs().max()) for k in theta0)  # the mean's: 1e3 / 4
    largest_honest = max(float((honest[k] - theta0[k]).abs().max()) for k in theta0)
    if aggregation == "trimmed_mean":
        # Each poisoned entry is its coordinate's largest value and trimmed: no coordinate moves beyond honest sizes.
        assert largest <= 2.0 * largest_honest
        return
    # centered_clip bounds the attacker's pull in L2, not per coordinate: 3 iterations at weight 1/4 and τ = R, the
    # median norm (at most the largest honest one), so on its 5 coordinates at most 3/4 of an honest update's norm.
    attacker = next(w for w in status.workers if w.name == "attacker")
    assert attacker.clipped_updates == 1
    shapes = {k: tuple(t.shape) for k, t in theta0.items()}
    decoded = [codec.ErrorFeedback().compress_decoded(honest_deltas(shapes, i), FORMAT)[1] for i in range(3)]
    honest_norm = max(math.sqrt(sum(float(torch.sum(t.double() ** 2)) for t in d.values())) for d in decoded)
    assert largest <= 0.75 * honest_norm + largest_honest


@pytest.mark.parametrize("step", [False, True], ids=["full parameters", "a step"])
def test_a_pull_in_another_codec_than_the_runs_is_refused_before_allocation(step: bool) -> None:
    """A worker took any codec a pull's header named: a hostile coordinator of an fp32 run sent θ as block-1 sparse
    (9.25 bytes a parameter, 1.1 GB of receive buffers for 16.7 M parameters where fp32 took 133 MB; review of a
    hostile coordinator, 2026-11-28). The full parameters come in fp32, a step in the run's step format."""
    step_format = DOWNLINKS["a downlink 4x denser"][1]
    # The full parameters in the run's step format (not fp32); a step in int8 at block 1 (not the step's sparse).
    other = codec.WireFormat(pb.CODEC_INT8_BLOCK, 1) if step else step_format
    params = {TARGET: 1e-3 * torch.randn(8192, generator=torch.Generator().manual_seed(6))}
    header, chunks = tensor_stream.build_payload(params, codec=other, run_id="run", version=1)
    if step:
        header.delta_from_version = 0
    responses = iter([pb.PullParametersResponse(header=header), *(pb.PullParametersResponse(chunk=c) for c in chunks)])
    with pytest.raises(tensor_stream.PayloadError, match=r"header codec CODEC_\w+ \(\d\) is not allowed"):
        receive_pull(responses, "run", {TARGET: (8192,)}, step_format)
