"""Git-history frame datasets: `build_git_dataset` (histories -> shards + manifest) and `GitFrameSource`.

`build_git_frames` converts one repository; `build_git_dataset` several into one dataset, some of
them held out (`RepoInput.held_out`: split "val", never trained on, and the action tokenizer is
trained on the other histories' actions only).

Layout of a dataset directory (all little-endian, no pickle); BUILD is the build's id (16 hex digits, random),
named by the manifest's `build`, so no build ever writes a file another build's manifest names:

    manifest.json                     geometry, styles, tokenizer, shards, stats, build
    tokenizer-BUILD.json              the action tokenizer (`ActionTokenizer`; the manifest's `tokenizer`)
    shard-BUILD-00000.rcf             frames + primitive actions (FRAME_FORMAT.md)
    shard-BUILD-00000.actions.u32     the primitive action codes again, raw uint32
    shard-BUILD-00000.tokens.npy      uint32 token ids of the shard's action stream
    shard-BUILD-00000.starts.npy      int64, index of each token's first action (= its frame)

(A dataset built before build ids has no `build`, `tokenizer.json` and `shard-00000.*`; it reads the same.)

A build writes into a temporary directory inside `out` (`.build-*`) and publishes only when everything is
written and on disk (every file fsynced): its files are moved in beside the old build's (their names are new),
then the new manifest replaces the old one (one rename, the directory fsynced before and after), and only then
are the files of other builds removed. An interrupted build or a crash of the machine leaves the previous
dataset whole (and maybe files of the unfinished build, which the next build removes), never a manifest beside
another build's shards. A reader that loaded the old manifest keeps the files it has open or mapped; one it
opens after the old build's files are gone is refused (ValueError: the dataset was rebuilt), never served from
the new build. One build at a time writes into a directory: a second is refused while the first holds
`out/.build.lock` (an flock, released when its process ends, however it ends); the holder first removes the
`.build-*` folders a killed build left.

The stream of one repository is cut into shards of at most `frames_per_shard`
frames; the editor state continues across shards (every shard's first block
is a key frame, so shards decode independently). Each history starts in a fresh
editor and its own shard; the manifest's `repos` lists every history (name, path,
the HEAD it was replayed up to, split) and every shard names its `repo` and `split`.

`GitFrameSource` implements `FrameWindowSource`: a window is L consecutive
tokens of one shard from a seeded uniform offset; `actions[b, t]` is token t
and `frames[b, t]` is the frame before token t's first action, so frame t + 1
shows the effect of all of token t's actions (several tokens starting inside
one character share a frame). Cells are (code point mod char_vocab, style);
styles are `git_editor.STYLE_*` (N_STYLES = 9). Frames are decoded on the fly
from the shards; token arrays are memory-mapped, and at most `max_open`
shard readers (each caching two decoded blocks) are open, so memory does not
grow with the repository. `next_window()` gives the next batch lazily
(`GitWindow`, a `FrameWindow`): only the chunk asked for is decoded, so a window
of 10^5 frames is never held at once.

The loader checks what it reads before serving it (a ValueError naming the file and what was expected):
the manifest's geometry, vocabulary, build, histories and shards (names `shard-BUILD-NNNNN`, counts), and,
once per shard when it is first opened, that the token ids and starts are 1-D integer arrays of the manifest's
length, the ids in 0 .. action_vocab_size - 1, the starts non-decreasing in 0 .. frames - 1, and that the `.rcf`
file has the manifest's geometry and frame count; each batch's styles are checked against `N_STYLES`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rcswarm.data.frames import git_replay
from rcswarm.data.frames.action_tokenizer import (
    ActionTokenizer,
    actions_to_text,
    chunk_text,
    encode_stream,
)
from rcswarm.data.frames.frame_codec import MAX_SIDE, FrameReader, FrameWriter, geometry_problem
from rcswarm.data.frames.git_editor import CONTROL_SEQUENCES, CONTROLS, MIN_COLS, MIN_ROWS, N_STYLES
from rcswarm.data.frames.git_replay import ReplayStats, check_limits, replay
from rcswarm.data.frames.window import FrameBatch, FrameWindowSpec, check_chunk
from rcswarm.data.validation import check_int

MANIFEST = "manifest.json"
BUILD_LOCK = ".build.lock"
FORMAT = "rcswarm-git-frames"
STAGING_PREFIX = ".build-"
BUILD_ID = re.compile(r"[0-9a-f]{16}")
# The files a build writes, of any build (and those of a dataset built before build ids): removed from `out` once
# the manifest of another build is in place. Other files in `out` are left alone.
BUILD_FILES = re.compile(r"(shard-([0-9a-f]{16}-)?\d{5}\.(rcf|actions\.u32|tokens\.npy|starts\.npy)"
                         r"|tokenizer(-[0-9a-f]{16})?\.json)")
# The names of those files that carry a build id: only a build writes such a name. A name without one
# (`tokenizer.json`, `shard-00000.rcf`) is removed only where the manifest being replaced names it (a dataset built
# before build ids), never because of its name alone: `--out` may be a directory of other files (a model's own
# `tokenizer.json`).
BUILD_ID_FILES = re.compile(r"shard-[0-9a-f]{16}-\d{5}\.(rcf|actions\.u32|tokens\.npy|starts\.npy)"
                            r"|tokenizer-[0-9a-f]{16}\.json")
SHARD_SUFFIXES = ("rcf", "actions.u32", "tokens.npy", "starts.npy")
# Shards and their token arrays count at most this many frames and tokens: exact in a float64 (the sampling
# weights) and far inside an int64 (numpy's offsets).
MAX_COUNT = (1 << 53) - 1


def shard_name(build: str | None, index: int) -> str:
    """The name of a build's `index`th shard: `shard-BUILD-NNNNN` (`shard-NNNNN` in a dataset without a build id)."""
    return f"shard-{build}-{index:05d}" if build else f"shard-{index:05d}"


def _shard_name_pattern(build: str | None) -> re.Pattern:
    return re.compile(rf"shard-{build}-\d{{5}}" if build else r"shard-\d{5}")


class _ShardSink:
    def __init__(self, out: Path, build: str, rows: int, cols: int, block_frames: int, frames_per_shard: int) -> None:
        self.out, self.build, self.rows, self.cols = out, build, rows, cols
        self.block_frames, self.per_shard = block_frames, frames_per_shard
        self.shards: list[dict] = []
        self.writer: FrameWriter | None = None
        self.raw_bytes = 0
        self.repo, self.split = "", "train"

    def begin(self, repo: str, split: str) -> None:
        """The shards opened from now on hold history `repo` of split `split`."""
        self.repo, self.split = repo, split

    def _open(self) -> None:
        name = shard_name(self.build, len(self.shards))
        self.writer = FrameWriter(self.out / f"{name}.rcf", self.rows, self.cols, self.block_frames, N_STYLES)
        self.afile = open(self.out / f"{name}.actions.u32", "wb")  # noqa: SIM115 - closed in _close_shard
        self.abuf: list[int] = []
        self.shards.append({"name": name, "frames": 0, "repo": self.repo, "split": self.split})

    def _next(self, action: int) -> FrameWriter:
        if self.writer is None or self.writer.n_frames + self.writer.pending >= self.per_shard:
            self._close_shard()
            self._open()
        self.abuf.append(action)
        if len(self.abuf) >= 65536:
            self.afile.write(np.asarray(self.abuf, "<u4").tobytes())
            self.abuf = []
        return self.writer

    def __call__(self, cp: np.ndarray, st: np.ndarray, action: int) -> None:
        self._next(action).write(cp, st, action)

    def write_rows(self, row_cp: list[str], row_st: list[bytes], damage, action: int, scroll=None) -> None:
        self._next(action).write_rows(row_cp, row_st, damage, action, scroll)

    def _close_shard(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        self.afile.write(np.asarray(self.abuf, "<u4").tobytes())
        self.afile.close()
        self.shards[-1]["frames"] = self.writer.n_frames
        self.raw_bytes += self.writer.raw_bytes
        self.writer = None

    def close(self) -> None:
        self._close_shard()


def _cpu() -> float:
    """CPU seconds of this process and its finished children (git), user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _actions(out: Path, name: str) -> np.ndarray:
    return np.fromfile(out / f"{name}.actions.u32", dtype="<u4")


SUMMARY_COUNTS = ("commits", "files", "skipped_binary", "skipped_oversized", "skipped_other", "skipped_name",
                  "actions")
TRAIN, VAL = "train", "val"
SPLITS = (TRAIN, VAL)


@dataclass(frozen=True)
class RepoInput:
    """One history of a dataset: its `name` in the manifest, the `path` of a clone (or bare git directory),
    and whether it is held out (split "val": never trained on, never seen by the tokenizer)."""

    name: str
    path: Path
    held_out: bool = False

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"repository name {self.name!r}: expected letters, digits, '-', '_' or '.'")

    @property
    def split(self) -> str:
        return VAL if self.held_out else TRAIN


def repo_name(path: str | Path) -> str:
    """A repository's default name: its directory's name without `.git` (the parent's for `.../NAME/.git`)."""
    path = Path(path).resolve()
    name = path.parent.name if path.name == ".git" else path.name
    return name.removesuffix(".git") or "repo"


def _replay_repo(repo: RepoInput, sink: _ShardSink, rows: int, cols: int, max_file_bytes: int,
                 max_commits: int | None, commit_messages: bool, progress: bool, console) -> ReplayStats:
    """Replay one history into `sink` (its shards start fresh: none straddles two histories)."""
    sink.begin(repo.name, repo.split)
    stats = ReplayStats()
    if not progress:
        replay(str(repo.path), sink, rows, cols, max_file_bytes, max_commits, stats, None, commit_messages)
        sink.close()
        return stats
    from rich import progress as rp

    bar = rp.Progress(
        rp.TextColumn(f"[bold]{repo.name}[/]"), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn("commits"),
        rp.TextColumn("{task.fields[actions]:,} actions"), rp.TimeElapsedColumn(), rp.TimeRemainingColumn(),
        console=console, transient=False,
    )
    task = bar.add_task("replay", total=None, actions=0)

    def on_commit(i: int, total: int, s: ReplayStats) -> None:
        bar.update(task, completed=i, total=total, actions=s.actions)

    count = [0]

    class CountingSink:
        def write_rows(self, row_cp, row_st, damage, action: int, scroll=None) -> None:
            sink.write_rows(row_cp, row_st, damage, action, scroll)
            count[0] += 1
            if not count[0] & 0x1FFF:  # large commits: keep the action count moving
                bar.update(task, actions=count[0])

    with bar:
        replay(str(repo.path), CountingSink(), rows, cols, max_file_bytes, max_commits, stats, on_commit,
               commit_messages)
    sink.close()
    return stats


class _StageProgress:
    """The progress of the stages after the replay (training the tokenizer, encoding the shards), one bar a stage in
    the replay's style (`_replay_repo`): its name, a bar, done/total actions, elapsed and remaining time. Without
    `progress` (`--no-progress`) it shows nothing."""

    def __init__(self, progress: bool, console) -> None:
        self.bar = None
        self.totals: dict[int, int] = {}
        if progress:
            from rich import progress as rp

            self.bar = rp.Progress(
                rp.TextColumn("[bold]{task.description}[/]"), rp.BarColumn(), rp.MofNCompleteColumn(),
                rp.TextColumn("actions"),
                rp.TimeElapsedColumn(), rp.TimeRemainingColumn(), console=console, transient=False,
            )

    def __enter__(self) -> _StageProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def add(self, stage: str, total: int) -> int | None:
        """A new stage's bar (None without progress)."""
        if self.bar is None:
            return None
        task = self.bar.add_task(stage, total=total)
        self.totals[task] = total
        return task

    def advance(self, task: int | None, actions: int, done: bool = False) -> None:
        """`actions` more of `task` done (`done`: all of them)."""
        if self.bar is None or task is None:
            return
        if done:
            self.bar.update(task, completed=self.totals[task])
        else:
            self.bar.advance(task, actions)


def build_git_frames(repo: str | Path, out: str | Path, *args, **options) -> dict:
    """Convert `repo`'s first-parent history into a dataset at `out` (the other arguments as
    `build_git_dataset`'s: rows, cols, vocab_size, ...); returns the summary dict."""
    return build_git_dataset([RepoInput(repo_name(repo), Path(repo))], out, *args, **options)


def build_git_dataset(
    repos: Sequence[RepoInput],
    out: str | Path,
    rows: int = 48,
    cols: int = 160,
    vocab_size: int = 4096,
    block_frames: int = 256,
    frames_per_shard: int = 1 << 20,
    max_file_bytes: int = 256 * 1024,
    max_commits: int | None = None,
    progress: bool = True,
    console=None,
    commit_messages: bool = False,
) -> dict:
    """Convert several histories into one dataset at `out`, the held-out ones as split "val".

    Each history is replayed from a fresh editor into its own shards (`max_commits` applies to each);
    the action tokenizer is trained on the training histories' actions only, then encodes every shard.
    Returns the summary: totals over all histories, and per history under "repos".
    """
    repos = list(repos)
    names = [r.name for r in repos]
    if not repos or len(set(names)) != len(names):
        raise ValueError(f"repositories {names}: expected at least one, with distinct names")
    if all(r.held_out for r in repos):
        raise ValueError(f"repositories {names}: every one is held out; expected at least one to train on")
    check_build_options(rows, cols, vocab_size, block_frames, frames_per_shard, max_file_bytes, max_commits)
    for repo in repos:
        problem = git_replay.Git(str(repo.path)).history_problem()
        if problem:
            raise ValueError(f"repository {repo.name} ({repo.path}): {problem}")
    check_held_out_apart(repos, max_commits)
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with _BuildLock(out):
            _remove_staging_left_behind(out)
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
            try:
                summary, manifest = _build(repos, staging, _new_build_id(out), rows, cols, vocab_size, block_frames,
                                           frames_per_shard, max_file_bytes, max_commits, progress, console,
                                           commit_messages)
                _publish(staging, out, manifest)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        if created:
            _remove_if_only_the_lock(out)
        raise
    return summary


def check_held_out_apart(repos: Sequence[RepoInput], max_commits: int | None) -> None:
    """ValueError, naming both histories, a shared commit and what to do, when a held-out history shares a commit with
    a training one: the same repository given twice, a fork, a clone, or a history that merged the other (a merge is
    replayed as its diff against its first parent, so the merged history's files are typed into the merging one's
    frames). Asked before anything is written; only what each replay reads counts: the whole ancestry of its last
    replayed commit (HEAD, or the `max_commits`th of its first-parent line), every parent followed.

    Two ancestries share a commit exactly when a root of one (a commit without a parent, or a shallow clone's
    boundary) is in the other: below a shared commit, following parents, one of the two reaches a root first, and
    the other reaches that commit too. So only the roots (`Git.roots`, few) are held, and each history's ancestry is
    streamed once (`Git.ancestry`), never held, whatever its length.
    """
    held = [r for r in repos if r.held_out]
    if not held:
        return
    training = [r for r in repos if not r.held_out]
    heads = {r.name: _replayed_head(r, max_commits) for r in repos}
    roots = {r.name: git_replay.Git(str(r.path)).roots(heads[r.name]) for r in repos}
    training_roots = {sha: r for r in reversed(training) for sha in roots[r.name]}
    held_roots = {sha: r for r in reversed(held) for sha in roots[r.name]}
    for repo in held:  # a training history's root in the held-out one: it forked, cloned or merged the training one
        shared = _first_reached(repo, heads[repo.name], training_roots)
        if shared is not None:
            raise _shares_commit(repo, shared, training_roots[shared], training_roots[shared])
    for repo in training:  # a held-out history's root in a training one: it forked, cloned or merged the held-out one
        shared = _first_reached(repo, heads[repo.name], held_roots)
        if shared is not None:
            raise _shares_commit(held_roots[shared], shared, repo, held_roots[shared])


def _replayed_head(repo: RepoInput, max_commits: int | None) -> str:
    """The last commit a replay of `repo` reads: HEAD, or the `max_commits`th commit of its first-parent line (the
    line streamed, git stopped there)."""
    git = git_replay.Git(str(repo.path))
    if max_commits is None:
        return git.resolve("HEAD")
    last = ""
    with closing(git.first_parent_commits(max_count=max_commits)) as line:
        for sha, _, _ in line:
            last = sha
    return last


def _first_reached(repo: RepoInput, head: str, wanted: dict[str, RepoInput]) -> str | None:
    """The first commit of `head`'s ancestry in `repo` that is in `wanted`, or None; git is stopped there."""
    if not wanted:
        return None
    with closing(git_replay.Git(str(repo.path)).ancestry(head)) as commits:
        for sha in commits:
            if sha in wanted:
                return sha
    return None


def _shares_commit(held: RepoInput, sha: str, trained: RepoInput, owner: RepoInput) -> ValueError:
    """The refusal of a held-out history `held` and a training one `trained` that share commit `sha`, a root commit
    of `owner`'s history (one of the two)."""
    other = trained if owner is held else held
    return ValueError(
        f"held-out repository {held.name} ({held.path}) shares commit {sha} with training repository {trained.name} "
        f"({trained.path}): {sha}, a root commit of {owner.name}'s history, is also in {other.name}'s (one of the two "
        "is a clone or fork of the other, or merged it), so the held-out history's files would be trained on; "
        f"expected histories with no commit in common: drop {held.name} or {trained.name}, or hold out another history")


def _remove_if_only_the_lock(out: Path) -> None:
    """After a failed first build into `out` (which it created): remove `out` when only the build lock is left, so
    that a failed build leaves no dataset directory behind. A build that started since keeps its files."""
    try:
        if {path.name for path in out.iterdir()} == {BUILD_LOCK}:
            (out / BUILD_LOCK).unlink()
            out.rmdir()
    except OSError:
        pass


def _remove_staging_left_behind(out: Path) -> None:
    """Remove the `.build-*` folders of builds that ended without cleaning up (killed): called holding the lock,
    so none of them belongs to a running build."""
    for path in out.iterdir():
        if path.name.startswith(STAGING_PREFIX) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _new_build_id(out: Path) -> str:
    """A fresh build id: random, and named by no file in `out` (so the build overwrites none)."""
    while True:
        build = secrets.token_hex(8)
        if not any(build in path.name for path in out.iterdir()):
            return build


class _BuildLock:
    """`out/.build.lock`, held exclusively (flock) for a build's life: a second build into `out` is refused
    with the holder's pid instead of interleaving its shards with the first's."""

    def __init__(self, out: Path) -> None:
        self.path, self._file = out / BUILD_LOCK, None

    def __enter__(self) -> _BuildLock:
        handle = open(self.path, "a+")  # noqa: SIM115 - held open until __exit__
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RuntimeError(f"{self.path.parent}: another build is writing this dataset (pid {holder}); "
                               "wait for it to end, or build into another directory") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.truncate(0)
        self._file.close()  # closing releases the flock


def check_build_options(rows: int, cols: int, vocab_size: int, block_frames: int, frames_per_shard: int,
                        max_file_bytes: int, max_commits: int | None) -> None:
    """ValueError, naming the value, for an option `build_git_dataset` cannot build with (before any replay):
    rows and cols from the editor's least (`MIN_ROWS`, `MIN_COLS`) to the frame format's most (65535), and a
    block of block_frames x rows x cols within the reader's decode budget (`frame_codec.DECODED_BLOCK_BUDGET`)."""
    for name, value, low, high in (("rows", rows, MIN_ROWS, MAX_SIDE), ("cols", cols, MIN_COLS, MAX_SIDE),
                                   ("vocab_size", vocab_size, 256, None), ("block_frames", block_frames, 1, MAX_SIDE),
                                   ("frames_per_shard", frames_per_shard, 1, None)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
            raise ValueError(f"{name}={value!r}: expected an integer in {low}..{high or 'any'}")
    problem = geometry_problem(rows, cols, block_frames)
    if problem:
        raise ValueError(problem)
    check_limits(max_file_bytes, max_commits)


def _build(repos: list[RepoInput], out: Path, build: str, rows: int, cols: int, vocab_size: int, block_frames: int,
           frames_per_shard: int, max_file_bytes: int, max_commits: int | None, progress: bool, console,
           commit_messages: bool) -> tuple[dict, dict]:
    """Replay, train the tokenizer and encode every shard into `out` (the staging directory), every file named
    with the build id `build`: (summary, manifest)."""
    sink = _ShardSink(out, build, rows, cols, block_frames, frames_per_shard)
    t0 = time.perf_counter()
    c0 = _cpu()
    per_repo = []
    for repo in repos:
        started = time.perf_counter()
        stats = _replay_repo(repo, sink, rows, cols, max_file_bytes, max_commits, commit_messages, progress, console)
        per_repo.append({"name": repo.name, "path": str(Path(repo.path).resolve()), "head": stats.last_commit,
                         "split": repo.split, **{key: getattr(stats, key) for key in SUMMARY_COUNTS},
                         "replay_seconds": time.perf_counter() - started})
    check_every_history_has_frames(per_repo, sink.shards)
    t_replay = time.perf_counter() - t0
    c_replay = _cpu() - c0

    train_actions = sum(sh["frames"] for sh in sink.shards if sh["split"] == TRAIN)
    all_actions = sum(sh["frames"] for sh in sink.shards)
    with _StageProgress(progress, console) as stages:
        learn = stages.add("tokenizer", train_actions)

        def texts():
            for sh in sink.shards:
                if sh["split"] != TRAIN:
                    continue
                text = actions_to_text(_actions(out, sh["name"]).tolist())
                for _, chunk in chunk_text(text):
                    yield chunk
                    stages.advance(learn, len(chunk))

        tok = ActionTokenizer.train(texts(), vocab_size)
        stages.advance(learn, 0, done=True)
        tokenizer = f"tokenizer-{build}.json"
        tok.save(out / tokenizer)
        encode = stages.add("encode", all_actions)
        for sh in sink.shards:
            ids, starts = encode_stream(tok, _actions(out, sh["name"]).astype(np.int64),
                                        on_chunk=lambda n: stages.advance(encode, n))
            np.save(out / f"{sh['name']}.tokens.npy", ids, allow_pickle=False)
            np.save(out / f"{sh['name']}.starts.npy", starts, allow_pickle=False)
            sh["tokens"] = len(ids)
    for entry in per_repo:
        mine = [sh for sh in sink.shards if sh["repo"] == entry["name"]]
        entry.update(frames=sum(sh["frames"] for sh in mine), tokens=sum(sh["tokens"] for sh in mine))
    compressed = sum((out / f"{sh['name']}.rcf").stat().st_size for sh in sink.shards)
    actions = sum(r["actions"] for r in per_repo)
    elapsed = time.perf_counter() - t0
    summary = {
        **{key: sum(r[key] for r in per_repo) for key in SUMMARY_COUNTS},
        "frames": sum(sh["frames"] for sh in sink.shards), "tokens": sum(sh["tokens"] for sh in sink.shards),
        "raw_bytes": sink.raw_bytes, "compressed_bytes": compressed,
        "ratio": sink.raw_bytes / compressed if compressed else 0.0,
        "replay_seconds": t_replay, "seconds": elapsed,
        "actions_per_second": actions / t_replay if t_replay > 0 else 0.0,
        "replay_cpu_seconds": c_replay,
        "actions_per_cpu_second": actions / c_replay if c_replay > 0 else 0.0,
        "repos": per_repo,
    }
    manifest = {
        "format": FORMAT, "version": 2, "build": build,
        **({"repo": per_repo[0]["path"]} if len(per_repo) == 1 else {}),
        "repos": [{key: r[key] for key in ("name", "path", "head", "split")} for r in per_repo],
        "rows": rows, "cols": cols, "n_styles": N_STYLES, "block_frames": block_frames,
        "tokenizer": tokenizer, "action_vocab_size": tok.vocab_size,
        "controls": {name: CONTROL_SEQUENCES[name] for name in CONTROLS},
        "shards": sink.shards, "summary": summary,
    }
    return summary, manifest


def check_every_history_has_frames(per_repo: list[dict], shards: list[dict]) -> None:
    """ValueError, naming the history, its commits and what its replay skipped, when a history gave no frame (no text
    file in the commits it read): the build would publish a dataset without it (an empty one, in place of a good one
    with --overwrite) that fails only when opened. Asked after the replay, before anything is published; with a frame
    from every history, the training split has frames too."""
    framed = {sh["repo"] for sh in shards if sh["frames"] > 0}
    for entry in per_repo:
        if entry["name"] not in framed:
            skipped = ", ".join(f"{entry[key]} {key.removeprefix('skipped_')}" for key in SUMMARY_COUNTS
                                if key.startswith("skipped_"))
            raise ValueError(f"repository {entry['name']} ({entry['path']}, split {entry['split']!r}): its "
                             f"{entry['commits']} commits replayed gave 0 frames (files typed: {entry['files']}; "
                             f"skipped: {skipped}); expected a history with at least one text file: leave it out, "
                             "or raise max_file_bytes (--max-file-bytes) where its files were skipped as oversized")


def _publish(staging: Path, out: Path, manifest: dict) -> None:
    """Move a finished build from `staging` into `out`, the manifest last, then remove the other builds' files.

    The build's files have names of their own (its build id), so moving them in overwrites nothing: until the
    new manifest replaces the old one (a rename), the old manifest and every file it names stay as they were.
    Afterwards the files of other builds (`BUILD_FILES`: earlier builds, an interrupted one's leftovers) are
    removed; other files in `out` are left alone.
    """
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    built = {path.name for path in staging.iterdir()}
    owned = _files_without_build_id(out)
    for name in built:
        _fsync(staging / name)
    for name in sorted(built - {MANIFEST}):
        if (out / name).exists():  # never: the build id is fresh (_new_build_id)
            raise RuntimeError(f"{out / name}: exists; a build never overwrites a file")
        os.replace(staging / name, out / name)
    _fsync(out)  # the files' new names are on disk before the manifest that names them
    os.replace(staging / MANIFEST, out / MANIFEST)
    _fsync(out)
    for path in out.iterdir():
        if path.name not in built and (BUILD_ID_FILES.fullmatch(path.name) or path.name in owned):
            path.unlink()
    _fsync(out)


def _files_without_build_id(out: Path) -> set[str]:
    """The files of the dataset now in `out` whose names carry no build id (`BUILD_FILES` of a dataset built before
    build ids: its `tokenizer.json` and the files of the shards its manifest names); empty where `out` holds no
    manifest of such a dataset (no manifest, another format, a build with an id, one that cannot be read)."""
    try:
        old = json.loads((out / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    if not isinstance(old, dict) or old.get("format") != FORMAT or "build" in old:
        return set()
    shards = old.get("shards") if isinstance(old.get("shards"), list) else []
    names = {sh.get("name") for sh in shards if isinstance(sh, dict)}
    files = {f"{name}.{suffix}" for name in names if isinstance(name, str) for suffix in SHARD_SUFFIXES}
    return {name for name in ({"tokenizer.json"} | files) if BUILD_FILES.fullmatch(name)}


def _fsync(path: Path) -> None:
    """Flush a file's contents, or a directory's entries, to disk (data imports nothing of ours, so this is its own
    twin of sync/files.fsync_dir)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def print_summary(summary: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="git frames")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (*SUMMARY_COUNTS, "frames", "tokens"):
        table.add_row(key, f"{summary[key]:,}")
    table.add_row("raw bytes (5 B/cell)", f"{summary['raw_bytes']:,}")
    table.add_row("compressed bytes", f"{summary['compressed_bytes']:,}")
    table.add_row("ratio", f"{summary['ratio']:.1f}x")
    table.add_row("actions/s (replay+encode)", f"{summary['actions_per_second']:,.0f}")
    table.add_row("actions per CPU second", f"{summary['actions_per_cpu_second']:,.0f}")
    table.add_row("seconds", f"{summary['seconds']:.2f}")
    console = console or Console()
    console.print(table)
    repos = summary.get("repos", [])
    if len(repos) > 1:
        per_repo = Table(title="histories")
        for column in ("name", "split", "head", "commits", "files", "frames", "tokens"):
            per_repo.add_column(column, justify="left" if column in ("name", "split", "head") else "right")
        for r in repos:
            per_repo.add_row(r["name"], r["split"], r["head"][:10], *(f"{r[key]:,}" for key in
                                                                      ("commits", "files", "frames", "tokens")))
        console.print(per_repo)


def held_out_repos(manifest: dict) -> list[str]:
    """The names of a dataset's held-out histories (split "val"); [] for one built without any."""
    return [r["name"] for r in manifest.get("repos", []) if r.get("split") == VAL]


def dataset_shards(manifest: dict, split: str | None) -> list[dict]:
    """The shards a split reads: None every shard; "train" the training histories' shards; "val" the held-out
    histories' shards, or, in a dataset without a held-out history, every shard (held-out windows are then
    other windows of the same histories, drawn from another seed)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS} or None")
    shards = manifest["shards"]
    if split is None or (split == VAL and not held_out_repos(manifest)):
        return list(shards)
    return [s for s in shards if s.get("split", TRAIN) == split]


def _int_field(table: dict, key: str, low: int, where: str, high: int = MAX_COUNT) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{where}: {key} = {value!r}: expected an integer in {low}..{high}")
    return value


def load_manifest(root: str | Path) -> dict:
    """A dataset directory's manifest, checked (ValueError naming the file and what was expected): its format,
    geometry and vocabulary, its build id and tokenizer file, its histories (`repos`: objects with a name and a
    split), and every shard's name (`shard-BUILD-NNNNN` of the manifest's build, or `shard-NNNNN` in a dataset
    without one; once each), frame and token counts (0 .. `MAX_COUNT`) and split."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise ValueError(f"{path}: no such file: expected a dataset made by `rcswarm data frames` "
                         "(a build that did not finish leaves none)")
    try:
        m = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"{path}: expected a JSON object with format {FORMAT!r}")
    for key in ("rows", "cols"):
        _int_field(m, key, 1, str(path), MAX_SIDE)
    _int_field(m, "action_vocab_size", 1, str(path))
    build = m.get("build")
    if "build" in m and not (isinstance(build, str) and BUILD_ID.fullmatch(build)):
        raise ValueError(f"{path}: build = {build!r}: expected 16 hexadecimal digits")
    tokenizer = m.get("tokenizer", "tokenizer.json")
    if tokenizer not in ("tokenizer.json", f"tokenizer-{build}.json"):
        raise ValueError(f"{path}: tokenizer = {tokenizer!r}: expected 'tokenizer-{build}.json' (the build's)"
                         if build else f"{path}: tokenizer = {tokenizer!r}: expected 'tokenizer.json'")
    repos = m.get("repos", [])
    if not isinstance(repos, list) or not all(
            isinstance(r, dict) and isinstance(r.get("name"), str) and r.get("split") in SPLITS for r in repos):
        raise ValueError(f"{path}: repos = {repos!r}: expected a list of objects, each with a name and a split "
                         f"in {SPLITS}")
    shards = m.get("shards")
    if not isinstance(shards, list) or not all(isinstance(sh, dict) for sh in shards):
        raise ValueError(f"{path}: shards = {shards!r}: expected a list of objects")
    seen, names = set(), _shard_name_pattern(build)
    for sh in shards:
        name = sh.get("name")
        if not isinstance(name, str) or not names.fullmatch(name) or name in seen:
            expected = f"'shard-{build}-' (the build) and five digits" if build else "'shard-' and five digits"
            raise ValueError(f"{path}: shard name {name!r}: expected {expected}, each name once")
        seen.add(name)
        _int_field(sh, "frames", 0, f"{path}: shard {name}")
        _int_field(sh, "tokens", 0, f"{path}: shard {name}")
        if sh.get("split", TRAIN) not in SPLITS:
            raise ValueError(f"{path}: shard {name}: split = {sh.get('split')!r}: expected one of {SPLITS}")
    return m


def _int_array(path: Path) -> np.ndarray:
    """A memory-mapped 1-D integer .npy array; ValueError naming the file otherwise (FileNotFoundError passes)."""
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError) as e:  # EOFError: a file of zero bytes (a copy cut off)
        raise ValueError(f"{path}: not a readable .npy array: {type(e).__name__}: {e}") from None
    if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"{path}: dtype {getattr(a, 'dtype', None)}, shape {getattr(a, 'shape', None)}: "
                         "expected a 1-D array of integers")
    return a


class GitFrameSource:
    """A `FrameWindowSource` over a built dataset directory (see the module docstring).

    `split` picks the shards (`dataset_shards`): "train" never reads a held-out history, "val" reads
    only the held-out ones (where the dataset has any); None reads all.

    The source reads the build whose manifest it loaded: a shard file it opens after a rebuild removed that
    build's files raises a ValueError saying so (open the dataset again to read the new build).
    """

    def __init__(self, root: str | Path, spec: FrameWindowSpec, char_vocab: int = 8192, max_open: int = 4,
                 split: str | None = None) -> None:
        check_int("GitFrameSource", "char_vocab", char_vocab, 1)
        check_int("GitFrameSource", "max_open", max_open, 1)
        self.root = Path(root)
        self.spec = spec
        self.char_vocab = char_vocab
        m = load_manifest(self.root)
        self.manifest = m
        self._geometry = (int(m["rows"]), int(m["cols"]))
        self._vocab = int(m["action_vocab_size"])
        self.split = split
        shards = dataset_shards(m, split)
        self.shards = [s for s in shards if s.get("tokens", 0) >= spec.window]
        if not self.shards:
            where = f"split {split!r} ({len(shards)} shards)" if split else "no shard"
            raise ValueError(f"{self.root}: {where}: no shard has {spec.window} tokens (window longer than the data)")
        w = np.array([s["tokens"] - spec.window + 1 for s in self.shards], np.float64)
        self.weights = w / w.sum()
        self.rng = np.random.default_rng(spec.seed)
        self.max_open = max_open
        self._readers: OrderedDict[int, FrameReader] = OrderedDict()
        self._tokens = [None] * len(self.shards)

    def _gone(self, path: Path) -> ValueError:
        """The error for a file of this source's build that is no longer there: the dataset was rebuilt."""
        build = self.manifest.get("build")
        try:
            now = json.loads((self.root / MANIFEST).read_text()).get("build")
        except (OSError, ValueError, AttributeError):
            now = None
        rebuilt = f"; the manifest now names build {now}" if now and now != build else ""
        return ValueError(f"{path}: no such file: the dataset at {self.root} was rebuilt (or removed) after this reader "
                          f"loaded its manifest (build {build or 'without an id'}{rebuilt}); a reader never mixes "
                          "two builds: open the dataset again to read the new one")

    @property
    def geometry(self) -> tuple[int, int]:
        return self._geometry

    @property
    def action_vocab_size(self) -> int:
        return self._vocab

    def _reader(self, k: int) -> FrameReader:
        if k in self._readers:
            self._readers.move_to_end(k)
            return self._readers[k]
        path = self.root / f"{self.shards[k]['name']}.rcf"
        try:
            r = FrameReader(path)
        except FileNotFoundError:
            raise self._gone(path) from None
        frames = self.shards[k]["frames"]
        if (r.rows, r.cols) != self._geometry or len(r) != frames:
            r.close()
            raise ValueError(f"{path}: {len(r)} frames of {r.rows}x{r.cols}: expected {frames} frames of "
                             f"{self._geometry[0]}x{self._geometry[1]} (the manifest's)")
        self._readers[k] = r
        while len(self._readers) > self.max_open:
            self._readers.popitem(last=False)[1].close()
        return r

    def _tok(self, k: int):
        if self._tokens[k] is None:
            self._tokens[k] = self._load_tokens(k)
        return self._tokens[k]

    def _load_tokens(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard k's token ids and starts, memory-mapped and checked once (ValueError naming the file)."""
        shard = self.shards[k]
        base = self.root / shard["name"]
        try:
            ids, starts = _int_array(Path(f"{base}.tokens.npy")), _int_array(Path(f"{base}.starts.npy"))
        except FileNotFoundError as e:
            raise self._gone(Path(e.filename or f"{base}.tokens.npy")) from None
        n, frames = shard["tokens"], shard["frames"]
        if len(ids) != n or len(starts) != n:
            raise ValueError(f"{base}.tokens.npy, .starts.npy: {len(ids)} ids and {len(starts)} starts: expected "
                             f"{n} each (the manifest's tokens)")
        if n and not (0 <= int(ids.min()) and int(ids.max()) < self._vocab):
            raise ValueError(f"{base}.tokens.npy: ids in {int(ids.min())}..{int(ids.max())}: expected ids in "
                             f"0..{self._vocab - 1} (action_vocab_size)")
        if n and not (0 <= int(starts[0]) and int(starts[-1]) < frames and not np.any(starts[1:] < starts[:-1])):
            raise ValueError(f"{base}.starts.npy: starts from {int(starts[0])} to {int(starts[-1])}: expected "
                             f"non-decreasing frame indices in 0..{frames - 1} (the shard's frames)")
        return ids, starts

    def rows(self, k: int, offset: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(frames [count, rows, cols, 2], token ids [count]) of shard k from token `offset`."""
        ids, starts = self._tok(k)
        reader = self._reader(k)
        frames = np.stack([reader.frame(int(s)) for s in starts[offset : offset + count]])
        if count and int(frames[..., 1].max()) >= N_STYLES:
            raise ValueError(f"{reader.path}: style {int(frames[..., 1].max())} in frames {int(starts[offset])}.."
                             f"{int(starts[offset + count - 1])}: expected styles in 0..{N_STYLES - 1}")
        frames[..., 0] %= self.char_vocab
        return frames, np.asarray(ids[offset : offset + count], np.int64)

    def window(self, k: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(frames [L, rows, cols, 2], token ids [L]) of shard k from token `offset`."""
        return self.rows(k, offset, self.spec.window)

    def next_window(self) -> GitWindow:
        """The next batch as a lazy `FrameWindow`: (shard, offset) drawn now, frames decoded per chunk."""
        places = []
        for _ in range(self.spec.batch_size):
            k = int(self.rng.choice(len(self.shards), p=self.weights))
            off = int(self.rng.integers(0, self.shards[k]["tokens"] - self.spec.window + 1))
            places.append((k, off))
        return GitWindow(self, tuple(places), self.spec.window)

    def next_batch(self) -> FrameBatch:
        return self.next_window().chunk(0, self.spec.window)


@dataclass(frozen=True)
class GitWindow:
    """B windows of `length` tokens at `places` ((shard, token offset) each); a `FrameWindow`.

    `chunk(start, stop)` decodes only the frames of tokens start .. stop - 1 of every
    window (the reader caches two blocks per shard); token ids are memory-mapped.
    """

    source: GitFrameSource
    places: tuple[tuple[int, int], ...]
    length: int

    @property
    def batch_size(self) -> int:
        return len(self.places)

    def chunk(self, start: int, stop: int) -> FrameBatch:
        """(frames [B, stop - start, rows, cols, 2], actions [B, stop - start]), int64."""
        check_chunk(self, start, stop)
        rows = [self.source.rows(k, offset + start, stop - start) for k, offset in self.places]
        frames = np.stack([f for f, _ in rows])  # [B, n, rows, cols, 2]
        actions = np.stack([a for _, a in rows])  # [B, n]
        return torch.from_numpy(frames), torch.from_numpy(actions)
