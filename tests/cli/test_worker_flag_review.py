"""`rcswarm worker` flags a review of the command line (2026-11-29) found misnamed or taken though they cannot work.

Before: `--max-unavailable-s inf` (the former name of --patience-s) was refused as `--patience-s inf`; `--coordinator
127.0.0.1:0` was taken and the worker retried "Connection refused" until its patience ran out (port 0 is a server's
"any free port": nobody listens there); `--config`, `--out` and `--identity-path` were plain `Path`s, so `--out ''`
meant the working directory and `--config ''` read the directory "." as a config. Each is now a usage error (exit 2,
one line naming the flag) before anything is started.

A second review found a --membership-file another worker runs on, a --state-dir that cannot be made (named by no
flag), timeouts no answer can come within and a host that is no host name taken or misnamed; the same holds for them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rcswarm.cli import worker as worker_cli
from rcswarm.worker import membership as membership_module
from rcswarm.worker.options import WorkerOptions, seconds_problem
from tests.helpers.commands import not_started, one_error_line

TOKEN = "t" * 32


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    return one_error_line(capsys.readouterr().err)


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


# A second review of the command's flags (2026-11-29, the membership file's lock): bad values that were taken, or
# refused without naming the flag.


def unwritable_dir(tmp_path: Path) -> Path | None:
    """A directory this process cannot write in (mode 0o500), None as root (which writes there anyway)."""
    if os.geteuid() == 0:
        return None
    directory = tmp_path / "read-only"
    directory.mkdir(mode=0o500)
    return directory


@pytest.mark.parametrize("where", ["under a file", "proc", "read-only"])
def test_a_state_dir_that_cannot_be_made_is_refused_naming_the_flag(where, tmp_path, capsys):
    """Before: `rcswarm worker: [Errno 30] Read-only file system: '.../x'` or `[Errno 2] No such file or directory`,
    naming no flag."""
    (tmp_path / "afile").write_text("")
    read_only = unwritable_dir(tmp_path)
    if where == "read-only" and read_only is None:
        pytest.skip("root writes in a directory of mode 0o500; 'under a file' and 'proc' fail for root too")
    state_dir = {"under a file": tmp_path / "afile" / "x", "proc": Path("/proc/1/nonexist"),
                 "read-only": (read_only or tmp_path) / "x"}[where]
    assert worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, "--state-dir", str(state_dir)]) == 2
    line = one_line(capsys)
    assert line.startswith(f"rcswarm worker: --state-dir {state_dir}: "), line
    assert "[Errno" not in line, line


def test_a_membership_file_whose_lock_cannot_be_made_is_refused_naming_the_flag(tmp_path, capsys):
    """Its lock (`<file>.lock`) is made beside it: a file where its directory would be is named as such."""
    (tmp_path / "afile").write_text("")
    membership = tmp_path / "afile" / "m.json"
    argv = ["--coordinator", "127.0.0.1:1", "--token", TOKEN, "--membership-file"]
    assert worker_cli.main([*argv, str(membership)]) == 2
    assert one_line(capsys) == (f"rcswarm worker: --membership-file {membership}: Not a directory: "
                                f"{str(tmp_path / 'afile')!r}")
    read_only = unwritable_dir(tmp_path)
    if read_only is not None:
        membership = read_only / "m.json"
        assert worker_cli.main([*argv, str(membership)]) == 2
        assert one_line(capsys).startswith(f"rcswarm worker: --membership-file {membership}: Permission denied")


def test_a_lock_file_that_cannot_be_written_is_named_by_its_flag(tmp_path):
    """A full disk while the holder is written into the lock file (StateDirLock's OSError has no file name)."""
    error = OSError(errno.ENOSPC, f"state dir {tmp_path}: cannot write its lock file coordinator.lock (...)")
    assert worker_cli.lock_os_problem("--state-dir", tmp_path, tmp_path / "coordinator.lock", error) == (
        f"--state-dir {tmp_path}: cannot write its lock file {tmp_path / 'coordinator.lock'} (No space left on device)")


def ends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused worker sends no Leave for the membership its file records."""
    monkeypatch.setattr(membership_module, "end_previous", not_started)


@pytest.mark.parametrize(("holder", "argv", "refusal"), [
    ((None, "m.json", True), ["--membership-file", "m.json"], "--membership-file {m} is in use by another worker"),
    # a worker on --state-dir D holds D/membership.json's lock too: one given that file alone is refused ...
    (("d", "d/membership.json", False), ["--membership-file", "d/membership.json"],
     "--membership-file {d}/membership.json is in use by another worker"),
    # ... and the other way round
    ((None, "d/membership.json", True), ["--state-dir", "d"], "--state-dir {d}: its {d}/membership.json is in use"),
])
def test_a_membership_file_in_use_is_refused_naming_its_holder(holder, argv, refusal, tmp_path, monkeypatch, capsys):
    """Two workers given one --membership-file (without --state-dir) were not refused: the second ended the first's
    live membership at its start (Leave "restarted"; the first re-joined), and the first, stopping, removed the file
    that by then recorded the second's membership. The holder here is this process (`hold_locks`, as a running
    worker holds them)."""
    ends_nothing(monkeypatch)
    monkeypatch.chdir(tmp_path)
    state_dir, membership, given = holder
    held = worker_cli.hold_locks(Path(state_dir) if state_dir else None, Path(membership), given)
    try:
        assert worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, *argv]) == 2
        line = one_line(capsys)
        assert line.startswith("rcswarm worker: " + refusal.format(m="m.json", d="d")), line
        assert f"(pid {os.getpid()} on " in line, line
    finally:
        worker_cli.release_locks(held)
    worker_cli.release_locks(worker_cli.hold_locks(None, Path(membership), True))  # the refused worker held none


@pytest.mark.parametrize("backend", [[], ["--backend", "hivemind"]])
@pytest.mark.parametrize("value", ["0.0001", "0.09"])
def test_an_rpc_timeout_no_answer_can_come_within_is_refused(backend, value, capsys):
    """`--rpc-timeout-s 0.0001` was taken: every call failed DEADLINE_EXCEEDED and the worker gave up "without an
    answer from the coordinator", blaming it."""
    assert worker_cli.main([*backend, "--coordinator", "127.0.0.1:1", "--token", TOKEN, "--rpc-timeout-s", value]) == 2
    assert one_line(capsys) == (f"rcswarm worker: --rpc-timeout-s {float(value)}: expected a number of seconds >= 0.1 "
                                "and at most 1e+06")


@pytest.mark.parametrize(("argv", "refusal"), [
    (["--transfer-timeout-s", "0.0001"], "--transfer-timeout-s 0.0001: expected a number of seconds >= 0.1"),
    (["--rpc-timeout-s", "5", "--transfer-timeout-s", "1"], "--transfer-timeout-s 1.0: expected at least "
                                                            "--rpc-timeout-s 5.0"),
])
def test_a_transfer_timeout_below_its_floor_is_refused(argv, refusal, capsys):
    """`--transfer-timeout-s 0.0001` was taken: 32.6 s of DEADLINE_EXCEEDED retries pulling version 0."""
    assert worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, *argv]) == 2
    assert one_line(capsys).startswith(f"rcswarm worker: {refusal}")


def test_the_timeout_floors_themselves_are_taken():
    options = WorkerOptions("127.0.0.1:1", rpc_timeout_s=0.1, transfer_timeout_s=0.1)
    assert (options.rpc_timeout_s, options.transfer_timeout_s) == (0.1, 0.1)
    assert seconds_problem("--patience-s", 0.001) is None  # a flag without a floor takes any seconds > 0
    with pytest.raises(ValueError, match=r"^--transfer-timeout-s 0\.01: expected a number of seconds >= 0\.1"):
        WorkerOptions("127.0.0.1:1", transfer_timeout_s=0.01)  # every options value, not only the command line's


@pytest.mark.parametrize("backend", [[], ["--backend", "hivemind"]])
@pytest.mark.parametrize(("target", "refusal"), [
    ("a b:50051", "host 'a b': expected a host name (letters, digits, '-', '_' and '.') or an IP address"),
    ("h\u00e9te:50051", "host 'h\u00e9te': expected a host name"),
    ("[zz]:50051", "'zz' is not an IP address; expected [V6]:PORT"),
])
def test_a_host_that_is_no_host_name_is_refused_naming_coordinator(target, refusal, backend, capsys):
    """`--coordinator "a b:50051"` was dialled and retried UNAVAILABLE for the whole patience."""
    assert worker_cli.main([*backend, "--coordinator", target, "--token", TOKEN]) == 2
    assert one_line(capsys).startswith(f"rcswarm worker: --coordinator {target!r}: {refusal}")


def test_a_long_rpc_timeout_alone_raises_the_default_transfer_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A review: `--rpc-timeout-s 400` alone was refused naming `--transfer-timeout-s 300.0`, a flag nobody typed (the
    default); the default transfer deadline is now at least the rpc timeout, and a shorter one given is refused."""
    started: list[WorkerOptions] = []
    monkeypatch.setattr(worker_cli, "run_worker", lambda options, *_args, **_kwargs: started.append(options) or 0)
    assert worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, "--rpc-timeout-s", "400"]) == 0
    assert (started[0].rpc_timeout_s, started[0].transfer_timeout_s) == (400.0, 400.0)
