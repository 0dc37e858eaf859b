"""Checkpoint files of a state dir: safetensors files of a version's parameters and optimizer state.

`write_checkpoint` writes one straight from the tensors' memory (a header, then each tensor's bytes,
no intermediate copy; the safetensors layout of sync/files.py, which `save_tensors` writes with too) and digests
it in the same pass; `split_checkpoint` separates a file's parameters
from its optimizer state groups ("<group>/<name>"); `verify_checkpoint` checks a file against its entry
in the store's `checkpoints` ledger (a readable, complete safetensors file, the version in its metadata,
the run's parameter names, finite values, both digests). `StateStore` (state/store.py) commits, prunes
and loads them.

Two digests cover every byte of a checkpoint (issue #31). `param_sha256` is the parameters' digest
pulls carry (`tensor_stream.params_sha256`: each name, a NUL byte and its float32 bytes, in pull order);
`rest_blake3` (`rest_digest`) is the BLAKE3 digest of everything else in the file, in file order: the
8-byte header length, the header (metadata, every tensor's name, dtype, shape and offsets) and the bytes
of every optimizer state tensor (the outer momentum, the broadcast residual, any other group). BLAKE3,
a cryptographic hash, because the state is twice θ's size and SHA-256 over it doubled the commit's
time at 100 M parameters (docs/RELIABILITY.md); it runs on its own thread beside the write. A ledger
entry written before `rest_blake3` existed has none: its file is checked over θ (and for finite state)
only, as before; every commit since records both.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import torch
from safetensors import SafetensorError, safe_open

from rcswarm.sync import tensor_stream
from rcswarm.sync.files import raw_bytes, safetensors_head, write_all

# A pruned checkpoint file kept for the next commit to overwrite in place: writing into a file's cached
# pages is several times faster than allocating new ones (docs/PERFORMANCE.md, the round close at scale).
RECYCLED_CHECKPOINT = ".recycled.safetensors"

# Optimizer state is stored beside the parameters as "<group>/<parameter name>";
# parameter names never contain "/".
STATE_SEPARATOR = "/"


@dataclass(frozen=True)
class Checkpoint:
    """A verified version: its parameters, optimizer state and the digest they were checked against."""

    version: int
    params: dict[str, torch.Tensor]
    # group ("outer_momentum", "broadcast_residual", ...) -> name -> tensor
    state: dict[str, dict[str, torch.Tensor]]
    # params_sha256 of `params` in the run's parameter order (run_state.param_names).
    param_sha256: bytes = b""


@dataclass(frozen=True)
class LedgerEntry:
    """A committed version as the `checkpoints` ledger records it: its file, its parameters' digest and the
    digest of the rest of the file (hex; None for an entry committed before the ledger recorded it)."""

    version: int
    file: str
    param_sha256: str
    rest_blake3: str | None = None


@dataclass(frozen=True)
class Digests:
    """What `write_checkpoint` computed in its pass: the parameters' digest (None unless asked) and `rest_blake3`."""

    params: bytes | None
    rest: bytes


def split_checkpoint(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Separate a checkpoint's parameters from its optimizer state groups."""
    params: dict[str, torch.Tensor] = {}
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        group, sep, name = key.partition(STATE_SEPARATOR)
        if sep:
            state.setdefault(group, {})[name] = tensor
        else:
            params[key] = tensor
    return params, state


def write_checkpoint(
    path: Path, params: Mapping[str, torch.Tensor], state: Mapping[str, Mapping[str, torch.Tensor]],
    metadata: Mapping[str, str], digest: bool,
) -> Digests:
    """Write a safetensors file of `params` then each state group's tensors ("<group>/<name>") straight from
    the tensors' memory: a header, then each tensor's bytes by one write each, no intermediate copy (not
    fsynced: the caller does). An existing file at `path` is overwritten in place and cut to size, so the
    pages it has in the page cache are reused instead of allocated afresh. Returns the file's `rest_blake3`
    and, with `digest`, `tensor_stream.params_sha256(params)` (params must be float32), both computed over
    the same bytes in the same pass.
    """
    parts = [(key, raw_bytes(key, tensor), tensor) for key, tensor in params.items()]
    for group, named in state.items():
        parts.extend((f"{group}{STATE_SEPARATOR}{k}", raw_bytes(f"{group}/{k}", v), v) for k, v in named.items())
    head, size = safetensors_head(parts, metadata)
    sha = hashlib.sha256() if digest else None
    if sha is not None and any(tensor.dtype != torch.float32 for tensor in params.values()):
        raise ValueError(f"checkpoint parameters must be float32 to be digested, got {sorted({str(t.dtype) for t in params.values()})}")
    # The rest digest runs on its own thread over the same memory while this one writes and digests the
    # parameters: blake3, hashlib and os.write release the GIL, so the passes overlap.
    rest = blake3.blake3(head)
    hashing = threading.Thread(target=lambda: [rest.update(data) for _, data, _ in parts[len(params):]],
                               name="rest-digest", daemon=True)
    hashing.start()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_all(fd, memoryview(head))
        for index, (key, data, _) in enumerate(parts):
            if sha is not None and index < len(params):
                sha.update(key.encode("utf-8"))
                sha.update(b"\0")
                sha.update(data)
            write_all(fd, data)
        os.ftruncate(fd, len(head) + size)
    finally:
        os.close(fd)
        hashing.join()
    return Digests(None if sha is None else sha.digest(), rest.digest())


def _read_head(path: Path) -> tuple[bytes, dict[str, Any]]:
    """A safetensors file's first 8 bytes and header as stored, and the header parsed; ValueError when they
    cannot be read."""
    with open(path, "rb") as handle:
        size = handle.read(8)
        if len(size) != 8:
            raise ValueError("shorter than the 8 bytes of a header length")
        (length,) = struct.unpack("<Q", size)
        if length > os.fstat(handle.fileno()).st_size:
            raise ValueError(f"its header length {length} exceeds the file")
        header = handle.read(length)
    try:
        parsed = json.loads(header)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"its header is not JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise ValueError("its header is not a JSON object")
    return size + header, parsed


def checkpoint_metadata(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The metadata in the header of the safetensors file `path` (its header only is read), or None and why it
    cannot be read."""
    try:
        _, header = _read_head(path)
    except (OSError, ValueError) as error:
        return None, f"its header cannot be read ({error})"
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict):
        return None, "its header's metadata is not a JSON object"
    return metadata, ""


def rest_digest(head: bytes, header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], params: set[str]) -> bytes:
    """`rest_blake3` of a loaded checkpoint: BLAKE3 of `head` (the stored header length and header) and of every
    tensor that is not a parameter, in the order of its data offsets (as `write_checkpoint` computes it)."""
    rest = blake3.blake3(head)
    others = sorted((key for key in tensors if key not in params), key=lambda key: header[key]["data_offsets"][0])
    for key in others:
        rest.update(raw_bytes(key, tensors[key]))
    return rest.digest()


def verify_checkpoint(path: Path, entry: LedgerEntry, names: list[str], run_id: str) -> tuple[Checkpoint | None, str]:
    """The checkpoint in `path` when it verifies against its ledger `entry` and the run's parameter `names`
    (in the run's order) and `run_id`, else None and what is wrong."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            # Copies: safetensors maps the file, and the store rewrites a pruned checkpoint's file in place for a
            # later version (`.recycled`), which would change a view of it under the run.
            tensors = {key: handle.get_tensor(key).clone() for key in handle.keys()}
        head, header = _read_head(path)
    except (OSError, SafetensorError, ValueError) as error:
        return None, f"unreadable or truncated safetensors file ({error})"
    if metadata.get("version") != str(entry.version) or metadata.get("run_id", run_id) != run_id:
        return None, (f"its metadata says run {metadata.get('run_id')!r} version {metadata.get('version')!r}, "
                      f"the ledger run {run_id!r} version {entry.version}")
    params, state = split_checkpoint(tensors)
    if sorted(params) != sorted(names):
        return None, f"holds parameters {sorted(params)}, expected the run's {sorted(names)}"
    bad = [key for key, tensor in tensors.items() if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        return None, f"non-finite values (NaN or Inf) in {', '.join(sorted(bad))}"
    ordered = {key: params[key] for key in names}
    digest = tensor_stream.params_sha256(ordered)
    if digest.hex() != entry.param_sha256:
        return None, f"parameters' SHA-256 {digest.hex()} differs from the {entry.param_sha256} recorded at commit"
    if entry.rest_blake3 is not None:
        rest = rest_digest(head, header, tensors, set(params)).hex()
        if rest != entry.rest_blake3:
            groups = ", ".join(sorted(state)) or "none"
            return None, (f"BLAKE3 digest of its header and optimizer state ({groups}) {rest} differs from the "
                          f"{entry.rest_blake3} recorded at commit")
    return Checkpoint(version=entry.version, params=ordered, state=state, param_sha256=digest), ""
