"""The benchmarks' fastest modes still run (benchmarks/ is no package: each script runs as a process).

A benchmark only the documentation ever ran can break with the code under it and nobody notices until someone
wants its table; each case here runs one script in its smallest configuration (a few seconds on 2 cores, mostly
the interpreter and torch starting) and checks that it exits 0 and prints its table's header. Arguments that
once failed with a traceback only after the measuring are refused first, with a line naming them.
Longer ones (sync_bench --quick: every configuration, about 2 minutes; the soaks; Ray) are not here:
tests/swarm/test_chaos.py runs the chaos soak (--wide), docs/PERFORMANCE.md lists the rest's commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT_S = 120  # each run takes a few seconds; far above that on a loaded machine


def run_script(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env, cwd=cwd or ROOT, check=False)


# (script, arguments, a line of its output) — the fastest documented mode of each.
SMOKE = [
    ("round_close_bench.py", ["--quick"], "close pieces, mean seconds per round"),
    ("time_coupled_bench.py", ["--rounds", "3", "--honest", "2"], "| honest workers | attack |"),
    ("forecast_bench.py", ["--synthetic"], "all: median error"),
    ("dashboard_load_bench.py", ["--rows", "2000", "--workers", "2", "--requests", "2"], "GetStatus (status())"),
    ("frame_gpu_plan.py", ["examples/frame_git_gpu.toml"], "min/round"),
    ("psm_stream_bench.py", ["--tokens", "64", "--window", "32", "--chunk", "16", "--d-model", "64"], "gpt / psm"),
    ("rpc_latency_bench.py", ["--calls", "20"], "flood  Heartbeat"),
    ("aggregation_bench.py", ["--sizes", "1m", "--updates", "4", "--repeats", "1", "--skip-loss", "--zeros", "0.9"],
     "| 1m | 4 | trimmed_mean |"),
]


@pytest.mark.parametrize(("script", "args", "expected"), SMOKE, ids=[case[0] for case in SMOKE])
def test_the_fastest_mode_runs_and_prints_its_table(script, args, expected, tmp_path):
    if script == "psm_stream_bench.py":
        args = [*args, "--plot", str(tmp_path / "psm.png")]
    proc = run_script(script, *args)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert expected in proc.stdout, proc.stdout[-3000:]


def test_frame_seq_len_refuses_lengths_it_cannot_fit_before_training():
    """With 2 lengths it trained both, then failed in the power-law fit with a traceback."""
    proc = run_script("frame_seq_len.py", "--lengths", "8", "16", "--steps", "1")
    assert proc.returncode == 2
    assert "--lengths 8 16: expected at least 3 distinct lengths" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_frame_seq_len_runs_three_lengths(tmp_path):
    out = tmp_path / "fsl.json"
    proc = run_script("frame_seq_len.py", "--lengths", "2", "4", "8", "--steps", "2", "--batch-size", "1",
                      "--documents", "2", "--plot", str(tmp_path / "fsl.png"), "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row["length"] for row in result["rows"]] == [2, 4, 8]
    assert (tmp_path / "fsl.png").stat().st_size > 1000


def test_frame_heldout_eval_on_a_sweep_dir_and_without_one(tmp_path):
    """A sweep's run dir (run.toml, final-L<L>.safetensors) evaluated on a few held-out frames; a missing run.toml
    is one line and exit 2, not a traceback."""
    from safetensors.torch import save_file

    from rcswarm.config.runspec import RunSpec
    from rcswarm.models import registry

    run_dir = tmp_path / "sweep"
    run_dir.mkdir()
    spec = RunSpec.from_dict({
        "run": {"name": "heldout-smoke"}, "model": {"name": "frame", "preset": "tiny"},
        "data": {"source": "typing", "batch_size": 2, "task_config": {"n_documents": 4}},
        "sweep": {"seq_lens": [4, 8, 16]},
    })
    (run_dir / "run.toml").write_text(spec.to_toml())
    for run in spec.sweep_runs():
        model = registry.build_model(run.model.name, run.model.preset, run.model.overrides, seed=0)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(run_dir / f"final-L{run.data.seq_len}.safetensors"))
    proc = run_script("frame_heldout_eval.py", str(run_dir), "--frames", "32", "--batch", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads((run_dir / "heldout_eval.json").read_text())
    assert [r["L"] for r in document["results"]] == [4, 8, 16]
    assert document["fit"] is not None

    proc = run_script("frame_heldout_eval.py", str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert "run.toml' does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_make_history_makes_a_history_git_imports(tmp_path):
    """docs/PERFORMANCE.md's histories of many commits come from this generator through `git fast-import`."""
    from rcswarm.data.frames.git_replay import replay

    repo = tmp_path / "h"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=TIMEOUT_S)
    stream = run_script("make_history.py", "30")
    assert stream.returncode == 0, stream.stderr
    subprocess.run(["git", "-C", str(repo), "fast-import", "--done", "--quiet"], input=stream.stdout, text=True,
                   check=True, timeout=TIMEOUT_S)
    subprocess.run(["git", "-C", str(repo), "reset", "-q", "--hard", "main"], check=True, timeout=TIMEOUT_S)
    stats = replay(str(repo), lambda *frame: None, 24, 80)
    assert stats.commits == 30 and stats.files == 33  # counter.txt in each, a note in commits 0, 10 and 20
    assert run_script("make_history.py", "0").returncode == 2
