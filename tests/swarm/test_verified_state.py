"""`rcswarm coordinator` (its own process) refuses a state dir whose checkpoints do not verify, and exits 2."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.helpers.processes import worker_env
from tests.helpers.specs import TOKEN, write_spec
from tests.helpers.verified_state import VERSIONS, committed_run, spec


def test_the_coordinator_command_refuses_unverified_state_and_exits_2(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    committed_run(state_dir)
    for path in (state_dir / "checkpoints").glob("v*.safetensors"):
        tensors = load_file(str(path))
        for tensor in tensors.values():
            tensor.fill_(float("inf"))
        save_file(tensors, str(path), metadata={"version": path.stem.lstrip("v0") or "0"})
    config = write_spec(spec(), tmp_path / "run.toml")
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", str(state_dir),
         "--port", "0", "--token", TOKEN],
        env=worker_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "rcswarm coordinator: state dir" in result.stderr and "no checkpoint verifies" in result.stderr
    assert f"v{VERSIONS:08d}.safetensors" in result.stderr


def _no_file_growth() -> None:
    """In the child before exec: no file may grow (writes beyond size 0 fail with EFBIG), as on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))


def test_a_restart_that_cannot_write_its_state_dir_exits_2_with_one_line(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    committed_run(state_dir)
    config = write_spec(spec(), tmp_path / "run.toml")
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir", str(state_dir),
         "--port", "0", "--token", TOKEN],
        env=worker_env(), capture_output=True, text=True, timeout=120, preexec_fn=_no_file_growth,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("rcswarm coordinator: ")]
    assert str(state_dir) in line, line
