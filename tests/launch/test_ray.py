"""`rcswarm launch ray` (issue #16) without Ray: the plan's checks, pending reasons, a worker actor without its
token, usage errors, and the KubeRay manifests' launch commands parsed by the command's own parser.

The tests on a real local Ray instance are tests/swarm/test_ray.py.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from rcswarm.cli import launch
from rcswarm.launch import LaunchPlan, pending_reason
from rcswarm.protos.wire import TOKEN_ENV
from rcswarm.worker import WorkerOptions
from tests.helpers.waiting import wait_for


@pytest.mark.parametrize(("fields", "message"), [
    ({"workers": -1}, "--workers -1: expected an integer >= 0"),
    ({"gpus_per_worker": -0.5}, "--gpus-per-worker -0.5: expected a number >= 0"),
    ({"gpus_per_worker": 1.5}, "--gpus-per-worker 1.5: above 1 it must be a whole number of GPUs"),
    ({"cpus_per_worker": 0.0}, "--cpus-per-worker 0.0: expected a number > 0"),
    ({"namespace": "my ns"}, "--namespace 'my ns': expected letters"),
    ({"coordinator": "nohost"}, "--coordinator 'nohost': expected HOST:PORT"),
    ({"tls_ca": "ca.crt"}, "--tls-ca 'ca.crt': expected an absolute path"),
])
def test_a_bad_plan_is_refused_naming_the_flag(fields, message):
    worker = {k: Path(v) if k.startswith("tls_") else v for k, v in fields.items() if k in ("coordinator", "tls_ca")}
    plan = {k: v for k, v in fields.items() if k not in worker}
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        LaunchPlan(WorkerOptions(**{"coordinator": "c:1", **worker}), **{"workers": 2, **plan})


def _keys(value) -> list[str]:
    """Every key of nested dicts (dataclasses' asdict), at every depth."""
    if isinstance(value, dict):
        return [k for key, item in value.items() for k in (str(key), *_keys(item))]
    if isinstance(value, (list, tuple)):
        return [k for item in value for k in _keys(item)]
    return []


def test_the_plan_carries_no_token_and_threads_follow_the_cpus():
    plan = LaunchPlan(WorkerOptions("c:1"), workers=2, cpus_per_worker=2.5, gpus_per_worker=0.5)
    config = plan.worker_config(1)
    assert config.name == "rcswarm-worker-1" and config.worker.threads == 3
    # No field is a token (max_step_tokens is a limit): its keys, at every depth.
    assert not [key for key in _keys(asdict(plan)) + _keys(asdict(config)) if "token" in key and key != "max_step_tokens"]
    assert plan.demand() == {"CPU": 2.5, "GPU": 0.5}
    assert LaunchPlan(WorkerOptions("c:1"), workers=1, gpus_per_worker=0).demand() == {"CPU": 1.0}


def test_pending_reason_tells_infeasible_from_busy():
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
             {"Alive": True, "Resources": {"CPU": 16.0}}]
    infeasible = pending_reason({"CPU": 4.0, "GPU": 4.0}, nodes, {"CPU": 20.0, "GPU": 2.0})
    assert infeasible.startswith("infeasible: no node of the cluster has 4 GPU, 4 CPU (the largest has 2 GPU, 8 CPU)")
    busy = pending_reason({"CPU": 4.0, "GPU": 1.0}, nodes, {"CPU": 3.0})
    assert busy == "waiting for 1 GPU, 4 CPU free on one node (free in the whole cluster now: 3 CPU)"


def test_a_worker_actor_without_the_token_on_its_node_reports_why_and_stays_up(monkeypatch):
    """The token comes only from the node's environment: without it the actor's worker does not start and
    says so (state failed, exit 2), instead of exiting into a restart loop."""
    from rcswarm.worker import FAILED, RayWorker, RayWorkerConfig

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    actor = RayWorker(asdict(RayWorkerConfig(WorkerOptions("127.0.0.1:9", name="w", device="cpu", threads=1))))
    state, code, problem = wait_for(lambda: actor.outcome()[0] == FAILED and actor.outcome(), 30, "the refusal")
    assert code == 2 and problem.startswith(f"no join token on this Ray node: set ${TOKEN_ENV}")


def test_a_worker_actor_whose_worker_ends_in_error_reports_failed_with_the_reason(monkeypatch, start_coordinator):
    """A refused token ends the worker with exit status 1: the actor reports `failed` naming the refusal (the worker's
    own leave set the stop event it shares, which read as `stopped` without a reason), and does not start it again
    into the same refusal; a device it cannot parse is `failed` with exit 2; an exception out of the loop (say, CUDA
    out of memory) is started again MAX_ERROR_RETRIES times, then `failed` naming it, not an actor alive forever in
    `training` that Ray never restarts (before, it was `failed` at once, holding its resources: review of the Ray
    launcher, 2026-11-29)."""
    from rcswarm.worker import FAILED, STOPPED, RayWorker, RayWorkerConfig, ray_worker
    from rcswarm.worker.worker import Worker
    from tests.helpers.specs import tiny_spec

    local = start_coordinator(tiny_spec())
    monkeypatch.setattr(ray_worker, "FIRST_RETRY_S", 0.05)
    monkeypatch.setattr(ray_worker, "MAX_ERROR_RETRIES", 2)

    def outcome(options: WorkerOptions) -> tuple[str, int | None, str, int]:
        actor = RayWorker(asdict(RayWorkerConfig(options)))
        ended = wait_for(lambda: actor.outcome()[0] in (FAILED, STOPPED) and actor.outcome(), 30, "the actor's end")
        return (*ended, actor.retries)

    monkeypatch.setenv(TOKEN_ENV, "not-the-token")
    state, code, problem, retries = outcome(WorkerOptions(local.target, name="w", device="cpu", threads=1,
                                                          patience_s=5.0))
    assert (state, code, retries) == (FAILED, 1, 0) and "refused the join token" in problem, problem
    state, code, problem, retries = outcome(WorkerOptions(local.target, name="w", device="gpu", threads=1))
    assert (state, code, problem, retries) == (FAILED, 2, "--device 'gpu': expected auto, cpu, cuda or cuda:N", 0)

    def out_of_memory(self) -> int:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(Worker, "run", out_of_memory)
    state, code, problem, retries = outcome(WorkerOptions(local.target, name="w", device="cpu", threads=1))
    assert (state, code, retries) == (FAILED, 1, 2) and problem.startswith("RuntimeError: CUDA out of memory"), problem


def test_each_worker_actor_keeps_its_membership_in_a_private_file_per_coordinator(monkeypatch, tmp_path):
    """A restarted actor finds its predecessor's membership file on the node (worker/ray_worker.py); the file holds
    the worker secret, so its directory is the user's alone; another coordinator's actor of the same name has another
    file, and no coordinator leaves a directory of its own behind (one directory per user, nothing else)."""
    import stat
    import tempfile

    from rcswarm.worker.ray_worker import membership_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = membership_file(WorkerOptions("127.0.0.1:7000", name="rcswarm-worker-0"))
    assert first == membership_file(WorkerOptions("127.0.0.1:7000", name="rcswarm-worker-0"))
    assert first.name.endswith("-rcswarm-worker-0.membership.json") and not first.exists()
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700 and first.parent.parent == tmp_path
    other = membership_file(WorkerOptions("127.0.0.1:7001", name="rcswarm-worker-0"))
    assert other != first and other.parent == first.parent
    assert membership_file(WorkerOptions("127.0.0.1:7000", name="rcswarm-worker-1")) != first
    assert list(tmp_path.rglob("*")) == [first.parent]


@pytest.mark.parametrize(("argv", "message"), [
    (["ray", "--workers", "2"], "--coordinator HOST:PORT is required (or --with-coordinator)"),
    (["ray", "--coordinator", "c:1"], "--workers N is required to launch (or --status / --stop)"),
    (["ray", "--coordinator", "c:1", "--workers", "1", "--with-coordinator"], "--coordinator and --with-coordinator"),
    (["ray", "--with-coordinator", "--workers", "1"], "--with-coordinator needs --config RUN.toml and --state-dir DIR"),
    (["ray", "--coordinator", "c:1", "--workers", "1", "--cpus-per-worker", "nan"], "--cpus-per-worker nan"),
    (["kubernetes"], "unknown target 'kubernetes': expected `ray`"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


MUTUAL_TLS = {"tls": {"enabled": True, "secretName": "coordinator-tls",
                      "mutual": {"enabled": True, "clientSecretName": "worker-client-tls"}}}


RAYJOB = Path(__file__).resolve().parents[2] / "helm" / "kuberay" / "rayjob.yaml"


def parsed_launch(argv: list[str]):
    """`rcswarm launch ray ARGS` parsed and checked as the command would."""
    assert argv[:3] == ["rcswarm", "launch", "ray"], argv
    args = launch.parser().parse_args(argv[3:])
    assert launch.check_arguments(args) is None, argv
    return args


def mounted(path: str, pod_spec: dict) -> bool:
    """Whether `path` lies under a volume mount of the pod's first container."""
    mounts = pod_spec["containers"][0].get("volumeMounts", [])
    return any(path.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts)


@pytest.mark.parametrize("values", ["plain", "mutual-tls"])
def test_the_charts_ray_head_runs_a_launch_this_command_accepts(values):
    """The RayCluster's head calls `rcswarm launch ray` with arguments its parser takes, and every TLS
    file it names is mounted on the Ray worker pods, where the actors read it."""
    import shlex

    from tests.helpers.deploy import CHART, objects, render, scenario_values

    helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (pip install -e '.[dev]')")
    chart = helm_python.Chart.load(CHART)
    try:
        found = objects(render(chart, {**scenario_values("ray"), **(MUTUAL_TLS if values == "mutual-tls" else {})},
                               ["ray.io/v1"]))
    finally:
        chart.close()
    (cluster,) = [o for o in found if o["kind"] == "RayCluster"]
    script = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["args"][0]
    args = parsed_launch(shlex.split(script.split("exec ", 1)[1].split(")", 1)[0]))
    assert (args.workers, args.gpus_per_worker, args.cpus_per_worker, args.namespace) == (4, 1.0, 3.0, "demo-rcswarm")
    assert not args.detach, "the head's launcher follows the run (and removes the actors when it ends)"
    files = [str(f) for f in (args.tls_ca, args.tls_cert, args.tls_key) if f]
    assert len(files) == (3 if values == "mutual-tls" else 0)
    (worker_pod,) = [g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]]
    assert all(mounted(f, worker_pod) for f in files), (files, worker_pod["containers"][0].get("volumeMounts"))


def test_the_rayjob_manifest_is_a_valid_kuberay_rayjob():
    """helm/kuberay/rayjob.yaml: strictly valid against KubeRay's RayJob CRD; its entrypoint is a launch this
    command accepts that fits the worker group's GPUs; the token only from a Secret, on every Ray pod."""
    import shlex

    from tests.helpers.deploy import SCHEMAS, need, strict_custom_schema

    yaml, jsonschema = need("yaml", "PyYAML"), need("jsonschema", "jsonschema")
    job = yaml.safe_load(RAYJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    schema = strict_custom_schema(SCHEMAS / "kuberay" / "rayjob-v1.schema.json")
    jsonschema.Draft7Validator(schema).validate({k: v for k, v in job.items() if k != "metadata"})
    misspelt = {**job["spec"], "shutdownAfterJobFinish": True}
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        jsonschema.Draft7Validator(schema).validate({**job, "spec": misspelt})

    spec = job["spec"]
    args = parsed_launch(shlex.split(spec["entrypoint"]))
    assert args.address == "auto" and not args.detach and "runtimeEnvYAML" not in spec
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    gpus_per_pod = int(group["rayStartParams"]["num-gpus"])
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus_per_pod
    assert args.workers * args.gpus_per_worker <= group["maxReplicas"] * gpus_per_pod
    assert args.gpus_per_worker <= gpus_per_pod, "a worker actor must fit on one Ray pod"
    pods = [spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"], group["template"]["spec"]]
    for pod in pods:
        (token,) = [e for e in pod["containers"][0]["env"] if e["name"] == TOKEN_ENV]
        assert set(token) == {"name", "valueFrom"} and "secretKeyRef" in token["valueFrom"]
    assert TOKEN_ENV not in spec["entrypoint"] and "--token" not in spec["entrypoint"]


def test_cpu_only_workers_need_no_gpu_and_train_on_the_cpu():
    """Issue #33: a cluster without GPUs (one machine) is launched with --cpu-only, not --gpus-per-worker 0."""
    common = ["--coordinator", "127.0.0.1:50051", "--workers", "2"]
    plan = launch.plan_of(launch.parser().parse_args([*common, "--cpu-only"]), "127.0.0.1:50051")
    assert (plan.gpus_per_worker, plan.worker.device, plan.demand()) == (0.0, "cpu", {"CPU": 1.0})
    assert launch.plan_of(launch.parser().parse_args(common), "127.0.0.1:50051").gpus_per_worker == 1.0
    for extra, problem in ((["--gpus-per-worker", "1"], "--cpu-only and --gpus-per-worker 1: give one of them"),
                           (["--device", "cuda"], "--cpu-only and --device cuda: CPU workers train on the CPU")):
        assert launch.check_arguments(launch.parser().parse_args([*common, "--cpu-only", *extra])) == problem


def test_a_worker_actor_that_gave_up_on_a_silent_coordinator_starts_again(monkeypatch, tmp_path):
    """Its worker gave up (the coordinator unreachable past --patience-s) and the actor stayed "failed" for good,
    holding its resources, though the coordinator came back (review of the Ray launcher, 2026-11-29). It starts
    again after a delay (state "starting", the reason given) and joins the coordinator once it serves."""
    import socket
    import tempfile

    from rcswarm.coordinator.server import RunningCoordinator
    from rcswarm.coordinator.sweep import open_group
    from rcswarm.worker import ray_worker
    from rcswarm.worker.ray_worker import STARTING, STOPPED, TRAINING, RayWorker, RayWorkerConfig, retry_delay_s
    from tests.helpers.specs import TOKEN, tiny_spec

    assert [retry_delay_s(n) for n in (1, 2, 3, 5, 6, 100)] == [30.0, 60.0, 120.0, 480.0, 600.0, 600.0]
    monkeypatch.setattr(ray_worker, "FIRST_RETRY_S", 0.5)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with socket.socket() as probe:  # a port nothing serves yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = WorkerOptions(f"127.0.0.1:{port}", name="w", device="cpu", threads=1, patience_s=0.5)
    actor = RayWorker(asdict(RayWorkerConfig(options)))
    running = None
    try:
        state, code, problem = wait_for(lambda: actor.outcome()[0] == STARTING and actor.outcome()[2]
                                        and actor.outcome(), 30, "the actor to give up and wait")
        assert code is None and "gives up" in problem and "starting again in 0.5s (retry 1)" in problem, problem
        running = RunningCoordinator(open_group(tiny_spec(run={"rounds": 0}), tmp_path / "state"), TOKEN,
                                     port=port).start()
        wait_for(lambda: actor.outcome()[0] == TRAINING and actor.worker.worker_id, 60, "a start that joins")
        assert actor.retries >= 1 and actor.outcome()[2] == "", actor.outcome()  # no stale "starting again" reason
    finally:
        actor._stop_requested.set()
        actor._stop.set()
        actor._thread.join(timeout=30)
        if running is not None:
            running.stop(grace=0.5)
    assert actor.outcome()[0] == STOPPED
