"""The coordinator's own bound on the model it builds: every run of it holds a full copy of the model's state.

Before anything is built, `rcswarm coordinator` counts the run spec's model on the meta device
(`models/limits.bounded_parameter_count`: shapes only, stopped far past the limit or at
`MAX_MODULES` submodules) and refuses a spec whose runs
would hold more parameters than its limit, with one line naming the model, its parameter count, the bytes held per
parameter and the limit with where it comes from (`model_problem`). A sweep's runs each hold their own θ, momentum
and buffers (`sweep.build_runs`), so its count is the model's times its runs. The limit is `--max-params` or, by
default, what the host's memory holds (a container's cgroup limit counted, `models/limits.host_memory_bytes`) at
COORDINATOR_BYTES_PER_PARAMETER. Every model a coordinator builds is built at its start: a restart is a start (and a
restart may not change the model, resume.py), a sweep builds all its runs then, the curriculum changes lengths only.
Like the worker's (worker/limits.py), the bound stops the absurd (`n_layers = 100000` made the coordinator allocate
until the machine swapped), not every model a host cannot hold: the updates a round holds and the allocator's free
pages come on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcswarm.config.runspec import RunSpec
from rcswarm.models.limits import (
    GIB,
    MAX_MODULES,
    ModelCount,
    bounded_parameter_count,
    counted,
    describe_model,
    host_memory_bytes,
    modules_problem,
)

# What one run keeps per parameter: 10 float32 copies (4 bytes each). θ, the outer momentum and the broadcast
# residual (the round step's error feedback), and the same three of the version before, which the last close keeps
# for the next to write into (records.SpareBuffers: the next aggregate, the outer step's target and the step land
# there, so the pending aggregate takes no memory of its own); the fp32 pull payloads of θ_v and of θ_{v-1} (built by
# a full pull; a pull may still stream the older); the round's step payload (4 bytes at an fp32 downlink, less when
# compressed); centered_clip's kept aggregate (its next starting point). A checkpoint is written from θ's buffers and
# read back only at a start, so it adds no copy. Measured (lstm_lm base10m, fp32, 2 workers, 5 rounds): 39 bytes a
# parameter resident once freed memory is trimmed; 65 at the peak with the round's held updates (one per worker, at
# the uplink codec: 4 bytes fp32, about 1 int8) and the allocator's free pages.
COORDINATOR_BYTES_PER_PARAMETER = 40


@dataclass(frozen=True)
class ParameterLimit:
    """The most parameters this coordinator holds over all its runs, and where that number comes from; the most
    submodules a model it counts may register (`models/limits.MAX_MODULES`)."""

    max_params: int
    source: str
    max_modules: int = MAX_MODULES

    @classmethod
    def of(cls, max_params: int = 0) -> ParameterLimit:
        """`max_params` (--max-params) when > 0, else what the host's memory holds; ValueError below 0."""
        if max_params < 0:
            raise ValueError(f"--max-params {max_params}: expected >= 0 (0: what the host's memory holds)")
        if max_params > 0:
            return cls(max_params, "--max-params")
        memory = host_memory_bytes()
        return cls(memory // COORDINATOR_BYTES_PER_PARAMETER,
                   f"the {memory / GIB:.1f} GiB of host memory at {COORDINATOR_BYTES_PER_PARAMETER} bytes per "
                   "parameter; --max-params sets it")


def _size(n_bytes: int) -> str:
    """A size for a refusal: GiB, or MiB below one GiB."""
    return f"{n_bytes / GIB:,.1f} GiB" if n_bytes >= GIB else f"{n_bytes / (1 << 20):,.1f} MiB"


def _held(count: ModelCount, ceiling: int, runs: int) -> str:
    """What the runs hold at COORDINATOR_BYTES_PER_PARAMETER, in words (from `ceiling` up where the count stopped)."""
    held = (count.parameters if count.complete else ceiling) * runs
    bound = "about " if count.complete else "more than "
    size = f"{bound}{_size(held * COORDINATOR_BYTES_PER_PARAMETER)}"
    if runs == 1:
        return f"held at {COORDINATOR_BYTES_PER_PARAMETER} bytes each ({size})"
    return (f"held by each of the sweep's {runs} runs: {'' if count.complete else 'more than '}{held:,} parameters "
            f"in all at {COORDINATOR_BYTES_PER_PARAMETER} bytes each ({size})")


def model_problem(spec: RunSpec, limit: ParameterLimit) -> str:
    """Why this coordinator does not build the model of `spec` ("" when it may): its parameters times the runs
    (`spec.sweep_runs()`, each holding its own copy) above `limit.max_params`, or more than `limit.max_modules`
    submodules; counted on the meta device, allocating nothing. ValueError for a model config that does not build
    at all (an unknown name, preset or field)."""
    runs = len(spec.sweep_runs())
    model = spec.model
    ceiling = limit.max_params // runs
    count = bounded_parameter_count(model.name, model.preset, model.overrides, ceiling, limit.max_modules)
    if count.complete and count.parameters * runs <= limit.max_params:
        return ""
    described = describe_model(model.name, model.preset, model.overrides)
    return modules_problem(count, ceiling, described, "a coordinator") or (
        f"the model ({described}) has {counted(count, ceiling)}, {_held(count, ceiling, runs)}: more than this "
        f"coordinator's limit of {limit.max_params:,} parameters ({limit.source})")
