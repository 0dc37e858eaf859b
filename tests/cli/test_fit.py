"""`rcswarm fit` on synthetic metrics from the paper's law, and on malformed files."""

import csv
import json
import re

import numpy as np
import pytest

from rcswarm.cli.fit import main
from rcswarm.cli.main import COMMANDS

COLUMNS = ("run_id", "worker_id", "step", "seq_len", "loss", "wall_time")


def paper_rows(seed: int = 0) -> list[dict]:
    """Two workers per run; α∞ = 0.308, τ = 720, A(s) from 5.8 to 5, 1% noise, 0.05·L seconds per step."""
    rng = np.random.default_rng(seed)
    rows = []
    for length in (2, 4, 8, 16):
        for step in range(25, 4001, 25):
            alpha = 0.308 * (1 - np.exp(-step / 720))
            amplitude = 5.0 + 0.8 * np.exp(-step / 1500)
            for worker in ("w0", "w1"):
                loss = amplitude * length ** -alpha * np.exp(rng.normal(0, 0.01))
                rows.append({"run_id": f"len{length}", "worker_id": worker, "step": step, "seq_len": length,
                             "loss": float(loss), "wall_time": 0.05 * length * step + rng.uniform(0, 0.01)})
    return rows


def write_csv(path, rows, columns=COLUMNS):
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="module")
def rows():
    return paper_rows()


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_synthetic_metrics_are_fitted_and_plotted(tmp_path, capsys, rows, suffix):
    metrics = tmp_path / f"metrics.{suffix}"
    (write_csv if suffix == "csv" else write_jsonl)(metrics, rows)
    out = tmp_path / "plots" / "fit.png"
    assert main([str(metrics), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    printed = capsys.readouterr().out
    alpha_inf = float(re.search(r"α∞ \[90% interval\]\s*│\s*([0-9.]+) \[", printed).group(1))
    tau = float(re.search(r"τ \(steps\) \[90% interval\]\s*│\s*([0-9.]+) \[", printed).group(1))
    assert alpha_inf == pytest.approx(0.308, rel=0.1)
    assert tau == pytest.approx(720, rel=0.1)
    assert "2 → 4" in printed and "Eq. 11" in printed and "not enough data" not in printed
    # 4 → 8 and 8 → 16 cross after the plateau and the first tenth of the time: observed, beside the prediction.
    assert re.search(r"4 → 8 │ +[0-9.]+ s │ +[0-9.]+ s \(steps", printed), printed


def test_custom_column_names(tmp_path, capsys, rows):
    renamed = [{"run": r["run_id"], "it": r["step"], "L": r["seq_len"], "nll": r["loss"], "t": r["wall_time"]} for r in rows]
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, renamed, columns=("run", "it", "L", "nll", "t"))
    argv = [str(metrics), "--out", str(tmp_path / "p.png"), "--step-column", "it", "--length-column", "L",
            "--loss-column", "nll", "--time-column", "t", "--run-column", "run"]
    assert main(argv) == 0


def test_bad_json_names_the_line(tmp_path, capsys, rows):
    metrics = tmp_path / "metrics.jsonl"
    lines = [json.dumps(row) for row in rows[:5]]
    lines[2] = lines[2][:-3]
    metrics.write_text("\n".join(lines) + "\n")
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 2
    error = capsys.readouterr().err
    assert f"{metrics}: line 3: bad JSON" in error and "Traceback" not in error


def test_missing_column_names_the_line(tmp_path, capsys, rows):
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, rows[:5], columns=("run_id", "step", "seq_len", "loss"))
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 2
    assert f"{metrics}: line 2: missing column 'wall_time'" in capsys.readouterr().err


def test_non_numeric_loss_names_the_line(tmp_path, capsys, rows):
    metrics = tmp_path / "metrics.csv"
    broken = [dict(row) for row in rows[:6]]
    broken[3]["loss"] = "abc"
    write_csv(metrics, broken)
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 2
    assert f"{metrics}: line 5: column 'loss' has non-numeric value 'abc'" in capsys.readouterr().err


def test_too_few_lengths_and_missing_file(tmp_path, capsys, rows):
    metrics = tmp_path / "metrics.jsonl"
    write_jsonl(metrics, [row for row in rows if row["seq_len"] in (2, 4)])
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 2
    assert "at least 3 distinct lengths" in capsys.readouterr().err
    assert main([str(tmp_path / "absent.csv"), "--out", str(tmp_path / "p.png")]) == 2
    assert "absent.csv" in capsys.readouterr().err
    assert main([]) == 2


def test_the_fit_command_is_registered():
    assert COMMANDS["fit"] == ("rcswarm.cli.fit", "fit scaling laws to recorded metrics and plot them")


def test_fit_reads_a_run_directory_of_state_dirs(tmp_path, capsys):
    """The state dirs a sweep leaves behind are enough: rcswarm fit RUN_DIR."""
    import math

    from rcswarm.cli.fit import main as fit_main
    from rcswarm.config.runspec import RunSpec
    from rcswarm.state.store import StateStore

    for length in (2, 4, 8, 16):
        store = StateStore(tmp_path / "run" / "state" / f"run-L{length}")
        spec = RunSpec.from_dict({"inner": {"steps": 10}, "data": {"seq_len": length}})
        store.set_many({"spec_json": spec.to_json(), "run_id": f"r{length}"})
        rows = []
        for version in range(30):
            for k in range(10):
                step = version * 10 + k + 1
                loss = 5.4 * length ** (-0.3 * (1 - math.exp(-step / 120)))
                rows.append((f"r{length}", "w", version, 100 + step, length, 8, loss, 64, 0.0, 0.0, 0.0, 0, 0, "",
                             0.01 * length * step))
        if length == 4:
            # A round of the L = 2 run that a re-joining worker reported here (issue #33): 11 rows at L = 2.
            rows += [(f"r{length}", "r1w5-stray", 12, 500 + k, 2, 8, 9.0, 16, 0.0, 0.0, 0.0, 0, 0, "", 5.0 + k)
                     for k in range(11)]
        store.add_metrics(rows)
        store.close()
    assert fit_main([str(tmp_path / "run"), "--out", str(tmp_path / "fit.png")]) == 0
    printed = capsys.readouterr()
    assert "α∞" in printed.out and (tmp_path / "fit.png").stat().st_size > 1000
    # The stray rows are named (run, table, workers, version, length) and left out; no "line" of a directory.
    (note,) = printed.err.splitlines()
    assert "run 'r4'" in note and "run-L4/state.sqlite, table metrics" in note
    assert "11 training rows at seq_len 2" in note
    assert "r1w5-stray" in note and "version 12" in note and "line" not in note
    assert fit_main([str(tmp_path / "empty-dir-that-does-not-exist"), "--out", str(tmp_path / "x.png")]) == 2


def test_a_fit_the_data_do_not_identify_prints_not_enough_data(tmp_path, capsys, rows):
    """Every length cut to its first 1,000 steps, recorded every 25th (40 steps each): the caveats replace the
    numbers, and no crossover is predicted from the fit."""
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, [row for row in rows if row["step"] <= 1000])
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"α∞ \[90% interval\]\s*│\s*not enough data \(fitted", printed), printed
    assert "not enough data: too few recorded steps" in printed
    assert "not enough data (the fit" in printed  # a table cell: rich may wrap the rest


def test_fit_png_has_the_law_panel_and_plain_tick_labels(tmp_path, rows):
    """Four panels; the law's x axis reads 2, 4, 8, 16 and no axis of the figure uses a 10^k label."""
    from matplotlib.figure import Figure

    from rcswarm.cli import fit as fit_cli
    from rcswarm.observe.analysis import Columns, analyse, length_curves, read_metrics

    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, rows)
    analysis = analyse(length_curves(metrics, read_metrics(metrics, Columns("step", "seq_len", "loss", "wall_time",
                                                                             "run_id"))))
    figures = []
    real_savefig = Figure.savefig

    def keep(figure, *args, **kwargs):
        figures.append(figure)
        return real_savefig(figure, *args, **kwargs)

    Figure.savefig = keep
    try:
        fit_cli.plot(analysis, tmp_path / "fit.png")
    finally:
        Figure.savefig = real_savefig
    (figure,) = figures
    by_step, alphas, by_time, law = figure.axes
    assert law.get_xlabel() == "trained sequence length L" and law.get_title().startswith("training loss at step")
    assert [label.get_text() for label in law.get_xticklabels()] == ["2", "4", "8", "16"]
    for axes in (by_step, by_time, law):
        for label in [*axes.get_xticklabels(), *axes.get_yticklabels()]:
            assert "10^" not in label.get_text() and "times" not in label.get_text(), label.get_text()
    # Observed crossovers are labelled with their pair, predicted ones marked as predicted.
    texts = [text.get_text() for text in by_time.texts]
    assert any(text.strip() == "4→8" for text in texts) and any(text.strip() == "4→8 predicted" for text in texts)


def test_a_sweep_dir_with_idle_lengths_names_them(tmp_path, capsys):
    from rcswarm.config.runspec import RunSpec
    from rcswarm.state.store import StateStore

    for length in (2, 4, 8):
        store = StateStore(tmp_path / "run" / "state" / f"run-L{length}")
        spec = RunSpec.from_dict({"inner": {"steps": 10}, "data": {"seq_len": length}})
        store.set_many({"spec_json": spec.to_json(), "run_id": f"r{length}"})
        if length == 2:
            store.add_metrics([(f"r{length}", "w", 0, step, length, 8, 3.0 / step, 64, 0.0, 0.0, 0.0, 0, 0, "",
                                float(step)) for step in range(1, 11)])
        store.close()
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "fit.png")]) == 2
    error = capsys.readouterr().err
    assert "the runs at L = 4, 8 below" in error and "have no training metrics yet" in error
    assert "train a sweep" not in error


EXPORTED = ("run_id", "worker_id", "version", "step", "seq_len", "batch", "loss", "tokens", "wall_time")


def exported_table(rows):
    """The coordinator's metrics table as exported: each row with its tokens, and every 50th preceded by a round's
    pull row (0 tokens, no loss); one training row without a loss (NaN: NULL in the table)."""
    out = []
    for index, row in enumerate(rows):
        if index % 50 == 0:
            out.append({**row, "loss": None, "tokens": 0})
        out.append({**row, "version": 0, "batch": 4, "tokens": 4 * row["seq_len"]})
    out[5] = {**out[5], "loss": float("nan")}
    return out


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_an_exported_metrics_table_leaves_out_the_rows_that_are_not_training_rows(tmp_path, capsys, rows, suffix):
    metrics = tmp_path / f"metrics.{suffix}"
    table = exported_table(rows)
    if suffix == "csv":
        write_csv(metrics, table, columns=EXPORTED)
    else:
        metrics.write_text("".join(json.dumps(row) + "\n" for row in table))  # NaN as JSON's NaN, None as null
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 0
    captured = capsys.readouterr()
    skipped = len(range(0, len(rows), 50)) + 1
    lines = "[2, 7, 53, …," if suffix == "csv" else "[1, 6, 52, …,"  # after the header line, or from line 1
    assert f"{metrics}: skipped {skipped} rows that are not training rows (tokens 0 or no 'loss'" in captured.err
    assert f"at lines {lines}" in captured.err and "α∞" in captured.out and "not enough data" not in captured.out


def test_a_csv_saved_with_a_byte_order_mark_is_read(tmp_path, capsys, rows):
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, rows)
    metrics.write_bytes(b"\xef\xbb\xbf" + metrics.read_bytes())  # as Excel saves "CSV UTF-8"
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 0, capsys.readouterr().err
    assert "α∞" in capsys.readouterr().out


def test_run_ids_are_printed_as_text_not_markup(tmp_path, capsys, rows):
    link = "[link=https://e.example]c[/link]"
    names = {2: "[/]", 4: link}
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, [{**row, "run_id": names.get(row["seq_len"], row["run_id"])} for row in rows])
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 0  # "[/]" was rich's MarkupError
    printed = capsys.readouterr().out
    assert " [/] │" in printed and f" {link} │" in printed, printed


def test_a_fit_of_hundreds_of_lengths_takes_those_with_the_most_steps_and_says_so(tmp_path, capsys, rows):
    from rcswarm.observe.analysis import MAX_LENGTHS

    stray = [{"run_id": f"r{length}", "worker_id": "w", "step": step, "seq_len": length,
              "loss": 3.0 * length ** -0.1, "wall_time": step * length / 1000.0}
             for length in range(100, 300) for step in (25, 50)]
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, rows + stray)
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 0
    printed = capsys.readouterr().out.replace("\n", " ")
    assert "lengths left out" in printed and f"{204 - MAX_LENGTHS} of 204 lengths left out" in printed


def test_lengths_whose_times_do_not_overlap_keep_the_fit(tmp_path, capsys, rows):
    metrics = tmp_path / "metrics.csv"
    write_csv(metrics, [{**row, "wall_time": row["wall_time"] + (1e5 if row["seq_len"] == 4 else 0.0)} for row in rows])
    assert main([str(metrics), "--out", str(tmp_path / "p.png")]) == 0  # was rc 2: "expected ... times to overlap"
    printed = capsys.readouterr().out
    alpha_inf = float(re.search(r"α∞ \[90% interval\]\s*│\s*([0-9.]+) \[", printed).group(1))
    assert alpha_inf == pytest.approx(0.308, rel=0.1) and "do not" in printed and "overlap" in printed


def test_a_smooth_below_one_and_a_missing_column_are_usage_errors_naming_the_flags(tmp_path, capsys):
    """`--smooth 0` printed the tables and then "window=0: ..."; a file without a run column named no flag."""
    metrics = tmp_path / "m.csv"
    metrics.write_text("step,seq_len,loss,wall_time\n1,2,3.0,0.1\n")
    assert main([str(metrics), "--smooth", "0"]) == 2
    assert "rcswarm fit: --smooth 0: expected a positive number of steps" in capsys.readouterr().err
    assert main([str(metrics)]) == 2
    err = capsys.readouterr().err
    assert "missing column 'run_id'" in err and "--run-column" in err
