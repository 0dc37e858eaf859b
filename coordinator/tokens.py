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

`ViewTokens` are the dashboard's read-only credential (`--view-token-file PATH` of `rcswarm coordinator` and
`rcswarm dht`): a file read, checked (the same lengths, the same WARNING for a short token) and re-read exactly as
the join tokens' (`AcceptedTokens` is both), but a class of its own, not a JoinTokens: the gRPC guard
(guards.py) takes JoinTokens alone, and the dashboard takes both (observe/dashboard/auth.py `token_check`). No
token may be in both: checked at start (`view_tokens_problem`), and a later reload of either file that would put
one in both is refused as a bad file is (`AcceptedTokens.keep_apart`: the two then share one lock).
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from rcswarm.protos.wire import TOKEN_ENV, long_token_problem, one_token, short_token_warning

log = logging.getLogger("rcswarm.coordinator")

JOIN_TOKEN = "join token"
# The longest a changed token file goes unnoticed while calls that need a token arrive.
CHECK_EVERY_S = 1.0
# (mtime in ns, size, inode) of the token file, or None when it could not be read.
Stamp = tuple[int, int, int, int] | None


def bearer(token: str) -> bytes:
    """The `authorization` metadata value that presents `token`."""
    return f"Bearer {token}".encode()


def _said_of(message: str, kind: str) -> str:
    """A protos.wire message about "the join token of ..." said of a `kind` of token (a view token's file)."""
    return message if kind == JOIN_TOKEN else message.replace(f"the {JOIN_TOKEN} of", f"the {kind} of", 1)


def parse_tokens(text: str, source: str, kind: str = JOIN_TOKEN) -> tuple[str, ...]:
    """The tokens of a token file's text in order, without duplicates; ValueError naming `source` and the
    line of a malformed token (never the token itself), or saying the file holds none; a WARNING naming the line
    of a token shorter than MIN_TOKEN_CHARS (`protos.wire.short_token_warning`). `kind` names the tokens in the
    messages: "join token" (--token-file), "view token" (--view-token-file)."""
    tokens: dict[str, None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not all(33 <= ord(char) < 127 for char in line):
            raise ValueError(f"{source} line {number}: expected one token of printable ASCII without spaces")
        too_long = long_token_problem(line, f"{source} line {number}")
        if too_long is not None:
            raise ValueError(_said_of(too_long, kind))
        short = short_token_warning(line, f"{source} line {number}")
        if short is not None and line not in tokens:
            log.warning("%s", _said_of(short, kind))
        tokens[line] = None
    if not tokens:
        raise ValueError(f"{source} holds no {kind}: expected one token per line (blank lines and # comments are "
                         "ignored)")
    return tuple(tokens)


def read_tokens(path: Path, flag: str = "--token-file", kind: str = JOIN_TOKEN) -> tuple[str, ...]:
    """The tokens in the file at `path` (given as `flag`); ValueError naming the flag and the path when it cannot be
    read or holds none."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path}: not UTF-8 text") from None
    return parse_tokens(text, f"{flag} {path}", kind)


def file_stamp(path: Path) -> Stamp:
    """What changes when the file at `path` is rewritten, replaced, or its mode or owner changed (ctime: a file made
    readable after a reload failed on its permissions is read again); None when it cannot be stat'ed."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns


class AcceptedTokens:
    """Accepted tokens of one kind (`KIND`, read from `FLAG`'s file), each compared in constant time; from a file,
    re-read when it changes. `JoinTokens` and `ViewTokens` are the two kinds; neither is the other.

    Threads: `accepts` runs on gRPC's threads for every call that needs a token (through
    GuardInterceptor; join tokens only) and on the dashboard's request threads, `reload` on the main thread
    (SIGHUP). The accepted tokens are one immutable
    tuple, replaced whole by a successful reload, so `accepts` reads it without a lock. `_lock`
    guards the file's stamp and the time of the next check and makes reloads one at a time:
    `accepts` only tries to take it (never waits: while another thread reloads, the tokens
    accepted so far answer), `reload` waits for it.
    """

    KIND = JOIN_TOKEN
    FLAG = "--token-file"

    def __init__(
        self, tokens: Sequence[str], path: Path | None = None, stamp: Stamp = None,
        check_every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Accept `tokens`; with `path`, the file they were read from when it had `stamp`, re-read when that changes."""
        if not tokens or not all(tokens):
            raise ValueError(self._none_given())
        self.path = path
        self.check_every_s = check_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._expected = tuple(bearer(token) for token in tokens)
        self._stamp = stamp
        self._next_check = clock() + check_every_s
        # The other kind of tokens that must share none with these (`keep_apart`), or None; whether a reload of
        # this file runs now (`_lock` held), so that the other's reload does not start this one again.
        self._apart: AcceptedTokens | None = None
        self._loading = False
        # Whether this file's last reload was refused only for tokens the other kind holds (`_lock` held): a reload
        # of the other's file that lets them go reads this one again (`_retry_other`), as its stamp no longer changes.
        self._refused_for_other = False

    @classmethod
    def _none_given(cls) -> str:
        return f"a {cls.KIND} is required ({cls.FLAG})"

    @classmethod
    def from_file(
        cls, path: Path, check_every_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> Self:
        """The tokens of the file at `path`, re-read when it changes; ValueError naming the flag and the path if it
        cannot be read or holds no token."""
        stamp = file_stamp(path)
        tokens = cls(read_tokens(path, cls.FLAG, cls.KIND), path, stamp, check_every_s, clock)
        log.info("%ss: %d accepted from %s", cls.KIND, len(tokens), path)
        return tokens

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

    def keep_apart(self, other: AcceptedTokens) -> None:
        """From now on a reload of either of the two that would put a token in both is refused as a bad file is
        (the tokens accepted before stay, a WARNING names the file and the problem): the view tokens beside the join
        tokens. Call it before either is used by another thread: the two then take one lock, so that a reload of
        each checks the other's tokens as they are, and two reloads cannot each let in the same token."""
        if self is other:
            raise ValueError("a set of tokens cannot be kept apart from itself")
        other._lock = self._lock
        self._apart, other._apart = other, self

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
            self._catch_up()
        finally:
            self._lock.release()

    def _catch_up(self) -> None:
        """Reload the file if its stamp changed since it was last looked at (`_lock` held)."""
        if self.path is None:
            return
        stamp = file_stamp(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            self._load(self.path)

    def _load(self, path: Path) -> bool:
        """Replace the tokens with those of the file at `path`, or keep them and log a warning when it is bad
        (`_lock` held)."""
        self._loading = True
        self._refused_for_other = False
        try:
            tokens = read_tokens(path, self.FLAG, self.KIND)
            expected = tuple(bearer(token) for token in tokens)
            problem = self._apart_problem(expected, path)
            if problem is not None:
                self._refused_for_other = True
                raise ValueError(problem)
        except ValueError as exc:
            log.warning("%ss not reloaded: %s; the %d tokens accepted before stay", self.KIND, exc, len(self._expected))
            return False
        finally:
            self._loading = False
        self._expected = expected
        log.info("%ss reloaded: %d tokens from %s", self.KIND, len(tokens), path)
        self._retry_other()
        return True

    def _retry_other(self) -> None:
        """Read the other kind's file again when its last reload was refused for tokens these held (`_lock` held):
        an operator who moves a token between the two files one edit at a time gets the second file's reload refused
        while the first still holds the token, and that file's stamp does not change again when the first is fixed."""
        other = self._apart
        if other is not None and other._refused_for_other and other.path is not None:
            other._load(other.path)

    def _apart_problem(self, expected: tuple[bytes, ...], path: Path) -> str | None:
        """Why `expected`, read from `path`, may not replace these tokens: some are also the tokens kept apart from
        these (`keep_apart`); None when none is (`_lock` held, which is the other's too). The other file is taken in
        first when it changed too and was not looked at yet, so that a token moved from one file to the other in
        one go is not refused for the order the two are looked at in."""
        other = self._apart
        if other is None:
            return None
        if not other._loading:
            other._catch_up()
        shared = _shared(expected, other._expected)
        if not shared:
            return None
        return apart_problem(f"{self.FLAG} {path}", shared, self.KIND, other)


class JoinTokens(AcceptedTokens):
    """The accepted join tokens: what Join and GetStatus take (guards.py), and the dashboard too."""

    @classmethod
    def _none_given(cls) -> str:
        return f"a join token is required (--token, --token-file or ${TOKEN_ENV})"

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


class ViewTokens(AcceptedTokens):
    """The dashboard's read-only tokens (`--view-token-file`): they open the dashboard and /metrics, never gRPC
    (the gRPC guard takes JoinTokens, which these are not)."""

    KIND = "view token"
    FLAG = "--view-token-file"


def _shared(tokens: tuple[bytes, ...], others: tuple[bytes, ...]) -> int:
    """How many of `tokens` are among `others`, each pair compared in constant time."""
    count = 0
    for token in tokens:
        matched = False
        for other in others:
            matched |= hmac.compare_digest(token, other)
        count += matched
    return count


def apart_problem(where: str, shared: int, kind: str, other: AcceptedTokens) -> str:
    """The problem of `shared` tokens of `kind`, read from `where`, that `other` (the other kind) accepts too."""
    plural = shared != 1
    if kind == ViewTokens.KIND:
        return (f"{where}: {shared} of its tokens {'are' if plural else 'is'} also accepted as join tokens: a view "
                "token must be one that cannot join the swarm; give the viewers tokens of their own")
    source = f"{other.FLAG} {other.path}" if other.path is not None else other.FLAG
    also = "are also view tokens" if plural else "is also a view token"
    return (f"{where}: {shared} of its tokens {also} ({source}): a view token must be one that cannot join the "
            "swarm; remove it from one of the files")


def view_tokens_problem(view: ViewTokens, join: AcceptedTokens) -> str | None:
    """Why `view` may not serve as read-only tokens beside `join`, or None: a token in both files would be a "view"
    credential that can join the swarm (checked at start; a reload of either file that would put a token in both is
    refused once they are kept apart: `AcceptedTokens.keep_apart`)."""
    shared = _shared(view._expected, join._expected)
    if not shared:
        return None
    where = f"{view.FLAG} {view.path}" if view.path is not None else view.FLAG
    return apart_problem(where, shared, view.KIND, join)
