"""The command line's one error convention.

A usage error (an unknown flag, a bad value, an unreadable or invalid config or input file) prints
one line, `<command>: <what is wrong>`, on stderr and exits 2; `--help` exits 0; a failure while
running (a coordinator that cannot be reached, a training process that died) exits 1.
Every command's entry point lives in cli/ (`rcswarm coordinator` and `rcswarm worker` included).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

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


def path_arg(text: str) -> Path | str:
    """An argparse `type` for a path flag: a Path, but an empty value stays "" (Path("") is the working directory),
    for `empty_path_problem` to refuse it."""
    return Path(text) if text else text


def empty_path_problem(flag: str, value: str | os.PathLike | None) -> str | None:
    """`--flag '': expected a path` for an empty value (it would mean the working directory), else None."""
    if value is not None and os.fspath(value) == "":
        return f"{flag} '': expected a path"
    return None


def output_dir_problem(flag: str, path: str | os.PathLike) -> str | None:
    """Why `path` cannot be, or be made, the directory a command writes into (None: it can); checked before any
    work, so that a file in its place fails at once with the flag named, not in a traceback at the end. An empty
    value is refused (pass the flag's text, or `path_arg`'s value: Path("") would be the working directory)."""
    empty = empty_path_problem(flag, path)
    if empty is not None:
        return empty
    path = Path(path)
    return _directory_problem(flag, path, path)


def output_file_problem(flag: str, path: str | os.PathLike, suffixes: Sequence[str] = ()) -> str | None:
    """Why a command cannot write the file `path` (its directory made if missing), or None; `suffixes`: the
    file types it can write (empty: any)."""
    empty = empty_path_problem(flag, path)
    if empty is not None:
        return empty
    path = Path(path)
    if suffixes and path.suffix.lower() not in suffixes:
        return f"{flag} {str(path)!r}: expected a file ending in {' or '.join(suffixes)}"
    try:
        if path.is_dir():
            return f"{flag} {str(path)!r} is a directory; expected a file"
    except OSError as exc:  # a name too long, a parent that cannot be searched: Path.is_dir raises those
        return _os_problem(flag, path, exc)
    return _directory_problem(flag, path, path.parent)


def _directory_problem(flag: str, given: Path, directory: Path) -> str | None:
    """Why `directory` (of the flag's value `given`) cannot be, or be made, a directory to write into."""
    try:
        existing = next((p for p in (directory, *directory.parents) if p.exists()), Path("."))
        if not existing.is_dir():
            return (f"{flag} {str(given)!r}: {str(existing)!r} is not a directory; expected a directory to write into "
                    "(made if missing)")
    except OSError as exc:  # Path.exists raises all but ENOENT, ENOTDIR, EBADF, ELOOP: ENAMETOOLONG, EACCES
        return _os_problem(flag, given, exc)
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {str(given)!r}: {str(existing)!r} is not writable"
    return None


def _os_problem(flag: str, given: Path, exc: OSError) -> str:
    """`--flag 'value': <the OS's reason>` for an OSError met while looking at the flag's path."""
    return f"{flag} {str(given)!r}: {exc.strerror or exc}"


# `--http-trusted-proxy`'s help (observe/dashboard/proxies.py), on `rcswarm coordinator` and `rcswarm dht` alike.
TRUSTED_PROXY_HELP = ("a reverse proxy in front of the dashboard, as an IPv4/IPv6 network or address (repeatable): for "
                      "a request from it, the client its X-Forwarded-For header names is the one the login throttle "
                      "and the log lines count (walked from the right, past trusted entries), and it is exempt from "
                      "the per-address connection cap. Anyone inside these networks can claim any client address: "
                      "name the proxies alone; needs --http-port")
