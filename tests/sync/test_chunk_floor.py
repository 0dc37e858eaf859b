"""The chunk floor of sync/tensor_stream.py: a payload of more than MAX_SMALL_CHUNKS chunks uses chunks of at least
MIN_CHUNK_SIZE, refused by the sender and, before any chunk is read, by the receiver."""

from __future__ import annotations

import zlib

import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync.tensor_stream import (
    MAX_CHUNK_SIZE,
    MAX_SMALL_CHUNKS,
    MIN_CHUNK_SIZE,
    PayloadError,
    PayloadReceiver,
    build_payload,
    chunk_floor_problem,
)


def test_the_floor_allows_large_chunks_or_few_chunks_only() -> None:
    assert chunk_floor_problem(MAX_CHUNK_SIZE, 10 * MAX_CHUNK_SIZE) is None
    assert chunk_floor_problem(MIN_CHUNK_SIZE, 1000 * MIN_CHUNK_SIZE) is None
    assert chunk_floor_problem(100, 100 * MAX_SMALL_CHUNKS) is None
    problem = chunk_floor_problem(1, 100_736)
    assert problem is not None and "chunk_size is 1: 100736 bytes in 100736 chunks" in problem
    assert f"at least {MIN_CHUNK_SIZE}" in problem


def test_honest_payloads_use_one_mib_chunks_and_tiny_chunks_are_refused_by_the_sender() -> None:
    tensors = {"w": torch.randn(40_000)}  # 160 KB in fp32
    header, chunks = build_payload(tensors, codec=pb.CODEC_FP32, run_id="r", version=1)
    assert header.chunk_size == MAX_CHUNK_SIZE and len(chunks) == 1
    with pytest.raises(ValueError, match="chunk_size is 1000: 160000 bytes in 160 chunks"):
        build_payload(tensors, codec=pb.CODEC_FP32, run_id="r", version=1, chunk_size=1000)


def test_a_header_asking_for_tiny_chunks_is_refused_before_any_chunk() -> None:
    tensors = {"w": torch.randn(40_000)}
    header, chunks = build_payload(tensors, codec=pb.CODEC_FP32, run_id="r", version=1)
    blob = chunks[0].data
    header.chunk_size = 16
    del header.chunk_crc32[:]
    header.chunk_crc32.extend(zlib.crc32(blob[i:i + 16]) for i in range(0, len(blob), 16))
    with pytest.raises(PayloadError, match="header chunk_size is 16: 160000 bytes in 10000 chunks"):
        PayloadReceiver(header, expected={"w": (40_000,)})
