"""Tests for rcswarm.sync.codec: round trips within the documented bounds, and error feedback."""

from __future__ import annotations

import math

import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec

ALL_CODECS = (pb.CODEC_FP32, pb.CODEC_BF16, pb.CODEC_INT8_BLOCK)
SHAPES = [(), (1,), (0,), (7,), (255,), (256,), (257,), (3, 5, 7), (2, 1000), (4, 0, 3)]
BLOCK_SIZES = [1, 7, 64, 256]


def _random_tensor(shape: tuple[int, ...], seed: int, magnitude: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * magnitude


def _round_trip(x: torch.Tensor, codec_value: int, block_size: int) -> torch.Tensor:
    data = codec.encode(x, codec_value, block_size)
    assert isinstance(data, bytes)
    assert len(data) == codec.encoded_size(x.numel(), codec_value, block_size)
    y = codec.decode(data, codec_value, tuple(x.shape), block_size)
    assert y.dtype == torch.float32
    assert tuple(y.shape) == tuple(x.shape)
    return y


def _assert_int8_bound(x: torch.Tensor, y: torch.Tensor, block_size: int) -> None:
    flat_x = x.reshape(-1).double()
    flat_y = y.reshape(-1).double()
    num_blocks = -(-flat_x.numel() // block_size)
    pad = num_blocks * block_size - flat_x.numel()
    blocks_x = torch.nn.functional.pad(flat_x, (0, pad)).view(num_blocks, block_size)
    blocks_y = torch.nn.functional.pad(flat_y, (0, pad)).view(num_blocks, block_size)
    absmax = blocks_x.abs().amax(dim=1, keepdim=True)  # [num_blocks, 1]
    bound = absmax / 254 * (1 + 2**-15)
    err = (blocks_x - blocks_y).abs()
    assert bool((err <= bound).all()), f"max err/bound {float((err / bound.clamp_min(1e-300)).max())}"


def _assert_bf16_bound(x: torch.Tensor, y: torch.Tensor) -> None:
    err = (x.double() - y.double()).abs()
    assert bool((err <= x.double().abs() * 2**-8).all())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("magnitude", [1.0, 1e30, 1e-30])
def test_fp32_round_trip_is_exact(shape: tuple[int, ...], magnitude: float) -> None:
    x = _random_tensor(shape, seed=1, magnitude=magnitude)
    y = _round_trip(x, pb.CODEC_FP32, codec.DEFAULT_BLOCK_SIZE)
    assert torch.equal(x, y)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("magnitude", [1.0, 1e30, 1e-30])
def test_bf16_round_trip_within_relative_bound(shape: tuple[int, ...], magnitude: float) -> None:
    x = _random_tensor(shape, seed=2, magnitude=magnitude)
    y = _round_trip(x, pb.CODEC_BF16, codec.DEFAULT_BLOCK_SIZE)
    _assert_bf16_bound(x, y)
    assert torch.equal(y, x.to(torch.bfloat16).to(torch.float32))


def test_bf16_rounds_to_nearest_even() -> None:
    one = 1.0
    ulp = 2.0**-7
    x = torch.tensor([one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2**-20], dtype=torch.float32)
    y = _round_trip(x, pb.CODEC_BF16, 1)
    assert y.tolist() == [one, one + 2 * ulp, one + ulp]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("magnitude", [1.0, 1e30, 1e-30])
def test_int8_round_trip_within_block_bound(shape: tuple[int, ...], block_size: int, magnitude: float) -> None:
    x = _random_tensor(shape, seed=3, magnitude=magnitude)
    y = _round_trip(x, pb.CODEC_INT8_BLOCK, block_size)
    _assert_int8_bound(x, y, block_size)


def test_int8_mixed_magnitudes_and_zero_block() -> None:
    block_size = 16
    x = torch.cat(
        [
            torch.zeros(block_size),
            _random_tensor((block_size,), seed=4, magnitude=1e30),
            _random_tensor((block_size,), seed=5, magnitude=1e-30),
            torch.tensor([3.0, -3.0, 0.0]),
        ]
    )  # [3 * block_size + 3]
    data = codec.encode(x, pb.CODEC_INT8_BLOCK, block_size)
    scales = torch.frombuffer(bytearray(data[:16]), dtype=torch.float32)  # [4]
    assert scales[0].item() == 0.0
    assert scales[3].item() == pytest.approx(3.0 / 127)
    y = codec.decode(data, pb.CODEC_INT8_BLOCK, tuple(x.shape), block_size)
    assert torch.equal(y[:block_size], torch.zeros(block_size))
    assert y[-3:].tolist() == pytest.approx([3.0, -3.0, 0.0])
    _assert_int8_bound(x, y, block_size)


def test_int8_layout_is_scales_then_values() -> None:
    x = torch.tensor([1.0, -0.5, 0.25, 127.0, 0.0])
    data = codec.encode(x, pb.CODEC_INT8_BLOCK, 3)
    scales = torch.frombuffer(bytearray(data[:8]), dtype=torch.float32)  # [2]
    values = torch.frombuffer(bytearray(data[8:]), dtype=torch.int8)  # [5]
    assert scales.tolist() == pytest.approx([1.0 / 127, 1.0])
    assert values.tolist() == [127, -64, 32, 127, 0]


def test_int8_size_ratio() -> None:
    block_size = 256
    x = _random_tensor((64, block_size), seed=6)
    int8_bytes = len(codec.encode(x, pb.CODEC_INT8_BLOCK, block_size))
    fp32_bytes = len(codec.encode(x, pb.CODEC_FP32, block_size))
    assert int8_bytes / fp32_bytes == pytest.approx((1 + 4 / block_size) / 4, rel=1e-12)
    odd = _random_tensor((10_001,), seed=7)
    ratio = len(codec.encode(odd, pb.CODEC_INT8_BLOCK, block_size)) / (4 * odd.numel())
    assert ratio == pytest.approx((1 + 4 / block_size) / 4, rel=1e-3)


@pytest.mark.parametrize("codec_value", ALL_CODECS)
def test_encoded_size_matches_formula(codec_value: int) -> None:
    per_element = {pb.CODEC_FP32: 4, pb.CODEC_BF16: 2}
    for numel in (0, 1, 255, 256, 257, 1000):
        got = codec.encoded_size(numel, codec_value, 256)
        if codec_value == pb.CODEC_INT8_BLOCK:
            assert got == numel + 4 * math.ceil(numel / 256)
        else:
            assert got == per_element[codec_value] * numel


def test_encode_accepts_non_contiguous_input() -> None:
    x = _random_tensor((30, 40), seed=8).t()  # [40, 30], non-contiguous
    assert not x.is_contiguous()
    for codec_value in ALL_CODECS:
        y = _round_trip(x, codec_value, 16)
        if codec_value == pb.CODEC_FP32:
            assert torch.equal(x, y)


def test_decode_result_does_not_alias_the_buffer() -> None:
    x = _random_tensor((100,), seed=9)
    buffer = bytearray(codec.encode(x, pb.CODEC_FP32, 1))
    y = codec.decode(buffer, pb.CODEC_FP32, (100,), 1)
    buffer[:4] = b"\0\0\0\0"
    assert torch.equal(x, y)
    y.add_(1.0)


def test_decode_accepts_memoryview_slices() -> None:
    x = _random_tensor((10,), seed=10)
    data = b"junk" + codec.encode(x, pb.CODEC_BF16, 1) + b"tail"
    y = codec.decode(memoryview(data)[4:-4], pb.CODEC_BF16, (10,), 1)
    assert torch.equal(y, x.to(torch.bfloat16).float())


@pytest.mark.parametrize("codec_value", ALL_CODECS)
def test_decode_rejects_wrong_length(codec_value: int) -> None:
    data = codec.encode(_random_tensor((10,), seed=11), codec_value, 4)
    name = pb.Codec.Name(codec_value)
    for bad in (data[:-1], data + b"\0"):
        with pytest.raises(ValueError, match=rf"{name}.*expected {len(data)} bytes, got {len(bad)}"):
            codec.decode(bad, codec_value, (10,), 4)


def test_unknown_codec_is_rejected() -> None:
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="99"):
        codec.encode(x, 99, 256)
    with pytest.raises(ValueError, match="99"):
        codec.decode(b"", 99, (0,), 256)
    with pytest.raises(ValueError, match="CODEC_UNSPECIFIED"):
        codec.encoded_size(3, pb.CODEC_UNSPECIFIED, 256)


def test_int8_needs_positive_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        codec.encode(torch.zeros(3), pb.CODEC_INT8_BLOCK, 0)


def test_int8_decode_rejects_non_finite_scales() -> None:
    data = bytearray(codec.encode(torch.ones(8), pb.CODEC_INT8_BLOCK, 4))
    for bad_scale in (float("nan"), float("inf"), -1.0):
        corrupt = bytearray(data)
        corrupt[:4] = torch.tensor([bad_scale], dtype=torch.float32).numpy().tobytes()
        with pytest.raises(ValueError, match="scale"):
            codec.decode(bytes(corrupt), pb.CODEC_INT8_BLOCK, (8,), 4)


def test_int8_encode_rejects_non_finite_values() -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="non-finite"):
            codec.encode(torch.tensor([1.0, bad]), pb.CODEC_INT8_BLOCK, 4)


def test_encode_rejects_non_float32() -> None:
    with pytest.raises(ValueError, match="float64"):
        codec.encode(torch.zeros(3, dtype=torch.float64), pb.CODEC_FP32, 256)


def test_codec_from_name() -> None:
    assert codec.codec_from_name("fp32") == pb.CODEC_FP32
    assert codec.codec_from_name("bf16") == pb.CODEC_BF16
    assert codec.codec_from_name("INT8") == pb.CODEC_INT8_BLOCK
    with pytest.raises(ValueError, match=r"'fp8'.*'fp32', 'bf16', 'int8'"):
        codec.codec_from_name("fp8")


def _random_deltas(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "w": torch.randn(40, 50, generator=gen),  # [40, 50]
        "b": torch.randn(333, generator=gen) * 1e-3,  # [333]
        "s": torch.randn((), generator=gen),  # []
    }


@pytest.mark.parametrize("codec_value", [pb.CODEC_INT8_BLOCK, pb.CODEC_BF16])
def test_error_feedback_residual_bounded_and_sums_match(codec_value: int) -> None:
    block_size = 64
    rounds = 200
    gen = torch.Generator().manual_seed(12)
    feedback = codec.ErrorFeedback()
    first = _random_deltas(gen)
    one_round_error = math.sqrt(
        sum(
            float((t - _round_trip(t, codec_value, block_size)).double().square().sum())
            for t in first.values()
        )
    )
    sum_true = {name: torch.zeros(t.shape, dtype=torch.float64) for name, t in first.items()}
    sum_decoded = {name: torch.zeros(t.shape, dtype=torch.float64) for name, t in first.items()}
    norms = []
    deltas = first
    for _ in range(rounds):
        payloads = feedback.compress(deltas, codec_value, block_size)
        assert list(payloads) == list(deltas)
        for name, delta in deltas.items():
            sum_true[name] += delta.double()
            received = codec.decode(payloads[name], codec_value, tuple(delta.shape), block_size)
            sum_decoded[name] += received.double()
        norms.append(feedback.residual_norm())
        deltas = _random_deltas(gen)
    assert max(norms) <= 3 * one_round_error
    assert sum(norms[-50:]) <= 1.5 * sum(norms[:50])
    for name in sum_true:
        residual = feedback.residual(name)
        assert residual is not None
        torch.testing.assert_close(sum_decoded[name] + residual.double(), sum_true[name], rtol=0, atol=1e-4)
    assert sum(float(sum_true[n].abs().max()) for n in sum_true) > 10


def test_error_feedback_beats_plain_quantization_on_the_sum() -> None:
    gen = torch.Generator().manual_seed(13)
    feedback = codec.ErrorFeedback()
    delta = torch.randn(1000, generator=gen) * 1e-2 + 0.3  # [1000], a constant push each round
    total_plain = torch.zeros(1000, dtype=torch.float64)
    total_feedback = torch.zeros(1000, dtype=torch.float64)
    for _ in range(100):
        total_plain += _round_trip(delta, pb.CODEC_INT8_BLOCK, 256).double()
        payload = feedback.compress({"d": delta}, pb.CODEC_INT8_BLOCK, 256)["d"]
        total_feedback += codec.decode(payload, pb.CODEC_INT8_BLOCK, (1000,), 256).double()
    truth = delta.double() * 100
    assert float((total_feedback - truth).abs().max()) < 0.1 * float((total_plain - truth).abs().max())


def test_error_feedback_fp32_residual_is_zero_and_reset() -> None:
    gen = torch.Generator().manual_seed(14)
    feedback = codec.ErrorFeedback()
    deltas = _random_deltas(gen)
    payloads = feedback.compress(deltas, pb.CODEC_FP32, 256)
    assert feedback.residual_norm() == 0.0
    for name, delta in deltas.items():
        assert torch.equal(codec.decode(payloads[name], pb.CODEC_FP32, tuple(delta.shape), 256), delta)
    feedback.compress(deltas, pb.CODEC_INT8_BLOCK, 16)
    assert feedback.residual_norm() > 0
    feedback.reset()
    assert feedback.residual_norm() == 0.0
    assert feedback.residual("w") is None


def test_error_feedback_rejects_non_finite_without_changing_state() -> None:
    feedback = codec.ErrorFeedback()
    feedback.compress({"a": torch.randn(10), "b": torch.randn(10)}, pb.CODEC_BF16, 1)
    before = {name: feedback.residual(name) for name in ("a", "b")}
    with pytest.raises(ValueError, match="'b'"):
        feedback.compress({"a": torch.randn(10), "b": torch.full((10,), float("nan"))}, pb.CODEC_BF16, 1)
    for name, residual in before.items():
        assert torch.equal(feedback.residual(name), residual)


def test_a_value_bf16_rounds_to_infinity_leaves_the_residuals_as_they_were() -> None:
    """A finite float32 from 3.3961e38 up encodes as ±inf in bf16: the round is refused (ValueError naming the tensor)
    and the residuals stay as they were; before, the residual became -inf and every later round raised."""
    feedback = codec.ErrorFeedback()
    feedback.compress({"w": torch.tensor([0.25, 1.0 + 2**-10])}, pb.CODEC_BF16)
    before = feedback.snapshot()
    with pytest.raises(ValueError, match=r"delta 'w': CODEC_BF16 \(2\) cannot carry its largest magnitude 3\.4e\+38"):
        feedback.compress({"w": torch.tensor([3.4e38, 1.0])}, pb.CODEC_BF16)
    assert all(torch.equal(feedback.snapshot()[k], before[k]) for k in before)
    payloads = feedback.compress({"w": torch.zeros(2)}, pb.CODEC_BF16)  # the next round encodes
    assert torch.isfinite(codec.decode(payloads["w"], pb.CODEC_BF16, (2,))).all()
