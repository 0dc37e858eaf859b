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
  Encoding rejects non-finite values, and decoding rejects non-finite or negative scales.

``ErrorFeedback`` keeps, per tensor name, what the lossy codecs dropped and adds it to the
next round's delta, so that over many rounds the receiver sees the sum of the true deltas up
to one bounded residual.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from rcswarm.protos.v1 import coordinator_pb2 as pb

DEFAULT_BLOCK_SIZE = 256

CODEC_NAMES: dict[str, int] = {
    "fp32": pb.CODEC_FP32,
    "bf16": pb.CODEC_BF16,
    "int8": pb.CODEC_INT8_BLOCK,
}

_KNOWN_CODECS = frozenset(CODEC_NAMES.values())
_INT8_MAX = 127.0
# Blocks quantized per slice of the int8 encoder.
_QUANTIZE_ROWS = 4096


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


def _check_codec(codec: int, block_size: int) -> None:
    if codec not in _KNOWN_CODECS:
        raise ValueError(f"{codec_label(codec)} is not supported; expected one of {sorted(_KNOWN_CODECS)}")
    if codec == pb.CODEC_INT8_BLOCK and block_size <= 0:
        raise ValueError(f"CODEC_INT8_BLOCK needs block_size > 0, got {block_size}")


def _num_blocks(numel: int, block_size: int) -> int:
    return -(-numel // block_size)


def encoded_size(numel: int, codec: int, block_size: int) -> int:
    """Bytes that ``encode`` produces for a tensor of ``numel`` elements."""
    _check_codec(codec, block_size)
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if codec == pb.CODEC_FP32:
        return 4 * numel
    if codec == pb.CODEC_BF16:
        return 2 * numel
    return 4 * _num_blocks(numel, block_size) + numel


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


def _block_scales(flat: torch.Tensor, block_size: int) -> torch.Tensor:
    """float32 absmax / 127 of each block, the last block possibly short."""
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
    return absmax / _INT8_MAX


def _quantize_into(values: torch.Tensor, divisor: torch.Tensor, out: torch.Tensor) -> None:
    """out = clamp(round(values / divisor), -127, 127) as int8; shapes broadcast.

    Element-wise, so 2-d inputs run `_QUANTIZE_ROWS` blocks at a time through one float32 buffer
    instead of a full-size temporary; every element sees the same operations.
    """
    rows = values.shape[0] if values.dim() == 2 else 0
    if rows <= _QUANTIZE_ROWS:
        q = values / divisor
        q.round_().clamp_(-_INT8_MAX, _INT8_MAX)
        out.copy_(q)
        return
    buffer = torch.empty(_QUANTIZE_ROWS, values.shape[1], dtype=torch.float32)  # [_QUANTIZE_ROWS, block_size]
    for start in range(0, rows, _QUANTIZE_ROWS):
        stop = min(start + _QUANTIZE_ROWS, rows)
        q = buffer[: stop - start]  # [rows in slice, block_size]
        torch.div(values[start:stop], divisor[start:stop], out=q)
        q.round_().clamp_(-_INT8_MAX, _INT8_MAX)
        out[start:stop].copy_(q)


def _encode_int8_block(flat: torch.Tensor, block_size: int) -> bytes:
    numel = flat.numel()
    scales = _block_scales(flat, block_size)  # [num_blocks]
    if not bool(torch.isfinite(scales).all()):
        bad = int((~torch.isfinite(scales)).sum())
        raise ValueError(f"CODEC_INT8_BLOCK cannot encode non-finite values ({bad} blocks hold NaN or Inf)")
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


def encode(tensor: torch.Tensor, codec: int, block_size: int) -> bytes:
    """Encode a float32 tensor of any shape (moved to CPU, made contiguous) with ``codec``."""
    _check_codec(codec, block_size)
    flat = _flat_cpu_float32(tensor)  # [numel]
    if codec == pb.CODEC_FP32:
        return _encode_fp32(flat)
    if codec == pb.CODEC_BF16:
        return _encode_bf16(flat)
    return _encode_int8_block(flat, block_size)


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
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        bad = int(np.count_nonzero(~(np.isfinite(scales) & (scales >= 0))))
        raise ValueError(f"CODEC_INT8_BLOCK payload has {bad} non-finite or negative block scales")
    q = np.frombuffer(buf, dtype=np.int8, count=numel, offset=4 * num_blocks)  # [numel]
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


def decode(
    data: bytes | bytearray | memoryview, codec: int, shape: tuple[int, ...], block_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``encode``'s bytes into a fresh float32 tensor of ``shape``, or into ``out`` (a contiguous float32
    CPU tensor of as many elements, returned viewed as ``shape``): the same values without fresh memory."""
    _check_codec(codec, block_size)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape must have non-negative dimensions, got {shape}")
    numel = math.prod(shape)
    buf = memoryview(data).cast("B")
    expected = encoded_size(numel, codec, block_size)
    if buf.nbytes != expected:
        raise ValueError(
            f"{codec_label(codec)} payload for shape {shape}: expected {expected} bytes, got {buf.nbytes}"
        )
    into = None
    if out is not None:
        if out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous() or out.numel() != numel:
            raise ValueError(f"out must be a contiguous float32 CPU tensor of {numel} elements, got {out.dtype} "
                             f"{tuple(out.shape)} on {out.device}")
        into = out.view(-1).numpy()  # [numel]
    if codec == pb.CODEC_FP32:
        values = _decode_fp32(buf, numel, into)
    elif codec == pb.CODEC_BF16:
        values = _decode_bf16(buf, numel, into)
    else:
        values = _decode_int8_block(buf, numel, block_size, into)
    return torch.from_numpy(values).reshape(shape) if out is None else out.view(shape)


def _combine(delta: torch.Tensor, residual: torch.Tensor | None, consume: bool) -> torch.Tensor:
    """``delta + residual`` (``delta`` without one) in a fresh tensor, or in ``delta``'s own buffer when
    the caller gave it up (``consume``, contiguous); the same values either way."""
    if not (consume and delta.is_contiguous()):
        return delta + residual if residual is not None else delta.clone()
    return delta.add_(residual) if residual is not None else delta


class ErrorFeedback:
    """Per-tensor residuals that carry a lossy codec's rounding error into the next round.

    Each round sends ``c = delta + residual`` and keeps ``residual = c - decode(encode(c))``,
    exactly what the receiver did not get. Summed over rounds, what the receiver decoded
    equals the sum of the true deltas minus the current residual.
    """

    def __init__(self) -> None:
        self._residuals: dict[str, torch.Tensor] = {}

    def compress(self, deltas: dict[str, torch.Tensor], codec: int, block_size: int) -> dict[str, bytes]:
        """Encode ``delta + residual`` per name and update the residuals; same order as ``deltas``.

        The residuals change only if every tensor encodes; a non-finite input raises
        ValueError and leaves them as they were.
        """
        return self.compress_decoded(deltas, codec, block_size)[0]

    def compress_decoded(
        self, deltas: dict[str, torch.Tensor], codec: int, block_size: int, *, consume: bool = False,
        into: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[dict[str, bytes], dict[str, torch.Tensor]]:
        """``compress``, and also what the receiver decodes from each payload (float32, same shapes).

        The decoded tensors are the ones the residual was computed from, so a caller needs
        not decode the payloads again; they are fresh tensors the caller may keep or overwrite.
        With ``consume`` the caller gives up ``deltas``: their buffers become the new residuals. A lossy
        codec decodes into ``into[name]`` where one is given (a float32 buffer of the same shape the caller
        gave up) instead of a fresh tensor.
        """
        _check_codec(codec, block_size)
        payloads: dict[str, bytes] = {}
        received: dict[str, torch.Tensor] = {}
        updated: dict[str, torch.Tensor] = {}
        for name, delta in deltas.items():
            payloads[name], received[name], updated[name] = self._compress_one(
                name, delta, codec, block_size, consume, None if into is None else into.get(name)
            )
        self._residuals.update(updated)
        return payloads, received

    def _compress_one(
        self, name: str, delta: torch.Tensor, codec: int, block_size: int, consume: bool = False,
        into: torch.Tensor | None = None,
    ) -> tuple[bytes, torch.Tensor, torch.Tensor]:
        """(payload, decoded payload, new residual) of one tensor; the residual reuses the combined buffer."""
        if delta.dtype != torch.float32:
            raise ValueError(f"delta {name!r}: expected float32, got {delta.dtype}")
        delta = delta.detach().to("cpu")
        residual = self._residuals.get(name)
        if residual is not None and residual.shape != delta.shape:
            raise ValueError(
                f"delta {name!r}: shape {tuple(delta.shape)} differs from its residual's {tuple(residual.shape)}"
            )
        combined = _combine(delta, residual, consume)  # [*shape]
        if not all_finite(combined):
            bad = int((~torch.isfinite(combined)).sum())
            raise ValueError(f"delta {name!r} has {bad} non-finite values")
        payload = encode(combined, codec, block_size)
        if codec == pb.CODEC_FP32:
            return payload, combined, torch.zeros_like(combined)
        usable = into is not None and into.shape == combined.shape and into.dtype == torch.float32 and into.is_contiguous()
        received = decode(payload, codec, tuple(combined.shape), block_size, out=into if usable else None)  # [*shape]
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
