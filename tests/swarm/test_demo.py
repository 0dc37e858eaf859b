"""`make demo` end to end: `rcswarm run` without a config (its own process) sweeps, fits the law and plots it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rcswarm.cli.demo import demo_spec
from rcswarm.cli.fit import main as fit_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_demo_sweeps_fits_the_law_and_plots_it(tmp_path: Path):
    run_dir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "rcswarm.cli.main", "run", "--minutes", "0.6", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=240,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "dashboard: http://127.0.0.1:" in out and "train loss = mean of the workers' last" in out
    assert not re.search(r"\bnan\b", out, flags=re.IGNORECASE), out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["seq_len"] for r in summary["runs"]] == demo_spec().sweep.seq_lens
    # Every length trains the same wall time (a fixed number of rounds would leave the lengths' time
    # ranges disjoint, and no crossover could be observed).
    assert summary["outcome"] == "budget" and all(r["rounds"] >= 2 for r in summary["runs"]), summary["outcome_message"]
    assert {"alpha", "amplitude", "r_squared", "alpha_low", "alpha_high"} <= set(summary["fit"])
    law = summary["law"]["fit"]
    assert {"alpha_inf", "tau", "r_squared", "per_doubling"} <= set(law)
    assert len(law["crossovers"]) == len(summary["runs"]) - 1
    assert all({"observed_s", "predicted_s"} <= set(pair) for pair in law["crossovers"])
    assert "held-out loss of the final parameters ≈" in out and "wall-time crossover" in out
    plot = run_dir / summary["law"]["plot"]
    assert plot.read_bytes().startswith(PNG_MAGIC)
    assert fit_main([str(run_dir), "--out", str(tmp_path / "again.png")]) == 0
    assert (tmp_path / "again.png").read_bytes().startswith(PNG_MAGIC)
