"""In-process coordinators on loopback (real gRPC, port 0) for tests, and what calls to them need."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.server import RunningCoordinator
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import RunGroup, open_group
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import StateStore
from rcswarm.sync import tensor_stream
from rcswarm.worker.client import CoordinatorClient, RetryPolicy
from tests.helpers.specs import TOKEN


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class LocalCoordinator:
    running: RunningCoordinator
    state_dir: Path

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    @property
    def service(self) -> SwarmCoordinator:
        return self.running.coordinator

    def client(self, token: str = TOKEN) -> CoordinatorClient:
        return CoordinatorClient(self.target, token, retry=RetryPolicy(max_elapsed_s=5.0))


@pytest.fixture
def start_coordinator(tmp_path: Path) -> Iterator[Callable[..., LocalCoordinator]]:
    """Start in-process coordinators (real gRPC on loopback, port 0); all stopped at teardown."""
    started: list[LocalCoordinator] = []

    def start(spec: RunSpec, state_dir: Path | None = None, service: type[SwarmCoordinator] = SwarmCoordinator,
              **kwargs: Any) -> LocalCoordinator:
        """`service`: the coordinator class (a test's subclass of the real one)."""
        state_dir = state_dir or tmp_path / f"state{len(started)}"
        store = StateStore(state_dir, spec.coordinator.keep_checkpoints, spec.coordinator.durable)
        running = RunningCoordinator(service(spec, store), TOKEN, **kwargs).start()
        local = LocalCoordinator(running, state_dir)
        started.append(local)
        return local

    yield start
    for local in started:
        local.running.stop(grace=0.5)


@contextlib.contextmanager
def serving(spec: RunSpec, state_dir: Path, occupied: bool = False) -> Iterator[tuple[RunGroup, str]]:
    """`spec`'s run group (a sweep's runs, or one run) served on loopback: (group, HOST:PORT), stopped at the end.
    With `occupied`, a bare client holds a place in the first run, so that a sweep's emptiest run is another."""
    running = RunningCoordinator(open_group(spec, state_dir), TOKEN).start()
    occupant = None
    try:
        target = f"127.0.0.1:{running.port}"
        if occupied:
            occupant = CoordinatorClient(target, TOKEN)
            occupant.join("occupant", "cpu", 1)
        yield running.group, target
    finally:
        if occupant is not None:
            occupant.close()
        running.stop(grace=0.5)


def creds(member: Any) -> dict[str, Any]:
    """The worker_id and worker_secret fields of a request made for `member` (a JoinResponse, or an Identity)."""
    return {"worker_id": member.worker_id, "worker_secret": member.worker_secret}


def previous(member: Any) -> dict[str, Any]:
    """The JoinRequest fields of a re-join naming `member`'s membership (a JoinResponse, or an Identity): its id and
    its worker secret, without which the coordinator takes nothing of it over."""
    return {"previous_worker_id": member.worker_id, "previous_worker_secret": member.worker_secret}


def deltas_of(coordinator: SwarmCoordinator, value: float) -> dict[str, torch.Tensor]:
    """An update of `value` in every coordinate of the run's parameters."""
    return {name: torch.full(shape, value) for name, shape in coordinator.shapes.items()}


def push(coordinator: SwarmCoordinator, member: pb.JoinResponse, deltas: dict[str, torch.Tensor],
         tokens: int, version: int | None = None) -> pb.PushUpdateResponse:
    """`member`'s update `deltas` from `version` (None: the current one) in the run's format, through the
    coordinator's push."""
    version = coordinator.version if version is None else version
    header, chunks = tensor_stream.build_payload(deltas, codec=coordinator.wire_format, run_id=coordinator.run_id,
                                                 version=version)
    meta = pb.UpdateMeta(**creds(member), base_version=version, tokens=tokens)
    return coordinator.push(iter([pb.PushUpdateRequest(meta=meta), pb.PushUpdateRequest(header=header),
                                  *(pb.PushUpdateRequest(chunk=c) for c in chunks)]))


def pull_all(coordinator: SwarmCoordinator, member: pb.JoinResponse) -> None:
    """Pull θ for `member` in process, reading and dropping every message."""
    for _ in coordinator.pull(pb.PullParametersRequest(**creds(member))):
        pass


def refusal_of(call: Callable[[], Any]) -> Refusal:
    """The Refusal `call()` raises (the test fails if it raises none)."""
    with pytest.raises(Refusal) as info:
        call()
    return info.value
