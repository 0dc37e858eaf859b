"""Tensor files on a full disk and after a killed save (the state dir review of 2026-11-29).

`rcswarm run` ended a run whose disk filled up at its last step, the export of the final parameters, with
safetensors' SafetensorError as a traceback and no summary.json; and every save killed mid-write (a worker OOM-killed
while saving its error-feedback residual) left a temporary file of the residual's size for good. Now `save_tensors`
raises OSError naming the file, the summary says the parameters were not exported and is written, and a save removes
what an earlier killed one left. The full disk is the kernel's own refusal (RLIMIT_FSIZE in a child process), the
kill a real SIGKILL.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from rcswarm.cli import run as run_cli
from rcswarm.sync.files import save_tensors
from tests.helpers.verified_state import VERSIONS, committed_run, spec


def child(script: str, *args: str) -> subprocess.Popen[str]:
    """A Python process running `script` (the package imported as this one is), its stdout piped."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], stdout=subprocess.PIPE, text=True)


FULL_DISK_SAVE = """
    import json, resource, signal, sys
    from pathlib import Path
    import torch
    from rcswarm.sync.files import save_tensors
    path = Path(sys.argv[1])
    save_tensors({"w": torch.ones(4)}, path, {"saved": "first"})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
    try:
        save_tensors({"w": torch.ones(1 << 20)}, path, {"saved": "second"})
        print(json.dumps({"raised": None}))
    except Exception as exc:
        print(json.dumps({"raised": type(exc).__name__, "oserror": isinstance(exc, OSError), "message": str(exc)}))
"""


def test_save_tensors_on_a_full_disk_raises_an_oserror_naming_the_file_and_keeps_the_previous_one(
        tmp_path: Path) -> None:
    """A write the kernel refuses (the file size limit: EFBIG, as ENOSPC on a full disk) left safetensors'
    SafetensorError, which `rcswarm run`'s export did not catch. Now an OSError names the file; the previous file
    is whole and no temporary stays."""
    path = tmp_path / "final.safetensors"
    process = child(FULL_DISK_SAVE, str(path))
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["oserror"], result
    assert result["message"] == f"[Errno {errno.EFBIG}] cannot write {path}: File too large"
    assert sorted(os.listdir(tmp_path)) == ["final.safetensors"]
    assert torch.equal(load_file(str(path))["w"], torch.ones(4))


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


KILLED_SAVE = """
    import sys
    from pathlib import Path
    import torch
    from rcswarm.sync.files import save_tensors
    residual = {"w": torch.ones(32 << 20)}  # 128 MiB
    print("ready", flush=True)
    while True:
        save_tensors(residual, Path(sys.argv[1]), {"run_id": "r"})
"""


def kill_mid_save(path: Path) -> list[str]:
    """Start a process saving a 128 MiB residual to `path` over and over, SIGKILL it once a file other than `path`
    appears beside it; the names then beside `path`."""
    process = child(KILLED_SAVE, str(path))
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60.0
        while not [name for name in os.listdir(path.parent) if name != path.name]:
            assert time.monotonic() < deadline, "no save began within 60 s"
            time.sleep(0.002)
        time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    return sorted(os.listdir(path.parent))


def test_a_save_killed_mid_write_leaves_one_temporary_that_the_next_save_removes(tmp_path: Path) -> None:
    """Each save killed mid-write left safetensors' own `.tmpXXXX` of the residual's size (two of 268 MB in the
    review) for good. Now a save writes only `.<name>.partial`, and the next save of the file removes it."""
    path = tmp_path / "error_feedback.safetensors"
    for _ in range(2):
        left = kill_mid_save(path)
        assert set(left) <= {path.name, f".{path.name}.partial"}, left
    save_tensors({"w": torch.ones(4)}, path, {"run_id": "r"})
    assert sorted(os.listdir(tmp_path)) == [path.name]


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
