"""`rcswarm coordinator` as a process, given a run spec whose model no host holds: it exits with the usage error's
status and one line naming the parameter count, within seconds and without allocating the model (its address
space is capped at 4 GiB).

Before, `[model.overrides] n_layers = 100000` (59 billion parameters of the byte LSTM) made the coordinator allocate
until the machine swapped. The child's address space is capped here, so code that allocates the model fails at the
cap instead of swapping the machine that runs the test.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

from rcswarm.protos.wire import TOKEN_ENV
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

# The child's address space: about 0.7 GiB for the refusing coordinator (python, torch, grpc); the model is 221 GiB.
ADDRESS_SPACE = 4 << 30
DEADLINE_S = 120.0


def capped_address_space() -> None:
    """In the child, before exec: at most ADDRESS_SPACE of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_a_coordinator_given_a_huge_model_refuses_it_in_one_line_without_allocating(tmp_path: Path) -> None:
    spec = tiny_spec(model={"name": "lstm_lm", "preset": "small", "overrides": {"n_layers": 100_000}})
    config = write_spec(spec, tmp_path / "run.toml")
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "rcswarm.cli", "coordinator", "--config", str(config), "--state-dir",
         str(tmp_path / "state"), "--host", "127.0.0.1", "--port", "0"],
        env={**os.environ, TOKEN_ENV: TOKEN}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=capped_address_space,
    )
    watchdog = threading.Timer(DEADLINE_S, process.kill)
    watchdog.start()
    try:
        with process.stderr:
            stderr = process.stderr.read()
        # Not its peak RSS: a child forked from pytest (preexec_fn forks) starts its ru_maxrss at pytest's own (1.3 GiB
        # late in the full suite). The address-space cap is the bound: allocating the model fails at it.
        _, status, _ = os.wait4(process.pid, 0)
    finally:
        watchdog.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4
    seconds = time.monotonic() - started
    lines = stderr.decode(errors="replace").strip().splitlines()
    assert process.returncode == 2, lines[-20:]
    assert len(lines) == 1, lines[-20:]
    assert lines[0].startswith("rcswarm coordinator: the model (lstm_lm preset 'small', overrides "
                               "{'n_layers': 100000}) has "), lines
    # On a host above about 100 GiB the count stops first at MAX_TENSORS parameter tensors (or MAX_MODULES submodules).
    if "parameter tensors" not in lines[0] and "submodules" not in lines[0]:
        assert "parameters (its count on the meta device stopped at " in lines[0], lines
        assert "held at 40 bytes each" in lines[0] and "GiB of host memory" in lines[0], lines
    assert seconds < 30, f"{seconds:.1f} s to refuse"
    assert not (tmp_path / "state").exists()
