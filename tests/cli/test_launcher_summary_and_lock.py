"""What the review of the local launcher and the worker CLI (2026-11-29) found, in-process: a signal while `rcswarm
run` fitted a sweep's law ended it before summary.json was written; a second `rcswarm run` on a run directory in use
deleted the first one's coordinator.json; `rcswarm worker --state-dir ""` took the working directory. (The launches
with real processes: tests/swarm/test_launcher_signals_and_lock.py.)"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import threading
import time

import pytest
from rich.console import Console

import rcswarm.worker.worker
from rcswarm.cli import run as run_cli
from rcswarm.cli import worker as worker_cli
from rcswarm.state.lock import StateDirLock
from tests.helpers.specs import tiny_spec, write_spec

SWEEP = tiny_spec(sweep={"seq_lens": [4, 8, 16]})
COMPLETED = run_cli.Outcome("completed", "completed 2 rounds", 0)
LAUNCHER_LOCK = "launcher.lock"  # state/lock.py LAUNCHER_LOCK_NAME
PATH_FLAGS = ("--state-dir", "--membership-file", "--data-root", "--tls-ca", "--tls-cert", "--tls-key")


def sweep_rows() -> list[dict]:
    """A summary row per length of SWEEP, as `summarize_run` makes them (the held-out losses falling with L)."""
    return [{"seq_len": length, "batch_size": 4, "rounds": 2, "workers": 1, "first_round_loss": 3.2,
             "last_round_loss": 2.9, "val_loss_initial": 5.5, "val_loss_final": loss, "tokens": 0,
             "tokens_per_second": 0.0, "bytes_sent_per_round": 0.0, "bytes_received_per_round": 0.0,
             "sync_share": math.nan, "wall_seconds": 0.0, "ratio_up": math.nan, "ratio_down": math.nan}
            for length, loss in zip(SWEEP.sweep.seq_lens, (3.0, 2.6, 2.3))]


def test_a_sigterm_while_the_sweeps_law_is_fitted_ends_it_and_summary_json_is_whole(tmp_path, monkeypatch) -> None:
    """SIGTERM while the launcher fitted and plotted a sweep's law (its stop handlers given back by then) killed it
    before summary.json was written (repro: rc 143, no summary.json). Now summary.json is written before the fit,
    the signal ends the fit at once (a fit.png it had begun is removed) and the launcher exits 143 after writing
    summary.json again without the law."""
    def slow_fit(console, run_dir, held_out=None):
        """A fit that has begun its fit.png when the signal comes, and would take 10 s more."""
        (run_dir / "fit.png").write_bytes(b"\x89PNG cut short")
        assert json.loads((run_dir / "summary.json").read_text())["law_problem"].startswith("not fitted yet")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the signal ends this
        raise AssertionError("the fit went on after SIGTERM")

    monkeypatch.setattr(run_cli, "fit_law", slow_fit)
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    with run_cli.SummarySignals() as signals:
        run_cli.print_summary(Console(file=io.StringIO(), width=200), tmp_path, SWEEP, sweep_rows(), COMPLETED, signals)
    assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGTERM) is before
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["outcome"] == "completed" and document["fit"]["alpha"] > 0
    assert document["law"] is None and document["law_problem"] == "not fitted: interrupted by SIGTERM"
    assert not (tmp_path / "fit.png").exists() and not (tmp_path / "summary.json.partial").exists()
    assert run_cli.summary_status(COMPLETED, signals) == 128 + signal.SIGTERM


def test_a_sighup_before_the_fit_skips_it_and_is_given_to_the_earlier_handler(tmp_path, monkeypatch) -> None:
    """A closed terminal's SIGHUP while the table is printed: the fit is not begun, summary.json is written, the exit
    status is 129; the signal goes to the handler from before once the summary stretch ends."""
    monkeypatch.setattr(run_cli, "fit_law", lambda *args: pytest.fail("fitted after SIGHUP"))
    seen: list[int] = []
    before = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
    try:
        with run_cli.SummarySignals() as signals:
            os.kill(os.getpid(), signal.SIGHUP)
            assert seen == []  # noted, not yet passed on
            run_cli.print_summary(Console(file=io.StringIO(), width=200), tmp_path, SWEEP, sweep_rows(), COMPLETED,
                                  signals)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert seen == [signal.SIGHUP]
    assert json.loads((tmp_path / "summary.json").read_text())["law_problem"] == "not fitted: interrupted by SIGHUP"
    assert run_cli.summary_status(COMPLETED, signals) == 129
    interrupted = run_cli.Outcome("interrupted", "stopped by SIGTERM", 143)
    assert run_cli.summary_status(interrupted, signals) == 143  # the signal that stopped the launch


def test_a_second_launch_on_a_locked_run_dir_is_refused_and_touches_nothing(tmp_path, monkeypatch, capsys) -> None:
    """A second `rcswarm run` on a run directory in use deleted the first one's coordinator.json and quoted the first
    one's log lines as its reason (exit 1). Now it is refused at once (exit 2), naming the holder's pid and its
    coordinator's address, before it writes or deletes anything."""
    monkeypatch.setattr(run_cli.Swarm, "start_coordinator", lambda self: pytest.fail("launched on a locked run dir"))
    run_dir = tmp_path / "run"
    held = StateDirLock.acquire(run_dir, role="launcher", name=LAUNCHER_LOCK)
    try:
        held.announce("127.0.0.1:40345")
        port_file = run_dir / "coordinator.json"
        port_file.write_text('{"port": 40345, "pid": 1}')
        config = write_spec(tiny_spec(run={"rounds": 1, "workers": 1}), tmp_path / "run.toml")
        assert run_cli.main([str(config), "--run-dir", str(run_dir)]) == 2
        assert port_file.read_text() == '{"port": 40345, "pid": 1}'
        assert sorted(p.name for p in run_dir.iterdir()) == ["coordinator.json", LAUNCHER_LOCK]
    finally:
        held.release()
    err = capsys.readouterr().err
    assert err.startswith(f"rcswarm run: --run-dir {str(run_dir)!r} is in use by another rcswarm run (pid {os.getpid()}")
    assert "its coordinator serving on 127.0.0.1:40345" in err and "another --run-dir" in err


class ReachedWorker:
    """Stands in for the worker loop: reaching it means the command line was accepted."""

    def __init__(self, options, token, previous=None) -> None:
        self.stop = threading.Event()

    def run(self) -> int:
        return 0


class NoSignals:
    """Stands in for StopSignal: installs nothing in the test's process."""

    def __init__(self, target=None) -> None:
        self.target = target

    def install(self, *signals: int) -> NoSignals:
        return self


@pytest.mark.parametrize("flag", PATH_FLAGS)
def test_an_empty_worker_path_is_a_usage_error_naming_the_flag(flag, tmp_path, monkeypatch, capsys) -> None:
    """`rcswarm worker --state-dir ""` took the working directory as its state dir (locked it, would keep its
    residual and membership file there); an empty --data-root read datasets under it. Each empty path flag is now
    refused, one line naming it, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RCSWARM_TOKEN", "t" * 32)
    monkeypatch.setattr(rcswarm.worker.worker, "Worker", ReachedWorker)
    monkeypatch.setattr(worker_cli, "StopSignal", NoSignals)
    monkeypatch.setattr(worker_cli, "set_threads", lambda threads: None)
    assert worker_cli.main(["--coordinator", "127.0.0.1:1", flag, ""]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"rcswarm worker: {flag} '': expected a path"
    assert list(tmp_path.iterdir()) == []
