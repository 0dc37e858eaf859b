"""Every command guides: each option has a help line, every --help exits 0, errors name the value."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from rcswarm.cli import bench, coordinator, data, dht, fit, launch, main, run, status, worker

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "run": run.parser,
    "fit": fit.parser,
    "status": status.parser,
    "data frames": data.parser,
    "bench diag": bench.parser,
    "coordinator": coordinator.parser,
    "worker": worker.parser,
    "launch ray": launch.parser,
    "dht": dht.parser,
}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user sees (not --help, not the hidden aliases kept for old scripts)."""
    return [action for action in parser._actions
            if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS]


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_has_a_help_line(command: str) -> None:
    missing = [action.dest for action in options(PARSERS[command]()) if not (action.help or "").strip()]
    assert not missing, f"rcswarm {command}: options without help text: {missing}"


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_help_shows_every_non_empty_default(command: str) -> None:
    text = " ".join(PARSERS[command]().format_help().split())
    for action in options(PARSERS[command]()):
        default = action.default
        if action.option_strings and default not in (None, False, []) and not isinstance(default, bool):
            assert f"default: {default}" in text or "default" in (action.help or ""), (command, action.dest)


@pytest.mark.parametrize("argv", [
    ["--help"], ["run", "--help"], ["fit", "--help"], ["status", "--help"], ["data", "--help"],
    ["data", "frames", "--help"], ["bench", "--help"], ["bench", "diag", "--help"], ["--version"],
    ["coordinator", "--help"], ["worker", "--help"], ["launch", "--help"], ["launch", "ray", "--help"],
])
def test_help_and_version_exit_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main.main(argv)
    except SystemExit as exit_:
        code = exit_.code or 0
    assert code == 0
    assert capsys.readouterr().out.strip()


def test_model_names_and_presets_are_listed_in_bench_help() -> None:
    text = bench.parser().format_help()
    for name in ("chaingpt", "frame", "lstm_lm", "psm", "transformer"):
        assert name in text


def test_fit_on_a_missing_path_says_it_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing-here"
    assert fit.main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: no such file or directory" in err and "suffix" not in err


@pytest.mark.parametrize(("argv", "expected"), [
    (["/usr/bin/python3", "-m", "rcswarm.cli", "worker", "--coordinator", "h:1"], True),
    (["/usr/bin/python3", "-m", "rcswarm.cli.main", "worker", "--coordinator", "h:1"], True),
    (["/venv/bin/rcswarm", "worker", "--coordinator", "h:1"], True),
    (["/venv/bin/rcswarm", "coordinator", "--config", "worker"], False),
    (["/usr/bin/python3", "-m", "rcswarm.cli", "coordinator"], False),
    (["vim", "rcswarm/worker.py"], False),
])
def test_a_worker_counts_the_workers_on_its_host(argv: list[str], expected: bool) -> None:
    """`rcswarm worker` without --threads divides the cores by the worker processes it finds."""
    assert worker.is_worker_command(argv) is expected
    threads, why = worker.auto_threads()
    assert threads >= 1 and "cores" in why
