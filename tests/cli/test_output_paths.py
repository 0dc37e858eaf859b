"""Where a command writes: a file in the place of its output directory, an output of a type it cannot write, a
missing repository or a negative thread count are refused at once with the flag named (exit 2), before any work.

Each was a traceback before: `rcswarm run --run-dir FILE` and `bench diag --out FILE` at their mkdir,
`fit --out x.txt` in matplotlib after the fit, `coordinator --port-file DIR/MISSING/p.json` after it served,
`bench diag --threads -1` in torch; `bench diag --budget-minutes nan` trained 0 steps and reported them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.cli import bench as diag_bench
from rcswarm.cli import bench_gpu, fit
from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.cli import data as data_cli
from rcswarm.cli import run as run_cli
from rcswarm.cli.usage import output_dir_problem, output_file_problem
from tests.helpers.commands import status_of


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return path


def test_the_helpers_name_the_flag_the_value_and_what_is_in_the_way(tmp_path, a_file):
    assert output_dir_problem("--out", tmp_path / "new" / "deeper") is None  # made when it is written
    assert output_dir_problem("--out", a_file / "sub") == (
        f"--out {str(a_file / 'sub')!r}: {str(a_file)!r} is not a directory; expected a directory to write into "
        "(made if missing)")
    assert output_file_problem("--out", tmp_path / "new" / "x.png", (".png",)) is None
    assert output_file_problem("--out", tmp_path, (".png",)) == f"--out {str(tmp_path)!r}: expected a file ending in .png"
    assert output_file_problem("--out", tmp_path) == f"--out {str(tmp_path)!r} is a directory; expected a file"
    assert "is not a directory" in output_file_problem("--out", a_file / "x.png", (".png",))


def metrics_file(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.csv"
    rows = [f"{step},{length},{3 * length ** -0.3 * step ** -0.2:.5f},{step * length * 0.01},r{length}"
            for length in (8, 16, 32) for step in range(1, 40)]
    path.write_text("step,seq_len,loss,wall_time,run_id\n" + "\n".join(rows) + "\n")
    return path


def test_every_command_refuses_an_output_it_cannot_write(tmp_path, a_file, capsys):
    config = Path(__file__).resolve().parents[2] / "examples" / "run.toml"
    cases = [
        (run_cli.main, ["--run-dir", str(a_file / "run"), "--rounds", "1"], "rcswarm run: --run-dir"),
        (diag_bench.main, ["--task", "s5", "--models", "lstm", "--max-steps", "1", "--out", str(a_file)], "--out"),
        (data_cli.main, ["frames", "--repo", str(tmp_path), "--out", str(a_file)], "rcswarm data frames: --out"),
        (fit.main, [str(metrics_file(tmp_path)), "--out", str(a_file / "fit.png")], "rcswarm fit: --out"),
        (bench_gpu.main, ["--device", "cpu", "--out", str(a_file / "gpu.json")], "rcswarm bench gpu: --out"),
        (coordinator_cli.main, ["--config", str(config), "--state-dir", str(tmp_path / "state"), "--port", "0",
                                "--token", "t", "--port-file", str(a_file / "port.json")], "rcswarm coordinator: --port-file"),
    ]
    for main, argv, named in cases:
        assert status_of(main, argv) == 2, argv
        err = capsys.readouterr().err
        assert named in err and f"{str(a_file)!r} is not a directory" in err, err
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    "main, argv, expected",
    [
        (fit.main, ["METRICS", "--out", "fit.txt"], "rcswarm fit: --out 'fit.txt': expected a file ending in .png or .pdf or .svg"),
        (bench_gpu.main, ["--device", "cpu", "--out", "gpu.csv"], "rcswarm bench gpu: --out 'gpu.csv': expected a file ending in .json"),
        (data_cli.main, ["frames", "--repo", "MISSING", "--out", "OUT"], "--repo 'MISSING': 'MISSING' is not a directory; expected a git repository"),
        (diag_bench.main, ["--task", "s5", "--models", "lstm", "--threads", "-1"], "--threads -1: expected an integer >= 0"),
        (diag_bench.main, ["--task", "s5", "--models", "lstm", "--budget-minutes", "nan"], "--budget-minutes"),
    ],
)
def test_bad_values_are_refused_before_any_work(main, argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [str(metrics_file(tmp_path)) if a == "METRICS" else a for a in argv]
    before = sorted(tmp_path.iterdir())
    assert status_of(main, argv) == 2
    assert expected in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == before  # nothing written
