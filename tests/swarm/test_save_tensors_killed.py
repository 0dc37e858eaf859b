"""Tensor files on a full disk and after a killed save, in child processes (the state dir review of 2026-11-29).

A write the kernel refuses (RLIMIT_FSIZE in a child process, as a full disk) left safetensors' SafetensorError; every
save killed mid-write (a real SIGKILL) left a temporary of the file's size for good. Now `save_tensors` raises OSError
naming the file, and a save removes what an earlier killed one left (tests/cli/test_run_full_disk.py: the summary).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from rcswarm.sync.files import save_tensors


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
