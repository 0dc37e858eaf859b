"""Streaming BPTT spills a window's embeddings to $TMPDIR only where the disk keeps SPILL_RESERVE_BYTES free beside
them (train/bptt/segment_store.py `check_spill_space`); a worker whose disk is short ends with one line saying so.
Before, the only bound was the worker's step limit: a coordinator's long window could fill the worker's disk."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.models import registry
from rcswarm.train.bptt import segment_store
from rcswarm.train.bptt.segment_store import SPILL_RESERVE_BYTES, SpillSpaceError, check_spill_space
from rcswarm.train.inner import inner_step, make_inner_optimizer, make_sampler
from rcswarm.worker import Worker
from tests.helpers.specs import TOKEN, tiny_spec
from tests.helpers.worker import _options, run_until

Usage = namedtuple("Usage", "total used free")
SPILLING = {"model": {"name": "frame", "preset": "tiny"},
            "data": {"source": "typing", "seq_len": 40, "batch_size": 2, "task_config": {"n_documents": 4}},
            "inner": {"steps": 2, "bptt_chunk": 1, "memory_budget_mb": 0.003}}  # the embeddings go to a file


@pytest.fixture
def short_disk(monkeypatch: pytest.MonkeyPatch) -> int:
    """Every disk reports SPILL_RESERVE_BYTES + 1 KiB free: less than a window's embeddings beside the reserve."""
    free = SPILL_RESERVE_BYTES + 1024
    monkeypatch.setattr(segment_store.shutil, "disk_usage", lambda path: Usage(10 * free, 9 * free, free))
    return free


def test_a_spill_that_would_leave_less_than_the_reserve_is_refused(short_disk: int, tmp_path: Path) -> None:
    check_spill_space(str(tmp_path), 1024)  # exactly the reserve left
    with pytest.raises(SpillSpaceError) as refused:
        check_spill_space(str(tmp_path), 1025)
    assert str(refused.value).startswith(f"streaming BPTT would write 0.0 MiB of the window's embeddings to {tmp_path}, "
                                         "which has 1,024.0 MiB free (keeping 1,024 MiB)")


def test_a_window_whose_embeddings_do_not_fit_the_disk_is_not_written(short_disk: int, monkeypatch) -> None:
    written: list[int] = []
    monkeypatch.setattr(segment_store.os, "pwrite", lambda fd, data, offset: written.append(len(data)) or len(data))
    spec = RunSpec.from_dict(SPILLING)
    model = registry.build_model("frame", "tiny", seed=0)
    sampler = make_sampler(spec.data, seed=1, model_config=model.config)
    optimizer = make_inner_optimizer(model, spec.inner)
    with pytest.raises(SpillSpaceError, match=r"point TMPDIR at a larger disk"):
        inner_step(model, optimizer, sampler, 1.0, torch.device("cpu"), 1, spec.inner.memory_budget_mb)
    assert written == []
    monkeypatch.undo()  # a disk with room, written: it trains
    assert inner_step(model, optimizer, sampler, 1.0, torch.device("cpu"), 1, spec.inner.memory_budget_mb).tokens == 80


def test_a_worker_whose_disk_is_short_exits_with_one_line(short_disk: int, start_coordinator) -> None:
    local = start_coordinator(tiny_spec(run={"rounds": 0}, **SPILLING))
    worker = Worker(_options(local.target), TOKEN)
    assert run_until(worker, lambda w: False, 60) == 1
    assert worker.exit_reason.startswith("victim cannot train this window: streaming BPTT would write"), worker.exit_reason
