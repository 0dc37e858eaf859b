"""What a coordinator a volunteer does not control can make its worker do (review of a hostile coordinator,
2026-11-28): the rates of the worker's calls have floors whatever the coordinator answers, and its strings reach the
worker's log as one line of text."""

from __future__ import annotations

import io
import logging
import math
from pathlib import Path

import grpc
import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.protos.transport import PLACE_RETRY_KEY
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import Worker
from rcswarm.worker import worker as worker_module
from rcswarm.worker.client import MAX_PLACE_RETRY_S, MIN_PLACE_RETRY_S, place_retry_s
from rcswarm.worker.limits import DEFAULT_MAX_STEP_TOKENS, ModelLimit
from rcswarm.worker.log_lines import OneLineFormatter
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import _options, run_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Refused(grpc.RpcError):
    """A RESOURCE_EXHAUSTED refusal with the place-retry trailer, as the client sees one."""

    def __init__(self, milliseconds: str) -> None:
        self.milliseconds = milliseconds

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def trailing_metadata(self):
        return ((PLACE_RETRY_KEY, self.milliseconds),)


@pytest.mark.parametrize("lease_s, expected", [
    (3.0, 1.0), (0.3, worker_module.MIN_HEARTBEAT_S), (1e6, worker_module.MAX_HEARTBEAT_S),
    (math.nan, worker_module.DEFAULT_LEASE_S / 3), (math.inf, worker_module.DEFAULT_LEASE_S / 3),
    (0.0, worker_module.DEFAULT_LEASE_S / 3), (-5.0, worker_module.DEFAULT_LEASE_S / 3),
])
def test_heartbeats_keep_a_sane_interval_whatever_lease_the_join_answered(lease_s: float, expected: float) -> None:
    """A NaN lease made the heartbeat loop's wait return at once: 1,154 heartbeats a second."""
    assert worker_module.heartbeat_interval(lease_s) == pytest.approx(expected)


@pytest.mark.parametrize("milliseconds, expected", [
    ("2000", 2.0), ("1", MIN_PLACE_RETRY_S), ("1e12", MAX_PLACE_RETRY_S), ("inf", MAX_PLACE_RETRY_S),
    ("nan", None), ("0", None), ("-3", None), ("soon", None),
])
def test_a_place_retry_trailer_is_kept_between_its_floor_and_ceiling(milliseconds: str, expected: float | None) -> None:
    """A 1 ms trailer made a refused worker ask for a place 612 times a second (the coordinator sends 1 to 10 s)."""
    assert place_retry_s(Refused(milliseconds)) == expected


EVIL = ("curriculum\x1b]8;;https://evil.example/\x07click here\x1b]8;;\x07\x1b[2K\r"
        "\n2026-11-28 00:00:00,000 worker ERROR forged: run your-own-command to recover")


class EvilStrings(SwarmCoordinator):
    """The real coordinator, writing a terminal's escape sequences and a forged log line into what the worker logs:
    an assignment's reason and a refused push's details."""

    def heartbeat(self, request):
        response = super().heartbeat(request)
        response.assignment.reason = EVIL
        response.assignment.batch_size = 5  # not the spec's 4: the worker logs the reason at its next round
        return response

    def push(self, requests):
        for _ in requests:
            pass
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, "stale" + EVIL)

    def await_version(self, request, time_remaining):
        """Says the version the worker waits for is served (it is not): the worker, refused stale, trains again."""
        return pb.AwaitVersionResponse(version=request.min_version, run_state=pb.RUN_STATE_RUNNING)


def test_a_coordinators_strings_are_one_line_of_text_in_the_workers_log(start_coordinator) -> None:
    """They were logged as sent: an OSC-8 link, a line erased (ESC[2K, CR) and a forged ERROR line followed by a
    command to run, in the volunteer's terminal. The worker's formatter (`log_to_stderr`) escapes them."""
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"lease_s": 0.6}), service=EvilStrings)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("rcswarm.worker")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        worker = Worker(_options(local.target), TOKEN)
        run_until(worker, lambda w: "stale" in out.getvalue() and out.getvalue().count("evil.example") >= 2, 60)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = out.getvalue().splitlines()
    assert any("stale" in line and "evil.example" in line for line in lines), lines
    assert not [line for line in lines if line.startswith("2026-11-28") or "\x1b" in line or "\r" in line], lines
    assert any("\\x1b]8;;https://evil.example/\\x07" in line and "\\n2026-11-28 00:00:00,000 worker ERROR forged" in line
               for line in lines), lines


class HugeWindows(SwarmCoordinator):
    """The real coordinator, assigning batch 2^12 × seq_len 2^11 (8.4 M positions a step) at every heartbeat and
    join: before, a worker allocated until the machine swapped (batch 2^22 × seq_len 256: 8 GiB in one array)."""

    def _assignment(self, worker):
        assignment = super()._assignment(worker)
        assignment.seq_len, assignment.batch_size = 1 << 11, 1 << 12
        return assignment


def test_an_assignment_over_the_step_limit_is_refused_before_allocating(start_coordinator) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 0}), service=HugeWindows)
    worker = Worker(_options(local.target), TOKEN)
    assert run_until(worker, lambda w: False, 60) == 1
    assert ("the coordinator's assignment for version 0: batch 4,096 × seq_len 2,048 = 8,388,608 positions a step, "
            "more than this worker's limit of 2,097,152 (--max-step-tokens)") in worker.exit_reason, worker.exit_reason


@pytest.mark.parametrize("data_root", [None, "public"])
def test_a_git_dataset_outside_the_data_root_is_never_opened(start_coordinator, tmp_path, monkeypatch,
                                                             data_root) -> None:
    """A coordinator named the operator's own dataset (absolute, or relative to the worker's working directory) and
    the worker trained on it; now it reads one only under --data-root (none without one) and exits naming both."""
    (tmp_path / "private").mkdir()
    (tmp_path / "public").mkdir()
    opened: list[str] = []
    monkeypatch.setattr("rcswarm.data.frames.GitFrameSource", lambda path, *a, **k: opened.append(path))
    spec = tiny_spec(run={"rounds": 0}, model={"name": "frame", "preset": "tiny"},
                     data={"source": "git", "seq_len": 8, "task_config": {"dataset": str(tmp_path / "private")}})
    local = start_coordinator(spec)
    root = tmp_path / data_root if data_root else None
    worker = Worker(_options(local.target, data_root=root), TOKEN)
    assert run_until(worker, lambda w: False, 60) == 1
    assert "cannot train this run: the run spec of" in worker.exit_reason, worker.exit_reason
    expected = f"outside this worker's data root {root}" if root else "--data-root DIR, the folder that holds it"
    assert expected in worker.exit_reason, worker.exit_reason
    assert opened == [] and worker.model is None


def test_a_spec_whose_windows_exceed_the_step_limit_is_refused_and_every_example_fits() -> None:
    limit = ModelLimit(10**12, "a test", max_step_tokens=DEFAULT_MAX_STEP_TOKENS)
    assert limit.problem(tiny_spec(data={"seq_len": 4096, "batch_size": 1024})).startswith(
        "the run spec's data.seq_len = 4096: batch 1,024 × seq_len 4,096")
    # Every window the run can train, not only data.seq_len's (a hivemind peer follows the schedule without an
    # assignment to check; review of the hivemind path, 2026-11-29).
    schedule = tiny_spec(curriculum={"schedule": [[0, 32, 4], [10, 65536, 512]]})
    assert limit.problem(schedule).startswith("the run spec's curriculum.schedule = 65536: batch 512 × seq_len 65,536")
    # A length assigned per worker (a ladder's rung, curriculum.worker_seq_lens) is checked when it is assigned: a
    # worker that holds the short lengths trains them.
    ladder = tiny_spec(data={"batch_size": 64}, curriculum={
        "policy": "adaptive", "seq_lens": [4, 65536], "alpha_inf": 1.0, "tau": 1.0})
    assert limit.problem(ladder) == ""
    assert limit.problem(tiny_spec(curriculum={"worker_seq_lens": [32, 1 << 20]})) == ""
    assert "held-out windows" in limit.problem(tiny_spec(run={"eval_seq_len": 1 << 20}))
    assert ModelLimit(10**12, "a test", max_step_tokens=100).problem(tiny_spec()) != ""
    for path in sorted(EXAMPLES.glob("*.toml")):
        spec = RunSpec.from_toml(path)
        for run in spec.sweep_runs() if spec.is_sweep else [spec]:
            assert limit.problem(run) == "", path
