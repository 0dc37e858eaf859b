"""In-process command lines for the tests of cli/: a command's exit status however its main reports it."""

from __future__ import annotations

from collections.abc import Callable


def status_of(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """The exit status of a command's main, whether it returns it or argparse's error raises it."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code)


def one_error_line(err: str) -> str:
    """The one non-blank line a usage error writes to stderr (`err`, as capsys read it), with no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def not_started(*_args, **_kwargs):
    """A stand-in for what a command starts (monkeypatched in): a refused command line must never reach it."""
    raise AssertionError("started though the command line is refused")
