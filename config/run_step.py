"""The run step: a run's own count of the inner steps trained, across its rounds (issue #27).

A metric row of a round carries the version its worker trained from and, through its step counter,
k, its step within that round (from 0). The run step of that row is the number of steps the run's
rounds trained before its version plus k + 1:

    run_step(v, k) = Σ_{u < v} steps_u + k + 1

where steps_u is what round u really trained: the count its record holds (`RunSteps.recorded`, the
coordinator's `rounds.steps`: the most inner steps among its updates trained from version u), else
`inner.steps`. Step-boxed rounds train exactly `inner.steps`, so for them run_step(v, k) is
v × inner.steps + k + 1 as before; time-boxed rounds (`sync.round = "time"`) and adaptive step
counts (`sync.adaptive_steps`) train more or fewer, and counting what they trained keeps consecutive
versions' run steps from overlapping or leaving gaps. A hivemind round always trains `inner.steps`
(the hivemind peer ignores the coordinator's pacing), and a state dir written before the count was
recorded has none: both count `inner.steps` per round.

This module is the pure rule, in config/ because both sides use it: the coordinator's fixed
curriculum schedule and the analysis (observe/, `analysis.run_steps` reads the recorded counts
from a store) and the hivemind worker's schedule, which may import neither observe nor state.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunSteps:
    """A run's step counter: `inner_steps` (its `inner.steps`) and the steps recorded per round (version -> steps)."""

    inner_steps: int
    recorded: Mapping[int, int] = field(default_factory=dict)
    # The recorded versions in order, and the sums of (recorded steps - inner_steps) over each prefix of them.
    _versions: list[int] = field(init=False, repr=False, compare=False, default_factory=list)
    _extra: list[int] = field(init=False, repr=False, compare=False, default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.inner_steps, bool) or not isinstance(self.inner_steps, int) or self.inner_steps < 1:
            raise ValueError(f"inner_steps={self.inner_steps!r}: expected a positive integer")
        for version, steps in self.recorded.items():
            if version < 0 or isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                raise ValueError(f"recorded[{version!r}]={steps!r}: expected a version >= 0 and a positive step count")
        versions = sorted(self.recorded)
        object.__setattr__(self, "_versions", versions)
        extra = (self.recorded[v] - self.inner_steps for v in versions)
        object.__setattr__(self, "_extra", [0, *itertools.accumulate(extra)])

    def before(self, version: int) -> int:
        """The steps the run's rounds trained before `version`: Σ_{u < version} steps_u."""
        if version < 0:
            raise ValueError(f"version={version!r}: expected a version >= 0")
        return version * self.inner_steps + self._extra[bisect.bisect_left(self._versions, version)]

    def run_step(self, version: int, k: int) -> int:
        """The run step of the step `k` (from 0) within the round trained from `version`: before(version) + k + 1."""
        return self.before(version) + k + 1
