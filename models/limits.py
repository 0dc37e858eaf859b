"""What bounds a model before it is built, for every process that builds one (the worker, the coordinator).

`host_memory_bytes`: the host's physical memory, lowered to the container's cgroup limit; each side divides it by
what it keeps per parameter (worker/limits.py, coordinator/capacity.py). `describe_model`: the model a run spec
names, as both sides' refusals write it.

`bounded_parameter_count`: `registry.parameter_count_of` (the model built on the meta device, shapes only) that
stops once the parameters registered so far pass twice a limit, the submodules registered pass `MAX_MODULES`, or
the parameter registrations pass `MAX_TENSORS` (one module may register any number of them).
The meta build allocates no tensor, but every module is still a Python object: the byte LSTM with
`n_layers = 100000` took 70 s and 2.7 GiB of Python objects to count in full (review of the coordinator's bound,
2026-11). Twice: a parameter a builder replaces (an output layer built with its own weight, then given the
embedding's) counts until it is replaced, so a model of tied weights within the limit is still counted to its end.
The largest shipped preset (chaingpt 1.5b) registers 170 submodules, and for every shipped preset the running count
ends at the model's count (tests/models/test_model_limits.py), so neither stop refuses a model that fits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
# cgroup v2, then v1: the memory a container may use ("max" or a huge number when unlimited).
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
# The most submodule registrations a count follows (about 3 s and 130 MiB of Python objects on the meta device);
# 190 × the largest shipped model's 170.
MAX_MODULES = 1 << 15
# The most parameter registrations a count follows: one module may register any number of them, and torch's
# `nn.LSTM(num_layers=N)` takes time growing as N² to do so (its `__setattr__` searches a list each time): 20,000
# layers took 27 s while registering one module (review of the coordinator's bound, 2026-11-28). 16,384
# registrations (an LSTM of 4,096 layers) take 1.3 s here; the largest shipped preset registers 308 (53 × fewer).
MAX_TENSORS = 1 << 14


def host_memory_bytes() -> int:
    """The host's physical memory, or the cgroup's memory limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def describe_model(name: str, preset: str, overrides: Mapping[str, Any]) -> str:
    """The model a run spec names, for a refusal: "lstm_lm preset 'small', overrides {'n_layers': 8}"."""
    return f"{name} preset {preset!r}" + (f", overrides {dict(overrides)}" if overrides else "")


@dataclass(frozen=True)
class ModelCount:
    """A model's parameters, submodule and parameter registrations as counted; `stopped` says why the count stopped
    early ("parameters": past twice the limit, "modules": past the most modules, "tensors": past the most parameter
    registrations; "" when it is the model's count)."""

    parameters: int
    modules: int
    stopped: str = ""
    tensors: int = 0

    @property
    def complete(self) -> bool:
        """Whether `parameters` is the model's count (else what was held when the count stopped)."""
        return not self.stopped


class _Stopped(Exception):
    """Raised from a registration hook to end the build being counted."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Tally:
    """The parameters and submodules registered by the counting thread (the hooks are process-wide: registrations
    of other threads are not counted). A parameter counts once however many places hold it (a tied weight), and a
    place given another parameter (`head.weight = embed.weight`) no longer counts the one it held."""

    def __init__(self, most_parameters: int, most_modules: int, most_tensors: int) -> None:
        self.most_parameters, self.most_modules, self.most_tensors = most_parameters, most_modules, most_tensors
        self.tensors = 0
        self.thread = threading.get_ident()
        # (id of the module, name) -> (the module, its parameter there), held so that no id is reused meanwhile.
        self.places: dict[tuple[int, str], tuple[Any, Any]] = {}
        self.holders: dict[int, int] = {}  # id of a parameter -> the places that hold it
        self.parameters = 0
        self.modules = 0

    def _hold(self, parameter: Any, change: int) -> None:
        """One place more (`change` 1) or fewer (-1) holds `parameter`; it counts while one does."""
        held = self.holders.get(id(parameter), 0) + change
        self.holders[id(parameter)] = held
        if held == (1 if change > 0 else 0):
            self.parameters += change * parameter.numel()

    def parameter(self, module: Any, name: str, parameter: Any) -> None:
        """A parameter registration hook: count it; stop the build past the most parameters."""
        if threading.get_ident() != self.thread:
            return
        previous = self.places.get((id(module), name))
        if previous is not None:
            self._hold(previous[1], -1)
        self.places[(id(module), name)] = (module, parameter)
        self._hold(parameter, 1)
        self.tensors += 1
        if self.parameters > self.most_parameters:
            raise _Stopped("parameters")
        if self.tensors > self.most_tensors:
            raise _Stopped("tensors")

    def module(self, module: Any, name: str, submodule: Any) -> None:
        """A module registration hook: count it; stop the build past the most modules."""
        if submodule is None or threading.get_ident() != self.thread:
            return
        self.modules += 1
        if self.modules > self.most_modules:
            raise _Stopped("modules")

    def count(self, stopped: str) -> ModelCount:
        return ModelCount(self.parameters, self.modules, stopped, self.tensors)


def counted(count: ModelCount, ceiling: int) -> str:
    """A model's parameters as `count` counted them, for a refusal: its count, or more than `ceiling` where the count
    stopped."""
    if count.complete:
        return f"{count.parameters:,} parameters"
    return f"more than {ceiling:,} parameters (its count on the meta device stopped at {count.parameters:,})"


def modules_problem(count: ModelCount, ceiling: int, described: str, who: str) -> str:
    """The refusal of a count that stopped at the most submodules or parameter registrations while its parameters
    were within `ceiling` ("" for any other count); `who`: "a coordinator", "a worker"."""
    if count.stopped not in ("modules", "tensors") or count.parameters > ceiling:
        return ""
    many, bound = ((f"{count.modules - 1:,} submodules", "MAX_MODULES") if count.stopped == "modules" else
                   (f"{count.tensors - 1:,} parameter tensors", "MAX_TENSORS"))
    return (f"the model ({described}) has more than {many} (its count on the meta device stopped there, at "
            f"{count.parameters:,} parameters): more than {who} counts or builds (rcswarm.models.limits.{bound})")


# What torch raises where a tensor's shape does not fit its sizes (a dimension past int64: "Overflow when unpacking
# long long", TypeError; a product of dimensions past it: "Storage size calculation overflowed", RuntimeError):
# `[model.overrides] d_model = 2**63 - 1` (review of the specs, 2026-11), for every family.
BUILD_OVERFLOWS = (RuntimeError, TypeError, OverflowError, MemoryError)
# The most characters of torch's own message an overflow refusal quotes (its first line; the rest is a C++ trace).
MAX_QUOTED_CHARS = 200


def overflow_problem(name: str, preset: str, overrides: Mapping[str, Any], exc: BaseException) -> str:
    """The refusal of a model whose meta-device build raised `exc` (one of BUILD_OVERFLOWS): names the overrides."""
    said = (str(exc).splitlines() or [""])[0]
    if len(said) > MAX_QUOTED_CHARS:
        said = said[:MAX_QUOTED_CHARS] + "…"
    keys = ", ".join(f"model.overrides.{key} = {value!r}"[:MAX_QUOTED_CHARS] for key, value in overrides.items())
    return (f"the model ({describe_model(name, preset, {})}) cannot be built with {keys}: its tensors overflow "
            f"(torch: {type(exc).__name__}: {said}); expected overrides that give sizes a tensor holds")


def bounded_parameter_count(name: str, preset: str, overrides: Mapping[str, Any] | None, most: int,
                            max_modules: int = MAX_MODULES, max_tensors: int = MAX_TENSORS) -> ModelCount:
    """`registry.parameter_count_of(name, preset, overrides)` when the count ends (the caller compares it with
    `most`), else where it stopped (`ModelCount.stopped`): once the parameters held passed 2 × `most` (the model has
    more than `most`), the submodule registrations passed `max_modules`, or the parameter registrations passed
    `max_tensors`. ValueError as `make_config` raises it, and for overrides whose tensors overflow torch's sizes
    (`BUILD_OVERFLOWS` from the build: `overflow_problem`)."""
    from torch.nn.modules import module as torch_module  # torch, only once a model is counted

    from rcswarm.models import registry

    registry.make_config(name, preset, overrides)  # its ValueError as it is; what follows is the build alone
    tally = _Tally(2 * most, max_modules, max_tensors)
    hooks = [torch_module.register_module_parameter_registration_hook(tally.parameter),
             torch_module.register_module_module_registration_hook(tally.module)]
    try:
        count = registry.parameter_count_of(name, preset, overrides)
    except _Stopped as stop:
        return tally.count(stop.what)
    except BUILD_OVERFLOWS as exc:
        if not overrides:  # a shipped preset that does not build: a bug, not a config to refuse
            raise
        raise ValueError(overflow_problem(name, preset, overrides, exc)) from None
    finally:
        for hook in hooks:
            hook.remove()
    return ModelCount(count, tally.modules, "", tally.tensors)
