"""Run configs: typed, validated, and refused with the key and value named."""

import dataclasses
import json
import tomllib

import pytest

from rcswarm.config.runspec import RunSpec


def test_defaults_round_trip_through_json_and_toml(tmp_path):
    spec = RunSpec.from_dict({"model": {"overrides": {"d_model": 64}}, "sync": {"codec": "bf16"}})
    assert RunSpec.from_json(spec.to_json()) == spec
    path = tmp_path / "run.toml"
    path.write_text(spec.to_toml())
    assert RunSpec.from_toml(path) == spec


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"runn": {}}, "unknown key 'runn'"),
        ({"sync": {"codek": "int8"}}, "unknown key 'sync.codek'"),
        ({"sync": {"codec": "gzip"}}, "sync.codec = 'gzip'"),
        ({"data": {"seq_len": 0}}, "data.seq_len = 0"),
        ({"run": {"rounds": "ten"}}, "run.rounds = 'ten'"),
        ({"inner": {"steps": True}}, "inner.steps = True"),
        ({"outer": {"momentum": 1.0}}, "outer.momentum = 1.0"),
        ({"inner": {"lr": float("nan")}}, "inner.lr = nan"),
        ({"sync": "int8"}, "sync = 'int8'"),
        ({"run": {"workers": 0}}, "run.workers = 0"),
        ({"curriculum": {"policy": "random"}}, "curriculum.policy = 'random'"),
        ({"curriculum": {"worker_seq_lens": [-4]}}, "curriculum.worker_seq_lens = [-4]"),
        ({"curriculum": {"policy": "adaptive", "seq_lens": [8, 8], "alpha_inf": 0.3, "tau": 100.0}},
         "curriculum.seq_lens = [8, 8]"),
        ({"curriculum": {"budget_seconds": 0}}, "curriculum.budget_seconds = 0.0"),
        ({"sync": {"density": 0.0}}, "sync.density = 0.0"),
        ({"sync": {"density": 1.5}}, "sync.density = 1.5"),
        ({"sync": {"value_bits": 9}}, "sync.value_bits = 9"),
        ({"sync": {"codec": "sparse", "downlink_density": 1.5}}, "sync.downlink_density = 1.5"),
        ({"sync": {"codec": "sparse", "downlink_density": -0.1}}, "sync.downlink_density = -0.1"),
        ({"sync": {"codec": "sparse", "downlink_density": True}}, "sync.downlink_density = True"),
        ({"sync": {"codec": "int8", "downlink_density": 0.08}}, 'sync.downlink_density = 0.08 is invalid: expected the default (0.0) unless sync.codec = "sparse"'),
        ({"sync": {"codec": "lowbit", "value_bits": 3}}, "sync.value_bits = 3"),
        ({"sync": {"sparse_chunk": 1}}, "sync.sparse_chunk = 1"),
        ({"sync": {"error_decay": 1.01}}, "sync.error_decay = 1.01"),
        ({"sync": {"codec": "sparse", "error_feedback": False}}, "sync.error_feedback = False"),
        ({"sync": {"codec": "sparse", "backend": "hivemind"}}, "with sync.backend = 'hivemind': its all-reduce"),
        # A sweep's lengths and a schedule: every run trained the schedule's length (the sweep was ignored).
        ({"sweep": {"seq_lens": [2, 4]}, "curriculum": {"schedule": [[0, 8, 4]]}},
         "sweep.seq_lens = [2, 4] is invalid: expected empty when curriculum.schedule is given"),
        # Past int32 (the wire's TrainingAssignment): served, then every Join failed inside the server.
        ({"data": {"seq_len": 10**12}}, "data.seq_len = 1000000000000 is invalid: expected values up to 2147483647"),
        ({"inner": {"steps": 2**31}}, "inner.steps = 2147483648"),
        # More reports than workers may join: every round waited for its deadline.
        ({"sync": {"min_reports": 5}, "coordinator": {"max_workers": 1}},
         "sync.min_reports = 5 is invalid: expected at most coordinator.max_workers = 1"),
        # Accepted, then refused by the coordinator at start (which `rcswarm run` reported as a timeout).
        ({"run": {"seed": -1}}, "run.seed = -1 is invalid: expected an integer between 0 and 9223372036854775807"),
        ({"coordinator": {"max_calls": {"pushes": 4}}},
         "coordinator.max_calls = {'pushes': 4} is invalid: expected a kind of call among membership, query"),
        ({"coordinator": {"max_calls_per_peer": {"join": 4}}}, "coordinator.max_calls_per_peer = {'join': 4} is invalid"),
        # Keys of a task the byte source does not have: accepted and silently unused.
        ({"data": {"task_config": {"max_length": 8}}}, "data.task_config = {'max_length': 8} is invalid: expected no keys"),
    ],
)
def test_bad_configs_name_the_key_and_value(data, fragment):
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_dict(data)
    assert fragment in str(excinfo.value)


def test_toml_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nname = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        RunSpec.from_toml(bad)
    with pytest.raises(ValueError, match="does not exist"):
        RunSpec.from_toml(tmp_path / "missing.toml")
    with pytest.raises(ValueError, match="cannot be read: Is a directory"):
        RunSpec.from_toml(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[run]")
    with pytest.raises(ValueError, match="not valid TOML: 'utf-8' codec can't decode"):
        RunSpec.from_toml(binary)


def test_the_example_config_lists_the_defaults():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "run.toml"
    assert RunSpec.from_toml(example) == RunSpec()
    # Every key is written out (a key left out also loads as its default: the file must still list it).
    written = tomllib.loads(example.read_text())
    missing = [f"{table}.{key}" for table, values in RunSpec().to_dict().items() if isinstance(values, dict)
               for key in values if key not in written.get(table, {})]
    assert not missing, f"examples/run.toml lacks {missing}"


def test_a_sweep_expands_into_runs_with_their_own_lengths_and_batches():
    spec = RunSpec.from_dict({"run": {"name": "s"}, "data": {"batch_size": 16},
                              "sweep": {"seq_lens": [2, 4, 8], "constant_tokens": True}})
    runs = spec.sweep_runs()
    assert [(r.run.name, r.data.seq_len, r.data.batch_size) for r in runs] == [("s-L2", 2, 16), ("s-L4", 4, 8), ("s-L8", 8, 4)]
    assert not any(r.is_sweep for r in runs)
    paired = RunSpec.from_dict({"sweep": {"seq_lens": [2, 4], "batch_sizes": [8, 3]}}).sweep_runs()
    assert [r.data.batch_size for r in paired] == [8, 3]
    assert RunSpec().sweep_runs() == [RunSpec()]
    with pytest.raises(ValueError, match="sweep.batch_sizes"):
        RunSpec.from_dict({"sweep": {"seq_lens": [2, 4], "batch_sizes": [8]}})
    with pytest.raises(ValueError, match=r"sweep.seq_lens\[1\] = 'x'"):
        RunSpec.from_dict({"sweep": {"seq_lens": [2, "x"]}})


def test_a_curriculum_round_trips_and_the_default_one_stays_out_of_toml(tmp_path):
    spec = RunSpec.from_dict({"curriculum": {"policy": "adaptive", "seq_lens": [4, 8, 16], "budget_seconds": 60,
                                             "alpha_inf": 0.3, "tau": 500.0, "constant_tokens": True}})
    path = tmp_path / "run.toml"
    path.write_text(spec.to_toml())
    assert RunSpec.from_toml(path) == spec and spec.curriculum.adaptive
    assert "[curriculum]" not in RunSpec().to_toml()
    heterogeneous = RunSpec.from_dict({"curriculum": {"worker_seq_lens": [8, 16]}})
    assert RunSpec.from_json(heterogeneous.to_json()) == heterogeneous


def test_law_from_is_relative_to_the_config_file(tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "run.toml").write_text(
        '[curriculum]\npolicy = "adaptive"\nseq_lens = [2, 4]\nlaw_from = "../runs/sweep"\n'
    )
    spec = RunSpec.from_toml(folder / "run.toml")
    assert spec.curriculum.law_from == str((tmp_path / "runs" / "sweep").resolve())
    copied = tmp_path / "elsewhere" / "run.toml"
    copied.parent.mkdir()
    copied.write_text(spec.to_toml())
    assert RunSpec.from_toml(copied).curriculum.law_from == spec.curriculum.law_from


HIVEMIND = {"sync": {"backend": "hivemind"}}


@pytest.mark.parametrize(
    "key, good, bad, expected",
    [
        ("trust_factor", 1.5, 1.0, "a number > 1"),
        ("drift_tolerance", 0.01, 0.0, "a positive number"),
        ("timeout_factor", 1.0, 0.5, "a number between 1 and 1000"),
        ("timeout_factor", 1000.0, 1001.0, "a number between 1 and 1000"),
        ("timer_window", 1, 0, "an integer between 1 and 1000"),
        ("timer_window", 1000, 1001, "an integer between 1 and 1000"),
        ("min_allreduce_s", 0.5, 0.4, "a number of seconds >= 0.5"),
        ("initial_allreduce_s", 20.0, 19.0, "seconds >= hivemind.min_allreduce_s = 20.0"),
        ("request_timeout_s", 0.1, 0.05, "a number of seconds >= 0.1"),
        ("request_timeout_s", 60.0, float("inf"), "a finite number"),
        ("state_declare_s", 0.1, 5e-324, "a number of seconds >= 0.1"),
        ("record_ttl_s", 1.0, 0.5, "a number of seconds >= 1"),
        ("settle_s", 0.0, -1.0, "a number of seconds >= 0"),
        ("state_grace_s", 0.0, -0.5, "a number of seconds >= 0"),
    ],
)
def test_each_hivemind_rule_is_validated(key, good, bad, expected):
    spec = RunSpec.from_dict({**HIVEMIND, "hivemind": {key: good}})
    assert getattr(spec.hivemind, key) == good
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_dict({**HIVEMIND, "hivemind": {key: bad}})
    assert f"hivemind.{key} = {bad!r} is invalid: expected {expected}" in str(excinfo.value)


def test_hivemind_rules_are_typed():
    with pytest.raises(ValueError, match=r"hivemind.timer_window = 2.5 is invalid: expected an integer"):
        RunSpec.from_dict({**HIVEMIND, "hivemind": {"timer_window": 2.5}})
    with pytest.raises(ValueError, match=r"hivemind.trust_factor = 'high' is invalid: expected a finite number"):
        RunSpec.from_dict({**HIVEMIND, "hivemind": {"trust_factor": "high"}})
    with pytest.raises(ValueError, match=r"unknown key 'hivemind.trust'"):
        RunSpec.from_dict({**HIVEMIND, "hivemind": {"trust": 2.0}})


def test_hivemind_rules_off_their_defaults_are_refused_with_the_coordinator_backend():
    with pytest.raises(ValueError) as excinfo:
        RunSpec.from_dict({"hivemind": {"trust_factor": 8.0}})
    assert str(excinfo.value) == ("hivemind.trust_factor = 8.0 is invalid: expected the default (4.0) unless "
                                  "sync.backend = \"hivemind\" (sync.backend is 'coordinator')")
    # The defaults written out (as examples/run.toml does) are accepted with either backend.
    assert RunSpec.from_dict({"hivemind": {"trust_factor": 4.0, "timer_window": 5}}) == RunSpec()


def test_hivemind_rules_round_trip_and_the_default_table_stays_out_of_toml(tmp_path):
    spec = RunSpec.from_dict({**HIVEMIND, "hivemind": {"trust_factor": 2.5, "timer_window": 3, "settle_s": 0.0,
                                                       "initial_allreduce_s": 90.0}})
    path = tmp_path / "run.toml"
    path.write_text(spec.to_toml())
    assert "[hivemind]" in path.read_text()
    assert RunSpec.from_toml(path) == spec and spec.hivemind.timer_window == 3
    assert RunSpec.from_json(spec.to_json()) == spec
    assert "[hivemind]" not in RunSpec().to_toml() and "[hivemind]" not in RunSpec.from_dict(HIVEMIND).to_toml()
    # A coordinator's stored spec from before the table existed loads with the defaults.
    old = json.loads(RunSpec().to_json())
    del old["hivemind"]
    assert RunSpec.from_dict(old) == RunSpec()


def test_every_hivemind_rule_is_documented():
    from pathlib import Path

    from rcswarm.config.runspec import HivemindSection

    root = Path(__file__).resolve().parents[2]
    example = (root / "examples" / "run.toml").read_text().split("[hivemind]")[1]
    deploy = (root / "docs" / "DEPLOY.md").read_text().split("## On hivemind")[1]
    for field in dataclasses.fields(HivemindSection):
        assert f"\n{field.name} = {field.default!r}" in example, field.name
        assert f"`hivemind.{field.name}`" in deploy, field.name


def test_each_codec_key_makes_the_wire_format_it_names():
    from rcswarm.protos.v1 import coordinator_pb2 as pb
    from rcswarm.sync.codec import WireFormat

    sparse = RunSpec.from_dict({"sync": {"codec": "sparse", "density": 0.015, "value_bits": 3, "sparse_chunk": 1000}})
    assert WireFormat.from_sync(sparse.sync) == WireFormat(pb.CODEC_SPARSE, 1000, 15, 3)
    lowbit = RunSpec.from_dict({"sync": {"codec": "lowbit", "value_bits": 4, "block_size": 64, "backend": "hivemind"}})
    assert WireFormat.from_sync(lowbit.sync) == WireFormat(pb.CODEC_LOWBIT_BLOCK, 64, 0, 4)
    assert WireFormat.from_sync(RunSpec().sync) == WireFormat(pb.CODEC_INT8_BLOCK, 256)
    # The round's step: at sync.downlink_density, or at sync.density when it is 0 (the default).
    assert WireFormat.from_sync(sparse.sync, downlink=True) == WireFormat.from_sync(sparse.sync)
    denser = RunSpec.from_dict({"sync": {"codec": "sparse", "density": 0.015, "downlink_density": 0.06}})
    assert WireFormat.from_sync(denser.sync).keep == 61 and WireFormat.from_sync(denser.sync, downlink=True).keep == 246
    assert WireFormat.from_sync(RunSpec().sync, downlink=True) == WireFormat(pb.CODEC_INT8_BLOCK, 256)



def test_the_default_outer_step_is_plain_averaging():
    """Chosen from the outer-step grid (docs/PERFORMANCE.md "Compression"): SGD, lr 1, no momentum was within 1% of
    the best step for fp32 and int8 at H = 10 and 50, and the only one under which the sparse codec trains (the old
    default, Nesterov 0.7 / 0.9, ended 2-10% worse dense and diverged sparse). A config's own [outer] keys win."""
    default = RunSpec().outer
    assert (default.lr, default.momentum, default.nesterov) == (1.0, 0.0, False)
    given = RunSpec.from_dict({"sync": {"codec": "sparse"}, "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}})
    assert (given.outer.lr, given.outer.momentum, given.outer.nesterov) == (0.7, 0.9, True)


# The sparse settings every quality measurement used (docs/PERFORMANCE.md "Compression"), error feedback decaying.
SPARSE = {"codec": "sparse", "error_decay": 0.95}


def test_sparse_settings_measured_to_cost_loss_validate_with_a_caution():
    """The sparse codec lagged the dense codecs in its first rounds (caught up by round 60 at H = 10, after 120 at
    H = 50), with more than 2 workers unless the downlink was denser, and diverged under outer momentum
    (docs/PERFORMANCE.md "Compression"): such a config is valid, and `cautions` (logged by the coordinator) names the key, its value and
    the measured penalty; the defaults and int8 at any H get none."""
    assert RunSpec().cautions() == []
    long_enough = {"steps": 10}
    (no_decay,) = RunSpec.from_dict({"sync": {"codec": "sparse"}, "inner": long_enough, "run": {"rounds": 60}}).cautions()
    assert "sync.error_decay = 1.0" in no_decay and "0.95" in no_decay
    assert RunSpec.from_dict({"sync": SPARSE, "inner": long_enough, "run": {"rounds": 60}}).cautions() == []
    assert RunSpec.from_dict({"inner": {"steps": 200}, "outer": {"momentum": 0.9, "nesterov": True}}).cautions() == []
    # Too few rounds for H: the lag measured; enough rounds, or a run until stopped (rounds = 0): none.
    for steps, rounds, notes in ((10, 59, 1), (10, 60, 0), (10, 0, 0), (20, 119, 1), (50, 120, 0), (50, 1000, 0),
                                 (51, 1000, 1), (200, 0, 1)):
        spec = RunSpec.from_dict({"sync": SPARSE, "inner": {"steps": steps}, "run": {"rounds": rounds}})
        assert len(spec.cautions()) == notes, (steps, rounds)
    # More than 2 workers at H > 10: 240 rounds (4 workers at H = 50 caught up between 120 and 240).
    one_bit = {**SPARSE, "value_bits": 1, "downlink_density": 0.04}
    for workers, steps, rounds, notes in ((4, 50, 120, 1), (4, 50, 240, 0), (3, 20, 239, 1), (4, 10, 60, 0), (2, 50, 120, 0)):
        spec = RunSpec.from_dict({"sync": one_bit, "inner": {"steps": steps}, "run": {"workers": workers, "rounds": rounds}})
        assert len(spec.cautions()) == notes, (workers, steps, rounds)
    (crowd_rounds,) = RunSpec.from_dict({"sync": one_bit, "inner": {"steps": 50}, "run": {"workers": 4, "rounds": 200}}).cautions()
    assert "Run at least 240 rounds" in crowd_rounds and "between 120 and 240 rounds" in crowd_rounds
    (short,) = RunSpec.from_dict({"sync": SPARSE, "inner": {"steps": 20}}).cautions()
    assert "run.rounds = 40 at inner.steps = 20" in short and "+2.0% after 75 rounds of H = 20" in short
    assert "Run at least 120 rounds" in short and "+0.24%, +0.47%" in short
    (unmeasured,) = RunSpec.from_dict({"sync": SPARSE, "inner": {"steps": 100}, "run": {"rounds": 500}}).cautions()
    assert "inner.steps = 100" in unmeasured and "measured up to H = 50" in unmeasured and "+31.0%" in unmeasured
    (momentum,) = RunSpec.from_dict({"sync": SPARSE, "inner": long_enough, "run": {"rounds": 60},
                                     "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}}).cautions()
    assert "outer.momentum = 0.9" in momentum and "diverged" in momentum
    (crowd,) = RunSpec.from_dict({"sync": SPARSE, "run": {"workers": 4, "rounds": 60},
                                  "inner": long_enough}).cautions()
    assert "run.workers = 4" in crowd and "+2.1%" in crowd and "sync.downlink_density = 0.08" in crowd
    assert "sync.value_bits = 1 with sync.downlink_density = 0.04" in crowd and "+0.55%, -0.45%, -0.32%" in crowd
    # A downlink at run.workers × density (measured to remove the penalty) or denser: no caution; half of it: one;
    # 1-bit values with the downlink at 0.04 (measured within 0.55 % with 4 workers) up to 4 workers: none.
    for workers, downlink, bits, notes in ((4, 0.08, 2, 0), (3, 0.06, 2, 0), (64, 1.0, 2, 0), (4, 0.04, 2, 1),
                                           (4, 0.04, 1, 0), (3, 0.05, 1, 0), (4, 0.03, 1, 1), (8, 0.04, 1, 1)):
        sync = {**SPARSE, "downlink_density": downlink, "value_bits": bits}
        spec = RunSpec.from_dict({"sync": sync, "run": {"workers": workers, "rounds": 60}, "inner": long_enough})
        assert len(spec.cautions()) == notes, (workers, downlink, bits)
    assert len(RunSpec.from_dict({"sync": SPARSE, "inner": {"steps": 50}, "run": {"workers": 3},
                                  "outer": {"momentum": 0.5}}).cautions()) == 3
