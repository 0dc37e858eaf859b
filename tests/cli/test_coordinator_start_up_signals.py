"""`rcswarm coordinator`'s signals between its start and its serving loop, and the clean-up of a start that failed
(in-process: real signals to the test's own process, each caught by a handler the coordinator installed).

Before (a review, 2026-11-29): `StartUpSignals.hand_over` reset SIGTERM to SIG_DFL before the serving handler was
installed, with SIGTERM blocked in the main thread only, so a SIGTERM then reached another thread and killed the
process; the port file was written before the hand-over, so a SIGTERM right after it was taken for a stopped start
(state dir removed, port file left naming a dead process); a second SIGTERM or Ctrl-C during the clean-up of a
stopped start raised KeyboardInterrupt out of main (a traceback, the state dir and its lock left behind); a port file
write that failed after creating `PORT.partial` left it; `--health-stall-s nan` was told as `health_stall_s = nan`.
A review of the run spec (2026-11-29): `inner.beta2 = 0` crashed the start (ZeroDivisionError in the norm bound), and
any crash of the start but a signal left the new state dir, which then refused the corrected config ("spec
differs"); a config nested ~900 levels deep ended in a bare RecursionError message naming no file (exit 1).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path

import pytest

from rcswarm.cli import coordinator as coordinator_cli
from rcswarm.cli.signals import StopSignal
from rcswarm.coordinator import close as close_module
from rcswarm.sync import norm_bound
from tests.helpers.specs import TOKEN, tiny_spec, write_spec


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_spec(tiny_spec(), tmp_path / "run.toml")


@pytest.fixture(autouse=True)
def handlers() -> object:
    """The test process's SIGTERM, SIGINT and SIGHUP handlers, given back after each test (a guard on SIGTERM that
    raises instead of ending pytest); yields the guard. SIGINT gets Python's default handler meanwhile, as in a
    terminal: a suite started in the background by a non-interactive shell (`make test &`, a CI runner) inherits SIGINT
    ignored, and the coordinator leaves an ignored SIGINT ignored (nohup), which hung the Ctrl-C cases."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def guard(_signum: int, _frame: object) -> None:
        raise Killed

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, guard)
    try:
        yield guard
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class Killed(Exception):
    """What the guard raises: SIGTERM reached the handler from before the coordinator's start-up."""


def argv(config: Path, state: Path, *more: str) -> list[str]:
    return ["--config", str(config), "--state-dir", str(state), "--port", "0", "--token", TOKEN, *more]


def run_main(arguments: list[str]) -> int | BaseException:
    """main's status, or what it raised (a KeyboardInterrupt too: pytest would take it for the user's Ctrl-C)."""
    try:
        return coordinator_cli.main(arguments)
    except BaseException as exc:  # noqa: BLE001
        return exc


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if " coordinator INFO " not in line and " coordinator WARNING " not in line]


@pytest.mark.parametrize(("first", "second"), [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT),
                                               (signal.SIGTERM, signal.SIGINT)])
def test_a_second_signal_during_the_clean_up_of_a_stopped_start_is_only_noted(first, second, tmp_path, config,
                                                                                capsys, monkeypatch, handlers):
    """`timeout`, systemd and Kubernetes signal again, and Ctrl-C is pressed twice: the clean-up (closing the stores,
    removing the new state dir) runs to its end once, and the exit is the first signal's."""
    state = tmp_path / "state"
    real_open, real_discard = coordinator_cli.open_group, coordinator_cli.discard_new_state
    discards = []

    def open_group(*args, **kwargs):
        group = real_open(*args, **kwargs)
        os.kill(os.getpid(), first)
        return group

    def discard(*args, **kwargs):
        discards.append(args)
        os.kill(os.getpid(), second)  # the second signal, while the clean-up runs
        return real_discard(*args, **kwargs)

    monkeypatch.setattr(coordinator_cli, "open_group", open_group)
    monkeypatch.setattr(coordinator_cli, "discard_new_state", discard)
    status = run_main(argv(config, state))
    assert status == 128 + first, f"main ended with {status!r}"
    err = capsys.readouterr().err
    said = f"rcswarm coordinator: stopped by {signal.Signals(first).name} while starting; removed the new state dir"
    assert errors(err) == [said], err
    assert len(discards) == 1, "the clean-up ran more than once"
    assert not state.exists() and [p.name for p in tmp_path.iterdir()] == ["run.toml"]
    assert signal.getsignal(signal.SIGTERM) is handlers and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigterm_while_a_failed_port_file_is_cleaned_up_leaves_the_failure_and_no_state(tmp_path, config, capsys,
                                                                                          monkeypatch, handlers):
    """The port file cannot be written (serving had begun): a SIGTERM while that start is undone neither breaks
    the clean-up off nor runs it again, and the status is the port file's failure."""
    state, port_file = tmp_path / "state", tmp_path / "port.json"
    real_discard = coordinator_cli.discard_new_state
    discards = []

    def write_port_file(path, info):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def discard(*args, **kwargs):
        discards.append(args)
        os.kill(os.getpid(), signal.SIGTERM)
        return real_discard(*args, **kwargs)

    monkeypatch.setattr(coordinator_cli, "write_port_file", write_port_file)
    monkeypatch.setattr(coordinator_cli, "discard_new_state", discard)
    status = run_main(argv(config, state, "--port-file", str(port_file)))
    assert status == 1, f"main ended with {status!r}"
    err = capsys.readouterr().err
    (line,) = errors(err)
    assert line.startswith("rcswarm coordinator: --port-file") and "Permission denied; stopped serving" in line, err
    assert len(discards) == 1, "the clean-up ran more than once"
    assert not state.exists() and [p.name for p in tmp_path.iterdir()] == ["run.toml"]
    assert signal.getsignal(signal.SIGTERM) is handlers, "the handler from before the start was not given back"


def test_a_sigterm_right_after_the_port_file_stops_a_serving_coordinator(tmp_path, config, capsys, caplog,
                                                                         monkeypatch, handlers):
    """The port file tells the world the coordinator serves: from then on SIGTERM stops it as any serving
    coordinator (status 0, its state kept), never as a start-up (status 143, the state dir removed, the port file
    left naming a process that is gone). The serving handler is in place before the port file is written."""
    state, port_file = tmp_path / "state", tmp_path / "port.json"
    real_write = coordinator_cli.write_port_file
    seen = []

    def write_port_file(path, info):
        real_write(path, info)
        seen.append(signal.getsignal(signal.SIGTERM))
        os.kill(os.getpid(), signal.SIGTERM)  # an orchestrator that reacts at once

    monkeypatch.setattr(coordinator_cli, "write_port_file", write_port_file)
    caplog.set_level(logging.INFO, logger="rcswarm.coordinator")
    status = run_main(argv(config, state, "--port-file", str(port_file)))
    assert status == 0, f"main ended with {status!r}:\n{capsys.readouterr().err}"
    assert len(seen) == 1 and getattr(seen[0], "__self__", None).__class__ is StopSignal, seen
    err = capsys.readouterr().err
    assert errors(err) == [], err
    assert any(r.getMessage().startswith("stopping: ") for r in caplog.records), caplog.text
    assert state.is_dir() and port_file.exists()
    assert signal.getsignal(signal.SIGTERM) is handlers, "the handler from before the start was not given back"


def test_the_hand_over_never_passes_sigterm_through_its_default_action(monkeypatch, handlers):
    """SIG_DFL between the start-up handler and the serving one ends the process when the kernel delivers SIGTERM
    to any thread but the one that blocked it: the serving handler replaces the start-up one in one step."""
    calls = []
    real_signal, real_mask = signal.signal, signal.pthread_sigmask

    def recorded_signal(sig, handler):
        calls.append((sig, handler))
        return real_signal(sig, handler)

    def recorded_mask(how, mask):
        calls.append(("mask", how))
        return real_mask(how, mask)

    start_up = coordinator_cli.StartUpSignals().install()
    monkeypatch.setattr(signal, "signal", recorded_signal)
    monkeypatch.setattr(signal, "pthread_sigmask", recorded_mask)
    stop = start_up.hand_over()
    try:
        assert all(handler not in (signal.SIG_DFL, signal.SIG_IGN) for _, handler in calls), calls
        assert not any(sig == "mask" for sig, _ in calls), calls
        assert signal.getsignal(signal.SIGTERM) == stop.handle and signal.getsignal(signal.SIGINT) == stop.handle
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5.0) and stop.signum == signal.SIGTERM
    finally:
        monkeypatch.undo()
        start_up.restore()
    assert signal.getsignal(signal.SIGTERM) is handlers and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_noted_during_the_start_up_stops_the_serving_loop_at_once(handlers):
    """A start-up signal whose KeyboardInterrupt something on the way swallowed is not lost at the hand-over."""
    start_up = coordinator_cli.StartUpSignals().install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler to run at
        stop = start_up.hand_over()
        assert stop.wait(5.0) and stop.signum == signal.SIGTERM
    finally:
        start_up.restore()


def test_a_port_file_write_that_fails_half_way_leaves_no_partial_file(tmp_path, config, capsys, monkeypatch):
    """A full disk fails the write() after open() created `PORT.partial`: it is removed with the rest."""
    state, port_file = tmp_path / "state", tmp_path / "port.json"
    real_write = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if not self.name.startswith("port."):
            return real_write(self, data, *args, **kwargs)
        with open(self, "w") as file:  # the file exists, with the part of it that fit
            file.write(data[:5])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(OSError):
        coordinator_cli.write_port_file(port_file, {"port": 1})
    assert not port_file.with_suffix(".partial").exists()
    assert coordinator_cli.main(argv(config, state, "--port-file", str(port_file))) == 1
    (line,) = errors(capsys.readouterr().err)
    assert "cannot write it: No space left on device; stopped serving" in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["run.toml"], "the partial port file (or the state) was left"


@pytest.mark.parametrize("value", ["nan", "inf", "0.001", "-1.0"])
def test_a_bad_health_stall_flag_is_named_as_the_flag(value, tmp_path, config, capsys):
    """The flag the user typed, not the run spec's key it overrides (as --max-calls and --stream-idle-s are)."""
    args = coordinator_cli.parse_args([*argv(config, tmp_path / "state"), "--health-stall-s", value])
    with pytest.raises(ValueError, match=rf"^--health-stall-s {value}: expected a number of seconds in \[1, "):
        coordinator_cli.serving_limits(args, tiny_spec())
    assert coordinator_cli.main([*argv(config, tmp_path / "state"), "--health-stall-s", value]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"rcswarm coordinator: --health-stall-s {value}: expected"), line
    assert not (tmp_path / "state").exists()


def test_a_beta2_of_zero_is_served(tmp_path, capsys, monkeypatch, handlers):
    """β2 = 0 (v_t = g_t², a legal Adam) has no automatic step bound unless β1 = 0: the start takes the fallback
    bound instead of dividing by zero, serves (stopped here by a SIGTERM once the port file is written) and keeps
    its state."""
    config = write_spec(tiny_spec(inner={"beta2": 0.0}), tmp_path / "run.toml")
    state, port_file = tmp_path / "state", tmp_path / "port.json"
    real_write = coordinator_cli.write_port_file

    def write_port_file(path, info):
        real_write(path, info)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(coordinator_cli, "write_port_file", write_port_file)
    status = run_main(argv(config, state, "--port-file", str(port_file)))
    assert status == 0, f"main ended with {status!r}:\n{capsys.readouterr().err}"
    assert errors(capsys.readouterr().err) == []
    assert (state / "state.sqlite").exists() and port_file.exists()
    assert signal.getsignal(signal.SIGTERM) is handlers


@pytest.mark.parametrize(("module", "name", "error"), [
    (norm_bound, "adam_step_bound", ZeroDivisionError("float division by zero")),  # how β2 = 0 crashed it
    (close_module, "update_norm_bound", KeyError("embedding.weight")),
])
def test_a_crash_deep_in_the_start_leaves_no_state_dir(module, name, error, tmp_path, config, monkeypatch, handlers):
    """A start that crashes (a bug: not a usage error, not a signal) still raises with its traceback, but first
    removes the state dir it created, so the next start, its config corrected, is not refused as another run's."""
    state = tmp_path / "state"

    def crash(*_args, **_kwargs):
        raise error

    monkeypatch.setattr(module, name, crash)
    with pytest.raises(type(error)):
        coordinator_cli.main(argv(config, state))
    assert not state.exists() and [p.name for p in tmp_path.iterdir()] == ["run.toml"]
    assert signal.getsignal(signal.SIGTERM) is handlers, "the handler from before the start was not given back"
    monkeypatch.undo()
    served = tmp_path / "port.json"
    real_write = coordinator_cli.write_port_file

    def write_port_file(path, info):
        real_write(path, info)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(coordinator_cli, "write_port_file", write_port_file)
    assert run_main(argv(config, state, "--port-file", str(served))) == 0  # the same state dir, started again


@pytest.mark.parametrize("levels", [900, 3000])
def test_a_config_nested_too_deeply_is_a_usage_error_naming_the_file(levels, tmp_path, capsys, handlers):
    config = tmp_path / "deep.toml"
    config.write_text("[model.overrides]\nx = " + "[" * levels + "]" * levels + "\n")
    assert coordinator_cli.main(argv(config, tmp_path / "state")) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line == f"rcswarm coordinator: run config {str(config)!r} is nested too deeply: expected arrays and " \
                   "tables nested at most 32 levels deep", line
    assert not (tmp_path / "state").exists()
