"""`rcswarm worker` flags a review of the command line (2026-11-29) found misnamed or taken though they cannot work.

Before: `--max-unavailable-s inf` (the former name of --patience-s) was refused as `--patience-s inf`; `--coordinator
127.0.0.1:0` was taken and the worker retried "Connection refused" until its patience ran out (port 0 is a server's
"any free port": nobody listens there); `--config`, `--out` and `--identity-path` were plain `Path`s, so `--out ''`
meant the working directory and `--config ''` read the directory "." as a config. Each is now a usage error (exit 2,
one line naming the flag) before anything is started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.cli import worker as worker_cli

TOKEN = "t" * 32


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def not_started(*_args, **_kwargs):
    raise AssertionError("started though the command line is refused")


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_cli, "set_threads", not_started)


@pytest.mark.parametrize("backend", [[], ["--backend", "hivemind"]])
@pytest.mark.parametrize(("flag", "value"), [("--max-unavailable-s", "inf"), ("--max-unavailable-s", "0"),
                                             ("--patience-s", "nan")])
def test_a_bad_patience_is_named_by_the_flag_typed(flag, value, backend, capsys):
    code = worker_cli.main([*backend, "--coordinator", "127.0.0.1:1", "--token", TOKEN, flag, value])
    assert code == 2
    assert one_line(capsys).startswith(f"rcswarm worker: {flag} {float(value)}: expected a finite number of seconds")


def test_the_former_name_still_sets_the_patience():
    args = worker_cli.parse_args(["--coordinator", "127.0.0.1:1", "--max-unavailable-s", "42"])
    assert args.patience_s == 42.0 and args.patience_s_flag == "--max-unavailable-s"
    args = worker_cli.parse_args(["--coordinator", "127.0.0.1:1"])
    assert args.patience_s == 300.0 and args.patience_s_flag == "--patience-s"


@pytest.mark.parametrize("backend", [[], ["--backend", "hivemind"]])
@pytest.mark.parametrize("target", ["127.0.0.1:0", "[::1]:0", "dns:///coordinator:0", "127.0.0.1:65536"])
def test_a_port_that_cannot_be_dialled_is_refused_naming_coordinator(target, backend, capsys):
    assert worker_cli.main([*backend, "--coordinator", target, "--token", TOKEN]) == 2
    port = target.rsplit(":", 1)[1]
    assert one_line(capsys) == (f"rcswarm worker: --coordinator {target!r}: port {port}: expected HOST:PORT with a "
                                "port in 1..65535 (0 cannot be dialled)")


def test_a_target_wrong_elsewhere_keeps_its_own_refusal(capsys):
    assert worker_cli.main(["--coordinator", "http://127.0.0.1:0", "--token", TOKEN]) == 2
    assert "http:// is a URL scheme" in one_line(capsys)
    assert worker_cli.dial_problem("127.0.0.1:65535") is None and worker_cli.dial_problem(None) is None


@pytest.mark.parametrize(("flag", "more"), [
    ("--config", []), ("--out", ["--config", "RUN.toml"]), ("--identity-path", ["--config", "RUN.toml"]),
])
def test_an_empty_hivemind_path_is_refused_not_taken_for_the_working_directory(flag, more, capsys):
    assert worker_cli.main(["--backend", "hivemind", *more, flag, ""]) == 2
    assert one_line(capsys) == f"rcswarm worker: {flag} '': expected a path"


def test_the_hivemind_paths_are_paths():
    args = worker_cli.parse_args(["--backend", "hivemind", "--config", "RUN.toml", "--out", "out",
                                  "--identity-path", "id.key"])
    assert (args.config, args.out, args.identity_path) == (Path("RUN.toml"), Path("out"), Path("id.key"))
