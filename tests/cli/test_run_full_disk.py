"""Tensor files on a full disk and after a killed save (the state dir review of 2026-11-29).

`rcswarm run` ended a run whose disk filled up at its last step, the export of the final parameters, with
safetensors' SafetensorError as a traceback and no summary.json; and every save killed mid-write left a temporary
file of the residual's size for good. Now the summary says the parameters were not exported and is written, and a
save removes what an earlier killed one left. The kernel's own refusal and a real SIGKILL are in
tests/swarm/test_save_tensors_killed.py (they start processes).
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from rcswarm.cli import run as run_cli
from rcswarm.sync.files import save_tensors
from tests.helpers.verified_state import VERSIONS, committed_run, spec


def test_a_full_disk_at_the_export_still_writes_summary_json_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`summarize_run` let the export's error end `rcswarm run` with a traceback, summary.json unwritten. Now the
    summary records that the final parameters were not exported (and why), one stderr line says so, and the rest of
    the summary (the parameters' size among it: they were read) is written."""
    committed_run(tmp_path / "state")

    def full_disk(tensors: object, path: Path, metadata: object = None) -> Path:
        raise OSError(errno.ENOSPC, f"cannot write {path}: No space left on device")

    monkeypatch.setattr(run_cli, "save_tensors", full_disk)
    final = tmp_path / "final.safetensors"
    row = run_cli.summarize_run(run_cli.LocalRun(spec(), tmp_path / "state", final), evaluated=False)
    run_cli.print_summary(Console(file=io.StringIO(), width=200), tmp_path, spec(), [row],
                          run_cli.Outcome("completed", "completed 3 rounds", 0))
    said = f"final parameters not exported: [Errno {errno.ENOSPC}] cannot write {final}: No space left on device"
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["export_problem"] == said and document["fp32_bytes"] > 0
    assert document["rounds"] == VERSIONS
    assert capsys.readouterr().err.splitlines() == [f"rcswarm run: {said}"]
    assert not final.exists()


def test_a_save_removes_the_temporaries_of_earlier_killed_saves_and_writes_mode_0600(tmp_path: Path) -> None:
    """What a killed save left, under this version's name or an earlier one's (`.<name>.<pid>.partial`), goes with
    the next save of the same file, and nothing of another file's; the file is mode 0600 as before."""
    path = tmp_path / "final.safetensors"
    leftovers = [f".{path.name}.partial", f".{path.name}.4242.partial"]
    for name in [*leftovers, ".other.safetensors.partial"]:
        (tmp_path / name).write_bytes(b"\0" * 64)
    save_tensors({"w": torch.arange(6.0).reshape(2, 3)}, path, {"version": "3"})
    assert sorted(os.listdir(tmp_path)) == [".other.safetensors.partial", path.name]
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert torch.equal(load_file(str(path))["w"], torch.arange(6.0).reshape(2, 3))
