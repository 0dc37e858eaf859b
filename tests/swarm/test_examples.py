"""The example configs: the git-frames one trains on what `rcswarm data frames` (which runs git) makes,
with the exact command its comment gives; every config loads and builds its model in tests/deploy/test_examples.py."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from rcswarm.cli.main import main as rcswarm
from rcswarm.cli.run import evaluate
from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.train.inner import make_inner_optimizer, make_sampler, train_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIT_FRAMES = EXAMPLES / "git_frames.toml"


def _commented_command(path: Path, program: str) -> list[str]:
    """The command line a config's comment gives for `program` (e.g. "rcswarm data frames")."""
    lines = [line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")]
    (line,) = [line for line in lines if line.startswith(program)]
    return shlex.split(line)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")
def test_git_frames_example_trains_on_rcswarm_data_frames_output(tmp_path: Path):
    from tests.helpers.git_repo import make_repo

    repo = make_repo(tmp_path)
    words = _commented_command(GIT_FRAMES, "rcswarm data frames")
    spec = RunSpec.from_toml(GIT_FRAMES)
    dataset = tmp_path / "frames"
    placeholders = {"PATH/TO/REPO": str(repo), spec.data.task_config["dataset"]: str(dataset)}
    assert set(placeholders) <= set(words), words
    assert rcswarm([placeholders.get(word, word) for word in words[1:]] + ["--no-progress"]) == 0

    # The example as written, on the dataset just made, with short windows to keep the test quick.
    spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, task_config={"dataset": str(dataset)},
                                                               seq_len=4, batch_size=4))
    torch.manual_seed(0)
    model = registry.build_model(spec.model.name, spec.model.preset, spec.model.overrides, seed=spec.run.seed)
    sampler = make_sampler(spec.data, seed=1, model_config=model.config)
    optimizer = make_inner_optimizer(model, spec.inner)
    before = evaluate(spec, None)
    losses = [train_step(model, optimizer, *sampler.next_batch(), spec.inner.grad_clip, spec.inner.bptt_chunk)
              for _ in range(30)]
    after = evaluate(spec, model.state_dict())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert after < before - 1.0, (before, after, losses[::5])
