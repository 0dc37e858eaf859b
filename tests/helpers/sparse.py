"""Malformed CODEC_SPARSE payloads (issue #28): each corruption of a valid tensor's bytes, for the codec's tests and the
wire's. A corruption takes the tensor's encoded bytes and returns bad ones; its fragment is in the refusal. And a
sparse run's members on the real wire: joined clients, honest updates and sparse pushes."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec, tensor_stream

Corrupt = Callable[[bytes], bytes]


@dataclass(frozen=True)
class SparseLayout:
    """Where the parts of a sparse tensor's bytes are (sync/codec.py's module docstring), written out here on its
    own: the chunks' (elements, entries), the offsets' low bits `low`, and the first byte of the low bits, the
    bitmaps and the values."""

    chunks: list[tuple[int, int]]
    low: int
    lows_at: int
    bitmaps_at: int
    values_at: int

    @classmethod
    def of(cls, fmt: codec.WireFormat, numel: int) -> SparseLayout:
        full, rest = divmod(numel, fmt.block_size)
        chunks = [(fmt.block_size, fmt.keep)] * full + ([(rest, -(-fmt.keep * rest // fmt.block_size))] if rest else [])
        low = min(range(17), key=lambda b: (fmt.keep * b + math.ceil(fmt.block_size / 2**b), b))
        kept = sum(k for _, k in chunks)
        bitmaps = sum(k + math.ceil(n / 2**low) for n, k in chunks)
        lows_at = 8 * len(chunks)
        bitmaps_at = lows_at + math.ceil(kept * low / 8)
        return cls(chunks, low, lows_at, bitmaps_at, bitmaps_at + math.ceil(bitmaps / 8))

    @property
    def rest(self) -> int:
        """Elements of the short last chunk (the layouts here have one)."""
        return self.chunks[-1][0]

    def bitmap_widths(self) -> list[int]:
        return [k + math.ceil(n / 2**self.low) for n, k in self.chunks]


def _bits(data: bytes, start: int, stop: int) -> list[int]:
    return np.unpackbits(np.frombuffer(data[start:stop], dtype=np.uint8), bitorder="little").tolist()


def _packed(bits: list[int]) -> bytes:
    return np.packbits(np.array(bits, dtype=np.uint8), bitorder="little").tobytes()


def read_offsets(data: bytes, layout: SparseLayout) -> list[int]:
    """Every entry's chunk-local offset, bit by bit: low bits, then the i-th one of a chunk's bitmap at h_i + i."""
    lows, bitmap = _bits(data, layout.lows_at, layout.bitmaps_at), _bits(data, layout.bitmaps_at, layout.values_at)
    offsets, at = [], 0
    for width in layout.bitmap_widths():
        ones = [j for j in range(width) if bitmap[at + j]]
        offsets += [(one - i) << layout.low for i, one in enumerate(ones)]
        at += width
    return [offset | sum(lows[e * layout.low + j] << j for j in range(layout.low)) for e, offset in enumerate(offsets)]


def write_offsets(data: bytes, layout: SparseLayout, offsets: list[int]) -> bytes:
    """`data` with these offsets (any values whose high parts h_i fit each chunk's bitmap in order)."""
    lows = [(value >> j) & 1 for value in offsets for j in range(layout.low)]
    bitmap, entry = [], 0
    for (_, kept), width in zip(layout.chunks, layout.bitmap_widths()):
        bits = [0] * width
        for i in range(kept):
            position = (offsets[entry] >> layout.low) + i
            assert position < width and not bits[position], "this corruption has no Elias–Fano code"
            bits[position], entry = 1, entry + 1
        bitmap += bits
    return (data[:layout.lows_at] + _packed(lows)[:layout.bitmaps_at - layout.lows_at] + _packed(bitmap)
            + data[layout.values_at:])


def flip_bitmap_bit(data: bytes, layout: SparseLayout, chunk: int, want: int) -> bytes:
    """`data` with the first bit of chunk `chunk`'s bitmap that is not `want` set to `want` (one more or one fewer)."""
    bitmap = _bits(data, layout.bitmaps_at, layout.values_at)
    at = sum(layout.bitmap_widths()[:chunk])
    bitmap[bitmap.index(1 - want, at)] = want
    return data[:layout.bitmaps_at] + _packed(bitmap) + data[layout.values_at:]


def malformed(fmt: codec.WireFormat, numel: int) -> list[tuple[str, Corrupt, str]]:
    """(name, corruption, message fragment) for a tensor of `numel` elements in `fmt`: needs a chunk size that is not
    a power of two, at least two full chunks and a short last chunk, offsets split with low bits, and values whose
    bits leave padding."""
    layout = SparseLayout.of(fmt, numel)
    assert fmt.block_size & (fmt.block_size - 1) and layout.rest < fmt.block_size and len(layout.chunks) >= 3
    assert layout.low >= 1 and (sum(k for _, k in layout.chunks) * fmt.value_bits) % 8, "needs low bits and padding"

    def offsets(change: Callable[[list[int]], None]) -> Corrupt:
        def corrupt(data: bytes) -> bytes:
            values = read_offsets(data, layout)
            change(values)
            return write_offsets(data, layout, values)
        return corrupt

    def unordered(values: list[int]) -> None:
        """Chunk 1's first two entries in one bucket of 2**low, the first above the second."""
        high = values[fmt.keep + 1] >> layout.low << layout.low
        values[fmt.keep:fmt.keep + 2] = [high | ((1 << layout.low) - 1), high]

    def scale(index: int, value: float) -> Corrupt:
        def corrupt(data: bytes) -> bytes:
            out = bytearray(data)
            struct.pack_into("<f", out, 4 * index, value)
            return bytes(out)
        return corrupt

    def padding(data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] | 0x80])

    def low_bits_padding(data: bytes) -> bytes:
        at = layout.bitmaps_at - 1
        return data[:at] + bytes([data[at] | 0x80]) + data[at + 1:]

    def bitmaps_padding(data: bytes) -> bytes:
        at = layout.values_at - 1
        return data[:at] + bytes([data[at] | 0x80]) + data[at + 1:]

    # The largest high part chunk 0's bitmap holds for its last entry: an offset at or past the chunk's end.
    outside = math.ceil(fmt.block_size / 2**layout.low) << layout.low
    last = sum(k for _, k in layout.chunks) - 1
    return [
        ("offset out of the chunk", offsets(lambda v: v.__setitem__(fmt.keep - 1, outside)),
         f"out of its {fmt.block_size} elements"),
        ("offset out of the short last chunk", offsets(lambda v: v.__setitem__(last, layout.rest)),
         f"out of its {layout.rest} elements"),
        ("duplicate offset", offsets(lambda v: v.__setitem__(1, v[0])), "duplicate or unordered"),
        ("unordered offsets", offsets(unordered), "duplicate or unordered"),
        ("a one too many in a bitmap", lambda data: flip_bitmap_bit(data, layout, 1, 1),
         f"chunk 1 has {fmt.keep + 1} ones in its offsets' bitmap; expected {fmt.keep}"),
        ("a one missing from a bitmap", lambda data: flip_bitmap_bit(data, layout, 0, 0),
         f"chunk 0 has {fmt.keep - 1} ones in its offsets' bitmap; expected {fmt.keep}"),
        ("NaN scale", scale(1, math.nan), "bad scales"),
        ("infinite scale", scale(3, math.inf), "bad scales"),
        ("negative scale", scale(0, -1.0), "bad scales"),
        ("lo above hi", scale(0, 1e30), "bad scales"),
        ("non-zero padding", padding, "values: the padding bits"),
        *([("non-zero padding of the low bits", low_bits_padding, "low bits: the padding bits")]
          if (last + 1) * layout.low % 8 else []),
        *([("non-zero padding of the bitmaps", bitmaps_padding, "bitmaps: the padding bits")]
          if sum(layout.bitmap_widths()) % 8 else []),
    ]


# ---- a sparse run on the real wire (tests/coordinator/test_sparse_wire.py, tests/observe/test_traffic_views.py) ----

SPARSE = {"codec": "sparse", "sparse_chunk": 100, "density": 0.05, "value_bits": 2}
FORMAT = codec.WireFormat(pb.CODEC_SPARSE, 100, 5, 2)
TARGET = "embed.weight"  # 8192 elements: 81 chunks of 100 and one of 92


def honest_deltas(shapes: dict[str, tuple[int, ...]], index: int) -> dict[str, torch.Tensor]:
    """Updates that share a direction: g + noise, g the same for every worker, noise per worker."""
    common = torch.Generator().manual_seed(100)
    own = torch.Generator().manual_seed(200 + index)
    return {name: 1e-3 * torch.randn(shape, generator=common) + 4e-4 * torch.randn(shape, generator=own)
            for name, shape in shapes.items()}


def sparse_push(client, member, deltas: dict[str, torch.Tensor], *, version: int = 0, encoded=None, corrupt=None):
    """Push `deltas` in the run's sparse format (or `encoded` bytes), with the header or chunks changed by `corrupt`."""
    encoded = encoded or codec.ErrorFeedback().compress(deltas, FORMAT)
    header, chunks = tensor_stream.build_payload(deltas, codec=FORMAT, run_id=member.run_id, version=version,
                                                 encoded=encoded)
    if corrupt:
        corrupt(header, chunks)
    meta = pb.UpdateMeta(worker_id=member.worker_id, worker_secret=member.worker_secret, base_version=version,
                         tokens=128, inner_steps=1)
    return client.push(meta, header, chunks)


def joined(local, names: list[str]) -> tuple[Any, list[Any], dict[str, torch.Tensor]]:
    """A client, members that pulled version 0, and θ_0."""
    client = local.client()
    members = []
    theta = None
    for name in names:
        member = client.join(name, "cpu", 1)
        _, theta = client.pull(member, member.run_id)
        members.append(member)
    return client, members, theta
