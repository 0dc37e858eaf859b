"""The example configs: every one loads and builds its model (the git-frames one training on what
`rcswarm data frames` makes runs git: tests/swarm/test_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda path: path.name)
def test_every_example_loads_and_builds_its_model(path: Path):
    spec = RunSpec.from_toml(path)
    for run in spec.sweep_runs():
        model = registry.build_model(run.model.name, run.model.preset, run.model.overrides, seed=run.run.seed)
        assert sum(p.numel() for p in model.parameters()) > 0
