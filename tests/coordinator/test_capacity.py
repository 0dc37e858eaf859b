"""The coordinator's own bound on the model it builds (coordinator/capacity.py): the decision over a run spec and
a limit, counted on the meta device without building the model.

Before, nothing bounded it: `[model.overrides] n_layers = 100000` made `rcswarm coordinator` (and `rcswarm run`)
allocate until the machine swapped. The flag is tests/coordinator/test_coordinator_max_params.py, the process with
that spec tests/swarm/test_coordinator_capacity.py.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator import COORDINATOR_BYTES_PER_PARAMETER, ParameterLimit, model_problem
from rcswarm.models import registry
from rcswarm.models.limits import bounded_parameter_count, host_memory_bytes
from tests.helpers.specs import tiny_spec

HUGE = {"n_layers": 100_000}
# Python-level memory a refused spec may cost (the meta build's modules until the count stops).
PEAK_BOUND = 256 << 20


def count_of(spec: RunSpec) -> int:
    return registry.parameter_count_of(spec.model.name, spec.model.preset, spec.model.overrides)


def sweep_spec(lengths: list[int]) -> RunSpec:
    return tiny_spec(sweep={"seq_lens": lengths})


def test_a_model_within_the_limit_passes_and_one_parameter_more_is_refused_naming_every_number() -> None:
    spec = tiny_spec()
    count = count_of(spec)
    assert model_problem(spec, ParameterLimit(count, "--max-params")) == ""
    problem = model_problem(spec, ParameterLimit(count - 1, "--max-params"))
    assert problem == (f"the model (lstm_lm preset 'tiny') has {count:,} parameters, held at "
                       f"{COORDINATOR_BYTES_PER_PARAMETER} bytes each (about {count * 40 / 2**20:.1f} MiB): more than "
                       f"this coordinator's limit of {count - 1:,} parameters (--max-params)")


def test_a_count_far_past_the_limit_stops_and_says_so() -> None:
    spec = tiny_spec()
    count = count_of(spec)
    problem = model_problem(spec, ParameterLimit(count // 3, "--max-params"))
    assert problem.startswith(f"the model (lstm_lm preset 'tiny') has more than {count // 3:,} parameters (its count "
                              "on the meta device stopped at "), problem
    assert problem.endswith(f"more than this coordinator's limit of {count // 3:,} parameters (--max-params)"), problem


def test_each_run_of_a_sweep_holds_its_own_copy() -> None:
    spec = sweep_spec([16, 32, 64])
    count = count_of(spec)
    assert model_problem(spec, ParameterLimit(3 * count, "--max-params")) == ""
    problem = model_problem(spec, ParameterLimit(3 * count - 1, "--max-params"))
    held = f"has {count:,} parameters, held by each of the sweep's 3 runs: {3 * count:,} parameters in all at 40 bytes each"
    assert held in problem, problem
    assert f"limit of {3 * count - 1:,} parameters (--max-params)" in problem, problem


def test_a_huge_model_is_refused_quickly_without_building_it() -> None:
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "small", "overrides": HUGE})
    limit = ParameterLimit(5 * 10**8, "the test's limit")
    started = time.monotonic()
    tracemalloc.start()
    try:
        problem = model_problem(spec, limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    seconds = time.monotonic() - started
    assert problem.startswith("the model (lstm_lm preset 'small', overrides {'n_layers': 100000}) has more than "
                              "500,000,000 parameters (its count on the meta device stopped at "), problem
    assert problem.endswith("held at 40 bytes each (more than 18.6 GiB): more than this coordinator's limit of "
                            "500,000,000 parameters (the test's limit)"), problem
    # The refusal before any build decides (the peak); the time is a hang guard only (building it takes minutes).
    assert seconds < 60 and peak < PEAK_BOUND, (seconds, peak)


def test_a_model_of_too_many_modules_is_refused_naming_them() -> None:
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "tiny", "overrides": HUGE})
    problem = model_problem(spec, ParameterLimit(10**12, "--max-params", max_modules=500))
    stopped = bounded_parameter_count("lstm_lm", "tiny", HUGE, 10**12, max_modules=500)
    assert stopped.stopped == "modules"
    assert problem == ("the model (lstm_lm preset 'tiny', overrides {'n_layers': 100000}) has more than 500 submodules "
                       f"(its count on the meta device stopped there, at {stopped.parameters:,} parameters): more than "
                       "a coordinator counts or builds (rcswarm.models.limits.MAX_MODULES)")


def test_the_default_limit_is_what_the_hosts_memory_holds() -> None:
    limit = ParameterLimit.of()
    assert limit.max_params == host_memory_bytes() // COORDINATOR_BYTES_PER_PARAMETER
    assert "GiB of host memory at 40 bytes per parameter; --max-params sets it" in limit.source
    assert ParameterLimit.of(1000) == ParameterLimit(1000, "--max-params")
    with pytest.raises(ValueError, match=r"--max-params -1: expected >= 0"):
        ParameterLimit.of(-1)
