"""The client flags, declared once: how a command reaches a coordinator and proves it may.

    --coordinator HOST:PORT  [--token T | $RCSWARM_TOKEN]  [--tls-ca CA [--tls-cert C --tls-key K]]

`rcswarm worker`, `rcswarm status` and `rcswarm launch ray` add them with `add_client_flags` and read
them with `client_options` (the typed value, `ClientOptions` or a `WorkerOptions` built on it: HOST:PORT
and the TLS combination checked, the files as Paths) and `client_token` (--token, else $RCSWARM_TOKEN).
`rcswarm launch ray` takes no --token: its workers read the token on their own Ray nodes, and its TLS
files are paths on those nodes. A bad value raises ValueError naming the flag; the commands print it
as their usage error (cli/usage.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, TypeVar

from rcswarm.cli.usage import empty_path_problem, path_arg
from rcswarm.protos.wire import TOKEN_ENV, one_token
from rcswarm.worker import ClientOptions

Options = TypeVar("Options", bound=ClientOptions)


def add_client_flags(parser: argparse.ArgumentParser, coordinator_help: str, *, token: bool = True,
                     files_on: str = "") -> None:
    """--coordinator (help: what this command does with it), --token unless `token` is False, the --tls-* files
    (read on `files_on`, e.g. "every Ray node", when they are not read by this process)."""
    parser.add_argument("--coordinator", default=None, help=coordinator_help)
    if token:
        parser.add_argument("--token", default=None, help=f"join token (default: ${TOKEN_ENV})")
    where = f", a path on {files_on}" if files_on else ""
    parser.add_argument("--tls-ca", type=path_arg, default=None,
                        help=f"PEM CA certificate that signed the coordinator's{where}; enables TLS")
    parser.add_argument("--tls-cert", type=path_arg, default=None,
                        help=f"PEM client certificate{where}, for a coordinator with --tls-client-ca (mutual TLS)")
    parser.add_argument("--tls-key", type=path_arg, default=None, help=f"PEM private key of --tls-cert{where}")


def client_options(args: argparse.Namespace, kind: type[Options] = ClientOptions, **fields: Any) -> Options:
    """The client flags as one validated value: a `kind` (ClientOptions, or WorkerOptions with the worker's
    other `fields`; a field given overrides its flag); ValueError naming the flag that is wrong."""
    flags = {"coordinator": args.coordinator, "tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key}
    for name in ("tls_ca", "tls_cert", "tls_key"):  # "" would be the working directory (`path_arg`)
        problem = empty_path_problem(f"--{name.replace('_', '-')}", flags[name])
        if problem is not None:
            raise ValueError(problem)
    return kind(**{**flags, **fields})


def client_token(args: argparse.Namespace) -> str:
    """--token, else $RCSWARM_TOKEN; ValueError when neither is given."""
    if args.token:
        return one_token(args.token, "--token")
    if not os.environ.get(TOKEN_ENV, ""):
        raise ValueError(f"a join token is required (--token or ${TOKEN_ENV})")
    return one_token(os.environ[TOKEN_ENV], f"${TOKEN_ENV}")
