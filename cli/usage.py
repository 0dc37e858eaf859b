"""The command line's one error convention.

A usage error (an unknown flag, a bad value, an unreadable or invalid config or input file) prints
one line, `<command>: <what is wrong>`, on stderr and exits 2; `--help` exits 0; a failure while
running (a coordinator that cannot be reached, a training process that died) exits 1.
Every command's entry point lives in cli/ (`rcswarm coordinator` and `rcswarm worker` included).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE_ERROR = 2


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless it has no default or already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = default is not None and default is not False and default != [] and default != argparse.SUPPRESS
        if not shown or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command's parser: every option's help line shows its default."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=DefaultsHelpFormatter)


def usage_error(prog: str, message: str) -> int:
    """Print `prog: message` on stderr; the exit status of a usage error."""
    print(f"{prog}: {message}", file=sys.stderr)
    return USAGE_ERROR


def parse_or_status(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status argparse chose (0 after --help, 2 for a usage error)."""
    try:
        return parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
