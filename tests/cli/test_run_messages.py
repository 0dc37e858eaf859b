"""What `rcswarm run` and `rcswarm` say when something goes wrong (review of the command line, 2026-11-28): the
summary's held-out evaluation failing, skipped or needless, a worker that dies, Ctrl-C during the imports, a
coordinator that refuses a resumed run directory."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import signal
import time

import torch
from rich.console import Console
from safetensors.torch import save_file

from rcswarm.cli import run as run_cli
from rcswarm.observe.report import summarize
from rcswarm.state.store import StateStore
from tests.helpers.specs import tiny_spec


def test_a_held_out_split_the_evaluation_cannot_read_is_a_reason_not_a_traceback(monkeypatch) -> None:
    def short_split(spec, params):
        raise ValueError("ds: split 'val' (1 shards): no shard has 64 tokens (window longer than the data)")

    monkeypatch.setattr(run_cli, "evaluate", short_split)
    losses = run_cli.held_out_losses(tiny_spec(), {"w": torch.zeros(1)}, evaluated=True)
    assert losses["val_loss_initial"] is None and losses["val_loss_final"] is None
    assert "window longer than the data" in losses["val_loss_problem"]
    shown = run_cli.held_out_text({"rounds": 3, **losses})
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


class Stopped(Exception):
    """What this test's own SIGTERM/SIGHUP handler raises, should the evaluation leave the signal to it."""


def test_sigterm_or_sighup_during_the_evaluation_skips_it_and_the_summary_is_written(capsys) -> None:
    """A process manager's SIGTERM or a closed terminal's SIGHUP while the summary's held-out evaluation ran (the
    launch's stop handlers uninstalled by then) ended `rcswarm run` without summary.json: now it skips the
    evaluation as Ctrl-C does, and the handlers from before are back after."""
    def stop_handler(signum, frame):
        raise Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        before = signal.signal(sig, stop_handler)
        try:
            calls: list[bool] = []

            def summarize_all(evaluated: bool) -> list[bool]:
                calls.append(evaluated)
                if evaluated:
                    os.kill(os.getpid(), sig)
                    time.sleep(5)  # the handler interrupts this
                return calls

            console = Console(file=io.StringIO(), width=200)
            assert run_cli.skippable_evaluation(console, summarize_all) == [True, False]
            assert "held-out evaluation interrupted: the summary is written without it" in console.file.getvalue()
            assert signal.getsignal(sig) is stop_handler
        finally:
            signal.signal(sig, before)


def test_a_hivemind_runs_summary_says_why_its_held_out_loss_is_missing(tmp_path, monkeypatch) -> None:
    """The hivemind launch evaluated without `held_out_losses`: a held-out split it cannot read ended it in a
    traceback, and Ctrl-C during the evaluation too, both without summary.json."""
    from rcswarm.cli import run_hivemind

    spec = tiny_spec(run={"workers": 1})
    peer = tmp_path / "peers" / "worker-0"
    peer.mkdir(parents=True)
    (peer / "summary.json").write_text(json.dumps({"name": "worker-0", "version": 2, "history": [
        {"loss": 5.0, "skipped": False, "drift": 0.0}, {"loss": 4.0, "skipped": False, "drift": 0.0}]}))
    save_file({"w": torch.zeros(3)}, str(peer / "final.safetensors"))

    def short_split(spec, params):
        raise ValueError("ds: split 'val': no shard has 64 tokens")

    monkeypatch.setattr(run_cli, "evaluate", short_split)
    result = run_hivemind.summarize(spec, tmp_path, 1)
    assert result["val_loss_final"] is None and "no shard has 64 tokens" in result["val_loss_problem"]
    assert run_cli.held_out_text(result) == "— (ds: split 'val': no shard has 64 tokens)"
    skipped = run_hivemind.summarize(spec, tmp_path, 1, evaluated=False)
    assert skipped["val_loss_problem"] == "not evaluated: interrupted" and skipped["rounds"] == 2


def test_a_hivemind_runs_full_disk_at_the_export_is_said_and_the_summary_kept(tmp_path, monkeypatch, capsys) -> None:
    """A review (2026-11-29): the hivemind launch copied worker-0's replica to final.safetensors with nothing to
    catch a full disk (a traceback, no summary.json), where the coordinator's launch records `export_problem`."""
    import errno

    from rcswarm.cli import run_hivemind

    spec = tiny_spec(run={"workers": 1})
    peer = tmp_path / "peers" / "worker-0"
    peer.mkdir(parents=True)
    (peer / "summary.json").write_text(json.dumps({"name": "worker-0", "version": 1, "history": [
        {"loss": 5.0, "skipped": False, "drift": 0.0}]}))
    save_file({"w": torch.zeros(3)}, str(peer / "final.safetensors"))

    def full_disk(source, destination):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_hivemind.shutil, "copyfile", full_disk)
    result = run_hivemind.summarize(spec, tmp_path, 1, evaluated=False)
    said = f"final parameters not exported: [Errno {errno.ENOSPC}] No space left on device"
    assert result["export_problem"] == said and result["rounds"] == 1
    assert capsys.readouterr().err.splitlines() == [f"rcswarm run: {said}"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["peers"]  # no final.safetensors, no temporary
    monkeypatch.undo()
    assert run_hivemind.summarize(spec, tmp_path, 1, evaluated=False)["export_problem"] == ""
    assert (tmp_path / "final.safetensors").is_file()


def test_summary_json_of_an_empty_run_is_strict_json(tmp_path) -> None:
    """An empty or failed run's row has NaN losses and ratios; summary.json held them as bare NaN (not JSON: a CI
    script's JSON.parse failed on exactly the runs it checks), since `default=` never sees a float. Now null."""
    store = StateStore(tmp_path / "state")
    store.close()
    store = StateStore.open_read_only(tmp_path / "state")
    try:
        summary = summarize(store)
    finally:
        store.close()
    row = {"seq_len": 32, "batch_size": 4, "trained": [], **dataclasses.asdict(summary), "fp32_bytes": 0,
           "ratio_up": math.nan, "ratio_down": math.nan, "val_loss_initial": 5.5, "val_loss_final": None,
           "val_loss_problem": "", "val_losses": [], "forecasts": [], "pruning": [], "stopped": None}
    run_cli.print_summary(Console(file=io.StringIO(), width=200), tmp_path, tiny_spec(), [row],
                          run_cli.Outcome("failed", "no round completed", 1))

    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    document = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert document["first_round_loss"] is None and document["ratio_up"] is None and document["val_loss_initial"] == 5.5


def test_a_model_its_coordinator_would_refuse_is_refused_before_the_run_dir_is_made(tmp_path, capsys) -> None:
    """`rcswarm run` made the run dir and its logs, started the coordinator and quoted its refusal from the log;
    the launcher counts the model as the coordinator does (coordinator/capacity.py) and says so first."""
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "small", "overrides": {"n_layers": 100_000}}, run={"rounds": 1})
    config = tmp_path / "run.toml"
    config.write_text(spec.to_toml())
    assert run_cli.main([str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rcswarm run: the model (lstm_lm preset 'small', overrides {'n_layers': 100000}) has more "), err
    assert "more than this coordinator's limit of" in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_max_params_sets_the_limit_rcswarm_run_and_its_processes_hold_a_model_to(tmp_path, capsys) -> None:
    """The refusal said "--max-params sets it", and `rcswarm run` had no such flag: a model above the host's default
    could not be run at all. It sets the launcher's check and is passed to the coordinator and every worker."""
    spec = tiny_spec(run={"rounds": 1})
    config = tmp_path / "run.toml"
    config.write_text(spec.to_toml())
    assert run_cli.main([str(config), "--run-dir", str(tmp_path / "run"), "--max-params", "1000"]) == 2
    err = capsys.readouterr().err
    assert "more than this coordinator's limit of 1,000 parameters (--max-params)" in err, err
    assert not (tmp_path / "run").exists()
    args = run_cli.parse_args([str(config), "--max-params", str(10**12)])
    assert run_cli.load_spec(args).model == spec.model
    swarm = run_cli.Swarm(spec, tmp_path / "run", 1, args.max_params)
    assert swarm.limit_args == ["--max-params", str(10**12)]
    assert run_cli.Swarm(spec, tmp_path / "run", 1).limit_args == []
    assert run_cli.parse_args([str(config), "--max-params", "-1"]) == 2
    assert "--max-params -1: expected >= 0" in capsys.readouterr().err
