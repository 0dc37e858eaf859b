"""Chunked tensor payloads: a TensorHeader message, then TensorChunk messages of at most 1 MiB.

Chunks are at least MIN_CHUNK_SIZE (64 KiB) unless the payload takes at most MAX_SMALL_CHUNKS (64) of them:
each chunk is a gRPC message, and a receiver pays for every message whatever it carries (the tiny model's
100,736-byte update sent as 100,736 one-byte chunks held the coordinator for 20 s of wall time, two pushes at
once), so a header that asks for more, smaller chunks is refused before any chunk is read. Honest senders use
MAX_CHUNK_SIZE (`build_payload`'s default; a worker's update UPLOAD_CHUNK_SIZE), which refuses such a cut too.

The sender encodes each tensor with a codec (see ``rcswarm.sync.codec``), concatenates the
encoded bytes in order and cuts them into chunks; the header lists every tensor's name, shape
and encoded size, the total size, the chunk size and each chunk's CRC-32, and optionally the
SHA-256 of the float32 tensors it describes. ``PayloadReceiver`` checks the header against
what the receiver expects before it allocates anything, then checks every chunk as it
arrives, so a malformed or hostile stream fails early with a ``PayloadError`` that says what
was found and what was expected.

The header names the codec's whole format (`WireFormat`: codec, block size, and for the sparse and
low-bit codecs `sparse_keep` and `value_bits`), and every codec's size is a function of the shape and the
format alone, so the sparse codec's payload, however few entries it carries, is framed like the others:
each tensor's `num_bytes` must equal `encoded_size` before anything is allocated, and what the bytes
hold (offsets, scales, codes) is checked when the tensors are decoded, before any is returned.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Collection, Mapping

import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.sync.codec import (
    CODEC_NAMES,
    DEFAULT_BLOCK_SIZE,
    WireFormat,
    codec_label,
    decode,
    encode,
    encoded_size,
)

MAX_CHUNK_SIZE = 1 << 20
# The chunk a worker uploads its update in: the coordinator cancels a stream that brings no whole message for
# `stream_idle_s` (10 s by default), so a chunk must cross the worker's uplink within it. 256 KiB needs 26 KiB/s
# (0.21 Mbit/s); 1 MiB chunks, before, needed 0.84 Mbit/s, and a slower uplink never delivered an update.
UPLOAD_CHUNK_SIZE = 1 << 18
# The smallest chunk of a payload cut into more than MAX_SMALL_CHUNKS chunks (the module docstring).
MIN_CHUNK_SIZE = 1 << 16
MAX_SMALL_CHUNKS = 64
SHA256_SIZE = 32

_KNOWN_CODECS = frozenset(CODEC_NAMES.values())
# Codecs whose bytes follow from the codec alone (no block, density or bits in the header).
_DENSE_CODECS = (pb.CODEC_FP32, pb.CODEC_BF16)


class PayloadError(ValueError):
    """A payload that does not match its header or the receiver's expectations.

    ``tensor`` is the name of the offending tensor when the problem is one tensor's.
    """

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor


def _dtype_label(dtype: int) -> str:
    try:
        return f"{pb.DType.Name(dtype)} ({dtype})"
    except ValueError:
        return f"unknown dtype {dtype}"


def _float32_le_bytes(tensor: torch.Tensor) -> memoryview:
    values = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)  # [numel]
    return memoryview(values.numpy().astype("<f4", copy=False)).cast("B")


def params_sha256(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """SHA-256 over, in order, each name's UTF-8 bytes, a NUL byte and its float32 LE bytes."""
    digest = hashlib.sha256()
    for name, tensor in tensors.items():
        digest.update(name.encode("utf-8"))
        digest.update(b"\0")
        digest.update(_float32_le_bytes(tensor))
    return digest.digest()


def _check_chunk_size(chunk_size: int) -> None:
    if not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size must be in (0, {MAX_CHUNK_SIZE}], got {chunk_size}")


def chunk_floor_problem(chunk_size: int, total_bytes: int) -> str | None:
    """Why `total_bytes` may not be cut into chunks of `chunk_size` (a positive size), or None: chunks below
    MIN_CHUNK_SIZE are allowed only while the payload takes at most MAX_SMALL_CHUNKS of them (pure)."""
    num_chunks = -(-total_bytes // chunk_size)
    if chunk_size >= MIN_CHUNK_SIZE or num_chunks <= MAX_SMALL_CHUNKS:
        return None
    return (f"chunk_size is {chunk_size}: {total_bytes} bytes in {num_chunks} chunks; expected a chunk_size of at "
            f"least {MIN_CHUNK_SIZE} (or at most {MAX_SMALL_CHUNKS} chunks)")


def _encoded_parts(
    tensors: Mapping[str, torch.Tensor],
    codec: WireFormat,
    block_size: int,
    encoded: Mapping[str, bytes] | None,
) -> list[bytes]:
    """Each tensor's encoded bytes in order, encoding it unless ``encoded`` already has them."""
    if encoded is not None:
        extra = [name for name in encoded if name not in tensors]
        if extra:
            raise ValueError(f"encoded bytes given for tensors not in the payload: {extra[:5]}")
    parts = []
    for name, tensor in tensors.items():
        if encoded is None:
            parts.append(encode(tensor, codec, block_size))
            continue
        if name not in encoded:
            raise ValueError(f"no encoded bytes given for tensor {name!r}")
        part = encoded[name]
        expected = encoded_size(tensor.numel(), codec, block_size)
        if len(part) != expected:
            raise ValueError(
                f"tensor {name!r}: encoded bytes have {len(part)} bytes, "
                f"expected {expected} for {codec.describe()} and shape {tuple(tensor.shape)}"
            )
        parts.append(part)
    return parts


def _cut_chunks(blob: bytes, chunk_size: int) -> list[pb.TensorChunk]:
    if len(blob) <= chunk_size:
        return [pb.TensorChunk(index=0, data=blob)] if blob else []
    view = memoryview(blob)
    return [
        pb.TensorChunk(index=index, data=view[start : start + chunk_size].tobytes())
        for index, start in enumerate(range(0, len(blob), chunk_size))
    ]


def build_payload(
    tensors: Mapping[str, torch.Tensor],
    *,
    codec: int | WireFormat,
    run_id: str,
    version: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int = MAX_CHUNK_SIZE,
    encoded: Mapping[str, bytes] | None = None,
    content_sha256: bytes = b"",
) -> tuple[pb.TensorHeader, list[pb.TensorChunk]]:
    """The header and chunks that carry ``tensors`` encoded with ``codec`` (a `WireFormat`, or a dense codec with
    ``block_size``).

    ``encoded`` supplies already-encoded bytes (e.g. ``ErrorFeedback.compress``'s output) for
    every tensor; the shapes still come from ``tensors``. ``content_sha256`` is empty or the
    32-byte ``params_sha256`` of the tensors the receiver should decode.
    """
    _check_chunk_size(chunk_size)
    fmt = WireFormat.of(codec, block_size)  # ValueError for an unknown codec or bad parameters
    if len(content_sha256) not in (0, SHA256_SIZE):
        raise ValueError(f"content_sha256 must be empty or {SHA256_SIZE} bytes, got {len(content_sha256)}")
    parts = _encoded_parts(tensors, fmt, fmt.block_size, encoded)
    blob = b"".join(parts)
    problem = chunk_floor_problem(chunk_size, len(blob))
    if problem is not None:
        raise ValueError(problem)
    chunks = _cut_chunks(blob, chunk_size)
    header = pb.TensorHeader(
        run_id=run_id,
        version=version,
        codec=fmt.codec,
        block_size=fmt.block_size,
        sparse_keep=fmt.keep,
        value_bits=fmt.value_bits,
        tensors=[
            pb.TensorInfo(name=name, dtype=pb.DTYPE_FLOAT32, shape=tuple(tensor.shape), num_bytes=len(part))
            for (name, tensor), part in zip(tensors.items(), parts)
        ],
        total_bytes=len(blob),
        chunk_size=chunk_size,
        chunk_crc32=[zlib.crc32(chunk.data) for chunk in chunks],
        content_sha256=content_sha256,
    )
    return header, chunks


def header_format(header: pb.TensorHeader) -> WireFormat:
    """The `WireFormat` a header names; PayloadError for an unknown codec or parameters it does not take."""
    if header.codec not in _KNOWN_CODECS:
        raise PayloadError(f"header codec is {codec_label(header.codec)}; expected one of {sorted(_KNOWN_CODECS)}")
    dense = header.codec in _DENSE_CODECS
    try:
        return WireFormat(header.codec, header.block_size if not dense else DEFAULT_BLOCK_SIZE,
                          header.sparse_keep, header.value_bits)
    except ValueError as exc:
        raise PayloadError(f"header block_size is {header.block_size} (sparse_keep {header.sparse_keep}, value_bits "
                           f"{header.value_bits}): {exc}") from None


def _check_header_identity(
    header: pb.TensorHeader,
    run_id: str | None,
    version: int | None,
    allowed_codecs: Collection[int] | None,
    expected_format: WireFormat | None = None,
) -> WireFormat:
    fmt = header_format(header)
    if allowed_codecs is not None and header.codec not in allowed_codecs:
        allowed = ", ".join(codec_label(c) for c in allowed_codecs)
        raise PayloadError(f"header codec {codec_label(header.codec)} is not allowed; expected one of {allowed}")
    if expected_format is not None and fmt.codec == expected_format.codec and fmt.codec not in _DENSE_CODECS and fmt != expected_format:
        raise PayloadError(f"header format is {fmt.describe()}; this run's is {expected_format.describe()}")
    if run_id is not None and header.run_id != run_id:
        raise PayloadError(f"header run_id is {header.run_id!r}; expected {run_id!r}")
    if version is not None and header.version != version:
        raise PayloadError(f"header version is {header.version}; expected {version}")
    if not 0 < header.chunk_size <= MAX_CHUNK_SIZE:
        raise PayloadError(f"header chunk_size is {header.chunk_size}; expected a value in (0, {MAX_CHUNK_SIZE}]")
    if len(header.content_sha256) not in (0, SHA256_SIZE):
        raise PayloadError(
            f"header content_sha256 has {len(header.content_sha256)} bytes; expected 0 or {SHA256_SIZE}"
        )
    return fmt


def _check_tensor_infos(header: pb.TensorHeader) -> None:
    seen: set[str] = set()
    for info in header.tensors:
        if info.dtype != pb.DTYPE_FLOAT32:
            raise PayloadError(
                f"tensor {info.name!r} has dtype {_dtype_label(info.dtype)}; expected DTYPE_FLOAT32",
                tensor=info.name,
            )
        if info.name in seen:
            raise PayloadError(f"tensor {info.name!r} appears twice in the header", tensor=info.name)
        seen.add(info.name)
        if any(d < 0 for d in info.shape):
            raise PayloadError(
                f"tensor {info.name!r} has shape {tuple(info.shape)}; expected non-negative dimensions",
                tensor=info.name,
            )


def _check_expected(header: pb.TensorHeader, expected: Mapping[str, tuple[int, ...]]) -> None:
    received = [info.name for info in header.tensors]
    received_set = set(received)
    for name in received:
        if name not in expected:
            raise PayloadError(f"unexpected tensor {name!r}; it is not among the expected tensors", tensor=name)
    for name in expected:
        if name not in received_set:
            raise PayloadError(
                f"missing tensor {name!r}: expected {len(expected)} tensors, got {len(received)}", tensor=name
            )
    for position, (name, want) in enumerate(zip(expected, received)):
        if name != want:
            raise PayloadError(
                f"tensor at position {position} is {want!r}; expected {name!r} (tensors out of order)",
                tensor=want,
            )
    for info in header.tensors:
        got = tuple(int(d) for d in info.shape)
        want_shape = tuple(int(d) for d in expected[info.name])
        if got != want_shape:
            raise PayloadError(f"tensor {info.name!r} has shape {got}; expected {want_shape}", tensor=info.name)


def _check_sizes(header: pb.TensorHeader, fmt: WireFormat) -> None:
    total = 0
    for info in header.tensors:
        want = encoded_size(math.prod(info.shape), fmt)
        if info.num_bytes != want:
            raise PayloadError(
                f"tensor {info.name!r} has num_bytes {info.num_bytes}; expected {want} "
                f"for shape {tuple(info.shape)} and {fmt.describe()}",
                tensor=info.name,
            )
        total += want
    if header.total_bytes != total:
        raise PayloadError(f"header total_bytes is {header.total_bytes}; the tensors need {total}")
    problem = chunk_floor_problem(header.chunk_size, total)
    if problem is not None:
        raise PayloadError(f"header {problem}")
    num_chunks = -(-total // header.chunk_size)
    if len(header.chunk_crc32) != num_chunks:
        raise PayloadError(
            f"header lists {len(header.chunk_crc32)} chunk CRCs; expected {num_chunks} "
            f"for {total} bytes in chunks of {header.chunk_size}"
        )


class PayloadReceiver:
    """Validates a header, then reassembles and checks its chunks as they stream in.

    ``expected`` maps each tensor name, in order, to its shape; the header must list exactly
    these. ``run_id``, ``version`` and ``allowed_codecs`` are checked when given, an int8, sparse or low-bit
    header of ``expected_format``'s codec must carry its parameters (the run's block, density and bits), and
    ``max_total_bytes`` bounds the
    buffer a header may ask for. Every check on the header runs before the receive buffer is
    allocated.
    """

    def __init__(
        self,
        header: pb.TensorHeader,
        *,
        expected: Mapping[str, tuple[int, ...]] | None,
        run_id: str | None = None,
        version: int | None = None,
        allowed_codecs: Collection[int] | None = None,
        max_total_bytes: int | None = None,
        expected_format: WireFormat | None = None,
    ) -> None:
        fmt = _check_header_identity(header, run_id, version, allowed_codecs, expected_format)
        _check_tensor_infos(header)
        if expected is not None:
            _check_expected(header, expected)
        _check_sizes(header, fmt)
        if max_total_bytes is not None and header.total_bytes > max_total_bytes:
            raise PayloadError(f"header total_bytes is {header.total_bytes}; at most {max_total_bytes} are accepted")
        self._header = header
        self._format = fmt
        self._num_chunks = len(header.chunk_crc32)
        self._next_index = 0
        self._buffer: bytearray | None = bytearray(header.total_bytes)
        self._bytes_received = 0

    @property
    def header(self) -> pb.TensorHeader:
        return self._header

    @property
    def format(self) -> WireFormat:
        """The codec and parameters the header names (checked)."""
        return self._format

    @property
    def bytes_received(self) -> int:
        """Payload bytes accepted so far (chunk data only)."""
        return self._bytes_received

    @property
    def num_chunks(self) -> int:
        return self._num_chunks

    def _expected_length(self, index: int) -> int:
        if index < self._num_chunks - 1:
            return self._header.chunk_size
        return self._header.total_bytes - index * self._header.chunk_size

    def add(self, chunk: pb.TensorChunk) -> None:
        """Accept the next chunk; it must be in order, of the right length and CRC."""
        if self._buffer is None:
            raise RuntimeError("add() called after finish()")
        index = chunk.index
        if self._next_index >= self._num_chunks:
            raise PayloadError(f"unexpected chunk {index}: all {self._num_chunks} chunks were already received")
        if index != self._next_index:
            raise PayloadError(f"chunk index is {index}; expected {self._next_index} (chunks must arrive in order)")
        data = chunk.data
        want = self._expected_length(index)
        if len(data) != want:
            raise PayloadError(f"chunk {index} has {len(data)} bytes; expected {want}")
        crc = zlib.crc32(data)
        want_crc = self._header.chunk_crc32[index]
        if crc != want_crc:
            raise PayloadError(f"chunk {index} has CRC-32 {crc:#010x}; expected {want_crc:#010x}")
        start = index * self._header.chunk_size
        self._buffer[start : start + want] = data
        self._next_index += 1
        self._bytes_received += want

    def finish(self) -> dict[str, torch.Tensor]:
        """The decoded float32 tensors, in header order; checks completeness and the SHA-256."""
        return self.finish_encoded()[0]

    def finish_encoded(self) -> tuple[dict[str, torch.Tensor], bytearray]:
        """`finish`'s tensors and the received payload bytes they were decoded from (the header's codec,
        tensors concatenated in header order), for a receiver that keeps the compact form."""
        if self._buffer is None:
            raise RuntimeError("finish() called twice")
        if self._next_index != self._num_chunks:
            raise PayloadError(f"incomplete payload: got {self._next_index} of {self._num_chunks} chunks")
        buffer, self._buffer = self._buffer, None
        tensors = self._decode_all(memoryview(buffer))
        want = self._header.content_sha256
        if want:
            got = params_sha256(tensors)
            if got != want:
                raise PayloadError(f"decoded tensors have SHA-256 {got.hex()}; header says {want.hex()}")
        return tensors, buffer

    def _decode_all(self, buffer: memoryview) -> dict[str, torch.Tensor]:
        header = self._header
        tensors: dict[str, torch.Tensor] = {}
        offset = 0
        for info in header.tensors:
            part = buffer[offset : offset + info.num_bytes]
            try:
                tensors[info.name] = decode(part, self._format, tuple(info.shape))
            except ValueError as exc:
                raise PayloadError(f"tensor {info.name!r}: {exc}", tensor=info.name) from exc
            offset += info.num_bytes
        return tensors


def check_finite(tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise PayloadError naming the first tensor with NaN or Inf values, and how many."""
    for name, tensor in tensors.items():
        finite = torch.isfinite(tensor)
        if bool(finite.all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        bad = int((~finite).sum())
        raise PayloadError(
            f"tensor {name!r} has {bad} non-finite values ({nan} NaN, {bad - nan} Inf) "
            f"of {tensor.numel()}; expected all finite",
            tensor=name,
        )


def global_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """L2 norm over all elements of all tensors, accumulated in float64.

    Squares a float64 copy of each tensor in place: the same values and the same reduction as
    ``sum(square(tensor.double()))``. Contiguous CPU tensors are copied into one work buffer the size of
    the largest (a view of the tensor's shape, so each sum sees the same layout) instead of a fresh
    full-size temporary each; others get their own copy.
    """
    total = 0.0
    flat = [t for t in tensors.values() if t.device.type == "cpu" and t.is_contiguous()]
    work = torch.empty(max((t.numel() for t in flat), default=0), dtype=torch.float64)  # [largest]
    for tensor in tensors.values():
        if tensor.device.type == "cpu" and tensor.is_contiguous():
            wide = work[: tensor.numel()].view(tensor.shape).copy_(tensor.detach())  # [*shape]
        else:
            wide = tensor.detach().to(torch.float64, copy=True)  # [*shape]
        total += float(torch.sum(wide.square_()))
    return math.sqrt(total)
