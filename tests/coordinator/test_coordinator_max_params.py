"""`rcswarm coordinator --max-params N`: the most parameters the coordinator holds over its runs, checked before
anything is created (coordinator/capacity.py decides; tests/coordinator/test_capacity.py). In this process: the
refusals only, since a spec the coordinator accepts is served until it is stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from tests.helpers.specs import TOKEN, tiny_spec, write_spec


def count_of(spec: RunSpec) -> int:
    return registry.parameter_count_of(spec.model.name, spec.model.preset, spec.model.overrides)


def main(tmp_path: Path, spec: RunSpec, *flags: str) -> int:
    """`rcswarm coordinator` in this process, on a config of `spec` and a state dir that does not exist yet."""
    config = write_spec(spec, tmp_path / "run.toml")
    return coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                 "--token", TOKEN, *flags])


@pytest.mark.timeout(60)  # before, the flag did not exist; a spec it passes would be served until stopped
def test_max_params_refuses_the_spec_with_one_line_before_anything_is_created(tmp_path, capsys) -> None:
    spec = tiny_spec()
    count = count_of(spec)
    assert main(tmp_path, spec, "--max-params", str(count - 1)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rcswarm coordinator: the model (lstm_lm preset 'tiny') has "), lines
    assert f"limit of {count - 1:,} parameters (--max-params)" in lines[0], lines
    assert not (tmp_path / "state").exists()


@pytest.mark.timeout(60)
def test_max_params_counts_every_run_of_a_sweep(tmp_path, capsys) -> None:
    spec = tiny_spec(sweep={"seq_lens": [16, 32]})
    count = count_of(spec)
    assert main(tmp_path, spec, "--max-params", str(2 * count - 1)) == 2
    err = capsys.readouterr().err
    assert "held by each of the sweep's 2 runs" in err and f"limit of {2 * count - 1:,} parameters" in err, err
    assert not (tmp_path / "state").exists()


@pytest.mark.timeout(60)
def test_a_negative_max_params_is_a_usage_error(tmp_path, capsys) -> None:
    assert main(tmp_path, tiny_spec(), "--max-params", "-1") == 2
    assert "rcswarm coordinator: --max-params -1: expected >= 0" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
