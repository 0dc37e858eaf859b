"""The Ray control plane of `rcswarm launch ray` (issue #16): the plan, the supervisor, the actors, the status.

Design (plain Ray Core actors, not Ray Train: rcswarm workers are independent and the coordinator
already handles join and leave):

* Every worker is a detached, named actor `rcswarm-worker-<i>` of the Ray namespace
  (`rcswarm.worker.RayWorker`, `num_gpus` G, `num_cpus` C, `max_restarts=-1`): detached, because a
  non-detached actor dies with its driver whatever `max_restarts` says. Ray restarts a dead actor's
  process; the new process joins the coordinator again as a new worker.
* A detached supervisor actor `rcswarm-supervisor` (`num_cpus=0`) holds the plan (`LaunchPlan`, plan.py) and
  reconciles every RECONCILE_S: it starts the missing `rcswarm-worker-<i>` for i < N (at most once
  per RECREATE_BACKOFF_S per slot: an actor killed for good or failing at creation is started again,
  not in a loop) and retires those with i >= N (each Leaves, then is killed). Running the command
  again with another plan (`--workers 3`) replaces the supervisor, whose arguments are then the new
  plan, so a restarted supervisor never goes back to an old count.
* The launcher then follows (status lines on every change, and the supervisor's events) until every
  worker's run has ended (`ended`: an actor Ray never started counts once the started ones have all
  ended), and then removes the actors; with `--detach` it returns once every worker has joined
  (`joined`: a failed one never does). A driver that exits leaves the detached actors training;
  `--status` and `--stop` from any later driver find them. The supervisor replaces a worker actor made
  for another plan, or pending with another plan's resources (`replace_reason`).
* Actors pending for lack of resources are reported with the reason (`pending_reason`: infeasible on
  every node, or waiting for free resources), never waited on silently.
* The coordinator runs outside Ray by default (`--coordinator`); `--with-coordinator` runs it as a
  detached actor pinned to the head node (`CoordinatorActor`, running a `CoordinatorSpec`), which dies
  with the head; one that already runs other settings is refused, not silently reused.
* Actor states come from Ray's GCS (`ray._private.state`), which Ray Client cannot reach: `ray://`
  addresses are refused; a HOST:PORT address is probed first (`reach_problem`), since Ray retries an
  unreachable one for minutes.
* The join token is never an actor argument nor part of a runtime_env (Ray records both): every
  actor reads `RCSWARM_TOKEN` from its node's environment.

Rooms: plan.py (`LaunchPlan`, the actor names, pending reasons; no Ray), actors.py (find, call, start,
retire actors), supervisor.py (`Supervisor`, `ensure_supervisor`), coordinator_actor.py
(`CoordinatorActor`, `start_coordinator`), status.py (`collect_status`, `stop_all`, `follow`), head.py (`head_lost`,
`HeadWatch`: a follower whose Ray head is gone ends in seconds with one line, status 3). The
command line (flags, errors, main) is cli/launch.py. Ray is imported only inside the functions that
need it, here and in worker/ray_worker.py: `rcswarm launch --help` and the rest of rcswarm work
without the `ray` extra.
"""

from rcswarm.launch.actors import connect, gcs_address, named_actors, reach_problem, wait
from rcswarm.launch.coordinator_actor import CoordinatorActor, CoordinatorSpec, settings_differ, start_coordinator
from rcswarm.launch.head import HEAD_LOST_STATUS, HeadLost, HeadOptions, HeadWatch, OnThread, head_lost, head_lost_line
from rcswarm.launch.plan import (
    NAMESPACE,
    NAMESPACE_RULE,
    LaunchPlan,
    pending_reason,
    resource_problem,
    resources,
    worker_index,
)
from rcswarm.launch.status import (
    Verdict,
    collect_status,
    ended,
    follow,
    interrupted,
    interrupted_start,
    joined,
    print_status,
    replaced,
    stop_all,
    stop_command,
)
from rcswarm.launch.supervisor import Supervisor, ensure_supervisor, replace_reason

__all__ = [
    "HEAD_LOST_STATUS", "NAMESPACE", "NAMESPACE_RULE", "CoordinatorActor", "CoordinatorSpec", "HeadLost", "HeadOptions",
    "HeadWatch", "LaunchPlan", "OnThread", "Supervisor", "Verdict", "collect_status", "connect", "ended", "ensure_supervisor",
    "follow", "gcs_address", "head_lost", "head_lost_line", "interrupted", "interrupted_start", "joined",
    "named_actors", "pending_reason", "print_status", "reach_problem", "replace_reason", "replaced", "resource_problem", "resources",
    "settings_differ", "start_coordinator", "stop_all", "stop_command", "wait", "worker_index",
]
