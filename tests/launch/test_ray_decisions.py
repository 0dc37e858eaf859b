"""`rcswarm launch ray`'s decisions without Ray: when a followed run is over (`ended`, `removed`), when `--detach` is
done (`joined`), which worker actors the supervisor replaces (`replace_reason`) and that it retires them together,
when a worker is started again inside its actor (`start_again_reason`) and how `--status` shows it, why a coordinator
actor did not answer (`unanswered_reason`), a supervisor whose name stays registered, what a stopped launcher leaves
behind (`interrupted`), a coordinator actor's settings (`settings_differ`), the values Ray refuses, the checks made
before connecting (`ray://`, an address nothing answers at, the coordinator's bind rule, a relative state dir or
`law_from`), and the launcher's exit status after a signal.

The tests on a real local Ray instance are tests/swarm/test_ray.py.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import types
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rcswarm.cli import launch
from rcswarm.launch import (
    CoordinatorSpec,
    LaunchPlan,
    Verdict,
    ended,
    interrupted,
    joined,
    pending_reason,
    reach_problem,
    replace_reason,
    settings_differ,
)
from rcswarm.launch.actors import death_cause_text
from rcswarm.launch.status import ActorRow
from rcswarm.worker import FAILED, FINISHED, STOPPED, TRAINING, WorkerOptions
from tests.helpers.specs import tiny_spec, write_spec
from tests.helpers.waiting import wait_for

PLAN = LaunchPlan(WorkerOptions("127.0.0.1:7000", device="cpu"), workers=3, gpus_per_worker=1.0, cpus_per_worker=0.5)
OTHER_PLAN = replace(PLAN, worker=WorkerOptions("127.0.0.1:7001", device="cpu"))
FINISHED_ALL = Verdict(0, "every worker's run has ended, each one finished")


def row(index: int, state: str = TRAINING, plan: LaunchPlan = PLAN, worker_id: str = "w", problem: str = "",
        ray_state: str = "ALIVE") -> ActorRow:
    """Worker actor `index` as `collect_status` shows it; pending (no answer) unless `ray_state` is ALIVE."""
    info = None if ray_state != "ALIVE" else {
        "state": state, "worker_id": worker_id, "problem": problem, "config": asdict(plan.worker_config(index))}
    return ActorRow(f"rcswarm-worker-{index}", ray_state, 0, 0, info)


def pending(index: int) -> ActorRow:
    return row(index, ray_state="PENDING_CREATION")


def status(*rows: ActorRow, plan: LaunchPlan = PLAN, supervisor: bool = True) -> dict:
    return {"namespace": plan.namespace, "rows": list(rows), "plan": asdict(plan), "supervisor": supervisor,
            "events": []}


# ---- when the followed run is over -----------------------------------------------------------------------------


def test_an_actor_ray_never_started_does_not_keep_a_finished_run_going():
    """3 one-GPU workers on 2 GPUs: the third waits for a GPU the finished ones hold until they are removed, so
    it counts as ended once every started worker has ended (before, the launcher followed forever)."""
    over = ended(status(row(0, FINISHED), row(1, FINISHED), pending(2)), PLAN)
    assert over == Verdict(0, "every worker's run has ended, each started one finished; never started: rcswarm-worker-2")
    failed = ended(status(row(0, FINISHED), row(1, FAILED, problem="CUDA is not available"), pending(2)), PLAN)
    assert failed is not None and failed.status == 1
    assert "rcswarm-worker-1 failed: CUDA is not available" in failed.reason and "rcswarm-worker-2" in failed.reason
    assert ended(status(row(0, FINISHED), row(1, TRAINING), pending(2)), PLAN) is None
    assert ended(status(row(0, FINISHED), row(1, FINISHED)), PLAN) is None, "a slot with no actor yet"
    assert ended(status(pending(0), pending(1), pending(2)), PLAN) is None, "nothing started yet"
    assert ended(status(row(0, FINISHED), row(1, STOPPED), row(2, FINISHED)), PLAN).status == 1


def test_an_earlier_runs_finished_actor_does_not_end_a_new_run():
    """A FINISHED actor made for another plan (an earlier run in the namespace) is being replaced: not an end."""
    assert ended(status(*(row(i, FINISHED, plan=OTHER_PLAN) for i in range(3))), PLAN) is None
    assert ended(status(row(0, FINISHED), row(1, FINISHED), row(2, FINISHED, plan=OTHER_PLAN)), PLAN) is None
    assert ended(status(*(row(i, FINISHED) for i in range(3))), PLAN) == FINISHED_ALL


def test_with_no_worker_wanted_the_run_ends_once_the_last_actor_is_gone():
    none = replace(PLAN, workers=0)
    assert ended(status(row(0, plan=none), plan=none), none) is None
    assert ended(status(plan=none), none).status == 0


# ---- when --detach is done ---------------------------------------------------------------------------------------


def test_a_failed_or_stopped_worker_never_counts_as_joined():
    """--device cuda on a host without CUDA: every worker fails; --detach exits 1 naming why (it said 0)."""
    failed = joined(status(*(row(i, FAILED, worker_id="", problem="CUDA is not available") for i in range(3))), PLAN)
    assert failed is not None and failed.status == 1 and "rcswarm-worker-0 failed: CUDA is not available" in failed.reason
    assert joined(status(row(0), row(1), row(2, STOPPED, worker_id="")), PLAN).status == 1
    assert joined(status(row(0), row(1), row(2, worker_id="")), PLAN) is None, "one still joining"
    assert joined(status(row(0), row(1), pending(2)), PLAN) is None
    assert joined(status(row(0), row(1), row(2, plan=OTHER_PLAN)), PLAN) is None, "one being replaced"
    assert joined(status(row(0, FAILED, plan=OTHER_PLAN), row(1), row(2)), PLAN) is None, "an old plan's failure"
    assert joined(status(row(0), row(1), row(2, FINISHED, worker_id="")), PLAN) == Verdict(0, "every worker joined (3)")


# ---- which worker actors the supervisor replaces ----------------------------------------------------------------


def test_a_pending_actor_waiting_for_another_plans_resources_is_replaced():
    """After --gpus-per-worker 3 (infeasible), a launch with 1 GPU replaced only ALIVE actors: the 3-GPU one
    waited forever. A pending actor is replaced when Ray recorded other resources, or (none recorded) when this
    supervisor did not start it."""
    infeasible = {"State": "PENDING_CREATION", "RequiredResources": {"CPU": 0.5, "GPU": 3.0}}
    assert replace_reason(PLAN, 0, infeasible, None, started_here=True) == (
        "waiting for 3 GPU, 0.5 CPU where the plan asks 1 GPU, 0.5 CPU")
    mine = {"State": "PENDING_CREATION", "RequiredResources": {"CPU": 0.5, "GPU": 1.0}}
    assert replace_reason(PLAN, 0, mine, None, started_here=False) is None
    unknown = {"State": "DEPENDENCIES_UNREADY", "RequiredResources": {}}
    assert replace_reason(PLAN, 0, unknown, None, started_here=True) is None
    assert replace_reason(PLAN, 0, unknown, None, started_here=False) == "waiting to start for an earlier supervisor's plan"


def test_a_running_actor_is_replaced_only_when_made_for_another_plan():
    alive = {"State": "ALIVE", "RequiredResources": {"CPU": 0.5, "GPU": 1.0}}
    assert replace_reason(PLAN, 1, alive, row(1, plan=OTHER_PLAN).info, started_here=False) == "made for another plan"
    assert replace_reason(PLAN, 1, alive, row(1).info, started_here=False) is None
    assert replace_reason(PLAN, 1, alive, None, started_here=False) is None, "not answering yet: kept for now"
    assert replace_reason(PLAN, 1, {"State": "RESTARTING"}, None, started_here=False) is None


# ---- what a launcher stopped by a signal says ---------------------------------------------------------------------


def test_a_stopped_launcher_says_what_stays_and_the_real_stop_command():
    address = "127.0.0.1:6379"
    training = interrupted(status(row(0), row(1), pending(2)), PLAN, address, "SIGTERM")
    assert training.startswith("the launcher stops (SIGTERM); the 3 worker actors in namespace rcswarm stay (2 training)")
    assert training.endswith(f"rcswarm launch ray --address {address} --namespace rcswarm --stop")
    assert "ADDRESS" not in training
    finished = interrupted(status(*(row(i, FINISHED) for i in range(3))), PLAN, address, "SIGINT")
    assert "have ended their runs but stay" in finished and "keep training" not in finished
    gone = interrupted(status(supervisor=False), PLAN, address, "SIGTERM")
    assert gone == "the launcher stops (SIGTERM); no rcswarm actor is left in namespace rcswarm"


def test_sigterm_while_following_exits_143(monkeypatch, capsys):
    """128 + the signal's number, as a shell reports it (it was 130 for every signal)."""
    def follow(plan, poll_s, stop, watch=None):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(10)

    monkeypatch.setattr(launch, "ensure_supervisor", lambda plan: None)
    monkeypatch.setattr(launch, "follow", follow)
    monkeypatch.setattr(launch, "collect_status", lambda namespace: status(row(0), plan=PLAN))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    args = launch.parser().parse_args(["--address", "127.0.0.1:6379", "--coordinator", "127.0.0.1:7000",
                                       "--workers", "3", "--cpus-per-worker", "0.5", "--device", "cpu"])
    try:
        assert launch.launch(args) == 143
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    out = capsys.readouterr().out
    assert "(SIGTERM)" in out and "--address 127.0.0.1:6379 --namespace rcswarm --stop" in out


def test_the_follower_prints_the_supervisors_events(monkeypatch, capsys):
    """A worker Ray refuses to create says why only in the supervisor's events: the follower prints each once."""
    from rcswarm.launch import status as status_module

    event = "12:00:00 reconcile failed: ValueError: bad resources"
    shown = status(row(0), row(1), row(2))
    shown["events"] = [event]
    rounds = iter([shown, shown, status(*(row(i, FINISHED) for i in range(3)))])
    monkeypatch.setattr(status_module, "collect_status", lambda namespace: next(rounds))
    monkeypatch.setattr(status_module, "stop_all", lambda namespace: ["removed"])
    assert status_module.follow(PLAN, 0.01, threading.Event()) == FINISHED_ALL
    assert capsys.readouterr().out.count(event) == 1


def test_a_stop_report_says_left_only_of_a_worker_that_had_a_membership_to_leave():
    """A worker that had failed or never joined was reported "w1-… left the swarm" / "no membership left the swarm"
    (review of the Ray launcher, 2026-11-29)."""
    from rcswarm.launch.actors import describe_stop

    assert describe_stop({"worker_id": "w1", "state": STOPPED, "was": TRAINING, "left": True}) == "w1 left the swarm"
    assert describe_stop({"worker_id": "w1", "state": FAILED, "was": FAILED, "left": True,
                          "problem": "w1 gives up: AwaitVersion: gave up after 8.9s"}) == (
        "it had failed before (w1 gives up: AwaitVersion: gave up after 8.9s); removed")
    assert describe_stop({"worker_id": "", "state": STOPPED, "was": "starting", "left": True}) == "it had not joined; removed"
    assert describe_stop(None).startswith("it did not answer")


def test_a_relative_data_root_is_refused_naming_the_flag():
    """Each actor resolved it against its own node's Ray working directory, not the launcher's (review, 2026-11-29)."""
    with pytest.raises(ValueError, match=r"^--data-root 'data': expected an absolute path \(it is read on every Ray node\)"):
        LaunchPlan(WorkerOptions("c:1", data_root=Path("data")), workers=1)
    assert LaunchPlan(WorkerOptions("c:1", data_root=Path("/data")), workers=1).worker.data_root == Path("/data")


def test_a_follower_whose_actors_another_driver_removed_ends(monkeypatch, capsys):
    """`--stop` from another driver (what the interrupt message advises) removed every actor: `ended` waited for
    rows that would never come, and the follower polled for ever (review of the Ray launcher, 2026-11-29). Two polls
    in a row without the supervisor or a worker end it with status 1; one (a supervisor Ray restarts) does not."""
    from rcswarm.launch import status as status_module

    assert status_module.removed(status(supervisor=False), PLAN).status == 1
    assert status_module.removed(status(row(0), supervisor=False), PLAN) is None
    assert status_module.removed(status(supervisor=True), PLAN) is None
    assert status_module.removed(status(supervisor=False, plan=replace(PLAN, workers=0)),
                                 replace(PLAN, workers=0)) is None
    rounds = iter([status(row(0), row(1), row(2)), status(supervisor=False), status(row(0), row(1), row(2)),
                   status(supervisor=False), status(supervisor=False)])
    monkeypatch.setattr(status_module, "collect_status", lambda namespace: next(rounds))
    verdict = status_module.follow(PLAN, 0.01, threading.Event())
    assert verdict.status == 1 and "are gone: removed by another driver" in verdict.reason
    assert "are gone" in capsys.readouterr().out


def test_a_follower_ends_once_no_wanted_worker_is_left_and_no_supervisor(monkeypatch, capsys):
    """Without a supervisor, an actor of a slot beyond the plan (left by a larger plan, or being removed) kept the
    follower polling for ever, though nothing would start the wanted ones again (review of the Ray launcher,
    2026-11-29)."""
    from rcswarm.launch import status as status_module

    beyond = row(5, plan=replace(PLAN, workers=6))
    assert status_module.removed(status(beyond, supervisor=False), PLAN).status == 1
    assert status_module.removed(status(row(1), beyond, supervisor=False), PLAN) is None
    assert status_module.removed(status(beyond, supervisor=True), PLAN) is None
    rounds = iter([status(row(0), row(1), row(2)), status(beyond, supervisor=False), status(beyond, supervisor=False)])
    monkeypatch.setattr(status_module, "collect_status", lambda namespace: next(rounds))
    verdict = status_module.follow(PLAN, 0.01, threading.Event())
    assert verdict.status == 1 and "every wanted worker actor of namespace rcswarm are gone" in verdict.reason
    assert "are gone" in capsys.readouterr().out


# ---- a worker started again inside its actor -----------------------------------------------------------------------


def test_a_worker_is_started_again_after_an_error_a_bounded_number_of_times_and_never_after_a_refusal():
    """A gRPC status, training that kept diverging or an exception out of the loop left the actor `failed` for good,
    holding its resources, and Ray never restarts a live actor (review of the Ray launcher, 2026-11-29): the kind of
    end (`Worker.end`) decides. A silent coordinator is waited for without a bound."""
    from rcswarm.worker.ray_worker import MAX_ERROR_RETRIES, start_again_reason
    from rcswarm.worker.worker import End

    error = "w exits: the coordinator refused the request: INVALID_ARGUMENT: no"
    assert start_again_reason(End.ERROR, error, 0) == f"{error} (error 1 of at most {MAX_ERROR_RETRIES} started again)"
    assert start_again_reason(End.ERROR, error, MAX_ERROR_RETRIES - 1) is not None
    assert start_again_reason(End.ERROR, error, MAX_ERROR_RETRIES) is None
    assert start_again_reason(End.GAVE_UP, "w gives up: AwaitVersion", 100) == "w gives up: AwaitVersion"
    for end in (End.REFUSED, End.FINISHED, End.STOPPED):
        assert start_again_reason(end, "w cannot train this run: the run spec of r is refused", 0) is None, end


def test_the_status_line_counts_the_starts_again_inside_the_actor():
    """Ray's restarts column does not count them, and --status said nothing of a worker started again."""
    info = {"state": TRAINING, "worker_id": "w2", "problem": "", "config": asdict(PLAN.worker_config(0)),
            "retries": 2, "last_retry": "w exits: boom (error 2 of at most 5 started again)"}
    line = ActorRow("rcswarm-worker-0", "ALIVE", 0, 0, info).line()
    assert line.endswith("started again 2 times in this actor, the last after: w exits: boom (error 2 of at most 5 "
                         "started again)"), line
    once = ActorRow("rcswarm-worker-0", "ALIVE", 0, 0, {**info, "retries": 1}).line()
    assert "started again 1 time in this actor" in once, once
    assert "started again" not in ActorRow("rcswarm-worker-0", "ALIVE", 0, 0, {**info, "retries": 0}).line()
    assert ActorRow("rcswarm-worker-0", "ALIVE", 0, 0, {**info, "retries": 3}).key() != ActorRow(
        "rcswarm-worker-0", "ALIVE", 0, 0, info).key(), "a follower prints a new line for a new start"


# ---- the supervisor's retirements and its name, the coordinator actor ----------------------------------------------


class _Handle:
    """A stand-in for a Ray actor handle: its name and `_actor_id`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._actor_id = types.SimpleNamespace(hex=lambda: f"id-{name}")


def test_the_supervisor_retires_replaced_and_extra_workers_together(monkeypatch):
    """A worker made for another plan was retired inline, one after another (each up to 40 s) before the extra ones
    were (review of the Ray launcher, 2026-11-29): every retirement of a round is one `retire_all`. A stand-in
    namespace (no Ray) under a real supervisor's reconcile thread."""
    from rcswarm.launch import supervisor as module

    plan = replace(PLAN, workers=2)
    actors = {f"rcswarm-worker-{i}": _Handle(f"rcswarm-worker-{i}") for i in range(4)}
    made_for = {"rcswarm-worker-0": OTHER_PLAN}
    batches = []

    def retire_all(going):
        batches.append(sorted(going))
        for name in going:
            actors.pop(name)
        return {}, set()

    def start_worker(_plan, index):
        return actors.setdefault(f"rcswarm-worker-{index}", _Handle(f"rcswarm-worker-{index}"))

    monkeypatch.setattr(module, "named_actors", lambda namespace: sorted(actors))
    monkeypatch.setattr(module, "lookup", lambda name, namespace: actors.get(name))
    monkeypatch.setattr(module, "gcs_record", lambda handle: {"State": "ALIVE"})
    monkeypatch.setattr(module, "actor_record", lambda actor_id: {})
    monkeypatch.setattr(module, "call", lambda handle, method, *args, **kw: {
        "config": asdict(made_for.get(handle.name, plan).worker_config(int(handle.name.rsplit("-", 1)[1])))})
    monkeypatch.setattr(module, "retire_all", retire_all)
    monkeypatch.setattr(module, "start_worker", start_worker)
    supervisor = module.Supervisor(asdict(plan))
    try:
        wait_for(lambda: batches, 10, "the supervisor's first retirements")
    finally:
        supervisor.halt()
    assert batches[:1] == [["rcswarm-worker-0", "rcswarm-worker-2", "rcswarm-worker-3"]]
    events = supervisor.events()
    assert any("replaced rcswarm-worker-0, made for another plan: " in e for e in events), events
    assert sum("retired rcswarm-worker-" in e for e in events) == 2, events


def test_a_supervisor_whose_name_stays_registered_is_an_error_not_a_silent_reuse(monkeypatch):
    """Replacing the supervisor of another plan ignored whether the killed one's name went: `get_if_exists` then
    handed the dying supervisor back, leaving no supervisor at all (review of the Ray launcher, 2026-11-29)."""
    from rcswarm.launch import supervisor as module

    old, created, killed = _Handle("rcswarm-supervisor"), object(), []
    actor_class = types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(remote=lambda plan: created))
    fake_ray = types.SimpleNamespace(kill=lambda handle, no_restart: killed.append((handle, no_restart)),
                                     remote=lambda cls: actor_class)
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(module, "CALL_TIMEOUT_S", 0.3)
    monkeypatch.setattr(module, "lookup", lambda name, namespace: old)  # the name stays registered
    monkeypatch.setattr(module, "call", lambda handle, method, *a, **kw: None if method != "plan"
                        else asdict(PLAN) if handle is created else asdict(OTHER_PLAN))
    with pytest.raises(RuntimeError, match=r"^the supervisor of another plan in namespace rcswarm was killed but its "
                                           r"name is still registered after 0\.3s; run the launch again$"):
        module.ensure_supervisor(PLAN)
    assert killed == [(old, True)]
    monkeypatch.setattr(module, "lookup", lambda name, namespace: None)  # gone: a new one is created
    assert module.ensure_supervisor(PLAN) is created


def test_a_coordinator_actor_that_does_not_answer_is_told_by_its_ray_state():
    """Why `start_coordinator` removes a coordinator actor that did not answer: pending names the flag that sets what
    it waits for (it said --gpus-per-worker/--cpus-per-worker, the workers' flags), dead gives Ray's cause, and one
    alive but hung says how long it was waited for (it was left in the namespace: tests/swarm/test_ray.py)."""
    from rcswarm.launch.coordinator_actor import unanswered_reason

    spec = CoordinatorSpec("[run]\n", "/srv/state", "127.0.0.1", 50051, (), 4.0)
    head = [{"Alive": True, "Resources": {"CPU": 2.0, "node:__internal_head__": 1.0}}]
    pending = unanswered_reason(spec, {"State": "PENDING_CREATION"}, head, {"CPU": 1.0})
    assert pending.startswith("Ray never started it on the head node (infeasible: no node of the cluster has 4 CPU")
    assert pending.endswith("else lower --coordinator-cpus)"), pending
    dead = {"State": "DEAD", "DeathCause": "killed by ray.kill"}
    assert unanswered_reason(spec, dead, head, {}) == "killed by ray.kill"
    assert unanswered_reason(spec, {"State": "ALIVE"}, head, {}) == "it did not answer within 130s (Ray state ALIVE)"
    assert unanswered_reason(spec, {}, head, {}) == "it did not answer within 130s (Ray state unknown)"
    workers = pending_reason({"CPU": 4.0}, head, {})
    assert workers.endswith("else lower --gpus-per-worker/--cpus-per-worker"), workers


# ---- values Ray refuses, and checks before connecting -------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"cpus_per_worker": 0.00001}, "--cpus-per-worker 1e-05: Ray counts resources in steps of 0.0001"),
    ({"gpus_per_worker": 0.00015}, "--gpus-per-worker 0.00015: Ray counts resources in steps of 0.0001"),
    ({"cpus_per_worker": float("inf")}, "--cpus-per-worker inf: expected a number > 0"),
])
def test_resource_quantities_ray_refuses_are_refused_naming_the_flag(fields, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        LaunchPlan(WorkerOptions("c:1"), workers=1, **fields)
    assert LaunchPlan(WorkerOptions("c:1"), workers=1, cpus_per_worker=0.0001, gpus_per_worker=0.25).demand() == {
        "CPU": 0.0001, "GPU": 0.25}


def coordinator_args(tmp_path: Path, *extra: str):
    config = write_spec(tiny_spec(), tmp_path / "run.toml")
    return launch.parser().parse_args(["--with-coordinator", "--config", str(config), "--state-dir",
                                       str(tmp_path / "state"), "--workers", "1", "--cpu-only", *extra])


@pytest.mark.parametrize(("extra", "message"), [
    (["--coordinator-cpus", "nan"], "--coordinator-cpus nan: expected a number >= 0"),
    (["--coordinator-cpus", "0.00001"], "--coordinator-cpus 1e-05: Ray counts resources in steps of 0.0001"),
    (["--coordinator-port", "70000"], "--coordinator-port 70000: expected 0..65535"),
    (["--state-dir", "state"], "--state-dir 'state': expected an absolute path on the head node"),
    ([], "--coordinator-host '0.0.0.0' listens on every network interface and TLS is off"),
    (["--coordinator-host", "127.0.0.1", "--coordinator-arg=--no-such-flag"],
     "--coordinator-arg '--no-such-flag': `rcswarm coordinator` refuses it: "),
])
def test_coordinator_actor_arguments_are_checked_before_launching(tmp_path, extra, message):
    """What the coordinator actor would refuse (Ray's precision, a port, a relative state dir, plaintext on every
    interface, an unknown flag) is a usage error here, naming the flag, not a failure inside the actor."""
    problem = launch.check_arguments(coordinator_args(tmp_path, *extra))
    assert problem is not None and problem.startswith(message), problem
    if not extra:
        assert "--coordinator-arg=--insecure" in problem


def test_a_plaintext_coordinator_on_every_interface_passes_with_insecure(tmp_path):
    assert launch.check_arguments(coordinator_args(tmp_path, "--coordinator-arg=--insecure")) is None
    assert launch.check_arguments(coordinator_args(tmp_path, "--coordinator-host", "127.0.0.1")) is None


def test_the_coordinator_actor_gets_law_from_as_an_absolute_path(tmp_path, monkeypatch):
    """A relative `curriculum.law_from` is relative to the config: the actor, in another directory, gets it
    absolute (it got the file's text, and refused the path)."""
    folder = tmp_path / "configs"
    folder.mkdir()
    spec = tiny_spec(curriculum={"policy": "adaptive", "seq_lens": [8, 16], "law_from": "metrics.csv"})
    config = folder / "run.toml"
    config.write_text(spec.to_toml())
    monkeypatch.chdir(tmp_path)
    args = launch.parser().parse_args(["--with-coordinator", "--config", "configs/run.toml", "--state-dir",
                                       str(tmp_path / "state"), "--workers", "1", "--cpu-only"])
    sent = launch.coordinator_spec(args).config_text
    assert f'law_from = "{folder / "metrics.csv"}"' in sent, sent


def test_a_run_on_a_git_dataset_needs_the_data_root_its_workers_read_it_under(tmp_path):
    """The workers read a git dataset only under --data-root (worker/data_root.py): without one, every worker actor
    would start, join and exit; the launch is refused up front, and --data-root reaches the workers' options."""
    spec = tiny_spec(model={"name": "frame", "preset": "tiny"},
                     data={"source": "git", "seq_len": 8, "task_config": {"dataset": "/data/git-frames-5"}})
    config = tmp_path / "run.toml"
    config.write_text(spec.to_toml())
    command = ["--with-coordinator", "--config", str(config), "--state-dir", str(tmp_path / "state"),
               "--coordinator-host", "127.0.0.1", "--workers", "1", "--cpu-only"]
    problem = launch.check_arguments(launch.parser().parse_args(command))
    assert problem == (f"--config {str(config)!r} trains on the git dataset '/data/git-frames-5': give --data-root "
                       "DIR, the folder that holds it on every Ray node"), problem
    args = launch.parser().parse_args([*command, "--data-root", "/data"])
    assert launch.check_arguments(args) is None
    assert launch.plan_of(args, "127.0.0.1:50051").worker.data_root == Path("/data")


def test_a_coordinator_actor_with_other_settings_is_named_not_reused():
    wanted = CoordinatorSpec("[run]\n", "/srv/state", "127.0.0.1", 50051, ("--insecure",), 1.0)
    assert settings_differ(wanted.settings(), wanted.settings()) is None
    running = replace(wanted, state_dir="/srv/other", port=50052, config_text="[run]\nrounds = 2\n").settings()
    differ = settings_differ(running, wanted.settings())
    assert "--state-dir '/srv/other' there, '/srv/state' here" in differ and "--coordinator-port 50052 there" in differ
    assert "--config (the run spec)" in differ and "--coordinator-host" not in differ
    assert settings_differ(None, wanted.settings()) == "it does not report its settings"


def test_a_coordinator_actor_the_head_node_cannot_hold_is_refused_up_front():
    """`--coordinator-cpus 3` on a 2-CPU head: the actor stayed PENDING_CREATION, the launcher gave up after two
    minutes without naming the flag and left the actor behind, where a corrected retry got it back (review of the Ray
    launcher, 2026-11-29)."""
    from rcswarm.launch.coordinator_actor import head_cpu_problem

    head = {"Alive": True, "Resources": {"CPU": 2.0, "node:__internal_head__": 1.0}}
    other = {"Alive": True, "Resources": {"CPU": 64.0}}
    assert head_cpu_problem(3.0, [other, head]) == ("--coordinator-cpus 3: the head node, where the coordinator actor "
                                                    "runs, has 2 CPUs; expected at most that")
    assert head_cpu_problem(2.0, [other, head]) is None
    assert head_cpu_problem(3.0, [other]) is None  # no head reported: Ray says why it waits


def test_flags_that_would_do_nothing_are_refused():
    """`--json` without `--status` and `--start-timeout-s` without `--detach` were ignored silently (review of the Ray
    launcher, 2026-11-29)."""
    base = ["--address", "127.0.0.1:6379"]
    args = launch.parser().parse_args([*base, "--stop", "--json"])
    assert launch.check_arguments(args) == "--json: only with --status (it prints the status as JSON)"
    assert launch.check_arguments(launch.parser().parse_args([*base, "--status", "--json"])) is None
    follow = launch.parser().parse_args([*base, "--coordinator", "c:1", "--workers", "1", "--start-timeout-s", "60"])
    assert launch.check_arguments(follow) == "--start-timeout-s: only with --detach (a following launch waits for the run's end)"
    detached = launch.parser().parse_args([*base, "--coordinator", "c:1", "--workers", "1", "--cpus-per-worker", "1",
                                           "--detach", "--start-timeout-s", "60"])
    assert launch.check_arguments(detached) is None


def test_ray_client_addresses_are_refused_up_front():
    """Ray Client cannot read the GCS records the launcher needs: every command died in a traceback (and --stop
    after killing the supervisor)."""
    for command in (["--status"], ["--stop"], ["--coordinator", "c:1", "--workers", "1"]):
        args = launch.parser().parse_args(["--address", "ray://127.0.0.1:10001", *command])
        problem = launch.check_arguments(args)
        assert problem is not None and problem.startswith("--address 'ray://127.0.0.1:10001': Ray Client"), problem


def test_an_address_nothing_answers_at_fails_in_seconds(capsys):
    """Ray retries an unreachable GCS for about 14 minutes, deaf to Ctrl-C: a TCP probe fails first, naming it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    address = f"127.0.0.1:{closed}"
    assert reach_problem("auto", 1.0) is None
    began = time.monotonic()
    assert launch.main(["ray", "--address", address, "--status"]) == 1
    assert time.monotonic() - began < 10
    assert f"nothing answers at {address}" in capsys.readouterr().err
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert reach_problem(f"127.0.0.1:{listening.getsockname()[1]}", 3.0) is None


class _Cause:
    """A stand-in for Ray's ActorDeathCause message (oneof `context`)."""

    def __init__(self, kind: str | None, **fields) -> None:
        self.kind = kind
        if kind is not None:
            setattr(self, kind, type("Context", (), fields)())

    def WhichOneof(self, _name: str) -> str | None:
        return self.kind


def test_a_death_cause_is_told_in_words_not_as_a_message_dump():
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: no port"
    assert death_cause_text(_Cause("creation_task_failure_context", formatted_exception_string=traceback)) == (
        "RuntimeError: no port")
    assert death_cause_text(_Cause("actor_died_error_context", error_message=" killed by ray.kill \n")) == (
        "killed by ray.kill")
    assert death_cause_text(_Cause(None)) == ""


def test_a_coordinator_actor_ray_is_restarting_is_not_removed(monkeypatch):
    """An unanswered coordinator actor is removed, unless Ray is restarting it: a resumed coordinator may take longer
    than the wait, and removing it then cost the run a start (review of this session's diff, 2026-11-29)."""
    from rcswarm.launch import coordinator_actor as module

    handle, killed = object(), []
    actor_class = types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(remote=lambda spec: handle))
    head = [{"Alive": True, "Resources": {"CPU": 2.0, "node:__internal_head__": 1.0}}]
    fake_ray = types.SimpleNamespace(kill=lambda actor, no_restart: killed.append(actor), remote=lambda cls: actor_class,
                                     nodes=lambda: head, available_resources=lambda: {"CPU": 2.0})
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(module, "call", lambda *args, **kwargs: None)  # it does not answer
    spec = CoordinatorSpec("[run]\n", "/srv/state", "127.0.0.1", 50051, (), 1.0)
    monkeypatch.setattr(module, "gcs_record", lambda actor: {"State": "RESTARTING"})
    with pytest.raises(RuntimeError, match="Ray is restarting it, so it stays in namespace ns"):
        module.start_coordinator("ns", spec)
    assert killed == []
    monkeypatch.setattr(module, "gcs_record", lambda actor: {"State": "ALIVE"})
    with pytest.raises(RuntimeError, match="removed from namespace ns"):
        module.start_coordinator("ns", spec)
    assert killed == [handle]
