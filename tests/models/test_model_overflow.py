"""Model sizes past what a tensor holds (review of the specs, 2026-11): `[model.overrides] d_model = 2**63 - 1` made
the meta-device count raise torch's RuntimeError ("Storage size calculation overflowed") or TypeError ("Overflow when
unpacking long long"), shown as a traceback by `rcswarm run` and `rcswarm coordinator` (which refuse ValueError
only). `models/limits.bounded_parameter_count` now refuses such overrides with a ValueError naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.capacity import ParameterLimit, model_problem
from rcswarm.models import registry
from rcswarm.models.limits import bounded_parameter_count
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

HUGE = 2**63 - 1
# Per family, fields whose overflow torch raised at the meta build (the review's ov1.txt and ov2.txt).
OVERFLOWING = [
    ("chaingpt", "vocab_size", HUGE), ("chaingpt", "d_mlp", HUGE),
    ("frame", "n_hidden", HUGE), ("frame", "n_hidden", 2**31), ("frame", "mlp_ratio", HUGE),
    ("lstm", "d_model", HUGE), ("lstm_lm", "d_model", HUGE), ("lstm_lm", "mlp_ratio", HUGE),
    ("psm", "mlp_ratio", HUGE), ("psm", "chunk_size", HUGE), ("rwkv7", "lora_rank", HUGE), ("rwkv7", "mlp_ratio", HUGE),
    ("ssm", "d_state", HUGE), ("ssm", "d_model", HUGE), ("ssm", "dt_rank", HUGE), ("sum", "mlp_ratio", HUGE),
    ("transformer", "mlp_ratio", HUGE), ("transformer", "max_len", HUGE),
]


def test_every_family_is_covered() -> None:
    assert {family for family, _, _ in OVERFLOWING} == set(registry.list_models())


def spec_of(family: str, field: str, value: int) -> RunSpec:
    return RunSpec.from_dict({"run": {"name": "t"}, "model": {"name": family, "preset": "tiny",
                                                              "overrides": {field: value}}})


@pytest.mark.parametrize(("family", "field", "value"), OVERFLOWING)
def test_an_overflowing_override_is_refused_naming_it(family: str, field: str, value: int) -> None:
    spec = spec_of(family, field, value)
    with pytest.raises(ValueError) as refusal:
        model_problem(spec, ParameterLimit.of(5 * 10**6))
    message = str(refusal.value)
    assert f"model.overrides.{field} = {value}" in message and "its tensors overflow" in message, message
    assert "\n" not in message and len(message) < 600, message  # torch's C++ trace is not quoted


def test_an_overflow_of_a_shipped_preset_is_not_disguised(monkeypatch) -> None:
    """Without overrides the config is not at fault: torch's error goes up as it is."""
    def overflow(name, preset, overrides=None):
        raise RuntimeError("Storage size calculation overflowed")
    monkeypatch.setattr(registry, "parameter_count_of", overflow)
    with pytest.raises(RuntimeError):
        bounded_parameter_count("lstm_lm", "tiny", None, 10**6)


def test_a_config_error_is_still_the_configs(monkeypatch) -> None:
    with pytest.raises(ValueError, match="d_model"):
        bounded_parameter_count("lstm_lm", "tiny", {"d_model": -1}, 10**6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["d_model", "mlp_ratio"])  # torch's RuntimeError, its TypeError (a traceback)
def test_rcswarm_coordinator_refuses_it_in_one_line(tmp_path: Path, capsys, field: str) -> None:
    spec = tiny_spec(model={"overrides": {field: HUGE}})
    config = write_spec(spec, tmp_path / "run.toml")
    status = coordinator_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                   "--token", TOKEN])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith("rcswarm coordinator: the model (lstm_lm preset 'tiny') cannot be "
                                                   f"built with model.overrides.{field} = {HUGE}"), lines
    assert not (tmp_path / "state").exists()
