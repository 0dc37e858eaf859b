"""Git histories replayed as editor frames, on repositories made with `git` (the replay runs `git` too): replay
invariant, dataset and loader, CLI, lazy windows, the worker training on the frames."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rcswarm.data.frames import FrameWindow
from rcswarm.data.frames.action_tokenizer import ActionTokenizer
from rcswarm.data.frames.frame_codec import FrameReader, FrameWriter
from rcswarm.data.frames.git_editor import C, Editor, ReplayError
from rcswarm.data.frames.git_frames import GitFrameSource, build_git_frames
from rcswarm.data.frames.git_replay import replay
from rcswarm.data.frames.window import FrameWindowSource, FrameWindowSpec, check_frame_batch
from tests.helpers.data import COLS, ROWS, _assert_chunks_make_the_batch
from tests.helpers.git_repo import _commit, _git, make_repo, make_second_repo

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return make_repo(tmp_path_factory.mktemp("gitframes"))


@pytest.fixture(scope="module")
def dataset(repo, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ds")
    summary = build_git_frames(repo, out, ROWS, COLS, vocab_size=300, block_frames=32, frames_per_shard=1500, progress=False)
    return out, summary


def _head_files(repo: Path) -> dict[str, bytes]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    return {p: (repo / p).read_bytes() for p in out.decode().split("\0") if p}


def test_replay_matches_every_commit(repo):
    frames = []

    def sink(cp, st, a):
        frames.append(a)

    stats = replay(str(repo), sink, ROWS, COLS)
    assert stats.commits == 7  # every commit checked inside replay (ReplayError otherwise)
    assert stats.skipped_binary == 2 and stats.skipped_other == 1
    assert stats.actions == len(frames) > 500
    # independently, re-run and compare the final editor file system with HEAD
    ed = Editor(ROWS, COLS)
    from rcswarm.data.frames import git_replay

    orig = git_replay.Editor
    git_replay.Editor = lambda r, c: ed
    try:
        replay(str(repo), lambda *a: None, ROWS, COLS)
    finally:
        git_replay.Editor = orig
    head = {p: b.decode() for p, b in _head_files(repo).items() if p not in ("notrail.txt", "link")}
    assert "bin.dat" in head and "ünï/中文.txt" in head
    assert ed.files == head


def test_replay_error_names_commit_and_path(repo, monkeypatch):
    from rcswarm.data.frames import git_replay

    real = git_replay.Planner.edit

    def broken(self, old, new):
        real(self, old, new)
        self.type("!")  # one extra character

    monkeypatch.setattr(git_replay.Planner, "edit", broken)
    with pytest.raises(ReplayError, match=r"commit [0-9a-f]{40}: path '"):
        replay(str(repo), lambda *a: None, ROWS, COLS)


def test_dataset_and_loader(dataset):
    out, summary = dataset
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["shards"]) >= 2 and summary["frames"] == summary["actions"]
    assert summary["ratio"] > 20
    tok = ActionTokenizer.load(out / m["tokenizer"])
    total = 0
    for sh in m["shards"]:
        acts = np.fromfile(out / f"{sh['name']}.actions.u32", dtype="<u4").astype(np.int64)
        ids = np.load(out / f"{sh['name']}.tokens.npy")
        assert tok.decode(ids.tolist()) == acts.tolist()
        with FrameReader(out / f"{sh['name']}.rcf") as r:
            assert np.array_equal(r.actions(0, 50), acts[:50])
        total += len(acts)
    assert total == summary["actions"]
    spec = FrameWindowSpec(batch_size=3, window=12, seed=5)
    src = GitFrameSource(out, spec, char_vocab=8192)
    assert isinstance(src, FrameWindowSource)
    frames, actions = src.next_batch()
    check_frame_batch(src, spec, (frames, actions))
    assert frames.shape == (3, 12, ROWS, COLS, 2)
    # alignment: frame t is the frame before token t's first action
    k, off = 0, 7
    f, a = src.window(k, off)
    starts = np.load(out / f"{m['shards'][0]['name']}.starts.npy")
    with FrameReader(out / f"{m['shards'][0]['name']}.rcf") as r:
        for t in range(12):
            ref = r.frame(int(starts[off + t]))
            ref[..., 0] %= 8192  # char id = code point mod char_vocab (the tree separator is U+2502)
            assert np.array_equal(f[t], ref)
            # token t's actions are exactly the primitive actions from its start up to the next token's start
        acts = r.actions(int(starts[off]), int(starts[off + 12]) - int(starts[off]))
    assert tok.decode(a.tolist()) == acts.tolist()
    again = GitFrameSource(out, spec).next_batch()
    assert torch.equal(again[0], frames) and torch.equal(again[1], actions)


def test_cli_end_to_end(repo, tmp_path, capsys):
    from rcswarm.cli.main import main

    out = tmp_path / "cli"
    rc = main(["data", "frames", "--repo", str(repo), "--out", str(out), "--rows", "12", "--cols", "48",
               "--vocab-size", "280", "--no-progress", "--max-commits", "3", "--commit-messages"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["rows"] == 12 and m["cols"] == 48 and m["summary"]["commits"] == 3
    acts = np.fromfile(out / f"{m['shards'][0]['name']}.actions.u32", dtype="<u4").astype(np.int64).tolist()
    assert acts.count(C["COMMIT"]) == 3
    i = acts.index(C["COMMIT"])
    assert "".join(chr(a) for a in acts[i + 1 : i + 10]) == "new files"
    assert "ratio" in capsys.readouterr().out
    assert main(["data"]) == 2


def test_a_history_that_cannot_be_replayed_is_refused_before_anything_is_written(repo, tmp_path, capsys):
    from rcswarm.cli.main import main

    empty, plain, out = tmp_path / "empty", tmp_path / "plain", tmp_path / "ds"
    empty.mkdir()
    plain.mkdir()
    _git(empty, "init", "-q")
    for bad, said in ((empty, "its HEAD names no commit (an empty repository"), (plain, "not a git repository")):
        # The bad one after a good one: refused before the good one is replayed, not after.
        rc = main(["data", "frames", "--repo", str(repo), "--repo", str(bad), "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and f"repository {bad.name} ({bad}): {said}" in err, err  # before: git's raw error, rc 1
        assert not out.exists()  # before: an empty directory holding .build.lock


def test_stored_frames_equal_rendered_frames(repo, tmp_path):
    """Frames written during replay decode bit-exactly to what the editor rendered."""
    shown, actions = [], []
    path = tmp_path / "s.rcf"
    w = FrameWriter(path, ROWS, COLS, block_frames=64)

    def sink(cp, st, a):
        w.write(cp, st, a)
        if len(shown) < 700:
            shown.append(np.stack([cp.astype(np.int64), st.astype(np.int64)], -1))
            actions.append(a)

    replay(str(repo), sink, ROWS, COLS)
    w.close()
    with FrameReader(path) as r:
        for i in range(len(shown)):
            assert np.array_equal(r.frame(i), shown[i]), i
        assert r.actions(0, len(actions)).tolist() == actions
        # each frame differs from the previous only as the action explains: the first action changes something
        assert len(r) > 700


def test_the_worker_trains_the_frame_model_on_git_frames(repo, tmp_path):
    import torch

    from rcswarm.config.runspec import RunSpec
    from rcswarm.models import registry
    from rcswarm.train.inner import inner_step, make_inner_optimizer, make_sampler

    out = tmp_path / "frames"
    build_git_frames(repo, out, rows=12, cols=40, vocab_size=300, progress=False)
    overrides = {"rows": 12, "cols": 40, "n_styles": 16, "action_vocab": 300}
    spec = RunSpec.from_dict({
        "model": {"name": "frame", "preset": "tiny", "overrides": overrides},
        "data": {"source": "git", "seq_len": 6, "batch_size": 2, "task_config": {"dataset": str(out)}},
        "inner": {"bptt_chunk": 3, "lr": 3e-3},
    })
    model = registry.build_model("frame", "tiny", overrides, seed=0)
    sampler = make_sampler(spec.data, seed=1, model_config=model.config)
    optimizer = make_inner_optimizer(model, spec.inner)
    results = [inner_step(model, optimizer, sampler, 1.0, torch.device("cpu"), 3) for _ in range(3)]
    assert all(r.tokens == 12 and r.loss > 0 for r in results)
    mismatched = registry.build_model("frame", "tiny", seed=0)  # 8 x 16 frames, 8 styles
    with pytest.raises(ValueError, match="the model has rows, cols"):
        make_sampler(spec.data, seed=1, model_config=mismatched.config)


def test_the_projects_own_history_replays_exactly(tmp_path):
    """A real input: this checkout's first commits (small files only, to keep the test quick)."""
    root = Path(__file__).resolve().parents[2]
    probe = subprocess.run(["git", "-C", str(root), "rev-list", "--max-count=4", "HEAD"], capture_output=True, text=True, check=False)
    if probe.returncode != 0 or not probe.stdout.strip():
        pytest.skip("this checkout has no git history")
    summary = build_git_frames(root, tmp_path / "own", rows=12, cols=40, vocab_size=300, max_commits=4,
                               max_file_bytes=1500, progress=False)
    assert summary["commits"] == min(4, len(probe.stdout.split()))
    assert summary["files"] > 0 and summary["actions"] == summary["frames"] > 0
    assert summary["ratio"] > 10


class _Capture:
    """A write_rows sink that feeds a FrameWriter and keeps every frame as an array."""

    def __init__(self, writer):
        self.writer, self.frames, self.actions, self.scrolls = writer, [], [], 0

    def write_rows(self, row_cp, row_st, damage, action, scroll=None):
        self.writer.write_rows(row_cp, row_st, damage, action, scroll)
        cp = np.frombuffer("".join(row_cp).encode("utf-32-le"), "<u4").astype(np.int64)
        st = np.frombuffer(b"".join(row_st), np.uint8).astype(np.int64)
        self.frames.append(np.stack([cp, st], -1).reshape(len(row_cp), -1, 2))
        self.actions.append(action)
        self.scrolls += scroll is not None


def test_fast_path_frames_decode_exactly(repo, tmp_path):
    """The replay's row-delta path (damage + scroll hints) decodes to exactly the frames shown;
    random access equals sequential decoding."""
    path = tmp_path / "fast.rcf"
    cap = _Capture(FrameWriter(path, ROWS, COLS, block_frames=50))
    replay(str(repo), cap, ROWS, COLS)
    cap.writer.close()
    assert cap.scrolls > 0
    with FrameReader(path) as r:
        assert len(r) == len(cap.frames)
        for i in range(len(r)):
            assert np.array_equal(r.frame(i), cap.frames[i]), i
        assert r.actions().tolist() == cap.actions
    rng = np.random.default_rng(0)
    with FrameReader(path, cache_blocks=0) as r:
        for i in rng.permutation(len(cap.frames))[:40].tolist():
            assert np.array_equal(r.frame(i), cap.frames[i])


def test_one_log_process_gives_every_commits_changes(repo):
    """`Git.history` (one `git log --raw`) equals `git diff-tree` per commit, merges included."""
    from rcswarm.data.frames.git_replay import Git

    work = repo.parent / "merge-clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True, capture_output=True)
    _git(work, "config", "user.email", "t@example.com")
    _git(work, "config", "user.name", "t")
    _git(work, "checkout", "-q", "-b", "side", "HEAD~2")
    (work / "side.txt").write_text("from the side branch\n")
    _commit(work, "side")
    _git(work, "checkout", "-q", "main")
    (work / "main.txt").write_text("on main\n")
    _commit(work, "main")
    _git(work, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    _git(work, "config", "log.showRoot", "false")  # user configuration must not change what is parsed
    _git(work, "config", "color.ui", "always")
    for path in (repo, work):
        g = Git(str(path))
        commits = list(g.first_parent_commits())
        hist = list(g.history())
        assert [h[0] for h in hist] == [c[0] for c in commits]
        for (sha, parent, _), (_, changes) in zip(commits, hist):
            assert changes == g.changes(sha, parent), sha
        assert list(g.history(max_count=3)) == hist[:3]
    assert any(ch.new_path == "side.txt" for ch in hist[-1][1])  # the merge's diff against its first parent


def test_git_window_chunks_are_the_batch_of_the_same_seed(tmp_path) -> None:
    repo = make_repo(tmp_path)
    out = tmp_path / "frames"
    build_git_frames(repo, out, ROWS, COLS, vocab_size=300, block_frames=32, frames_per_shard=1500, progress=False)
    spec = FrameWindowSpec(batch_size=3, window=90, seed=2)
    lazy, eager = GitFrameSource(out, spec), GitFrameSource(out, spec)
    for _ in range(2):
        window = lazy.next_window()
        assert isinstance(window, FrameWindow) and window.length == 90
        _assert_chunks_make_the_batch(window, eager.next_batch(), 11)


def test_several_histories_make_one_dataset_with_a_held_out_one(repo, tmp_path):
    from rcswarm.data.frames.git_frames import RepoInput, build_git_dataset, dataset_shards, held_out_repos

    other = make_second_repo(tmp_path)
    out = tmp_path / "both"
    summary = build_git_dataset([RepoInput("demo", repo), RepoInput("other", other, held_out=True)], out, ROWS, COLS,
                                vocab_size=300, block_frames=32, frames_per_shard=1500, progress=False)
    m = json.loads((out / "manifest.json").read_text())
    head = subprocess.run(["git", "-C", str(other), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert [(r["name"], r["split"]) for r in m["repos"]] == [("demo", "train"), ("other", "val")]
    assert m["repos"][1]["head"] == head and "repo" not in m
    assert held_out_repos(m) == ["other"]
    by_repo = {r["name"]: r for r in summary["repos"]}
    assert by_repo["other"]["commits"] == 4 and by_repo["demo"]["commits"] == 7
    assert summary["frames"] == sum(r["frames"] for r in summary["repos"]) == sum(s["frames"] for s in m["shards"])
    # Each history has its own shards, each shard names its history and split.
    assert [s["repo"] for s in m["shards"]] == sorted(s["repo"] for s in m["shards"])
    assert {(s["repo"], s["split"]) for s in m["shards"]} == {("demo", "train"), ("other", "val")}
    assert sum(s["frames"] for s in m["shards"] if s["repo"] == "other") == by_repo["other"]["frames"]
    # The tokenizer never saw the held-out history: it is the tokenizer of the training history alone.
    alone = tmp_path / "alone"
    build_git_frames(repo, alone, ROWS, COLS, vocab_size=300, block_frames=32, frames_per_shard=1500, progress=False)
    assert (out / m["tokenizer"]).read_text() == next(alone.glob("tokenizer-*.json")).read_text()
    # The splits read their own shards; "val" windows come from the held-out history only.
    spec = FrameWindowSpec(batch_size=4, window=16, seed=3)
    train, val = GitFrameSource(out, spec, split="train"), GitFrameSource(out, spec, split="val")
    assert {s["repo"] for s in train.shards} == {"demo"} and {s["repo"] for s in val.shards} == {"other"}
    assert [s["name"] for s in val.shards] == [s["name"] for s in dataset_shards(m, "val")]
    check_frame_batch(val, spec, val.next_batch())
    assert len(GitFrameSource(out, spec).shards) == len(m["shards"])  # no split: every shard
    with pytest.raises(ValueError, match="split='test'"):
        GitFrameSource(out, spec, split="test")


def test_the_cli_takes_several_histories_and_a_held_out_name(repo, tmp_path, capsys):
    from rcswarm.cli.main import main

    other = make_second_repo(tmp_path)
    out = tmp_path / "cli-two"
    assert main(["data", "frames", "--repo", f"a={repo}", "--repo", str(other), "--held-out", "other", "--out", str(out),
                 "--rows", str(ROWS), "--cols", str(COLS), "--vocab-size", "280", "--no-progress"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert [(r["name"], r["split"]) for r in m["repos"]] == [("a", "train"), ("other", "val")]
    assert "histories" in capsys.readouterr().out
    assert main(["data", "frames", "--repo", str(repo), "--held-out", "nope", "--out", str(tmp_path / "x"),
                 "--no-progress"]) == 2
    assert "--held-out ['nope']" in capsys.readouterr().err
    assert main(["data", "frames", "--repo", str(repo), "--held-out", "repo", "--out", str(tmp_path / "y"),
                 "--no-progress"]) == 2
    assert "every one is held out" in capsys.readouterr().err


def test_the_dataset_script_rebuilds_from_names_paths_and_pinned_commits(repo, tmp_path, capsys, monkeypatch):
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[2] / "examples" / "git_dataset.py"
    module_spec = importlib.util.spec_from_file_location("git_dataset", path)
    script = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, "git_dataset", script)  # its dataclasses look their module up
    module_spec.loader.exec_module(script)

    assert script.parse_spec("pallets/itsdangerous@abc123") == script.RepoSpec(
        "itsdangerous", "https://github.com/pallets/itsdangerous", "abc123", slug="pallets/itsdangerous")
    assert script.parse_spec("https://example.org/x/tool.git") == script.RepoSpec("tool", "https://example.org/x/tool.git")
    with pytest.raises(ValueError, match="not owner/name"):
        script.parse_spec("no-such-path-or-name")
    # A mirror directory laid out as owner+name/repo stands in for GitHub.
    mirrors = tmp_path / "mirrors"
    (mirrors / "someone+other").mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(make_second_repo(tmp_path)), str(mirrors / "someone+other" / "repo")],
                   check=True, capture_output=True)
    first_two = subprocess.run(["git", "-C", str(repo), "rev-list", "--reverse", "HEAD"], capture_output=True, text=True,
                               check=True).stdout.split()[1]
    out = tmp_path / "script-out"
    rc = script.main([f"{repo}@{first_two}", "someone/other", "--mirror", str(mirrors), "--cache", str(tmp_path / "cache"),
                      "--held-out", "other", "--out", str(out), "--rows", str(ROWS), "--cols", str(COLS), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    sources = json.loads((out / "sources.json").read_text())
    assert sources[0]["head"] == first_two and sources[1]["cloned_from"] == str(mirrors / "someone+other" / "repo")
    m = json.loads((out / "manifest.json").read_text())
    assert [(r["name"], r["split"], r["head"]) for r in m["repos"]] == [
        ("repo", "train", first_two), ("other", "val", sources[1]["head"])]
    assert m["summary"]["repos"][0]["commits"] == 2  # replayed up to the pinned commit
    assert script.main([str(repo), "--held-out", "absent", "--out", str(tmp_path / "z"), "--cache", str(tmp_path / "c2"),
                        "--no-progress"]) == 2


def test_a_second_build_into_a_dataset_being_built_is_refused_and_the_lock_ends_with_the_build(repo, tmp_path):
    """Two builds into one directory moved their shards in turn, each then its manifest: a manifest beside the
    other build's shards. A second build is refused while the first holds the lock; a build that failed frees it."""
    import fcntl

    from rcswarm.data.frames.git_frames import BUILD_LOCK, RepoInput, build_git_dataset

    out = tmp_path / "dataset"
    out.mkdir()
    with open(out / BUILD_LOCK, "a+") as held:  # what a running build holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        with pytest.raises(RuntimeError, match=r"another build is writing this dataset \(pid 4242\)"):
            build_git_dataset([RepoInput("r", repo)], out, ROWS, COLS, progress=False)
    assert not (out / "manifest.json").exists()

    def fail(*args, **kwargs):
        raise RuntimeError("the tokenizer failed")

    with pytest.MonkeyPatch.context() as patch, pytest.raises(RuntimeError, match="failed"):  # a build that fails ...
        patch.setattr(ActionTokenizer, "train", staticmethod(fail))
        build_git_dataset([RepoInput("r", repo)], out, ROWS, COLS, progress=False)
    summary = build_git_dataset([RepoInput("r", repo)], out, ROWS, COLS, progress=False)  # ... frees the lock
    assert summary["frames"] > 0 and (out / "manifest.json").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".build-")] == []
