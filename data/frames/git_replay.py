"""Replay a git history's first-parent line as editor actions, checking every commit.

Git access uses the git command line: `git rev-parse` pins the commit HEAD names, then one
`git log --first-parent --reverse -z --raw -M --diff-merges=first-parent` gives every commit's changes
(falling back, on a git without `--diff-merges`, to the commit list and `git diff-tree -r -z -M` per commit),
and one long-lived `git cat-file --batch` the blobs (`git rev-list --count` sizes a progress bar). The log is
streamed: read from its pipe `STREAM_CHUNK` bytes at a time and parsed record by record as it arrives
(`parse_log`), so one commit's changes are held at a time and memory does not grow with the history; subjects
are asked for only when they are typed. `--reverse` applies after `-n` in git, so the first `max_commits` of the
line are taken by stopping the stream (git killed) after that many. A git that fails or is killed is a
RuntimeError naming the repository; every wait on a git process is bounded (`GIT_IDLE_SECONDS`,
`GIT_EXIT_SECONDS`). Git runs through
subprocess rather than dulwich: git is already required to have a repository,
needs no extra dependency, its rename detection (-M) is the reference one, and
`cat-file --batch` streams blobs from one process at a rate dulwich's pure-Python
pack reader does not reach.

Per commit (against its first parent; the root commit against the empty tree),
for each changed path: a file is text when its blob has no NUL byte, decodes as
strict UTF-8, is at most `max_file_bytes` and has no character in the
tokenizer's reserved range U+F0000..U+F00FF; other files (binary, oversized,
symlinks, submodules) are skipped and counted. A blob's size comes from `cat-file`'s
header: an oversized one is read and dropped in chunks, never held whole. A path that
cannot be typed (its name is not UTF-8, holds a character of the reserved range,
which would read back as a control, or is longer than MAX_PATH_CHARS) is skipped
and counted as well (`skipped_name`). A path that stops being text is deleted from
the editor. Typing the commit subject is optional (`commit_messages`; at most
MAX_SUBJECT_CHARS characters of it). Actions (see `git_editor`): deletions (select
in the tree, DELETE_FILE), renames (select, RENAME, type the new path, ENTER), new
files (TREE, NEW_FILE, type the path, ENTER), then edits: open the file through
the tree, a line diff (difflib after the common prefix and suffix of lines, top to
bottom; its work is bounded by `LINE_DIFF_PAIRS`), inside replaced line pairs a
character diff of the line contents (newline handled separately), cursor moves
(UP/DOWN for near lines, GOTO + digits for far ones, HOME/END/LEFT/RIGHT in the
line), typing, DELETE and KILL_LINE, then SAVE.

Safety invariant: after a commit's actions, every touched path's saved editor
file equals the git blob exactly (or is absent); otherwise `ReplayError`
names the commit and path.
"""

from __future__ import annotations

import difflib
import os
import selectors
import subprocess
import tempfile
from collections import Counter
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field

from rcswarm.data.frames.git_editor import C, Editor, ReplayError

RESERVED_LOW, RESERVED_HIGH = 0xF0000, 0xF00FF
# At most this many pairs of equal lines (the sum over distinct lines of its count in the old text times its
# count in the new one) feed difflib's line diff; past it the most repeated lines are junk (see `line_opcodes`).
LINE_DIFF_PAIRS = 1_000_000
BLOB_CHUNK = 1 << 20
# `git log` is read from its pipe this many bytes at a time (a bounded buffer; records are parsed as they arrive).
STREAM_CHUNK = 1 << 16
# A field of `git log`'s output (a SHA with its parents and subject, a path) is kept to this many bytes; git allows
# any length and an untrusted repository's commit message or tree entry may be megabytes. Past it the rest of the
# field is read and dropped (`_fields`): a subject is typed cut anyway, a path that long is not typed.
MAX_FIELD_BYTES = 1 << 16
# The longest path typed (Linux's PATH_MAX, in characters); a longer one is skipped and counted like a name that
# is not UTF-8 (`typeable`).
MAX_PATH_CHARS = 4096
# The most characters of a commit subject typed (`commit_messages`): git's advice is 50 to 72; a history's longest
# real subjects are a few hundred. Past it the subject is cut, so that one commit cannot type megabytes of frames.
MAX_SUBJECT_CHARS = 500
# A streamed git that prints nothing for this long is killed (an error naming the repository): far above what one
# commit's diff or the walk before `--reverse`'s first record takes on a history of millions of commits.
GIT_IDLE_SECONDS = 1800.0
# A git that has closed its output (or was killed) is waited for at most this long.
GIT_EXIT_SECONDS = 30.0
# The last bytes of a failed git's stderr that its error quotes.
STDERR_TAIL = 4096
# Settings every git command here runs with, so that user or repository configuration cannot change what is
# parsed: log.showSignature would print gpg's output among `git log`'s records (a signed commit's "gpg: ..." lines
# read as a commit), log.showRoot and diff.relative would change the raw diffs, color.ui would add escapes; the diffs
# name `-O/dev/null`, so that a diff.orderFile (the user's or the repository's) cannot reorder a commit's changes.
GIT_CONFIG = ("-c", "log.showRoot=true", "-c", "log.showSignature=false", "-c", "diff.relative=false",
              "-c", "color.ui=false", "-c", "protocol.allow=never", "-c", "core.fsmonitor=false")
# A repository is untrusted: its own config must not run commands. Reading an object a partial clone lacks makes git
# fetch it from the promisor remote the repository names, through a transport the repository configures
# (`core.sshCommand`, `remote.*.uploadpack`: any command): `protocol.allow=never` refuses every transport, and
# GIT_NO_LAZY_FETCH (git >= 2.44) turns the lazy fetch off where git knows it; a missing object is then an error.
# The environment variables that point git at another repository or object store (set inside a git hook, or by a
# caller's own git work) are dropped, so that `-C PATH` is the repository read.
GIT_ENV_DROPPED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
                   "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_REPLACE_REF_BASE", "GIT_GRAFT_FILE",
                   "GIT_SHALLOW_FILE", "GIT_PREFIX", "GIT_NO_REPLACE_OBJECTS", "GIT_QUARANTINE_PATH")


def git_argv(repo: str, *args: str) -> list[str]:
    """The command line of `git args` on `repo`, with the settings every git command here runs with (`GIT_CONFIG`)."""
    return ["git", "-C", str(repo), *GIT_CONFIG, *args]


def git_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every git command here runs in: `environ` (this process's by default) without the variables
    that name another repository (`GIT_ENV_DROPPED`), with lazy fetches and terminal prompts off."""
    base = dict(os.environ if environ is None else environ)
    env = {key: value for key, value in base.items() if key not in GIT_ENV_DROPPED}
    env.update(GIT_NO_LAZY_FETCH="1", GIT_TERMINAL_PROMPT="0")
    return env


@dataclass
class ReplayStats:
    commits: int = 0
    files: int = 0
    skipped_binary: int = 0
    skipped_oversized: int = 0
    skipped_other: int = 0
    skipped_name: int = 0
    actions: int = 0
    last_commit: str = ""  # the SHA of the last commit replayed (the dataset's `head`: HEAD, or the --max-commits'th)


@dataclass
class Change:
    status: str
    old_path: str | None
    new_path: str | None
    old_sha: str | None
    new_sha: str | None
    new_mode: str = ""
    old_mode: str = ""


@dataclass
class Commit:
    """One commit of a first-parent line as `git log` printed it: its SHA, its first parent (None for the root),
    its subject ("" unless asked for) and its changes against the first parent ([] unless asked for)."""

    sha: str
    parent: str | None
    subject: str = ""
    changes: list[Change] = field(default_factory=list)


def _fields(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The NUL-terminated fields of a byte stream given in chunks, as they arrive: only the field being read is
    buffered (a field git printed: a SHA and subject, a raw diff's status, a path), and of it only its first
    MAX_FIELD_BYTES (the rest is dropped as it arrives). RuntimeError where the stream ends inside a field (anything
    but newlines after the last NUL)."""
    field_ = bytearray()  # the start of a field that began in an earlier chunk
    for chunk in chunks:
        start = 0
        while (end := chunk.find(0, start)) >= 0:
            if field_:
                field_ += chunk[start:min(end, start + MAX_FIELD_BYTES - len(field_))]
                yield bytes(field_)
                field_.clear()
            else:
                yield chunk[start:min(end, start + MAX_FIELD_BYTES)]
            start = end + 1
        field_ += chunk[start:start + max(0, MAX_FIELD_BYTES - len(field_))]
    if field_.strip(b"\n"):
        raise RuntimeError(f"git log: output ended inside a record ({bytes(field_[:60])!r})")


def parse_log(chunks: Iterable[bytes]) -> Generator[Commit, None, None]:
    """Parse, record by record as the bytes arrive, the output of `git log -z --format=%x1e%H %P[%x1f%s]
    [--raw --no-abbrev]`: one `Commit` per record, yielded once the next record starts (or the output ends), so that
    at most one commit's changes are held. Raw diff entries (`:modes shas status`, then one path, or two for a
    rename or copy) become its `changes`; a path is taken by position, so any name (a newline, a leading ':')
    parses. RuntimeError for a field that is neither."""
    fields = _fields(chunks)
    current: Commit | None = None
    for raw in fields:
        field_ = raw.lstrip(b"\n")
        if not field_:
            continue
        if field_[0] == 0x1E:
            if current is not None:
                yield current
            head, _, subject = field_[1:].partition(b"\x1f")
            parts = head.decode("ascii", "replace").split()
            if not parts:
                raise RuntimeError(f"git log: a record without a commit ({raw[:60]!r})")
            current = Commit(parts[0], parts[1] if len(parts) > 1 else None, subject.decode("utf-8", "replace"))
        elif field_[0] == 0x3A and current is not None:  # ":" starts a raw entry
            meta = field_[1:].decode("ascii", "replace").split()
            if len(meta) != 5:
                raise RuntimeError(f"git log: commit {current.sha}: unexpected raw entry {raw[:120]!r}")
            old_mode, new_mode, old_sha, new_sha, status = meta
            paths = [next(fields, None) for _ in range(2 if status[0] in "RC" else 1)]
            if None in paths:
                raise RuntimeError(f"git log: commit {current.sha}: output ended inside the entry {raw[:120]!r}")
            a = _path(paths[0])
            b = _path(paths[-1])
            null = "0" * len(old_sha)
            current.changes.append(Change(
                status[0], a if status[0] != "A" else None, b if status[0] != "D" else None,
                None if old_sha == null else old_sha, None if new_sha == null else new_sha, new_mode, old_mode,
            ))
        else:
            raise RuntimeError(f"git log: unexpected record {raw[:60]!r}")
    if current is not None:
        yield current


class Git:
    """The git command line on one repository.

    A history is read as a stream (`log`, `history`, `first_parent_commits`): `git log`'s output is parsed as it
    arrives from a pipe, `STREAM_CHUNK` bytes at a time, and one commit is held at a time, so memory does not grow
    with the number of commits. A git that fails, or is killed, is a RuntimeError naming the repository; a stream
    closed early (a `max_count` reached, an exception in the consumer) closes its pipe and kills its git.
    """

    def __init__(self, repo: str) -> None:
        self.repo = str(repo)
        self._cat: subprocess.Popen[bytes] | None = None
        self._diff_merges: bool | None = None

    def run(self, *args: str) -> bytes:
        """The whole output of a short `git args` (a SHA, a count); RuntimeError naming the repository if it fails."""
        proc = subprocess.run(git_argv(self.repo, *args), capture_output=True, check=False, env=git_env())
        if proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} in {self.repo} failed: "
                               f"{proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout

    def stream(self, *args: str, idle_seconds: float | None = None) -> Generator[bytes, None, None]:
        """The output of `git args`, in pieces of at most `STREAM_CHUNK` bytes as git writes them (a generator).

        git's stderr goes to a temporary file (never a pipe that could fill); its last `STDERR_TAIL` bytes name
        the failure. Every wait is bounded: a read that sees nothing for `idle_seconds` (`GIT_IDLE_SECONDS`), or a
        git that has not exited `GIT_EXIT_SECONDS` after closing its output, is killed. A git that exits non-zero or
        is killed is a RuntimeError naming the command and the repository. Closed early (`close()`, garbage
        collection, an exception thrown in), the pipe is closed and git killed.
        """
        idle = GIT_IDLE_SECONDS if idle_seconds is None else idle_seconds
        argv = git_argv(self.repo, *args)
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                    env=git_env())
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            why = ""
            try:
                with selectors.DefaultSelector() as selector:
                    selector.register(fd, selectors.EVENT_READ)
                    while True:
                        if not selector.select(idle):
                            why = f"printed nothing for {idle:g} s"
                            break
                        data = os.read(fd, STREAM_CHUNK)
                        if not data:
                            break
                        yield data
            except BaseException:
                _stop(proc)
                raise
            if why:
                _stop(proc)
            else:
                proc.stdout.close()
                try:
                    proc.wait(timeout=GIT_EXIT_SECONDS)
                except subprocess.TimeoutExpired:
                    why = f"did not exit {GIT_EXIT_SECONDS:g} s after its output ended"
                    _stop(proc)
            if why or proc.returncode != 0:
                stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - STDERR_TAIL))
                said = stderr.read().decode(errors="replace").strip()
                if not why:
                    why = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
                           else f"exited with status {proc.returncode}")
                raise RuntimeError(f"git {args[0]} in {self.repo} {why}" + (f": {said}" if said else ""))

    def history_problem(self) -> str | None:
        """Why this repository has no history to replay (not a git repository, or a HEAD that names no commit), or
        None: asked before a build writes anything."""
        def git(*args: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(git_argv(self.repo, *args), capture_output=True, check=False, env=git_env())

        if git("rev-parse", "--verify", "--quiet", "HEAD^{commit}").returncode == 0:
            return None
        inside = git("rev-parse", "--git-dir")
        if inside.returncode != 0:
            said = inside.stderr.decode(errors="replace").strip().splitlines()
            return f"not a git repository ({said[0] if said else f'git exited with {inside.returncode}'})"
        return "its HEAD names no commit (an empty repository, or a branch with no commits yet): nothing to replay"

    def resolve(self, rev: str = "HEAD") -> str:
        """The SHA of the commit `rev` names: a replay reads one fixed commit's history, even if HEAD moves."""
        return self.run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()

    def count(self, rev: str = "HEAD", max_count: int | None = None) -> int:
        """How many commits `rev`'s first-parent line holds (at most `max_count`): the commits a replay reads."""
        args = ["rev-list", "--first-parent", "--count"] + ([f"--max-count={max_count}"] if max_count else [])
        return int(self.run(*args, rev, "--").decode().strip())

    def _log(self, rev: str, max_count: int | None, subjects: bool, raw: bool) -> Generator[Commit, None, None]:
        """The first `max_count` commits of `rev`'s first-parent line, oldest first, read as they arrive.

        `git log --reverse` lists a line from its root, but applies `-n` before reversing (it would give the
        newest commits), so the limit is applied here: the stream stops (git killed) after `max_count` commits.
        """
        fmt = "--format=%x1e%H %P" + ("%x1f%s" if subjects else "")
        args = ["log", "--first-parent", "--reverse", "-z", "--no-color", fmt]
        if raw:
            args += ["--raw", "-M", "-O/dev/null", "--no-abbrev", "--diff-merges=first-parent"]
        chunks = self.stream(*args, rev, "--")
        records = parse_log(chunks)
        try:
            for index, commit in enumerate(records):
                yield commit
                if max_count is not None and index + 1 >= max_count:
                    return
        finally:
            records.close()
            chunks.close()

    def first_parent_commits(self, rev: str = "HEAD", max_count: int | None = None,
                             subjects: bool = False) -> Iterator[tuple[str, str | None, str]]:
        """(commit, first parent or None, subject: "" unless `subjects`), oldest first, as `git log` prints them
        (a generator: one commit held at a time; close it to stop git early)."""
        for commit in self._log(rev, max_count, subjects, raw=False):
            yield commit.sha, commit.parent, commit.subject

    def roots(self, rev: str = "HEAD") -> list[str]:
        """The root commits of `rev`'s whole ancestry, every parent followed (`git rev-list --max-parents=0`): the
        commits without a parent, a shallow clone's boundary among them; a history has few."""
        return self.run("rev-list", "--max-parents=0", rev, "--").decode().split()

    def ancestry(self, rev: str = "HEAD") -> Generator[str, None, None]:
        """Every commit `rev` reaches through any parent, merged histories included (`git rev-list`), newest first:
        read as git prints it, one chunk held at a time (a generator: close it to stop git early)."""
        chunks = self.stream("rev-list", rev, "--")
        tail = b""
        try:
            for chunk in chunks:
                lines = (tail + chunk).split(b"\n")
                tail = lines.pop()
                for line in lines:
                    yield line.decode()
        finally:
            chunks.close()
        if tail:
            yield tail.decode()

    def history(self, rev: str = "HEAD", max_count: int | None = None) -> Iterator[tuple[str, list[Change]]]:
        """(commit, changes against its first parent), oldest first, from one `git log --raw` process, parsed as
        it arrives (a generator: one commit's changes held at a time).

        The same changes as `changes(commit, parent)` per commit (`-M`, first-parent diffs of
        merges, the root commit against the empty tree) without a process per commit.
        """
        for commit in self._log(rev, max_count, False, raw=True):
            yield commit.sha, commit.changes

    def diff_merges(self, rev: str = "HEAD") -> bool:
        """Whether this git has `--diff-merges=first-parent` (git >= 2.31), which `history` needs; asked once."""
        if self._diff_merges is None:
            probe = subprocess.run(git_argv(self.repo, "log", "-n", "0", "--diff-merges=first-parent", rev, "--"),
                                   capture_output=True, check=False, env=git_env(), timeout=GIT_EXIT_SECONDS)
            self._diff_merges = probe.returncode == 0
        return self._diff_merges

    def commits(self, rev: str = "HEAD", max_count: int | None = None, subjects: bool = False) -> Iterator[Commit]:
        """The first `max_count` commits of `rev`'s first-parent line, oldest first, each with its changes (and its
        subject when `subjects`): from `history`'s one `git log --raw`, or, with a git without `--diff-merges`,
        the commit list and one `diff-tree` per commit. A generator: one commit held at a time."""
        if self.diff_merges(rev):
            yield from self._log(rev, max_count, subjects, raw=True)
            return
        for sha, parent, subject in self.first_parent_commits(rev, max_count, subjects):
            yield Commit(sha, parent, subject, self.changes(sha, parent))

    def changes(self, commit: str, parent: str | None) -> list[Change]:
        args = ["diff-tree", "-r", "-z", "-M", "-O/dev/null", "--no-commit-id"]
        args += ["--root", commit] if parent is None else [parent, commit]
        fields = self.run(*args).split(b"\0")
        out, i = [], 0
        while i < len(fields) and fields[i]:
            meta = fields[i].decode().lstrip(":").split()
            old_mode, new_mode, old_sha, new_sha, status = meta
            null = "0" * len(old_sha)
            if status[0] in "RC":
                a, b = _path(fields[i + 1]), _path(fields[i + 2])
                i += 3
            else:
                a = b = _path(fields[i + 1])
                i += 2
            out.append(Change(
                status[0], a if status[0] != "A" else None, b if status[0] != "D" else None,
                None if old_sha == null else old_sha, None if new_sha == null else new_sha, new_mode, old_mode,
            ))
        return out

    def blob(self, sha: str, max_bytes: int | None = None) -> bytes | None:
        """The blob's bytes; None for one larger than `max_bytes` (its size read from `cat-file`'s header),
        whose bytes are then read and dropped in chunks of `BLOB_CHUNK`, never held whole. A `cat-file` that
        ended (killed) is a RuntimeError naming the repository."""
        if self._cat is None:
            self._cat = subprocess.Popen(
                git_argv(self.repo, "cat-file", "--batch"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=git_env(),
            )
        assert self._cat.stdin and self._cat.stdout
        try:
            self._cat.stdin.write(sha.encode() + b"\n")
            self._cat.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise RuntimeError(f"git cat-file --batch in {self.repo} ended before object {sha} was read") from None
        out = self._cat.stdout
        line = out.readline()
        if not line:
            raise RuntimeError(f"git cat-file --batch in {self.repo} ended before object {sha} was read")
        header = line.split()
        if len(header) < 3:
            raise RuntimeError(f"git cat-file: object {sha} not found in {self.repo}")
        size = int(header[2])
        if max_bytes is not None and size > max_bytes:
            left = size + 1  # the content and its newline
            while left:
                chunk = out.read(min(left, BLOB_CHUNK))
                if not chunk:
                    raise RuntimeError(f"git cat-file: object {sha} ended after {size + 1 - left} of {size} bytes")
                left -= len(chunk)
            return None
        data = out.read(size)
        if len(data) != size or out.read(1) != b"\n":
            raise RuntimeError(f"git cat-file: object {sha} ended before its {size} bytes")
        return data

    def close(self) -> None:
        """End the `cat-file` process: its input closed, waited for at most `GIT_EXIT_SECONDS`, then killed."""
        if self._cat is not None:
            cat, self._cat = self._cat, None
            try:
                cat.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            try:
                cat.wait(timeout=GIT_EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                _stop(cat)
            cat.stdout.close()  # type: ignore[union-attr]


def _stop(proc: subprocess.Popen) -> None:
    """Close `proc`'s output pipe, kill it and wait for it (at most `GIT_EXIT_SECONDS`: a process that outlives
    SIGKILL, stuck in the kernel, is left, never waited for without end)."""
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=GIT_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pass


def _path(raw: bytes) -> str:
    """A path git printed: UTF-8, with bytes that are not kept as lone surrogates (`typeable` refuses them)."""
    return raw.decode("utf-8", "surrogateescape")


def typeable(path: str) -> bool:
    """Whether `path` can be typed as actions and read back: at most MAX_PATH_CHARS characters (a longer one, or one
    `_fields` cut, would take that many frames to type), no lone surrogate (a name that is not UTF-8) and no
    character of the tokenizer's reserved range (which it would read back as a control)."""
    if len(path) > MAX_PATH_CHARS:
        return False
    return not any(0xD800 <= ord(ch) <= 0xDFFF or RESERVED_LOW <= ord(ch) <= RESERVED_HIGH
                   for ch in path if ord(ch) >= 0xD800)


def typed_subject(subject: str) -> str:
    """What of a commit subject is typed: its first MAX_SUBJECT_CHARS characters, less those of the tokenizer's
    reserved range."""
    return "".join(ch for ch in subject[:MAX_SUBJECT_CHARS] if not RESERVED_LOW <= ord(ch) <= RESERVED_HIGH)


def classify(data: bytes, max_file_bytes: int) -> tuple[str | None, str]:
    """(text, "") for a text blob, else (None, reason) with reason "binary" or "oversized"."""
    if len(data) > max_file_bytes:
        return None, "oversized"
    if b"\0" in data:
        return None, "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "binary"
    if any(RESERVED_LOW <= ord(ch) <= RESERVED_HIGH for ch in text if ord(ch) >= RESERVED_LOW):
        return None, "binary"
    return text, ""


def _keepends(text: str) -> list[str]:
    if not text:
        return []
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _junk(a: list[str], b: list[str]):
    """difflib's `isjunk` for a line diff of `a` into `b`: None while the pairs of equal lines are at most
    `LINE_DIFF_PAIRS`, else membership in the most repeated lines, taken until the rest are."""
    ca, cb = Counter(a), Counter(b)
    pairs = sorted(((ca[x] * cb[x], x) for x in ca if x in cb), key=lambda p: p[0], reverse=True)
    total = sum(n for n, _ in pairs)
    junk = set()
    for n, x in pairs:
        if total <= LINE_DIFF_PAIRS:
            break
        junk.add(x)
        total -= n
    return junk.__contains__ if junk else None


def line_opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib opcodes that turn lines `a` into `b`, in time bounded by `LINE_DIFF_PAIRS`.

    The common prefix and suffix are equal blocks; the middle goes to difflib.SequenceMatcher, which loops
    over every pair of equal lines (quadratic for a file of repeated lines), so past `LINE_DIFF_PAIRS` pairs
    the most repeated lines are junk: they extend a match but never start one. The opcodes stay exact.
    """
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    am, bm = a[p : len(a) - s], b[p : len(b) - s]
    ops = [("equal", 0, p, 0, p)] if p else []
    if am or bm:
        matcher = difflib.SequenceMatcher(_junk(am, bm), am, bm, autojunk=False)
        ops += [(tag, i1 + p, i2 + p, j1 + p, j2 + p) for tag, i1, i2, j1, j2 in matcher.get_opcodes()]
    if s:
        ops.append(("equal", len(a) - s, len(a), len(b) - s, len(b)))
    return ops


class Planner:
    """Emits actions into an Editor, recording each (frame before, action) via `sink`."""

    def __init__(self, editor: Editor, sink) -> None:
        self.ed = editor
        self.sink = sink
        self.count = 0
        # a sink with `write_rows` (FrameWriter, the dataset's shard sink) gets the
        # screen rows and the damage; any other callable gets whole-frame arrays
        self._rows = getattr(sink, "write_rows", None)

    def do(self, code: int) -> None:
        ed = self.ed
        if self._rows is not None:
            damage, scroll = ed.render_damage()
            self._rows(ed.row_cp, ed.row_st, damage, code, scroll)
        else:
            cp, st = ed.render()
            self.sink(cp, st, code)
        ed.apply(code)
        self.count += 1

    def type(self, text: str) -> None:
        for ch in text:
            self.do(ord(ch))

    def select(self, path: str) -> None:
        ed = self.ed
        if ed.mode != "TREE":
            if ed.mode == "PROMPT":
                self.do(C["ESC"])
            if ed.mode != "TREE":
                self.do(C["TREE"])
        target = ed.paths.index(path)
        page = ed.rows - 1
        while abs(target - ed.sel) >= page:
            self.do(C["PGDN"] if target > ed.sel else C["PGUP"])
        while ed.sel != target:
            self.do(C["DOWN"] if target > ed.sel else C["UP"])

    def open(self, path: str) -> None:
        if self.ed.current == path and self.ed.mode == "EDIT":
            return
        self.select(path)
        self.do(C["ENTER"])

    def new_file(self, path: str) -> None:
        ed = self.ed
        if ed.mode != "TREE":
            self.do(C["TREE"])
        self.do(C["NEW_FILE"])
        self.type(path)
        self.do(C["ENTER"])

    def rename(self, old: str, new: str) -> None:
        self.select(old)
        self.do(C["RENAME"])
        self.type(new)
        self.do(C["ENTER"])

    def delete(self, path: str) -> None:
        self.select(path)
        self.do(C["DELETE_FILE"])

    def goto(self, r: int, c: int) -> None:
        """Move the cursor to line r, column c (both 0-based, in the current buffer)."""
        ed = self.ed
        dr = r - ed.r
        if abs(dr) > 8:
            self.do(C["GOTO"])
            self.type(str(r + 1))
            self.do(C["ENTER"])
        else:
            for _ in range(abs(dr)):
                self.do(C["DOWN"] if dr > 0 else C["UP"])
        n = len(ed.lines[ed.r])
        options = [(abs(c - ed.c), None), (c + 1, "HOME"), (n - c + 1, "END")]
        _, first = min(options, key=lambda o: o[0])
        if first:
            self.do(C[first])
        step = C["RIGHT"] if c > ed.c else C["LEFT"]
        for _ in range(abs(c - ed.c)):
            self.do(step)

    def edit(self, old: str, new: str) -> None:
        """Turn the open buffer's text `old` into `new`."""
        a, b = _keepends(old), _keepends(new)
        for tag, i1, i2, j1, j2 in line_opcodes(a, b):
            if tag == "equal":
                continue
            if tag == "delete":
                self.goto(j1, 0)
                for _ in range(i2 - i1):
                    self.do(C["KILL_LINE"])
            elif tag == "insert":
                self.goto(j1, 0)
                self.type("".join(b[j1:j2]))
            else:
                self._replace(a[i1:i2], b[j1:j2], j1)

    def _replace(self, olds: list[str], news: list[str], j1: int) -> None:
        m = min(len(olds), len(news))
        for k in range(m):
            ol, nl = olds[k], news[k]
            oc, nc = ol.removesuffix("\n"), nl.removesuffix("\n")
            row = j1 + k
            if oc != nc:
                self._line_edit(row, oc, nc)
            if ol.endswith("\n") and not nl.endswith("\n"):
                # nl is the new file's last line: drop everything after it
                self.goto(row, len(nc))
                ed = self.ed
                while ed.r + 1 < len(ed.lines) or ed.c < len(ed.lines[ed.r]):
                    self.do(C["KILL_LINE"])
                return
            if nl.endswith("\n") and not ol.endswith("\n"):
                self.goto(row, len(nc))
                self.do(ord("\n"))
        if len(olds) > m:
            self.goto(j1 + m, 0)
            for _ in range(len(olds) - m):
                self.do(C["KILL_LINE"])
        elif len(news) > m:
            self.goto(j1 + m, 0)
            self.type("".join(news[m:]))

    def _line_edit(self, row: int, oc: str, nc: str) -> None:
        if len(oc) * len(nc) > 4_000_000:
            ops = [("replace", 0, len(oc), 0, len(nc))]
        else:
            ops = difflib.SequenceMatcher(None, oc, nc, autojunk=False).get_opcodes()
        for tag, i1, i2, j1, j2 in ops:
            if tag == "equal":
                continue
            self.goto(row, j1)
            if tag in ("delete", "replace"):
                if i2 == len(oc):
                    # up to the end of the old content: clear to the end of this line only
                    self.goto(row, j1)
                    for _ in range(i2 - i1):
                        self.do(C["DELETE"])
                else:
                    for _ in range(i2 - i1):
                        self.do(C["DELETE"])
            if tag in ("insert", "replace"):
                self.type(nc[j1:j2])


def check_limits(max_file_bytes: int, max_commits: int | None) -> None:
    """ValueError, naming the value, for a `max_file_bytes` below 0 or a `max_commits` (None: all) below 1."""
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 0:
        raise ValueError(f"max_file_bytes={max_file_bytes!r}: expected an integer >= 0")
    if max_commits is not None and (isinstance(max_commits, bool) or not isinstance(max_commits, int)
                                    or max_commits < 1):
        raise ValueError(f"max_commits={max_commits!r}: expected an integer >= 1, or None for every commit")


@dataclass
class CommitReport:
    sha: str
    touched: dict[str, str | None] = field(default_factory=dict)


def replay(
    repo: str,
    sink,
    rows: int = 48,
    cols: int = 160,
    max_file_bytes: int = 256 * 1024,
    max_commits: int | None = None,
    stats: ReplayStats | None = None,
    on_commit=None,
    commit_messages: bool = False,
) -> ReplayStats:
    """Replay `repo`'s first-parent history; `sink(cp, st, action)` receives every (frame before, action).

    `on_commit(index, total, stats)` is called after each commit. With
    `commit_messages`, each commit ends with COMMIT, its subject typed (its first
    MAX_SUBJECT_CHARS characters, those of the tokenizer's reserved range dropped), ENTER. Raises
    `ReplayError` when the safety invariant fails, ValueError for a `max_commits` below 1
    or a negative `max_file_bytes`.
    """
    check_limits(max_file_bytes, max_commits)
    git = Git(repo)
    stats = stats or ReplayStats()
    editor = Editor(rows, cols)
    planner = Planner(editor, sink)
    try:
        head = git.resolve("HEAD")  # one commit's history, though HEAD moves meanwhile
        total = git.count(head, max_commits) if on_commit is not None else 0
        with closing(git.commits(head, max_commits, subjects=commit_messages)) as commits:
            for index, commit in enumerate(commits):
                sha = commit.sha
                expected = _replay_commit(git, planner, sha, commit.changes, max_file_bytes, stats)
                if commit_messages:
                    planner.do(C["COMMIT"])
                    planner.type(typed_subject(commit.subject))
                    planner.do(C["ENTER"])
                for path, text in expected.items():
                    got = editor.files.get(path)
                    if got != text:
                        what = "missing" if got is None else ("present" if text is None else "different")
                        raise ReplayError(
                            f"commit {sha}: path {path!r}: editor file is {what} after replay "
                            f"(expected {'absence' if text is None else f'{len(text)} chars'})"
                        )
                stats.commits += 1
                stats.actions = planner.count
                stats.last_commit = sha
                if on_commit is not None:
                    on_commit(index + 1, max(total, index + 1), stats)
    finally:
        git.close()
    return stats


def _replay_commit(git: Git, planner: Planner, sha: str, changes: list[Change], max_bytes: int, stats: ReplayStats):
    ed = planner.ed
    expected: dict[str, str | None] = {}
    edits: list[tuple[str, str]] = []

    def load(sha_: str | None, mode: str) -> str | None:
        if sha_ is None:
            return None
        if not mode.startswith("100"):
            stats.skipped_other += 1
            return None
        data = git.blob(sha_, max_bytes)
        text, why = (None, "oversized") if data is None else classify(data, max_bytes)
        if text is None:
            if why == "oversized":
                stats.skipped_oversized += 1
            else:
                stats.skipped_binary += 1
        return text

    # deletions first, then renames, then additions and modifications
    order = {"D": 0, "R": 1}
    for ch in sorted(changes, key=lambda c: order.get(c.status, 2)):
        if ch.new_path is not None and not typeable(ch.new_path):
            stats.skipped_name += 1  # never typed: an old path of its own is deleted or renamed away below
            new_text = None
        else:
            new_text = load(ch.new_sha, ch.new_mode)
        if ch.status == "D":
            if ch.old_path in ed.files:
                planner.delete(ch.old_path)
            expected[ch.old_path] = None
            continue
        if ch.status == "R" and ch.old_path in ed.files:
            expected[ch.old_path] = None
            if new_text is None:
                planner.delete(ch.old_path)
            else:
                planner.rename(ch.old_path, ch.new_path)
        elif ch.status == "R":
            expected[ch.old_path] = None  # the old path was not text: nothing to rename
        path = ch.new_path
        expected[path] = new_text
        if new_text is None:
            if path in ed.files:
                planner.delete(path)
            continue
        stats.files += 1
        if path not in ed.files:
            planner.new_file(path)
        edits.append((path, new_text))
    for path, text in edits:
        old = ed.files[path]
        if old == text:
            continue
        planner.open(path)
        planner.edit(old, text)
        planner.do(C["SAVE"])
    return expected
