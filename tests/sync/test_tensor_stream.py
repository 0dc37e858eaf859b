"""Tests for rcswarm.sync.tensor_stream: chunked payloads, their validation and helpers."""

from __future__ import annotations

import hashlib
import math
import zlib

import pytest
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync import codec
from rcswarm.sync.tensor_stream import (
    MAX_CHUNK_SIZE,
    PayloadError,
    PayloadReceiver,
    build_payload,
    check_finite,
    global_norm,
    params_sha256,
)

RUN_ID = "run-test"
VERSION = 7


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(30, 17, generator=gen),  # [30, 17]
        "lstm.bias": torch.randn(301, generator=gen),  # [301]
        "scale": torch.randn((), generator=gen),  # []
        "empty": torch.zeros(0, 4),  # [0, 4]
    }


def _shapes(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in tensors.items()}


def _receive(header: pb.TensorHeader, chunks: list[pb.TensorChunk], **kwargs) -> dict[str, torch.Tensor]:
    receiver = PayloadReceiver(header, **kwargs)
    for chunk in chunks:
        receiver.add(chunk)
    assert receiver.bytes_received == header.total_bytes
    return receiver.finish()


def _copy(header: pb.TensorHeader) -> pb.TensorHeader:
    out = pb.TensorHeader()
    out.CopyFrom(header)
    return out


def _payload(
    chunk_size: int = 1000, **kwargs
) -> tuple[dict[str, torch.Tensor], pb.TensorHeader, list[pb.TensorChunk]]:
    tensors = _tensors()
    kwargs.setdefault("codec", pb.CODEC_FP32)
    header, chunks = build_payload(tensors, run_id=RUN_ID, version=VERSION, chunk_size=chunk_size, **kwargs)
    return tensors, header, chunks


@pytest.mark.parametrize("codec_value", [pb.CODEC_FP32, pb.CODEC_BF16, pb.CODEC_INT8_BLOCK])
def test_round_trip_multiple_chunks(codec_value: int) -> None:
    tensors = _tensors()
    header, chunks = build_payload(
        tensors, codec=codec_value, run_id=RUN_ID, version=VERSION, block_size=64, chunk_size=300
    )
    sizes = [codec.encoded_size(t.numel(), codec_value, 64) for t in tensors.values()]
    assert header.total_bytes == sum(sizes)
    assert [info.num_bytes for info in header.tensors] == sizes
    assert [info.name for info in header.tensors] == list(tensors)
    assert [tuple(info.shape) for info in header.tensors] == list(_shapes(tensors).values())
    assert all(info.dtype == pb.DTYPE_FLOAT32 for info in header.tensors)
    assert (header.run_id, header.version, header.codec, header.block_size) == (RUN_ID, VERSION, codec_value, 64)
    assert len(chunks) == math.ceil(header.total_bytes / 300) > 1
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(len(c.data) == 300 for c in chunks[:-1])
    assert len(chunks[-1].data) == header.total_bytes - 300 * (len(chunks) - 1)
    assert list(header.chunk_crc32) == [zlib.crc32(c.data) for c in chunks]
    received = _receive(header, chunks, expected=_shapes(tensors), run_id=RUN_ID, version=VERSION)
    assert list(received) == list(tensors)
    for name, tensor in tensors.items():
        expected = codec.decode(codec.encode(tensor, codec_value, 64), codec_value, tuple(tensor.shape), 64)
        assert torch.equal(received[name], expected)
        assert received[name].dtype == torch.float32


def test_content_sha_round_trip() -> None:
    tensors = _tensors()
    digest = params_sha256(tensors)
    header, chunks = build_payload(tensors, codec=pb.CODEC_FP32, run_id=RUN_ID, version=1, content_sha256=digest)
    assert header.content_sha256 == digest
    received = _receive(header, chunks, expected=_shapes(tensors))
    assert params_sha256(received) == digest


def test_large_payload_uses_default_1mib_chunks() -> None:
    tensors = {"big": torch.randn(300_000), "small": torch.randn(10)}  # 1.2 MB in float32
    header, chunks = build_payload(tensors, codec=pb.CODEC_FP32, run_id=RUN_ID, version=1)
    assert header.chunk_size == MAX_CHUNK_SIZE
    assert len(chunks) == 2
    assert all(len(c.data) <= MAX_CHUNK_SIZE for c in chunks)
    assert len(chunks[0].data) == MAX_CHUNK_SIZE
    received = _receive(header, chunks, expected=_shapes(tensors))
    assert all(torch.equal(received[n], tensors[n]) for n in tensors)


def test_empty_payload_has_no_chunks() -> None:
    tensors = {"nothing": torch.zeros(0)}
    header, chunks = build_payload(tensors, codec=pb.CODEC_INT8_BLOCK, run_id=RUN_ID, version=1)
    assert chunks == [] and header.total_bytes == 0 and list(header.chunk_crc32) == []
    received = _receive(header, chunks, expected={"nothing": (0,)})
    assert received["nothing"].shape == (0,)


def test_build_with_pre_encoded_bytes_from_error_feedback() -> None:
    tensors = _tensors()
    feedback = codec.ErrorFeedback()
    encoded = feedback.compress(tensors, pb.CODEC_INT8_BLOCK, 32)
    header, chunks = build_payload(
        tensors, codec=pb.CODEC_INT8_BLOCK, run_id=RUN_ID, version=2, block_size=32, encoded=encoded, chunk_size=100
    )
    received = _receive(header, chunks, expected=_shapes(tensors), allowed_codecs={pb.CODEC_INT8_BLOCK})
    for name, tensor in tensors.items():
        residual = feedback.residual(name)
        torch.testing.assert_close(received[name] + residual, tensor, rtol=0, atol=1e-6)


def test_build_rejects_bad_arguments() -> None:
    tensors = _tensors()
    for chunk_size in (0, -1, MAX_CHUNK_SIZE + 1):
        with pytest.raises(ValueError, match=str(chunk_size)):
            build_payload(tensors, codec=pb.CODEC_FP32, run_id=RUN_ID, version=1, chunk_size=chunk_size)
    with pytest.raises(ValueError, match="42"):
        build_payload(tensors, codec=42, run_id=RUN_ID, version=1)
    short = {name: b"" for name in tensors}
    with pytest.raises(ValueError, match="embed.weight"):
        build_payload(tensors, codec=pb.CODEC_FP32, run_id=RUN_ID, version=1, encoded=short)
    with pytest.raises(ValueError, match="lstm.bias"):
        build_payload(tensors, codec=pb.CODEC_FP32, run_id=RUN_ID, version=1, encoded={"embed.weight": b"\0" * 2040})
    with pytest.raises(ValueError, match="content_sha256"):
        build_payload(tensors, codec=pb.CODEC_FP32, run_id=RUN_ID, version=1, content_sha256=b"abc")


def test_params_sha256_definition_and_sensitivity() -> None:
    tensors = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor(3.0)}
    manual = hashlib.sha256(b"a\0" + tensors["a"].numpy().tobytes() + b"b\0" + tensors["b"].numpy().tobytes())
    assert params_sha256(tensors) == manual.digest()
    assert params_sha256({"b": tensors["b"], "a": tensors["a"]}) != manual.digest()
    nudged = {"a": torch.nextafter(tensors["a"], torch.tensor(3.0)), "b": tensors["b"]}
    assert params_sha256(nudged) != manual.digest()
    assert params_sha256({"a": tensors["a"].t().contiguous(), "b": tensors["b"]}) == manual.digest()


def _rejects(header: pb.TensorHeader, match: str, *, tensor: str | None = None, **kwargs) -> None:
    kwargs.setdefault("expected", None)
    with pytest.raises(PayloadError, match=match) as info:
        PayloadReceiver(header, **kwargs)
    assert info.value.tensor == tensor


def test_rejects_wrong_name() -> None:
    tensors, header, _ = _payload()
    expected = _shapes(tensors)
    expected["embed.W"] = expected.pop("embed.weight")
    _rejects(header, "embed.weight", tensor="embed.weight", expected=expected)


def test_rejects_wrong_order() -> None:
    tensors, header, _ = _payload()
    names = list(tensors)
    expected = {name: tuple(tensors[name].shape) for name in [names[1], names[0], *names[2:]]}
    _rejects(header, r"position 0 is 'embed.weight'; expected 'lstm.bias'", tensor="embed.weight", expected=expected)


def test_rejects_wrong_shape() -> None:
    tensors, header, _ = _payload()
    expected = _shapes(tensors)
    expected["lstm.bias"] = (300,)
    _rejects(header, r"'lstm.bias' has shape \(301,\); expected \(300,\)", tensor="lstm.bias", expected=expected)


def test_rejects_extra_tensor() -> None:
    tensors, header, _ = _payload()
    expected = _shapes(tensors)
    del expected["scale"]
    _rejects(header, "unexpected tensor 'scale'", tensor="scale", expected=expected)


def test_rejects_missing_tensor() -> None:
    tensors, header, _ = _payload()
    expected = _shapes(tensors)
    expected["lstm.weight_hh"] = (4, 4)
    _rejects(header, "missing tensor 'lstm.weight_hh'", tensor="lstm.weight_hh", expected=expected)


def test_rejects_wrong_num_bytes() -> None:
    tensors, header, _ = _payload()
    bad = _copy(header)
    bad.tensors[1].num_bytes += 1
    _rejects(bad, r"'lstm.bias' has num_bytes 1205; expected 1204", tensor="lstm.bias", expected=_shapes(tensors))


def test_rejects_wrong_total() -> None:
    tensors, header, _ = _payload()
    bad = _copy(header)
    bad.total_bytes += 1
    _rejects(bad, rf"total_bytes is {header.total_bytes + 1}; the tensors need {header.total_bytes}")


def test_rejects_wrong_crc_count() -> None:
    _, header, _ = _payload()
    bad = _copy(header)
    bad.chunk_crc32.append(0)
    _rejects(bad, rf"{len(header.chunk_crc32) + 1} chunk CRCs; expected {len(header.chunk_crc32)}")


@pytest.mark.parametrize("chunk_size", [0, -5, MAX_CHUNK_SIZE + 1])
def test_rejects_bad_chunk_size(chunk_size: int) -> None:
    _, header, _ = _payload()
    bad = _copy(header)
    bad.chunk_size = chunk_size
    _rejects(bad, rf"chunk_size is {chunk_size}")


def test_rejects_unknown_and_disallowed_codec() -> None:
    _, header, _ = _payload()
    bad = _copy(header)
    bad.codec = 99
    _rejects(bad, "99")
    bad.codec = pb.CODEC_UNSPECIFIED
    _rejects(bad, "CODEC_UNSPECIFIED")
    _rejects(header, "CODEC_FP32.*not allowed.*CODEC_INT8_BLOCK", allowed_codecs={pb.CODEC_INT8_BLOCK})


def test_rejects_non_float32_dtype() -> None:
    _, header, _ = _payload()
    bad = _copy(header)
    bad.tensors[2].dtype = pb.DTYPE_UNSPECIFIED
    _rejects(bad, "'scale' has dtype DTYPE_UNSPECIFIED", tensor="scale")


def test_rejects_duplicate_name() -> None:
    _, header, _ = _payload()
    bad = _copy(header)
    bad.tensors[1].name = "embed.weight"
    _rejects(bad, "'embed.weight' appears twice", tensor="embed.weight")


def test_rejects_run_id_version_and_block_size() -> None:
    _, header, _ = _payload()
    _rejects(header, "'run-test'; expected 'other-run'", run_id="other-run")
    _rejects(header, f"version is {VERSION}; expected 8", version=8)
    int8_header, _ = build_payload({"x": torch.ones(3)}, codec=pb.CODEC_INT8_BLOCK, run_id=RUN_ID, version=1)
    bad = _copy(int8_header)
    bad.block_size = 0
    _rejects(bad, "block_size is 0")


def test_rejects_header_over_the_size_limit() -> None:
    _, header, _ = _payload()
    _rejects(header, rf"total_bytes is {header.total_bytes}; at most 100", max_total_bytes=100)


def _receiver() -> tuple[PayloadReceiver, list[pb.TensorChunk], dict[str, torch.Tensor]]:
    tensors, header, chunks = _payload(chunk_size=500)
    return PayloadReceiver(header, expected=_shapes(tensors)), chunks, tensors


def header_crc(chunk: pb.TensorChunk) -> str:
    return f"{zlib.crc32(chunk.data):#010x}"


def test_rejects_out_of_order_chunk() -> None:
    receiver, chunks, _ = _receiver()
    receiver.add(chunks[0])
    with pytest.raises(PayloadError, match="chunk index is 2; expected 1"):
        receiver.add(chunks[2])


def test_rejects_truncated_chunk() -> None:
    receiver, chunks, _ = _receiver()
    short = pb.TensorChunk(index=0, data=chunks[0].data[:-1])
    with pytest.raises(PayloadError, match="chunk 0 has 499 bytes; expected 500"):
        receiver.add(short)


def test_rejects_short_last_chunk_padded() -> None:
    receiver, chunks, _ = _receiver()
    for chunk in chunks[:-1]:
        receiver.add(chunk)
    last = chunks[-1]
    padded = pb.TensorChunk(index=last.index, data=last.data + b"\0")
    message = rf"chunk {last.index} has {len(last.data) + 1} bytes; expected {len(last.data)}"
    with pytest.raises(PayloadError, match=message):
        receiver.add(padded)


def test_rejects_flipped_byte() -> None:
    receiver, chunks, _ = _receiver()
    data = bytearray(chunks[1].data)
    data[17] ^= 0x01
    receiver.add(chunks[0])
    with pytest.raises(PayloadError, match=rf"chunk 1 has CRC-32 0x[0-9a-f]{{8}}; expected {header_crc(chunks[1])}"):
        receiver.add(pb.TensorChunk(index=1, data=bytes(data)))
    receiver.add(chunks[1])


def test_rejects_missing_chunk_at_finish() -> None:
    receiver, chunks, _ = _receiver()
    for chunk in chunks[:-1]:
        receiver.add(chunk)
    with pytest.raises(PayloadError, match=rf"got {len(chunks) - 1} of {len(chunks)} chunks"):
        receiver.finish()


def test_rejects_extra_chunk() -> None:
    receiver, chunks, _ = _receiver()
    for chunk in chunks:
        receiver.add(chunk)
    extra = pb.TensorChunk(index=len(chunks), data=b"\0")
    with pytest.raises(PayloadError, match=rf"unexpected chunk {len(chunks)}: all {len(chunks)} chunks"):
        receiver.add(extra)


def test_rejects_sha_mismatch() -> None:
    tensors = _tensors()
    wrong = hashlib.sha256(b"something else").digest()
    header, chunks = build_payload(tensors, codec=pb.CODEC_BF16, run_id=RUN_ID, version=1, content_sha256=wrong)
    receiver = PayloadReceiver(header, expected=_shapes(tensors))
    for chunk in chunks:
        receiver.add(chunk)
    with pytest.raises(PayloadError, match=wrong.hex()):
        receiver.finish()


def test_sha_of_original_fails_for_lossy_codec() -> None:
    tensors = _tensors()
    header, chunks = build_payload(
        tensors, codec=pb.CODEC_INT8_BLOCK, run_id=RUN_ID, version=1, content_sha256=params_sha256(tensors)
    )
    with pytest.raises(PayloadError, match="SHA-256"):
        _receive(header, chunks, expected=_shapes(tensors))


def test_corrupt_int8_scale_with_valid_crc_names_the_tensor() -> None:
    tensors = {"q": torch.ones(8)}
    header, chunks = build_payload(tensors, codec=pb.CODEC_INT8_BLOCK, run_id=RUN_ID, version=1, block_size=4)
    data = bytearray(chunks[0].data)
    data[:4] = torch.tensor([float("inf")]).numpy().tobytes()
    bad = _copy(header)
    bad.chunk_crc32[0] = zlib.crc32(bytes(data))
    receiver = PayloadReceiver(bad, expected={"q": (8,)})
    receiver.add(pb.TensorChunk(index=0, data=bytes(data)))
    with pytest.raises(PayloadError, match="'q'.*scale") as info:
        receiver.finish()
    assert info.value.tensor == "q"


def test_check_finite_names_the_tensor() -> None:
    check_finite({"ok": torch.randn(5)})
    with_nan = torch.zeros(10)
    with_nan[[1, 3]] = float("nan")
    with pytest.raises(PayloadError, match=r"'bad' has 2 non-finite values \(2 NaN, 0 Inf\)") as info:
        check_finite({"ok": torch.ones(3), "bad": with_nan})
    assert info.value.tensor == "bad"
    with_inf = torch.zeros(2, 2)
    with_inf[0, 0] = float("-inf")
    with pytest.raises(PayloadError, match=r"'inf' has 1 non-finite values \(0 NaN, 1 Inf\)") as info:
        check_finite({"inf": with_inf, "later": with_nan})
    assert info.value.tensor == "inf"


def test_global_norm_in_float64() -> None:
    tensors = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]]), "c": torch.zeros(0)}
    assert global_norm(tensors) == 5.0
    big = {"x": torch.full((4,), 3e38)}
    assert global_norm(big) == pytest.approx(6e38)
    assert global_norm({}) == 0.0
