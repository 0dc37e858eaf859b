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
    """Where the parts of a sparse tensor's bytes are: chunks, entries, the offsets' and the values' first byte."""

    chunks: int
    kept: int
    rest: int
    offsets_at: int
    values_at: int
    width: int

    @classmethod
    def of(cls, fmt: codec.WireFormat, numel: int) -> SparseLayout:
        full, rest = divmod(numel, fmt.block_size)
        kept = full * fmt.keep + -(-fmt.keep * rest // fmt.block_size)
        chunks = full + (rest > 0)
        width = codec.offset_bits(fmt.block_size)
        return cls(chunks, kept, rest, 8 * chunks, 8 * chunks + math.ceil(kept * width / 8), width)


def read_offsets(data: bytes, layout: SparseLayout) -> list[int]:
    bits = np.unpackbits(np.frombuffer(data[layout.offsets_at:layout.values_at], dtype=np.uint8), bitorder="little")
    weights = 1 << np.arange(layout.width)
    return [int(bits[i * layout.width:(i + 1) * layout.width] @ weights) for i in range(layout.kept)]


def write_offsets(data: bytes, layout: SparseLayout, offsets: list[int]) -> bytes:
    bits = np.array([(value >> j) & 1 for value in offsets for j in range(layout.width)], dtype=np.uint8)
    packed = np.packbits(bits, bitorder="little").tobytes()
    return data[:layout.offsets_at] + packed + data[layout.values_at:]


def malformed(fmt: codec.WireFormat, numel: int) -> list[tuple[str, Corrupt, str]]:
    """(name, corruption, message fragment) for a tensor of `numel` elements in `fmt`: needs a chunk size that is not
    a power of two, at least two full chunks and a short last chunk, and values whose bits leave padding."""
    layout = SparseLayout.of(fmt, numel)
    assert fmt.block_size & (fmt.block_size - 1) and layout.rest and layout.chunks >= 3
    assert (layout.kept * fmt.value_bits) % 8, "the values' last byte must hold padding bits"

    def offsets(change: Callable[[list[int]], None]) -> Corrupt:
        def corrupt(data: bytes) -> bytes:
            values = read_offsets(data, layout)
            change(values)
            return write_offsets(data, layout, values)
        return corrupt

    def scale(index: int, value: float) -> Corrupt:
        def corrupt(data: bytes) -> bytes:
            out = bytearray(data)
            struct.pack_into("<f", out, 4 * index, value)
            return bytes(out)
        return corrupt

    def padding(data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] | 0x80])

    outside = (1 << layout.width) - 1  # >= block_size: not a power of two
    last = layout.kept - 1
    return [
        ("offset out of the chunk", offsets(lambda v: v.__setitem__(fmt.keep - 1, outside)),
         f"out of its {fmt.block_size} elements"),
        ("offset out of the short last chunk", offsets(lambda v: v.__setitem__(last, layout.rest)),
         f"out of its {layout.rest} elements"),
        ("duplicate offset", offsets(lambda v: v.__setitem__(1, v[0])), "duplicate or unordered"),
        ("unordered offsets", offsets(lambda v: v.__setitem__(slice(fmt.keep, fmt.keep + 2), [v[fmt.keep + 1], v[fmt.keep]])),
         "duplicate or unordered"),
        ("NaN scale", scale(1, math.nan), "bad scales"),
        ("infinite scale", scale(3, math.inf), "bad scales"),
        ("negative scale", scale(0, -1.0), "bad scales"),
        ("lo above hi", scale(0, 1e30), "bad scales"),
        ("non-zero padding", padding, "padding bits"),
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
