"""The launchers pass their workers the git dataset their operator's file names as the data root
(worker/data_root.py): `rcswarm run` on a git dataset trains end to end; a hivemind worker refuses a dataset a
coordinator names outside its --data-root, and takes its own --config's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.data.frames.git_frames import build_git_frames
from tests.helpers.git_repo import make_repo
from tests.helpers.specs import tiny_spec, write_spec

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")

FRAME = {"name": "frame", "preset": "tiny", "overrides": {"rows": 12, "cols": 40, "n_styles": 16, "action_vocab": 300}}


def git_spec(dataset: str, **tables) -> RunSpec:
    return tiny_spec(model=FRAME, data={"source": "git", "seq_len": 6, "batch_size": 2, "task_config": {"dataset": dataset}},
                     inner={"steps": 2, "bptt_chunk": 3, "lr": 3e-3}, **tables)


def test_rcswarm_run_trains_on_the_git_dataset_its_config_names(tmp_path: Path) -> None:
    """The workers read a dataset only under --data-root; the launcher passes the one its config names (relative
    to the directory it runs in, as before), so a local run on a git dataset still trains."""
    build_git_frames(make_repo(tmp_path), tmp_path / "frames", rows=12, cols=40, vocab_size=300, progress=False)
    config = write_spec(git_spec("frames", run={"rounds": 1, "workers": 1}), tmp_path / "run.toml")
    result = subprocess.run([sys.executable, "-m", "rcswarm.cli.main", "run", str(config), "--run-dir", "run"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    worker_log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert result.returncode == 0, result.stdout + result.stderr + worker_log
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds"] == 1
    assert "--data-root" not in worker_log, worker_log


def test_a_hivemind_worker_reads_a_coordinators_dataset_only_under_its_data_root(tmp_path: Path) -> None:
    pytest.importorskip("rcswarm.worker.hivemind_sync")
    from rcswarm.worker import HivemindWorker
    from rcswarm.worker import hivemind_sync as hs

    (tmp_path / "private").mkdir()
    spec = git_spec(str(tmp_path / "private"), sync={"backend": "hivemind"})
    for root, expected in ((None, "--data-root DIR"), (tmp_path / "public", "outside this worker's data root")):
        with pytest.raises(ValueError, match="the run spec of test is refused: data.task_config.dataset") as refused:
            HivemindWorker(spec, hs.HivemindOptions(), control=object(), data_root=root)  # a coordinator's spec
        assert expected in str(refused.value)
