"""The review of the Ray launcher (2026-11-29), without Ray: a worker actor whose worker cannot even be imported says
so, a follower and `--detach` judge the plan the supervisor runs now, two launches racing for the supervisor, a signal
during the launcher's start-up, and `--coordinator-arg` flags that the coordinator actor sets itself.

The Ray scenario of the same review (a follower of an earlier plan after a scale) is tests/swarm/test_ray_launch_review.py.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rcswarm.cli import launch
from rcswarm.launch import NAMESPACE, LaunchPlan, Verdict, ended, joined
from rcswarm.launch import status as status_module
from rcswarm.launch.status import ActorRow, removed
from rcswarm.worker import FAILED, FINISHED, TRAINING, WorkerOptions
from tests.helpers.specs import tiny_spec, write_spec
from tests.helpers.waiting import wait_for

PLAN = LaunchPlan(WorkerOptions("127.0.0.1:7000", device="cpu"), workers=3, gpus_per_worker=0.0, cpus_per_worker=0.5)
SCALED = replace(PLAN, workers=1)


def row(index: int, state: str = TRAINING, plan: LaunchPlan = PLAN, problem: str = "") -> ActorRow:
    """Worker actor `index` of `plan`, answering, as `collect_status` shows it."""
    info = {"state": state, "worker_id": "w", "problem": problem, "config": asdict(plan.worker_config(index))}
    return ActorRow(f"rcswarm-worker-{index}", "ALIVE", 0, 0, info)


def status(*rows: ActorRow, plan: LaunchPlan | None = PLAN, supervisor: bool = True) -> dict:
    """`collect_status`'s answer: the supervisor's plan (None: no supervisor answered), these rows."""
    return {"namespace": PLAN.namespace, "rows": list(rows), "plan": asdict(plan) if plan else None,
            "supervisor": supervisor, "events": []}


# ---- 1: a worker thread that dies before its `try` -----------------------------------------------------------------


def test_a_worker_actor_that_cannot_import_its_worker_fails_saying_why_and_ends_the_run(monkeypatch):
    """`import torch` (and the worker's module) sat before the start's `try`: on a Ray node without torch, or with a
    mismatched rcswarm, the thread died and the actor stayed "starting" with no reason for ever, so `ended` never held
    and a follower never exited. Now FAILED, status 1, with the exception's words."""
    from rcswarm.worker import RayWorker

    plan = replace(PLAN, workers=1)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as on a node without torch
    actor = RayWorker(asdict(plan.worker_config(0)))
    state, code, problem = wait_for(lambda: actor.outcome()[0] != "starting" and actor.outcome(), 10,
                                    "the actor's outcome")
    assert (state, code, problem) == (FAILED, 1, "ModuleNotFoundError: import of torch halted; None in sys.modules")
    info = {"state": state, "worker_id": "", "problem": problem, "config": asdict(actor.config)}
    verdict = ended(status(ActorRow("rcswarm-worker-0", "ALIVE", 0, 0, info), plan=plan), plan)
    assert verdict is not None and verdict.status == 1, verdict
    assert f"rcswarm-worker-0 failed: {problem}" in verdict.reason


# ---- 2: the plan the supervisor runs now --------------------------------------------------------------------------


def test_a_run_scaled_by_another_launch_is_judged_by_the_plan_the_supervisor_runs_now():
    """After "scale: the same command, another N" from a second driver, `ended` judged the first launcher's plan: its
    3 slots never all ended, and the follower polled for ever, its actors holding their resources."""
    scaled = status(row(0, FINISHED, plan=SCALED), plan=SCALED)
    assert ended(scaled, PLAN) == Verdict(0, "every worker's run has ended, each one finished")
    assert ended(status(row(0, TRAINING, plan=SCALED), plan=SCALED), PLAN) is None
    to_none = replace(PLAN, workers=0)
    assert ended(status(plan=to_none), PLAN) == Verdict(0, "no worker is wanted and none is left")
    assert removed(status(plan=None, supervisor=False), SCALED).status == 1
    assert removed(status(row(0, plan=SCALED), plan=None, supervisor=False), SCALED) is None


def test_a_follower_of_an_earlier_plan_follows_the_new_one_to_its_end(monkeypatch, capsys):
    """The follower says once that another launch replaced its plan, then ends with the new plan's run."""
    rounds = iter([status(row(0), row(1), row(2)), status(row(0, plan=SCALED), plan=SCALED),
                   status(row(0, plan=SCALED), plan=SCALED), status(row(0, FINISHED, plan=SCALED), plan=SCALED)])
    monkeypatch.setattr(status_module, "collect_status", lambda namespace: next(rounds))
    monkeypatch.setattr(status_module, "stop_all", lambda namespace: ["removed"])
    verdict = status_module.follow(PLAN, 0.01, threading.Event())
    assert verdict == Verdict(0, "every worker's run has ended, each one finished")
    out = capsys.readouterr().out
    assert out.count("another launch replaced this plan: the supervisor of namespace rcswarm now runs 1 workers of "
                     "0.5 CPU joining 127.0.0.1:7000: following it") == 1, out


def test_a_detached_launch_whose_plan_another_launch_replaced_says_so():
    """`--detach` waited out --start-timeout-s for a plan no supervisor ran and said its workers had not joined."""
    verdict = joined(status(row(0, plan=SCALED), plan=SCALED), PLAN)
    assert verdict == Verdict(1, "another launch replaced this plan: the supervisor of namespace rcswarm now runs 1 "
                                 "workers of 0.5 CPU joining 127.0.0.1:7000")
    assert joined(status(row(0), row(1), row(2), plan=None, supervisor=False), PLAN) == Verdict(
        0, "every worker joined (3)"), "no supervisor answered this poll: judged by the launcher's own plan"


# ---- 3: two launches racing for the supervisor --------------------------------------------------------------------


class _Namespace:
    """A stand-in for a Ray namespace's named supervisor (no Ray): creating one with `get_if_exists` hands back the
    registered one, as Ray does; a killed one leaves the registry."""

    def __init__(self) -> None:
        self.registered: types.SimpleNamespace | None = None
        self.killed: list[dict] = []
        self.created = 0

    def create(self, plan: dict) -> types.SimpleNamespace:
        if self.registered is None:
            self.created += 1
            self.registered = types.SimpleNamespace(plan=plan)
        return self.registered

    def ray(self) -> types.SimpleNamespace:
        options = types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(remote=self.create))
        return types.SimpleNamespace(remote=lambda cls: options, kill=self.kill)

    def kill(self, handle, no_restart: bool) -> None:
        self.killed.append(handle.plan)
        if handle is self.registered:
            self.registered = None


def test_a_launch_that_loses_the_race_for_the_supervisor_replaces_the_winners_plan(monkeypatch):
    """Both launches found no supervisor; the other created its own first, and `get_if_exists` handed it to this one,
    which took it silently (and later exited 1 saying its workers had not joined). Now this launch replaces it, as a
    launch after it would."""
    from rcswarm.launch import supervisor as module

    other = asdict(replace(PLAN, workers=2))
    namespace = _Namespace()
    looked = iter([None])  # this launch looks before the other one's supervisor exists; then it sees the registry
    monkeypatch.setitem(sys.modules, "ray", namespace.ray())
    monkeypatch.setattr(module, "lookup", lambda name, ns: next(looked, namespace.registered))
    monkeypatch.setattr(module, "call", lambda handle, method, *a, **kw: handle.plan if method == "plan" else None)
    namespace.create(other)  # the other launch, at the same moment
    handle = module.ensure_supervisor(PLAN)
    assert handle.plan == asdict(PLAN) and namespace.registered is handle
    assert namespace.killed == [other] and namespace.created == 2


def test_launches_that_keep_racing_for_the_supervisor_end_naming_the_plan_that_runs(monkeypatch):
    from rcswarm.launch import supervisor as module

    other = asdict(replace(PLAN, workers=2))
    namespace = _Namespace()
    monkeypatch.setitem(sys.modules, "ray", namespace.ray())
    monkeypatch.setattr(module, "lookup", lambda name, ns: None)  # the other launch recreates its own each time
    monkeypatch.setattr(module, "call", lambda handle, method, *a, **kw: handle.plan if method == "plan" else None)
    monkeypatch.setattr(namespace, "create", lambda plan: types.SimpleNamespace(plan=other))
    with pytest.raises(RuntimeError, match=r"^another launch keeps starting the supervisor of namespace rcswarm with "
                                           r"another plan \(2 workers of 0\.5 CPU joining 127\.0\.0\.1:7000\)"):
        module.ensure_supervisor(PLAN)


# ---- 4: a signal during the start-up ------------------------------------------------------------------------------


@pytest.mark.parametrize(("step", "sig", "words"), [
    ("start_coordinator", signal.SIGTERM, "while starting the coordinator actor"),
    ("ensure_supervisor", signal.SIGINT, "while starting the supervisor"),
])
def test_a_signal_during_the_start_up_says_what_stays_and_exits_128_plus_its_number(tmp_path, monkeypatch, capsys,
                                                                                       step, sig, words):
    """The handler was installed after `start_coordinator` (up to 130 s) and `ensure_supervisor`: SIGTERM there ended
    the launcher with Ray's C++ dump (status 15), SIGINT with "interrupted" (130), the coordinator actor left running
    and no --stop said. A slow start-up step that is signalled, under a handler that fails the test when it is the one
    that runs (as the default would have ended the launcher)."""
    release, exits, later = threading.Event(), [], []

    def slow(*args):
        os.kill(os.getpid(), sig)
        release.wait(30)
        return "127.0.0.1:7000"

    def reached_default(signum, frame):
        raise AssertionError(f"{signal.Signals(signum).name} reached the handler the launcher had before")

    monkeypatch.setattr(launch, "start_coordinator", slow if step == "start_coordinator" else lambda ns, spec: "h:1")
    monkeypatch.setattr(launch, "ensure_supervisor", slow if step == "ensure_supervisor" else later.append)
    monkeypatch.setattr(launch, "named_actors", lambda namespace: ["rcswarm-coordinator", "other-actor"])
    monkeypatch.setattr(launch, "exit_now", lambda code: exits.append(code) or code)
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    args = launch.parser().parse_args(["--address", "127.0.0.1:6379", "--with-coordinator", "--config", str(config),
                                       "--state-dir", str(tmp_path / "state"), "--coordinator-arg=--insecure",
                                       "--workers", "1", "--cpu-only"])
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(sig, reached_default)
    try:
        assert launch.launch(args) == 128 + sig and exits == [128 + sig]
    finally:
        release.set()
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert later == [], "nothing more starts after the signal"
    err = capsys.readouterr().err
    assert err == (f"rcswarm launch ray: the launcher stops ({signal.Signals(sig).name}) {words}; rcswarm-coordinator "
                   "stays in namespace rcswarm (detached: what was starting goes on). Remove them with: rcswarm launch "
                   "ray --address 127.0.0.1:6379 --namespace rcswarm --stop\n"), err


def test_a_start_up_signalled_before_any_actor_exists_says_none_is_left():
    from rcswarm.launch import interrupted_start

    assert interrupted_start(["other"], "run", "a:1", "SIGINT", "starting the supervisor") == (
        "the launcher stops (SIGINT) while starting the supervisor; no rcswarm actor is left in namespace run")
    both = interrupted_start(["rcswarm-supervisor", "rcswarm-coordinator", "rcswarm-worker-0"], "run", "a:1", "SIGHUP",
                             "starting the supervisor")
    assert "; rcswarm-coordinator and rcswarm-supervisor and 1 worker actor stay in namespace run" in both, both


# ---- 5: --coordinator-arg flags the coordinator actor sets itself -------------------------------------------------


def coordinator_args(tmp_path: Path, *extra: str):
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    return launch.parser().parse_args(["--with-coordinator", "--config", str(config), "--state-dir",
                                       str(tmp_path / "state"), "--workers", "1", "--cpu-only",
                                       "--coordinator-arg=--insecure", *extra])


@pytest.mark.parametrize(("extra", "flag", "instead"), [
    (["--coordinator-arg=--state-dir=/x"], "--state-dir", "; use --state-dir"),
    (["--coordinator-arg=--port-file=/x"], "--port-file", " (in --state-dir's coordinator-actor/)"),
    (["--coordinator-arg=--port-file", "--coordinator-arg=/x"], "--port-file", " (in --state-dir's coordinator-actor/)"),
    (["--coordinator-arg=--port-f=/x"], "--port-file", " (in --state-dir's coordinator-actor/)"),
    (["--coordinator-arg=--config=/x.toml"], "--config", "; use --config"),
    (["--coordinator-arg=--con", "--coordinator-arg=/x.toml"], "--config", "; use --config"),
    (["--coordinator-arg=--host=127.0.0.1"], "--host", "; use --coordinator-host"),
    (["--coordinator-arg=--hos=0.0.0.0"], "--host", "; use --coordinator-host"),
    (["--coordinator-arg=--port=50051"], "--port", "; use --coordinator-port"),
    (["--coordinator-arg=--sta", "--coordinator-arg=/y"], "--state-dir", "; use --state-dir"),
])
def test_a_coordinator_arg_setting_a_flag_the_actor_sets_is_refused_naming_it(tmp_path, extra, flag, instead):
    """argparse's last value wins, so it overrode the actor's own unseen (with --port-file the actor then waited two
    minutes for a port file that never came). Every spelling argparse takes is refused: a value apart or after `=`, an
    unambiguous prefix, the actor's own value again."""
    problem = launch.check_arguments(coordinator_args(tmp_path, *extra))
    given = " ".join(["--insecure", *(e.split("=", 1)[1] for e in extra)])
    assert problem == (f"--coordinator-arg {given!r}: sets `rcswarm coordinator`'s {flag}, which the coordinator actor "
                       f"sets itself{instead}"), problem


def test_other_coordinator_args_still_pass(tmp_path):
    assert launch.check_arguments(coordinator_args(tmp_path, "--coordinator-arg=--health-port=0",
                                                   "--coordinator-arg=--tls-san", "--coordinator-arg=host")) is None
    ambiguous = launch.check_arguments(coordinator_args(tmp_path, "--coordinator-arg=--po=1"))
    assert ambiguous is not None and "`rcswarm coordinator` refuses it: " in ambiguous and "ambiguous" in ambiguous


def test_a_namespace_with_a_trailing_newline_is_refused() -> None:
    """`re.match` with `$` took "abc\\n" (a review of the chart's namespace pattern found it): the whole name must
    match now, as the chart's schema requires."""
    assert NAMESPACE.fullmatch("abc") and not NAMESPACE.fullmatch("abc\n") and not NAMESPACE.fullmatch("-abc")
    args = launch.parser().parse_args(["--address", "127.0.0.1:6379", "--namespace", "abc\n", "--coordinator",
                                       "127.0.0.1:50051", "--workers", "1"])
    assert "--namespace 'abc\\n'" in (launch.check_arguments(args) or "")
