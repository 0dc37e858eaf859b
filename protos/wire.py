"""Constants both ends of the wire agree on: where the join token comes from, message size limits; how the other
end's strings are made fit to print (`printable`).

The coordinator's server, the worker's client, `rcswarm status` and the launcher import these
rather than keeping their own copies, so a limit changes in one place.
"""

from __future__ import annotations

import logging

# The environment variable holding the join token (better than argv, which other users can read).
TOKEN_ENV = "RCSWARM_TOKEN"


# A join token shorter than this draws a WARNING (never a refusal: tests and small set-ups use short ones): the
# token is the only secret between the network and the swarm, and the dashboard's login can be guessed at online.
MIN_TOKEN_CHARS = 16
# The longest join token: a client sends it in gRPC metadata, limited to 16 KiB in all (a longer one is refused
# RESOURCE_EXHAUSTED, "received metadata size exceeds hard limit", on every call).
MAX_TOKEN_CHARS = 4096


def long_token_problem(token: str, source: str) -> str | None:
    """Why `token` (from `source`) is too long to send, naming its length and never the token, or None (pure)."""
    if len(token) <= MAX_TOKEN_CHARS:
        return None
    return (f"the join token of {source} has {len(token)} characters, more than {MAX_TOKEN_CHARS}: gRPC metadata, "
            "which carries it, holds at most 16 KiB, so no client could send it")


def short_token_warning(token: str, source: str) -> str | None:
    """A warning naming `source` and the token's length (never the token) when it is shorter than MIN_TOKEN_CHARS,
    else None (pure)."""
    if len(token) >= MIN_TOKEN_CHARS:
        return None
    return (f"the join token of {source} has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}: it can be "
            "guessed; use a long random one, e.g. python -c \"import secrets; print(secrets.token_urlsafe(32))\"")


def one_token(value: str, source: str) -> str:
    """The join token `value` (from `source`: --token, $RCSWARM_TOKEN) without surrounding whitespace, as a token
    file's line is read: a Secret written by `echo` or `openssl rand` ends in a newline, which the coordinator
    accepted while every worker's metadata was refused ("Illegal header value"). ValueError naming `source`, never
    the token, for one that is empty, holds other than printable ASCII without spaces, or is longer than
    MAX_TOKEN_CHARS (`long_token_problem`); a WARNING for one shorter than MIN_TOKEN_CHARS (`short_token_warning`)."""
    token = value.strip()
    if not token or not all(33 <= ord(char) < 127 for char in token):
        raise ValueError(f"the join token of {source}: expected one token of printable ASCII without spaces")
    too_long = long_token_problem(token, source)
    if too_long is not None:
        raise ValueError(too_long)
    warning = short_token_warning(token, source)
    if warning is not None:
        logging.getLogger("rcswarm").warning("%s", warning)
    return token

# Largest gRPC message either side sends or accepts; tensors travel in chunks of at most 1 MiB
# (sync/tensor_stream.py), so this bounds a chunk plus its header with room to spare.
MAX_MESSAGE_BYTES = 4 << 20

# gRPC channel and server options that apply MAX_MESSAGE_BYTES in both directions.
MESSAGE_SIZE_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)

# A PushUpdate without a join token presents its worker's id and secret in these metadata keys too, so the
# server can refuse it before the stream takes a slot (the meta message in the stream stays the authority).
WORKER_ID_METADATA = "rcswarm-worker-id"
WORKER_SECRET_METADATA = "rcswarm-worker-secret-bin"

# The largest held-out loss a worker reports on a pull's row (Metric.val_loss, issue #30): the coordinator refuses a
# larger one, and a worker does not send one (a diverged θ is no point of the curve).
MAX_VAL_LOSS = 1e4


def printable(text: str) -> str:
    """`text` with every character that is not printable (newlines, escape sequences, other control characters)
    written as its Python escape: the other end's string (a worker name, a device, a leave reason; a status's
    details, an assignment's reason, a run id) fit for one log line, an event row and a terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)

# The most runs a Join names as refused by its worker (JoinRequest.refused_run_ids): a worker stops after refusing
# this many, and a coordinator refuses a Join that names more (a sweep has a handful of runs).
MAX_REFUSED_RUNS = 64
# How a Join refused FAILED_PRECONDITION because the worker refused every run it could go to begins (the other
# FAILED_PRECONDITION of a Join says the run or the sweep finished): that worker ends with exit 1, naming why.
REFUSED_RUNS_REFUSAL = "join refused: this worker refused "
# How the Leave of a worker that cannot train its run begins (its model or windows above the worker's limits, out of
# memory): the run counts it among those that refused it (RunSummary.refused_by, last_refusal).
REFUSED_LEAVE = "refused: "
# The most refusing workers a run remembers (the newest kept).
MAX_REFUSALS = 64
