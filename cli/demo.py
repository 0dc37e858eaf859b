"""The built-in demo: what `rcswarm run` with no config (and `make demo`) trains.

The mission in miniature: one coordinator serving a sweep of the byte-level LSTM language
model over four trained sequence lengths, one worker process per length, every length given
the same wall time (`DEMO_MINUTES`), so that the end of the run shows the held-out loss
falling as a power law in L, the fitted α(s), and the wall-time crossovers where the longer
lengths overtake the shorter ones despite their costlier steps (docs/RESULTS.md has the
full-size version). The run directory's run.toml is this spec, to copy and vary.
"""

from __future__ import annotations

from typing import Any

from rcswarm.config.runspec import RunSpec

# The wall time every run of the demo gets, in minutes (`rcswarm run --minutes` overrides it).
DEMO_MINUTES = 3.0

DEMO: dict[str, Any] = {
    "run": {"name": "demo", "rounds": 100_000, "workers": 4},
    "model": {"name": "lstm_lm", "preset": "small"},
    "data": {"source": "stdlib", "batch_size": 64},
    "inner": {"lr": 3e-3, "steps": 10},
    "sync": {"codec": "int8"},
    "sweep": {"seq_lens": [2, 4, 8, 16]},
}


def demo_spec() -> RunSpec:
    """The demo's run spec (validated like any RUN.toml)."""
    return RunSpec.from_dict(DEMO)
