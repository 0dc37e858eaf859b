"""The round close at scale, part 3 (issue 13): a close writes its results into the buffers the previous close
left unread (the replaced momentum and broadcast residual) instead of fresh memory, with bit-identical results,
and the reference norms and the flag events enter the commit's own SQLite transaction.

Real coordinators on loopback with raw stubs (tests/helpers/wire.py `Wire`), real SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.coordinator import RunningCoordinator, SwarmCoordinator
from rcswarm.coordinator.close import RoundCloser
from rcswarm.coordinator.records import REFERENCE_NORMS_KEY
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import tensor_stream
from tests.helpers.close import assert_bit_identical, encoded_payload
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.state import read_state
from tests.helpers.wire import Wire

ROUNDS = 4


class FreshBuffersCloser(RoundCloser):
    """Real closes given no spare buffers: every result in fresh memory, as before."""

    def begin(self) -> Any:
        self.spare = None
        return super().begin()


class FreshBuffersCoordinator(SwarmCoordinator):
    """A real coordinator whose closes are given no spare buffers: every result in fresh memory, as before."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.closer = FreshBuffersCloser(self)


@contextmanager
def serving(coordinator: SwarmCoordinator) -> Iterator[Wire]:
    running = RunningCoordinator(coordinator, TOKEN).start()
    wire = Wire(f"127.0.0.1:{running.port}")
    try:
        yield wire
    finally:
        wire.close()
        running.stop(grace=0.5)


def spec(method: str = "clipped_mean", workers: int = 2) -> Any:
    return tiny_spec(run={"rounds": 0, "workers": workers},
                     sync={"codec": "int8", "min_reports": workers, "aggregation": method, "min_cosine": -1.0},
                     coordinator={"lease_s": 30.0, "durable": False})


def close_round(coordinator: SwarmCoordinator, wire: Wire, workers: list[str], seed: int, scales: list[float],
                full: bool = True) -> None:
    """Every worker pulls the current version (in full, or else the compressed step to it) and pushes a random
    int8 update (`scales` times the usual size: an outlier the aggregators act on); the last push closes the round."""
    version = coordinator.version
    headers = [wire.pull(worker) if full else step_pull(wire, worker, version - 1) for worker in workers]
    for index, (worker, header, scale) in enumerate(zip(workers, headers, scales)):
        generator = torch.Generator().manual_seed(seed * 100 + index)
        deltas = {t.name: scale * 1e-3 * torch.randn(tuple(t.shape), generator=generator) for t in header.tensors}
        payload, chunks = encoded_payload(deltas, pb.CODEC_INT8_BLOCK, coordinator.spec.sync.block_size,
                                          header.run_id, header.version)
        meta = pb.UpdateMeta(**wire.creds(worker), base_version=header.version, tokens=100)
        messages = [pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=payload),
                    *(pb.PushUpdateRequest(chunk=c) for c in chunks)]
        wire.call("PushUpdate", iter(messages), timeout=30.0)
    assert coordinator.version == version + 1


def step_pull(wire: Wire, worker: str, have_version: int) -> pb.TensorHeader:
    """Pull the compressed step from `have_version`; its header."""
    request = pb.PullParametersRequest(**wire.creds(worker), have_version=have_version)
    responses = list(wire.stub.PullParameters(request, timeout=30.0, metadata=wire.metadata))
    assert responses[0].header.delta_from_version == have_version
    return responses[0].header


def state(coordinator: SwarmCoordinator) -> dict[str, torch.Tensor]:
    """θ, the momentum and the broadcast residual, by prefixed name."""
    tensors = {f"theta/{k}": v for k, v in coordinator.params.items()}
    tensors.update({f"momentum/{k}": v for k, v in coordinator.momentum.items()})
    tensors.update({f"residual/{k}": v for k, v in coordinator.broadcast_feedback.snapshot().items()})
    return tensors


@pytest.mark.parametrize("method", ["clipped_mean", "trimmed_mean", "centered_clip"])
def test_closes_write_into_the_previous_closes_buffers_and_match_fresh_ones_bit_for_bit(tmp_path: Path, method: str) -> None:
    recycling = SwarmCoordinator(spec(method, 3), StateStore(tmp_path / "recycling", durable=False))
    fresh = FreshBuffersCoordinator(spec(method, 3), StateStore(tmp_path / "fresh", durable=False))
    assert_bit_identical(state(recycling), state(fresh))
    momenta, residuals, thetas = [], [], []
    with serving(recycling) as wire, serving(fresh) as fresh_wire:
        workers = [wire.join(f"w{i}") for i in range(3)]
        fresh_workers = [fresh_wire.join(f"w{i}") for i in range(3)]
        for round_index in range(ROUNDS):
            scales = [1.0, 1.0, 40.0 if round_index % 2 else 1.0]
            close_round(recycling, wire, workers, round_index, scales)
            close_round(fresh, fresh_wire, fresh_workers, round_index, scales)
            assert_bit_identical(state(recycling), state(fresh))
            momenta.append(dict(recycling.momentum))
            residuals.append(recycling.broadcast_feedback.snapshot())
            thetas.append(dict(recycling.params))
        checkpoints = recycling.store.load_current(), fresh.store.load_current()
        assert_bit_identical(checkpoints[0].params, checkpoints[1].params)
        assert_bit_identical(checkpoints[0].params, recycling.params)
        assert any(r.clipped or r.aggregation.count("flagged") for r in recycling.store.recent_rounds(ROUNDS))
    # The held updates decoded into one scratch buffer each, kept for the next close.
    assert len(recycling.closer.decode_scratch) == 3
    # Double buffering: version v + 2's momentum and residual live in version v's buffers (held here, so
    # fresh memory could not have landed there). centered_clip keeps its aggregate, so its residual is fresh.
    shares = [momenta[v + 2][name].data_ptr() == momenta[v][name].data_ptr()
              for v in range(ROUNDS - 2) for name in momenta[v]]
    assert all(shares)
    residual_shares = [residuals[v + 2][name].data_ptr() == residuals[v][name].data_ptr()
                       for v in range(ROUNDS - 2) for name in residuals[v]]
    assert all(residual_shares) == (method != "centered_clip")
    theta_shares = [thetas[v + 2][name].data_ptr() == thetas[v][name].data_ptr()
                    for v in range(ROUNDS - 2) for name in thetas[v]]
    assert all(theta_shares)


def test_a_full_pull_of_a_recycled_version_starts_over_at_the_current_one(tmp_path: Path) -> None:
    coordinator = SwarmCoordinator(spec(), StateStore(tmp_path / "state", durable=False))
    with serving(coordinator) as wire:
        workers = [wire.join(f"w{i}") for i in range(2)]
        close_round(coordinator, wire, workers, 0, [1.0, 1.0])
        built = coordinator._pull_payload
        close_round(coordinator, wire, workers, 1, [1.0, 1.0])
        unbuilt = coordinator._pull_payload
        close_round(coordinator, wire, workers, 2, [1.0, 1.0], full=False)
        # Version 2's θ was never pulled in full; the close to version 4 reuses its buffers, so a pull that
        # picked its payload before gets nothing from it and starts over at the current version.
        close_round(coordinator, wire, workers, 3, [1.0, 1.0], full=False)
        assert unbuilt.get() is None and unbuilt.build_seconds is None and built.build_seconds is not None
        # A payload built before its θ was reused keeps serving what it served (its chunks are copies).
        header, chunks = built.get()
        assert header.version == 1
        receiver = tensor_stream.PayloadReceiver(header, expected=None)
        for chunk in chunks:
            receiver.add(chunk)
        assert tensor_stream.params_sha256(receiver.finish()) == header.content_sha256
        original = coordinator._pick_payload
        picks = []

        def stale_first(request: Any) -> Any:
            picks.append(request.worker_id)
            return (unbuilt, None, []) if len(picks) == 1 else original(request)

        coordinator._pick_payload = stale_first
        pulled = wire.pull(workers[1])
        assert len(picks) == 2 and pulled.version == coordinator.version == 4
        assert pulled.content_sha256 == coordinator.param_sha256


class NoSeparateWrites(StateStore):
    """A real store that refuses the close's own rows (the reference norms, flag events) outside `commit_version`
    once `strict` is set."""

    strict = False

    def set_many(self, values: Any) -> None:
        if self.strict and REFERENCE_NORMS_KEY in values:
            raise AssertionError(f"reference norms written outside the commit: {values}")
        super().set_many(values)

    def add_event(self, worker_id: str, kind: str, reason: str, now: float | None = None) -> None:
        if self.strict and kind in ("clipped", "dropped", "trimmed"):
            raise AssertionError(f"flag event written outside the commit: {kind} {reason}")
        super().add_event(worker_id, kind, reason, now)


def test_the_reference_norms_and_flag_events_enter_the_commits_transaction(tmp_path: Path) -> None:
    store = NoSeparateWrites(tmp_path / "state", durable=False)
    coordinator = SwarmCoordinator(spec("clipped_mean", 3), store)
    with serving(coordinator) as wire:
        workers = [wire.join(f"w{i}") for i in range(3)]
        store.strict = True
        close_round(coordinator, wire, workers, 0, [1.0, 1.0, 40.0])
        close_round(coordinator, wire, workers, 1, [1.0, 1.0, 1.0])
        store.strict = False
        history = json.loads(store.get(REFERENCE_NORMS_KEY))
        rounds = store.recent_rounds(2)
    assert [tuple(norms) for norms in history] == list(coordinator.closer.norm_history) and len(history) == 2
    assert sorted(r.clipped for r in rounds) == [0, 1]
    events = read_state(store.state_dir, lambda stored: stored.events("clipped"))
    assert [(e.worker_id, e.kind) for e in events] == [(workers[2], "clipped")]
    assert events[0].reason.startswith("round 0: norm ")


@pytest.mark.parametrize("codec", [pb.CODEC_FP32, pb.CODEC_BF16, pb.CODEC_INT8_BLOCK])
def test_decoding_into_a_given_buffer_gives_the_fresh_decode_bit_for_bit(codec: int) -> None:
    values = torch.randn(3, 100, generator=torch.Generator().manual_seed(3))  # [3, 100]
    payload = codecs.encode(values, codec, 64)
    scratch = torch.full((300,), float("nan"))  # [300]
    decoded = codecs.decode(payload, codec, (3, 100), 64, out=scratch)
    assert decoded.data_ptr() == scratch.data_ptr() and decoded.shape == (3, 100)
    assert_bit_identical({"x": decoded}, {"x": codecs.decode(payload, codec, (3, 100), 64)})
    with pytest.raises(ValueError, match="out must be a contiguous float32 CPU tensor of 300 elements"):
        codecs.decode(payload, codec, (3, 100), 64, out=torch.zeros(299))
