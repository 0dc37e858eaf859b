"""Edge values a fuzzer of the run spec found accepted, or refused from deep inside: each is now refused naming the
key and value, or round-trips through JSON and TOML."""

import json

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry

HIVEMIND = {"sync": {"backend": "hivemind"}}


@pytest.mark.parametrize(
    "data, fragment",
    [
        # Past 64 bits: accepted, then overflowed where the coordinator stored or sent the value.
        ({"run": {"rounds": 2**63}}, "run.rounds = 9223372036854775808 is invalid"),
        ({"coordinator": {"max_workers": 2**64}}, "coordinator.max_workers = 18446744073709551616 is invalid"),
        ({"data": {"max_bytes": 10**100}}, "data.max_bytes = 1000000000000000000000"),
        ({"coordinator": {"max_metric_rows": -(2**63) - 1}}, "coordinator.max_metric_rows = -9223372036854775809"),
        ({"curriculum": {"schedule": [[0, 8, 4], [2**63, 16, 2]]}}, "curriculum.schedule[1][0] = 9223372036854775808"),
        ({"model": {"overrides": {"d_model": 2**64}}}, "model.overrides.d_model = 18446744073709551616 is invalid"),
        # Past int32 in a sweep's batch sizes: accepted, then refused by sweep_runs() as data.batch_size.
        ({"sweep": {"seq_lens": [8, 16], "batch_sizes": [2**31, 1]}},
         "sweep.batch_sizes = [2147483648, 1] is invalid: expected values up to 2147483647"),
    ],
)
def test_integers_past_their_width_are_refused(data, fragment):
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_dict(data)
    assert fragment in str(excinfo.value)


@pytest.mark.parametrize(
    "data, key",
    [
        # A wait this long overflows the platform's time_t (threading's waits raise OverflowError).
        ({"coordinator": {"max_wait_s": 1e10}}, "coordinator.max_wait_s"),
        ({"coordinator": {"lease_s": 1e308}}, "coordinator.lease_s"),
        ({"coordinator": {"stream_idle_s": 1e300}}, "coordinator.stream_idle_s"),
        ({"coordinator": {"health_stall_s": 2**64}}, "coordinator.health_stall_s"),
        ({"coordinator": {"forget_after_s": 1e308}}, "coordinator.forget_after_s"),
        ({"sync": {"round_deadline_s": 1e308}}, "sync.round_deadline_s"),
        ({"sync": {"round": "time", "round_seconds": 1e308}}, "sync.round_seconds"),
        ({"curriculum": {"budget_seconds": 1e308}}, "curriculum.budget_seconds"),
        ({**HIVEMIND, "hivemind": {"request_timeout_s": 1e308}}, "hivemind.request_timeout_s"),
        ({**HIVEMIND, "hivemind": {"min_allreduce_s": 1e308, "initial_allreduce_s": 1e308}}, "hivemind.min_allreduce_s"),
        ({**HIVEMIND, "hivemind": {"settle_s": 1e308}}, "hivemind.settle_s"),
        ({**HIVEMIND, "hivemind": {"state_grace_s": 1e308}}, "hivemind.state_grace_s"),
        ({**HIVEMIND, "hivemind": {"record_ttl_s": 1e308}}, "hivemind.record_ttl_s"),
        ({**HIVEMIND, "hivemind": {"timeout_factor": 1e308}}, "hivemind.timeout_factor"),
    ],
)
def test_durations_past_any_wait_are_refused(data, key):
    with pytest.raises(ValueError, match=rf"^{key.replace('.', '[.]')} = .* is invalid: expected"):
        RunSpec.from_dict(data)


# Finite values the spec took that broke a run (a review, 2026-11-28: each was run against the real coordinator and
# worker); each is now refused, and the value at the bound is taken.
BROKE_A_RUN = [
    # 2**31 steps overflowed the assignment's int32: every Join failed and left a ghost member.
    ({"sync": {"round": "time", "max_steps": 2**31}}, "sync.max_steps = 2147483648 is invalid: expected an integer in "
     "[0, 1,000,000]", {"sync": {"round": "time", "max_steps": 10**6}}),
    ({"inner": {"steps": 214748365}}, "inner.steps = 214748365 is invalid: expected at most 100,000",
     {"inner": {"steps": 100_000}}),
    # The batch constant_tokens derives at length 1 overflowed int32 at the second Join.
    ({"curriculum": {"worker_seq_lens": [2**31 - 1, 1], "constant_tokens": True}, "data": {"batch_size": 2}},
     "curriculum.constant_tokens = True is invalid: expected batches up to 2147483647 (the wire's int32): "
     "data.batch_size 2 × 2147483647 / 1 is a batch of 4,294,967,294 at length 1",
     {"curriculum": {"worker_seq_lens": [2**30, 1], "constant_tokens": True}, "data": {"batch_size": 1}}),
    # The sweep's own: refused at sweep_runs() naming data.batch_size, a key the user never set.
    ({"sweep": {"seq_lens": [2**30, 1], "constant_tokens": True}, "data": {"batch_size": 4}},
     "sweep.constant_tokens = True is invalid: expected batches up to 2147483647 (the wire's int32): "
     "data.batch_size 4 × 1073741824 / 1 is a batch of 4,294,967,296 at length 1",
     {"sweep": {"seq_lens": [2**30, 1], "constant_tokens": True}, "data": {"batch_size": 1}}),
    # θ overflowed and every round close failed; AdamW's lr past float32 ended the worker's thread.
    ({"outer": {"lr": 1e300}}, "outer.lr = 1e+300 is invalid: expected at most 10", {"outer": {"lr": 10.0}}),
    ({"inner": {"lr": 1e39}}, "inner.lr = 1e+39 is invalid: expected at most 10", {"inner": {"lr": 10.0}}),
    # Every pull cancelled at once; workers evicted at every tick; an await loop without a pause; health flapping.
    ({"coordinator": {"stream_idle_s": 1e-300}}, "coordinator.stream_idle_s = 1e-300 is invalid: expected a number of "
     "seconds >= 1", {"coordinator": {"stream_idle_s": 1.0}}),
    ({"coordinator": {"lease_s": 5e-324}}, "coordinator.lease_s = 5e-324 is invalid: expected a number of seconds "
     ">= 0.5", {"coordinator": {"lease_s": 0.5}}),
    ({"coordinator": {"max_wait_s": 5e-324}}, "coordinator.max_wait_s = 5e-324 is invalid", {"coordinator": {"max_wait_s": 0.1}}),
    ({"coordinator": {"health_stall_s": 0.1}}, "coordinator.health_stall_s = 0.1 is invalid",
     {"coordinator": {"health_stall_s": 1.0}}),
    # A 0-byte held-out split ended the worker; metrics refused "retry in inf s"; an unbounded RPC thread pool.
    ({"data": {"val_fraction": 5e-324}}, "data.val_fraction = 5e-324 is invalid: expected a number in [0.001, 0.5)",
     {"data": {"val_fraction": 0.001}}),
    ({"coordinator": {"metric_rows_per_s": 0.5}}, "coordinator.metric_rows_per_s = 0.5 is invalid",
     {"coordinator": {"metric_rows_per_s": 1.0}}),
    ({"coordinator": {"max_workers": 2**62}}, "coordinator.max_workers = 4611686018427387904 is invalid: expected at "
     "most 4,096", {"coordinator": {"max_workers": 4096}}),
    ({"coordinator": {"max_calls": {"pull": 2**40}}}, "coordinator.max_calls.pull = 1099511627776 is invalid: expected "
     "an integer in [1, 4096]", {"coordinator": {"max_calls": {"pull": 4096}}}),
    # The averager's declare loop spun (6,800 DHT stores in 5 s) and its records expired before anyone read them.
    ({**HIVEMIND, "hivemind": {"state_declare_s": 5e-324}}, "hivemind.state_declare_s = 5e-324 is invalid",
     {**HIVEMIND, "hivemind": {"state_declare_s": 0.1}}),
]


@pytest.mark.parametrize("data, fragment, at_the_bound", BROKE_A_RUN, ids=[row[1].split(" =")[0] for row in BROKE_A_RUN])
def test_finite_values_that_broke_a_run_are_refused_and_the_bound_is_taken(data, fragment, at_the_bound):
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_dict(data)
    assert fragment in str(excinfo.value)
    RunSpec.from_dict(at_the_bound)


def test_the_longest_duration_is_accepted():
    from rcswarm.config.runspec import MAX_SECONDS

    spec = RunSpec.from_dict({"coordinator": {"max_wait_s": MAX_SECONDS}, "sync": {"round_deadline_s": MAX_SECONDS}})
    assert spec.coordinator.max_wait_s == MAX_SECONDS


@pytest.mark.parametrize(
    "text, fragment",
    [
        # A lone surrogate (an undecodable byte of a path, or a JSON escape) cannot be written to a TOML file.
        ('{"curriculum": {"law_from": "runs/\\udcff"}}', "curriculum.law_from = 'runs/\\udcff' is invalid"),
        ('{"data": {"source": "diag", "task": "\\ud800"}}', "data.task = '\\ud800' is invalid"),
        ('{"model": {"preset": "\\udcff"}}', "model.preset = '\\udcff' is invalid"),
        ('{"data": {"source": "git", "task_config": {"dataset": "d\\udcff"}}}',
         "data.task_config.dataset = 'd\\udcff' is invalid"),
        ('{"data": {"source": "git", "task_config": {"dataset": "d\\u0000"}}}',
         "data.task_config.dataset = 'd\\x00' is invalid: expected text without NUL"),
        # TOML has no null: accepted, then to_toml() refused the spec (`rcswarm run` sends the coordinator TOML).
        ('{"model": {"overrides": {"d_model": null}}}', "model.overrides.d_model = None is invalid"),
        ('{"model": {"overrides": {"sizes": [1, null]}}}', "model.overrides.sizes[1] = None is invalid"),
    ],
)
def test_text_toml_cannot_carry_is_refused(text, fragment):
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_json(text)
    assert fragment in str(excinfo.value)


def test_a_free_table_with_a_key_that_is_not_a_string_is_refused():
    with pytest.raises(ValueError, match=r"^model\.overrides = \{1: 2\} is invalid: expected a table whose keys"):
        RunSpec.from_dict({"model": {"overrides": {1: 2}}})


def test_a_nul_in_law_from_of_a_toml_file_names_the_key(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[curriculum]\npolicy = "adaptive"\nseq_lens = [8, 16]\nlaw_from = "runs/\\u0000x"\n')
    with pytest.raises(ValueError, match=r"^curriculum\.law_from = 'runs/\\x00x' is invalid: expected text without NUL"):
        RunSpec.from_toml(path)


@pytest.mark.parametrize(
    "data",
    [
        {"run": {"name": "\U0001d400\u00e9"}},  # letters (isalnum) beyond the BMP: json.dumps wrote surrogate pairs
        {"data": {"source": "git", "task_config": {"dataset": 'runs/a"b\\c\x7fd\ne\tf\U0001f600'}}},
        {"curriculum": {"policy": "adaptive", "seq_lens": [8, 16], "law_from": "/runs/\u00e9t\u00e9 \x7f"}},
        {"model": {"overrides": {"d_model": 64, "nested": {"a": [1, 2], "b": "x"}, "odd key": 1.5}}},
        {"data": {"source": "typing", "task_config": {"n_documents": 4}}, "model": {"name": "frame", "preset": "tiny"}},
        # Sweep keys off their defaults: to_toml() once left the table out without seq_lens and lost them (without
        # seq_lens they are refused now: they do nothing there).
        {"sweep": {"seq_lens": [8, 16], "constant_tokens": True}},
        {"sweep": {"seq_lens": [8, 16], "prune": True, "prune_at": [0.5]}},
    ],
)
def test_accepted_specs_round_trip_through_json_and_toml(data, tmp_path):
    spec = RunSpec.from_dict(data)
    assert RunSpec.from_json(spec.to_json()) == spec
    text = spec.to_toml()
    assert text.isascii()
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    assert RunSpec.from_toml(path) == spec


@pytest.mark.timeout(20)
@pytest.mark.parametrize("n_pool", [2**63, 10**100, 7])
def test_a_frame_model_with_more_pooling_than_columns_is_refused_at_once(n_pool):
    # 2**n_pool was computed before: n_pool = 2**63 hung the check (and the run's start) on an enormous power.
    with pytest.raises(ValueError, match=r"FrameModelConfig\.n_pool="):
        registry.make_config("frame", "tiny", {"n_pool": n_pool})


def test_the_examples_and_the_defaults_still_parse():
    from pathlib import Path

    examples = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))
    assert examples
    for path in examples:
        spec = RunSpec.from_toml(path)
        assert RunSpec.from_json(spec.to_json()) == spec
        assert json.loads(spec.to_json()) == spec.to_dict()
    assert RunSpec.from_dict(RunSpec().to_dict()) == RunSpec()
