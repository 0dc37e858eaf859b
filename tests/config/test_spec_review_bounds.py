"""Values the run spec took that broke or silently did nothing (a fuzz review of the spec, 2026-11): an unreadable
curriculum.law_from, an unbounded inner.weight_decay, denormal rates and bounds, unnamed model keys, whole 10^5-
character values echoed in refusals, and adaptive-only curriculum keys taken and ignored under the fixed policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.config.runspec import (
    ADAPTIVE_ONLY,
    MIN_CENTERED_CLIP_TAU,
    MIN_LR,
    MIN_UPDATE_NORM,
    CurriculumSection,
    InnerSection,
    RunSpec,
)
from rcswarm.coordinator import curriculum as curricula
from rcswarm.coordinator.capacity import ParameterLimit, model_problem
from tests.helpers.specs import tiny_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LONG_NAME = "x" * 300  # one path component past every file system's NAME_MAX (255): ENAMETOOLONG


# M2: curriculum.law_from that the OS cannot read.

def test_a_law_from_too_long_for_the_os_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError) as refusal:
        curricula.fitted_law(f"/tmp/{LONG_NAME}")
    assert str(refusal.value) == f"curriculum.law_from = '/tmp/{LONG_NAME}' cannot be read: File name too long"


def test_a_law_from_this_user_may_not_read_is_refused_naming_the_key(tmp_path, monkeypatch) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,seq_len,loss,wall_time,run_id\n")

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(curricula.analysis, "read_metrics", denied)
    with pytest.raises(ValueError, match=rf"^curriculum\.law_from = '{path}' cannot be read: Permission denied$"):
        curricula.fitted_law(path)


def test_rcswarm_run_refuses_an_unreadable_law_from_in_one_line(tmp_path, capsys) -> None:
    from rcswarm.cli import run as run_cli

    config = tmp_path / "run.toml"
    spec = RunSpec.from_dict({**tiny_spec().to_dict(), "curriculum": {
        "policy": "adaptive", "seq_lens": [2, 4], "law_from": LONG_NAME}})
    config.write_text(spec.to_toml())
    status = run_cli.main([str(config), "--run-dir", str(tmp_path / "run")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2, lines
    assert len(lines) == 1 and "curriculum.law_from = " in lines[0] and "cannot be read: File name too long" in lines[0]
    assert not (tmp_path / "run").exists()


# M3: inner.weight_decay bounded by lr · weight_decay < 1.

@pytest.mark.parametrize(("lr", "decay"), [(3e-3, 1e300), (3e-3, 2.0**63), (3e-3, 1 / 3e-3), (1.0, 1.0), (10.0, 0.5)])
def test_a_weight_decay_that_does_not_shrink_theta_is_refused(lr: float, decay: float) -> None:
    with pytest.raises(ValueError) as refusal:
        RunSpec.from_dict({"inner": {"lr": lr, "weight_decay": decay}})
    message = str(refusal.value)
    assert message.startswith(f"inner.weight_decay = {decay!r} is invalid: expected"), message
    assert "inner.lr × inner.weight_decay < 1" in message and f"inner.lr = {lr:g}" in message, message


def test_a_weight_decay_below_the_bound_is_taken() -> None:
    assert RunSpec.from_dict({"inner": {"lr": 1e-3, "weight_decay": 999.0}}).inner.weight_decay == 999.0
    assert InnerSection(lr=10.0, weight_decay=0.0).weight_decay == 0.0
    assert InnerSection().weight_decay == 0.01


# M4: denormal rates and bounds.

@pytest.mark.parametrize(("table", "key", "value", "floor"), [
    ("inner", "lr", 5e-324, MIN_LR), ("inner", "lr", 1e-11, MIN_LR), ("outer", "lr", 5e-324, MIN_LR),
    ("sync", "centered_clip_tau", 5e-324, MIN_CENTERED_CLIP_TAU), ("sync", "centered_clip_tau", 1e-4, MIN_CENTERED_CLIP_TAU),
    ("sync", "max_update_norm", 5e-324, MIN_UPDATE_NORM), ("sync", "max_update_norm", 1e-7, MIN_UPDATE_NORM),
])
def test_a_value_below_its_floor_is_refused_naming_key_value_and_floor(table, key, value, floor) -> None:
    with pytest.raises(ValueError) as refusal:
        RunSpec.from_dict({table: {key: value}})
    message = str(refusal.value)
    assert message.startswith(f"{table}.{key} = {value!r} is invalid: expected"), message
    assert f"{floor:g}" in message, message


@pytest.mark.parametrize(("table", "key", "value"), [
    ("inner", "lr", MIN_LR), ("outer", "lr", MIN_LR), ("sync", "centered_clip_tau", MIN_CENTERED_CLIP_TAU),
    ("sync", "max_update_norm", MIN_UPDATE_NORM), ("sync", "max_update_norm", 0.0),
])
def test_the_floors_themselves_and_automatic_norms_are_taken(table, key, value) -> None:
    assert getattr(getattr(RunSpec.from_dict({table: {key: value}}), table), key) == value


@pytest.mark.parametrize(("table", "key"), [("inner", "lr"), ("outer", "lr"), ("sync", "centered_clip_tau")])
def test_zero_is_still_refused(table, key) -> None:
    with pytest.raises(ValueError, match=rf"^{table}\.{key} = 0\.0 is invalid"):
        RunSpec.from_dict({table: {key: 0.0}})


# L1: an unknown model.name or model.preset names its key.

def test_an_unknown_model_name_names_model_name() -> None:
    spec = RunSpec.from_dict({"model": {"name": "x", "preset": "tiny"}})
    with pytest.raises(ValueError, match=r"^model\.name = 'x' is unknown: expected a registered model name, one of \["):
        model_problem(spec, ParameterLimit.of(10**6))


def test_an_unknown_model_preset_names_model_preset() -> None:
    spec = RunSpec.from_dict({"model": {"name": "lstm_lm", "preset": "huge"}})
    with pytest.raises(ValueError, match=r"^model\.preset = 'huge' is unknown for model 'lstm_lm': expected one of \["):
        model_problem(spec, ParameterLimit.of(10**6))


# L2: a long value is cut in the refusal.

@pytest.mark.parametrize("data", [
    {"run": {"name": "!" * 10**5}}, {"data": {"source": "s" * 10**5}}, {"inner": {"optimizer": "o" * 10**5}},
    {"sweep": {"seq_lens": [0] * 10**5}},
])
def test_a_long_value_is_cut_in_the_refusal(data) -> None:
    with pytest.raises(ValueError) as refusal:
        RunSpec.from_dict(data)
    message = str(refusal.value)
    assert len(message) < 500 and "characters)" in message, message[:600]


def test_a_long_string_says_its_length() -> None:
    with pytest.raises(ValueError) as refusal:
        RunSpec.from_dict({"data": {"source": "s" * 10**5}})
    assert f"data.source = '{'s' * 199}… (100,000 characters) is invalid: expected one of" in str(refusal.value)


def test_a_long_model_name_is_cut_in_the_refusal() -> None:
    for model in ({"name": "m" * 10**5}, {"name": "lstm_lm", "preset": "p" * 10**5}):
        spec = RunSpec.from_dict({"model": model})
        with pytest.raises(ValueError) as refusal:
            model_problem(spec, ParameterLimit.of(10**6))
        assert len(str(refusal.value)) < 600 and "(100,000 characters)" in str(refusal.value)


def test_a_long_unknown_key_is_cut_in_the_refusal() -> None:
    with pytest.raises(ValueError) as refusal:
        RunSpec.from_dict({"run": {"k" * 10**5: 1}})
    assert len(str(refusal.value)) < 600 and "characters)" in str(refusal.value)


def test_a_short_value_is_written_whole() -> None:
    with pytest.raises(ValueError, match=r"^data\.source = 'nope' is invalid: expected one of"):
        RunSpec.from_dict({"data": {"source": "nope"}})


# L3: the adaptive policy's law and budget under the fixed policy.

@pytest.mark.parametrize(("key", "value"), [
    ("law_from", "runs/earlier"), ("alpha_inf", 0.3), ("tau", 720.0), ("amplitude", 2.0), ("budget_seconds", 600.0),
])
def test_an_adaptive_only_key_is_refused_under_the_fixed_policy(key, value) -> None:
    with pytest.raises(ValueError, match=rf"^curriculum\.{key} = .* is invalid: expected the default .* unless "
                                         r'curriculum\.policy = "adaptive"'):
        RunSpec.from_dict({"curriculum": {"policy": "fixed", key: value}})
    # ... and taken with the adaptive policy.
    table = {"policy": "adaptive", "seq_lens": [8, 16], key: value}
    if key != "law_from":
        table = {"alpha_inf": 0.3, "tau": 720.0, **table}
    assert getattr(RunSpec.from_dict({"curriculum": table}).curriculum, key) == value


def test_the_defaults_are_taken_under_the_fixed_policy() -> None:
    defaults = {key: CurriculumSection.__dataclass_fields__[key].default for key in ADAPTIVE_ONLY}
    assert RunSpec.from_dict({"curriculum": {"policy": "fixed", **defaults}}).curriculum == CurriculumSection()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda path: path.name)
def test_every_example_still_loads(path: Path) -> None:
    RunSpec.from_toml(path)
