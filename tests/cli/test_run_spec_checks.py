"""`rcswarm run`'s checks of a spec against the swarm it starts (a review, 2026-11-29): each refusal comes before
the run dir is made, naming the key or flag. Before: a window beyond the workers' step limit started everything,
every worker exited 1 and the launcher then evaluated the oversized window in its own process for minutes; a sweep
with fewer workers than lengths under --minutes exited 0 with a length never trained; sync.min_reports above the
workers per run made every round wait its whole deadline."""

from __future__ import annotations

import pytest

from rcswarm.cli import run as run_cli
from rcswarm.worker.limits import DEFAULT_MAX_STEP_TOKENS
from tests.helpers.specs import tiny_spec


def refused(tmp_path, capsys, spec, *flags: str) -> str:
    """`rcswarm run` on `spec`: exit 2, one line on stderr, no run dir; the line."""
    config = tmp_path / "run.toml"
    config.write_text(spec.to_toml())
    assert run_cli.main([str(config), "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rcswarm run: ") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
    return err


def test_a_window_beyond_the_workers_step_limit_is_refused(tmp_path, capsys):
    batch = DEFAULT_MAX_STEP_TOKENS // 16 + 1
    err = refused(tmp_path, capsys, tiny_spec(run={"rounds": 1}, data={"seq_len": 16, "batch_size": batch}))
    assert f"batch {batch:,} × seq_len 16 = {batch * 16:,} positions a step, more than this worker's limit of " in err
    assert "every worker `rcswarm run` starts has the default limit" in err


def test_a_sweep_length_or_a_held_out_window_beyond_the_limit_is_refused(tmp_path, capsys):
    sweep = tiny_spec(run={"rounds": 1}, data={"seq_len": 16, "batch_size": 2})
    big = DEFAULT_MAX_STEP_TOKENS // 32 + 1
    sweep = type(sweep).from_dict({**sweep.to_dict(), "sweep": {"seq_lens": [16, 32], "batch_sizes": [2, big]}})
    assert f"the run spec's data.seq_len = 32: batch {big:,} × seq_len 32" in refused(tmp_path, capsys, sweep)
    # The held-out window: eval_seq_len × data.batch_size, its split large enough for the data's own check.
    held_out = tiny_spec(run={"rounds": 1, "eval_seq_len": DEFAULT_MAX_STEP_TOKENS // 3 + 1},
                         data={"batch_size": 3, "val_fraction": 0.45})
    assert "the run spec's held-out windows" in refused(tmp_path, capsys, held_out)


def test_fewer_workers_than_a_sweeps_lengths_under_a_time_budget_is_refused(tmp_path, capsys):
    spec = tiny_spec(run={"rounds": 4, "workers": 2})
    spec = type(spec).from_dict({**spec.to_dict(), "sweep": {"seq_lens": [8, 16, 32]}})
    err = refused(tmp_path, capsys, spec, "--minutes", "0.3")
    assert "run.workers = 2: fewer workers than the sweep's 3 lengths under a wall-time budget" in err
    err = refused(tmp_path, capsys, spec, "--minutes", "0.3", "--workers", "1")
    assert err.startswith("rcswarm run: --workers = 1: fewer workers"), err
    # Without a time budget the runs train in turn (a finished run's workers move on): taken.
    args = run_cli.parse_args([str(tmp_path / "run.toml")])
    assert run_cli.load_spec(args).run.workers == 2


@pytest.mark.parametrize(("workers", "lengths", "min_reports", "taken"), [
    (1, [], 3, False), (2, [], 2, True), (4, [8, 16], 3, False), (4, [8, 16], 2, True), (1, [8, 16], 1, True),
    (2, [8, 16, 32, 64], 2, False),
])
def test_min_reports_above_the_workers_per_run_is_refused(tmp_path, capsys, workers, lengths, min_reports, taken):
    spec = tiny_spec(run={"rounds": 4, "workers": workers}, sync={"min_reports": min_reports})
    if lengths:
        spec = type(spec).from_dict({**spec.to_dict(), "sweep": {"seq_lens": lengths}})
    if taken:
        config = tmp_path / "run.toml"
        config.write_text(spec.to_toml())
        assert run_cli.load_spec(run_cli.parse_args([str(config)])).sync.min_reports >= min_reports
    else:
        err = refused(tmp_path, capsys, spec)
        per_run = max(workers // max(len(lengths), 1), 1)  # one each when the runs train in turn
        assert f"sync.min_reports = {min_reports}: more than the {per_run} worker" in err
        assert f"expected at most {per_run}" in err
