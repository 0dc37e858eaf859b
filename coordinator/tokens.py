"""The join tokens a coordinator accepts: one fixed token, or a file of tokens re-read when it changes.

Only Join and GetStatus need a join token (guards.py's `GuardInterceptor`); a joined worker's
calls are authenticated by the worker secret its Join returned (service.py). So the token can
be rotated while the run goes on: `rcswarm coordinator --token-file PATH` accepts every token
listed in PATH, one per line (blank lines and lines starting with `#` are ignored), and re-reads
the file when its modification time, size or inode changes (looked at most once a second, on the
next call that needs a token) and on SIGHUP. To rotate: add the new token to the file, start new
workers with it (or restart old ones), then remove the old token; workers that joined with the
old one keep training, and only their next Join (after an eviction or a coordinator restart)
needs the new token.

A reload is all or nothing: an unreadable, empty or malformed file keeps the tokens accepted
before and logs a warning naming the path and the problem. Tokens are never logged.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rcswarm.protos.wire import TOKEN_ENV, long_token_problem, one_token, short_token_warning

log = logging.getLogger("rcswarm.coordinator")

# The longest a changed token file goes unnoticed while calls that need a token arrive.
CHECK_EVERY_S = 1.0
# (mtime in ns, size, inode) of the token file, or None when it could not be read.
Stamp = tuple[int, int, int, int] | None


def bearer(token: str) -> bytes:
    """The `authorization` metadata value that presents `token`."""
    return f"Bearer {token}".encode()


def parse_tokens(text: str, source: str) -> tuple[str, ...]:
    """The tokens of a token file's text in order, without duplicates; ValueError naming `source` and the
    line of a malformed token (never the token itself), or saying the file holds none; a WARNING naming the line
    of a token shorter than MIN_TOKEN_CHARS (`protos.wire.short_token_warning`)."""
    tokens: dict[str, None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not all(33 <= ord(char) < 127 for char in line):
            raise ValueError(f"{source} line {number}: expected one token of printable ASCII without spaces")
        too_long = long_token_problem(line, f"{source} line {number}")
        if too_long is not None:
            raise ValueError(too_long)
        short = short_token_warning(line, f"{source} line {number}")
        if short is not None and line not in tokens:
            log.warning("%s", short)
        tokens[line] = None
    if not tokens:
        raise ValueError(f"{source} holds no join token: expected one token per line (blank lines and # comments are ignored)")
    return tuple(tokens)


def read_tokens(path: Path) -> tuple[str, ...]:
    """The tokens in the file at `path`; ValueError naming the path when it cannot be read or holds none."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"--token-file {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--token-file {path}: not UTF-8 text") from None
    return parse_tokens(text, f"--token-file {path}")


def file_stamp(path: Path) -> Stamp:
    """What changes when the file at `path` is rewritten, replaced, or its mode or owner changed (ctime: a file made
    readable after a reload failed on its permissions is read again); None when it cannot be stat'ed."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns


class JoinTokens:
    """The accepted join tokens, each compared in constant time; from a file, re-read when it changes.

    Threads: `accepts` runs on gRPC's threads for every call that needs a token (through
    GuardInterceptor), `reload` on the main thread (SIGHUP). The accepted tokens are one immutable
    tuple, replaced whole by a successful reload, so `accepts` reads it without a lock. `_lock`
    guards the file's stamp and the time of the next check and makes reloads one at a time:
    `accepts` only tries to take it (never waits: while another thread reloads, the tokens
    accepted so far answer), `reload` waits for it.
    """

    def __init__(
        self, tokens: Sequence[str], path: Path | None = None, stamp: Stamp = None,
        check_every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Accept `tokens`; with `path`, the file they were read from when it had `stamp`, re-read when that changes."""
        if not tokens or not all(tokens):
            raise ValueError(f"a join token is required (--token, --token-file or ${TOKEN_ENV})")
        self.path = path
        self.check_every_s = check_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._expected = tuple(bearer(token) for token in tokens)
        self._stamp = stamp
        self._next_check = clock() + check_every_s

    @classmethod
    def from_file(
        cls, path: Path, check_every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> JoinTokens:
        """The tokens of the file at `path`, re-read when it changes; ValueError naming the path if it
        cannot be read or holds no token."""
        stamp = file_stamp(path)
        tokens = cls(read_tokens(path), path, stamp, check_every_s, clock)
        log.info("join tokens: %d accepted from %s", len(tokens), path)
        return tokens

    @classmethod
    def from_cli(cls, token: str | None, token_file: Path | None, env_token: str) -> JoinTokens:
        """`rcswarm coordinator`'s tokens: --token-file, or --token, or the environment's token.
        --token and --token-file exclude each other; with --token-file the environment is ignored."""
        if token and token_file is not None:
            raise ValueError("--token and --token-file exclude each other: give one")
        if token_file is not None:
            return cls.from_file(token_file)
        if token:
            return cls([one_token(token, "--token")])
        return cls([one_token(env_token, f"${TOKEN_ENV}")] if env_token else [])

    def __len__(self) -> int:
        """How many tokens are accepted now (any thread)."""
        return len(self._expected)

    def accepts(self, presented: bytes) -> bool:
        """Whether `presented` (the `authorization` metadata) is "Bearer <token>" for an accepted token;
        compares against every token in constant time (any thread; may reload the file first)."""
        self._maybe_reload()
        matched = False
        for expected in self._expected:
            matched |= hmac.compare_digest(presented, expected)
        return matched

    def accepts_token(self, token: str) -> bool:
        """Whether `token` itself (a dashboard's bearer header or login form) is accepted (any thread)."""
        return self.accepts(bearer(token))

    def reload(self) -> bool:
        """Re-read the token file now, whether or not it changed (takes `_lock`, waiting for it); whether
        the tokens were replaced. A fixed token set has nothing to reload."""
        if self.path is None:
            return False
        with self._lock:
            self._stamp = file_stamp(self.path)
            return self._load(self.path)

    def _maybe_reload(self) -> None:
        """At most once per `check_every_s`, reload the file if its stamp changed (tries `_lock`; skips the
        check when another thread holds it)."""
        path = self.path
        if path is None or self._clock() < self._next_check or not self._lock.acquire(blocking=False):
            return
        try:
            self._next_check = self._clock() + self.check_every_s
            stamp = file_stamp(path)
            if stamp != self._stamp:
                self._stamp = stamp
                self._load(path)
        finally:
            self._lock.release()

    def _load(self, path: Path) -> bool:
        """Replace the tokens with those of the file at `path`, or keep them and log a warning when it is bad
        (`_lock` held)."""
        try:
            tokens = read_tokens(path)
        except ValueError as exc:
            log.warning("join tokens not reloaded: %s; the %d tokens accepted before stay", exc, len(self._expected))
            return False
        self._expected = tuple(bearer(token) for token in tokens)
        log.info("join tokens reloaded: %d tokens from %s", len(tokens), path)
        return True
