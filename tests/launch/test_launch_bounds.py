"""`rcswarm launch ray` values the CLI fuzz review (2026-11-29) found accepted: an infinite or huge --patience-s
(each worker retried for ever) or --poll-s, and a --device no worker trains on (checked by its form: the launcher
need not have CUDA). Each is a usage error naming the flag, before Ray is reached."""

from __future__ import annotations

import pytest

from rcswarm.cli import launch

BASE = ["ray", "--coordinator", "127.0.0.1:50051", "--workers", "1"]


def not_connected(*_args, **_kwargs):
    raise AssertionError("reached Ray though the command line is refused")


@pytest.mark.parametrize("flag", ["--patience-s", "--poll-s", "--start-timeout-s"])
@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_infinite_or_huge_seconds_are_refused(flag, value, monkeypatch, capsys):
    monkeypatch.setattr(launch, "connect", not_connected)
    extra = ["--detach"] if flag == "--start-timeout-s" else []
    assert launch.main([*BASE, *extra, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rcswarm launch ray: {flag} {float(value)}: expected a finite number of seconds"), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("device", ["bogus", "mps", "meta", "cuda:x"])
def test_a_device_no_worker_trains_on_is_refused(device, monkeypatch, capsys):
    monkeypatch.setattr(launch, "connect", not_connected)
    assert launch.main([*BASE, "--device", device]) == 2
    assert capsys.readouterr().err == f"rcswarm launch ray: --device {device!r}: expected auto, cpu, cuda or cuda:N\n"


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_the_devices_workers_train_on_pass_without_cuda_here(device):
    args = launch.parser().parse_args([*BASE[1:], "--device", device])
    assert launch.check_arguments(args) is None
