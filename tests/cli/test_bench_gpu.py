"""`rcswarm bench gpu` without a GPU: the one-line exit, the FLOP and byte counts behind the fractions of peak, the
rows, goals, table and JSON, the synthetic frame window, the swarm part's verdict. (The parts that start processes run
in tests/swarm/test_bench_gpu.py; the CUDA measurements themselves need a GPU: docs/PERFORMANCE.md.)"""

from __future__ import annotations

import json
import math
import tomllib

import pytest
import torch
from rich.console import Console

from rcswarm.cli.bench_gpu import main as bench_gpu
from rcswarm.cli.gpu_check import report
from rcswarm.cli.gpu_check.bptt import BpttConfig, SyntheticWindow, plan, row_of
from rcswarm.cli.gpu_check.kernels import RwkvCase, outputs_and_grads, rwkv_inputs
from rcswarm.cli.gpu_check.report import INFO, PASS, Goal, Row
from rcswarm.cli.gpu_check.swarm import joined_devices, judge, swarm_config
from rcswarm.config.runspec import RunSpec
from rcswarm.kernels.rwkv_product import rwkv_product_chunked, rwkv_product_naive
from rcswarm.kernels.sgsa import sgsa_mask
from rcswarm.models.frame.config import FrameModelConfig
from rcswarm.models.frame.flops import estimate_flops, step_seconds, training_step_flops
from rcswarm.models.frame.presets import PRESETS


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(capsys, tmp_path):
    assert bench_gpu(["--out", str(tmp_path / "x.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA device" in out
    assert not (tmp_path / "x.json").exists()
    assert bench_gpu(["--device", "cuda"]) == 2
    assert bench_gpu(["--parts", "nope"]) == 2


def test_the_cards_and_the_fractions_of_peak():
    h100 = report.card_peak("NVIDIA H100 80GB HBM3")
    assert h100 is not None and (h100.bf16_flops, h100.bandwidth) == (989e12, 3.35e12)  # the numbers
    assert report.card_peak("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert report.card_peak("NVIDIA H200").bandwidth == 4.8e12
    assert report.card_peak("Tesla T4") is None
    assert report.fraction(989e12, 2.0, h100.bf16_flops) == pytest.approx(0.5)
    assert report.fraction(1.0, 0.0, 1.0) is None and report.fraction(1.0, 1.0, None) is None


def test_attention_pair_counts_match_the_masks():
    for length, window, stride in ((1, 4, 2), (37, 8, 4), (100, 16, 7), (64, 100, 8)):
        assert report.sgsa_pairs(length, window, stride) == int(sgsa_mask(length, window, stride).sum())
        assert report.causal_pairs(length) == int(torch.ones(length, length).tril().sum())
    assert report.attention_flops(2, 3, 64, 32, 10, backward=False) == 2 * (64 + 32) * 10 * 6
    assert report.attention_flops(1, 1, 1, 1, 4, backward=True) == 56  # 3.5x the forward's 16


def test_rwkv_counts_follow_the_recurrence():
    assert report.rwkv_flops(1, 1, 1, 2, 3, backward=False) == 9 * 6
    assert report.rwkv_flops(2, 5, 3, 4, 4, backward=True) == 3 * report.rwkv_flops(2, 5, 3, 4, 4, backward=False)
    # inputs r, w, k, a, b (d_k each) and v (d_v) read, y written; the backward reads them and dy, writes grads
    assert report.rwkv_bytes(1, 1, 1, 4, 8, 2, backward=False) == 2 * (5 * 4 + 8 + 8)
    assert report.rwkv_bytes(1, 1, 1, 4, 8, 2, backward=True) == 2 * (3 * (5 * 4 + 8) + 2 * 8)


def test_the_kernel_check_compares_every_output_and_gradient():
    """The comparison the GPU part runs, here with the chunked CPU path standing in for the Triton kernel."""
    case = RwkvCase(1, 9, 2, 4, 3, with_state=True)
    inputs = rwkv_inputs(case, torch.float64, torch.device("cpu"))
    got = outputs_and_grads(lambda **x: rwkv_product_chunked(*x.values(), chunk_size=4), inputs)
    want = outputs_and_grads(lambda **x: rwkv_product_naive(*x.values()), inputs)
    assert list(got) == ["out0", "out1", "dr", "dw_raw", "dk", "dv", "da", "db", "dinitial_state"]
    assert all(torch.allclose(got[name], want[name], rtol=1e-9, atol=1e-12) for name in want)


def test_synthetic_windows_are_the_same_whatever_the_chunking():
    window = SyntheticWindow(2, 50, 3, 4, char_vocab=11, n_styles=5, action_vocab=7, seed=3)
    whole = window.chunk(0, 50)
    pieces = [window.chunk(a, min(a + 13, 50)) for a in range(0, 50, 13)]
    assert torch.equal(torch.cat([f for f, _ in pieces], 1), whole[0])
    assert torch.equal(torch.cat([a for _, a in pieces], 1), whole[1])
    frames, actions = whole
    assert frames.shape == (2, 50, 3, 4, 2) and actions.shape == (2, 50)
    assert 0 <= int(frames[..., 0].min()) and int(frames[..., 0].max()) < 11 and int(frames[..., 1].max()) < 5
    assert int(actions.max()) < 7 and len(actions.unique()) > 3
    with pytest.raises(ValueError, match="expected 0 <= start < stop <= 50"):
        window.chunk(10, 51)


def test_bptt_plan_tries_plain_only_where_asked():
    configs = plan(("tiny",), (100, 32768, 10**6), "cuda", 32768, 64, 32.0)
    assert [(c.method, c.length) for c in configs] == [
        ("plain", 100), ("paged", 100), ("binomial", 100), ("plain", 32768), ("paged", 32768),
        ("binomial", 32768), ("paged", 10**6), ("binomial", 10**6)]
    with pytest.raises(ValueError, match="method='fast'"):
        BpttConfig("tiny", "fast", 10, "cuda")


def _bptt_row(method: str, length: int, peak: int, fps: float) -> Row:
    config = BpttConfig("tiny", method, length, "cuda")
    return row_of(config, {"preset": "tiny", "method": method, "length": length, "seconds": 2.0,
                           "frames_per_second": fps, "loss": 4.0, "schedule": "x", "peak_bytes": peak,
                           "peak_rss_bytes": None, "flops": int(989e12)}, report.card_peak("H100"))


def _timing(kernel: str, length: int, seconds: float) -> Row:
    return Row("timings", kernel, "", data={"kernel": kernel, "length": length, "backward": True, "seconds": seconds})


def test_goals_are_read_from_the_rows_and_land_in_the_json(tmp_path):
    rows = [
        _timing("rwkv_product triton", 32768, 0.010), _timing("fla chunk_rwkv7", 32768, 0.011),
        _timing("sgsa triton", 16384, 0.004), _timing("sdpa causal", 16384, 0.010),
        _bptt_row("plain", 32768, 10 * 2**30, 1000.0), _bptt_row("binomial", 32768, 100 * 2**20, 600.0),
        _bptt_row("binomial", 10**6, 104 * 2**20, 550.0),
        row_of(BpttConfig("tiny", "paged", 10**6, "cuda"), {"error": "timed out after 300 s"}),
        Row("kernels", "rwkv", "ok", status=PASS),
    ]
    found = {goal.name: goal for goal in report.goals(rows)}
    rwkv = found["rwkv_product fwd+bwd speed over fla chunk_rwkv7 at T = 32K"]
    assert rwkv.measured == pytest.approx(1.1) and rwkv.met
    sgsa = found["SGSA fwd+bwd speed over dense causal SDPA at 16K"]
    assert sgsa.measured == pytest.approx(2.5) and sgsa.met is False and "NOT met" in sgsa.line()
    assert rows[5].data["utilization"] == pytest.approx(0.5) and "50.0% of bf16 peak" in rows[5].detail
    memory = found["tiny: streaming BPTT peak memory at L = 1,000,000 over L = 32,768"]
    assert memory.measured == pytest.approx(1.04) and memory.met
    speed = found["tiny: streaming BPTT frames/s over plain autograd at L = 32,768"]
    assert speed.measured == pytest.approx(0.6) and speed.met
    assert Goal("x", None, 1.0).met is None and "not measured" in Goal("x", None, 1.0).line()
    assert rows[7].status == report.SKIPPED and rows[7].value == "not measured"

    doc = report.document(rows, {"device": "cuda", "nan": math.nan})
    path = tmp_path / "out" / "check.json"
    report.write_json(doc, path)
    loaded = json.loads(path.read_text())
    assert loaded["environment"]["nan"] is None  # non-finite numbers become null
    assert [g["met"] for g in loaded["goals"]] == [True, False, True, True]
    assert len(loaded["rows"]) == len(rows) and loaded["failed"] == []
    assert report.exit_status(rows) == 0
    assert report.exit_status(rows + [Row("swarm", "s", "failed", status=report.ERROR)]) == 1
    console = Console(record=True, width=200)
    report.render_table(rows, "title", console)
    text = console.export_text()
    assert "tiny binomial L=1,000,000" in text and "timed out after 300 s" in text


def test_rows_refuse_unknown_parts_and_statuses():
    with pytest.raises(ValueError, match="Row.part='gpu'"):
        Row("gpu", "x", "y")
    with pytest.raises(ValueError, match="Row.status='ok'"):
        Row("swarm", "x", "y", status="ok")
    assert Row("swarm", "x", "y").status == INFO


def test_the_swarm_config_loads_and_the_verdict_needs_every_condition():
    spec = RunSpec.from_dict(tomllib.loads(swarm_config(3, "bf16")))
    assert spec.run.workers == 2 and spec.inner.precision == "bf16" and spec.inner.bptt_chunk > 0
    log = ("... coordinator INFO join: worker-0 (cuda) as r0w1-aa at version 0: admitted\n"
           "... coordinator INFO join: worker-1 (cuda) as r0w2-bb at version 0: admitted\n")
    devices = joined_devices(log)
    assert devices == {"worker-0": "cuda", "worker-1": "cuda"}
    good = {"outcome": "completed", "rounds": 3, "first_round_loss": 4.1, "last_round_loss": 3.2,
            "val_loss_initial": 4.2, "val_loss_final": 3.5, "tokens_per_second": 900.0, "outcome_message": "ok"}
    assert judge(good, devices, "cuda", 3).status == PASS
    assert judge(good, devices, "cpu", 3).status == report.FAIL  # joined on the wrong device
    assert judge({**good, "rounds": 2}, devices, "cuda", 3).status == report.FAIL
    assert judge({**good, "val_loss_final": 4.3}, devices, "cuda", 3).status == report.FAIL
    assert judge({**good, "last_round_loss": math.nan}, devices, "cuda", 3).status == report.FAIL
    assert judge(good, {"worker-0": "cuda"}, "cuda", 3).status == report.FAIL


def test_training_step_flops_follow_appendix_j():
    config = FrameModelConfig(**PRESETS["82m"])
    per = estimate_flops(config, 512, 1024)
    assert (per.frame_head, per.main) == (267_877_110_251_520, 19_791_209_299_968)  # the Appendix J table
    one = estimate_flops(config, 1, 100_000)
    assert training_step_flops(config, 1, 100_000) == 4 * 100_000 * one.frame_head + 3 * one.main
    assert training_step_flops(config, 1, 100_000, core_recompute=True) == 4 * 100_000 * one.frame_head + 4 * one.main
    assert training_step_flops(config, 1, 100_000, streaming=False) == 3 * (100_000 * one.frame_head + one.main)
    assert step_seconds(989e12, 989e12, 0.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="utilization=0"):
        step_seconds(1, 1.0, 0)


def test_a_spent_budget_starts_nothing_and_the_json_holds_every_row_so_far(tmp_path, capsys):
    """--budget-minutes: a part (or a (c) configuration) with too little of the budget left is not started, a
    SKIPPED row says so, and the JSON is written after every part (a check its machine cuts off keeps its rows)."""
    import time

    from rcswarm.cli.bench_gpu import deadline_of
    from rcswarm.cli.gpu_check.bptt import measure_bptt

    out = tmp_path / "check.json"
    assert bench_gpu(["--device", "cpu", "--budget-minutes", "0", "--out", str(out)]) == 2
    assert "--budget-minutes 0.0: expected a number of minutes > 0" in capsys.readouterr().err and not out.exists()
    assert deadline_of(None, 5.0) is None and deadline_of(1.5, 5.0) == 95.0
    # 6 ms of budget: not one part starts; every part's row says why, and the check exits 0 (nothing failed).
    assert bench_gpu(["--device", "cpu", "--budget-minutes", "0.0001", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(row["part"], row["status"], row["detail"]) for row in rows] == [
        (part, report.SKIPPED, report.BUDGET_SPENT) for part in report.PARTS]
    # (c) past its deadline: no child is started, one SKIPPED row per configuration, each handed on as it comes.
    seen: list[Row] = []
    started = time.monotonic()
    skipped = measure_bptt("cpu", ("tiny",), (64, 128), plain_max=64, on_row=seen.append, deadline=started - 1)
    assert time.monotonic() - started < 1.0 and seen == skipped and len(skipped) == 5
    assert all(row.status == report.SKIPPED and row.detail == report.BUDGET_SPENT for row in skipped)


def test_the_json_is_written_after_every_part(monkeypatch):
    import io

    from rcswarm.cli.bench_gpu import parser, run_parts

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # both parts then answer "not run" at once on the CPU
    saved: list[int] = []
    args = parser().parse_args(["--device", "cpu", "--parts", "timings", "kernels"])
    seconds: dict[str, float] = {}
    rows = run_parts(args, torch.device("cpu"), Console(file=io.StringIO()), lambda so_far: saved.append(len(so_far)),
                     part_seconds=seconds)
    assert saved == [1, 2] and [row.part for row in rows] == ["timings", "kernels"]
    assert list(seconds) == ["timings", "kernels"] and all(0 <= s < 60 for s in seconds.values())


def test_the_gradient_check_fails_a_streaming_gradient_that_is_off(monkeypatch):
    """(c)'s gradient rows fail when streaming BPTT's gradient differs from plain autograd's (here: one entry of one
    parameter's gradient moved by 1e-6, as a restore of a stale state would move many)."""
    from rcswarm.cli.gpu_check.bptt import check_gradients
    from rcswarm.train.bptt import streaming

    honest = streaming.streaming_backward

    def off_by_a_little(model, *args, **kwargs):
        result = honest(model, *args, **kwargs)
        next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] += 1e-6
        return result

    monkeypatch.setattr(streaming, "streaming_backward", off_by_a_little)
    rows = check_gradients("cpu", length=40, k=4)
    assert [row.status for row in rows] == [report.FAIL] * 3 and all(row.data["error"] > 1e-9 for row in rows)
