"""Untrusted git histories and dataset files (docs/RELIABILITY.md, "Untrusted git histories and dataset files"):
the line diff's work is bounded, an oversized blob is never held, names that cannot be typed are skipped, a
rebuild is published whole or not at all, a crafted dataset or `.rcf` file is refused with the file named, and
the count flags and the [data] table are checked.

No git process runs here (tests/deploy/test_layout.py): histories are held in memory (`MemoryGit`, standing in
for `git_replay.Git`), and `Git`'s own parsing is fed the bytes git prints.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
import signal
import struct
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rcswarm.config.runspec import DataSection
from rcswarm.data.frames import frame_codec as fc
from rcswarm.data.frames import git_frames, git_replay
from rcswarm.data.frames.action_tokenizer import ActionTokenizer
from rcswarm.data.frames.git_editor import C, Editor
from rcswarm.data.frames.git_frames import GitFrameSource, RepoInput, build_git_dataset
from rcswarm.data.frames.git_replay import Change, Commit, Git, Planner, ReplayStats, replay
from rcswarm.data.frames.window import FrameWindowSpec
from tests.helpers.data import COLS, ROWS

SPEC = FrameWindowSpec(batch_size=2, window=8, seed=3)
BAD_NAME = b"bad\xff.txt".decode("utf-8", "surrogateescape")  # a name that is not UTF-8, as the replay holds it
RESERVED_NAME = "x\U000f000ay.txt"  # U+F000A: control 10 (TREE) in the tokenizer's text


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


class MemoryGit:
    """A first-parent history held in memory, in place of `git_replay.Git`: one {path: bytes} snapshot per
    commit (changes: additions, modifications, deletions, and the renames given as {commit: {old: new}})."""

    def __init__(self, snapshots: list[dict[str, bytes]], renames: dict[int, dict[str, str]] | None = None) -> None:
        self.blobs: dict[str, bytes] = {}
        self.log: list[tuple[str, list[Change]]] = []
        prev: dict[str, bytes] = {}
        for k, snap in enumerate(snapshots):
            moved = (renames or {}).get(k, {})
            changes = [Change("R", old, new, _sha(prev[old]), self._put(snap[new]), "100644", "100644")
                       for old, new in moved.items()]
            for path in sorted(set(prev) | set(snap)):
                a, b = prev.get(path), snap.get(path)
                if a == b or path in moved or path in moved.values():
                    continue
                changes.append(Change("A" if a is None else "D" if b is None else "M",
                                      None if a is None else path, None if b is None else path,
                                      None if a is None else _sha(a), None if b is None else self._put(b),
                                      "000000" if b is None else "100644", "000000" if a is None else "100644"))
            # a commit's id follows from its parent's and its snapshot, as git's does: histories share commits only
            # where their snapshots agree from the first commit on
            parent = self.log[-1][0] if self.log else ""
            self.log.append((_sha(parent.encode() + repr(sorted(snap.items())).encode()), changes))
            prev = snap

    def history_problem(self) -> None:
        return None

    def _put(self, data: bytes) -> str:
        self.blobs[_sha(data)] = data
        return _sha(data)

    def resolve(self, rev: str = "HEAD") -> str:
        return self.log[-1][0]

    def count(self, rev: str = "HEAD", max_count: int | None = None) -> int:
        return len(self.log[:max_count])

    def first_parent_commits(self, rev: str = "HEAD", max_count: int | None = None,
                             subjects: bool = False) -> Iterator[tuple[str, str | None, str]]:
        for k, (sha, _) in enumerate(self.log[:max_count]):
            yield sha, self.log[k - 1][0] if k else None, f"commit {k}" if subjects else ""

    def roots(self, rev: str = "HEAD") -> list[str]:
        """The history's one root commit (`Git.roots`)."""
        return [self.log[0][0]]

    def ancestry(self, rev: str = "HEAD") -> Iterator[str]:
        """The commits `rev` reaches, newest first (`Git.ancestry`): a line has no merges."""
        shas = [sha for sha, _ in self.log]
        yield from reversed(shas[: shas.index(rev) + 1])

    def history(self, rev: str = "HEAD", max_count: int | None = None) -> Iterator[tuple[str, list[Change]]]:
        yield from self.log[:max_count]

    def commits(self, rev: str = "HEAD", max_count: int | None = None, subjects: bool = False) -> Iterator[Commit]:
        for (sha, parent, subject), (_, changes) in zip(self.first_parent_commits(rev, max_count, subjects),
                                                        self.log):
            yield Commit(sha, parent, subject, changes)

    def changes(self, commit: str, parent: str | None) -> list[Change]:
        return dict(self.log)[commit]

    def blob(self, sha: str, max_bytes: int | None = None) -> bytes | None:
        data = self.blobs[sha]
        return None if max_bytes is not None and len(data) > max_bytes else data

    def close(self) -> None:
        pass


def use_histories(monkeypatch, histories: dict[str, MemoryGit]) -> None:
    """Replays and builds of the repository path P read `histories[Path(P).name]`."""
    monkeypatch.setattr(git_replay, "Git", lambda repo: histories[Path(repo).name])


def python_history(seed: int, commits: int = 5) -> MemoryGit:
    rng = random.Random(seed)
    lines: list[str] = []
    snaps = []
    for c in range(commits):
        for _ in range(6):
            lines.insert(rng.randrange(len(lines) + 1), f"value_{rng.randrange(1000)} = {rng.randrange(10**6)}")
        snaps.append({**(snaps[-1] if snaps else {}), f"m{c % 2}.py": ("\n".join(lines) + "\n").encode()})
    return MemoryGit(snaps)


def build(out: Path, names: tuple[str, ...] = ("a",), **options) -> dict:
    options = {"rows": ROWS, "cols": COLS, "vocab_size": 300, "block_frames": 32, "progress": False, **options}
    return build_git_dataset([RepoInput(n, Path("/nonexistent") / n) for n in names], out, **options)


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def shard_file(root: Path, suffix: str, k: int = 0) -> Path:
    """The file `suffix` of the manifest's k-th shard (its name carries the build id)."""
    return root / f"{manifest(root)['shards'][k]['name']}.{suffix}"


# -- 1. the line diff --------------------------------------------------------------------------------------


class NullSink:
    def write_rows(self, *args) -> None:
        pass


def test_a_file_of_repeated_lines_is_diffed_in_bounded_time():
    # 12,000 identical lines, one changed at the top and one added at the end: difflib without a bound loops
    # over every pair of equal lines (about 14 s before the fix; the fix: well under a second)
    n = 12_000
    ed = Editor(ROWS, COLS)
    p = Planner(ed, NullSink())
    p.new_file("f.txt")
    p.type("}\n" * n)
    p.do(C["SAVE"])
    new = "{\n" + "}\n" * (n - 1) + "{\n"
    started = time.perf_counter()
    p.edit(ed.files["f.txt"], new)
    assert time.perf_counter() - started < 2.0
    assert ed.text() == new


@pytest.mark.parametrize("seed", range(4))
def test_the_bounded_line_diff_stays_exact(monkeypatch, seed):
    monkeypatch.setattr(git_replay, "LINE_DIFF_PAIRS", 30)  # junk the repeated lines almost always
    rng = random.Random(seed)
    for _ in range(6):
        a = [f"{rng.choice('{}x ')}\n" for _ in range(rng.randrange(0, 60))]
        b = list(a)
        for _ in range(rng.randrange(1, 8)):
            k = rng.randrange(len(b) + 1)
            if rng.random() < 0.5 and k < len(b):
                del b[k]
            else:
                b.insert(k, f"{rng.choice('{}yz')}\n")
        rebuilt = []
        for tag, i1, i2, j1, j2 in git_replay.line_opcodes(a, b):
            assert tag != "equal" or a[i1:i2] == b[j1:j2]
            rebuilt += b[j1:j2]
        assert rebuilt == b
        ed = Editor(ROWS, COLS)
        p = Planner(ed, NullSink())
        p.new_file("f.txt")
        p.type("".join(a))
        p.do(C["SAVE"])
        p.edit("".join(a), "".join(b))
        assert ed.text() == "".join(b)


# -- 2. an oversized blob ----------------------------------------------------------------------------------


class CatFile:
    """`git cat-file --batch`'s pipes, its answers given in advance."""

    def __init__(self, answers: bytes) -> None:
        self.stdin, self.stdout = io.BytesIO(), io.BytesIO(answers)


def test_an_oversized_blob_is_dropped_in_chunks_not_held():
    big = 32 << 20
    git = Git("unused")
    git._cat = CatFile(b"%s blob %d\n" % (b"1" * 40, big) + bytes(big) + b"\n" + b"%s blob 3\nhi\n\n" % (b"2" * 40))
    tracemalloc.start()
    try:
        assert git.blob("1" * 40, max_bytes=1024) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # a chunk at a time (before: the 32 MiB blob read whole, then copied)
    assert git.blob("2" * 40, max_bytes=1024) == b"hi\n"  # the stream stays in step
    git._cat = CatFile(b"%s blob 10\nabc" % (b"3" * 40))
    with pytest.raises(RuntimeError, match="ended"):
        git.blob("3" * 40, max_bytes=4)


# -- 6, 7. names that cannot be typed ----------------------------------------------------------------------


def test_git_output_with_a_name_that_is_not_utf8_parses(monkeypatch):
    sha, blob = "a" * 40, "b" * 40
    raw = b"\x1e%s\0\n:000000 100644 %s %s A\0bad\xff.txt\0" % (sha.encode(), b"0" * 40, blob.encode())
    monkeypatch.setattr(Git, "stream", lambda self, *args: (raw[i : i + 1] for i in range(len(raw))))
    [(commit, [change])] = Git("unused").history()  # parsed as it arrives, here a byte at a time
    assert commit == sha and change.new_path == BAD_NAME and not git_replay.typeable(change.new_path)
    tree = b":000000 100644 %s %s A\0bad\xff.txt\0" % (b"0" * 40, blob.encode())
    monkeypatch.setattr(Git, "run", lambda self, *args: tree)
    assert [c.new_path for c in Git("unused").changes(sha, None)] == [BAD_NAME]


def test_names_that_cannot_be_typed_are_skipped_and_counted(monkeypatch):
    history = MemoryGit([
        {"ok.txt": b"hello\n", BAD_NAME: b"x\n", RESERVED_NAME: b"y\n"},
        {"ok.txt": b"hello\n", BAD_NAME: b"x2\n", RESERVED_NAME: b"y\n", "keep.txt": b"k\n"},
        {BAD_NAME: b"x2\n", RESERVED_NAME: b"y\n", "keep.txt": b"k\n", "x\U000f0001.txt": b"hello\n"},
    ], renames={2: {"ok.txt": "x\U000f0001.txt"}})
    use_histories(monkeypatch, {"r": history})
    actions: list[int] = []
    stats = replay("r", lambda cp, st, a: actions.append(a), ROWS, COLS)
    assert stats.commits == 3 and stats.skipped_name == 4  # added twice, changed once, renamed to once
    assert not [a for a in actions if 0xD800 <= a <= 0xDFFF or git_replay.RESERVED_LOW <= a <= git_replay.RESERVED_HIGH]


def test_a_dataset_of_a_history_with_such_names_round_trips(monkeypatch, tmp_path, capsys):
    from rcswarm.cli.main import main

    use_histories(monkeypatch, {"r": MemoryGit([{"ok.txt": b"hi\n", BAD_NAME: b"x\n", RESERVED_NAME: b"y\n"}])})
    out = tmp_path / "ds"
    (tmp_path / "r").mkdir()  # the command checks the directory is there; its history is the one above
    assert main(["data", "frames", "--repo", str(tmp_path / "r"), "--out", str(out), "--no-progress",
                 "--vocab-size", "256", "--rows", str(ROWS), "--cols", str(COLS)]) == 0
    m = manifest(out)
    assert m["summary"]["skipped_name"] == 2 and m["summary"]["files"] == 1
    tok = ActionTokenizer.load(out / m["tokenizer"])
    acts = np.fromfile(shard_file(out, "actions.u32"), "<u4").tolist()
    assert tok.decode(tok.encode(acts)[0]) == acts


def test_fields_of_megabytes_are_kept_to_their_first_bytes_and_the_stream_stays_in_step(monkeypatch):
    """An untrusted history's commit message or tree entry may be megabytes long (git allows any length): the parser
    keeps a field's first MAX_FIELD_BYTES (before, the whole field was buffered); a path that long is not typeable."""
    sha, parent, blob = "a" * 40, "c" * 40, "b" * 40
    subject, path = b"s" * (4 << 20), b"p" * (4 << 20)
    raw = (b"\x1e%s\x1f%s\0\n:000000 100644 %s %s A\0%s\0:000000 100644 %s %s A\0ok.txt\0\x1e%s %s\x1fnext\0"
           % (sha.encode(), subject, b"0" * 40, blob.encode(), path, b"0" * 40, blob.encode(), parent.encode(),
              sha.encode()))
    step = git_replay.STREAM_CHUNK
    monkeypatch.setattr(Git, "stream", lambda self, *args: (raw[i : i + step] for i in range(0, len(raw), step)))
    tracemalloc.start()
    try:
        first, second = Git("unused")._log("HEAD", None, subjects=True, raw=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert first.sha == sha and first.subject == "s" * (git_replay.MAX_FIELD_BYTES - 42)
    long_path, ok = first.changes
    assert len(long_path.new_path) == git_replay.MAX_FIELD_BYTES and not git_replay.typeable(long_path.new_path)
    assert ok.new_path == "ok.txt" and (second.sha, second.parent, second.subject) == (parent, sha, "next")


class LongSubjects(MemoryGit):
    """A MemoryGit whose commit subjects are 100,000 characters long."""

    def first_parent_commits(self, rev: str = "HEAD", max_count: int | None = None,
                             subjects: bool = False) -> Iterator[tuple[str, str | None, str]]:
        for sha, parent, _ in super().first_parent_commits(rev, max_count, subjects):
            yield sha, parent, "é" * 100_000 if subjects else ""


def test_a_long_subject_is_typed_cut_and_a_path_past_path_max_is_skipped(monkeypatch):
    """One commit must not type megabytes of frames: a subject is typed to MAX_SUBJECT_CHARS characters, a path
    longer than MAX_PATH_CHARS is skipped and counted like a name that is not UTF-8."""
    long_path = "d/" * (git_replay.MAX_PATH_CHARS // 2) + "x.txt"
    use_histories(monkeypatch, {"r": LongSubjects([{"ok.txt": b"hi\n", long_path: b"x\n"}])})
    actions: list[int] = []
    stats = replay("r", lambda cp, st, a: actions.append(a), ROWS, COLS, commit_messages=True)
    assert stats.commits == 1 and stats.skipped_name == 1 and stats.files == 1
    typed = actions[actions.index(C["COMMIT"]) + 1 :]
    assert typed == [ord("é")] * git_replay.MAX_SUBJECT_CHARS + [C["ENTER"]]
    assert git_replay.typeable("d/" * (git_replay.MAX_PATH_CHARS // 2))


# -- 3. a rebuild is published whole or not at all ---------------------------------------------------------


class Interrupted(BaseException):
    pass


def test_an_interrupted_rebuild_leaves_the_previous_dataset_whole(monkeypatch, tmp_path):
    use_histories(monkeypatch, {"a": python_history(0), "b": python_history(1, commits=9)})
    out = tmp_path / "ds"
    build(out, ("a",))
    before = snapshot(out)
    batch = GitFrameSource(out, SPEC).next_batch()

    def interrupt(*args, **kwargs):
        raise Interrupted("Ctrl-C while training the tokenizer")

    monkeypatch.setattr(git_frames.ActionTokenizer, "train", staticmethod(interrupt))
    with pytest.raises(Interrupted):
        build(out, ("b",))
    assert snapshot(out) == before  # before the fix: repo b's shard beside repo a's manifest and tokens
    assert [p.name for p in out.iterdir() if p.name.startswith(".build-")] == []
    again = GitFrameSource(out, SPEC).next_batch()
    assert all(np.array_equal(x, y) for x, y in zip(batch, again))


@pytest.mark.parametrize("moved", [1, 2, 5])
def test_a_rebuild_interrupted_while_publishing_leaves_the_previous_dataset(monkeypatch, tmp_path, moved):
    use_histories(monkeypatch, {"a": python_history(0), "b": python_history(1, commits=9)})
    out = tmp_path / "ds"
    build(out, ("a",))
    before, batch = manifest(out), GitFrameSource(out, SPEC).next_batch()
    real, calls = git_frames.os.replace, []

    def replace_then_stop(src, dst):
        calls.append(dst)
        if len(calls) > moved:
            raise Interrupted("killed while moving the files into place")
        real(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(git_frames.os, "replace", replace_then_stop)
        with pytest.raises(Interrupted):
            build(out, ("b",))
    # The new build's files sit beside the old ones under names of their own; the old manifest still names the old.
    assert manifest(out) == before and len(snapshot(out)) > len(before["shards"]) * 4 + 3
    again = GitFrameSource(out, SPEC).next_batch()  # before the fix: no manifest (moved=1) or none that loads
    assert all(np.array_equal(x, y) for x, y in zip(batch, again))
    build(out, ("b",))  # the next build removes what the unfinished one left
    names = {p.name for p in out.iterdir()} - {".build.lock", "manifest.json"}
    assert names and all(manifest(out)["build"] in name for name in names)


def test_a_rebuild_replaces_the_old_shards_and_keeps_other_files(monkeypatch, tmp_path):
    use_histories(monkeypatch, {"a": python_history(0, commits=9), "b": python_history(1, commits=2)})
    out = tmp_path / "ds"
    build(out, ("a",), frames_per_shard=400)
    (out / "notes.txt").write_text("mine")
    old = manifest(out)
    assert len(old["shards"]) > 2
    build(out, ("b",), frames_per_shard=100_000)
    m = manifest(out)
    assert m["build"] != old["build"] and git_frames.BUILD_ID.fullmatch(m["build"])
    assert [s["name"] for s in m["shards"]] == [f"shard-{m['build']}-00000"] and m["repos"][0]["name"] == "b"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".build.lock", "manifest.json", f"tokenizer-{m['build']}.json", "notes.txt",
         *(f"shard-{m['build']}-00000.{e}" for e in ("rcf", "actions.u32", "tokens.npy", "starts.npy"))])
    assert m["tokenizer"] == f"tokenizer-{m['build']}.json"
    GitFrameSource(out, SPEC).next_batch()


def test_a_reader_of_the_old_build_never_reads_the_new_one(monkeypatch, tmp_path):
    """The review's repro: a run reads split "train" while the dataset is rebuilt with a held-out history first.
    Before the fix the rebuild overwrote shard-00000.* in place, and the reader, reopening shard 0's .rcf by name
    beside its old memory-mapped tokens, served the held-out history's frames as training frames."""
    use_histories(monkeypatch, {"a": python_history(0, commits=9), "other": python_history(7, commits=9)})
    out = tmp_path / "ds"
    build(out, ("a",), frames_per_shard=400)
    src = GitFrameSource(out, SPEC, max_open=1, split="train")
    assert len(src.shards) > 2
    mid = src.shards[0]["tokens"] // 2  # (the first frames of both histories are alike: a new file m0.py)
    first = src.window(0, mid)
    src.window(1, 0)  # shard 0's reader is closed (max_open=1); its token arrays stay mapped
    build_git_dataset([RepoInput("other", Path("/nonexistent/other"), held_out=True),
                       RepoInput("a", Path("/nonexistent/a"))], out, ROWS, COLS, vocab_size=300, block_frames=32,
                      frames_per_shard=400, progress=False)
    m = manifest(out)
    assert m["shards"][0]["repo"] == "other" and m["shards"][0]["split"] == "val"
    with pytest.raises(ValueError, match=r"-00000\.rcf: no such file: the dataset at .* was rebuilt") as err:
        src.window(0, mid)  # before the fix: history "other"'s (held-out) frames beside history a's tokens
    assert f"(build {src.manifest['build']}; the manifest now names build {m['build']})" in str(err.value)
    # A reader opened now reads the new build: "train" is history a's shards only, and a's frames are the same.
    new = GitFrameSource(out, SPEC, max_open=1, split="train")
    assert {s["repo"] for s in new.shards} == {"a"}
    k = next(i for i, s in enumerate(new.shards) if s["frames"] == src.shards[0]["frames"])
    assert all(np.array_equal(x, y) for x, y in zip(new.window(k, mid), first))


def _to_the_names_before_build_ids(d: Path) -> None:
    """Rename a dataset's files and manifest to the layout of datasets built before build ids."""
    m = manifest(d)
    build = m.pop("build")
    for path in d.iterdir():
        path.rename(d / path.name.replace(f"-{build}", ""))
    m["tokenizer"] = "tokenizer.json"
    for sh in m["shards"]:
        sh["name"] = sh["name"].replace(f"-{build}", "")
    (d / "manifest.json").write_text(json.dumps(m))


def test_a_dataset_built_before_build_ids_reads_and_a_rebuild_replaces_it(monkeypatch, tmp_path):
    use_histories(monkeypatch, {"a": python_history(0, commits=9), "b": python_history(1, commits=2)})
    out = tmp_path / "ds"
    build(out, ("a",), frames_per_shard=400)
    batch = GitFrameSource(out, SPEC).next_batch()
    _to_the_names_before_build_ids(out)
    assert (out / "shard-00000.rcf").is_file() and (out / "tokenizer.json").is_file()
    again = GitFrameSource(out, SPEC).next_batch()
    assert all(np.array_equal(x, y) for x, y in zip(batch, again))
    build(out, ("b",))
    build_id = manifest(out)["build"]
    assert all(build_id in p.name for p in out.iterdir() if p.name not in (".build.lock", "manifest.json"))


def test_staging_folders_a_killed_build_left_are_removed(monkeypatch, tmp_path):
    use_histories(monkeypatch, {"a": python_history(0)})
    out = tmp_path / "ds"
    (out / ".build-k1ll3d").mkdir(parents=True)
    (out / ".build-k1ll3d" / "shard-00000.rcf").write_bytes(bytes(1000))
    (out / ".build-notes.txt").write_text("a file, not a staging folder: left alone")
    build(out, ("a",))
    assert not (out / ".build-k1ll3d").exists()  # before the fix: left there for good
    assert (out / ".build-notes.txt").is_file()
    assert [p.name for p in out.iterdir() if p.is_dir()] == []


class Terminated(Exception):
    """Stands in for SIGTERM's default action (the process ends on the spot, no `finally` runs)."""


def test_sigterm_during_a_build_exits_143_and_leaves_no_staging_folder(monkeypatch, tmp_path):
    from rcswarm.cli.main import main

    use_histories(monkeypatch, {"r": python_history(0)})
    (tmp_path / "r").mkdir()
    out = tmp_path / "ds"
    staged = []

    def terminate(*args, **kwargs):
        staged.extend(p.name for p in out.iterdir() if p.name.startswith(".build-"))
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the build")

    def default_action(signum, frame):
        raise Terminated(f"signal {signum}")

    monkeypatch.setattr(git_frames.ActionTokenizer, "train", staticmethod(terminate))
    previous = signal.signal(signal.SIGTERM, default_action)
    try:
        with pytest.raises(SystemExit) as exit_:  # before the fix: Terminated (the CLI left SIGTERM alone)
            main(["data", "frames", "--repo", str(tmp_path / "r"), "--out", str(out), "--no-progress",
                  "--vocab-size", "256", "--rows", str(ROWS), "--cols", str(COLS)])
        assert exit_.value.code == 143
        assert signal.getsignal(signal.SIGTERM) is default_action  # the CLI put the handler back
    finally:
        signal.signal(signal.SIGTERM, previous)
    # A first build into `out`: nothing of it is left, not even the directory and its build lock.
    assert staged and not out.exists()


def test_the_head_of_a_history_is_the_last_commit_replayed(monkeypatch, tmp_path):
    history = python_history(0, commits=9)
    use_histories(monkeypatch, {"a": history})
    summary = build(tmp_path / "ds", ("a",), max_commits=3)
    m = manifest(tmp_path / "ds")
    third = history.log[2][0]
    assert m["repos"][0]["head"] == summary["repos"][0]["head"] == third  # before: HEAD, commit 9
    build(tmp_path / "all", ("a",))
    assert manifest(tmp_path / "all")["repos"][0]["head"] == history.log[-1][0]


# -- 4. crafted dataset files -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "ds"
    with pytest.MonkeyPatch.context() as mp:
        use_histories(mp, {"a": python_history(0)})
        build(out, ("a",))
    return out


def _edit_manifest(change):
    def mutate(d: Path) -> None:
        m = json.loads((d / "manifest.json").read_text())
        change(m)
        (d / "manifest.json").write_text(json.dumps(m))
    return mutate


def _edit_array(suffix: str, change):
    def mutate(d: Path) -> None:
        path = shard_file(d, suffix)
        array = change(np.load(path))
        with open(path, "wb") as f:  # np.save would add ".npy" to a name that does not end with it
            np.save(f, array, allow_pickle=False)
    return mutate


def _cut_tokens(d: Path) -> None:
    p = shard_file(d, "tokens.npy")
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _trailer_frames(d: Path) -> None:
    p = shard_file(d, "rcf")
    b = bytearray(p.read_bytes())
    off, nb, nf, crc, end = fc.TRAILER.unpack(b[-fc.TRAILER.size :])
    b[-fc.TRAILER.size :] = fc.TRAILER.pack(off, nb, nf + 10**6, crc, end)
    p.write_bytes(bytes(b))


CRAFTED = {
    "ids past the vocabulary": (_edit_array("tokens.npy", lambda t: t * 0 + 4_000_000_000), r"tokens\.npy: ids in"),
    "float ids": (_edit_array("tokens.npy", lambda t: t.astype(np.float64) + 0.7), r"tokens\.npy: dtype float64"),
    "2-D ids": (_edit_array("tokens.npy", lambda t: t.reshape(1, -1)), r"tokens\.npy: .*expected a 1-D array"),
    "a cut .npy": (_cut_tokens, r"tokens\.npy: not a readable \.npy array"),
    "a .npy of zero bytes": (lambda d: shard_file(d, "tokens.npy").write_bytes(b""),
                             r"tokens\.npy: not a readable \.npy array: EOFError"),
    "fewer tokens than the manifest says": (_edit_array("tokens.npy", lambda t: t[:20]), r"20 ids .* expected \d+"),
    "negative starts": (_edit_array("starts.npy", lambda s: s * 0 - 1), r"starts\.npy: starts from -1"),
    "starts past the frames": (_edit_array("starts.npy", lambda s: s * 0 + 10**9), r"starts\.npy: .*expected non-dec"),
    "decreasing starts": (_edit_array("starts.npy", lambda s: s[::-1].copy()), r"starts\.npy: .*non-decreasing"),
    "a manifest without rows": (_edit_manifest(lambda m: m.pop("rows")), r"manifest\.json: rows = None"),
    "a shard name with a path": (_edit_manifest(lambda m: m["shards"][0].update(name="../base/shard-00000")),
                                 r"manifest\.json: shard name '\.\./base/shard-00000'"),
    "a shard name of another build": (
        _edit_manifest(lambda m: m["shards"][0].update(name=f"shard-{'0' * 16}-00000")),
        r"manifest\.json: shard name 'shard-0{16}-00000': expected 'shard-[0-9a-f]{16}-' \(the build\)"),
    "a shard name without the build": (_edit_manifest(lambda m: m["shards"][0].update(name="shard-00000")),
                                       r"manifest\.json: shard name 'shard-00000'"),
    "a build id that is not one": (_edit_manifest(lambda m: m.update(build="../x")), r"manifest\.json: build = '\.\./x'"),
    "a tokenizer outside the directory": (_edit_manifest(lambda m: m.update(tokenizer="../t.json")),
                                          r"manifest\.json: tokenizer = '\.\./t\.json'"),
    "a manifest whose rows differ from the .rcf": (_edit_manifest(lambda m: m.update(rows=m["rows"] + 1)),
                                                   r"shard-[0-9a-f]{16}-00000\.rcf: \d+ frames of 16x64: expected"),
    "rows past the frame format": (_edit_manifest(lambda m: m.update(rows=70000)),
                                   r"manifest\.json: rows = 70000: expected an integer in 1\.\.65535"),
    "a manifest whose frames differ from the .rcf": (_edit_manifest(lambda m: m["shards"][0].update(frames=5)),
                                                     r"starts\.npy: .*in 0\.\.4"),
    "a shard of 10**30 tokens": (_edit_manifest(lambda m: m["shards"][0].update(tokens=10**30)),
                                 (rf"manifest\.json: shard shard-[0-9a-f]{{16}}-00000: tokens = {10**30}: expected "
                                  r"an integer in 0\.\.9007199254740991")),
    "a history list that is null": (_edit_manifest(lambda m: m.update(repos=None)), r"manifest\.json: repos = None"),
    "an .rcf trailer claiming more frames": (_trailer_frames, r"shard-[0-9a-f]{16}-00000\.rcf: the trailer says \d+ frames"),
    "no manifest": (lambda d: (d / "manifest.json").unlink(), r"manifest\.json: no such file"),
    "another format": (_edit_manifest(lambda m: m.update(format="x")), r"manifest\.json: expected a JSON object"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_dataset_is_refused_naming_the_file(dataset, tmp_path, case):
    mutate, message = CRAFTED[case]
    d = tmp_path / "ds"
    shutil.copytree(dataset, d)
    mutate(d)
    with pytest.raises(ValueError, match=message):
        src = GitFrameSource(d, SPEC, char_vocab=256, split="train")
        for _ in range(3):
            src.next_batch()


@pytest.mark.parametrize("repos", [None, "ab", [1], [{"name": "a"}], [{"name": 3, "split": "val"}], {"a": 1}])
def test_a_malformed_history_list_is_refused_naming_the_file(dataset, tmp_path, repos):
    d = tmp_path / "ds"
    shutil.copytree(dataset, d)
    _edit_manifest(lambda m: m.update(repos=repos))(d)
    for split in ("val", "train", None):  # before the fix: TypeError or AttributeError for split "val"
        with pytest.raises(ValueError, match=r"manifest\.json: repos = .*: expected a list of objects, each with a name"):
            GitFrameSource(d, SPEC, split=split)


@pytest.mark.parametrize("option, value", [("char_vocab", 0), ("char_vocab", -7), ("char_vocab", True),
                                           ("max_open", 0), ("max_open", -1), ("max_open", 2.5)])
def test_the_sources_own_arguments_are_checked(dataset, option, value):
    """char_vocab 0 or -7 served frames of char ids 0 or -6..0 without a word, and max_open 0 failed on its first batch
    with "seek of closed file"; now each is a ValueError naming the argument and its value."""
    with pytest.raises(ValueError, match=rf"GitFrameSource\.{option}={value!r}: expected a positive int"):
        GitFrameSource(dataset, SPEC, **{option: value}).next_batch()


def test_an_unchanged_copy_of_the_dataset_loads(dataset, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(dataset, d)
    frames, actions = GitFrameSource(d, SPEC, char_vocab=256, split="train").next_batch()
    assert frames.shape == (2, 8, ROWS, COLS, 2) and int(actions.max()) < 300


# -- 5. a zlib bomb in an .rcf block ------------------------------------------------------------------------


def _rcf_with_one_block(path: Path, comp: bytes, raw_len: int, raw_crc: int, comp_len: int | None = None,
                        rows: int = 12, cols: int = 40, block_frames: int = 64, count: int = 1) -> None:
    head = fc.HEADER.pack(fc.MAGIC, fc.VERSION, rows, cols, block_frames, 9)
    f = bytearray(head + struct.pack("<I", zlib.crc32(head)))
    offset = len(f)
    f += fc.BLOCK_HEADER.pack(fc.BLOCK_MAGIC, 0, count, raw_len, len(comp) if comp_len is None else comp_len,
                              raw_crc, zlib.crc32(comp)) + comp
    index = fc.INDEX_ENTRY.pack(offset, 0, count)
    at = len(f)
    f += index + fc.TRAILER.pack(at, 1, count, zlib.crc32(index), fc.END_MAGIC)
    path.write_bytes(bytes(f))


def _rcf_of_blank_frames(path: Path, count: int, rows: int, cols: int) -> None:
    """One block of `count` blank frames (action 0, no row changed): a few hundred bytes whatever the count."""
    raw = bytearray()
    for part in (bytes(count), bytes(count), b""):  # actions, operations (a head of 0 rows a frame), text
        fc._varint(len(part), raw)
        raw += part
    _rcf_with_one_block(path, zlib.compress(bytes(raw), 9), len(raw), zlib.crc32(raw), rows=rows, cols=cols,
                        block_frames=count, count=count)


def test_a_block_past_the_decode_budget_is_refused_when_the_file_is_opened(tmp_path):
    path = tmp_path / "wide.rcf"
    _rcf_of_blank_frames(path, 65535, 48, 160)  # decodes to 65535 x 48 x 160 x 5 bytes = 2.3 GiB
    assert path.stat().st_size < 1000
    with pytest.raises(fc.FrameFormatError, match=r"wide\.rcf: block_frames x rows x cols = 65535 x 48 x 160 decodes "
                                                  r"to 2,516,544,000 bytes a block .* at most 268,435,456"):
        fc.FrameReader(path)  # before the fix: opened, and frame(0) peaked at 2.4 GiB
    within = tmp_path / "ok.rcf"
    _rcf_of_blank_frames(within, 6990, 48, 160)  # the most frames a block of 48 x 160 may hold
    with fc.FrameReader(within) as r:
        assert len(r) == 6990 and not r.frame(6989)[..., 1].any() and r.action(0) == 0


def test_the_writer_and_the_build_options_keep_to_the_decode_budget(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"65535 x 48 x 160 decodes to .* \(DECODED_BLOCK_BUDGET; at most 6990 frames"):
        fc.FrameWriter(tmp_path / "w.rcf", 48, 160, block_frames=65535)
    assert not (tmp_path / "w.rcf").exists()
    with pytest.raises(ValueError, match=r"rows=70000: expected an integer in 1\.\.65535"):
        fc.FrameWriter(tmp_path / "w.rcf", 70000, 160)  # before: struct.error
    use_histories(monkeypatch, {"a": python_history(0)})
    with pytest.raises(ValueError, match=r"6991 x 48 x 160 decodes to"):
        build(tmp_path / "ds", ("a",), rows=48, cols=160, block_frames=6991)
    assert not (tmp_path / "ds").exists()


def test_a_block_that_inflates_past_its_raw_len_is_refused_without_inflating_it(tmp_path):
    path = tmp_path / "bomb.rcf"
    _rcf_with_one_block(path, zlib.compress(bytes(16 << 20), 9), 10, zlib.crc32(bytes(10)))
    tracemalloc.start()
    try:
        with pytest.raises(fc.FrameFormatError, match="decompresses to more than its 10 raw bytes"):
            fc.FrameReader(path).frame(0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20  # before the fix: the 16 MiB inflated whole


def test_block_sizes_past_what_the_format_allows_are_refused(tmp_path):
    path = tmp_path / "x.rcf"
    comp = zlib.compress(b"abc")
    limit = fc.max_raw_len(1, 12, 40)
    _rcf_with_one_block(path, comp, limit + 1, 0)
    with pytest.raises(fc.FrameFormatError, match=f"claims {len(comp)} compressed and {limit + 1} raw bytes"):
        fc.FrameReader(path).frame(0)
    _rcf_with_one_block(path, comp, 3, zlib.crc32(b"abc"), comp_len=1 << 31)
    with pytest.raises(fc.FrameFormatError, match=r"claims 2147483648 compressed .* expected at most \d+ and"):
        fc.FrameReader(path).frame(0)
    _rcf_with_one_block(path, comp[:-2], 3, zlib.crc32(b"abc"))  # the stream's end cut off
    with pytest.raises(fc.FrameFormatError, match="decompresses to 3 bytes, not its 3 raw bytes"):
        fc.FrameReader(path).frame(0)


# -- 8. count flags and the [data] table ------------------------------------------------------------------


@pytest.mark.parametrize("flag, value", [("--max-commits", "-1"), ("--max-commits", "0"),
                                         ("--frames-per-shard", "0"), ("--max-file-bytes", "-1"),
                                         ("--block-frames", "0"), ("--vocab-size", "255")])
def test_a_count_flag_below_its_least_value_is_a_usage_error(monkeypatch, tmp_path, capsys, flag, value):
    from rcswarm.cli.main import main

    use_histories(monkeypatch, {"r": python_history(0)})
    out = tmp_path / "ds"
    (tmp_path / "r").mkdir()  # the command checks the directory is there; its history is the one above
    assert main(["data", "frames", "--repo", str(tmp_path / "r"), "--out", str(out), "--no-progress",
                 "--rows", str(ROWS), "--cols", str(COLS), flag, value]) == 2
    assert f"{flag} {value}: expected an integer >=" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("option, value", [("max_commits", 0), ("max_commits", -1), ("frames_per_shard", 0),
                                           ("max_file_bytes", -1), ("vocab_size", 100), ("rows", 2), ("rows", 70000),
                                           ("cols", 23), ("cols", 65536), ("block_frames", 65536)])
def test_build_options_are_checked_before_any_replay(monkeypatch, tmp_path, option, value):
    use_histories(monkeypatch, {"a": python_history(0)})
    with pytest.raises(ValueError, match=f"{option}={value}: expected an integer"):
        build(tmp_path / "ds", ("a",), **{option: value})
    assert not (tmp_path / "ds").exists()
    if option in ("max_commits", "max_file_bytes"):
        with pytest.raises(ValueError, match=f"{option}={value}"):
            replay("a", lambda *a: None, ROWS, COLS, **{option: value})


@pytest.mark.parametrize("flag, value, message", [
    ("--rows", "70000", "--rows 70000: expected an integer in 3..65535"),  # before the fix: struct.error
    ("--cols", "10", "--cols 10: expected an integer in 24..65535"),
    ("--block-frames", "60000", "block_frames x rows x cols = 60000 x 48 x 160 decodes to"),
])
def test_a_geometry_the_format_cannot_hold_is_a_usage_error(monkeypatch, tmp_path, capsys, flag, value, message):
    from rcswarm.cli.main import main

    use_histories(monkeypatch, {"r": python_history(0)})
    out = tmp_path / "ds"
    (tmp_path / "r").mkdir()
    args = ["data", "frames", "--repo", str(tmp_path / "r"), "--out", str(out), "--no-progress", flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "rcswarm data frames" in err and message in err
    assert not out.exists()


@pytest.mark.parametrize("task_config, message", [
    ({}, r"data\.task_config\.dataset = None is invalid"),
    ({"dataset": ""}, r"data\.task_config\.dataset = '' is invalid"),
    ({"dataset": 3}, r"data\.task_config\.dataset = 3 is invalid"),
    ({"dataset": "d", "typo": 1}, r"data\.task_config = .* only the key \"dataset\""),
])
def test_a_git_data_section_needs_a_dataset(task_config, message):
    with pytest.raises(ValueError, match=message):
        DataSection(source="git", task_config=task_config)
    assert DataSection(source="git", task_config={"dataset": "data/git-frames"}).task_config["dataset"]


def test_replay_stats_count_names_with_the_other_skips():
    assert "skipped_name" in git_frames.SUMMARY_COUNTS and ReplayStats().skipped_name == 0


# -- 7. the twentieth session's review (docs/RELIABILITY.md, "Reviews of the twentieth session") -----------------


def test_a_long_line_with_a_character_that_is_not_ascii_replays_in_bounded_memory():
    """A 20,000-character line of JSON with one 'é' took 65 s and 5.7 GB to replay (each keystroke laid the whole
    line out again, and the layout cache kept 8,192 versions of it); 4,000 characters here: 278 MiB traced before,
    well under 16 MiB now."""
    text = '{"k": "é' + "abcdefghi " * 400 + '"}\n'
    ed = Editor(ROWS, COLS)
    p = Planner(ed, NullSink())
    p.new_file("t.json")
    tracemalloc.start()
    try:
        started = time.perf_counter()
        p.edit("", text)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    p.do(C["SAVE"])
    assert ed.files["t.json"] == text
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB traced"
    assert elapsed < 10, f"{elapsed:.1f} s"


@pytest.mark.parametrize("seed", range(6))
def test_long_lines_and_prompts_are_laid_out_as_the_whole_line_layout_does(monkeypatch, seed):
    """The editor lays out a line or prompt longer than SHORT_LINE a window at a time from the display columns it
    keeps across edits; every screen must be the one the whole-line layout gives (tabs, wide characters, combining
    marks and controls, scrolled sideways, long prompts cut to their tail)."""
    from rcswarm.data.frames import git_editor

    rng = random.Random(seed)
    windowed, whole = Editor(6, 30), Editor(6, 30)
    alphabet = ["a", "b", "x", " ", "\t", "é", "漢", "字", "\x01", "\u0301", "\n"]
    controls = ["UP", "DOWN", "LEFT", "RIGHT", "HOME", "END", "BACKSPACE", "DELETE", "KILL_LINE", "SAVE", "GOTO",
                "ENTER", "ESC", "COMMIT", "PGUP", "PGDN", "TREE", "NEW_FILE", "RENAME"]
    codes = [C["NEW_FILE"], *map(ord, "f\t漢" * 3), C["ENTER"]]
    codes += [ord(rng.choice(alphabet)) if rng.random() < 0.6 else C[rng.choice(controls)] for _ in range(1500)]
    for step, code in enumerate(codes):
        monkeypatch.setattr(git_editor, "SHORT_LINE", 3)
        windowed.apply(code)
        got = windowed.render()
        monkeypatch.setattr(git_editor, "SHORT_LINE", 10**9)
        whole.apply(code)
        want = whole.render()
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), f"step {step}: {code}"


def test_git_runs_without_lazy_fetches_transports_or_another_repository(monkeypatch):
    """A partial clone's config ran a command of the repository's choosing: reading a blob the clone lacks fetched it
    from `remote.origin.url` through `core.sshCommand` (the review's repro touched a file); and GIT_DIR in the
    environment (a git hook) made `git -C REPO` read another repository."""
    argv = git_replay.git_argv("/r", "log")
    assert argv[:3] == ["git", "-C", "/r"] and argv[-1] == "log"
    assert "protocol.allow=never" in argv and "core.fsmonitor=false" in argv
    env = git_replay.git_env({"GIT_DIR": "/other/.git", "GIT_OBJECT_DIRECTORY": "/o", "HOME": "/h", "PATH": "/bin"})
    assert env == {"HOME": "/h", "PATH": "/bin", "GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0"}
    seen = []

    class Done:
        returncode, stdout, stderr = 0, b"", b""

    def record(args, **kwargs):
        seen.append((args, kwargs.get("env")))
        return Done()

    monkeypatch.setenv("GIT_DIR", "/other/.git")
    monkeypatch.setattr(git_replay.subprocess, "run", record)
    Git("/r").run("log")
    Git("/r").history_problem()
    assert seen and all("protocol.allow=never" in args and env is not None and "GIT_DIR" not in env
                        and env["GIT_NO_LAZY_FETCH"] == "1" for args, env in seen)
    assert all("-O/dev/null" in args for args, _ in _git_commands_of_a_replay(monkeypatch))


def _git_commands_of_a_replay(monkeypatch) -> list[tuple[list[str], dict | None]]:
    """The git commands `Git.history` and `Git.changes` run (their output empty)."""
    seen = []
    monkeypatch.setattr(Git, "run", lambda self, *args: seen.append((list(args), None)) or b"")
    monkeypatch.setattr(Git, "stream", lambda self, *args: seen.append((list(args), None)) or (b for b in ()))
    assert list(Git("/r").history()) == []
    Git("/r").changes("a" * 40, "b" * 40)
    return seen


def test_a_build_into_a_directory_of_other_files_keeps_their_tokenizer_json(monkeypatch, tmp_path):
    """`--out` a model's directory: its `tokenizer.json` (and a `shard-00001.rcf` of its own) were deleted as files
    of an earlier build, though no manifest named them."""
    use_histories(monkeypatch, {"a": python_history(0)})
    out = tmp_path / "model"
    out.mkdir()
    (out / "tokenizer.json").write_text('{"mine": true}')
    (out / "shard-00001.rcf").write_bytes(b"mine")
    build(out, ("a",))
    build(out, ("a",))
    assert (out / "tokenizer.json").read_text() == '{"mine": true}' and (out / "shard-00001.rcf").read_bytes() == b"mine"
    assert {p.name for p in out.iterdir() if manifest(out)["build"] not in p.name} == {
        ".build.lock", "manifest.json", "tokenizer.json", "shard-00001.rcf"}
    GitFrameSource(out, SPEC).next_batch()


def test_a_held_out_history_that_shares_commits_with_a_training_one_is_refused(monkeypatch, tmp_path):
    """The same repository given twice (`--repo a=R --repo b=R --held-out b`), or a fork, put the held-out
    history's frames into the training split: built without a word before."""
    same, fork = python_history(0, commits=6), python_history(0, commits=8)  # the fork: the same 6 commits, 2 more
    use_histories(monkeypatch, {"a": same, "b": same, "c": fork, "d": python_history(1)})
    for names in (("a", "b"), ("a", "c")):
        out = tmp_path / "-".join(names)
        with pytest.raises(ValueError, match=rf"held-out repository {names[1]} .* shares commit {same.log[0][0]} "
                                             rf"with training repository {names[0]}"):
            build_git_dataset([RepoInput(names[0], Path("/x") / names[0]),
                               RepoInput(names[1], Path("/x") / names[1], held_out=True)], out, ROWS, COLS,
                              vocab_size=300, progress=False)
        assert not out.exists()
    # histories that share no commit are built
    build_git_dataset([RepoInput("a", Path("/x/a")), RepoInput("d", Path("/x/d"), held_out=True)], tmp_path / "ok",
                      ROWS, COLS, vocab_size=300, progress=False)
    assert {r["name"]: r["split"] for r in manifest(tmp_path / "ok")["repos"]} == {"a": "train", "d": "val"}


def test_the_command_replaces_an_existing_dataset_only_with_overwrite(monkeypatch, tmp_path, capsys):
    """`rcswarm data frames --out DIR` replaced the dataset DIR held without a word (a typo in --out lost a
    dataset that took hours); now it is a usage error naming the directory unless --overwrite is given."""
    from rcswarm.cli.main import main

    use_histories(monkeypatch, {"r": python_history(0), "s": python_history(1)})
    for name in ("r", "s"):
        (tmp_path / name).mkdir()
    out = tmp_path / "ds"
    flags = ["--out", str(out), "--no-progress", "--vocab-size", "256", "--rows", str(ROWS), "--cols", str(COLS)]
    assert main(["data", "frames", "--repo", str(tmp_path / "r"), *flags]) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(["data", "frames", "--repo", str(tmp_path / "s"), *flags]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(out)!r} already holds a dataset" in err and "--overwrite" in err, err
    assert snapshot(out) == before
    assert main(["data", "frames", "--repo", str(tmp_path / "s"), *flags, "--overwrite"]) == 0
    assert manifest(out)["repos"][0]["name"] == "s"


def test_the_launchers_check_opens_the_held_out_split_at_every_length_a_run_asks(monkeypatch, tmp_path):
    """A held-out history shorter than a run's windows passed the launcher's check (it opened the training split only)
    and each worker of that length died at its start; `rcswarm run` then ended in a traceback from its evaluation."""
    from rcswarm.config.runspec import RunSpec
    from rcswarm.train.inner import data_problem

    use_histories(monkeypatch, {"a": python_history(0, commits=9), "b": python_history(1, commits=1)})
    out = tmp_path / "ds"
    build_git_dataset([RepoInput("a", Path("/nonexistent/a")), RepoInput("b", Path("/nonexistent/b"), held_out=True)],
                      out, ROWS, COLS, vocab_size=300, block_frames=32, progress=False)
    val_tokens = max(s["tokens"] for s in git_frames.dataset_shards(manifest(out), "val"))
    train_tokens = max(s["tokens"] for s in git_frames.dataset_shards(manifest(out), "train"))
    length = (val_tokens + train_tokens) // 2  # the training histories have it, the held-out one does not
    assert val_tokens < length <= train_tokens

    def spec(**run) -> RunSpec:
        return RunSpec.from_dict({
            "model": {"name": "frame", "preset": "small", "overrides": {"rows": ROWS, "cols": COLS}},
            "data": {"source": "git", "seq_len": length, "task_config": {"dataset": str(out)}}, "run": run})

    problem = data_problem(spec(), open_dataset=True)
    assert problem is not None and problem.startswith(f"data.seq_len = {length}: windows of {length} frames: "), problem
    assert "split 'val'" in problem and "window longer than the data" in problem, problem
    assert data_problem(spec(eval_seq_len=val_tokens), open_dataset=True) is None
