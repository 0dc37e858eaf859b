"""The worker's own limits (issue #31, point 5, and point 7's worker side): real coordinators on loopback whose
subclasses serve what a hostile or broken coordinator would, and the real worker.

* A Join answering a run spec whose model is far above what the worker may build: refused before anything is
  allocated, one ERROR line naming both numbers (before: a 14.4 GB tensor, a raw RuntimeError or the OOM killer).
* A coordinator that answers every heartbeat but serves a payload the worker refuses: the worker gives up after a
  run of refused payloads (before: heartbeats kept resetting its patience, so it re-pulled forever).
* A coordinator refusing ReportMetrics (a full disk, a metrics budget): one WARNING line per report and training
  goes on (before: RESOURCE_EXHAUSTED was retried while heartbeats were answered, forever; a refusal ended it).
"""

from __future__ import annotations

import logging
import threading
import time
import tracemalloc
import weakref

import grpc
import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.records import Refusal, Reservation
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.models import registry
from rcswarm.models.limits import host_memory_bytes
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker import Worker
from rcswarm.worker.client import RetriesExhausted
from rcswarm.worker.limits import TRAINING_BYTES_PER_PARAMETER, ModelLimit
from rcswarm.worker.membership import Membership, write_membership
from tests.helpers.coordinator import serving
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import FaultBeforeFirstPush, _options, run_until

# The hostile spec: d_model 30000, 8 layers of the demo's LSTM.
HUGE_OVERRIDES = {"d_model": 30000, "n_layers": 8}
# Python-level memory a refused spec may cost, far below one layer of the model it names.
PEAK_BOUND = 64 << 20


def huge_spec_json(spec: RunSpec) -> str:
    raw = spec.to_dict()
    raw["model"]["overrides"] = {**raw["model"].get("overrides", {}), **HUGE_OVERRIDES}
    return RunSpec.from_dict(raw).to_json()


class HugeSpecCoordinator(SwarmCoordinator):
    """The real coordinator, whose Join serves a run spec naming a model of tens of billions of parameters."""

    def join(self, request: pb.JoinRequest, placed: str = "",
             reservation: Reservation | None = None) -> pb.JoinResponse:
        response = super().join(request, placed, reservation)
        response.run_spec_json = huge_spec_json(self.spec)
        return response


def errors_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_parameter_count_needs_no_allocation() -> None:
    spec = tiny_spec()
    built = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides)
    assert registry.parameter_count_of(spec.model.name, spec.model.preset, spec.model.overrides) == sum(
        p.numel() for p in built.parameters())
    tracemalloc.start()
    try:
        huge = registry.parameter_count_of(spec.model.name, spec.model.preset, HUGE_OVERRIDES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert huge > 10**10 and peak < PEAK_BOUND, (huge, peak)


def test_the_count_on_the_meta_device_is_the_built_models_for_every_small_preset() -> None:
    checked = 0
    for name in registry.list_models():
        for preset in registry.get(name).presets:
            count = registry.parameter_count_of(name, preset)
            if count <= 3_000_000:  # the larger presets are the same code at other sizes
                assert count == registry.parameter_count(registry.build_model(name, preset, seed=0)), (name, preset)
                checked += 1
    assert checked >= 15


def test_the_default_limit_is_what_the_devices_memory_holds() -> None:
    limit = ModelLimit.of("cpu")
    assert limit.max_params == host_memory_bytes() // TRAINING_BYTES_PER_PARAMETER
    assert "GiB of cpu memory" in limit.source and "--max-params" in limit.source
    assert ModelLimit.of("cpu", 1000) == ModelLimit(1000, "--max-params")
    with pytest.raises(ValueError, match="--max-params -1: expected >= 0"):
        _options("127.0.0.1:1", max_params=-1)


def test_a_join_serving_a_huge_model_is_refused_before_allocation(start_coordinator, caplog) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 0}), service=HugeSpecCoordinator)
    worker = Worker(_options(local.target, patience_s=5.0), TOKEN)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
            code = worker.run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 1 and worker.model is None
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MiB allocated for a refused spec"
    errors = errors_of(caplog)
    assert len(errors) == 1 and "\n" not in errors[0], errors
    # The count stops past twice the limit (models/limits.bounded_parameter_count): the line gives a lower bound.
    limit = worker.limit.max_params
    assert "refused before allocating" in errors[0] and f"has more than {limit:,} parameters" in errors[0], errors
    assert f"limit of {worker.limit.max_params:,}" in errors[0] and "GiB of cpu memory" in errors[0], errors


def test_max_params_sets_the_limit(start_coordinator, caplog) -> None:
    spec = tiny_spec(run={"rounds": 0})
    count = registry.parameter_count_of(spec.model.name, spec.model.preset, spec.model.overrides)
    local = start_coordinator(spec)
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        code = Worker(_options(local.target, patience_s=5.0, max_params=count - 1), TOKEN).run()
    errors = errors_of(caplog)
    assert code == 1 and len(errors) == 1, errors
    assert f"has {count:,} parameters" in errors[0] and f"limit of {count - 1:,} (--max-params)" in errors[0], errors
    # At the limit it trains.
    worker = Worker(_options(local.target, patience_s=5.0, max_params=count), TOKEN)
    assert run_until(worker, lambda w: w.step >= 1, 60) == 0


class CorruptPulls(SwarmCoordinator):
    """The real coordinator, answering every call, but flipping one byte of every pulled chunk (its CRC fails)."""

    pulls = 0

    def pull(self, request):
        type(self).pulls += 1
        for message in super().pull(request):
            if message.WhichOneof("part") == "chunk":
                corrupt = pb.PullParametersResponse()
                corrupt.CopyFrom(message)  # the served messages are shared: corrupt a copy
                data = bytearray(corrupt.chunk.data)
                data[len(data) // 2] ^= 0xFF
                corrupt.chunk.data = bytes(data)
                message = corrupt
            yield message


def test_refused_payloads_end_the_worker_while_heartbeats_are_answered(start_coordinator, caplog) -> None:
    # Heartbeats every 0.2 s, a patience of 2 s: before, each answered heartbeat restarted the patience.
    local = start_coordinator(tiny_spec(run={"rounds": 0}, coordinator={"lease_s": 0.6}), service=CorruptPulls)
    CorruptPulls.pulls = 0
    worker = Worker(_options(local.target, patience_s=2.0), TOKEN)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        thread.start()
        thread.join(timeout=60)
    alive = thread.is_alive()
    worker.stop.set()
    thread.join(timeout=30)
    assert not alive, f"the worker still re-pulls after {time.monotonic() - started:.0f}s ({CorruptPulls.pulls} pulls)"
    assert result == [1]
    policy = worker.client.retry
    assert CorruptPulls.pulls == policy.max_refused_payloads
    errors = errors_of(caplog)
    assert len(errors) == 1 and f"refused {policy.max_refused_payloads} payloads in a row" in errors[0], errors
    assert "CRC" in errors[0], errors


class RefusedMetrics(SwarmCoordinator):
    """The real coordinator, whose ReportMetrics refuses every batch with `code` (as a full disk would)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    refused = 0

    def report_metrics(self, request):
        type(self).refused += 1
        raise Refusal(self.code, "cannot store metrics: database or disk is full")


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT])
def test_a_refused_report_metrics_is_one_line_and_training_goes_on(start_coordinator, caplog, code) -> None:
    RefusedMetrics.code, RefusedMetrics.refused = code, 0
    local = start_coordinator(tiny_spec(run={"rounds": 0}, inner={"steps": 2}), service=RefusedMetrics)
    worker = Worker(_options(local.target, patience_s=30.0), TOKEN)
    with caplog.at_level(logging.INFO, logger="rcswarm.worker"):
        code_ = run_until(worker, lambda w: RefusedMetrics.refused >= 3, 60)
    assert code_ == 0 and worker.step >= 6
    warnings = [r for r in caplog.records if "ReportMetrics failed" in r.getMessage()]
    assert len(warnings) >= 3 and all(r.exc_info is None and "\n" not in r.getMessage() for r in warnings)
    text = warnings[0].getMessage()
    assert code.name in text and "disk is full" in text
    assert ("kept for the next report" if code == grpc.StatusCode.RESOURCE_EXHAUSTED else "dropped") in text
    assert not errors_of(caplog)


def test_a_refused_pull_policy_is_validated() -> None:
    from rcswarm.worker.client import RetryPolicy

    with pytest.raises(ValueError, match="max_refused_payloads = 0"):
        RetryPolicy(max_refused_payloads=0)
    assert issubclass(RetriesExhausted, RuntimeError)


def test_a_model_of_a_hundred_thousand_layers_is_refused_without_counting_it_all() -> None:
    """Counting `n_layers = 100000` in full on the meta device took 70 s and 2.7 GiB of Python objects before the
    refusal; the count stops past twice the limit (or at MAX_MODULES submodules)."""
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "small", "overrides": {"n_layers": 100_000}})
    tracemalloc.start()
    try:
        problem = ModelLimit(10**9, "a test").problem(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problem.startswith("the model (lstm_lm preset 'small', overrides {'n_layers': 100000}) has more than "), problem
    assert peak < 256 << 20, f"{peak / 2**20:.0f} MiB allocated counting a refused spec"  # 2.7 GiB before


def test_a_worker_that_cannot_train_one_length_of_a_sweep_trains_another(tmp_path, caplog) -> None:
    """Placed in the L = 512 run its --max-step-tokens does not hold, the worker ended (exit 1) though the sweep's
    L = 8 run was one it could train. It leaves that run, saying why, and joins again naming it: the sweep places it
    at L = 8, where it trains; a join that names both runs is refused, and the worker ends naming the reasons."""
    spec = tiny_spec(sweep={"seq_lens": [8, 512]}, run={"rounds": 2, "workers": 1}, data={"batch_size": 2},
                     inner={"steps": 2}, coordinator={"lease_s": 60.0})
    with serving(spec, tmp_path / "state", occupied=True) as (group, target):  # the emptiest run is L512
        short, long = group.runs
        worker = Worker(_options(target, max_step_tokens=100), TOKEN)
        with caplog.at_level(logging.WARNING, logger="rcswarm.worker"):
            code = run_until(worker, lambda w: w.run_id == short.run_id and w.step >= 2, 60)
        assert code == 0 and worker.run_id == short.run_id and worker.step >= 2, worker.exit_reason
        refused = [r.getMessage() for r in caplog.records if "asking for another" in r.getMessage()]
        assert len(refused) == 1 and f"leaving run {long.run_id}" in refused[0], refused
        assert "batch 2 × seq_len 512 = 1,024 positions a step, more than this worker's limit of 100" in refused[0]
        left = [e.reason for e in long.store.events("leave")]
        assert len(left) == 1 and left[0].startswith("left: refused: the run spec of"), left

        # Nothing it can train: the second run refused too (its limit below L8's windows), the worker ends.
        stuck = Worker(_options(target, max_step_tokens=10), TOKEN)
        assert run_until(stuck, lambda w: False, 60) == 1
        assert "cannot train this run: the run spec of" in stuck.exit_reason
        assert "(no other run: join refused: this worker refused " in stuck.exit_reason, stuck.exit_reason
        assert "test-L512, and the sweep has no other unfinished run)" in stuck.exit_reason, stuck.exit_reason


def test_a_worker_whose_run_is_stopped_mid_round_stops_training_it_and_moves(tmp_path, caplog) -> None:
    """A pruned run's worker trained its round to the end and pushed an update the run dropped: up to a whole round
    (23 minutes of an H100 in examples/frame_git_gpu.toml). The heartbeat's NOT_FOUND now says the run no longer takes
    its updates (the MOVED_KEY trailer): the round stops within a heartbeat and the worker joins the run going on."""
    spec = tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 3, "workers": 1}, inner={"steps": 100_000},
                     coordinator={"lease_s": 3.0})
    with serving(spec, tmp_path / "state") as (group, target):
        first, second = group.runs
        worker = Worker(_options(target), TOKEN)
        thread = threading.Thread(target=worker.run, daemon=True)
        with caplog.at_level(logging.WARNING, logger="rcswarm.worker"):
            thread.start()
            try:
                deadline = time.monotonic() + 60
                while not (worker.run_id == first.run_id and worker.step > 0) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert worker.run_id == first.run_id, worker.run_id
                first.stop("pruned: the test")
                stopped, deadline = time.monotonic(), time.monotonic() + 30
                while worker.run_id != second.run_id and time.monotonic() < deadline:
                    time.sleep(0.05)
                moved_after = time.monotonic() - stopped
            finally:
                worker.stop.set()
                thread.join(timeout=30)
        assert worker.run_id == second.run_id, worker.run_id
        assert moved_after < 10, f"{moved_after:.1f} s"  # heartbeats every second at a 3 s lease
        assert first.version == 0 and not first.round.reports  # no update of the stopped round reached it
        lines = [r.getMessage() for r in caplog.records if "its run was stopped (pruned: the test)" in r.getMessage()]
        assert lines and "stopped after" in lines[0], lines


class OutOfMemoryAt(Worker):
    """The real worker, whose training runs out of device memory at windows of `seq_len` (as CUDA would: a
    torch.OutOfMemoryError from inside a step)."""

    def __init__(self, options, seq_len: int) -> None:
        super().__init__(options, TOKEN)
        self.oom_seq_len = seq_len
        self.ooms = 0

    def _train_step(self, *args, **kwargs):
        if self.trainer.data.seq_len == self.oom_seq_len:
            self.ooms += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (the test)")
        return super()._train_step(*args, **kwargs)


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap"])
def test_a_worker_out_of_memory_at_one_length_of_a_sweep_trains_another(tmp_path, caplog, overlap) -> None:
    """An OutOfMemoryError ended the worker with a traceback, and a restarted one was placed in the same run again.
    It is a refusal of that run: the worker leaves it and the sweep places it at a length that fits."""
    spec = tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 3, "workers": 1}, inner={"steps": 2},
                     sync={"overlap": overlap}, coordinator={"lease_s": 60.0})
    with serving(spec, tmp_path / "state", occupied=True) as (group, target):  # the worker goes to L16 first
        short, long = group.runs
        worker = OutOfMemoryAt(_options(target), 16)
        with caplog.at_level(logging.WARNING, logger="rcswarm.worker"):
            code = run_until(worker, lambda w: w.run_id == short.run_id and w.step >= 2, 60)
        assert code == 0 and worker.ooms == 1 and worker.run_id == short.run_id, worker.exit_reason
        lines = [r.getMessage() for r in caplog.records if "asking for another" in r.getMessage()]
        assert len(lines) == 1 and f"out of memory on cpu training run {long.run_id} at seq_len 16 × batch 4" in lines[0]
        assert "CUDA out of memory. Tried to allocate 2.00 GiB (the test)" in lines[0], lines


class OutOfMemoryHolding(Worker):
    """The real worker, running out of memory at windows of `seq_len` while its step holds a large tensor (the
    round's saved activations); records whether that tensor is still alive when the next run's model is built."""

    def __init__(self, options, seq_len: int) -> None:
        super().__init__(options, TOKEN)
        self.oom_seq_len, self.held, self.alive_at_build = seq_len, None, []

    def _train_step(self, *args, **kwargs):
        if self.trainer.data.seq_len == self.oom_seq_len and self.held is None:
            activations = torch.empty(64 << 20, dtype=torch.uint8)
            self.held = weakref.ref(activations)
            raise torch.OutOfMemoryError("CUDA out of memory (the test)")
        return super()._train_step(*args, **kwargs)

    def _build_model(self, spec):
        if self.held is not None:
            self.alive_at_build.append(self.held() is not None)
        return super()._build_model(spec)


def test_the_failed_rounds_tensors_are_gone_before_the_next_runs_model_is_built(tmp_path) -> None:
    """The run was refused inside the error's handler: its traceback held the failed step's frames, and with them
    its activations, while the next run's model was built (on a GPU, a second out-of-memory: review, 2026-11-29)."""
    spec = tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 3, "workers": 1}, inner={"steps": 2},
                     coordinator={"lease_s": 60.0})
    with serving(spec, tmp_path / "state", occupied=True) as (group, target):
        short, _ = group.runs
        worker = OutOfMemoryHolding(_options(target), 16)
        assert run_until(worker, lambda w: w.run_id == short.run_id and w.step >= 2, 60) == 0, worker.exit_reason
        assert worker.alive_at_build == [False], worker.alive_at_build


def test_a_worker_that_refused_a_run_ends_with_0_when_the_sweep_ends(tmp_path) -> None:
    """Every FAILED_PRECONDITION of a join was read as "no other run" once the worker had refused one, including
    "every run of the sweep has finished": exit 1, "cannot train this run" (review, 2026-11-29)."""
    spec = tiny_spec(sweep={"seq_lens": [8, 512]}, run={"rounds": 2, "workers": 1}, data={"batch_size": 2},
                     inner={"steps": 2}, coordinator={"lease_s": 60.0})
    with serving(spec, tmp_path / "state", occupied=True) as (group, target):
        short, long = group.runs

        def end_the_sweep(worker: Worker) -> None:  # an eviction, and the sweep's end meanwhile
            short.leave(pb.LeaveRequest(worker_id=worker.identity.worker_id,
                                        worker_secret=worker.identity.worker_secret, reason="evicted (the test)"))
            long.stop("budget (the test)", kind="budget")
            short.stop("budget (the test)", kind="budget")

        worker = FaultBeforeFirstPush(_options(target, max_step_tokens=100), end_the_sweep)
        assert worker.run() == 0, worker.exit_reason
        assert list(worker._refused_runs) == [long.run_id] and worker.finished


def test_a_worker_whose_push_rejoin_finds_the_run_over_ends_with_0(tmp_path) -> None:
    """Evicted before its push while the run ended: the push's re-join answered "finished" (the identity emptied),
    and the wait past the refused version long-polled without a membership: UNAUTHENTICATED, exit 1 (review,
    2026-11-29)."""
    spec = tiny_spec(run={"rounds": 3, "workers": 1}, inner={"steps": 2}, coordinator={"lease_s": 60.0})
    with serving(spec, tmp_path / "state") as (group, target):
        run = group.runs[0]

        def end_the_run(worker: Worker) -> None:
            run.leave(pb.LeaveRequest(worker_id=worker.identity.worker_id, worker_secret=worker.identity.worker_secret,
                                      reason="evicted (the test)"))
            run.stop("the run ended meanwhile (the test)", kind="budget")

        worker = FaultBeforeFirstPush(_options(target), end_the_run)
        assert worker.run() == 0, worker.exit_reason
        assert worker.finished


class OutOfMemoryAtBuild(Worker):
    """The real worker, whose model build runs out of device memory for windows of `seq_len`."""

    def __init__(self, options, seq_len: int) -> None:
        super().__init__(options, TOKEN)
        self.oom_seq_len = seq_len

    def _build_model(self, spec):
        if spec.data.seq_len == self.oom_seq_len:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB (the test)")
        return super()._build_model(spec)


def test_a_restarted_worker_builds_no_run_ahead_that_it_refused(tmp_path) -> None:
    """A worker that refused the last run of a sweep (out of memory building its model) kept a membership file naming
    it; the next process built that model ahead and ended with a traceback, every other start under a supervisor
    that starts it again (review of the sweep's wire, 2026-11-29). Now the refusal removes the file, and a build
    ahead that fails is skipped for the join to refuse."""
    spec = tiny_spec(sweep={"seq_lens": [8, 16]}, run={"rounds": 5, "workers": 1}, inner={"steps": 2},
                     coordinator={"lease_s": 60.0})
    with serving(spec, tmp_path / "state", occupied=True) as (group, target):
        short, long = group.runs
        short.stop("pruned: a test")  # only L16 is left
        membership = tmp_path / "membership.json"
        for start in range(2):
            worker = OutOfMemoryAtBuild(_options(target, membership_file=membership), 16)
            assert run_until(worker, lambda w: False, 60) == 1
            assert f"cannot build the model of {long.run_id}: out of memory on cpu" in worker.exit_reason, start
            assert not membership.exists(), start
        # A membership file written before the refusal (a process killed between the two): the build ahead that
        # runs out of memory is skipped, and the join refuses the run with its reason.
        ahead = OutOfMemoryAtBuild(_options(target, membership_file=membership), 16)
        member = ahead.client.join("w", "cpu", 1)
        write_membership(membership, Membership(target, member.run_id, member.worker_id, member.worker_secret,
                                                member.run_spec_json))
        assert run_until(ahead, lambda w: False, 60) == 1
        assert f"cannot build the model of {long.run_id}: out of memory" in ahead.exit_reason, ahead.exit_reason
