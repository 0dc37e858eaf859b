"""Paths the OS refuses, empty paths, failures after serving began, flags named in their errors, and signals during
start-up: each ends in one line and an exit status, not a traceback, and leaves no state behind.

Before: a 300-character --state-dir/--out/--run-dir, or one under a parent that cannot be searched, raised from
Path.exists (Python 3.11 hides only ENOENT, ENOTDIR, EBADF, ELOOP); an empty path meant the working directory (a
coordinator served its state there); an unwritable --port-file raised after serving and left the new state dir; a
failed dataset write raised; `--vocab-size 2**64` raised OverflowError; `--max-calls push=0` named `max_calls['push']`;
a Ctrl-C inside an import ended in an ImportError traceback; SIGTERM while starting killed the coordinator silently.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.cli import data as data_cli
from rcswarm.cli import fit as fit_cli
from rcswarm.cli import main as main_cli
from rcswarm.cli import run as run_cli
from tests.helpers.commands import status_of
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

LONG = "x" * 300


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_spec(tiny_spec(), tmp_path / "run.toml")


def coordinator_argv(config: Path, state: Path, *more: str) -> list[str]:
    return ["--config", str(config), "--state-dir", str(state), "--port", "0", "--token", TOKEN, *more]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if " coordinator INFO " not in line and " coordinator WARNING " not in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def output_cases(tmp_path: Path, config: Path, name: str) -> list:
    return [
        (coordinator_cli.main, coordinator_argv(config, tmp_path / name), "rcswarm coordinator: --state-dir"),
        (fit_cli.main, [str(config), "--out", str(tmp_path / f"{name}.png")], "rcswarm fit: --out"),
        (data_cli.main, ["frames", "--repo", str(tmp_path), "--out", str(tmp_path / name)], "rcswarm data frames: --out"),
        (run_cli.main, ["--run-dir", str(tmp_path / name), "--rounds", "1"], "rcswarm run: --run-dir"),
    ]


def test_a_name_too_long_is_a_usage_error_naming_the_flag(tmp_path, config, capsys):
    for main, argv, named in output_cases(tmp_path, config, LONG):
        assert status_of(main, argv) == 2, argv
        err = capsys.readouterr().err
        assert named in one_line(err) and os.strerror(errno.ENAMETOOLONG) in err, err


def test_a_parent_that_cannot_be_searched_is_a_usage_error_naming_the_flag(tmp_path, config, capsys, monkeypatch):
    locked = tmp_path / "locked"
    real_stat = Path.stat

    def stat(self, *args, **kwargs):  # a mode-000 parent for a non-root user (the tests run as root)
        if str(self).startswith(str(locked)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    for main, argv, named in output_cases(locked, config, "out"):
        assert status_of(main, argv) == 2, argv
        err = capsys.readouterr().err
        assert named in one_line(err) and "Permission denied" in err, err


def test_an_empty_path_is_refused_not_taken_for_the_working_directory(tmp_path, config, capsys, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    state = str(tmp_path / "state")
    cases = [
        (coordinator_cli.main, ["--config", str(config), "--state-dir", "", "--token", TOKEN], "--state-dir"),
        (coordinator_cli.main, ["--config", "", "--state-dir", state, "--token", TOKEN], "--config"),
        (coordinator_cli.main, coordinator_argv(config, Path(state), "--port-file", ""), "--port-file"),
        (coordinator_cli.main, coordinator_argv(config, Path(state), "--tls-self-signed", ""), "--tls-self-signed"),
        (coordinator_cli.main, coordinator_argv(config, Path(state), "--token-file", ""), "--token-file"),
        (data_cli.main, ["frames", "--repo", str(tmp_path), "--out", ""], "--out"),
        (data_cli.main, ["frames", "--repo", "", "--out", str(tmp_path / "data")], "--repo"),
        (run_cli.main, ["--run-dir", "", "--rounds", "1"], "--run-dir"),
        (run_cli.main, ["", "--rounds", "1"], "RUN.toml"),
        (fit_cli.main, [str(config), "--out", ""], "--out"),
        (fit_cli.main, [""], "METRICS"),
    ]
    for main, argv, flag in cases:
        assert status_of(main, argv) == 2, argv
        line = one_line(capsys.readouterr().err)
        assert line.endswith(f"{flag} '': expected a path"), line
        assert list(work.iterdir()) == [], argv
    assert not Path(state).exists() and not (tmp_path / "data").exists()


def test_a_port_file_that_cannot_be_written_stops_serving_and_removes_the_new_state(tmp_path, config, capsys,
                                                                                     monkeypatch):
    state, port_file = tmp_path / "state", tmp_path / "port.json"
    real_write = Path.write_text

    def write_text(self, *args, **kwargs):  # /sys or /proc for root: os.access passes, the write fails
        if self.name.startswith("port."):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    before = signal.getsignal(signal.SIGTERM)
    assert coordinator_cli.main(coordinator_argv(config, state, "--port-file", str(port_file))) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rcswarm coordinator: --port-file") and "Permission denied" in line, line
    assert not state.exists() and not port_file.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["run.toml"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_dataset_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    from rcswarm.data.frames import git_frames

    def fail(*_args, **_kwargs):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/proc/xx")

    monkeypatch.setattr(git_frames, "build_git_dataset", fail)
    assert data_cli.main(["frames", "--repo", str(tmp_path), "--out", str(tmp_path / "out"), "--no-progress"]) == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("rcswarm data frames: ") and "/proc/xx" in line, line


@pytest.mark.parametrize("more, expected", [
    (["--host", "127.0.0.1:5"], "--host '127.0.0.1:5': --host takes no port; use --port 5"),
    (["--host", "[::1]:5"], "--host '[::1]:5': --host takes no port; use --port 5"),
    (["--port", "5000", "--http-port", "5000"], "--http-port 5000: the same as --port"),
    (["--health-port", "5001", "--http-port", "5001"], "--http-port 5001: the same as --health-port"),
    (["--max-calls", "push=0"], "--max-calls 'push=0': expected an integer in [1,"),
    (["--stream-idle-s", "nan"], "--stream-idle-s nan: expected a number of seconds"),
    (["--max-calls", "polls=3"], "--max-calls 'polls=3': 'polls': unknown RPC kind; expected one of"),
])
def test_coordinator_flags_are_named_in_their_errors(more, expected, tmp_path, config, capsys):
    state = tmp_path / "state"
    assert coordinator_cli.main(coordinator_argv(config, state, *more)) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rcswarm coordinator: {expected}"), line
    assert not state.exists()


def test_loopback_ipv6_hosts_are_not_taken_for_ports():
    for host in ("::1", "[::1]", "127.0.0.1", "localhost", "fe80::1", "0.0.0.0"):
        assert coordinator_cli.host_port_problem(host) is None, host


def test_a_tls_dir_that_is_a_file_and_a_state_dir_the_os_refuses_name_their_flag(tmp_path, config, capsys,
                                                                                  monkeypatch):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert coordinator_cli.main(coordinator_argv(config, tmp_path / "s1", "--tls-self-signed", str(a_file))) == 2
    assert one_line(capsys.readouterr().err).startswith("rcswarm coordinator: --tls-self-signed")

    state = tmp_path / "state"

    def refuse(*_args, **_kwargs):  # /proc/rcswarm-x for root: os.access passes, mkdir fails
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(state))

    monkeypatch.setattr(coordinator_cli, "lock_state_dirs", refuse)
    assert coordinator_cli.main(coordinator_argv(config, state)) == 2
    line = one_line(capsys.readouterr().err)
    assert line == f"rcswarm coordinator: --state-dir {str(state)!r}: No such file or directory", line


@pytest.mark.parametrize("flag, value", [("--vocab-size", str(1 << 64)), ("--rows", "0"), ("--rows", "70000"),
                                         ("--cols", "0"), ("--frames-per-shard", str(1 << 64)),
                                         ("--max-file-bytes", str(1 << 64)), ("--max-commits", str(1 << 64))])
def test_data_count_flags_are_bounded_and_named(flag, value, tmp_path, capsys):
    out = tmp_path / "out"
    assert data_cli.main(["frames", "--repo", str(tmp_path), "--out", str(out), flag, value, "--no-progress"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"rcswarm data frames: {flag} {value}: expected an integer"), line
    assert not out.exists()


def test_data_least_rows_and_cols_are_the_editors():
    from rcswarm.data.frames.git_editor import MIN_COLS, MIN_ROWS

    assert data_cli.FLAG_BOUNDS["--rows"][0] == MIN_ROWS and data_cli.FLAG_BOUNDS["--cols"][0] == MIN_COLS


def interrupted_import_error() -> ImportError:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("cannot import name 'x' from partially initialized module 'y'") from None
    except ImportError as exc:
        return exc


def test_an_import_error_caused_by_ctrl_c_is_an_interruption(capsys, monkeypatch):
    assert main_cli.interrupted_import(interrupted_import_error())  # the context survives `from None`
    caused = ImportError("numpy: cannot load module more than once per process")
    caused.__cause__ = RuntimeError("x")
    caused.__cause__.__context__ = KeyboardInterrupt()
    assert main_cli.interrupted_import(caused)
    assert not main_cli.interrupted_import(ImportError("no module named x"))
    assert not main_cli.interrupted_import(KeyboardInterrupt())

    def import_module(_name):
        raise interrupted_import_error()

    monkeypatch.setattr(main_cli.importlib, "import_module", import_module)
    assert main_cli.main(["fit", "x"]) == 130
    assert capsys.readouterr().err == "rcswarm: interrupted\n"

    def broken(_name):
        raise ImportError("no module named x")

    monkeypatch.setattr(main_cli.importlib, "import_module", broken)
    with pytest.raises(ImportError):
        main_cli.main(["fit", "x"])


class Killed(Exception):
    """What the guard handler raises: SIGTERM reached the handler from before the coordinator's start-up."""


@pytest.mark.parametrize("when", ["model_problem", "open_group"])
def test_sigterm_while_starting_stops_with_one_line_and_removes_the_new_state(when, tmp_path, config, capsys,
                                                                               monkeypatch):
    state = tmp_path / "state"
    real = getattr(coordinator_cli, when)

    def slow_start_up(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    def guard(_signum, _frame):
        raise Killed

    monkeypatch.setattr(coordinator_cli, when, slow_start_up)
    previous = signal.signal(signal.SIGTERM, guard)
    try:
        status = coordinator_cli.main(coordinator_argv(config, state))
        assert signal.getsignal(signal.SIGTERM) is guard  # given back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == 128 + signal.SIGTERM
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rcswarm coordinator: stopped by SIGTERM while starting"), line
    assert not state.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["run.toml"]
