"""Every command guides: each option has a help line, every --help exits 0, errors name the value."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rcswarm.cli import bench, data, fit, main, run, status

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "run": run.parser,
    "fit": fit.parser,
    "status": status.parser,
    "data frames": data.parser,
    "bench diag": bench.parser,
}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]


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
])
def test_help_and_version_exit_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(argv) == 0
    assert capsys.readouterr().out.strip()


def test_version_names_the_installed_distribution() -> None:
    out = subprocess.run([sys.executable, "-m", "rcswarm.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("rcswarm ") and "unknown" not in out.stdout


def test_model_names_and_presets_are_listed_in_bench_help() -> None:
    text = bench.parser().format_help()
    for name in ("chaingpt", "frame", "lstm_lm", "psm", "transformer"):
        assert name in text


def test_fit_on_a_missing_path_says_it_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nothing-here"
    assert fit.main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: no such file or directory" in err and "suffix" not in err
