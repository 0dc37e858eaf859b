"""Command lines the CLI fuzz review (2026-11-29) found accepted, or ending in a traceback, though nothing useful
could follow: infinite or huge seconds (`rcswarm worker`, `status`, `dht`), a missing hivemind extra (`rcswarm dht`,
`rcswarm worker --backend hivemind`), a --maddrs-file that is a directory, and a mirror of a coordinator-backend
run. Each is a usage error (exit 2, one line naming the flag) before any network call or DHT start."""

from __future__ import annotations

import sys

import pytest

import rcswarm.worker
from rcswarm.cli import dht as dht_cli
from rcswarm.cli import status as status_cli
from rcswarm.cli import worker as worker_cli
from tests.helpers.commands import not_started, one_error_line
from tests.helpers.specs import tiny_spec, write_spec

TOKEN = "t" * 32
HIVEMIND_EXTRA = "needs the hivemind extra: pip install 'rcswarm[hivemind]'"


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    return one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("value", ["inf", "1e300"])
@pytest.mark.parametrize("flag", ["--rpc-timeout-s", "--transfer-timeout-s", "--patience-s"])
def test_worker_refuses_infinite_or_huge_seconds(flag, value, monkeypatch, capsys):
    monkeypatch.setattr(worker_cli, "set_threads", not_started)
    code = worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, flag, value])
    assert code == 2
    assert one_line(capsys).startswith(f"rcswarm worker: {flag} {float(value)}: expected a finite number of seconds")


@pytest.mark.parametrize("argv, flag", [(["--patience-s", "inf"], "--patience-s"),
                                        (["--rpc-timeout-s", "1e300"], "--rpc-timeout-s"),
                                        (["--threads", "100000"], "--threads 100000"),
                                        (["--threads", "18446744073709551616"], "--threads 18446744073709551616")])
def test_a_hivemind_worker_refuses_them_too(argv, flag, monkeypatch, capsys):
    monkeypatch.setattr(worker_cli, "set_threads", not_started)
    code = worker_cli.main(["--backend", "hivemind", "--coordinator", "127.0.0.1:1", "--token", TOKEN, *argv])
    assert code == 2
    assert one_line(capsys).startswith(f"rcswarm worker: {flag}")


@pytest.mark.parametrize("threads", ["100000", "18446744073709551616"])
def test_worker_refuses_threads_torch_cannot_set(threads, monkeypatch, capsys):
    monkeypatch.setattr(worker_cli, "set_threads", not_started)
    assert worker_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, "--threads", threads]) == 2
    assert one_line(capsys).startswith(f"rcswarm worker: --threads {threads}: expected 0..")


@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_status_refuses_an_infinite_or_huge_timeout(value, monkeypatch, capsys):
    monkeypatch.setattr(status_cli, "fetch_status", not_started)
    assert status_cli.main(["--coordinator", "127.0.0.1:1", "--token", TOKEN, "--timeout", value]) == 2
    assert one_line(capsys).startswith(f"rcswarm status: --timeout {float(value)}: expected a finite number of seconds")


def no_hivemind(monkeypatch) -> None:
    """This process as one without the hivemind extra."""
    monkeypatch.setitem(sys.modules, "hivemind", None)
    for name in ("hivemind_sync", "hivemind_worker"):
        monkeypatch.delitem(sys.modules, f"rcswarm.worker.{name}", raising=False)
        if name in vars(rcswarm.worker):  # getattr would import it (the package's lazy __getattr__)
            monkeypatch.delattr(rcswarm.worker, name)


@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_dht_refuses_an_infinite_or_huge_poll(value, monkeypatch, capsys):
    no_hivemind(monkeypatch)  # the DHT never starts: the refusal comes first
    assert dht_cli.main(["--poll-s", value]) == 2
    assert one_line(capsys).startswith(f"rcswarm dht: --poll-s {float(value)}: expected a finite number of seconds")


def test_dht_without_the_hivemind_extra_says_how_to_install_it(monkeypatch, capsys):
    no_hivemind(monkeypatch)
    assert dht_cli.main(["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]) == 2
    assert one_line(capsys) == f"rcswarm dht: {HIVEMIND_EXTRA}"


def test_a_hivemind_worker_without_the_hivemind_extra_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    no_hivemind(monkeypatch)
    monkeypatch.setattr(worker_cli, "set_threads", not_started)
    config = write_spec(tiny_spec(sync={"backend": "hivemind", "codec": "int8"}), tmp_path / "run.toml")
    assert worker_cli.main(["--backend", "hivemind", "--config", str(config)]) == 2
    assert one_line(capsys) == f"rcswarm worker: {HIVEMIND_EXTRA}"


def test_dht_refuses_a_maddrs_file_that_is_a_directory_before_it_starts(tmp_path, monkeypatch, capsys):
    no_hivemind(monkeypatch)
    assert dht_cli.main(["--maddrs-file", str(tmp_path)]) == 2
    assert one_line(capsys) == f"rcswarm dht: --maddrs-file {str(tmp_path)!r} is a directory; expected a file"


def test_dht_refuses_to_mirror_a_coordinator_backend_run(tmp_path, monkeypatch, capsys):
    """Its workers send their metrics to the coordinator, never to the DHT: such a mirror ran and mirrored nothing."""
    no_hivemind(monkeypatch)
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    assert dht_cli.main(["--config", str(config), "--state-dir", str(tmp_path / "state")]) == 2
    assert one_line(capsys).startswith(f"rcswarm dht: --config {str(config)!r}: sync.backend is 'coordinator', "
                                       "not \"hivemind\"")
    assert not (tmp_path / "state").exists()
