"""`rcswarm status` stays readable at 100 columns (its width when piped) and in an 80-column terminal: no line is wider
than the console, no table is cropped, a run's id, state and version and every number stay whole on one line, a
forecast or refusal is printed as a sentence under the tables, not folded into a column a few characters wide, a
peer's markup stays text, and a very long peer string is cut with "…" and a note that `--json` has it whole."""

from __future__ import annotations

import io
import math
import re

import pytest
from rich.console import Console

from rcswarm.cli import status as status_cli
from rcswarm.coordinator.sweep import open_group
from rcswarm.observe.forecast import describe
from rcswarm.protos.v1 import coordinator_pb2 as pb
from tests.helpers.specs import tiny_spec

WIDTHS = (100, 80)
DEVICE = "cuda:0 NVIDIA H100 80GB HBM3"
OOM = "out of memory on cuda:0 (NVIDIA H100 80GB HBM3)"
MARKUP = "limit [bold]1e9[/] params"
NOTE = "not enough data: 3 usable rounds (2 rows left out: not finite positive losses), a forecast needs 5"
PRUNED = ("round 40 of 200: frames-sweep-L1024 pruned: its forecast 2.31 [2.2, 2.4] is above frames-sweep-L256's "
          "1.76 [1.70, 1.82] at 90% confidence")
CLOSE = "round 41: all 3 active workers reported"


def forecasts() -> list[pb.ForecastStatus]:
    nan = math.nan
    return [
        pb.ForecastStatus(at_round=200, loss=1.8432, low=1.7911, high=1.9023, basis="held-out", target_loss=1.9,
                          target_seconds=812.0),
        pb.ForecastStatus(at_round=200, loss=1.7613, low=1.7012, high=1.8211, basis="training", target_loss=1.9,
                          target_seconds=math.inf),
        pb.ForecastStatus(note=NOTE, loss=nan, low=nan, high=nan, target_seconds=nan),
        pb.ForecastStatus(stopped=PRUNED, at_round=200, loss=2.31, low=2.2, high=2.4, target_seconds=nan),
    ]


def sentence(forecast: pb.ForecastStatus) -> str:
    """A forecast as status prints it (as text, not markup)."""
    prefix = "held-out: " if forecast.basis == "held-out" and not forecast.note else ""
    return prefix + describe(forecast.loss, forecast.low, forecast.high, forecast.at_round, forecast.note,
                             forecast.stopped, forecast.target_loss, forecast.target_seconds)


def a_sweep() -> pb.GetStatusResponse:
    """A sweep of 4 runs over L = 128..1024 with long-ish run ids, two of them refused by workers (one reason with
    markup in it), forecasts of every kind, and six workers on H100s (one named "[/]")."""
    runs = [pb.RunSummary(
        run_id=f"frames-sweep-L{length}", version=version, run_state=state, target_rounds=200, seq_len=length,
        batch_size=64, active_workers=active, latest_loss=loss, total_tokens=tokens, tokens_per_second=rate,
        forecast=forecast, val_loss=val, val_version=val_version, refused_by=refused, last_refusal=refusal)
        for length, version, state, active, loss, tokens, rate, forecast, val, val_version, refused, refusal in zip(
            (128, 256, 512, 1024), (41, 38, 3, 40),
            (pb.RUN_STATE_RUNNING, pb.RUN_STATE_RUNNING, pb.RUN_STATE_RUNNING, pb.RUN_STATE_FINISHED),
            (3, 2, 0, 0), (1.93412, 1.8123, 2.7711, 2.4012), (123456789, 98765432, 1234567, 2345678901),
            (123456.7, 98765.4, 0.0, 45678.9), forecasts(), (1.9521, 1.8402, 0.0, 2.3501), (40, 36, -1, 40),
            (0, 0, 3, 1), ("", "", OOM, MARKUP))]
    workers = [pb.WorkerStatus(
        worker_id=f"r{j}w{j + 10}-0123abcd", name="[/]" if j == 5 else f"gpu-node-{17 + j}.cluster.example.org",
        state=pb.WORKER_STATE_ACTIVE, base_version=runs[j % 2].version, seconds_since_heartbeat=1.25 + j,
        device=DEVICE, assignment=pb.TrainingAssignment(seq_len=runs[j % 2].seq_len, batch_size=64),
        trained_tokens=12345678 + j, applied_tokens=12000000 + j, step_seconds=0.4123, run_id=runs[j % 2].run_id,
        round_bytes_up=4_200_000, round_bytes_down=16_800_000, utilization=0.87,
        reason=f"refused: {OOM}" if j == 0 else "", clipped_updates=j % 2) for j in range(6)]
    rounds = [pb.RoundStatus(version=version, reports=3, tokens=3 * 64 * 128 * 10, opened_at=1000.0 + version,
                             closed_at=1012.5 + version, close_reason=CLOSE, update_norm=0.0123,
                             aggregation="mean", run_id=runs[k].run_id) for k, version in ((0, 40), (0, 41), (1, 38))]
    return pb.GetStatusResponse(
        run_id="frames-sweep", version=3, run_state=pb.RUN_STATE_RUNNING, target_rounds=200, workers=workers,
        rounds=rounds, latest_loss=1.8812, tokens_per_second=222222.1, param_sha256="ab" * 32,
        total_tokens=2570000000, applied_tokens=2500000000, runs=runs, waiting_for_place=2,
        pace="step-boxed: 50 inner steps per round (sync.inner_steps), round deadline 120 s",
        fp32_bytes=16_800_000, bytes_up_per_round=4_200_000.0, bytes_down_per_round=16_800_000.0)


def a_run() -> pb.GetStatusResponse:
    """One run (no sweep) with the sweep's held-out forecast and two of its workers."""
    sweep = a_sweep()
    run = pb.GetStatusResponse(
        run_id="frames-L1024-h100-long-context", version=41, run_state=pb.RUN_STATE_RUNNING, target_rounds=200,
        latest_loss=1.93, tokens_per_second=12345.6, total_tokens=123456789, applied_tokens=120000000,
        val_loss=1.9521, val_version=40, forecast=sweep.runs[0].forecast, pace=sweep.pace,
        fp32_bytes=sweep.fp32_bytes, bytes_up_per_round=sweep.bytes_up_per_round,
        bytes_down_per_round=sweep.bytes_down_per_round, workers=sweep.workers[:2], rounds=sweep.rounds[:2])
    for worker in run.workers:
        worker.run_id = run.run_id
    for closed in run.rounds:
        closed.run_id = run.run_id
    return run


def printed(status: pb.GetStatusResponse, width: int, **options) -> str:
    out = io.StringIO()
    status_cli.report(status, Console(file=out, width=width, **options), totals={})
    return out.getvalue()


def one_line(text: str, *values: str) -> bool:
    """Whether some line holds every one of `values`, each whole."""
    return any(all(value in line for value in values) for line in text.splitlines())


def assert_fits(text: str, width: int) -> None:
    """No line is wider than the console, and no table is cropped: a row that begins with a border ends with one."""
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    cropped = [line for line in lines if line[:1] in "│┃┏┡└" and line.rstrip()[-1:] not in "│┃┓┩┘"]
    assert not cropped, "\n".join(cropped)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_sweeps_runs_forecasts_and_refusals_are_whole_on_one_line(width: int) -> None:
    status = a_sweep()
    text = printed(status, width)
    assert_fits(text, width)
    states = {pb.RUN_STATE_RUNNING: "running", pb.RUN_STATE_FINISHED: "finished"}
    for run in status.runs:
        # The run's id, L × batch, state and version on its row, none of them cut or wrapped.
        assert one_line(text, run.run_id, f"{run.seq_len} × {run.batch_size}", states[run.run_state],
                        f"{run.version} / {run.target_rounds}"), text
        assert one_line(text, run.run_id, str(run.total_tokens)), text
    for run in status.runs[:2] + status.runs[3:]:
        assert one_line(text, run.run_id, f"{run.val_loss:.4g} (θ_{run.val_version})"), text
    # A forecast is a sentence under the tables: whole on one line where it fits the width; a longer note is
    # wrapped at its spaces there, every word kept, in order.
    flat = " ".join(text.split())
    for run in status.runs:
        words = sentence(run.forecast)
        if len(words) <= width - 12:
            assert one_line(text, f"L={run.seq_len}", words), (words, text)
        assert " ".join(words.split()) in flat, (words, text)
    # Who refused a run and why, the reason whole on its line and its markup as written.
    assert one_line(text, "L=512: refused by 3 workers, the last:") and one_line(text, OOM), text
    assert one_line(text, "L=1024: refused by 1 worker, the last:") and one_line(text, MARKUP), text
    assert "versions" in text and one_line(text, "L=128: 41 / 200", "L=256: 38 / 200"), text


@pytest.mark.parametrize("width", WIDTHS)
def test_a_runs_forecast_and_fields_are_whole_on_one_line(width: int) -> None:
    status = a_run()
    text = printed(status, width)
    assert_fits(text, width)
    assert one_line(text, "version", "41 / 200") and one_line(text, "held-out loss (along the way)", "1.952 (θ_40)")
    assert one_line(text, "held-out: 1.843 [1.791, 1.902] at round 200; 1.9 at 812 s"), text
    assert one_line(text, "forecast of the final held-out loss (90%)"), text
    # The traffic breaks between its two halves, not inside one.
    assert one_line(text, "up 4.2 MB (4× below fp32),") and one_line(text, "down 16.8 MB (1× below fp32)"), text


@pytest.mark.parametrize("width", WIDTHS)
def test_the_workers_and_rounds_tables_are_not_cropped_and_keep_their_numbers_whole(width: int) -> None:
    status = a_sweep()
    text = printed(status, width)
    assert_fits(text, width)
    for worker in status.workers:
        assert one_line(text, worker.worker_id), text
        assert one_line(text, f"{worker.trained_tokens} /") and one_line(text, str(worker.applied_tokens)), text
    assert text.count("4.2 MB / 16.8 MB") == len(status.workers), text
    assert one_line(text, "128 × 64", "41", "1.2") and one_line(text, "0 / 0 / 1 / 0"), text
    # A peer's name is text: "[/]" is printed as itself (and does not end the table's markup).
    assert one_line(text, "│ [/] "), text
    # Each round's numbers on its row, its close reason whole on a line.
    for closed in status.rounds:
        assert one_line(text, f"L={128 if closed.run_id.endswith('128') else 256}", str(closed.version), "closed",
                        str(closed.tokens), "12.5", "0.0123"), text
    assert text.count(CLOSE) == len(status.rounds) and one_line(text, "aggregation of round 38: mean"), text


def test_a_very_long_peer_string_is_cut_and_the_report_says_where_it_is_whole() -> None:
    status = a_sweep()
    status.workers[0].name = "Ω" * 5000
    status.workers[1].device = "[red]cuda " * 500
    status.workers[2].reason = "refused: " + "why " * 2000
    status.runs[2].last_refusal = "Ж" * 3000
    text = printed(status, 100)
    assert_fits(text, 100)
    lines = text.splitlines()
    assert len(lines) < len(printed(a_sweep(), 100).splitlines()) + 30, "a long string took over the layout"
    # Cut to its limit, "…" in place of the rest (the name folds over a few lines of its column).
    assert text.count("Ω") == status_cli.NAME_CHARS - 1 and text.count("Ж") == status_cli.TEXT_CHARS - 1, text
    assert one_line(text, "Ω…") and one_line(text, "Ж…"), text
    assert "[red]cuda" in text and "why why" in text
    assert one_line(text, "…: a string cut to") and "`rcswarm status --json` has it whole" in " ".join(text.split())
    coloured = printed(status, 100, force_terminal=True)
    assert "[red]cuda" in coloured and "\x1b[31m" not in coloured
    assert "has it whole" not in printed(a_sweep(), 100), "the note is printed only when a string was cut"


def test_a_real_sweeps_status_fits_80_columns(tmp_path) -> None:
    base = tiny_spec(run={"rounds": 10000})
    sweep = open_group(base.from_dict({**base.to_dict(), "sweep": {"seq_lens": [2, 4, 8, 16]}}), tmp_path)
    try:
        members = [sweep.join(pb.JoinRequest(worker_name=name, device=DEVICE))
                   for name in ("gpu-node-17.cluster.example.org-4242", "b", "c")]
        status = sweep.status()
    finally:
        sweep.close()
    text = printed(status, 80)
    assert_fits(text, 80)
    for run in status.runs:
        assert one_line(text, run.run_id, f"{run.seq_len} × {run.batch_size}", "running", "0 / 10000"), text
        assert one_line(text, f"L={run.seq_len}", "no forecast yet"), text
    for member in members:
        assert one_line(text, member.worker_id), text
    assert re.search(r"L=2: 0 / 10000, L=4: 0 / 10000,\s", text), text
