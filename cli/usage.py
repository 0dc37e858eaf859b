"""The command line's one error convention.

A usage error (an unknown flag, a bad value, an unreadable or invalid config or input file) prints
one line, `<command>: <what is wrong>`, on stderr and exits 2; `--help` exits 0; a failure while
running (a coordinator that cannot be reached, a training process that died) exits 1.
`rcswarm coordinator` and `rcswarm worker`, whose entry points live beside their servers, follow
the same rule.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE_ERROR = 2


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
