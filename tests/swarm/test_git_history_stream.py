"""A history is read as a stream (`git_replay.Git`): `git log`'s output is parsed as it arrives, so memory does not
grow with the number of commits; a stream stopped early kills its git; a git that fails or is killed is an error
naming the repository; the held-out check holds roots, not commit lists; the stages after the replay (tokenizer,
encoding) show progress like the replay. Histories are made with `git fast-import` (thousands of commits in
well under a second)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from rcswarm.data.frames import git_replay
from rcswarm.data.frames.git_frames import RepoInput, build_git_dataset
from rcswarm.data.frames.git_replay import Git
from tests.helpers.data import COLS, ROWS

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")

COMMITS = 3000
FILES_PER_COMMIT = 4


def fast_import_history(root: Path, commits: int, files: int = FILES_PER_COMMIT, name: str = "many") -> Path:
    """A repository of `commits` first-parent commits, each changing `files` tiny files (and a subject of its own),
    made with one `git fast-import`."""
    repo = root / name
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, capture_output=True)
    stream = bytearray()

    def data(payload: bytes) -> None:
        stream.extend(b"data %d\n%s\n" % (len(payload), payload))

    for i in range(commits):
        stream.extend(b"commit refs/heads/main\nmark :%d\ncommitter t <t@example.com> %d +0000\n" % (i + 1, 1700000000 + i))
        data(b"commit %d" % i)
        if i:
            stream.extend(b"from :%d\n" % i)
        for k in range(files):
            stream.extend(b"M 100644 inline dir%d/file%d.txt\n" % (k, k))
            data(b"value %d of file %d\n" % (i, k))
    stream.extend(b"done\n")
    subprocess.run(["git", "-C", str(repo), "fast-import", "--done", "--quiet"], input=bytes(stream), check=True,
                   capture_output=True, timeout=60)
    return repo


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    return fast_import_history(tmp_path_factory.mktemp("stream"), COMMITS)


REAL_POPEN = subprocess.Popen


class Recorder:
    """Stands in for `subprocess.Popen` in `git_replay` (and so in its `subprocess.run`): starts the real process
    and keeps it, to be looked at."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def __call__(self, *args, **kwargs) -> subprocess.Popen:
        proc = REAL_POPEN(*args, **kwargs)
        self.started.append(proc)
        return proc

    def streamed(self, command: str) -> list[subprocess.Popen]:
        """The processes started of git `command` ("log", "cat-file") other than the short ones `Git.run` waits
        for (a `log -n 0` probe)."""
        return [p for p in self.started if command in p.args and "-n" not in p.args]


@pytest.fixture
def popen(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(git_replay.subprocess, "Popen", recorder)
    yield recorder
    for proc in recorder.started:  # nothing a test started outlives it
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_the_history_is_read_lazily_from_a_running_git(many, popen, monkeypatch):
    """The first commit comes before git has printed the log (it is still running, held by a full pipe), having
    read a chunk or two of a log of megabytes; closing the stream early closes the pipe and ends git. Before, `history`
    read the whole `git log --raw` output into one bytes object and built every commit's changes first."""
    read: list[int] = []
    stream = Git.stream

    def counted(self, *args, **kwargs):
        for chunk in stream(self, *args, **kwargs):
            read.append(len(chunk))
            yield chunk

    monkeypatch.setattr(Git, "stream", counted)
    history = Git(str(many)).history()
    sha, changes = next(history)
    [log] = popen.streamed("log")
    assert log.poll() is None  # git is still writing the log: it was not read whole
    assert len(changes) == FILES_PER_COMMIT and sum(read) <= 2 * git_replay.STREAM_CHUNK
    history.close()
    assert log.returncode is not None and log.stdout.closed  # stopped, reaped, no pipe left open
    # The whole log is much longer than what was read: the first commit did not need it.
    assert sum(1 for _ in Git(str(many)).history()) == COMMITS
    assert sum(read) > 20 * git_replay.STREAM_CHUNK


def test_reading_a_history_takes_memory_bounded_by_a_commit_not_the_history(many):
    """The whole history of 3,000 commits (12,000 changes, 1.6 MB of `git log --raw`) through `history` and
    `first_parent_commits` with subjects: the peak of Python allocations stays under 1 MiB (before: 7.7 MiB, the
    log's bytes and every commit's changes at once)."""
    git = Git(str(many))

    def peak_of(read) -> tuple[int, int]:
        """(what `read()` counted, the peak of Python allocations while it ran)."""
        tracemalloc.start()
        try:
            counted = read()
            return counted, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    changes, peak = peak_of(lambda: sum(len(changed) for _, changed in git.history()))
    assert changes == COMMITS * FILES_PER_COMMIT
    assert peak < 1 << 20, f"peak {peak / 2**20:.1f} MiB"
    subjects, peak = peak_of(lambda: sum(1 for _, _, subject in git.first_parent_commits(subjects=True)
                                         if subject.startswith("commit ")))
    assert subjects == COMMITS
    assert peak < 1 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_max_count_keeps_the_first_commits_from_the_root_and_stops_git(many, popen):
    """`git log --reverse -n N` would give the newest N commits reversed: the first N of the first-parent line from
    the root are taken by stopping the stream, and git is ended then, not after the whole log."""
    git = Git(str(many))
    first = list(git.history(max_count=3))
    assert all(proc.returncode is not None for proc in popen.started)
    every = git.history()
    assert first == [next(every) for _ in range(3)]
    every.close()
    assert [sha for sha, _, _ in git.first_parent_commits(max_count=3)] == [sha for sha, _ in first]
    assert [(c.sha, c.changes) for c in git.commits(max_count=3)] == first
    fallback = Git(str(many))
    fallback._diff_merges = False  # a git without --diff-merges: the commit list, then diff-tree per commit
    assert [(c.sha, c.changes) for c in fallback.commits(max_count=3)] == first
    assert git.count(max_count=3) == 3 and git.count() == COMMITS
    assert [s for _, _, s in git.first_parent_commits(max_count=2)] == ["", ""]  # subjects only when asked
    assert [s for _, _, s in git.first_parent_commits(max_count=2, subjects=True)] == ["commit 0", "commit 1"]


def test_a_killed_or_failing_git_is_an_error_naming_the_repository(many, popen):
    history = Git(str(many)).history()
    next(history)
    [log] = popen.streamed("log")
    log.send_signal(signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"git log in {many} was killed by signal {int(signal.SIGKILL)}"):
        for _ in history:
            pass
    assert log.returncode == -signal.SIGKILL and log.stdout.closed
    with pytest.raises(RuntimeError, match=rf"git log in {many} exited with status 128: .*no-such-rev"):
        list(Git(str(many)).history("no-such-rev"))


def test_a_replay_that_fails_ends_its_git_processes(many, popen, monkeypatch):
    """An error in the middle of a replay (here the sink's) closes the log's pipe and ends every git it started."""
    count = [0]

    def sink(cp, st, action) -> None:
        count[0] += 1
        if count[0] == 50:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        git_replay.replay(str(many), sink, ROWS, COLS)
    assert len(popen.streamed("log")) == len(popen.streamed("cat-file")) == 1
    assert all(proc.returncode is not None for proc in popen.started)


def test_held_out_histories_are_checked_by_their_roots(tmp_path):
    """A shallow clone of a training history shares its newest commits, not its root: it is refused as held out,
    unless `max_commits` keeps the replayed commits of both apart."""
    repo = fast_import_history(tmp_path, 8, files=1, name="full")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "3", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True)
    boundary = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD~2"], check=True, capture_output=True,
                              text=True).stdout.strip()
    repos = [RepoInput("full", repo), RepoInput("shallow", shallow, held_out=True)]
    with pytest.raises(ValueError, match=f"held-out repository shallow .* shares commit {boundary} with training "
                                         "repository full"):
        build_git_dataset(repos, tmp_path / "refused", ROWS, COLS, vocab_size=256, progress=False)
    assert not (tmp_path / "refused").exists()
    build_git_dataset(repos, tmp_path / "apart", ROWS, COLS, vocab_size=256, max_commits=2, progress=False)


def test_the_tokenizer_and_the_encoding_show_progress(tmp_path, capsys):
    """After the replay's bar, `rcswarm data frames` shows one for training the tokenizer and one for encoding the
    shards (none with --no-progress). Before, nothing was shown after the replay."""
    from rcswarm.cli.main import main

    repo = fast_import_history(tmp_path, 30, files=2)
    args = ["data", "frames", "--repo", str(repo), "--rows", str(ROWS), "--cols", str(COLS), "--vocab-size", "256"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    lines = capsys.readouterr().out.splitlines()
    replayed = next(i for i, line in enumerate(lines) if line.startswith("many ") and "30/30 commits" in line)
    actions = int(lines[replayed].split("commits")[1].split()[0].replace(",", ""))
    tokenizer = next(i for i, line in enumerate(lines) if line.startswith("tokenizer "))
    encode = next(i for i, line in enumerate(lines) if line.startswith("encode "))
    assert replayed < tokenizer < encode
    assert f"{actions}/{actions} actions" in lines[tokenizer] and f"{actions}/{actions} actions" in lines[encode]
    assert main([*args, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    quiet = capsys.readouterr().out
    assert not any(line.startswith(("many ", "tokenizer ", "encode ")) for line in quiet.splitlines())
