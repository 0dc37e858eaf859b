"""What `rcswarm run` and `rcswarm` say when something goes wrong (review of the command line, 2026-11-28): the
summary's held-out evaluation failing, skipped or needless, a worker that dies, Ctrl-C during the imports, a
coordinator that refuses a resumed run directory."""

from __future__ import annotations

import torch

from rcswarm.cli import run as run_cli
from tests.helpers.specs import tiny_spec


def test_a_held_out_split_the_evaluation_cannot_read_is_a_reason_not_a_traceback(monkeypatch) -> None:
    def short_split(spec, params):
        raise ValueError("ds: split 'val' (1 shards): no shard has 64 tokens (window longer than the data)")

    monkeypatch.setattr(run_cli, "evaluate", short_split)
    losses = run_cli.held_out_losses(tiny_spec(), {"w": torch.zeros(1)}, evaluated=True)
    assert losses["val_loss_initial"] is None and losses["val_loss_final"] is None
    assert "window longer than the data" in losses["val_loss_problem"]
    shown = run_cli._held_out_loss({"rounds": 3, **losses})
    assert shown.startswith("— (") and "split 'val'" in shown


def test_a_run_without_final_parameters_is_evaluated_once_and_a_skipped_one_not_at_all(monkeypatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(run_cli, "evaluate", lambda spec, params: calls.append(params) or 4.5)
    assert run_cli.held_out_losses(tiny_spec(), None, evaluated=True) == {
        "val_loss_initial": 4.5, "val_loss_final": 4.5, "val_loss_problem": ""}
    assert calls == [None]
    skipped = run_cli.held_out_losses(tiny_spec(), None, evaluated=False)
    assert skipped["val_loss_final"] is None and skipped["val_loss_problem"] == "not evaluated: interrupted"
    assert calls == [None]


def test_ctrl_c_before_a_command_takes_over_is_one_line_and_status_130(monkeypatch, capsys) -> None:
    """Ctrl-C while a command's modules import (torch: a second or two) printed a KeyboardInterrupt traceback."""
    from rcswarm.cli import main as cli_main

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main.importlib, "import_module", interrupted)
    assert cli_main.main(["status"]) == 130
    assert capsys.readouterr().err == "rcswarm: interrupted\n"


def test_a_worker_that_dies_is_named_with_its_logs_last_line(tmp_path) -> None:
    """A sweep whose workers of one length died at their start waited for its time limit without a word."""
    log = tmp_path / "worker-2.log"
    log.write_text("--- rcswarm run: launched ---\n" + "x" * 5000 + "\nworker ERROR worker-2 cannot start: "
                   "split 'val' (1 shards): no shard has 64 tokens\n\n")
    line = run_cli.failure_line(2, 1, log)
    assert line == (f"worker-2 exited with status 1 while the run goes on: worker ERROR worker-2 cannot start: split "
                    f"'val' (1 shards): no shard has 64 tokens (log: {log})")
    gone = tmp_path / "gone.log"
    assert run_cli.failure_line(0, 2, gone).endswith(f"(its log is empty) (log: {gone})")


def test_a_refused_resume_quotes_only_this_launchs_log(tmp_path) -> None:
    """A resumed run directory's coordinator.log holds the earlier launches above this one's line; the refusal quoted
    its last 2,000 characters, mostly the earlier launches' output, before the reason."""
    log = tmp_path / "coordinator.log"
    log.write_text(f"{run_cli.LAUNCH_MARK} 2026-11-28 10:00:00 ---\n" + "an earlier launch's line\n" * 200
                   + f"{run_cli.LAUNCH_MARK} 2026-11-28 11:00:00 ---\nrcswarm coordinator: state dir holds a run "
                   "whose spec differs in ['run.minutes']\n")
    assert run_cli.this_launch(log) == (f"{run_cli.LAUNCH_MARK} 2026-11-28 11:00:00 ---\nrcswarm coordinator: state "
                                        "dir holds a run whose spec differs in ['run.minutes']\n")
    other = tmp_path / "plain.log"
    other.write_text("no mark\n")
    assert run_cli.this_launch(other) == "no mark\n"
