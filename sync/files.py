"""Tensor files written whole or not at all: a crash leaves the previous file or the new one, never a torn one.

`save_tensors` writes a safetensors file under the fixed temporary name `.<name>.partial` beside its destination
(mode 0600), straight from the tensors' memory through its own file descriptor (`write_safetensors`: no copy of the
tensors, no temporary file of safetensors' own), fsyncs it, renames it over the destination and fsyncs the
directory, so the rename itself survives a power cut. A temporary left by a process killed mid-write (`.<name>.partial`,
or `.<name>.<pid>.partial` of earlier versions) is removed by the next save of the same file. Any failure to write
raises OSError naming the file (a full disk included). Used for what a run hands to its user or to its own restart
outside the coordinator's checkpoints (which have their own commit, state/store.py, with the same writer pieces,
state/checkpoints.py): a worker's error-feedback residual, the exported final parameters, a hivemind peer's final
replica.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

# safetensors' dtype names of the tensors a file may hold.
SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def raw_bytes(key: str, tensor: torch.Tensor) -> memoryview:
    """The little-endian bytes of a CPU tensor as safetensors stores them: a view, no copy when contiguous."""
    if tensor.dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {key!r} has dtype {tensor.dtype}: expected one of "
                         f"{', '.join(str(d) for d in SAFETENSORS_DTYPES)}")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def write_all(fd: int, data: memoryview) -> None:
    """os.write until every byte of `data` is written."""
    while data.nbytes:
        data = data[os.write(fd, data):]


def safetensors_head(parts: list[tuple[str, memoryview, torch.Tensor]], metadata: Mapping[str, str]) -> tuple[bytes, int]:
    """The start of a safetensors file of `parts` ((key, raw bytes, tensor) in file order) with `metadata`: the
    8-byte header length and the header, padded to 8 bytes; and the size of the data that follows it."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors files are little-endian; this host is big-endian")
    entries: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for key, data, tensor in parts:
        entries[key] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header, offset


def write_safetensors(fd: int, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """Write `tensors` with `metadata` as a safetensors file to the open `fd`: the header, then each tensor's bytes
    by one write each, straight from its memory, the widest dtypes first (as safetensors orders them, so that every
    tensor's data stays aligned to its element size)."""
    widest_first = sorted(tensors.items(), key=lambda item: -item[1].element_size())
    parts = [(key, raw_bytes(key, tensor), tensor) for key, tensor in widest_first]
    head, _ = safetensors_head(parts, metadata)
    write_all(fd, memoryview(head))
    for _, data, _ in parts:
        write_all(fd, data)


def partial_name(path: Path) -> Path:
    """The temporary name `save_tensors` writes `path` under before renaming it into place."""
    return path.with_name(f".{path.name}.partial")


def remove_stale_partials(path: Path) -> None:
    """Remove what a save of `path` killed mid-write left: `.<name>.partial` and `.<name>.<pid>.partial`."""
    stale = glob.escape(str(path.with_name(f".{path.name}.")))
    for leftover in (*glob.glob(f"{stale}partial"), *glob.glob(f"{stale}*.partial")):
        Path(leftover).unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    """fsync a directory: the rename of a file into it is durable after this."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_partial(temporary: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """Write and fsync `tensors` to `temporary` (created mode 0600, or truncated)."""
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_safetensors(fd, tensors, metadata)
        os.fsync(fd)
    finally:
        os.close(fd)


def _naming(path: Path, exc: OSError) -> OSError:
    """`exc` as an OSError of the same errno whose message names `path`, the file that could not be written."""
    message = f"cannot write {path}: {exc.strerror or exc}"
    return OSError(exc.errno, message) if exc.errno is not None else OSError(message)


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Write `tensors` (CPU) with `metadata` to `path` atomically (mode 0600); `path`. OSError naming `path` when it
    cannot be written (a full disk, a missing or read-only directory): the previous file, if any, is left as it was,
    and no temporary file stays behind."""
    path = Path(path)
    temporary = partial_name(path)
    try:
        remove_stale_partials(path)
        try:
            _write_partial(temporary, tensors, metadata or {})
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        fsync_dir(path.parent)
    except OSError as exc:
        raise _naming(path, exc) from exc
    return path
