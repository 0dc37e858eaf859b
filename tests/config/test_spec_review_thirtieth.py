"""Run specs a review of the run spec (2026-11-29) found taken, then failing later or doing nothing.

Before: `inner.beta2 = 0` (a legal Adam) made the automatic norm bound divide by zero at the coordinator's start; a
hivemind run with a [sweep] was taken and every hivemind worker then exited 2 at its start; a config nested ~900
levels deep raised RecursionError (and a JSON spec with a 5,000-digit integer a bare "Exceeds the limit (4300
digits)"), naming no file; and keys set where nothing reads them (a density with the int8 codec, a time budget in
step-boxed rounds, ...) were taken silently.
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing

import pytest
import torch

from rcswarm.config.runspec import MAX_TABLE_DEPTH, RunSpec
from rcswarm.coordinator.sweep import open_group
from rcswarm.sync.norm_bound import FALLBACK_NORM_BOUND, adam_step_bound, automatic_norm_bound
from tests.helpers.specs import tiny_spec

# --- inner.beta2 = 0 -------------------------------------------------------------------------------------------------


def adam_steps(beta1: float, gradients: list[float]) -> list[float]:
    """|θ_t − θ_{t−1}| of torch's AdamW at lr 1, β2 = 0, no weight decay, on one coordinate fed `gradients`."""
    theta = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([theta], lr=1.0, betas=(beta1, 0.0), weight_decay=0.0)
    moves = []
    for g in gradients:
        before = theta.detach().clone()
        theta.grad = torch.tensor([g])
        optimizer.step()
        moves.append(abs(float(theta.detach() - before)))
    return moves


def test_adam_step_bound_at_beta2_zero_is_sign_descent_or_no_bound():
    # β1 = 0: the step is g_t / |g_t|, a sign step of at most lr; torch agrees on gradients of any scale.
    assert adam_step_bound(0.0, 0.0) == 1.0
    assert max(adam_steps(0.0, [1e3, -1e-6, 5.0, 1e-9])) <= 1.0 + 1e-6
    # β1 > 0: m̂ keeps the large gradient while |g_t| is tiny, so no multiple of lr bounds a step.
    assert adam_step_bound(0.9, 0.0) is None
    assert adam_steps(0.9, [1e3, 1e-6])[1] > 1e6
    # The bound the coordinator computes at its start: no bound there (the fallback), not a ZeroDivisionError.
    spec = RunSpec.from_dict({"inner": {"beta2": 0.0}})
    bound, why = automatic_norm_bound(spec.inner, 1000, 1.0)
    assert bound == FALLBACK_NORM_BOUND and "no step bound" in why
    sign = RunSpec.from_dict({"inner": {"beta1": 0.0, "beta2": 0.0}})
    bound, why = automatic_norm_bound(sign.inner, 100, 0.0, steps=1)
    assert bound < FALLBACK_NORM_BOUND and "AdamW: 1 × lr per coordinate and step" in why


# --- a hivemind run has no [sweep] ------------------------------------------------------------------------------------


def test_a_hivemind_run_with_a_sweep_is_refused_naming_sweep_seq_lens():
    with pytest.raises(ValueError, match=r'^sweep\.seq_lens = \[8, 16\] is invalid: expected empty with '
                                         r'sync\.backend = "hivemind": a hivemind swarm trains one run'):
        RunSpec.from_dict({"sync": {"backend": "hivemind"}, "sweep": {"seq_lens": [8, 16]}})
    assert RunSpec.from_dict({"sweep": {"seq_lens": [8, 16]}}).is_sweep  # the coordinator backend's


# --- nested too deeply, integers too long -----------------------------------------------------------------------------


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [900, 3000])
def test_a_toml_file_nested_past_the_parser_is_refused_naming_the_file(levels, tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text(f'[model]\nname = "lstm_lm"\n[model.overrides]\nx = {nested(levels)}\n')
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_toml(path)
    assert str(excinfo.value) == (f"run config {str(path)!r} is nested too deeply: expected arrays and tables nested "
                                  f"at most {MAX_TABLE_DEPTH} levels deep")


def test_an_inline_table_nested_past_the_parser_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("[model]\noverrides = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n")
    with pytest.raises(ValueError, match=r"^run config '.*deep\.toml' is nested too deeply"):
        RunSpec.from_toml(path)


def test_a_table_value_nested_past_the_limit_is_refused_naming_the_key_and_one_at_it_round_trips(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text(f"[model.overrides]\nx = {nested(MAX_TABLE_DEPTH + 1)}\n")
    with pytest.raises(ValueError, match=r"^model\.overrides\.x(\[0\])+ is nested too deeply: expected arrays and "
                                         rf"tables nested at most {MAX_TABLE_DEPTH} levels deep$"):
        RunSpec.from_toml(path)
    # At the limit: taken, and written back out (400 levels were taken before and to_toml() then failed).
    spec = RunSpec.from_dict({"model": {"overrides": {"x": json.loads(nested(MAX_TABLE_DEPTH))}}})
    path.write_text(spec.to_toml())
    assert RunSpec.from_toml(path) == spec and RunSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(("text", "named"), [
    (nested(100_000), r"run spec"),  # past the parser
    ('{"model": {"overrides": {"x": ' + nested(900) + "}}}", r"model\.overrides\.x(\[0\])+"),  # parsed, past the limit
])
def test_a_json_spec_nested_too_deeply_is_refused_naming_the_run_spec_or_the_key(text, named):
    with pytest.raises(ValueError, match=f"^{named} is nested too deeply: expected arrays and tables nested at most "):
        RunSpec.from_json(text)


def test_an_integer_too_long_to_read_is_refused_naming_the_run_spec_or_the_file(tmp_path):
    digits = "9" * 5000
    with pytest.raises(ValueError, match=r"^run spec cannot be read: Exceeds the limit \(4300 digits\)"):
        RunSpec.from_json('{"run": {"seed": ' + digits + "}}")
    path = tmp_path / "big.toml"
    path.write_text(f"[run]\nseed = {digits}\n")
    with pytest.raises(ValueError, match=r"^run config '.*big\.toml' cannot be read: Exceeds the limit \(4300 digits\)"):
        RunSpec.from_toml(path)


# --- keys that do nothing ---------------------------------------------------------------------------------------------

HIVEMIND_DOES_NOT_RUN = r'with sync\.backend = "hivemind" \(hivemind peers train inner\.steps every round'

# (the spec, the refusal's start, the same key where it has an effect: taken)
UNUSED = {
    "hivemind time-boxed rounds": (
        {"sync": {"backend": "hivemind", "round": "time"}},
        rf"sync\.round = 'time' is invalid: expected the default \('steps'\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"round": "time"}}),
    "hivemind adaptive steps": (
        {"sync": {"backend": "hivemind", "adaptive_steps": True}},
        rf"sync\.adaptive_steps = True is invalid: expected the default \(False\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"adaptive_steps": True}}),
    "hivemind aggregation": (
        {"sync": {"backend": "hivemind", "aggregation": "trimmed_mean"}},
        rf"sync\.aggregation = 'trimmed_mean' is invalid: expected the default \('clipped_mean'\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"aggregation": "trimmed_mean"}}),
    "hivemind staleness": (
        {"sync": {"backend": "hivemind", "max_staleness": 5}},
        rf"sync\.max_staleness = 5 is invalid: expected the default \(1\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"max_staleness": 5}}),
    "hivemind step floor": (
        {"sync": {"backend": "hivemind", "min_steps": 3}},
        rf"sync\.min_steps = 3 is invalid: expected the default \(1\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"round": "time", "min_steps": 3}}),
    "hivemind clip factor": (
        {"sync": {"backend": "hivemind", "clip_factor": 5.0}},
        rf"sync\.clip_factor = 5\.0 is invalid: expected the default \(2\.0\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"clip_factor": 5.0}}),
    "hivemind staleness exponent": (
        {"sync": {"backend": "hivemind", "staleness_exponent": 1.0}},
        rf"sync\.staleness_exponent = 1\.0 is invalid: expected the default \(0\.5\) {HIVEMIND_DOES_NOT_RUN}",
        {"sync": {"staleness_exponent": 1.0}}),
    "step floor of fixed step-boxed rounds": (
        {"sync": {"min_steps": 3}},
        (r'sync\.min_steps = 3 is invalid: expected the default \(1\) unless sync\.round = "time" or '
         r"sync\.adaptive_steps \(step-boxed rounds of fixed steps train inner\.steps"),
        {"sync": {"adaptive_steps": True, "min_steps": 3}}),
    "density of int8": (
        {"sync": {"codec": "int8", "density": 0.5}},
        (r'sync\.density = 0\.5 is invalid: expected the default \(0\.02\) unless sync\.codec = "sparse" \(the int8 '
         r"codec sends every value"),
        {"sync": {"codec": "sparse", "density": 0.5}}),
    "value bits of fp32": (
        {"sync": {"codec": "fp32", "value_bits": 7}},
        (r'sync\.value_bits = 7 is invalid: expected the default \(2\) unless sync\.codec = "sparse" or "lowbit" \(the '
         r"fp32 codec's values have a fixed width\)"),
        {"sync": {"codec": "sparse", "value_bits": 7}}),
    "trim fraction of the mean": (
        {"sync": {"aggregation": "mean", "trim_fraction": 0.4}},
        (r'sync\.trim_fraction = 0\.4 is invalid: expected the default \(0\.2\) unless sync\.aggregation = '
         r'"trimmed_mean" \(mean trims nothing\)'),
        {"sync": {"aggregation": "trimmed_mean", "trim_fraction": 0.4}}),
    "clip factor of the mean": (
        {"sync": {"aggregation": "mean", "clip_factor": 5.0}},
        (r'sync\.clip_factor = 5\.0 is invalid: expected the default \(2\.0\) unless sync\.aggregation = "clipped_mean" '
         r'or "centered_clip" \(mean clips nothing\)'),
        {"sync": {"aggregation": "centered_clip", "clip_factor": 5.0}}),
    "error decay without error feedback": (
        {"sync": {"codec": "fp32", "error_feedback": False, "error_decay": 0.5}},
        (r"sync\.error_decay = 0\.5 is invalid: expected the default \(1\.0\) with sync\.error_feedback = false and "
         r'sync\.codec = "fp32" \(no worker keeps a residual, and the run sends a lossless downlink'),
        # the coordinator's int8 downlink carries its own residual, which error_decay decays
        {"sync": {"codec": "int8", "error_feedback": False, "error_decay": 0.5}}),
    "error decay of a hivemind run without error feedback": (
        {"sync": {"backend": "hivemind", "error_feedback": False, "error_decay": 0.5}},
        (r'sync\.error_decay = 0\.5 is invalid: .* with sync\.error_feedback = false and sync\.backend = "hivemind" '
         r"\(no worker keeps a residual, and the run has no coordinator downlink"),
        {"sync": {"backend": "hivemind", "error_decay": 0.5}}),
    "nesterov without momentum": (
        {"outer": {"momentum": 0.0, "nesterov": True}},
        (r"outer\.nesterov = True is invalid: expected the default \(False\) unless outer\.momentum > 0 \(without "
         r"momentum the Nesterov step is the plain one\)"),
        {"outer": {"momentum": 0.9, "nesterov": True}}),
    "step cap of step-boxed rounds": (
        {"sync": {"round": "steps", "max_steps": 7}},
        (r'sync\.max_steps = 7 is invalid: expected the default \(0\) unless sync\.round = "time" \(only a time-boxed '
         r"round has a time budget and a step cap\)"),
        {"sync": {"round": "time", "max_steps": 7}}),
    "time budget of step-boxed rounds": (
        {"sync": {"round_seconds": 1.0}},
        r'sync\.round_seconds = 1\.0 is invalid: expected the default \(30\.0\) unless sync\.round = "time"',
        {"sync": {"round": "time", "round_seconds": 1.0}}),
    "adaptive steps of time-boxed rounds": (
        {"sync": {"round": "time", "adaptive_steps": True}},
        r'sync\.adaptive_steps = True is invalid: expected the default \(False\) with sync\.round = "time"',
        {"sync": {"round": "steps", "adaptive_steps": True}}),
    "prune fractions without pruning": (
        {"sweep": {"seq_lens": [8, 16], "prune": False, "prune_at": [0.9]}},
        (r"sweep\.prune_at = \[0\.9\] is invalid: expected the default \(\[0\.25, 0\.5\]\) unless sweep\.prune = true "
         r"\(nothing is pruned\)"),
        {"sweep": {"seq_lens": [8, 16], "prune": True, "prune_at": [0.9]}}),
    "prune fractions without a sweep": (
        {"sweep": {"prune_at": [0.5]}}, r"sweep\.prune_at = \[0\.5\] is invalid: expected the default",
        {"sweep": {"seq_lens": [8, 16], "prune": True, "prune_at": [0.5]}}),
    "a sweep's constant tokens without lengths": (
        {"sweep": {"constant_tokens": True}},
        r"sweep\.constant_tokens = True is invalid: expected the default \(False\) unless sweep\.seq_lens names lengths",
        {"sweep": {"seq_lens": [8, 16], "constant_tokens": True}}),
    "a curriculum's constant tokens without lengths": (
        {"curriculum": {"constant_tokens": True, "schedule": [[0, 8, 2]]}},
        (r"curriculum\.constant_tokens = True is invalid: expected the default \(False\) unless "
         r"curriculum\.worker_seq_lens or curriculum\.seq_lens names lengths"),
        {"curriculum": {"constant_tokens": True, "worker_seq_lens": [8, 16]}}),
}


@pytest.mark.parametrize(("data", "refusal", "used"), UNUSED.values(), ids=UNUSED.keys())
def test_a_key_that_does_nothing_is_refused_naming_the_key_and_why(data, refusal, used):
    with pytest.raises(ValueError, match=f"^{refusal}"):
        RunSpec.from_dict(data)
    RunSpec.from_dict(used)  # where it has an effect, the same value is taken


def test_the_defaults_written_out_are_taken_wherever_they_do_nothing():
    defaults = {"round": "steps", "adaptive_steps": False, "max_staleness": 1, "aggregation": "clipped_mean",
                "density": 0.02, "value_bits": 2, "trim_fraction": 0.2, "error_decay": 1.0, "max_steps": 0,
                "round_seconds": 30.0, "error_feedback": False}
    spec = RunSpec.from_dict({"sync": {**defaults, "backend": "hivemind", "codec": "fp32"},
                              "outer": {"momentum": 0.0, "nesterov": False},
                              "sweep": {"prune_at": [0.25, 0.5], "constant_tokens": False},
                              "curriculum": {"constant_tokens": False}})
    assert spec.sync.backend == "hivemind" and spec.sweep == RunSpec().sweep



def without_inert_keys(data: dict) -> dict:
    """`data` less every key `RunSpec.from_dict` refuses as doing nothing, one refusal at a time."""
    cleaned = json.loads(json.dumps(data))
    while True:
        try:
            RunSpec.from_dict(cleaned)
            return cleaned
        except ValueError as refusal:
            table, key = re.match(r"^(\w+)\.(\w+) = ", str(refusal)).groups()
            del cleaned[table][key]


@pytest.mark.parametrize(("data", "refusal", "used"), UNUSED.values(), ids=UNUSED.keys())
def test_a_spec_read_back_takes_a_key_that_does_nothing_at_its_default(data, refusal, used):
    """A spec an older rcswarm stored (or a coordinator of another version sends its workers) may set a key the rules
    now refuse: read back (`from_json`) it is taken at its default, where it did nothing either, so the run resumes
    and reads the same as the config without the key."""
    stored = RunSpec().to_dict()
    for table, keys in data.items():
        stored[table].update(keys)
    assert RunSpec.from_json(json.dumps(stored)) == RunSpec.from_dict(without_inert_keys(data))
    with pytest.raises(ValueError, match=f"^{refusal}"):  # still refused where a user writes it
        RunSpec.from_dict(data)


def test_a_run_stored_with_a_key_that_does_nothing_resumes_under_the_config_without_it(tmp_path):
    """A state dir whose stored spec sets sync.density under int8 (taken and ignored before the rule) restarts with
    the config that dropped it (density is not a key a restart may change: compared after the read-back)."""
    spec = tiny_spec(run={"rounds": 4})
    open_group(spec, tmp_path).close()
    stored = spec.to_dict()
    stored["sync"]["density"] = 0.5
    with closing(sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)) as db:
        db.execute("UPDATE run_state SET value = ? WHERE key = 'spec_json'", (json.dumps(stored),))
    group = open_group(spec, tmp_path)
    try:
        assert group.version == 0 and group.runs[0].spec == spec
    finally:
        group.close()


def test_a_hivemind_spec_with_a_time_budget_read_back_takes_its_step_floor_at_the_default_too():
    """A review of the read-back: a stored hivemind spec with sync.round = "time", max_steps 100 and min_steps 20
    (inner.steps 10) was read back with round and max_steps at their defaults but min_steps kept, and then refused
    (min_steps above the 10 steps a step-boxed round allows): `rcswarm status` on such a mirror's state dir failed."""
    stored = RunSpec().to_dict()
    stored["sync"].update(backend="hivemind", round="time", max_steps=100, min_steps=20, round_seconds=10.0)
    stored["inner"]["steps"] = 10
    spec = RunSpec.from_json(json.dumps(stored))
    assert (spec.sync.round, spec.sync.max_steps, spec.sync.min_steps, spec.sync.round_seconds) == ("steps", 0, 1, 30.0)
