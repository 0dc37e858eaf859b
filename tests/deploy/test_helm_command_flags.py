"""The chart's values that become command flags, at the edges of what values.schema.json lets through: rendered (Helm's
Go SDK, as tests/deploy/test_helm.py renders it), strictly valid, and accepted by the real checks of the commands they
reach: `rcswarm worker`'s `main` up to where it would connect (the worker Deployment), `rcswarm launch ray`'s parser
and `check_arguments` (the RayCluster head), `rcswarm coordinator`'s parser and `_argument_problem`. All in this
process: no command is started. The values beyond those edges are test_helm.py's BAD_VALUES and BAD_COMBINATIONS.

Also the RayCluster head's shell line: a launch refusing its arguments stops the head's `ray start`, so that the head
container restarts instead of looking healthy with no workers.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.deploy import SCHEMAS, need, objects, render, scenario_values, strict_custom_schema

APIS = ["ray.io/v1"]
TOKEN = "chart-flags-token-0123456789"
RAYCLUSTER_SCHEMA = SCHEMAS / "kuberay" / "raycluster-v1.schema.json"
MUTUAL_TLS = {"enabled": True, "secretName": "coordinator-tls",
              "mutual": {"enabled": True, "clientSecretName": "worker-client"}}
LONGEST_NAMESPACE = "N9._-" + "n" * 58  # 63 characters: the most launch/plan.py's NAMESPACE takes

# name -> (values, what the worker, the launch and the coordinator must have parsed from the rendered flags)
EDGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "the smallest quantities": (
        {"tls": MUTUAL_TLS,
         "workers": {"device": "cuda:1", "gpus": 2, "threads": 64, "patienceSeconds": 1000000,
                     "dataRoot": "/data/frames", "extraArgs": ["--rpc-timeout-s", "0.1", "--transfer-timeout-s", "0.1"]},
         "ray": {"enabled": True, "workerGroup": {"gpus": 1},
                 "launch": {"workers": 0, "gpusPerWorker": 0.0001, "cpusPerWorker": 0.0001,
                            "namespace": LONGEST_NAMESPACE, "dataRoot": "/data"}}},
        {"device": "cuda:1", "threads": 64, "patience_s": 1e6, "workers": 0, "gpus_per_worker": 0.0001,
         "cpus_per_worker": 0.0001, "namespace": LONGEST_NAMESPACE},
    ),
    "whole GPUs, the most CPUs": (
        {"workers": {"device": "cpu:0", "threads": 0, "patienceSeconds": 0.001},
         "ray": {"enabled": True, "workerGroup": {"gpus": 4},
                 "launch": {"workers": 16, "gpusPerWorker": 4, "cpusPerWorker": 1024, "namespace": ""}}},
        {"device": "cpu:0", "threads": 2, "patience_s": 0.001, "workers": 16, "gpus_per_worker": 4.0,
         "cpus_per_worker": 1024.0, "namespace": "demo-rcswarm"},
    ),
    "a GPU fraction": (
        {"workers": {"device": "cuda", "gpus": 1, "threads": 1},
         "ray": {"enabled": True, "workerGroup": {"gpus": 1},
                 "launch": {"gpusPerWorker": 0.9999, "cpusPerWorker": 3.3333, "namespace": "9"}}},
        {"device": "cuda", "threads": 1, "patience_s": 300.0, "workers": 2, "gpus_per_worker": 0.9999,
         "cpus_per_worker": 3.3333, "namespace": "9"},
    ),
    "CPU actors": (
        {"workers": {"device": "auto"},
         "ray": {"enabled": True, "workerGroup": {"gpus": 0}, "launch": {"gpusPerWorker": 0, "cpusPerWorker": 1}}},
        {"device": "auto", "threads": 2, "patience_s": 300.0, "workers": 2, "gpus_per_worker": 0.0,
         "cpus_per_worker": 1.0, "namespace": "demo-rcswarm"},
    ),
}


def only(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in found if o["kind"] == kind]
    return obj


def head_container(found: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = only(found, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    return container


def launch_argv(found: list[dict[str, Any]]) -> list[str]:
    """The head's `rcswarm launch ray` arguments (after `rcswarm launch ray`), as its shell line splits them."""
    argv = shlex.split(re.search(r"exec (rcswarm launch ray [^)]*)\)", head_container(found)["args"][0]).group(1))
    assert argv[:3] == ["rcswarm", "launch", "ray"]
    return argv[3:]


def here(args: list[str], tmp_path: Path) -> list[str]:
    """The worker pod's arguments with its own files moved under `tmp_path`: the membership file (locked and written
    beside itself) and the data root (which must exist); the pod's name and CPU limit as the kubelet fills them."""
    moved = [a.replace("$(POD_NAME)", "demo-rcswarm-worker-0").replace("$(CPU_LIMIT)", "2") for a in args]
    for flag in ("--membership-file", "--data-root"):
        if flag in moved:
            at = moved.index(flag) + 1
            moved[at] = str(tmp_path / moved[at].lstrip("/"))
    data_root = moved[moved.index("--data-root") + 1] if "--data-root" in moved else None
    if data_root is not None:
        Path(data_root).mkdir(parents=True)
    return moved


@pytest.mark.parametrize("edge", EDGES)
def test_edge_values_render_flags_the_commands_accept(chart, k8s_validate, monkeypatch, tmp_path, edge):
    """Before, the schema let through values the commands refuse (`cpusPerWorker: 0`, `gpusPerWorker: 1.5`, a 70
    character or "-abc" namespace, `device: mps`, `patienceSeconds: 1e9`); now it ends where the commands do, and the
    values at its edges render flags every command takes."""
    from rcswarm.cli import coordinator as coordinator_cli
    from rcswarm.cli import launch as launch_cli
    from rcswarm.cli import worker as worker_cli

    values, expected = EDGES[edge]
    found = objects(render(chart, values, APIS))
    jsonschema = need("jsonschema", "jsonschema")
    for obj in found:
        if obj["kind"] == "RayCluster":
            body = {k: v for k, v in obj.items() if k != "metadata"}
            jsonschema.Draft7Validator(strict_custom_schema(RAYCLUSTER_SCHEMA)).validate(body)
        else:
            k8s_validate.validate(obj, "1.27", strict=True)

    (container,) = only(found, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "worker"
    started = []
    # `main` runs every check of the command line, takes its locks, then hands the options to `run_worker`, which
    # would dial the coordinator: here it records them instead.
    monkeypatch.setattr(worker_cli, "run_worker", lambda options, token, tls: started.append((options, token)) or 0)
    monkeypatch.setenv("RCSWARM_TOKEN", TOKEN)
    assert worker_cli.main(here(container["args"][1:], tmp_path)) == 0
    ((options, token),) = started
    assert token == TOKEN
    assert (options.device, options.threads, options.patience_s) == (
        expected["device"], expected["threads"], expected["patience_s"])

    args = launch_cli.parser().parse_args(launch_argv(found))
    assert launch_cli.check_arguments(args) is None
    assert {k: getattr(args, k) for k in ("workers", "gpus_per_worker", "cpus_per_worker", "namespace")} == {
        k: expected[k] for k in ("workers", "gpus_per_worker", "cpus_per_worker", "namespace")}

    (coordinator,) = only(found, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert coordinator_cli._argument_problem(coordinator_cli.parse_args(coordinator["args"][1:])) is None


@pytest.mark.parametrize("values", [
    {"ray": {"enabled": False, "launch": {"gpusPerWorker": 4}, "workerGroup": {"gpus": 1}}},
    {"workers": {"enabled": False, "device": "cuda:3", "gpus": 0}},
], ids=["no RayCluster", "no worker Deployment"])
def test_the_cross_checks_hold_only_for_what_renders(chart, values):
    """`ray.launch.gpusPerWorker` beyond `ray.workerGroup.gpus` and a CUDA `workers.device` beyond `workers.gpus` fail
    the render only where they would be used: without the RayCluster, or without the worker Deployment, they render."""
    assert objects(render(chart, values, APIS))


def test_a_refused_launch_stops_the_ray_head(chart):
    """The head ran the launch in the background beside `exec ray start --block`: a launch refusing its arguments
    (exit status 2) ended alone, and the head stayed Running with no workers, the reason only in its log. Now the
    shell around the launch stops `ray start` (the shell's own PID, which exec kept) with SIGTERM on status 2: Ray's
    handler exits 1, the container restarts (CrashLoopBackOff in `kubectl get pods`), and its last log lines are the
    termination message. The kubelet expands `$(NAME)` and turns `$$` into `$` in args, so the line uses neither."""
    container = head_container(objects(render(chart, scenario_values("ray"), APIS)))
    script = container["args"][0]
    assert "$$" not in script and "$(" not in script
    launch = re.escape(shlex.join(["rcswarm", "launch", "ray", *launch_argv(objects(render(chart, scenario_values("ray"), APIS)))]))
    assert re.fullmatch(
        r"ulimit -n 65536; head=\$BASHPID; "
        r"\( \(until ray health-check >/dev/null 2>&1; do sleep 2; done; exec " + launch + r"\); "
        r"if \[ \$\? -eq 2 \]; then echo \"rcswarm launch ray refused its arguments[^\"]*\" >&2; kill -TERM \$head; fi\) "
        r"& exec \$KUBERAY_GEN_RAY_START_CMD", script), script
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
