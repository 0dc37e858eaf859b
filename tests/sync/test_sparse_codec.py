"""The sparse and low-bit codecs of issue #28: round-trip bounds per chunk, sizes, error feedback, malformed bytes."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec
from tests.helpers.sparse import malformed

SPARSE = codec.WireFormat(pb.CODEC_SPARSE, 4096, 82, 2)
FORMATS = [
    SPARSE,
    codec.WireFormat(pb.CODEC_SPARSE, 100, 3, 1),
    codec.WireFormat(pb.CODEC_SPARSE, 64, 64, 8),
    codec.WireFormat(pb.CODEC_SPARSE, 37, 5, 4),
    codec.WireFormat(pb.CODEC_SPARSE, 2, 1, 3),
]
SHAPES = [(), (1,), (0,), (7,), (99,), (100,), (101,), (3, 5, 7), (2, 1000), (4, 0, 3), (9000,)]


def _distinct(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random values with distinct magnitudes (so the top-k of a chunk is one set)."""
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    magnitudes = (torch.randperm(numel, generator=gen).to(torch.float32) + 1.0) / max(numel, 1)  # [numel]
    signs = torch.where(torch.rand(numel, generator=gen) < 0.5, -1.0, 1.0)  # [numel]
    return (magnitudes * signs).reshape(shape)


def _chunks(flat: torch.Tensor, chunk: int) -> list[tuple[int, torch.Tensor]]:
    return [(start, flat[start:start + chunk]) for start in range(0, flat.numel(), chunk)]


def _kept(fmt: codec.WireFormat, length: int) -> int:
    return -(-fmt.keep * length // fmt.block_size)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.describe())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sparse_keeps_the_top_k_of_each_chunk_within_the_quantization_bound(fmt: codec.WireFormat, shape) -> None:
    x = _distinct(shape, seed=1) * 3.0
    data = codec.encode(x, fmt)
    assert len(data) == codec.encoded_size(x.numel(), fmt)
    y = codec.decode(data, fmt, shape)
    assert y.shape == x.shape and y.dtype == torch.float32
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for start, chunk in _chunks(flat_x, fmt.block_size):
        decoded = flat_y[start:start + chunk.numel()]
        k = _kept(fmt, chunk.numel())
        top = set(torch.topk(chunk.abs(), k).indices.tolist())
        sent = set(torch.nonzero(decoded).reshape(-1).tolist())
        assert sent <= top, "an entry not among the chunk's top-k was sent"
        kept = torch.tensor(sorted(top))
        magnitudes = chunk[kept].abs().double()
        lo, hi = float(magnitudes.min()), float(magnitudes.max())
        bound = (hi - lo) / 2 ** fmt.value_bits + 4 * 2**-23 * hi
        error = (chunk[kept].double() - decoded[kept].double()).abs()
        assert float(error.max()) <= bound
        assert bool((torch.sign(decoded[kept]) == torch.sign(chunk[kept])).all())
        rest = torch.ones(chunk.numel(), dtype=torch.bool)
        rest[kept] = False
        assert not bool(decoded[rest].any()), "an entry not kept decoded to a non-zero value"


def test_sparse_layout_scales_offsets_values() -> None:
    fmt = codec.WireFormat(pb.CODEC_SPARSE, 8, 2, 2)
    x = torch.tensor([0.0, -4.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.25, 3.0])  # two chunks: 8 values, then 1 (keeps 1)
    data = codec.encode(x, fmt)
    lo0, hi0, lo1, hi1 = struct.unpack_from("<4f", data)
    assert (lo0, hi0, lo1, hi1) == (1.0, 4.0, 3.0, 3.0)
    # Offsets, Elias–Fano at l = 1 (2·l + 2 + ceil(8 / 2**l) = 8 bits a full chunk, as at l = 2: the smaller l):
    # chunk 0 keeps 1 and 4, chunk 1 keeps 0. Low bits, 1 each, least significant first: 1, 0, 0.
    assert codec.offset_low_bits(8, 2) == 1
    assert data[16] == 0b001
    # Bitmaps: chunk 0's 2 + 4 bits with ones at h_i + i = (1 >> 1) + 0 and (4 >> 1) + 1; chunk 1's 1 + 1 bits, a
    # one at 0 (bit 6 of the stream).
    assert data[17] == 0b0100_1001
    # Values at 2 bits: sign, then the level of (|x| − lo) / ((hi − lo) / 2).
    codes = data[18]
    assert [(codes >> (2 * i)) & 3 for i in range(3)] == [0b11, 0b00, 0b00]
    assert codec.decode(data, fmt, (9,)).tolist() == [0, -3.25, 0, 0, 1.75, 0, 0, 0, 3.0]


@pytest.mark.parametrize("chunk, keep", [(4096, 82), (4096, 4096), (100, 1), (2, 2), (100, 4), (37, 5)])
def test_sparse_encoded_size_formula(chunk: int, keep: int) -> None:
    fmt = codec.WireFormat(pb.CODEC_SPARSE, chunk, keep, 3)
    low = codec.offset_low_bits(chunk, keep)
    for numel in (0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 7):
        full, rest = divmod(numel, chunk)
        kept_last = -(-keep * rest // chunk)
        kept, chunks = full * keep + kept_last, full + (rest > 0)
        bitmaps = full * (keep + math.ceil(chunk / 2**low)) + (kept_last + math.ceil(rest / 2**low) if rest else 0)
        assert codec.encoded_size(numel, fmt) == (8 * chunks + math.ceil(kept * low / 8) + math.ceil(bitmaps / 8)
                                                  + math.ceil(kept * 3 / 8))


@pytest.mark.parametrize("chunk, keep", [(4096, 82), (4096, 41), (4096, 164), (65536, 655), (100, 4), (37, 5), (8, 8)])
def test_sparse_offsets_cost_no_more_than_written_in_full_and_far_less_when_sparse(chunk: int, keep: int) -> None:
    """The split is the shortest full chunk over every split, so within Elias–Fano's bound of 2 + ceil(log2(n / k))
    bits an offset, and never above the full width plus the bitmap's one bit an entry."""
    low = codec.offset_low_bits(chunk, keep)
    coded = keep * low + codec.high_bits(chunk, keep, low)
    assert coded == min(keep * split + codec.high_bits(chunk, keep, split) for split in range(20))
    assert coded <= keep * (2 + math.ceil(math.log2(chunk / keep)))
    assert coded <= keep * (codec.offset_bits(chunk) + 1)


def test_sparse_default_density_is_150_times_below_fp32() -> None:
    """82 of 4,096 at 2 bits: 8 bytes of scales and 82 × (5 + 1 + 2) + 128 bits of offsets and values a chunk
    (7.6 bits an offset instead of 12 written in full)."""
    fmt = codec.WireFormat(pb.CODEC_SPARSE, codec.DEFAULT_SPARSE_CHUNK, codec.sparse_keep(0.02, 4096), 2)
    assert codec.offset_low_bits(4096, 82) == 5
    scales, low_bits, bitmaps, values = 100 * 8, 100 * 82 * 5 // 8, 100 * (82 + 128) // 8, 100 * 82 * 2 // 8
    assert codec.encoded_size(4096 * 100, fmt) == scales + low_bits + bitmaps + values
    assert 4 * 4096 / (8 + (82 * 8 + 128) / 8) == pytest.approx(154.5, abs=0.1)


def test_sparse_all_zero_and_constant_chunks() -> None:
    fmt = codec.WireFormat(pb.CODEC_SPARSE, 16, 4, 2)
    zeros = torch.zeros(16)
    assert torch.equal(codec.decode(codec.encode(zeros, fmt), fmt, (16,)), zeros)
    constant = torch.full((16,), -0.5)
    decoded = codec.decode(codec.encode(constant, fmt), fmt, (16,))
    assert sorted(decoded.tolist()) == [-0.5] * 4 + [0.0] * 12


def test_sparse_encode_rejects_non_finite_values() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.ones(10_000)
        x[7777] = bad
        with pytest.raises(ValueError, match="CODEC_SPARSE cannot encode non-finite values"):
            codec.encode(x, SPARSE)


@pytest.mark.parametrize("chunk, keep", [(4096, 82), (4096, 41), (4096, 123), (65536, 655), (1024, 1), (96, 3)])
def test_sparse_two_stage_selection_is_the_plain_top_k(chunk: int, keep: int) -> None:
    """The grouped selection (`_sparse_groups` > 1 for every case here) keeps each chunk's top-k set exactly."""
    assert codec._sparse_groups(chunk, keep) > 1
    x = _distinct((5 * chunk + chunk // 3,), seed=chunk + keep)
    fmt = codec.WireFormat(pb.CODEC_SPARSE, chunk, keep, 3)
    decoded = codec.decode(codec.encode(x, fmt), fmt, x.shape)
    for start, part in _chunks(x, chunk):
        top = set(torch.topk(part.abs(), _kept(fmt, part.numel())).indices.tolist())
        assert set(torch.nonzero(decoded[start:start + part.numel()]).reshape(-1).tolist()) == top


@pytest.mark.parametrize("where", ["one in a full chunk", "a whole full chunk", "the short last chunk"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_sparse_encode_rejects_non_finite_values_wherever_they_are(where: str, bad: float) -> None:
    """Non-finite entries are found among the kept ones (NaN ranks as the largest magnitude), grouped or not."""
    x = torch.randn(3 * 4096 + 100)
    if where == "one in a full chunk":
        x[4096 + 777] = bad
    elif where == "a whole full chunk":
        x[4096:8192] = bad
    else:
        x[-3] = bad
    with pytest.raises(ValueError, match="CODEC_SPARSE cannot encode non-finite values"):
        codec.encode(x, SPARSE)


@pytest.mark.parametrize("width", range(1, 17))
def test_bit_streams_round_trip_at_every_width(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    for count in (0, 1, 7, 8, 9, 1001):
        values = torch.randint(0, 1 << width, (count,), generator=gen).numpy().astype("uint16")
        packed = codec._pack_bits(values, width)
        assert len(packed) == -(-count * width // 8)
        assert (codec._unpack_bits(memoryview(packed), count, width, "test") == values).all()


MALFORMED_FORMAT = codec.WireFormat(pb.CODEC_SPARSE, 100, 4, 2)  # 7-bit offsets: 100..127 fit and are out of range
MALFORMED = [
    *malformed(MALFORMED_FORMAT, 205),
    ("a byte short (wrong count)", lambda data: data[:-1], "expected 35 bytes"),
    ("a byte more (wrong count)", lambda data: data + b"\0", "expected 35 bytes"),
]


@pytest.mark.parametrize("name, corrupt, fragment", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_sparse_decode_refuses_malformed_payloads_and_writes_nothing(name, corrupt, fragment) -> None:
    data = codec.encode(_distinct((205,), seed=3), MALFORMED_FORMAT)
    assert codec.decode(data, MALFORMED_FORMAT, (205,)).count_nonzero() == 9
    out = torch.full((205,), 7.0)
    with pytest.raises(ValueError, match=fragment):
        codec.decode(corrupt(data), MALFORMED_FORMAT, (205,), out=out)
    assert bool((out == 7.0).all()), "a refused payload wrote into the output"


@pytest.mark.parametrize("bits", codec.LOWBIT_VALUE_BITS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_lowbit_round_trip_within_block_bound(bits: int, shape) -> None:
    fmt = codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 64, 0, bits)
    x = _distinct(shape, seed=5)
    data = codec.encode(x, fmt)
    assert len(data) == codec.encoded_size(x.numel(), fmt) == 4 * -(-x.numel() // 64) + math.ceil(x.numel() * bits / 8)
    y = codec.decode(data, fmt, shape)
    levels = 2 ** (bits - 1) - 1
    for start, chunk in _chunks(x.reshape(-1), 64):
        bound = float(chunk.abs().max()) / (2 * levels) * (1 + 2**-15)
        assert float((chunk - y.reshape(-1)[start:start + chunk.numel()]).abs().max()) <= bound


def test_lowbit_refuses_the_unused_code_and_padding() -> None:
    fmt = codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 4, 0, 2)
    data = bytearray(codec.encode(torch.tensor([1.0, -1.0, 0.0, 0.5, 0.25]), fmt))
    out = torch.full((5,), 7.0)
    unused = bytearray(data)
    unused[8] |= 0b11  # the first code: 3 = 2Q + 1 with Q = 1
    with pytest.raises(ValueError, match="codes above 2"):
        codec.decode(unused, fmt, (5,), out=out)
    padded = bytearray(data)
    padded[-1] |= 0x80
    with pytest.raises(ValueError, match="padding bits"):
        codec.decode(padded, fmt, (5,), out=out)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("kwargs, fragment", [
    ({"codec": pb.CODEC_SPARSE, "block_size": 4096, "keep": 0, "value_bits": 2}, "keeps 1\\.\\.block_size"),
    ({"codec": pb.CODEC_SPARSE, "block_size": 16, "keep": 17, "value_bits": 2}, "keeps 1\\.\\.block_size"),
    ({"codec": pb.CODEC_SPARSE, "block_size": 16, "keep": 2, "value_bits": 9}, "value_bits in 1..8"),
    ({"codec": pb.CODEC_SPARSE, "block_size": 1 << 17, "keep": 2, "value_bits": 2}, "block_size in 1..65536"),
    ({"codec": pb.CODEC_LOWBIT_BLOCK, "block_size": 16, "keep": 0, "value_bits": 3}, r"value_bits in \(2, 4\)"),
    ({"codec": pb.CODEC_FP32, "block_size": 16, "keep": 1, "value_bits": 0}, "takes no keep"),
    ({"codec": 42, "block_size": 16}, "unknown codec 42"),
])
def test_wire_formats_validate_themselves(kwargs, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        codec.WireFormat(**kwargs)


def test_sparse_and_lowbit_need_their_parameters() -> None:
    with pytest.raises(ValueError, match="keeps 1..block_size"):
        codec.encode(torch.zeros(4), pb.CODEC_SPARSE, 256)


@pytest.mark.parametrize("fmt", [SPARSE, codec.WireFormat(pb.CODEC_SPARSE, 64, 8, 1),
                                 codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 64, 0, 2)], ids=lambda f: f.describe())
def test_error_feedback_makes_the_running_sum_exact_up_to_one_residual(fmt: codec.WireFormat) -> None:
    feedback = codec.ErrorFeedback()
    gen = torch.Generator().manual_seed(11)
    total_sent = torch.zeros(3, 3000, dtype=torch.float64)
    total_true = torch.zeros(3, 3000, dtype=torch.float64)
    for _ in range(40):
        delta = torch.randn(3, 3000, generator=gen)
        total_true += delta.double()
        payloads, received = feedback.compress_decoded({"w": delta}, fmt)
        assert torch.equal(received["w"], codec.decode(payloads["w"], fmt, (3, 3000)))
        total_sent += received["w"].double()
    residual = feedback.residual("w").double()
    # Σ decoded = Σ δ − r_T: exact but for the float32 sums of each round (about 2⁻²⁴ of each term).
    assert float((total_sent + residual - total_true).abs().max()) < 1e-4
    # Every round sends something of each chunk: the residual stays bounded, it does not grow like the sum.
    assert float(residual.abs().max()) < float(total_true.abs().max()) + 20


def test_error_feedback_decay_carries_beta_times_what_was_not_sent() -> None:
    fmt = codec.WireFormat(pb.CODEC_SPARSE, 64, 4, 2)
    feedback = codec.ErrorFeedback(decay=0.9)
    gen = torch.Generator().manual_seed(12)
    previous = torch.zeros(640)
    for _ in range(5):
        delta = torch.randn(640, generator=gen)
        _, received = feedback.compress_decoded({"w": delta.clone()}, fmt)
        combined = delta + 0.9 * previous
        assert torch.allclose(feedback.residual("w"), combined - received["w"], atol=1e-6)
        previous = feedback.residual("w")
    with pytest.raises(ValueError, match="decay = 1.5"):
        codec.ErrorFeedback(decay=1.5)


def test_error_feedback_with_decay_1_is_the_plain_sum_bit_for_bit() -> None:
    fmt = codec.WireFormat(pb.CODEC_INT8_BLOCK, 64)
    gen = torch.Generator().manual_seed(13)
    plain, decayed = codec.ErrorFeedback(), codec.ErrorFeedback(decay=1.0)
    for _ in range(3):
        delta = torch.randn(1000, generator=gen)
        assert plain.compress({"w": delta}, fmt) == decayed.compress({"w": delta}, fmt)


def test_error_feedback_refuses_non_finite_sparse_input_and_keeps_its_residual() -> None:
    feedback = codec.ErrorFeedback(decay=0.95)
    feedback.compress({"w": torch.randn(5000)}, SPARSE)
    before = feedback.residual("w")
    bad = torch.randn(5000)
    bad[10] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        feedback.compress({"w": bad}, SPARSE)
    assert torch.equal(feedback.residual("w"), before)



CAPPED_FORMATS = [
    codec.WireFormat(pb.CODEC_FP32),
    codec.WireFormat(pb.CODEC_BF16),
    codec.WireFormat(pb.CODEC_INT8_BLOCK, 64),
    codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 64, 0, 2),
    codec.WireFormat(pb.CODEC_LOWBIT_BLOCK, 64, 0, 4),
    codec.WireFormat(pb.CODEC_SPARSE, 256, 1, 2),
    codec.WireFormat(pb.CODEC_SPARSE, 37, 5, 8),
]


def _global_norm(tensors: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors.values()))


def _holding(residual: dict[str, torch.Tensor]) -> codec.ErrorFeedback:
    """Error feedback whose residuals are `residual` (as a worker resumes one)."""
    feedback = codec.ErrorFeedback()
    feedback.restore(dict(residual))
    return feedback


@pytest.mark.parametrize("fmt", CAPPED_FORMATS, ids=lambda f: f"{codec.codec_label(f.codec)}-{f.keep}-{f.value_bits}")
def test_a_norm_cap_sends_at_most_the_cap_and_keeps_the_rest_in_the_residual(fmt, monkeypatch) -> None:
    """`ErrorFeedback.compress(max_norm=...)` (a worker keeps its update under the coordinator's hard bound,
    sync/norm_bound.py): what the receiver decodes is at most the cap, in the second encoding at the latest, and
    decoded + new residual is what was to send (delta + residual), so nothing is lost; under the cap the payloads
    are those of the uncapped call, bit for bit."""
    monkeypatch.setattr(codec, "MAX_NORM_ATTEMPTS", 2)
    gen = torch.Generator().manual_seed(31)
    residual = {"w": torch.randn(40, 50, generator=gen) * 3.0, "b": torch.randn(333, generator=gen)}  # [40, 50], [333]
    deltas = {"w": torch.randn(40, 50, generator=gen) * 0.1, "b": torch.randn(333, generator=gen) * 0.1}
    uncapped = _holding(residual).compress(deltas, fmt)
    natural = _global_norm({name: codec.decode(payload, fmt, tuple(deltas[name].shape))
                            for name, payload in uncapped.items()})
    capped = _holding(residual)
    cap = natural / 4
    payloads = capped.compress(deltas, fmt, max_norm=cap)
    received = {name: codec.decode(payload, fmt, tuple(deltas[name].shape)) for name, payload in payloads.items()}
    assert cap * 0.99 < _global_norm(received) <= cap
    for name in deltas:
        torch.testing.assert_close(received[name] + capped.residual(name), deltas[name] + residual[name],
                                   rtol=0, atol=1e-5)
    assert _holding(residual).compress(deltas, fmt, max_norm=natural * 1.001) == uncapped
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_norm"):
            _holding(residual).compress(deltas, fmt, max_norm=bad)
