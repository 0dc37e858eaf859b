"""Where a worker reads the git dataset a run spec names (worker/data_root.py): only at or under its --data-root.

Before, a worker opened whatever path a coordinator's spec named, relative to its working directory or absolute, so
a coordinator could make a worker started among its operator's own frame datasets train on one of them and send
updates computed from it (review of a hostile coordinator, 2026-11-28)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rcswarm.cli import worker as worker_cli
from rcswarm.config.runspec import RunSpec
from rcswarm.worker.data_root import data_root_args, data_root_problem, dataset_problem
from tests.helpers.specs import tiny_spec

FRAME = {"name": "frame", "preset": "tiny"}


def git_spec(dataset: str) -> RunSpec:
    return tiny_spec(model=FRAME, data={"source": "git", "seq_len": 8, "task_config": {"dataset": dataset}})


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A worker's working directory holding its operator's private dataset and a public folder with one dataset and a
    link out to the private one."""
    (tmp_path / "private").mkdir()
    (tmp_path / "public" / "frames").mkdir(parents=True)
    os.symlink(tmp_path / "private", tmp_path / "public" / "link")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("dataset", ["public/frames", "public", "public/frames/../frames", "{root}/public/frames",
                                     "public/not-built-yet"])
def test_a_dataset_at_or_under_the_data_root_is_read(disk: Path, dataset: str) -> None:
    assert dataset_problem(git_spec(dataset.format(root=disk)), disk / "public") == ""
    assert dataset_problem(git_spec(dataset.format(root=disk)), Path("public")) == ""  # a relative root, from the cwd


@pytest.mark.parametrize("dataset", ["private", "{root}/private", "public/../private", "public/link", "/etc", "."])
def test_a_dataset_outside_the_data_root_is_refused_naming_both(disk: Path, dataset: str) -> None:
    named = dataset.format(root=disk)
    problem = dataset_problem(git_spec(named), disk / "public")
    assert problem.startswith(f"data.task_config.dataset = {named!r} is /"), problem
    assert f"outside this worker's data root {disk / 'public'} (--data-root)" in problem, problem


def test_without_a_data_root_no_git_dataset_is_read_and_other_sources_need_none(disk: Path) -> None:
    problem = dataset_problem(git_spec("private"), None)
    assert problem == ("data.task_config.dataset = 'private': this worker reads a git dataset only at or under the "
                       "folder its operator names (--data-root DIR, the folder that holds it)")
    assert dataset_problem(tiny_spec(), None) == ""
    assert dataset_problem(tiny_spec(model=FRAME, data={"source": "typing", "seq_len": 8}), None) == ""


def test_a_launcher_passes_the_dataset_its_operators_file_names(disk: Path) -> None:
    assert data_root_args(git_spec("public/frames")) == ["--data-root", str(disk / "public" / "frames")]
    assert data_root_args(tiny_spec()) == []
    assert dataset_problem(git_spec("public/frames"), Path(data_root_args(git_spec("public/frames"))[1])) == ""


def test_a_data_root_that_is_not_a_directory_is_a_usage_error(disk: Path, capsys: pytest.CaptureFixture) -> None:
    (disk / "file").write_text("")
    assert data_root_problem(disk / "public") == "" and data_root_problem(None) == ""
    for missing in (disk / "nowhere", disk / "file"):
        assert data_root_problem(missing).startswith(f"--data-root {missing}: no such directory")
    status = worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", "t", "--data-root", str(disk / "nowhere")])
    assert status == 2
    assert f"--data-root {disk / 'nowhere'}: no such directory" in capsys.readouterr().err
