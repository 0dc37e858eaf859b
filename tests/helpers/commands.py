"""In-process command lines for the tests of cli/: a command's exit status however its main reports it."""

from __future__ import annotations

from collections.abc import Callable


def status_of(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """The exit status of a command's main, whether it returns it or argparse's error raises it."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code)
