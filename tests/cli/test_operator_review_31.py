"""The thirty-first session's operator review, commands: `rcswarm fit` with a huge --smooth and with summary.json
values that are not positive finite numbers, `rcswarm bench diag`'s --group-by, --lr, --seed and --out refused before
any model trains (no --out/swarm/ made) and its docstring's example, and `rcswarm status --state-dir` naming no
directory or beside --json."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from rcswarm.cli import bench as bench_cli
from rcswarm.cli import fit as fit_cli
from rcswarm.cli import status as status_cli
from rcswarm.config.runspec import RunSpec
from rcswarm.state.store import StateStore

LENGTHS = (2, 4, 8, 16)
# A tiny budget: a refusal that came after training would still leave --out/swarm/ behind.
TINY = ["--task", "maze", "--models", "lstm", "--max-steps", "1", "--batch-size", "2", "--eval-examples", "2",
        "--task-arg", "num_moves=8"]


def _law_loss(length: int, step: int) -> float:
    """loss(L | s) = 5.4 · L^(−α(s)), α(s) = 0.3 (1 − e^(−s/120))."""
    return 5.4 * length ** (-0.3 * (1 - math.exp(-step / 120)))


def _metrics_csv(path: Path, steps: int = 40) -> Path:
    """A metrics file of LENGTHS, `steps` steps each, on the law."""
    lines = ["run_id,step,seq_len,loss,wall_time"]
    lines += [f"r{length},{step},{length},{_law_loss(length, step)!r},{0.01 * length * step!r}"
              for length in LENGTHS for step in range(1, steps + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run_dir(root: Path, summary_runs: list[dict]) -> Path:
    """A run directory as `rcswarm run` leaves it: a state dir per length with 300 training steps, summary.json."""
    for length in LENGTHS:
        store = StateStore(root / "state" / f"run-L{length}")
        spec = RunSpec.from_dict({"inner": {"steps": 10}, "data": {"seq_len": length}})
        store.set_many({"spec_json": spec.to_json(), "run_id": f"r{length}"})
        store.add_metrics([(f"r{length}", "w", version, 100 + version * 10 + k + 1, length, 8,
                            _law_loss(length, version * 10 + k + 1), 64, 0.0, 0.0, 0.0, 0, 0, "",
                            0.01 * length * (version * 10 + k + 1)) for version in range(30) for k in range(10)])
        store.close()
    (root / "summary.json").write_text(json.dumps({"runs": summary_runs}))
    return root


def test_fit_with_a_smooth_far_wider_than_the_data_runs_at_the_datas_cost(tmp_path: Path, capsys) -> None:
    """`rcswarm fit --smooth 100000000` took 77 s and 1.8 GB on 40 steps, 1e9 over 120 s: the window was allocated
    whole. 1e15 (8 PB of window) now runs as the 81-step window that covers every step."""
    metrics = _metrics_csv(tmp_path / "m.csv")
    out = tmp_path / "fit.png"
    assert fit_cli.main([str(metrics), "--out", str(out), "--smooth", str(10**15)]) == 0
    printed = capsys.readouterr()
    assert f"observed on {10**15}-step means" in " ".join(printed.out.split())
    assert out.stat().st_size > 1000 and "Traceback" not in printed.err


@pytest.mark.parametrize(("edit", "shown"), [({"seq_len": 0}, "seq_len 0 with"), ({"seq_len": -4}, "seq_len -4 with"),
                                             ({"val_loss_final": math.inf}, "seq_len 2 with held-out loss inf ")])
def test_fit_of_a_run_dir_whose_summary_holds_a_bad_held_out_value_leaves_it_out(tmp_path: Path, capsys, edit: dict,
                                                                               shown: str) -> None:
    """`rcswarm fit RUN_DIR` ended in a ValueError traceback ("expected positive finite values") when summary.json
    held a length <= 0 or an infinite loss; now the run is left out and named, and the law panel, with two lengths
    left, shows the training loss at the last matched step."""
    runs = [{"seq_len": length, "rounds": 30, "val_loss_final": _law_loss(length, 300)} for length in (2, 4, 8)]
    runs[0].update(edit)
    run_dir = _run_dir(tmp_path / "run", runs)
    assert fit_cli.main([str(run_dir), "--out", str(tmp_path / "fit.png")]) == 0
    err = capsys.readouterr().err
    summary = run_dir / "summary.json"
    assert f"rcswarm fit: {summary}: the run at {shown}" in err and "left out of the law across lengths" in err
    assert f"{summary}: the law panel shows the training loss at the last matched step" in err
    assert (tmp_path / "fit.png").stat().st_size > 1000


def test_fit_of_a_run_dir_keeps_the_held_out_law_of_the_good_runs(tmp_path: Path, capsys) -> None:
    """Four runs, one with an infinite held-out loss: the law over the other three, its title saying one was left
    out, no fallback."""
    runs = [{"seq_len": length, "rounds": 30, "val_loss_final": _law_loss(length, 300)} for length in LENGTHS]
    runs[0]["val_loss_final"] = math.inf
    run_dir = _run_dir(tmp_path / "run", runs)
    assert fit_cli.main([str(run_dir), "--out", str(tmp_path / "fit.png")]) == 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "summary.json" in line]
    assert "the run at seq_len 2 with held-out loss inf is left out" in line
    law = fit_cli.summary_law(run_dir)
    assert law is not None and law.lengths == (4.0, 8.0, 16.0) and "1 run(s) left out" in law.what


def test_bench_refuses_an_unknown_group_by_key_before_any_model_trains(tmp_path: Path, capsys) -> None:
    """`--group-by bogus` was refused by `evaluate`, after the first model had trained its share of the budget,
    leaving a half-written --out/swarm/."""
    out = tmp_path / "bench"
    assert bench_cli.main([*TINY, "--group-by", "bogus", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rcswarm bench diag: --group-by 'bogus': this task's metadata has ['depth'," in err
    assert not (out / "swarm").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--lr", "-1"], "--lr -1.0: expected a learning rate between 1e-10 and 10"),
    (["--lr", "nan"], "--lr nan: expected a learning rate between"),
    (["--lr", "inf"], "--lr inf: expected a learning rate between"),
    (["--lr", "100"], "--lr 100.0: expected a learning rate between"),
    (["--seed", "-1"], "--seed -1: expected an integer between 0 and 9223372036854775807"),
    (["--seed", str(2**63)], f"--seed {2**63}: expected an integer between 0 and"),
])
def test_bench_refuses_a_bad_lr_or_seed_naming_the_flag_before_any_model_trains(tmp_path: Path, capsys,
                                                                                 flags: list[str], message: str):
    """--lr -1 or nan: torch's "Invalid learning rate" after 18 s, no flag named; --seed -1: "seed=-1: expected ...";
    an lr or seed the RUN.toml's inner.lr / run.seed refuse failed after training."""
    out = tmp_path / "bench"
    assert bench_cli.main([*TINY, *flags, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_bench_says_in_one_line_that_it_cannot_write_its_results(tmp_path: Path, capsys) -> None:
    """--out /proc/...: os.access says root may write there, and mkdir raised FileNotFoundError as a traceback (as
    another user, --out's own check refuses it)."""
    out = "/proc/rcswarm-bench-review"
    assert bench_cli.main([*TINY, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rcswarm bench diag: ") and out in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_bench_docstrings_example_runs(tmp_path: Path) -> None:
    """The example `--task-arg p=0.2 --task-arg depth=32` was refused ("MazeConfig.p: unknown field"); run with a
    step per model instead of its budget."""
    example = bench_cli.__doc__.split("\n\n")[1].replace("\\\n", " ")
    argv = shlex.split(example)
    assert argv[:3] == ["rcswarm", "bench", "diag"]
    out = tmp_path / "example"
    assert bench_cli.main([*argv[3:], "--max-steps", "1", "--batch-size", "2", "--eval-examples", "2",
                           "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert report["task_config"] == {"p_withheld": 0.2, "exact_depth": True}


@pytest.mark.parametrize("more", [[], ["--json"]])
def test_status_refuses_a_state_dir_that_does_not_exist_whatever_else_is_given(tmp_path: Path, capsys,
                                                                               more: list[str]) -> None:
    """`--coordinator ... --json --state-dir nope` exited 0, ignoring it; without --json it said "no state dir
    below it holds run(s)" after the call. The coordinator here is never called (nothing listens on port 1)."""
    missing = tmp_path / "nope"
    for argv in (["--coordinator", "127.0.0.1:1", "--token", "t" * 24, "--timeout", "2"], []):
        assert status_cli.main([*argv, "--state-dir", str(missing), *more]) == 2
        assert capsys.readouterr().err == f"rcswarm status: --state-dir {missing}: no such directory (expected the " \
                                          "coordinator's state directory, or a mirrored swarm's)\n"
    afile = tmp_path / "afile"
    afile.write_text("")
    assert status_cli.main(["--state-dir", str(afile), *more]) == 2
    assert f"--state-dir {afile}: not a directory" in capsys.readouterr().err


def test_status_refuses_json_beside_a_coordinators_state_dir(tmp_path: Path, capsys) -> None:
    """--json prints GetStatus alone: the fit --state-dir adds is in the tables, so it was silently dropped."""
    argv = ["--coordinator", "127.0.0.1:1", "--token", "t" * 24, "--timeout", "2", "--state-dir", str(tmp_path),
            "--json"]
    assert status_cli.main(argv) == 2
    assert "--json prints GetStatus alone, without the fit that --state-dir adds" in capsys.readouterr().err
