"""The round close at scale (issue 13): each step decoded once, the full pull payload built lazily,
and the sliced average, in-place outer step and norm bit-identical to their one-pass definitions.

The coordinator tests run a real coordinator on loopback with raw stubs (tests/helpers/wire.py `Wire`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rcswarm.config.runspec import OuterSection
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer, tensor_stream
from tests.helpers.close import SHAPES, assert_bit_identical, random_tensors, serving_tiny_int8
from tests.helpers.wire import Wire


def test_the_sliced_average_is_bit_identical_to_one_float64_pass() -> None:
    generator = torch.Generator().manual_seed(3)
    updates = [(1000 + 7 * i, random_tensors(generator, 1e-3)) for i in range(3)]
    total = sum(tokens for tokens, _ in updates)
    want = {}
    for name in SHAPES:
        acc = torch.zeros(SHAPES[name], dtype=torch.float64)
        for tokens, deltas in updates:
            acc.add_(deltas[name].to(torch.float64), alpha=tokens / total)
        want[name] = acc.to(torch.float32)
    assert_bit_identical(outer.weighted_average(updates), want)


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_in_place_outer_step_is_bit_identical_to_its_formula(nesterov: bool) -> None:
    generator = torch.Generator().manual_seed(4)
    params, momentum, grad = (random_tensors(generator, s) for s in (1.0, 1e-2, 1e-3))
    options = OuterSection(lr=0.7, momentum=0.9, nesterov=nesterov)
    before = {name: t.clone() for name, t in params.items()}
    new_params, new_momentum = outer.outer_step(params, momentum, grad, options)
    want_momentum = {name: momentum[name] * 0.9 + grad[name] for name in SHAPES}
    direction = {name: grad[name] + 0.9 * want_momentum[name] if nesterov else want_momentum[name] for name in SHAPES}
    assert_bit_identical(new_momentum, want_momentum)
    assert_bit_identical(new_params, {name: params[name] - 0.7 * direction[name] for name in SHAPES})
    assert_bit_identical(params, before)


def test_the_norm_equals_the_float64_sum_of_squares_and_leaves_float64_inputs_alone() -> None:
    generator = torch.Generator().manual_seed(5)
    tensors = random_tensors(generator)
    want = sum(float(torch.sum(torch.square(t.to(torch.float64)))) for t in tensors.values()) ** 0.5
    assert tensor_stream.global_norm(tensors) == want
    wide = {"w": torch.tensor([3.0, 4.0], dtype=torch.float64)}
    assert tensor_stream.global_norm(wide) == 5.0
    assert torch.equal(wide["w"], torch.tensor([3.0, 4.0], dtype=torch.float64))


@pytest.mark.parametrize("codec", ["int8", "bf16", "fp32"])
def test_the_compressed_step_decodes_each_payload_once_and_matches_a_replica(codec: str, monkeypatch: Any) -> None:
    value, generator = codecs.codec_from_name(codec), torch.Generator().manual_seed(6)
    params = random_tensors(generator)
    feedback, replica_feedback = codecs.ErrorFeedback(), codecs.ErrorFeedback()
    decoded: list[int] = []
    real_decode = codecs.decode

    def counting_decode(*args: Any, **kwargs: Any) -> torch.Tensor:
        decoded.append(1)
        return real_decode(*args, **kwargs)

    for _ in range(3):
        target = {name: t - 1e-2 * torch.randn(t.shape, generator=generator) for name, t in params.items()}
        step = {name: t - target[name] for name, t in params.items()}
        want_encoded = replica_feedback.compress(step, value, 256)
        monkeypatch.setattr(codecs, "decode", counting_decode)
        decoded.clear()
        new_params, encoded = outer.compressed_step(params, target, value, 256, feedback)
        monkeypatch.setattr(codecs, "decode", real_decode)
        assert len(decoded) == (0 if codec == "fp32" else len(SHAPES))
        assert encoded == want_encoded
        # What a replica holding θ_v rebuilds from the bytes it pulls.
        rebuilt = {name: t - real_decode(encoded[name], value, tuple(t.shape), 256) for name, t in params.items()}
        assert_bit_identical(new_params, rebuilt)
        for name in SHAPES:
            assert torch.equal(feedback.residual(name), replica_feedback.residual(name))
        params = new_params


def test_a_non_finite_delta_is_refused_by_name_and_keeps_the_residuals() -> None:
    feedback = codecs.ErrorFeedback()
    feedback.compress({"w": torch.tensor([0.3, -0.7])}, pb.CODEC_INT8_BLOCK, 256)
    kept = feedback.residual("w")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=r"delta 'w' has 1 non-finite values"):
            feedback.compress({"w": torch.tensor([bad, 1.0])}, pb.CODEC_INT8_BLOCK, 256)
        assert torch.equal(feedback.residual("w"), kept)
    assert codecs.all_finite(torch.zeros(0)) and not codecs.all_finite(torch.tensor(float("nan")))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SwarmCoordinator, Wire]]:
    with serving_tiny_int8(tmp_path, durable=False) as served:
        yield served


def pulled(wire: Wire, worker_id: str, have_version: int | None = None) -> dict[str, torch.Tensor]:
    """Pull over the wire and decode what arrived, checking the header's digest when it carries one."""
    request = pb.PullParametersRequest(**wire.creds(worker_id))
    if have_version is not None:
        request.have_version = have_version
    responses = list(wire.stub.PullParameters(request, timeout=30.0, metadata=wire.metadata))
    receiver = tensor_stream.PayloadReceiver(responses[0].header, expected=None)
    for response in responses[1:]:
        receiver.add(response.chunk)
    return receiver.finish()


def test_the_close_leaves_the_full_pull_payload_to_the_first_full_pull(served: Any) -> None:
    coordinator, wire = served
    first, second = wire.join("first"), wire.join("second")
    header = wire.pull(first)
    wire.pull(second)
    wire.push_zero(first, header)
    wire.push_zero(second, header)
    assert coordinator.version == 1
    assert "pull payload" not in coordinator.last_close_seconds
    assert {"average", "norm", "outer step", "compressed step", "commit"} <= set(coordinator.last_close_seconds)
    lazy = coordinator._pull_payload
    assert lazy.build_seconds is None
    pulled(wire, first, have_version=0)
    assert lazy.build_seconds is None
    full = pulled(wire, second)
    assert lazy.build_seconds is not None
    assert tensor_stream.params_sha256(full) == coordinator.param_sha256
    assert_bit_identical(full, coordinator.params)
    assert lazy.get() is lazy.get()


def test_the_sliced_int8_encoder_gives_the_one_pass_bytes() -> None:
    generator = torch.Generator().manual_seed(7)
    flat = torch.randn(3 * codecs._QUANTIZE_ROWS * 256 + 300, generator=generator)  # [numel]
    full = flat.numel() // 256
    scales = codecs._block_scales(flat, 256)  # [num_blocks]
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))  # [num_blocks]
    q = torch.cat([(flat[: full * 256].view(full, 256) / divisor[:full, None]).reshape(-1), flat[full * 256 :] / divisor[-1]])
    want = scales.numpy().astype("<f4").tobytes() + q.round_().clamp_(-127, 127).to(torch.int8).numpy().tobytes()
    assert codecs.encode(flat, pb.CODEC_INT8_BLOCK, 256) == want
