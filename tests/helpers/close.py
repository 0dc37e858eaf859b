"""The round close in tests: tensors that cross the average's slices, bit-exact comparison, a tiny int8
coordinator with a wire to it, encoded payloads, and a store whose commit of a round sleeps."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.records import RoundRecord
from rcswarm.state.store import StateStore
from rcswarm.sync import codec as codecs
from rcswarm.sync import outer, tensor_stream
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.wire import Wire

# Sizes that cross slice boundaries of the average and leave odd tails; a 0-d tensor too.
SHAPES = {"big": (3, outer.AVERAGE_SLICE + 37), "odd": (1031,), "small": (7, 13), "scalar": ()}


def bits(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor's raw bits, so that equality also tells -0.0 from 0.0."""
    return {name: t.contiguous().view(torch.int32) for name, t in tensors.items()}


def assert_bit_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert torch.equal(bits(got)[name], bits(want)[name]), name


def random_tensors(generator: torch.Generator, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """float32 tensors of SHAPES, with signed zeros planted in the small one."""
    tensors = {name: torch.randn(shape, generator=generator) * scale for name, shape in SHAPES.items()}
    tensors["small"][0, :2] = torch.tensor([0.0, -0.0])
    return tensors


@contextlib.contextmanager
def serving_tiny_int8(tmp_path: Path, durable: bool) -> Iterator[tuple[SwarmCoordinator, Wire]]:
    """A tiny int8 coordinator on loopback that closes a round once both workers pushed, and a wire to it."""
    spec = tiny_spec(sync={"codec": "int8", "min_reports": 2}, coordinator={"lease_s": 30.0, "durable": durable})
    coordinator = SwarmCoordinator(spec, StateStore(tmp_path / "state", durable=durable))
    running = RunningCoordinator(coordinator, TOKEN).start()
    wire = Wire(f"127.0.0.1:{running.port}")
    try:
        yield coordinator, wire
    finally:
        wire.close()
        running.stop(grace=0.5)


def encoded_payload(deltas: dict[str, torch.Tensor], codec: int, block: int, run_id: str = "r", version: int = 0
                    ) -> tuple[pb.TensorHeader, list[pb.TensorChunk]]:
    """The payload a worker pushes: each tensor encoded once with `codec`."""
    encoded = {name: codecs.encode(t, codec, block) for name, t in deltas.items()}
    return tensor_stream.build_payload(deltas, codec=codec, run_id=run_id, version=version, block_size=block,
                                       encoded=encoded)


COMMIT_SLEEP_S = 2.0


class SlowCommitStore(StateStore):
    """A real store whose commit of a round's version first sleeps, announcing that the close is under way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.committing = threading.Event()

    def commit_version(self, run_id: str, version: int, params: Mapping[str, torch.Tensor],
                       state: Mapping[str, Mapping[str, torch.Tensor]], round_record: RoundRecord | None,
                       **rows: Any) -> None:
        if round_record is not None:
            self.committing.set()
            time.sleep(COMMIT_SLEEP_S)
        super().commit_version(run_id, version, params, state, round_record, **rows)
