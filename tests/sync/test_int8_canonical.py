"""The int8 (and lowbit) block codecs read back only bytes their encoder writes: no code -128, no scale whose
largest code decodes to ±inf; and every finite float32 the int8 encoder takes decodes finite.

Found by a review (2026-11-29): int8 decoding took the code -128 (0x80,
decoding beyond the block's absmax) and a finite scale of 3e38 (decoding to ±inf), and encoding float32's
largest value decoded to inf.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec

INT8 = codec.WireFormat(pb.CODEC_INT8_BLOCK, 4)
FLOAT32_MAX = float(np.finfo(np.float32).max)
BELOW_MAX = float(np.nextafter(np.float32(FLOAT32_MAX), np.float32(0)))


def _decode_refused(data: bytes, fmt: codec.WireFormat, numel: int, match: str) -> None:
    """Decoding `data` raises ValueError matching `match`, fresh and into `out`, and leaves `out` untouched."""
    with pytest.raises(ValueError, match=match):
        codec.decode(data, fmt, (numel,))
    out = torch.full((numel,), 7.0)  # [numel]
    with pytest.raises(ValueError, match=match):
        codec.decode(data, fmt, (numel,), out=out)
    assert bool((out == 7.0).all())


def test_int8_decode_refuses_the_code_minus_128() -> None:
    good = bytearray(codec.encode(torch.tensor([1.0, -0.5, 0.25, 0.0, 3.0, -3.0]), INT8))
    assert -128 not in np.frombuffer(bytes(good[8:]), np.int8).tolist()
    bad = bytearray(good)
    bad[8 + 1] = 0x80
    bad[8 + 5] = 0x80
    _decode_refused(bytes(bad), INT8, 6, r"2 codes of -128 \(0x80\); expected codes in -127\.\.127")


@pytest.mark.parametrize("scale", [3.0e38, FLOAT32_MAX / 127 * (1 + 2**-20)])
def test_int8_decode_refuses_a_scale_whose_codes_overflow(scale: float) -> None:
    bad = bytearray(codec.encode(torch.tensor([1.0, -0.5, 0.25, 0.0]), INT8))
    bad[0:4] = struct.pack("<f", scale)
    _decode_refused(bytes(bad), INT8, 4, r"1 block scales above 2\.6793\d*e\+36 .*float32's max / 127")


def test_int8_decode_takes_the_largest_scale_and_decodes_it_finite() -> None:
    data = bytearray(codec.encode(torch.tensor([1.0, -1.0, 0.0, 0.0]), INT8))
    data[0:4] = struct.pack("<f", codec._INT8_SCALE_MAX)
    values = codec.decode(bytes(data), INT8, (4,))
    assert bool(torch.isfinite(values).all()) and float(values.abs().max()) > 3.4e38


def test_lowbit_decode_refuses_a_scale_whose_codes_overflow() -> None:
    """4 bits (codes −7..7): a scale above float32's max / 7 is refused. (2 bits: codes −1..1, any finite scale
    decodes finite.)"""
    fmt = codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 4, 0, 4)
    bad = bytearray(codec.encode(torch.tensor([1.0, -1.0, 0.25, 0.0]), fmt))
    bad[0:4] = struct.pack("<f", float(np.nextafter(np.float32(FLOAT32_MAX / 7), np.float32(np.inf))))
    _decode_refused(bytes(bad), fmt, 4, r"1 block scales above .*float32's max / 7")


def test_int8_encode_refuses_float32_max_naming_it() -> None:
    with pytest.raises(codec.MagnitudeError, match=r"cannot encode magnitude 3\.40282347e\+38 \(block 1; 1 such"):
        codec.encode(torch.tensor([1.0, 0.0, 0.0, 0.0, -FLOAT32_MAX, 2.0]), INT8)


@pytest.mark.parametrize("fmt", [INT8, codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 4, 0, 2),
                                 codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 4, 0, 4)], ids=["int8", "low2", "low4"])
def test_every_finite_magnitude_the_encoder_takes_decodes_finite(fmt: codec.WireFormat) -> None:
    for top in (BELOW_MAX, 3.4e38, 3.0e38, FLOAT32_MAX):
        x = torch.tensor([top, -top / 3, 1.0, 0.0, 1e-30])  # [5]
        if fmt.codec == pb.CODEC_INT8_BLOCK and top == FLOAT32_MAX:
            continue  # refused, test_int8_encode_refuses_float32_max_naming_it
        values = codec.decode(codec.encode(x, fmt), fmt, (5,))
        assert bool(torch.isfinite(values).all()), (top, values)
        assert abs(float(values[0]) - top) <= top / 2


def test_error_feedback_keeps_its_clear_error_and_residuals_for_float32_max() -> None:
    feedback = codec.ErrorFeedback()
    feedback.compress({"w": torch.tensor([0.25, 1.0, -2.0])}, INT8)
    before = feedback.snapshot()
    carry = r"delta 'w': CODEC_INT8_BLOCK \(3\) cannot carry its largest magnitude 3\.40282e\+38"
    with pytest.raises(ValueError, match=carry):
        feedback.compress({"w": torch.tensor([FLOAT32_MAX, 1.0, 0.0])}, INT8)
    assert all(torch.equal(feedback.snapshot()[k], before[k]) for k in before)
    payloads = feedback.compress({"w": torch.zeros(3)}, INT8)  # the next round encodes
    assert torch.isfinite(codec.decode(payloads["w"], INT8, (3,))).all()
