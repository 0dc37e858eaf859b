"""The round close at scale, part 2 (issue 13): pushes held encoded until the close and decoded once per
pass, the checkpoint written from the tensors' memory with the parameters' digest in the same pass.

The coordinator test runs a real coordinator on loopback with raw stubs (tests/helpers/wire.py `Wire`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rcswarm.coordinator import SwarmCoordinator, aggregation
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.checkpoints import RECYCLED_CHECKPOINT, write_checkpoint
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer, tensor_stream
from tests.helpers.close import SHAPES, assert_bit_identical, encoded_payload, random_tensors, serving_tiny_int8
from tests.helpers.specs import tiny_spec
from tests.helpers.wire import Wire


def received(header: pb.TensorHeader, chunks: list[pb.TensorChunk]) -> tuple[dict[str, torch.Tensor], bytearray]:
    """What the coordinator's receiver makes of a payload: the decoded tensors and the bytes."""
    receiver = tensor_stream.PayloadReceiver(header, expected=None)
    for chunk in chunks:
        receiver.add(chunk)
    return receiver.finish_encoded()


def round_updates(codec: int, n: int = 5, flipped: bool = True) -> tuple[list[aggregation.Update], list[aggregation.Update]]:
    """n updates of one round as dicts of decoded tensors and as the coordinator holds them (EncodedDeltas),
    the last one sign-flipped and inflated so that the direction check and the clipping act."""
    generator = torch.Generator().manual_seed(11)
    common = random_tensors(generator, 1e-2)
    plain, held = [], []
    for i in range(n):
        deltas = {name: common[name] + random_tensors(generator, 5e-3)[name] for name in SHAPES}
        if flipped and i == n - 1:
            deltas = {name: -3.0 * t for name, t in deltas.items()}
        decoded, payload = received(*encoded_payload(deltas, codec, 64))
        norm = tensor_stream.global_norm(decoded)
        plain.append(aggregation.Update(f"w{i}", 100 + 10 * i, norm, decoded))
        held.append(aggregation.Update(f"w{i}", 100 + 10 * i, norm, aggregation.EncodedDeltas(
            encoded_payload(deltas, codec, 64)[0], payload)))
    return plain, held


@pytest.mark.parametrize("method", ["mean", "clipped_mean", "trimmed_mean", "centered_clip"])
@pytest.mark.parametrize("codec", [pb.CODEC_INT8_BLOCK, pb.CODEC_FP32])
def test_updates_held_encoded_aggregate_bit_identically_to_decoded_ones(method: str, codec: int) -> None:
    plain, held = round_updates(codec)
    options = aggregation.AggregationOptions.from_sync(tiny_spec(sync={"aggregation": method}).sync)
    previous = {name: torch.full(shape, 1e-3) for name, shape in SHAPES.items()}
    want = aggregation.aggregate(plain, options, [0.5], previous)
    got = aggregation.aggregate(held, options, [0.5], previous)
    assert_bit_identical(got.average, want.average)
    assert got.outcomes == want.outcomes and got.summary == want.summary
    assert any(o.action == "dropped" for o in got.outcomes)


def test_the_mean_decodes_each_held_tensor_once_and_holds_one_per_update(monkeypatch: Any) -> None:
    _, held = round_updates(pb.CODEC_INT8_BLOCK, n=2, flipped=False)
    calls: list[tuple[int, ...]] = []
    real = codecs.decode

    def counting(data: Any, codec: Any, shape: tuple[int, ...], block: int = codecs.DEFAULT_BLOCK_SIZE) -> torch.Tensor:
        calls.append(tuple(shape))
        return real(data, codec, shape, block)

    monkeypatch.setattr(codecs, "decode", counting)
    options = aggregation.AggregationOptions.from_sync(tiny_spec(sync={"aggregation": "clipped_mean"}).sync)
    aggregation.aggregate(held, options)
    assert sorted(calls) == sorted([tuple(shape) for shape in SHAPES.values()] * 2)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SwarmCoordinator, Wire]]:
    """The tiny int8 coordinator of test_close_speed, durable."""
    with serving_tiny_int8(tmp_path, durable=True) as served:
        yield served


def push(wire: Wire, worker_id: str, pulled: pb.TensorHeader, seed: int, block: int
         ) -> tuple[pb.TensorHeader, list[pb.TensorChunk]]:
    """Push a random int8 update from the version of `pulled`; the payload pushed."""
    generator = torch.Generator().manual_seed(seed)
    deltas = {t.name: 1e-3 * torch.randn(tuple(t.shape), generator=generator) for t in pulled.tensors}
    header, chunks = encoded_payload(deltas, pb.CODEC_INT8_BLOCK, block, pulled.run_id, pulled.version)
    meta = pb.UpdateMeta(**wire.creds(worker_id), base_version=pulled.version, tokens=100)
    messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header),
                *(pb.PushUpdateRequest(chunk=c) for c in chunks)]
    wire.call("PushUpdate", iter(messages), timeout=30.0)
    return header, chunks


def test_a_push_is_held_at_its_encoded_size_and_the_close_commits_its_digest(served: Any) -> None:
    coordinator, wire = served
    first, second = wire.join("first"), wire.join("second")
    pulled = wire.pull(first)
    wire.pull(second)
    block = coordinator.spec.sync.block_size
    header, chunks = push(wire, first, pulled, 1, block)
    held = coordinator.round.reports[first].deltas
    parameters = sum(t.numel() for t in coordinator.params.values())
    assert isinstance(held, aggregation.EncodedDeltas)
    assert held.nbytes == header.total_bytes < 4 * parameters * 0.3
    assert_bit_identical(dict(held), received(header, chunks)[0])
    push(wire, second, pulled, 2, block)
    assert coordinator.version == 1
    store = coordinator.store
    digest = tensor_stream.params_sha256(coordinator.params)
    assert coordinator.param_sha256 == digest == store.committed_digest(1)
    assert store.recent_rounds(1)[0].param_sha256 == digest.hex()
    assert {"write + digest", "fsync", "sqlite"} == set(store.last_commit_seconds)
    assert "digest" not in coordinator.last_close_seconds
    checkpoint = store.load_current()
    assert checkpoint is not None and checkpoint.version == 1 and checkpoint.param_sha256 == digest
    assert_bit_identical(checkpoint.params, coordinator.params)
    with pytest.raises(ValueError, match="version 7 was never committed"):
        store.committed_digest(7)


def test_the_streamed_checkpoint_holds_what_save_file_holds_and_digests_in_the_same_pass(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(12)
    params = random_tensors(generator)
    state = {"outer_momentum": {name: t.t() if t.dim() == 2 else t for name, t in random_tensors(generator).items()},
             "counts": {"steps": torch.arange(5), "half": torch.randn(3, generator=generator).bfloat16()}}
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    digests = write_checkpoint(ours, params, state, {"run_id": "r", "version": "3"}, digest=True)
    assert digests.params == tensor_stream.params_sha256(params)
    flat = {**params, **{f"{g}/{k}": v.contiguous() for g, named in state.items() for k, v in named.items()}}
    save_file(flat, str(theirs), metadata={"run_id": "r", "version": "3"})
    loaded = []
    for path in (ours, theirs):
        with safe_open(str(path), framework="pt") as handle:
            loaded.append((handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}))
    assert loaded[0][0] == loaded[1][0] and sorted(loaded[0][1]) == sorted(loaded[1][1])
    for key, tensor in loaded[1][1].items():
        assert tensor.dtype == loaded[0][1][key].dtype and torch.equal(tensor, loaded[0][1][key]), key
    assert write_checkpoint(tmp_path / "plain", params, {}, {}, digest=False).params is None
    with pytest.raises(ValueError, match="dtype torch.complex64"):
        write_checkpoint(tmp_path / "bad", {"c": torch.zeros(2, dtype=torch.complex64)}, {}, {}, digest=False)


def test_a_commit_without_a_digest_records_the_one_it_computed(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", durable=False)
    params = {"w": torch.tensor([1.0, -2.0]), "b": torch.zeros(3)}
    store.commit_version("run", 1, params, {"outer_momentum": {"w": torch.ones(2)}},
                         RoundRecord(0, 1.0, 2.0, 2, 96, "all reported", 0.1, ""))
    want = tensor_stream.params_sha256(params)
    assert store.committed_digest(1) == want
    assert store.recent_rounds(1)[0].param_sha256 == want.hex()
    store.commit_version("run", 2, params, {}, RoundRecord(1, 2.0, 3.0, 2, 96, "all reported", 0.1, "ab" * 32))
    assert store.committed_digest(2) == bytes.fromhex("ab" * 32) and "write" in store.last_commit_seconds
    store.close()


def test_a_pruned_checkpoint_file_is_overwritten_by_the_next_commit(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", keep_checkpoints=1, durable=False)
    store.set_many({"param_names": json.dumps(["w", "b"])})
    params = {"w": torch.arange(6, dtype=torch.float32), "b": torch.zeros(3)}
    for version in (1, 2, 3):
        store.commit_version("run", version, {k: v + version for k, v in params.items()}, {}, None)
    recycled = store.checkpoint_dir / RECYCLED_CHECKPOINT
    names = sorted(p.name for p in store.checkpoint_dir.iterdir())
    assert names == [RECYCLED_CHECKPOINT, "v00000002.safetensors", "v00000003.safetensors"]
    inode = recycled.stat().st_ino
    bigger = {"w": torch.arange(6, dtype=torch.float32) + 4, "b": torch.zeros(3) + 4}
    store.commit_version("run", 4, bigger, {"outer_momentum": {"w": torch.ones(6)}}, None)
    assert (store.checkpoint_dir / "v00000004.safetensors").stat().st_ino == inode
    small = {"w": torch.arange(6, dtype=torch.float32) + 5, "b": torch.zeros(3) + 5}
    for version in (5, 6, 7):  # the 7th goes over version 4's larger file: cut to size
        store.commit_version("run", version, small, {}, None)
    checkpoint = store.load_current()
    assert checkpoint is not None and checkpoint.version == 7 and not checkpoint.state
    assert_bit_identical(checkpoint.params, small)
    newest = store.checkpoint_dir / "v00000007.safetensors"
    fresh = tmp_path / "fresh.safetensors"
    write_checkpoint(fresh, small, {}, {"run_id": "run", "version": "7"}, digest=False)
    assert newest.stat().st_ino == inode and newest.read_bytes() == fresh.read_bytes()
    store.close()


@pytest.mark.parametrize("codec", [pb.CODEC_INT8_BLOCK, pb.CODEC_FP32])
def test_a_consumed_target_gives_the_same_step_and_becomes_the_residual(codec: int) -> None:
    generator = torch.Generator().manual_seed(13)
    params = random_tensors(generator)
    kept, consumed = codecs.ErrorFeedback(), codecs.ErrorFeedback()
    for _ in range(2):
        target = {name: t - 1e-2 * torch.randn(t.shape, generator=generator) for name, t in params.items()}
        spare = {name: t.clone() for name, t in target.items()}
        want, want_bytes = outer.compressed_step(params, target, codec, 64, kept)
        assert_bit_identical(target, spare)
        got, got_bytes = outer.compressed_step(params, spare, codec, 64, consumed, consume_target=True)
        assert got_bytes == want_bytes
        assert_bit_identical(got, want)
        for name in SHAPES:
            assert torch.equal(consumed.residual(name), kept.residual(name))
            if codec == pb.CODEC_INT8_BLOCK:
                assert consumed._residuals[name].data_ptr() == spare[name].data_ptr()
        params = got
