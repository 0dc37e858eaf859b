"""The dashboard's fixtures (tests/helpers/dashboard.py): an in-process coordinator fed metrics from a known law,
a sweep, and a pruned sweep with forecasts (tests/helpers/forecasts.py).

A run's curves count the run's own step and the coordinator's clock (`views.presentation`), so `swarm` and
`report_over_time` report each step's row when it is trained, on a settable clock: the helpers' `feed`
reports a length's steps in one request, all at one time on that clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.coordinator import creds
from tests.helpers.dashboard import FEED_CAP, LENGTHS, STEPS, SWEEP_T0, Clock, sweep, true_loss  # noqa: F401
from tests.helpers.forecasts import served  # noqa: F401  (fixture)
from tests.helpers.specs import tiny_spec


def timed_spec(lengths: tuple[int, ...] = LENGTHS) -> Any:
    """The helpers' `feed_spec` with leases that the settable clock's seconds do not end."""
    return tiny_spec(coordinator={**FEED_CAP, "lease_s": 1000.0}, curriculum={"worker_seq_lens": list(lengths)})


def feed_over_time(service: Any, clock: Clock, lengths: tuple[int, ...] = LENGTHS,
                   steps: range = STEPS) -> dict[int, str]:
    """One joined worker per length, as `feed`, each step's row reported once trained: at SWEEP_T0 + step·L/1000 s
    on the coordinator's clock (its own wall time: step·L/1000 s), all lengths' reports in the order of time."""
    members = {length: service.join(pb.JoinRequest(worker_name=f"gpu-{length}", device="cpu", pid=1))
               for length in lengths}
    for _, step, length in sorted((step * length, step, length) for length in lengths for step in steps):
        clock.now = SWEEP_T0 + step * length / 1000.0
        metric = pb.Metric(version=0, step=step, seq_len=length, batch=4, loss=true_loss(step, length),
                           tokens=4 * length, wall_time=step * length / 1000.0, compute_seconds=step * length / 1200.0,
                           sync_seconds=0.01 * step, bytes_sent=1000 * step, bytes_received=2000 * step)
        stored = service.report_metrics(pb.ReportMetricsRequest(**creds(members[length]), metrics=[metric]))
        assert stored.stored == 1
    return {length: member.worker_id for length, member in members.items()}


@pytest.fixture
def report_over_time(start_coordinator: Any) -> Callable[..., Any]:
    """Start a coordinator on a settable clock with its dashboard, and `feed_over_time` it (`lengths`, `steps`)."""

    def start(lengths: tuple[int, ...] = LENGTHS, steps: range = STEPS) -> Any:
        clock = Clock(SWEEP_T0)
        local = start_coordinator(timed_spec(lengths), http_port=0,
                                  service=lambda spec, store: SwarmCoordinator(spec, store, clock=clock))
        local.workers = feed_over_time(local.service, clock, lengths, steps)  # type: ignore[attr-defined]
        local.base = local.running.dashboard.url  # type: ignore[attr-defined]
        return local

    return start


@pytest.fixture
def swarm(report_over_time: Callable[..., Any]) -> Any:
    """The helpers' `swarm` (one worker per length of LENGTHS, every step of STEPS), reported over time."""
    return report_over_time()
