"""Tensor codecs for pseudo-gradients and parameters on the wire.

Every codec turns a CPU float32 tensor into a flat little-endian byte string and back:

* ``CODEC_FP32``: raw float32 values, ``4 * numel`` bytes. Lossless: the decoded tensor is
  bit-identical to the encoded one.
* ``CODEC_BF16``: ``tensor.to(torch.bfloat16)`` (round to nearest, ties to even), raw
  2-byte values, ``2 * numel`` bytes. For every element whose magnitude is a normal float32
  below the bfloat16 overflow threshold (about 3.396e38; larger magnitudes become +-inf),
  ``|x - x_hat| <= 2**-8 * |x|``. Subnormal inputs keep an absolute error of at most
  ``2**-134``.
* ``CODEC_INT8_BLOCK``: the flattened tensor is cut into blocks of ``block_size`` elements
  (the last block may be short). Each block stores ``scale = absmax(block) / 127`` as float32
  (0 for an all-zero block) and ``q = clamp(round(x / scale), -127, 127)`` as int8; the
  layout is all scales (one per block, in order) followed by all int8 values, so the size is
  ``4 * ceil(numel / block_size) + numel`` bytes. Decoding gives ``x_hat = q * scale`` and,
  per element, ``|x - x_hat| <= scale / 2 = absmax(block) / 254`` up to float32 rounding of
  the division and the product (at most ``2**-16 * scale`` more). Blocks whose absmax is so
  small that ``absmax / 127`` underflows to 0 (absmax below about 1e-43) decode to zeros.
  Encoding rejects non-finite values and a block whose ``127 * scale`` would overflow float32 (only
  an absmax of float32's largest value, 3.4028235e38: its scale rounds up; the next float32 down
  encodes). Decoding rejects non-finite or negative scales, scales above float32's max / 127 (whose
  ``127 * scale`` would decode to +-inf) and the code -128 (``0x80``), which the encoder never writes.

* ``CODEC_SPARSE`` (issue #28): the flattened tensor is cut into chunks of ``block_size``
  elements (the last may be short: ``n`` elements keep ``ceil(keep * n / block_size)``). Of each
  chunk the ``keep`` entries largest in magnitude are sent: their chunk-local offsets in strictly
  increasing order, Elias–Fano coded, and their values at ``value_bits`` = b bits each: a sign bit and
  ``b - 1`` magnitude bits. A chunk's two float32 scales ``lo`` and ``hi`` are the smallest and largest kept
  magnitude; with ``L = 2**(b-1)`` levels of width ``(hi - lo) / L`` a kept value decodes to
  ``±(lo + (q + 1/2) (hi - lo) / L)``, so per kept entry ``|x - x_hat| <= (hi - lo) / 2**b`` (plus float32
  rounding), and every entry not kept decodes to 0. The offsets (Elias–Fano, as in Vigna, "Quasi-succinct
  indices", WSDM 2013): each offset ``x`` is split into its ``l`` low bits (``offset_low_bits``: the ``l`` that
  makes a full chunk's code shortest, one ``l`` for every chunk of the tensor) and its high part ``h = x >> l``;
  a chunk of ``n`` elements keeping ``k`` entries writes the low bits (``k · l`` bits) and a bitmap of
  ``k + ceil(n / 2**l)`` bits with a one at ``h_i + i`` for its i-th entry. About ``2 + log2(n / k)`` bits an
  offset (7.6 at 82 of 4,096) instead of ``log2(n)`` (12), and the size is still fixed by the shape and the
  format. Layout: all scales (``lo, hi`` per chunk, in order), then every entry's low bits, then every chunk's
  bitmap, then the values, each of the four streams least significant bit first and padded with zero bits to a
  byte. The size depends on the shape and the format alone (``encoded_size``), so a receiver checks it before
  it allocates. Decoding refuses a chunk's bitmap with another number of ones than its entries, offsets out of
  the chunk or not strictly increasing (a duplicate), non-finite, negative or inverted (``lo > hi``) scales,
  and non-zero padding.
* ``CODEC_LOWBIT_BLOCK``: ``CODEC_INT8_BLOCK`` at ``value_bits`` = b in {2, 4} bits: per block
  ``scale = absmax / Q`` with ``Q = 2**(b-1) - 1`` and ``q = clamp(round(x / scale), -Q, Q)``
  stored as ``q + Q`` in b bits (2 bits: ternary, 4 bits: 15 levels), so
  ``|x - x_hat| <= absmax / (2 Q)``. Layout: all scales, then the codes packed 8 / b to a byte,
  least significant first. The dense low-bit codec hivemind's all-reduce can carry (sparse
  entries do not survive its reducers' averaging); decoding refuses the unused code ``2 Q + 1`` and,
  as int8's, non-finite or negative scales and scales above float32's max / Q.

A codec and every parameter its bytes depend on is a ``WireFormat``; the functions below take one
where they take a codec (a bare ``pb.Codec`` value plus ``block_size`` names the dense codecs).

``ErrorFeedback`` keeps, per tensor name, what the lossy codecs dropped and adds it to the
next round's delta, so that over many rounds the receiver sees the sum of the true deltas up
to one bounded residual. With a ``decay`` β < 1 (SparseLoCo's error feedback, arXiv:2508.15706)
the residual kept is β times what was not sent: old unsent mass fades instead of piling up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb

DEFAULT_BLOCK_SIZE = 256
# CODEC_SPARSE's default chunk (sync.sparse_chunk).
DEFAULT_SPARSE_CHUNK = 4096
# `ErrorFeedback.compress` with a norm cap: encodings tried (each scaled a little below the cap's ratio, since
# quantization scales with its input only up to rounding); the second meets the cap for every codec here.
MAX_NORM_ATTEMPTS = 3
NORM_SHRINK = 0.999

CODEC_NAMES: dict[str, int] = {
    "fp32": pb.CODEC_FP32,
    "bf16": pb.CODEC_BF16,
    "int8": pb.CODEC_INT8_BLOCK,
    "sparse": pb.CODEC_SPARSE,
    "lowbit": pb.CODEC_LOWBIT_BLOCK,
}

_KNOWN_CODECS = frozenset(CODEC_NAMES.values())
_INT8_MAX = 127.0
# The largest float32 that 127 (and Q) times a block scale may reach: float32's max; a scale above max / levels
# would decode to ±inf (`_largest_scale`).
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Blocks quantized per slice of the int8 encoder.
_QUANTIZE_ROWS = 4096
# The largest chunk or block of any codec (offsets of a sparse chunk fit 16 bits).
MAX_BLOCK_SIZE = 1 << 16
# CODEC_LOWBIT_BLOCK's widths: codes that tile a byte.
LOWBIT_VALUE_BITS = (2, 4)
# Values a bit stream is packed or unpacked in at once (bounds the bit-per-byte temporaries).
_PACK_SLICE = 1 << 20


class MagnitudeError(ValueError):
    """A finite value too large for a codec to carry: its encoding would decode to ±inf."""


def _largest_scale(levels: int) -> float:
    """The largest float32 block scale s with levels · s <= float32's max exactly (float64 holds the product
    exactly): what a block codec of codes −levels..levels writes at most and reads back finite."""
    scale = np.float32(_FLOAT32_MAX / levels)
    while float(scale) * levels > _FLOAT32_MAX:
        scale = np.nextafter(scale, np.float32(0))
    return float(scale)


# The int8 codec's largest scale: 2.6793884e36, one float32 step below float32(max / 127).
_INT8_SCALE_MAX = _largest_scale(int(_INT8_MAX))


@dataclass(frozen=True)
class WireFormat:
    """A codec and every parameter its bytes depend on: what a payload's header names and a receiver checks.

    ``block_size``: elements per block (int8, lowbit) or per chunk (sparse); ignored by fp32 and bf16.
    ``keep``: CODEC_SPARSE's entries kept per full chunk (1..block_size); 0 for the others.
    ``value_bits``: bits per value of CODEC_SPARSE (1..8) and CODEC_LOWBIT_BLOCK (2 or 4); 0 for the others.
    """

    codec: int
    block_size: int = DEFAULT_BLOCK_SIZE
    keep: int = 0
    value_bits: int = 0

    def __post_init__(self) -> None:
        if self.codec not in _KNOWN_CODECS:
            raise ValueError(f"{codec_label(self.codec)} is not supported; expected one of {sorted(_KNOWN_CODECS)}")
        if self.codec in (pb.CODEC_INT8_BLOCK, pb.CODEC_SPARSE, pb.CODEC_LOWBIT_BLOCK) and not (
            0 < self.block_size <= MAX_BLOCK_SIZE
        ):
            raise ValueError(f"{codec_label(self.codec)} needs block_size in 1..{MAX_BLOCK_SIZE}, got {self.block_size}")
        if self.codec == pb.CODEC_SPARSE:
            if not 1 <= self.keep <= self.block_size:
                raise ValueError(f"CODEC_SPARSE keeps 1..block_size = {self.block_size} entries per chunk, got {self.keep}")
            if not 1 <= self.value_bits <= 8:
                raise ValueError(f"CODEC_SPARSE needs value_bits in 1..8, got {self.value_bits}")
        elif self.codec == pb.CODEC_LOWBIT_BLOCK:
            if self.value_bits not in LOWBIT_VALUE_BITS or self.keep:
                raise ValueError(f"CODEC_LOWBIT_BLOCK needs value_bits in {LOWBIT_VALUE_BITS} and keep 0, got "
                                 f"value_bits {self.value_bits}, keep {self.keep}")
        elif self.keep or self.value_bits:
            raise ValueError(f"{codec_label(self.codec)} takes no keep or value_bits, got {self.keep}, {self.value_bits}")

    @classmethod
    def of(cls, codec: int | WireFormat, block_size: int = DEFAULT_BLOCK_SIZE) -> WireFormat:
        """`codec` itself when it is a format; else the format of a dense codec with `block_size` (the sparse and
        low-bit codecs need their other parameters: ValueError)."""
        return codec if isinstance(codec, WireFormat) else cls(int(codec), block_size)

    @classmethod
    def from_sync(cls, sync, downlink: bool = False) -> WireFormat:
        """The format of a run spec's [sync] table (`codec`, `block_size`, `sparse_chunk`, `density`, `value_bits`):
        the workers' updates', or with `downlink` the round's step's (sparse: at `step_density`)."""
        codec = codec_from_name(sync.codec)
        if codec == pb.CODEC_SPARSE:
            density = sync.step_density if downlink else sync.density
            return cls(codec, sync.sparse_chunk, sparse_keep(density, sync.sparse_chunk), sync.value_bits)
        if codec == pb.CODEC_LOWBIT_BLOCK:
            return cls(codec, sync.block_size, 0, sync.value_bits)
        return cls(codec, sync.block_size)

    @property
    def lossless(self) -> bool:
        return self.codec == pb.CODEC_FP32

    def describe(self) -> str:
        """For logs and messages, e.g. ``CODEC_SPARSE (4): 82 of 4096 per chunk, 2-bit values``."""
        if self.codec == pb.CODEC_SPARSE:
            return f"{codec_label(self.codec)}: {self.keep} of {self.block_size} per chunk, {self.value_bits}-bit values"
        if self.codec == pb.CODEC_LOWBIT_BLOCK:
            return f"{codec_label(self.codec)}: {self.value_bits}-bit values, blocks of {self.block_size}"
        if self.codec == pb.CODEC_INT8_BLOCK:
            return f"{codec_label(self.codec)}: blocks of {self.block_size}"
        return codec_label(self.codec)


def sparse_keep(density: float, chunk: int) -> int:
    """Entries a sparse chunk of `chunk` elements keeps at `density`: round(density × chunk), at least 1."""
    return min(chunk, max(1, round(density * chunk)))


def codec_label(codec: int) -> str:
    """A readable name for a codec value, e.g. ``CODEC_BF16 (2)``; unknown values too."""
    try:
        return f"{pb.Codec.Name(codec)} ({codec})"
    except ValueError:
        return f"unknown codec {codec}"


def codec_from_name(name: str) -> int:
    """The ``pb.Codec`` value for a name in ``CODEC_NAMES`` (case-insensitive)."""
    codec = CODEC_NAMES.get(name.strip().lower())
    if codec is None:
        allowed = ", ".join(repr(n) for n in CODEC_NAMES)
        raise ValueError(f"unknown codec name {name!r}; expected one of {allowed}")
    return codec


def _check_codec(codec: int | WireFormat, block_size: int) -> WireFormat:
    """The format `codec` names with `block_size` (`WireFormat.of`); ValueError for one that is not valid."""
    if not isinstance(codec, WireFormat) and codec == pb.CODEC_INT8_BLOCK and block_size <= 0:
        raise ValueError(f"CODEC_INT8_BLOCK needs block_size > 0, got {block_size}")
    return WireFormat.of(codec, block_size)


def _num_blocks(numel: int, block_size: int) -> int:
    return -(-numel // block_size)


def _sparse_counts(numel: int, fmt: WireFormat) -> tuple[int, int, int]:
    """(full chunks, elements of the short last chunk, entries it keeps) of a sparse tensor of `numel` elements."""
    full, rest = divmod(numel, fmt.block_size)
    return full, rest, -(-fmt.keep * rest // fmt.block_size)


def offset_bits(chunk: int) -> int:
    """Bits of a chunk-local offset written in full: (chunk − 1).bit_length(), at least 1."""
    return max(1, (chunk - 1).bit_length())


def high_bits(length: int, kept: int, low: int) -> int:
    """Bits of the Elias–Fano bitmap of a chunk of `length` elements keeping `kept`, offsets split at `low` bits:
    a one per entry and a zero per bucket of 2**low elements."""
    return kept + -(-length >> low)


def offset_low_bits(chunk: int, keep: int) -> int:
    """The low bits l of CODEC_SPARSE's Elias–Fano offsets for chunks of `chunk` elements keeping `keep`: the l in
    0..offset_bits(chunk) with the shortest full chunk, keep · l + high_bits(chunk, keep, l) bits (the smallest
    such l)."""
    return min(range(offset_bits(chunk) + 1), key=lambda low: (keep * low + high_bits(chunk, keep, low), low))


def _sparse_offset_sizes(numel: int, fmt: WireFormat) -> tuple[int, int, int]:
    """(low bits l, bytes of the low bits' stream, bytes of the bitmaps' stream) of a sparse tensor of `numel`
    elements."""
    full, rest, kept_last = _sparse_counts(numel, fmt)
    low = offset_low_bits(fmt.block_size, fmt.keep)
    bitmap = full * high_bits(fmt.block_size, fmt.keep, low) + (high_bits(rest, kept_last, low) if rest else 0)
    return low, -(-(full * fmt.keep + kept_last) * low // 8), -(-bitmap // 8)


def encoded_size(numel: int, codec: int | WireFormat, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes that ``encode`` produces for a tensor of ``numel`` elements."""
    fmt = _check_codec(codec, block_size)
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if fmt.codec == pb.CODEC_FP32:
        return 4 * numel
    if fmt.codec == pb.CODEC_BF16:
        return 2 * numel
    if fmt.codec == pb.CODEC_SPARSE:
        full, rest, kept_last = _sparse_counts(numel, fmt)
        kept = full * fmt.keep + kept_last
        chunks = full + (1 if rest else 0)
        _, low_bytes, high_bytes = _sparse_offset_sizes(numel, fmt)
        return 8 * chunks + low_bytes + high_bytes + -(-kept * fmt.value_bits // 8)
    if fmt.codec == pb.CODEC_LOWBIT_BLOCK:
        return 4 * _num_blocks(numel, fmt.block_size) + -(-numel * fmt.value_bits // 8)
    return 4 * _num_blocks(numel, fmt.block_size) + numel


def _flat_cpu_float32(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.float32:
        raise ValueError(f"codecs encode float32 tensors, got {tensor.dtype}")
    return tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite, from one min/max reduction (NaN propagates into both) with no
    full-size temporary."""
    if tensor.numel() == 0:
        return True
    lo, hi = torch.aminmax(tensor.detach())  # scalars
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def _encode_fp32(flat: torch.Tensor) -> bytes:
    return flat.numpy().astype("<f4", copy=False).tobytes()


def _encode_bf16(flat: torch.Tensor) -> bytes:
    bits = flat.to(torch.bfloat16).view(torch.int16)  # [numel]
    return bits.numpy().astype("<i2", copy=False).tobytes()


def _block_scales(flat: torch.Tensor, block_size: int, levels: float = _INT8_MAX) -> torch.Tensor:
    """float32 absmax / `levels` of each block, the last block possibly short."""
    numel = flat.numel()
    full = numel // block_size
    parts = []
    if full:
        lo, hi = torch.aminmax(flat[: full * block_size].view(full, block_size), dim=1)  # [full]
        parts.append(torch.maximum(hi, -lo))
    if numel > full * block_size:
        lo, hi = torch.aminmax(flat[full * block_size :])  # scalars
        parts.append(torch.maximum(hi, -lo).reshape(1))
    absmax = torch.cat(parts) if parts else flat.new_zeros(0)  # [num_blocks]
    return absmax / levels


def _quantize_into(
    values: torch.Tensor, divisor: torch.Tensor, out: torch.Tensor, levels: float = _INT8_MAX, offset: float = 0.0,
) -> None:
    """out = clamp(round(values / divisor), -levels, levels) + offset, in out's dtype; shapes broadcast.

    Element-wise, so 2-d inputs run `_QUANTIZE_ROWS` blocks at a time through one float32 buffer
    instead of a full-size temporary; every element sees the same operations.
    """
    rows = values.shape[0] if values.dim() == 2 else 0
    if rows <= _QUANTIZE_ROWS:
        q = values / divisor
        q.round_().clamp_(-levels, levels)
        out.copy_(q.add_(offset) if offset else q)
        return
    buffer = torch.empty(_QUANTIZE_ROWS, values.shape[1], dtype=torch.float32)  # [_QUANTIZE_ROWS, block_size]
    for start in range(0, rows, _QUANTIZE_ROWS):
        stop = min(start + _QUANTIZE_ROWS, rows)
        q = buffer[: stop - start]  # [rows in slice, block_size]
        torch.div(values[start:stop], divisor[start:stop], out=q)
        q.round_().clamp_(-levels, levels)
        out[start:stop].copy_(q.add_(offset) if offset else q)


def _encode_int8_block(flat: torch.Tensor, block_size: int) -> bytes:
    numel = flat.numel()
    scales = _block_scales(flat, block_size)  # [num_blocks]
    if not bool(torch.isfinite(scales).all()):
        bad = int((~torch.isfinite(scales)).sum())
        raise ValueError(f"CODEC_INT8_BLOCK cannot encode non-finite values ({bad} blocks hold NaN or Inf)")
    _refuse_overflowing_scales(flat, scales, block_size)
    num_blocks = scales.numel()
    out = torch.empty(4 * num_blocks + numel, dtype=torch.uint8)
    out.numpy()[: 4 * num_blocks].view("<f4")[:] = scales.numpy()
    q_out = out[4 * num_blocks :].view(torch.int8)  # [numel]
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))  # [num_blocks]
    full = numel // block_size
    if full:
        _quantize_into(
            flat[: full * block_size].view(full, block_size),
            divisor[:full].unsqueeze(1),
            q_out[: full * block_size].view(full, block_size),
        )
    if numel > full * block_size:
        _quantize_into(flat[full * block_size :], divisor[-1], q_out[full * block_size :])
    return out.numpy().tobytes()


def _refuse_overflowing_scales(flat: torch.Tensor, scales: torch.Tensor, block_size: int) -> None:
    """MagnitudeError naming the first block whose int8 scale (of `scales` [num_blocks]) is above `_INT8_SCALE_MAX`:
    127 × it would decode to ±inf."""
    over = scales > _INT8_SCALE_MAX  # [num_blocks]
    if not bool(over.any()):
        return
    block = int(over.nonzero()[0])
    absmax = float(flat[block * block_size: (block + 1) * block_size].abs().max())
    raise MagnitudeError(
        f"CODEC_INT8_BLOCK cannot encode magnitude {absmax:.9g} (block {block}; {int(over.sum())} such blocks): "
        f"127 × its scale {float(scales[block]):.9g} exceeds float32's max {_FLOAT32_MAX:.9g}; expected every "
        f"magnitude below float32's max (whose scale absmax / 127 rounds up)")


def _check_block_scales(scales: np.ndarray, levels: int, label: str) -> None:
    """ValueError unless every block scale [num_blocks] is finite, >= 0 and at most float32's max / `levels`."""
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        bad = int(np.count_nonzero(~(np.isfinite(scales) & (scales >= 0))))
        raise ValueError(f"{label} payload has {bad} non-finite or negative block scales")
    limit = _INT8_SCALE_MAX if levels == int(_INT8_MAX) else _largest_scale(levels)
    if scales.size and float(scales.max()) > limit:
        bad = int(np.count_nonzero(scales > limit))
        raise ValueError(f"{label} payload has {bad} block scales above {limit:.9g} (largest "
                         f"{float(scales.max()):.9g}); expected at most float32's max / {levels}, whose values "
                         f"decode finite")


def _lowbit_levels(value_bits: int) -> int:
    """Q of CODEC_LOWBIT_BLOCK: codes −Q..Q stored as 0..2Q."""
    return (1 << (value_bits - 1)) - 1


def _pack_codes(codes: np.ndarray, width: int) -> np.ndarray:
    """Codes of `width` bits (2 or 4: 8 / width to a byte, the first in the least significant bits) as bytes."""
    per_byte = 8 // width
    padded = -(-codes.size // per_byte) * per_byte
    if padded != codes.size:
        codes = np.concatenate([codes, np.zeros(padded - codes.size, dtype=np.uint8)])
    grouped = codes.reshape(-1, per_byte)  # [bytes, per_byte]
    out = grouped[:, 0].copy()  # [bytes]
    for j in range(1, per_byte):
        out |= grouped[:, j] << (width * j)
    return out


def _unpack_codes(packed: np.ndarray, count: int, width: int) -> np.ndarray:
    """`_pack_codes`'s codes back, uint8 [count]."""
    per_byte = 8 // width
    mask = (1 << width) - 1
    out = np.empty((packed.size, per_byte), dtype=np.uint8)  # [bytes, per_byte]
    for j in range(per_byte):
        np.bitwise_and(packed >> (width * j), mask, out=out[:, j])
    return out.reshape(-1)[:count]


def _encode_lowbit_block(flat: torch.Tensor, fmt: WireFormat) -> bytes:
    numel, block_size = flat.numel(), fmt.block_size
    levels = _lowbit_levels(fmt.value_bits)
    scales = _block_scales(flat, block_size, float(levels))  # [num_blocks]
    if not bool(torch.isfinite(scales).all()):
        bad = int((~torch.isfinite(scales)).sum())
        raise ValueError(f"CODEC_LOWBIT_BLOCK cannot encode non-finite values ({bad} blocks hold NaN or Inf)")
    codes = torch.empty(numel, dtype=torch.uint8)  # [numel] q + Q
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))  # [num_blocks]
    full = numel // block_size
    if full:
        _quantize_into(flat[: full * block_size].view(full, block_size), divisor[:full].unsqueeze(1),
                       codes[: full * block_size].view(full, block_size), float(levels), float(levels))
    if numel > full * block_size:
        _quantize_into(flat[full * block_size:], divisor[-1], codes[full * block_size:], float(levels), float(levels))
    packed = _pack_codes(codes.numpy(), fmt.value_bits)
    return scales.numpy().astype("<f4", copy=False).tobytes() + packed.tobytes()


def _bit_positions(start: int, count: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(byte, shift) of values start..start+count of a `width`-bit stream: value i begins at bit i·width, i.e. at
    bit `shift` of byte `byte`, and with width <= 16 ends within that byte and the next two."""
    bit = np.arange(start, start + count, dtype=np.int64) * width  # [count]
    return bit >> 3, (bit & 7).astype(np.uint32)


def _pack_bits(values: np.ndarray, width: int) -> bytes:
    """Unsigned integers below 2**width (width <= 16) as one bit stream, least significant bit first, padded with
    zero bits to a byte; `_PACK_SLICE` values at a time (a multiple of 8, so every slice ends on a byte)."""
    pieces = []
    for start in range(0, values.size, _PACK_SLICE):
        part = values[start:start + _PACK_SLICE].astype("<u2")  # [slice]
        bits = np.unpackbits(part.view(np.uint8).reshape(-1, 2), axis=1, bitorder="little")  # [slice, 16]
        pieces.append(np.packbits(bits[:, :width].reshape(-1), bitorder="little").tobytes())
    return b"".join(pieces)


def _unpack_bits(buf: memoryview, count: int, width: int, what: str) -> np.ndarray:
    """`_pack_bits`'s `count` values (uint16) from `buf`, which holds exactly their bytes; ValueError for
    non-zero padding bits (`what` names the stream). Each value is read from the three bytes it begins in."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    tail = count * width % 8
    if tail and raw.size and int(raw[-1]) >> tail:
        raise ValueError(f"{what}: the padding bits of the last byte are not zero")
    padded = np.concatenate([raw, np.zeros(2, dtype=np.uint8)])  # [bytes + 2]
    out = np.empty(count, dtype=np.uint16)  # [count]
    mask = np.uint32((1 << width) - 1)
    for start in range(0, count, _PACK_SLICE):
        stop = min(start + _PACK_SLICE, count)
        byte, shift = _bit_positions(start, stop - start, width)  # [slice] each
        word = padded[byte].astype(np.uint32)  # [slice] the three bytes each value begins in
        word |= padded[byte + 1].astype(np.uint32) << np.uint32(8)
        word |= padded[byte + 2].astype(np.uint32) << np.uint32(16)
        word >>= shift
        word &= mask
        out[start:stop] = word
    return out


def _sparse_groups(length: int, keep: int) -> int:
    """Entries per group of `_top_entries`'s two-stage selection in rows of `length` keeping `keep`: the largest
    power of two dividing `length` with at least 4 · keep groups; 1 (a plain top-k) where none above 1 fits."""
    group = 1
    while length % (2 * group) == 0 and length // (2 * group) >= 4 * keep:
        group *= 2
    return group


def _top_entries(rows: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets [r, keep] in increasing order, their values [r, keep]) of the `keep` entries of each row of
    `rows` [r, n] largest in magnitude (ties: any of the tied entries). A NaN counts as the largest magnitude.

    Where the rows split into groups (`_sparse_groups`), two stages select the same set at a fraction of a plain
    top-k's cost: row entry a · m + j belongs to group j of m (a strided view, so each group's largest magnitude is
    a maximum over `group` contiguous rows of m); the `keep` groups with the largest maxima hold every entry of the
    row's top `keep` (an entry outside them has `keep` group maxima at least as large, one per group, above it),
    so the top `keep` of those groups' `keep · group` entries is the row's.
    """
    r, n = rows.shape
    group = _sparse_groups(n, keep)
    if group == 1:
        _, offsets = torch.topk(rows.abs(), keep, dim=1, sorted=False)  # [r, keep]
    else:
        m = n // group
        strided = rows.view(r, group, m)  # entry a · m + j at [a, j]
        peak = torch.maximum(strided.amax(dim=1), strided.amin(dim=1).neg_())  # [r, m] largest magnitude per group
        _, groups = torch.topk(peak, keep, dim=1, sorted=False)  # [r, keep] the groups j kept
        candidates = torch.gather(strided, 2, groups.unsqueeze(1).expand(r, group, keep)).abs_()  # [r, group, keep]
        _, best = torch.topk(candidates.view(r, group * keep), keep, dim=1, sorted=False)  # [r, keep] a · keep + i
        offsets = torch.div(best, keep, rounding_mode="floor").mul_(m).add_(torch.gather(groups, 1, best % keep))
    offsets, _ = torch.sort(offsets, dim=1)
    return offsets, torch.gather(rows, 1, offsets)


def _encode_offsets(offsets: list[np.ndarray], lengths: list[int], low: int) -> bytes:
    """Elias–Fano code of groups of chunks (module docstring): `offsets[g]` [rows, kept] strictly increasing per
    row, of chunks of `lengths[g]` elements; every entry's `low` low bits, then every chunk's bitmap."""
    lows = np.concatenate([o.reshape(-1) for o in offsets]) & ((1 << low) - 1)  # [entries]
    bitmaps = []
    for o, length in zip(offsets, lengths):
        rows, kept = o.shape
        bitmap = np.zeros((rows, high_bits(length, kept, low)), dtype=np.uint8)  # [rows, bits]
        np.put_along_axis(bitmap, (o >> low) + np.arange(kept), 1, axis=1)
        bitmaps.append(bitmap.reshape(-1))
    return _pack_bits(lows, low) + np.packbits(np.concatenate(bitmaps), bitorder="little").tobytes()


def _encode_sparse(flat: torch.Tensor, fmt: WireFormat) -> bytes:
    numel, chunk = flat.numel(), fmt.block_size
    full, rest, kept_last = _sparse_counts(numel, fmt)
    parts = []  # (elements per chunk, offsets [chunks in part, kept], values [chunks in part, kept])
    if full:
        parts.append((chunk, *_top_entries(flat[: full * chunk].view(full, chunk), fmt.keep)))
    if rest:
        parts.append((rest, *_top_entries(flat[full * chunk:].view(1, rest), kept_last)))
    if not parts:
        return b""
    levels = 1 << (fmt.value_bits - 1)
    scales, codes = [], []
    for _, _, v in parts:
        magnitude = v.abs()  # [rows, kept]
        lo, hi = torch.aminmax(magnitude, dim=1)  # [rows] each
        # A non-finite entry (NaN counts as the largest magnitude) is always kept, so the kept values show it.
        if not bool(torch.isfinite(hi).all()):
            bad = int((~torch.isfinite(flat)).sum())
            raise ValueError(f"CODEC_SPARSE cannot encode non-finite values ({bad} of {numel})")
        width = (hi - lo) / levels  # [rows]
        divisor = torch.where(width > 0, width, torch.ones_like(width))  # [rows]
        q = magnitude.sub_(lo[:, None]).div_(divisor[:, None]).floor_().clamp_(0, levels - 1)  # [rows, kept]
        codes.append((q.to(torch.uint8) | ((v < 0).to(torch.uint8) << (fmt.value_bits - 1))).reshape(-1))
        scales.append(torch.stack([lo, hi], dim=1))  # [rows, 2]
    return (torch.cat(scales).numpy().astype("<f4", copy=False).tobytes()
            + _encode_offsets([o.numpy() for _, o, _ in parts], [n for n, _, _ in parts],
                              offset_low_bits(chunk, fmt.keep))
            + _pack_bits(torch.cat(codes).numpy(), fmt.value_bits))


def encode(tensor: torch.Tensor, codec: int | WireFormat, block_size: int = DEFAULT_BLOCK_SIZE) -> bytes:
    """Encode a float32 tensor of any shape (moved to CPU, made contiguous) with ``codec`` (a `WireFormat`, or a
    dense codec with ``block_size``)."""
    fmt = _check_codec(codec, block_size)
    flat = _flat_cpu_float32(tensor)  # [numel]
    if fmt.codec == pb.CODEC_FP32:
        return _encode_fp32(flat)
    if fmt.codec == pb.CODEC_BF16:
        return _encode_bf16(flat)
    if fmt.codec == pb.CODEC_SPARSE:
        return _encode_sparse(flat, fmt)
    if fmt.codec == pb.CODEC_LOWBIT_BLOCK:
        return _encode_lowbit_block(flat, fmt)
    return _encode_int8_block(flat, fmt.block_size)


def _decode_fp32(buf: memoryview, numel: int, into: np.ndarray | None = None) -> np.ndarray:
    values = np.frombuffer(buf, dtype="<f4", count=numel)  # [numel]
    if into is None:
        return values.astype(np.float32, copy=True)
    np.copyto(into, values)
    return into


def _decode_bf16(buf: memoryview, numel: int, into: np.ndarray | None = None) -> np.ndarray:
    halves = np.frombuffer(buf, dtype="<u2", count=numel)  # [numel]
    if into is None:
        bits = halves.astype(np.uint32)  # [numel]
    else:
        bits = into.view(np.uint32)  # [numel]
        np.copyto(bits, halves)
    bits <<= 16
    return bits.view(np.float32)


def _decode_int8_block(buf: memoryview, numel: int, block_size: int, into: np.ndarray | None = None) -> np.ndarray:
    num_blocks = _num_blocks(numel, block_size)
    scales = np.frombuffer(buf, dtype="<f4", count=num_blocks).astype(np.float32)  # [num_blocks]
    _check_block_scales(scales, int(_INT8_MAX), "CODEC_INT8_BLOCK")
    q = np.frombuffer(buf, dtype=np.int8, count=numel, offset=4 * num_blocks)  # [numel]
    if numel and int(q.min()) < -_INT8_MAX:
        bad = int(np.count_nonzero(q < -_INT8_MAX))
        raise ValueError(f"CODEC_INT8_BLOCK payload has {bad} codes of -128 (0x80); expected codes in -127..127")
    if into is None:
        out = q.astype(np.float32)  # [numel]
    else:
        out = into
        np.copyto(out, q)
    full = numel // block_size
    if full:
        blocks = out[: full * block_size].reshape(full, block_size)  # [full, block_size], a view
        blocks *= scales[:full, None]
    if numel > full * block_size:
        out[full * block_size :] *= scales[-1]
    return out


def _decode_lowbit_block(buf: memoryview, numel: int, fmt: WireFormat, into: np.ndarray | None = None) -> np.ndarray:
    num_blocks = _num_blocks(numel, fmt.block_size)
    scales = np.frombuffer(buf, dtype="<f4", count=num_blocks).astype(np.float32)  # [num_blocks]
    levels = _lowbit_levels(fmt.value_bits)
    _check_block_scales(scales, levels, "CODEC_LOWBIT_BLOCK")
    packed = np.frombuffer(buf, dtype=np.uint8, offset=4 * num_blocks)
    tail = numel * fmt.value_bits % 8
    if tail and packed.size and int(packed[-1]) >> tail:
        raise ValueError("CODEC_LOWBIT_BLOCK payload: the padding bits of the last byte are not zero")
    codes = _unpack_codes(packed, numel, fmt.value_bits)  # [numel] q + Q
    if numel and int(codes.max()) > 2 * levels:
        bad = int(np.count_nonzero(codes > 2 * levels))
        raise ValueError(f"CODEC_LOWBIT_BLOCK payload has {bad} codes above {2 * levels} (values beyond ±{levels})")
    out = np.empty(numel, dtype=np.float32) if into is None else into  # [numel]
    np.subtract(codes, np.float32(levels), out=out, casting="unsafe")
    full = numel // fmt.block_size
    if full:
        out[: full * fmt.block_size].reshape(full, fmt.block_size)[:] *= scales[:full, None]
    if numel > full * fmt.block_size:
        out[full * fmt.block_size:] *= scales[-1]
    return out


def _check_sparse_offsets(offsets: np.ndarray, chunks: int, kept: int, length: int, first: int) -> None:
    """Offsets [chunks, kept] of chunks of `length` elements: strictly increasing per chunk and below `length`
    (`first`: the index of the first of these chunks, for the message)."""
    if not offsets.size:
        return
    if kept > 1:
        steps = np.diff(offsets.astype(np.int32), axis=1)  # [chunks, kept - 1]
        if not (steps > 0).all():
            row = int(np.nonzero((steps <= 0).any(axis=1))[0][0])
            raise ValueError(f"CODEC_SPARSE payload: chunk {first + row} has duplicate or unordered offsets "
                             f"{offsets[row].tolist()[:8]}...; expected strictly increasing")
    top = offsets[:, -1]  # [chunks] the largest of each chunk
    if int(top.max()) >= length:
        row = int(np.nonzero(top >= length)[0][0])
        raise ValueError(f"CODEC_SPARSE payload: chunk {first + row} has offset {int(top[row])}, out of its "
                         f"{length} elements")


def _decode_offsets(lows: memoryview, bitmaps: memoryview, groups: list[tuple[int, int, int]], low: int) -> np.ndarray:
    """`_encode_offsets`'s chunk-local offsets, int64 [entries] (their order and range are the caller's to check).
    `groups`: (chunks, entries per chunk, elements per chunk) in order. ValueError for a chunk whose bitmap holds
    another number of ones than its entries, or non-zero padding bits."""
    entries = sum(rows * kept for rows, kept, _ in groups)
    low_parts = (_unpack_bits(lows, entries, low, "CODEC_SPARSE offsets' low bits").astype(np.int64) if low
                 else np.zeros(entries, dtype=np.int64))  # [entries]
    total = sum(rows * high_bits(length, kept, low) for rows, kept, length in groups)
    raw = np.frombuffer(bitmaps, dtype=np.uint8)
    if total % 8 and raw.size and int(raw[-1]) >> (total % 8):
        raise ValueError("CODEC_SPARSE offsets' bitmaps: the padding bits of the last byte are not zero")
    bitmap = np.unpackbits(raw, count=total, bitorder="little")  # [total]
    high_parts, start, first = [], 0, 0
    for rows, kept, length in groups:
        width = high_bits(length, kept, low)
        ones = np.flatnonzero(bitmap[start:start + rows * width])  # [ones] positions in these chunks' bitmaps
        row = ones // width  # [ones] the chunk of each
        if ones.size != rows * kept or (row.reshape(rows, kept) != np.arange(rows)[:, None]).any():
            counts = np.bincount(row, minlength=rows)  # [rows]
            bad = int(np.nonzero(counts != kept)[0][0])
            raise ValueError(f"CODEC_SPARSE payload: chunk {first + bad} has {int(counts[bad])} ones in its offsets' "
                             f"bitmap; expected {kept}, one per entry")
        column = ones.reshape(rows, kept) - row.reshape(rows, kept) * width  # [rows, kept]
        high_parts.append((column - np.arange(kept)).reshape(-1))  # the i-th one of a chunk is at h_i + i
        start, first = start + rows * width, first + rows
    high = np.concatenate(high_parts) if high_parts else np.zeros(0, dtype=np.int64)  # [entries]
    return (high.astype(np.int64) << low) | low_parts


def _decode_sparse(buf: memoryview, numel: int, fmt: WireFormat, into: np.ndarray | None = None) -> np.ndarray:
    chunk, bits = fmt.block_size, fmt.value_bits
    full, rest, kept_last = _sparse_counts(numel, fmt)
    chunks, kept = full + (1 if rest else 0), full * fmt.keep + kept_last
    scales = np.frombuffer(buf, dtype="<f4", count=2 * chunks).astype(np.float32).reshape(chunks, 2)  # [chunks, 2]
    lo, hi = scales[:, 0], scales[:, 1]  # [chunks] each
    good = np.isfinite(lo) & np.isfinite(hi) & (lo >= 0) & (lo <= hi)
    if not good.all():
        row = int(np.nonzero(~good)[0][0])
        raise ValueError(f"CODEC_SPARSE payload has {int(np.count_nonzero(~good))} chunks with bad scales (chunk {row}: "
                         f"lo {lo[row]!r}, hi {hi[row]!r}); expected finite 0 <= lo <= hi")
    low, low_bytes, bitmap_bytes = _sparse_offset_sizes(numel, fmt)
    lows_at, bitmaps_at, values_at = 8 * chunks, 8 * chunks + low_bytes, 8 * chunks + low_bytes + bitmap_bytes
    groups = [(full, fmt.keep, chunk)] * (1 if full else 0) + [(1, kept_last, rest)] * (1 if rest else 0)
    offsets = _decode_offsets(buf[lows_at:bitmaps_at], buf[bitmaps_at:values_at], groups, low)  # [kept]
    codes = _unpack_bits(buf[values_at:], kept, bits, "CODEC_SPARSE values")  # [kept]
    _check_sparse_offsets(offsets[: full * fmt.keep].reshape(full, fmt.keep), full, fmt.keep, chunk, 0)
    _check_sparse_offsets(offsets[full * fmt.keep:].reshape(-1, kept_last) if rest else offsets[:0].reshape(0, 1),
                          1 if rest else 0, kept_last, rest, full)
    levels = 1 << (bits - 1)
    row_of = np.concatenate([np.repeat(np.arange(full, dtype=np.int64), fmt.keep),
                             np.full(kept_last, full, dtype=np.int64)])  # [kept] the chunk of each entry
    width = (hi - lo) / np.float32(levels)  # [chunks]
    magnitude = (codes & (levels - 1)).astype(np.float32)  # [kept]
    magnitude += np.float32(0.5)
    magnitude *= width[row_of]
    magnitude += lo[row_of]
    values = np.where(codes >> (bits - 1) != 0, -magnitude, magnitude)  # [kept]
    out = np.zeros(numel, dtype=np.float32) if into is None else into  # [numel]
    if into is not None:
        out.fill(0.0)
    out[row_of * chunk + offsets] = values
    return out


def decode(
    data: bytes | bytearray | memoryview, codec: int | WireFormat, shape: tuple[int, ...],
    block_size: int = DEFAULT_BLOCK_SIZE, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``encode``'s bytes into a fresh float32 tensor of ``shape``, or into ``out`` (a contiguous float32
    CPU tensor of as many elements, returned viewed as ``shape``): the same values without fresh memory.
    ValueError, with nothing written into ``out``, for bytes the codec refuses (module docstring)."""
    fmt = _check_codec(codec, block_size)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape must have non-negative dimensions, got {shape}")
    numel = math.prod(shape)
    buf = memoryview(data).cast("B")
    expected = encoded_size(numel, fmt)
    if buf.nbytes != expected:
        raise ValueError(
            f"{codec_label(fmt.codec)} payload for shape {shape}: expected {expected} bytes, got {buf.nbytes}"
        )
    into = None
    if out is not None:
        if out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous() or out.numel() != numel:
            raise ValueError(f"out must be a contiguous float32 CPU tensor of {numel} elements, got {out.dtype} "
                             f"{tuple(out.shape)} on {out.device}")
        into = out.view(-1).numpy()  # [numel]
    if fmt.codec == pb.CODEC_FP32:
        values = _decode_fp32(buf, numel, into)
    elif fmt.codec == pb.CODEC_BF16:
        values = _decode_bf16(buf, numel, into)
    elif fmt.codec == pb.CODEC_SPARSE:
        values = _decode_sparse(buf, numel, fmt, into)
    elif fmt.codec == pb.CODEC_LOWBIT_BLOCK:
        values = _decode_lowbit_block(buf, numel, fmt, into)
    else:
        values = _decode_int8_block(buf, numel, fmt.block_size, into)
    return torch.from_numpy(values).reshape(shape) if out is None else out.view(shape)


def _combine(delta: torch.Tensor, residual: torch.Tensor | None, consume: bool, decay: float = 1.0) -> torch.Tensor:
    """``delta + decay · residual`` (``delta`` without one) in a fresh tensor, or in ``delta``'s own buffer when
    the caller gave it up (``consume``, contiguous); the same values either way (with decay 1, a plain sum)."""
    if residual is None:
        return delta if consume and delta.is_contiguous() else delta.clone()
    if not (consume and delta.is_contiguous()):
        return delta + residual if decay == 1.0 else torch.add(delta, residual, alpha=decay)
    return delta.add_(residual) if decay == 1.0 else delta.add_(residual, alpha=decay)


class ErrorFeedback:
    """Per-tensor residuals that carry a lossy codec's error (and a sparse codec's unsent entries) into the next round.

    Each round sends ``c = delta + β · residual`` and keeps ``residual = c - decode(encode(c))``,
    exactly what the receiver did not get. With ``decay`` β = 1 (the default), summed over rounds, what the
    receiver decoded equals the sum of the true deltas minus the current residual; with β < 1 the unsent part
    of each round fades by β per round (SparseLoCo's accumulator, module docstring).

    Threads: one owner at a time (a worker's loop; the coordinator's closing thread), no lock.
    """

    def __init__(self, decay: float = 1.0) -> None:
        if not (math.isfinite(decay) and 0.0 <= decay <= 1.0):
            raise ValueError(f"error feedback decay = {decay!r}: expected a number in [0, 1]")
        self.decay = decay
        self._residuals: dict[str, torch.Tensor] = {}
        # The scale the last `compress` sent its update at (1.0: whole; below: capped by its max_norm).
        self.last_scale = 1.0

    def compress(
        self, deltas: dict[str, torch.Tensor], codec: int | WireFormat, block_size: int = DEFAULT_BLOCK_SIZE,
        max_norm: float = math.inf,
    ) -> dict[str, bytes]:
        """Encode ``delta + β · residual`` per name and update the residuals; same order as ``deltas``.

        With ``max_norm`` what the receiver decodes has a global L2 norm of at most ``max_norm``: when the update
        decodes above it, ``c`` is scaled by s < 1 before encoding (every tensor alike) and the residual keeps
        ``c − decode(encode(s·c))``, so what is not sent now is sent later, as a sparse codec's unsent entries are.
        The residuals change only if every tensor encodes; a non-finite input raises
        ValueError and leaves them as they were.
        """
        if not max_norm > 0:
            raise ValueError(f"error feedback max_norm = {max_norm!r}: expected a number > 0")
        self.last_scale = 1.0
        if max_norm == math.inf:
            return self.compress_decoded(deltas, codec, block_size)[0]
        before = self.snapshot()
        scale = 1.0
        for _ in range(MAX_NORM_ATTEMPTS):
            payloads, received = self.compress_decoded(deltas, codec, block_size, scale=scale)
            # float32 norms per tensor summed in float64: no full-size temporaries.
            norm = math.sqrt(sum(float(torch.linalg.vector_norm(r)) ** 2 for r in received.values()))
            if norm <= max_norm:
                self.last_scale = scale
                return payloads
            self.restore(before)
            scale *= max_norm / norm * NORM_SHRINK
        raise AssertionError(f"the update still decodes to norm {norm:.6g} > {max_norm:.6g} at scale {scale:.3g}")

    def compress_decoded(
        self, deltas: dict[str, torch.Tensor], codec: int | WireFormat, block_size: int = DEFAULT_BLOCK_SIZE, *,
        consume: bool = False, into: Mapping[str, torch.Tensor] | None = None, scale: float = 1.0,
    ) -> tuple[dict[str, bytes], dict[str, torch.Tensor]]:
        """``compress``, and also what the receiver decodes from each payload (float32, same shapes).

        The decoded tensors are the ones the residual was computed from, so a caller needs
        not decode the payloads again; they are fresh tensors the caller may keep or overwrite.
        With ``consume`` the caller gives up ``deltas``: their buffers become the new residuals. A lossy
        codec decodes into ``into[name]`` where one is given (a float32 buffer of the same shape the caller
        gave up) instead of a fresh tensor. With ``scale`` < 1 what is encoded is ``scale · c`` (`compress`'s
        norm cap); the residual is ``c`` less what is decoded either way.
        """
        fmt = _check_codec(codec, block_size)
        payloads: dict[str, bytes] = {}
        received: dict[str, torch.Tensor] = {}
        updated: dict[str, torch.Tensor] = {}
        for name, delta in deltas.items():
            payloads[name], received[name], updated[name] = self._compress_one(
                name, delta, fmt, consume, None if into is None else into.get(name), scale
            )
        self._residuals.update(updated)
        return payloads, received

    def _compress_one(
        self, name: str, delta: torch.Tensor, fmt: WireFormat, consume: bool = False, into: torch.Tensor | None = None,
        scale: float = 1.0,
    ) -> tuple[bytes, torch.Tensor, torch.Tensor]:
        """(payload, decoded payload, new residual) of one tensor, encoding ``scale`` × the combined tensor; the
        residual reuses the combined buffer."""
        if delta.dtype != torch.float32:
            raise ValueError(f"delta {name!r}: expected float32, got {delta.dtype}")
        delta = delta.detach().to("cpu")
        residual = self._residuals.get(name)
        if residual is not None and residual.shape != delta.shape:
            raise ValueError(
                f"delta {name!r}: shape {tuple(delta.shape)} differs from its residual's {tuple(residual.shape)}"
            )
        combined = _combine(delta, residual, consume, self.decay)  # [*shape]
        if not all_finite(combined):
            bad = int((~torch.isfinite(combined)).sum())
            raise ValueError(f"delta {name!r} has {bad} non-finite values")
        sent = combined if scale == 1.0 else combined * scale  # [*shape]
        try:
            payload = encode(sent, fmt)
        except MagnitudeError as error:  # int8 refuses float32's largest magnitude (127 × scale overflows)
            raise ValueError(f"delta {name!r}: {codec_label(fmt.codec)} cannot carry its largest magnitude "
                             f"{float(combined.abs().max()):.6g} ({error})") from error
        if fmt.lossless:
            return payload, sent, torch.zeros_like(combined) if sent is combined else combined.sub_(sent)
        usable = into is not None and into.shape == combined.shape and into.dtype == torch.float32 and into.is_contiguous()
        received = decode(payload, fmt, tuple(combined.shape), out=into if usable else None)  # [*shape]
        if not all_finite(received):  # bf16 rounds a finite float32 from 3.3961e38 up to ±inf
            raise ValueError(f"delta {name!r}: {codec_label(fmt.codec)} cannot carry its largest magnitude "
                             f"{float(combined.abs().max()):.6g} (it encodes as a non-finite value)")
        return payload, received, combined.sub_(received)

    def residual(self, name: str) -> torch.Tensor | None:
        """A copy of the residual kept for ``name``; None before its first round."""
        residual = self._residuals.get(name)
        return None if residual is None else residual.clone()

    def residual_norm(self) -> float:
        """Global L2 norm over all residuals, accumulated in float64."""
        total = sum(float(torch.sum(torch.square(r.to(torch.float64)))) for r in self._residuals.values())
        return math.sqrt(total)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """The residuals as they are now, for `restore` when a sent update was not applied.

        compress() replaces residual tensors and never mutates them, so a shallow copy suffices.
        """
        return dict(self._residuals)

    def restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        """Go back to the residuals of a `snapshot`."""
        self._residuals = dict(snapshot)

    def reset(self) -> None:
        """Forget all residuals (they start again from zero)."""
        self._residuals.clear()
