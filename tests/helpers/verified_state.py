"""A run committed up to version VERSIONS through the real coordinator and store, for the verified-state tests.

Each version's checkpoint holds every kind of state a coordinator loads: θ, the outer momentum and a
broadcast residual, each different from version to version (`state_of`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from tests.helpers.specs import tiny_spec

VERSIONS = 3


def spec() -> RunSpec:
    return tiny_spec(run={"rounds": 10}, coordinator={"keep_checkpoints": 3})


def open_coordinator(state_dir: Path) -> SwarmCoordinator:
    run_spec = spec()
    return SwarmCoordinator(run_spec, StateStore(state_dir, run_spec.coordinator.keep_checkpoints, durable=False))


def state_of(params: dict[str, torch.Tensor], version: int) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer state committed with version `version`'s parameters: momentum and a broadcast residual."""
    return {"outer_momentum": {name: 0.1 * tensor + version for name, tensor in params.items()},
            "broadcast_residual": {name: 1e-3 * tensor - 1e-4 * version for name, tensor in params.items()}}


def committed_run(state_dir: Path) -> dict[int, bytes]:
    """A run committed up to version VERSIONS through the real coordinator and store; each version's digest."""
    coordinator = open_coordinator(state_dir)
    digests = {0: coordinator.param_sha256}
    try:
        for version in range(1, VERSIONS + 1):
            params = {name: tensor + 0.01 * version for name, tensor in coordinator.params.items()}
            digest = tensor_stream.params_sha256(params)
            record = RoundRecord(version - 1, 0.0, 1.0, 1, 64, "test", 0.1, digest.hex())
            coordinator.store.commit_version(coordinator.run_id, version, params, state_of(params, version), record)
            digests[version] = digest
    finally:
        coordinator.close()
    return digests


def checkpoint(state_dir: Path, version: int) -> Path:
    return state_dir / "checkpoints" / f"v{version:08d}.safetensors"


def tensor_span(path: Path, group: str = "") -> tuple[str, int, int]:
    """The key and byte range in the file of the first tensor of a safetensors checkpoint's state `group`
    ("": the parameters)."""
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size])
    key = next(key for key in sorted(header) if key != "__metadata__" and key.rpartition("/")[0] == group)
    start, end = header[key]["data_offsets"]
    return key, 8 + header_size + start, 8 + header_size + end


def flip_bytes(path: Path, group: str = "") -> str:
    """Flip the lowest bit of 64 bytes in the middle of the first tensor of `group` (values stay finite); its key."""
    data = bytearray(path.read_bytes())
    key, start, end = tensor_span(path, group)
    middle = (start + end) // 2
    for index in range(middle, middle + 64):
        data[index] ^= 0x01
    path.write_bytes(bytes(data))
    return key
