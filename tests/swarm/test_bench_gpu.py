"""`rcswarm bench gpu --device cpu`: the parts that start processes, on the CPU (the plumbing, not measurements): the
Triton kernels under the interpreter, streaming BPTT children, the 2-worker swarm."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from rcswarm.cli.bench_gpu import main as bench_gpu


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_the_kernel_part_runs_the_triton_kernels_under_the_interpreter(tmp_path):
    out = tmp_path / "kernels.json"
    proc = subprocess.run([sys.executable, "-m", "rcswarm.cli", "bench", "gpu", "--device", "cpu", "--parts",
                           "kernels", "timings", "--out", str(out)], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    kernels = [r for r in rows if r["part"] == "kernels"]
    assert [(r["data"]["kernel"], r["data"]["dtype"]) for r in kernels] == [
        ("rwkv", "fp32"), ("rwkv", "fp32"), ("rwkv", "bf16"), ("rwkv", "bf16"), ("sgsa", "fp32")]
    assert all(r["status"] == "pass" and r["data"]["finite"] for r in kernels)
    assert all(max(r["data"]["errors"].values()) <= r["data"]["tolerance"] for r in kernels)
    assert {name for r in kernels if r["data"]["kernel"] == "rwkv" for name in r["data"]["errors"]} >= {
        "out0", "out1", "dr", "dw_raw", "dk", "dv", "da", "db"}
    timings = [r for r in rows if r["part"] == "timings"]
    assert timings[0]["status"] == "skipped" and timings[0]["data"]["kernel"] == "fla chunk_rwkv7"  # not installed
    measured = {(r["data"]["kernel"], r["data"]["backward"]): r["data"] for r in timings[1:]}
    ours = ("rwkv_product triton", "rwkv_product triton BLOCK_V=16", "rwkv_product chunked (fp32 inside)", "sgsa triton")
    assert set(measured) == {(k, b) for k in (*ours, "sdpa causal") for b in (0, 1)}
    assert all(d["seconds"] > 0 and d["tokens_per_second"] > 0 and d["flop_fraction"] is None for d in measured.values())
    assert measured[("rwkv_product triton", True)]["flops"] == 3 * 9 * 16 * 8 * 8  # B 1, T 16, H 1, d 8


@pytest.mark.wide  # about 35 s on 2 cores; the default suite keeps the swarm part and the timeout test
def test_the_bptt_part_measures_each_configuration_in_a_child(tmp_path, capsys):
    out = tmp_path / "bptt.json"
    assert bench_gpu(["--device", "cpu", "--parts", "bptt", "--bptt-presets", "tiny", "--bptt-lengths", "40",
                      "--plain-max", "40", "--bptt-chunk", "4", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    # First the gradient check (float64, against plain autograd), then the measurements.
    checks, rows = rows[:3], rows[3:]
    assert [r["data"]["method"] for r in checks] == ["paged", "binomial, embeddings in memory",
                                                     "binomial, embeddings in disk"]
    assert all(r["status"] == "pass" and r["data"]["error"] <= 1e-9 for r in checks), checks
    assert [(r["data"]["method"], r["data"]["length"]) for r in rows] == [("plain", 40), ("paged", 40), ("binomial", 40)]
    for r in rows:
        assert r["status"] == "info" and r["data"]["frames_per_second"] > 0 and r["data"]["peak_rss_bytes"] > 0
        assert r["data"]["peak_bytes"] is None and r["data"]["flops"] > 0
    losses = [r["data"]["loss"] for r in rows]  # the same window: the same loss whichever way it is backpropagated
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[2] == pytest.approx(losses[0], rel=1e-5)
    schedules = [r["data"]["schedule"] for r in rows]
    assert schedules[:2] == ["plain", "paged"] and "stored core states" in schedules[2]  # 2 segments of 32 steps
    assert "tiny binomial L=40" in capsys.readouterr().out


def test_the_swarm_part_trains_two_workers_on_the_device(tmp_path):
    out = tmp_path / "swarm.json"
    assert bench_gpu(["--device", "cpu", "--parts", "swarm", "--swarm-rounds", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "pass", row
    assert row["data"]["devices"] == {"worker-0": "cpu", "worker-1": "cpu"}
    assert row["data"]["summary"]["rounds"] == 2


def test_a_swarm_past_its_timeout_leaves_no_process_behind(tmp_path, monkeypatch):
    """(d) cut off: the launcher gets SIGTERM, and once the grace is over it and every process its table lists
    (each in a session of its own, as `rcswarm run` starts them) are killed."""
    import time

    from rcswarm.cli.gpu_check import swarm

    monkeypatch.setattr(swarm, "STOP_GRACE_S", 1.0)
    sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
    children = [subprocess.Popen(sleeper, start_new_session=True) for _ in range(2)]
    (tmp_path / "processes.json").write_text(json.dumps({"coordinator": children[0].pid, "workers": [children[1].pid]}))
    launcher = subprocess.Popen(sleeper, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # the launcher has set its handler
    started = time.monotonic()
    swarm.stop(launcher, tmp_path / "processes.json")
    assert launcher.poll() is not None and time.monotonic() - started < 5.0
    assert [child.wait(timeout=5.0) for child in children] == [-9, -9]

