"""A following `rcswarm launch ray` whose Ray head is gone, without Ray: when the head counts as lost (`head_lost`), the
watch that runs each poll in a thread and probes the GCS (`HeadWatch`), the follower under it, and the command's one
line and exit status. Before, the follower waited inside Ray's call to the GCS until Ray ended the process a minute
later with its own message (status 1). The test on a real Ray head is tests/swarm/test_ray_head_lost.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rcswarm.cli import launch
from rcswarm.launch import HEAD_LOST_STATUS, HeadLost, HeadOptions, HeadWatch, LaunchPlan, head_lost, head_lost_line
from rcswarm.launch import status as status_module
from rcswarm.launch.head import Probes, probe
from rcswarm.worker import WorkerOptions

OPTIONS = HeadOptions("10.0.0.5:6379", unreachable_after_s=10.0)
PLAN = LaunchPlan(WorkerOptions("127.0.0.1:7000", device="cpu"), workers=2, gpus_per_worker=1.0, cpus_per_worker=0.5)


def probes(*seen: tuple[float, str | None]) -> Probes:
    found = Probes()
    for now, problem in seen:
        found = found.seen(now, problem)
    return found


# ---- when the head counts as lost (pure) ----------------------------------------------------------------------


def test_a_head_is_lost_once_its_gcs_answered_nothing_for_the_whole_grace():
    refused = probes((100.0, "connection refused"), (101.0, "connection refused"))
    assert head_lost(109.9, refused, OPTIONS) is None, "less than the grace: a GCS restarting in place is no loss"
    assert head_lost(110.0, refused, OPTIONS) == (
        "the Ray head at 10.0.0.5:6379 is unreachable (its GCS: connection refused, for 10s)")


def test_one_failed_probe_or_an_answer_between_failures_is_no_loss():
    assert head_lost(500.0, Probes(), OPTIONS) is None
    assert head_lost(500.0, probes((100.0, "no answer")), OPTIONS) is None, "a single probe may just be slow"
    answered = probes((100.0, "connection refused"), (105.0, None), (106.0, "connection refused"), (107.0, "no answer"))
    assert answered.failing_since == 106.0 and answered.problem == "no answer"
    assert head_lost(115.0, answered, OPTIONS) is None and head_lost(116.0, answered, OPTIONS) is not None


def test_a_probe_says_why_nothing_answers():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert probe(f"127.0.0.1:{port}", 1.0) == "connection refused"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert probe("127.0.0.1:%d" % listening.getsockname()[1], 1.0) is None
    assert probe("auto", 1.0) is None, "not a HOST:PORT: nothing to probe"


def test_the_line_says_what_the_loss_means_and_the_command_that_resumes():
    command = ["rcswarm", "launch", "ray", "--address", "auto", "--namespace", "my run", "--workers", "2"]
    outside = head_lost_line("the Ray head at 10.0.0.5:6379 is unreachable (…)", "run", "coord:50051", "", command)
    assert "\n" not in outside
    assert outside.startswith("the Ray head at 10.0.0.5:6379 is unreachable (…): the worker actors of namespace run and "
                              "their supervisor go with the head")
    assert "the coordinator at coord:50051 is outside Ray and keeps the run" in outside
    assert outside.endswith("resume with: rcswarm launch ray --address auto --namespace 'my run' --workers 2")
    inside = head_lost_line("lost", "run", "head:50051", "/data/state", command)
    assert "the coordinator actor died with it, and its state dir /data/state on the head keeps the run" in inside


# ---- the watch and the follower ------------------------------------------------------------------------------


def hung() -> None:
    """A poll of a dead head's GCS: Ray keeps waiting."""
    threading.Event().wait(60)


def test_a_poll_that_hangs_on_a_dead_head_ends_in_a_bounded_time():
    watch = HeadWatch(HeadOptions("127.0.0.1:1", unreachable_after_s=0.3), prober=lambda address, timeout: "refused",
                      every_s=0.05)
    started = time.monotonic()
    with pytest.raises(HeadLost, match=r"^the Ray head at 127.0.0.1:1 is unreachable \(its GCS: refused, for 0s\)$"):
        watch.run(hung, threading.Event())
    assert time.monotonic() - started < 5


def test_a_quick_poll_is_not_probed_and_a_failed_one_is_raised_again_while_the_head_answers():
    asked = []
    watch = HeadWatch(HeadOptions("127.0.0.1:1", unreachable_after_s=0.2),
                      prober=lambda address, timeout: asked.append(address), every_s=0.05)
    assert watch.run(lambda: {"rows": []}, threading.Event()) == {"rows": []} and asked == []

    def broken() -> None:
        raise RuntimeError("not the head's fault")

    with pytest.raises(RuntimeError, match="not the head's fault"):
        watch.run(broken, threading.Event())
    assert asked == ["127.0.0.1:1"]


def test_a_poll_that_fails_because_the_head_is_gone_is_the_head_lost():
    watch = HeadWatch(HeadOptions("127.0.0.1:1", unreachable_after_s=0.2), prober=lambda address, timeout: "refused",
                      every_s=0.05)

    def broken() -> None:
        raise ConnectionError("GCS")

    with pytest.raises(HeadLost):
        watch.run(broken, threading.Event())


def test_a_stop_while_a_poll_hangs_still_stops_the_follower():
    watch = HeadWatch(HeadOptions("127.0.0.1:1"), prober=lambda address, timeout: "refused", every_s=0.05)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert watch.run(hung, stop) is None


def test_the_follower_of_a_dead_head_raises_head_lost(monkeypatch, capsys):
    monkeypatch.setattr(status_module, "collect_status", lambda namespace: hung())
    watch = HeadWatch(HeadOptions("127.0.0.1:1", unreachable_after_s=0.2), prober=lambda address, timeout: "refused",
                      every_s=0.05)
    with pytest.raises(HeadLost):
        status_module.follow(PLAN, 0.01, threading.Event(), watch)


# ---- the command ----------------------------------------------------------------------------------------------


def test_the_launcher_ends_with_one_line_and_status_3_when_its_head_is_lost(monkeypatch, capsys):
    def follow(plan, poll_s, stop, watch):
        assert watch.options.address == "127.0.0.1:6390"  # `--address auto` resolved to the GCS the driver joined
        raise HeadLost("the Ray head at 127.0.0.1:6390 is unreachable (its GCS: connection refused, for 10s)")

    exits = []
    monkeypatch.setattr(launch, "connect", lambda address, namespace: None)
    monkeypatch.setattr(launch, "ensure_supervisor", lambda plan: None)
    monkeypatch.setattr(launch, "gcs_address", lambda given: "127.0.0.1:6390")
    monkeypatch.setattr(launch, "follow", follow)
    monkeypatch.setattr(launch, "exit_now", lambda status: exits.append(status) or status)
    argv = ["ray", "--address", "auto", "--namespace", "run", "--coordinator", "127.0.0.1:7000", "--workers", "2",
            "--cpu-only"]
    assert launch.main(argv) == HEAD_LOST_STATUS == 3 and exits == [3]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("rcswarm launch ray: the Ray head at 127.0.0.1:6390 is unreachable")
    assert err.rstrip().endswith("resume with: rcswarm launch ray --address auto --namespace run --coordinator "
                                 "127.0.0.1:7000 --workers 2 --cpu-only")


def test_the_gcs_address_of_a_driver_that_never_connected_imports_no_ray() -> None:
    """`launch` asks for the GCS address before following: without a connection it is the address given, and Ray is
    not imported by asking (an import fixes Ray's settings from the environment as it is then: the real-Ray tests,
    which set theirs first, failed when a launcher test ran before them)."""
    import sys

    from rcswarm.launch import gcs_address

    if "ray" in sys.modules:
        pytest.skip("Ray was imported by an earlier test in this process")
    assert gcs_address("127.0.0.1:6379") == "127.0.0.1:6379"
    assert "ray" not in sys.modules
