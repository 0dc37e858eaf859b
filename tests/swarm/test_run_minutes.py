"""`rcswarm run --minutes`: a wall-time budget ends the run cleanly with a summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.specs import tiny_spec, write_spec


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rcswarm.cli.main", "run", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_minutes_budget_stops_every_process_after_the_budget(tmp_path):
    config = write_spec(tiny_spec(run={"rounds": 100000, "workers": 2}), tmp_path / "run.toml")
    run_dir = tmp_path / "run"
    result = _run([str(config), "--run-dir", str(run_dir), "--minutes", "0.5"], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 1 <= summary["rounds"] < 100000
    assert f"after {summary['rounds']} rounds" in result.stdout and "0.5-minute budget" in result.stdout
    table = json.loads((run_dir / "processes.json").read_text())
    for pid in (table["coordinator"], *table["workers"]):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"process {pid} outlived the launcher")


def test_minutes_must_be_positive(tmp_path):
    for bad in ("0", "-1", "nan"):
        result = _run(["--minutes", bad], timeout=60)
        assert result.returncode == 2
        assert f"--minutes must be a positive number of minutes, got {float(bad)}" in result.stderr
