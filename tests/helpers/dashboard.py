"""What the dashboard tests share: metrics from a known law (`feed`, `true_loss`), an in-process coordinator with
its dashboard fed those metrics (`swarm`), a sweep over LENGTHS (`sweep`), HTTP GETs, a check that a PNG is not
blank, and bulk metric rows for the store's tables."""

from __future__ import annotations

import io
import math
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import creds
from tests.helpers.specs import TOKEN, tiny_spec

LENGTHS = (32, 64, 128, 256)


STEPS = range(1, 121)
# Every step's row is reported at version 0: the per-version cap must hold them all.
FEED_CAP = {"max_metrics_per_round": len(STEPS)}


ALPHA_INF, TAU = 0.3, 40.0


def true_loss(step: int, length: int) -> float:
    """A power law in L whose exponent grows as α∞(1 − e^(−s/τ)), times a slow decay in s."""
    alpha = ALPHA_INF * (1.0 - math.exp(-step / TAU))
    return 3.0 * step ** -0.2 * length ** -alpha


def feed_spec(lengths: tuple[int, ...] = LENGTHS) -> Any:
    """The run `feed` reports into: each joined worker assigned its own length (a row's tokens are bounded by the
    largest assignment's step) and room for every step's row at version 0."""
    return tiny_spec(coordinator=FEED_CAP, curriculum={"worker_seq_lens": list(lengths)})


def feed(service: Any, lengths: tuple[int, ...] = LENGTHS, steps: range = STEPS) -> dict[int, str]:
    """One joined worker per length, each reporting every step (of `steps`) through report_metrics."""
    workers = {}
    for length in lengths:
        joined = service.join(pb.JoinRequest(worker_name=f"gpu-{length}", device="cpu", pid=1))
        workers[length] = joined.worker_id
        metrics = [
            pb.Metric(version=0, step=step, seq_len=length, batch=4, loss=true_loss(step, length), tokens=4 * length,
                      wall_time=step * length / 1000.0, compute_seconds=step * length / 1200.0,
                      sync_seconds=0.01 * step, bytes_sent=1000 * step, bytes_received=2000 * step)
            for step in steps
        ]
        stored = service.report_metrics(pb.ReportMetricsRequest(**creds(joined), metrics=metrics))
        assert stored.stored == len(metrics)
    return workers


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


@pytest.fixture
def swarm(start_coordinator: Any) -> Any:
    local = start_coordinator(feed_spec(), http_port=0)
    workers = feed(local.service)
    local.base = local.running.dashboard.url  # type: ignore[attr-defined]
    local.workers = workers  # type: ignore[attr-defined]
    return local


def assert_png_not_blank(data: bytes, min_size: tuple[int, int] = (200, 150)) -> np.ndarray:
    import matplotlib.image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert image.shape[0] >= min_size[1] and image.shape[1] >= min_size[0], image.shape
    pixels = image[..., :3].reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 10, "the image is (nearly) a single colour"
    return image


class Clock:
    """A settable clock for the sweep's coordinators: metrics arrive at chosen times."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


SWEEP_T0 = 1_000_000.0


@pytest.fixture
def sweep(tmp_path: Path) -> Any:
    """A sweep over LENGTHS behind real gRPC and the HTTP dashboard; one client per run reports every step.

    A run's step is the steps its rounds trained before the version (none here: every row is at version 0)
    + the step within the round and its time counts from its
    first metric on the coordinator's clock, so each step is reported at SWEEP_T0 + step · L / 1000 s.
    """
    from types import SimpleNamespace

    from rcswarm.config.runspec import RunSpec
    from rcswarm.coordinator.server import RunningCoordinator
    from rcswarm.coordinator.sweep import SweepCoordinator
    from rcswarm.worker.client import CoordinatorClient, RetryPolicy

    base = tiny_spec(coordinator={"lease_s": 1000.0, "max_wait_s": 2.0, **FEED_CAP})
    spec = base.from_dict({**base.to_dict(), "sweep": {"seq_lens": list(LENGTHS)}})
    clock = Clock(SWEEP_T0)
    coordinator = SweepCoordinator(spec, tmp_path / "state", clock=clock)
    running = RunningCoordinator(coordinator, TOKEN, http_port=0).start()
    client = CoordinatorClient(f"127.0.0.1:{running.port}", TOKEN, retry=RetryPolicy(max_elapsed_s=5.0))
    try:
        workers = {}
        for index in range(len(LENGTHS)):
            joined = client.join(f"gpu-{index}", "cpu", 1)
            length = RunSpec.from_json(joined.run_spec_json).data.seq_len
            workers[length] = joined.worker_id
            for step in STEPS:
                clock.now = SWEEP_T0 + step * length / 1000.0
                client.report_metrics(joined, [pb.Metric(
                    version=0, step=step, seq_len=length, batch=4, loss=true_loss(step, length), tokens=4 * length,
                    wall_time=step * length / 1000.0, compute_seconds=step * length / 1200.0, sync_seconds=0.01 * step,
                    bytes_sent=1000 * step, bytes_received=2000 * step)], joined.run_id)
        clock.now = SWEEP_T0 + STEPS[-1] * max(LENGTHS) / 1000.0 + 1.0
        yield SimpleNamespace(coordinator=coordinator, running=running, base=running.dashboard.url, workers=workers,
                              names={length: f"gpu-{i}" for i, length in enumerate(workers)},
                              target=f"127.0.0.1:{running.port}", state_dir=tmp_path / "state")
    finally:
        client.close()
        running.stop(grace=0.5)


WORKERS = 4


def metric_rows(run_id: str, first: int, count: int, now: float) -> list[tuple]:
    """`count` training rows from WORKERS workers, steps counting on from row `first`."""
    rows = []
    for index in range(first, first + count):
        worker, step = index % WORKERS, index // WORKERS + 1
        rows.append((run_id, f"w{worker}", step // 5, step, 32, 4, 3.0 / (1 + step) ** 0.1, 128, 0.01 * step,
                     0.01, 0.001, 1000 * step, 2000 * step, "", now + 0.001 * index))
    return rows


def held_open(connection: socket.socket) -> bool:
    """Whether the server still holds `connection` open (nothing to read, not closed)."""
    connection.setblocking(False)
    try:
        return connection.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        connection.setblocking(True)
