"""The Kubernetes deployment, checked offline: helm/rcswarm rendered by real Helm code, every object
validated against real schemas, and the images of docker/ checked as far as no Docker engine allows.

* Helm: `helm-python-sdk` binds the Helm v4 Go SDK (no helm binary). Its C ABI's render takes the
  options `helm template` has (`api_versions`, `kube_version`); the Python wrapper does not pass them
  on, so `render` calls the ABI function itself, as the wrapper does.
* Kubernetes kinds: `kubernetes-validate`'s strict schemas (unknown fields refused) of Kubernetes
  1.27, the chart's floor, and of the newest version it bundles.
* Custom resources: the RayCluster and ServiceMonitor CRDs' openAPIV3Schema vendored in
  tests/deploy/k8s_schemas/ (see its README), made strict the way the API server's strict field validation is.
* The generated join token's survival across an upgrade: Helm's cluster-aware render reads the
  Secret back through `lookup` from a stand-in API server on 127.0.0.1 that serves that one Secret.
* Images: the Dockerfiles parsed by BuildKit's own parser (the `dockerfile` package), their COPY
  sources, entry point, pins and stages; the HEALTHCHECK script against a real gRPC health server.

Each dependency is in the `dev` extra; a test whose package is missing skips and names it.
"""

from __future__ import annotations

import ast
import base64
import copy
import json
import re
import shlex
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.helpers.deploy import (
    CHART,
    COORDINATOR_SERVICE,
    DOCKER,
    NAMESPACE,
    RELEASE,
    ROOT,
    SCHEMAS,
    load_healthcheck,
    need,
    objects,
    render,
    scenario_values,
    strict_custom_schema,
)

SCENARIOS = ("default", "gpu", "external-tls", "ingress-tls", "existing-secret", "servicemonitor", "ray", "view-token")
# API groups a scenario's cluster serves beyond Kubernetes' own (helm template --api-versions).
SCENARIO_APIS = {"ray": ["ray.io/v1"], "servicemonitor": ["monitoring.coreos.com/v1"],
                 "view-token": ["monitoring.coreos.com/v1"]}
CUSTOM_SCHEMAS = {
    ("ray.io/v1", "RayCluster"): SCHEMAS / "kuberay" / "raycluster-v1.schema.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "prometheus-operator" / "servicemonitor-v1.schema.json",
}
STATE_DIR_FLAG = "--state-dir"
TOKEN_FILE = "/etc/rcswarm/token/token"


def render_scenario(chart, name: str) -> list[dict[str, Any]]:
    return objects(render(chart, scenario_values(name), SCENARIO_APIS.get(name, [])))


def one(found: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in found if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in matches]}"
    return matches[0]


def pod_specs(found: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(owner, pod spec) of every pod template: StatefulSets, Deployments and the RayCluster's groups."""
    specs = []
    for obj in found:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            specs.append((obj["metadata"]["name"], obj["spec"]["template"]["spec"]))
        elif obj["kind"] == "RayCluster":
            specs.append(("ray head", obj["spec"]["headGroupSpec"]["template"]["spec"]))
            specs += [(f"ray {g['groupName']}", g["template"]["spec"]) for g in obj["spec"]["workerGroupSpecs"]]
    return specs


def coordinator_container(found: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(found, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return container


def worker_container(found: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(found, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def flag(args: list[str], name: str) -> str:
    """The value after `name` in an argument list."""
    assert name in args, f"{name} not in {args}"
    return args[args.index(name) + 1]


def test_chart_metadata_matches_the_package(chart):
    meta = chart.metadata
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["apiVersion"] == "v2"
    assert meta["appVersion"] == project["version"], "Chart.yaml's appVersion must be pyproject's version"
    # Built-in gRPC probes are GA from 1.27.
    assert meta["kubeVersion"] == ">= 1.27.0-0"


def schema_node(schema: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    """The values.schema.json node of a dotted values path ($refs followed); None past a leaf."""
    node = schema
    for key in path:
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        if "properties" not in node:
            return None
        node = node["properties"][key]
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_every_value_is_commented_and_in_the_schema():
    """values.yaml: each value the schema declares exists there, and each leaf has a comment line right above it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    parents: list[tuple[int, str]] = []
    checked = 0
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        parents = [(i, k) for i, k in parents if i < indent]
        path = [k for _, k in parents] + [match.group(2)]
        parent = schema_node(schema, path[:-1])
        parents.append((indent, match.group(2)))
        if parent is None or "properties" not in parent or any(parent is d for d in schema["$defs"].values()):
            continue  # inside a leaf, or a Kubernetes structure ($defs: resources, image) described as a whole
        assert match.group(2) in parent["properties"], f"values.yaml line {number + 1}: {'.'.join(path)} is not in the schema"
        if "properties" not in schema_node(schema, path):
            assert lines[number - 1].strip().startswith("#"), f"values.yaml line {number + 1}: {'.'.join(path)} has no comment"
            checked += 1
    assert checked > 60


def restart_mutable() -> tuple[str, ...]:
    """coordinator/resume.py's RESTART_MUTABLE, read from its source (importing the module would import torch)."""
    tree = ast.parse((ROOT / "coordinator" / "resume.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RESTART_MUTABLE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("coordinator/resume.py has no RESTART_MUTABLE")


def names_mutable(entry: str, words: set[str]) -> bool:
    """Whether `words` (run-spec keys as a text names them: `run.rounds`, `coordinator.*`, `outlier_*`, bare keys of
    the entry's table) name a key of the RESTART_MUTABLE `entry` (a key, or a prefix: `sync.outlier_`)."""
    table = entry.split(".", 1)[0]
    for word in words:
        key = word.rstrip("*")
        if (key if "." in key else f"{table}.{key}").startswith(entry):
            return True
    return False


def test_the_run_config_comment_and_upgrading_name_what_a_restart_may_change():
    """A restart on the same state may change the spec keys of RESTART_MUTABLE. docs/DEPLOY.md's "Upgrading" names
    every one; values.yaml's runConfig comment named five as the whole list (run.minutes, run.target_loss, the sync
    defences and pacing were missing) and now points to that list instead of keeping its own."""
    mutable = restart_mutable()
    lines = (CHART / "values.yaml").read_text().splitlines()
    at = lines.index("runConfig: |")
    start = at
    while lines[start - 1].startswith("#"):
        start -= 1
    comment = " ".join(line.lstrip("# ") for line in lines[start:at])
    named = set(re.findall(r"(?<![\w/])(?:run|model|data|inner|sync|coordinator|curriculum)\.[A-Za-z_*]+", comment))
    missing = [entry for entry in mutable if not names_mutable(entry, named)]
    assert not named or not missing, f"the runConfig comment lists {sorted(named)} as changeable, not {missing}"
    assert 'docs/DEPLOY.md, "Upgrading"' in comment and "RESTART_MUTABLE" in comment
    deploy = (ROOT / "docs" / "DEPLOY.md").read_text()
    upgrading = deploy.split("\n## Upgrading\n", 1)[1].split("\n## ", 1)[0]
    (bullet,) = [b for b in upgrading.split("\n* ") if "RESTART_MUTABLE" in b]
    words = set(re.findall(r"`([^`]+)`", bullet))
    assert not [entry for entry in mutable if not names_mutable(entry, words)], "docs/DEPLOY.md, Upgrading"


@pytest.mark.parametrize("scenario", ["default", "gpu", "external-tls", "ingress-tls", "existing-secret"])
def test_lint_is_clean(helm, scenario):
    """`helm lint --strict` on the chart: no warning or error (lint cannot declare extra APIs, hence
    no Ray or ServiceMonitor scenario here)."""
    report = helm.lint(CHART, scenario_values(scenario), strict=True, namespace=NAMESPACE, kube_version="v1.27.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], (problems, report["errors"])


def validate_custom(obj: dict[str, Any]) -> None:
    jsonschema = need("jsonschema", "jsonschema")
    body = {k: v for k, v in obj.items() if k != "metadata"}
    jsonschema.Draft7Validator(strict_custom_schema(CUSTOM_SCHEMAS[(obj["apiVersion"], obj["kind"])])).validate(body)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_object_is_valid(chart, k8s_validate, scenario):
    """Strictly valid against Kubernetes 1.27 and the newest bundled version; custom resources against their CRDs."""
    found = render_scenario(chart, scenario)
    assert {"StatefulSet", "Service", "ConfigMap"} <= {o["kind"] for o in found}
    for version in ("1.27", k8s_validate.latest_version()):
        for obj in found:
            where = f"{obj['kind']} {obj['metadata']['name']} against {version}"
            if (obj["apiVersion"], obj["kind"]) in CUSTOM_SCHEMAS:
                validate_custom(obj)
                continue
            try:
                k8s_validate.validate(obj, version, strict=True)
            except k8s_validate.ValidationError as exc:
                pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_strict_custom_schema_refuses_an_unknown_field(chart):
    """The RayCluster check can fail: a misspelt field of the rendered object is refused."""
    jsonschema = need("jsonschema", "jsonschema")
    cluster = copy.deepcopy(one(render_scenario(chart, "ray"), "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["replica"] = 2
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        validate_custom(cluster)


def test_each_scenario_renders_its_objects(chart):
    kinds = {name: sorted(o["kind"] for o in render_scenario(chart, name)) for name in SCENARIOS}
    assert kinds["default"] == ["ConfigMap", "Deployment", "Secret", "Service", "Service", "StatefulSet"]
    assert kinds["external-tls"].count("Service") == 3 and "Ingress" not in kinds["external-tls"]
    assert kinds["ingress-tls"].count("Service") == 2 and "Ingress" in kinds["ingress-tls"]
    assert "Secret" not in kinds["existing-secret"]
    assert "ServiceMonitor" in kinds["servicemonitor"] and kinds["servicemonitor"].count("ConfigMap") == 2
    assert "RayCluster" in kinds["ray"] and "Deployment" not in kinds["ray"]


def test_the_grafana_board_is_a_configmap_for_the_dashboard_sidecar(chart):
    """Issue #30: behind grafanaDashboard.enabled, the board of dashboards/rcswarm.json, whole, in a ConfigMap labelled
    grafana_dashboard: "1" as kube-prometheus-stack's sidecar expects (the queries are tests/observe/test_grafana.py's)."""
    assert not [o for o in render_scenario(chart, "default") if o["metadata"]["name"].endswith("-grafana-dashboard")]
    board = one(render_scenario(chart, "servicemonitor"), "ConfigMap", f"{RELEASE}-rcswarm-grafana-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["namespace"] == NAMESPACE and board["metadata"]["annotations"] == {"grafana_folder": "rcswarm"}
    assert json.loads(board["data"]["rcswarm.json"]) == json.loads((CHART / "dashboards" / "rcswarm.json").read_text())
    elsewhere = objects(render(chart, {"grafanaDashboard": {"enabled": True, "namespace": "monitoring",
                                                            "label": "dashboards", "labelValue": "rcswarm"}}))
    moved = one(elsewhere, "ConfigMap", f"{RELEASE}-rcswarm-grafana-dashboard")
    assert moved["metadata"]["namespace"] == "monitoring" and moved["metadata"]["labels"]["dashboards"] == "rcswarm"


BAD_VALUES = [
    ({"workers": {"replicas": -1}}, "at '/workers/replicas': minimum: got -1, want 0"),
    ({"grafanaDashboard": {"label": "no spaces"}}, "at '/grafanaDashboard/label': 'no spaces' does not match pattern"),
    ({"workers": {"gpus": 1.5}}, "at '/workers/gpus': got number, want integer"),
    ({"coordinator": {"persistence": {"size": "20"}}}, "at '/coordinator/persistence/size': '20' does not match pattern"),
    ({"coordinator": {"replicas": 2}}, "at '/coordinator': additional properties 'replicas' not allowed"),
    ({"workers": {"replica": 3}}, "at '/workers': additional properties 'replica' not allowed"),
    ({"workers": {"extraVolumes": ["frames"]}}, "at '/workers/extraVolumes/0': got string, want object"),
    ({"workers": {"extraVolumeMounts": [{"name": "frames"}]}}, "at '/workers/extraVolumeMounts/0': missing property 'mountPath'"),
    ({"ray": {"workerGroup": {"extraVolumes": ["frames"]}}}, "at '/ray/workerGroup/extraVolumes/0': got string, want object"),
    # The Ray launch is one shell line: a data root with a space or a quote would split it.
    ({"ray": {"launch": {"dataRoot": "/data/my frames"}}}, "at '/ray/launch/dataRoot': '/data/my frames' does not match pattern"),
    # A relative data root is resolved wherever each process runs (an actor's is not the launcher's directory).
    ({"ray": {"launch": {"dataRoot": "data/frames"}}}, "at '/ray/launch/dataRoot': 'data/frames' does not match pattern"),
    ({"workers": {"dataRoot": "data/frames"}}, "at '/workers/dataRoot': 'data/frames' does not match pattern"),
    ({"workers": {"dataRoot": "/data/\nframes"}}, "at '/workers/dataRoot': '/data/\\nframes' does not match pattern"),
    ({"workers": {"dataRoot": "/data/\u0085frames"}}, "at '/workers/dataRoot': "),  # a C1 control character (NEL)
    ({"coordinator": {"ingress": {"enabled": True}}}, "at '/coordinator/ingress/tlsSecretName': minLength: got 0, want 1"),
    # A misspelt strategy type rendered, and the API server refused the Deployment.
    ({"workers": {"strategy": {"type": "Recreat"}}}, "at '/workers/strategy/type': value must be one of 'RollingUpdate', 'Recreate'"),
    ({"workers": {"strategy": {"rollingUpdate": {"maxUnavailabe": 1}}}},
     "at '/workers/strategy/rollingUpdate': additional properties 'maxUnavailabe' not allowed"),
    # Every name is the full name and a suffix; the longest must fit 63 characters (the StatefulSet 52).
    ({"fullnameOverride": "f" * 41}, "at '/fullnameOverride': maxLength: got 41, want 40"),
    ({"nameOverride": "n" * 41}, "at '/nameOverride': maxLength: got 41, want 40"),
    # Values that become command flags, within what the command accepts: each of these rendered, and the head's
    # `rcswarm launch ray` (in the background: the head stayed healthy with no workers) or every worker pod (a crash
    # loop) refused it.
    ({"ray": {"launch": {"cpusPerWorker": 0}}}, "at '/ray/launch/cpusPerWorker': exclusiveMinimum: got 0, want 0"),
    ({"ray": {"launch": {"cpusPerWorker": 0.00001}}}, "at '/ray/launch/cpusPerWorker': multipleOf: got 1×10⁻⁰⁵, want 0.0001"),
    # Rounded up, an actor's torch threads, which a worker takes at most 1024 of.
    ({"ray": {"launch": {"cpusPerWorker": 1025}}}, "at '/ray/launch/cpusPerWorker': maximum: got 1,025, want 1,024"),
    ({"ray": {"launch": {"gpusPerWorker": 1.5}}}, "at '/ray/launch/gpusPerWorker': 'anyOf' failed"),
    ({"ray": {"launch": {"gpusPerWorker": 0.00001}}}, "at '/ray/launch/gpusPerWorker': multipleOf: got 1×10⁻⁰⁵, want 0.0001"),
    ({"ray": {"launch": {"gpusPerWorker": -1}}}, "at '/ray/launch/gpusPerWorker': minimum: got -1, want 0"),
    ({"ray": {"launch": {"namespace": "n" * 64}}}, "at '/ray/launch/namespace': '" + "n" * 64 + "' does not match pattern"),
    ({"ray": {"launch": {"namespace": "-abc"}}}, "at '/ray/launch/namespace': '-abc' does not match pattern"),
    ({"ray": {"launch": {"namespace": "my run"}}}, "at '/ray/launch/namespace': 'my run' does not match pattern"),
    ({"workers": {"device": "mps"}}, "at '/workers/device': 'mps' does not match pattern"),
    ({"workers": {"device": "cuda:01"}}, "at '/workers/device': 'cuda:01' does not match pattern"),
    ({"workers": {"patienceSeconds": 1e9}}, "at '/workers/patienceSeconds': maximum: got 1×10⁰⁹, want 1×10⁰⁶"),
    ({"workers": {"threads": 100000}}, "at '/workers/threads': maximum: got 100,000, want 1,024"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_bad_values_are_refused_by_the_schema(helm, chart, values, message):
    with pytest.raises(helm.HelmValuesError) as refused:
        render(chart, values)
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert message in str(refused.value)


BAD_COMBINATIONS = [
    ({"ray": {"enabled": True}}, [], "ray.enabled needs the KubeRay operator: this cluster does not serve the ray.io/v1 API"),
    ({"serviceMonitor": {"enabled": True}}, [], "serviceMonitor.enabled needs the Prometheus Operator"),
    ({"coordinator": {"external": {"enabled": True}}}, [], "coordinator.external.enabled exposes the coordinator outside the cluster: set tls.enabled=true"),
    ({"tls": {"enabled": True}}, [], "tls.enabled needs tls.secretName"),
    # Two container ports of one number: rendered and valid before, then a crash loop (the dashboard cannot bind).
    ({"tls": {"enabled": True, "secretName": "tls"}, "coordinator": {"dashboard": {"port": 50052}}}, [],
     "coordinator.dashboard.port 50052 equals coordinator.healthPort"),
    # The ingress controller terminates TLS: an outside worker's client certificate never reaches the coordinator.
    ({"tls": {"enabled": True, "secretName": "tls", "mutual": {"enabled": True, "clientSecretName": "client"}},
      "coordinator": {"ingress": {"enabled": True, "tlsSecretName": "host-tls"}}}, [],
     "tls.mutual.enabled and coordinator.ingress.enabled cannot be combined"),
    ({"tls": {"enabled": True, "secretName": "tls", "mutual": {"enabled": True, "clientSecretName": "client"}},
      "coordinator": {"ingress": {"enabled": True, "tlsSecretName": "host-tls"}}}, [],
     "Expose the coordinator with coordinator.external instead (a LoadBalancer or NodePort Service that passes TLS through"),
    # Prometheus refuses a scrape timeout above the interval: the chart's values said so, and rendered it anyway.
    ({"serviceMonitor": {"enabled": True, "interval": "30s", "scrapeTimeout": "1m"}, "coordinator": {"dashboard": {"enabled": True}}},
     ["monitoring.coreos.com/v1"], "serviceMonitor.scrapeTimeout 1m is longer than serviceMonitor.interval 30s"),
    ({"serviceMonitor": {"enabled": True, "interval": "1m30s", "scrapeTimeout": "91s"}}, ["monitoring.coreos.com/v1"],
     "serviceMonitor.scrapeTimeout 91s is longer than serviceMonitor.interval 1m30s"),
    ({"serviceMonitor": {"enabled": True, "interval": "500ms", "scrapeTimeout": "1s"}}, ["monitoring.coreos.com/v1"],
     "serviceMonitor.scrapeTimeout 1s is longer than serviceMonitor.interval 500ms"),
    # An actor whose GPUs no Ray worker pod has: rendered, launched, and pending for ever.
    ({"ray": {"enabled": True, "launch": {"gpusPerWorker": 4}, "workerGroup": {"gpus": 1}}}, ["ray.io/v1"],
     "ray.launch.gpusPerWorker 4 is above ray.workerGroup.gpus 1: a worker actor's GPUs must all be on one Ray worker pod"),
    ({"ray": {"enabled": True, "launch": {"gpusPerWorker": 0.5}, "workerGroup": {"gpus": 0}}}, ["ray.io/v1"],
     "ray.launch.gpusPerWorker 0.5 is above ray.workerGroup.gpus 0"),
    # A CUDA device the worker pod does not have: the worker exits at its start, and the pod crash loops.
    ({"workers": {"device": "cuda"}}, [], "workers.device cuda needs workers.gpus > 0"),
    ({"workers": {"device": "cuda:2", "gpus": 2}}, [],
     "workers.device cuda:2: a worker pod sees its workers.gpus 2 GPUs as cuda:0 to cuda:1"),
]


@pytest.mark.parametrize(("values", "apis", "message"), BAD_COMBINATIONS, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_bad_combinations_fail_the_render_with_a_message(helm, chart, values, apis, message):
    with pytest.raises(helm.HelmRenderError) as refused:
        render(chart, values, apis)
    assert message in str(refused.value)


@pytest.mark.parametrize(("interval", "timeout"), [("30s", "10s"), ("1m30s", "90s"), ("1m", "59s500ms"), ("2h", "119m"), ("1s", "500ms")])
def test_a_scrape_timeout_within_the_interval_renders(chart, interval, timeout):
    found = objects(render(chart, {"serviceMonitor": {"enabled": True, "interval": interval, "scrapeTimeout": timeout}},
                           ["monitoring.coreos.com/v1"]))
    (endpoint,) = one(found, "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == (interval, timeout)


def test_the_worker_strategy_carries_rolling_update_only_with_that_type(chart, k8s_validate):
    """Helm merges the default rollingUpdate block into `type: Recreate`; the API server refuses
    spec.strategy.rollingUpdate beside Recreate (kubernetes-validate does not check that rule)."""
    default = one(render_scenario(chart, "default"), "Deployment")["spec"]["strategy"]
    assert default == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"}}
    recreate = one(objects(render(chart, {"workers": {"strategy": {"type": "Recreate"}}})), "Deployment")
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}
    k8s_validate.validate(recreate, "1.27", strict=True)
    custom = {"workers": {"strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}}
    assert one(objects(render(chart, custom)), "Deployment")["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def render_release(chart, release: str, values: dict[str, Any], api_versions: list[str]) -> dict[str, str]:
    """`render` under another release name."""
    from helm_python import _native

    options = {"name": release, "namespace": NAMESPACE, "is_install": True, "api_versions": api_versions}
    return json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(options)))


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Where NOTES.txt names an object: (kind, pattern whose group is the name).
NOTES_NAMES = [
    ("StatefulSet", r"coordinator (\S+) \(one pod"),
    ("StatefulSet", r"PersistentVolumeClaim\s+state-(\S+)-0,"),
    ("Deployment", r"worker\(s\) in Deployment (\S+?)\.\n"),
    ("Deployment", r"deployment/(\S+) --replicas"),
    ("Secret", r"The join token is in Secret (\S+) "),
    ("Secret", r"kubectl get secret -n \S+ (\S+) -o jsonpath"),
    ("Service", r"svc/(\S+) "),
    ("Service", r"joins through Service (\S+):"),
    ("Service", r"kubectl get svc -n \S+ (\S+) "),
    ("RayCluster", r"RayCluster (\S+):"),
    ("RayCluster", r"ray\.io/cluster=([^,]+),"),
]


@pytest.mark.parametrize("length", [33, 42, 53])
@pytest.mark.parametrize("mutual", [False, True], ids=["ingress", "mutual"])
def test_long_release_names_give_distinct_valid_names(chart, length, mutual):
    """Helm allows release names of 53 characters. Every object's name stays distinct within its kind and
    within 63 characters (a StatefulSet's within 52: its pods carry controller-revision-hash
    "<name>-<10-character hash>"), and NOTES.txt names only objects the chart makes."""
    release = ("team-research-longsequence-recurrent-experiment-00042" + "x" * 53)[:length]
    values: dict[str, Any] = {
        "tls": {"enabled": True, "secretName": "coordinator-tls",
                "mutual": {"enabled": mutual, "clientSecretName": "client"}},
        "coordinator": {"external": {"enabled": True}, "dashboard": {"enabled": True},
                        # Mutual TLS cannot go through an Ingress (the chart refuses it).
                        "ingress": {"enabled": not mutual, "host": "swarm.example.org", "tlsSecretName": "host-tls"}},
        "serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}, "ray": {"enabled": True},
    }
    apis = ["ray.io/v1", "monitoring.coreos.com/v1"]
    rendered = render_release(chart, release, values, apis)
    names: dict[str, list[str]] = {}
    for obj in objects(rendered):
        names.setdefault(obj["kind"], []).append(obj["metadata"]["name"])
    assert len(names["Service"]) == 3 and len(names["ConfigMap"]) == 2 and len(names.get("Ingress", [])) == (not mutual)
    for kind, listed in names.items():
        assert len(listed) == len(set(listed)), f"{kind} names collide: {listed}"
        for name in listed:
            assert DNS_LABEL.match(name) and len(name) <= 63, f"{kind} {name}: {len(name)} characters"
    (statefulset,) = names["StatefulSet"]
    assert len(statefulset) <= 52, f"{statefulset}: {len(statefulset)} characters, its pods' labels would pass 63"
    # Another release sharing that prefix gets names of its own.
    other = objects(render_release(chart, release[:-1] + "y", values, apis))
    assert one(other, "StatefulSet")["metadata"]["name"] != statefulset
    notes = rendered["rcswarm/templates/NOTES.txt"]
    printed = set()
    for kind, pattern in NOTES_NAMES:
        for name in re.findall(pattern, notes):
            assert name in names.get(kind, []), f"NOTES.txt names {kind} {name!r}; the chart makes {names.get(kind)}"
            printed.add((kind, pattern))
    assert len(printed) == len(NOTES_NAMES), f"NOTES.txt no longer prints {set(NOTES_NAMES) - printed}:\n{notes}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_exactly_one_coordinator_in_a_statefulset(chart, scenario):
    found = render_scenario(chart, scenario)
    statefulset = one(found, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 1
    assert statefulset["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert all(o["spec"]["template"]["spec"]["containers"][0]["name"] != "coordinator"
               for o in found if o["kind"] == "Deployment")


def test_state_dir_is_the_retained_volume(chart):
    found = render_scenario(chart, "default")
    statefulset = one(found, "StatefulSet")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    container = coordinator_container(found)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[flag(container["args"], STATE_DIR_FLAG)] == claim["metadata"]["name"]
    assert "PersistentVolumeClaim" not in {o["kind"] for o in found}, "a templated PVC would be deleted on uninstall"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_token_comes_only_from_a_secret(chart, scenario):
    rendered = render(chart, scenario_values(scenario), SCENARIO_APIS.get(scenario, []))
    found = objects(rendered)
    secret_name, key = ("swarm-join-token", "join-token") if scenario == "existing-secret" else (f"{RELEASE}-rcswarm-token", "token")
    specs = pod_specs(found)
    assert specs
    coordinator = one(found, "StatefulSet")["metadata"]["name"]
    for owner, spec in specs:
        for container in spec["containers"]:
            args = container.get("args", [])
            if owner == coordinator:
                # The Secret as a file the coordinator re-reads (#3 of the review): no token in its args or env.
                assert flag(args, "--token-file") == TOKEN_FILE and "--token" not in args, owner
                assert "RCSWARM_TOKEN" not in {e["name"] for e in container["env"]}, owner
                volumes = {v["name"]: v for v in spec["volumes"]}
                mount = next(m for m in container["volumeMounts"] if TOKEN_FILE.startswith(m["mountPath"] + "/"))
                assert volumes[mount["name"]]["secret"] == {"secretName": secret_name, "items": [{"key": key, "path": "token"}]}
                continue
            assert not any(a.startswith("--token") for a in args), owner
            (token,) = [e for e in container["env"] if e["name"] == "RCSWARM_TOKEN"]
            assert token == {"name": "RCSWARM_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": key}}}, owner
    secrets = [o for o in found if o["kind"] == "Secret"]
    if scenario == "existing-secret":
        assert not secrets
        return
    (secret,) = secrets
    value = secret["data"]["token"]
    assert len(base64.b64decode(value)) == 48
    text = "\n".join(rendered.values())
    assert text.count(value) == 1 and base64.b64decode(value).decode() not in text


def test_each_render_without_a_cluster_makes_a_new_token(chart):
    """What the GitOps caveat is about: without `lookup` results every render draws a new token."""
    tokens = {one(objects(render(chart)), "Secret")["data"]["token"] for _ in range(2)}
    assert len(tokens) == 2


class SecretServer(BaseHTTPRequestHandler):
    """A stand-in Kubernetes API server holding one Secret, for Helm's `lookup` (GET only)."""

    secret: ClassVar[dict[str, Any]] = {}

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        name = self.secret["metadata"]["name"]
        if path == "/api/v1":
            body = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret", "verbs": ["get"]}]}
            self.reply(200, body)
        elif path == f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}":
            self.reply(200, self.secret)
        else:
            self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

    def reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_generated_token_is_kept_across_an_upgrade(helm, chart):
    """An upgrade renders with the cluster: `lookup` finds the release's Secret and the token stays."""
    kept = base64.b64encode(b"the-token-of-the-first-install").decode()
    handler = type("Handler", (SecretServer,), {"secret": {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {"token": kept},
        "metadata": {"name": f"{RELEASE}-rcswarm-token", "namespace": NAMESPACE}}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "u", "namespace": NAMESPACE}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
    })
    try:
        with helm.Config(kubeconfig_content=kubeconfig, namespace=NAMESPACE) as config:
            rendered = config.render(chart, name=RELEASE, namespace=NAMESPACE, is_upgrade=True)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert one(objects(rendered), "Secret")["data"]["token"] == kept


@pytest.mark.parametrize(("scenario", "port"), [("default", 50051), ("external-tls", 50052)])
def test_probes_ask_the_health_service(chart, scenario, port):
    """gRPC probes: startup and readiness on the coordinator's service, liveness on the server's ("");
    with TLS on the plaintext --health-port, without it on the main port (then --insecure)."""
    from rcswarm.coordinator.guards import SERVICE_NAME

    assert SERVICE_NAME == COORDINATOR_SERVICE
    container = coordinator_container(render_scenario(chart, scenario))
    for probe, service in (("startupProbe", SERVICE_NAME), ("readinessProbe", SERVICE_NAME), ("livenessProbe", "")):
        assert container[probe]["grpc"] == {"port": port, "service": service}, probe
    args = container["args"]
    if scenario == "default":
        assert "--insecure" in args and "--health-port" not in args and "--tls-cert" not in args
    else:
        assert flag(args, "--health-port") == str(port) and "--insecure" not in args
        assert port in {p["containerPort"] for p in container["ports"]}


def test_the_config_checksum_restarts_only_the_coordinator(chart):
    def annotations(values):
        found = objects(render(chart, values))
        return (one(found, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]["checksum/run-config"],
                one(found, "Deployment")["spec"]["template"])

    base, workers = annotations(None)
    again, _ = annotations(None)
    longer, workers_after = annotations({"runConfig": "[run]\nname = \"k8s-demo\"\nrounds = 2000\n"})
    assert base == again and base != longer
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert workers == workers_after, "a new run config must not restart the workers (they re-join the coordinator)"


def test_the_shipped_run_config_is_a_valid_run_spec(chart):
    from rcswarm.config.runspec import RunSpec

    configmap = one(objects(render(chart)), "ConfigMap")
    spec = RunSpec.from_dict(tomllib.loads(configmap["data"]["run.toml"]))
    assert spec.run.name == "k8s-demo" and spec.model.name == "lstm_lm"


def test_worker_threads_follow_the_cpu_limit(chart):
    container = worker_container(render_scenario(chart, "default"))
    assert flag(container["args"], "--threads") == "$(CPU_LIMIT)"
    (limit,) = [e for e in container["env"] if e["name"] == "CPU_LIMIT"]
    assert limit["valueFrom"]["resourceFieldRef"] == {"containerName": container["name"], "resource": "limits.cpu", "divisor": "1"}
    fixed = worker_container(objects(render(chart, {"workers": {"threads": 3}})))
    assert flag(fixed["args"], "--threads") == "3"


def test_gpu_workers(chart):
    cpu = worker_container(render_scenario(chart, "default"))
    found = render_scenario(chart, "gpu")
    gpu = worker_container(found)
    spec = one(found, "Deployment")["spec"]
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"] and cpu["image"] == "rcswarm:0.1.0-cpu"
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1 and gpu["image"] == "rcswarm:0.1.0-cuda"
    assert flag(gpu["args"], "--device") == "cuda"
    assert spec["replicas"] == 4 and spec["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


def test_tls_reaches_every_client(chart):
    """With TLS, in-cluster workers trust the CA and present their client certificate; the
    external Service and the Ingress carry only gRPC."""
    found = render_scenario(chart, "external-tls")
    args = worker_container(found)["args"]
    assert flag(args, "--tls-ca") == "/etc/rcswarm/tls-ca/ca.crt"
    assert flag(args, "--tls-cert") == "/etc/rcswarm/tls-client/tls.crt"
    assert flag(coordinator_container(found)["args"], "--tls-client-ca") == "/etc/rcswarm/tls-ca/ca.crt"
    external = one(found, "Service", f"{RELEASE}-rcswarm-coordinator-external")
    assert external["spec"]["type"] == "LoadBalancer"
    assert [(p["port"], p["appProtocol"]) for p in external["spec"]["ports"]] == [(443, "grpc")]
    found = render_scenario(chart, "ingress-tls")
    assert flag(worker_container(found)["args"], "--tls-ca") == "/etc/rcswarm/tls-ca/ca.crt"
    ingress = one(found, "Ingress")
    assert ingress["spec"]["tls"][0]["secretName"] == "swarm-example-org-tls"
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] == f"/{COORDINATOR_SERVICE}"


def strictly_valid(k8s_validate, found: list[dict[str, Any]]) -> None:
    """Every Kubernetes object of `found` strictly valid against 1.27 and the newest bundled version."""
    for version in ("1.27", k8s_validate.latest_version()):
        for obj in found:
            if (obj["apiVersion"], obj["kind"]) not in CUSTOM_SCHEMAS:
                k8s_validate.validate(obj, version, strict=True)


BODY_SIZE = "nginx.ingress.kubernetes.io/proxy-body-size"


def test_the_ingress_lifts_the_request_body_limit_of_ingress_nginx(chart, k8s_validate):
    """ingress-nginx counts a gRPC client stream against proxy-body-size (1m by default): a pushed update is
    larger, nginx answered 413 and the run stalled at version 0. The chart sets "0" (no limit); the user's
    annotations are kept beside it, and one of that name replaces it."""
    found = render_scenario(chart, "ingress-tls")
    assert one(found, "Ingress")["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/backend-protocol": "GRPCS", BODY_SIZE: "0"}
    strictly_valid(k8s_validate, found)
    bare = {"tls": {"enabled": True, "secretName": "tls"},
            "coordinator": {"ingress": {"enabled": True, "tlsSecretName": "host-tls"}}}
    assert one(objects(render(chart, bare)), "Ingress")["metadata"]["annotations"] == {BODY_SIZE: "0"}
    mine = copy.deepcopy(bare)
    mine["coordinator"]["ingress"]["annotations"] = {BODY_SIZE: "64m", "example.org/team": "ml"}
    ingress = one(objects(render(chart, mine)), "Ingress")
    assert ingress["metadata"]["annotations"] == {BODY_SIZE: "64m", "example.org/team": "ml"}
    k8s_validate.validate(ingress, "1.27", strict=True)


def test_worker_extra_volumes_bring_a_git_dataset(chart, k8s_validate):
    """A git dataset run (data.source = "git") needs the dataset on every worker: workers.extraVolumes and
    workers.extraVolumeMounts reach the worker pod as written, after the chart's own; none by default. A worker
    reads a dataset only under its --data-root (worker/data_root.py): workers.dataRoot, none by default."""
    from rcswarm.cli import worker

    default = one(render_scenario(chart, "default"), "Deployment")["spec"]["template"]["spec"]
    assert [v["name"] for v in default["volumes"]] == ["tmp"]
    assert [m["name"] for m in default["containers"][0]["volumeMounts"]] == ["tmp"]
    assert "--data-root" not in default["containers"][0]["args"]
    run_config = (ROOT / "examples" / "git_frames.toml").read_text()
    dataset = tomllib.loads(run_config)["data"]["task_config"]["dataset"]
    volume = {"name": "frames", "persistentVolumeClaim": {"claimName": "git-frames", "readOnly": True}}
    mount = {"name": "frames", "mountPath": f"/tmp/{dataset}", "readOnly": True}
    values = {**scenario_values("external-tls"), "runConfig": run_config,
              "workers": {"extraVolumes": [volume], "extraVolumeMounts": [mount], "dataRoot": mount["mountPath"]}}
    found = objects(render(chart, values))
    spec = one(found, "Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["volumes"][0]["name"] == "tmp" and spec["volumes"][-1] == volume
    assert container["volumeMounts"][0]["mountPath"] == "/tmp" and container["volumeMounts"][-1] == mount
    parsed = worker.parse_args([a.replace("$(CPU_LIMIT)", "2").replace("$(POD_NAME)", "w-0") for a in container["args"][1:]])
    assert parsed.data_root == Path(f"/tmp/{dataset}")
    # One argument, quoted: a path with a space or a ';' is the path (the schema refused them before).
    odd = {**values, "workers": {**values["workers"], "dataRoot": "/data/my frames;x"}}
    args = one(objects(render(chart, odd)), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--data-root") + 1] == "/data/my frames;x"
    # The mount is where the relative dataset path lands: the worker runs in the image's WORKDIR, /tmp.
    assert "workingDir" not in container
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        (runtime,) = [st for st in stages(DOCKER / name) if st["name"] == "runtime"]
        assert [c.value[0] for c in runtime["commands"] if c.cmd == "WORKDIR"][-1] == "/tmp", name
    assert "frames" not in {v["name"] for v in one(found, "StatefulSet")["spec"]["template"]["spec"]["volumes"]}
    strictly_valid(k8s_validate, found)


def test_the_coordinator_token_file_holds_what_it_parses_and_follows_the_secret(chart, tmp_path):
    """The coordinator reads the Secret's key as its --token-file: the generated token (and a Secret written with
    a trailing newline) is one token to parse_tokens, and a kubelet-style update of the volume (the ..data symlink
    swapped) is taken without a restart."""
    from rcswarm.cli import coordinator as coordinator_cli
    from rcswarm.coordinator.tokens import JoinTokens, parse_tokens

    found = render_scenario(chart, "default")
    token = base64.b64decode(one(found, "Secret")["data"]["token"]).decode()
    assert parse_tokens(token, "secret") == (token,)
    assert parse_tokens(token + "\n", "secret") == (token,)
    args = coordinator_cli.parse_args(coordinator_container(found)["args"][1:])
    assert str(args.token_file) == TOKEN_FILE and args.token is None
    # The layout the kubelet gives a Secret volume: token -> ..data/token, ..data -> a timestamped dir.
    for version, value in (("a", token), ("b", "rotated-token\n")):
        (tmp_path / version).mkdir()
        (tmp_path / version / "token").write_text(value)
    (tmp_path / "..data").symlink_to("a")
    (tmp_path / "token").symlink_to("..data/token")
    tokens = JoinTokens.from_file(tmp_path / "token", check_every_s=0.0)
    assert tokens.accepts_token(token) and not tokens.accepts_token("rotated-token")
    (tmp_path / "..data_tmp").symlink_to("b")
    (tmp_path / "..data_tmp").replace(tmp_path / "..data")
    assert tokens.accepts_token("rotated-token") and not tokens.accepts_token(token)


def test_servicemonitor_scrapes_with_the_token(chart):
    found = render_scenario(chart, "servicemonitor")
    (endpoint,) = one(found, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": f"{RELEASE}-rcswarm-token", "key": "token"}}
    service = one(found, "Service", f"{RELEASE}-rcswarm-coordinator")
    assert "http" in {p["name"] for p in service["spec"]["ports"]}


def test_with_tls_the_dashboard_serves_https_and_is_scraped_over_it(chart):
    """With tls.enabled the dashboard serves HTTPS with the coordinator's certificate (--http-tls), and the
    ServiceMonitor scrapes it over HTTPS checked against the CA: the join token, its Bearer credential, never
    crosses the pod network in the clear (before: --http-tls missing and `scheme: http`)."""
    values = {**scenario_values("servicemonitor"), "tls": {"enabled": True, "secretName": "coordinator-tls"}}
    found = objects(render(chart, values, SCENARIO_APIS["servicemonitor"]))
    assert "--http-tls" in coordinator_container(found)["args"]
    monitor = one(found, "ServiceMonitor")
    validate_custom(monitor)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "coordinator-tls", "key": "ca.crt"}},
        "serverName": f"{RELEASE}-rcswarm-coordinator.{NAMESPACE}.svc",
    }
    plain = objects(render(chart, scenario_values("servicemonitor"), SCENARIO_APIS["servicemonitor"]))
    assert "--http-tls" not in coordinator_container(plain)["args"]
    assert one(plain, "ServiceMonitor")["spec"]["endpoints"][0]["scheme"] == "http"


# -- the read-only view token (coordinator.dashboard.viewTokenSecret): mounted as the coordinator's
# --view-token-file, sent by the ServiceMonitor instead of the join token.

VIEW_FILE = "/etc/rcswarm/view-token/token"
MONITOR_APIS = SCENARIO_APIS["view-token"]


def render_view(chart: Any, **dashboard: Any) -> list[dict[str, Any]]:
    values = scenario_values("view-token")
    values["coordinator"]["dashboard"].update(dashboard)
    return objects(render(chart, values, MONITOR_APIS))


def test_the_view_token_secret_is_the_coordinators_view_token_file(chart):
    found = render_view(chart)
    (pod,) = [o["spec"]["template"]["spec"] for o in found if o["kind"] == "StatefulSet"]
    container = coordinator_container(found)
    args = container["args"]
    assert flag(args, "--view-token-file") == VIEW_FILE and flag(args, "--token-file") == TOKEN_FILE
    mount = next(m for m in container["volumeMounts"] if VIEW_FILE.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True and mount.get("subPath") is None, "no subPath: the kubelet updates the file"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["secret"] == {
        "secretName": "dashboard-view-token", "items": [{"key": "view-token", "path": "token"}]}
    join_mount = next(m for m in container["volumeMounts"] if TOKEN_FILE.startswith(m["mountPath"] + "/"))
    assert join_mount["name"] != mount["name"], "the join token and the view token are separate volumes"
    # The CLI parses what the chart passes: the dashboard then requires a token (view or join) as before.
    from rcswarm.cli import coordinator as coordinator_cli

    parsed = coordinator_cli.parse_args(args[1:])
    assert str(parsed.view_token_file) == VIEW_FILE and coordinator_cli._argument_problem(parsed) is None


def test_the_servicemonitor_sends_the_view_token_not_the_join_token(chart):
    (endpoint,) = one(render_view(chart), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": "dashboard-view-token", "key": "view-token"}}
    # Without the value: the join token, as before.
    plain = objects(render(chart, scenario_values("servicemonitor"), MONITOR_APIS))
    (before,) = one(plain, "ServiceMonitor")["spec"]["endpoints"]
    assert before["authorization"]["credentials"] == {"name": f"{RELEASE}-rcswarm-token", "key": "token"}
    assert "--view-token-file" not in coordinator_container(plain)["args"]
    assert "view-token" not in {m["name"] for m in coordinator_container(plain)["volumeMounts"]}


def test_with_the_dashboard_off_no_view_token_is_passed(chart):
    found = objects(render(chart, {"coordinator": {"dashboard": {"enabled": False,
                                                                 "viewTokenSecret": "dashboard-view-token"}}}))
    container = coordinator_container(found)
    assert "--view-token-file" not in container["args"] and "--http-port" not in container["args"]
    assert "view-token" not in {m["name"] for m in container["volumeMounts"]}


def test_the_view_token_render_with_tls_is_strictly_valid(chart, k8s_validate):
    """The scenario itself is in SCENARIOS (test_every_rendered_object_is_valid); with TLS too."""
    values = {**scenario_values("view-token"), "tls": {"enabled": True, "secretName": "coordinator-tls"}}
    found = objects(render(chart, values, MONITOR_APIS))
    assert "--http-tls" in coordinator_container(found)["args"]
    for version in ("1.27", k8s_validate.latest_version()):
        for obj in found:
            if obj["kind"] == "ServiceMonitor":
                validate_custom(obj)
                continue
            try:
                k8s_validate.validate(obj, version, strict=True)
            except k8s_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} against {version}: "
                            f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_notes_name_the_view_token(chart):
    notes = render(chart, scenario_values("view-token"), MONITOR_APIS)["rcswarm/templates/NOTES.txt"]
    assert "the read-only view token of Secret dashboard-view-token, key view-token, or the join token" in notes


def test_a_view_token_secret_that_is_the_join_token_fails_the_render(helm, chart):
    join_secret = {"coordinator": {"dashboard": {"viewTokenSecret": f"{RELEASE}-rcswarm-token",
                                                 "viewTokenSecretKey": "token"}}}
    with pytest.raises(helm.HelmRenderError) as refused:
        render(chart, join_secret)
    assert "name the join token itself" in str(refused.value)
    other_key = {"coordinator": {"dashboard": {"viewTokenSecret": f"{RELEASE}-rcswarm-token",
                                               "viewTokenSecretKey": "view"}}}
    assert flag(coordinator_container(objects(render(chart, other_key)))["args"], "--view-token-file") == VIEW_FILE


@pytest.mark.parametrize(("dashboard", "message"), [
    ({"viewTokenSecret": "Not_A_Name"},
     "at '/coordinator/dashboard/viewTokenSecret': 'Not_A_Name' does not match pattern"),
    ({"viewTokenSecretKey": ""}, "at '/coordinator/dashboard/viewTokenSecretKey': minLength: got 0, want 1"),
    ({"viewTokenSecretKey": "a/b"}, "at '/coordinator/dashboard/viewTokenSecretKey': 'a/b' does not match pattern"),
])
def test_bad_view_token_values_are_refused_by_the_schema(helm, chart, dashboard, message):
    with pytest.raises(helm.HelmValuesError) as refused:
        render(chart, {"coordinator": {"dashboard": dashboard}})
    assert message in str(refused.value)


def test_the_namespace_of_the_secret_is_the_releases(chart):
    """A ServiceMonitor reads its credentials Secret from its own namespace: the release's, where the operator
    creates the view token Secret."""
    monitor = one(render_view(chart), "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE


def test_ray_head_launches_the_workers(chart):
    cluster = one(render_scenario(chart, "ray"), "RayCluster")
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    (head,) = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    script = head["args"][0]
    launch = shlex.split(re.search(r"exec (rcswarm launch ray [^)]*)\)", script).group(1))
    assert launch[:5] == ["rcswarm", "launch", "ray", "--address", "auto"]
    assert flag(launch, "--coordinator") == f"{RELEASE}-rcswarm-coordinator.{NAMESPACE}.svc:50051"
    assert (flag(launch, "--workers"), flag(launch, "--gpus-per-worker")) == ("4", "1")
    assert script.rstrip().endswith("exec $KUBERAY_GEN_RAY_START_CMD")
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_runs_unprivileged_on_a_read_only_root(chart, scenario):
    """The Ray pods ran with the image's defaults (no pod or container security context) and Ray's object store
    in a 64 MiB /dev/shm; every pod now runs as the images' user without privileges, Ray's files in emptyDirs."""
    specs = pod_specs(render_scenario(chart, scenario))
    assert specs
    for owner, spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001, owner
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"], owner
            assert context["readOnlyRootFilesystem"] is True, owner
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, owner
        if owner.startswith("ray"):
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}, owner
            assert {"name": "shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"], owner


def test_the_ray_worker_pods_bring_a_git_dataset(chart, k8s_validate):
    """Ray's worker actors read a git dataset on the Ray worker pods: ray.workerGroup.extraVolumes and
    extraVolumeMounts reach those pods (not the head) after the chart's own, and ray.launch.dataRoot is the
    launch's --data-root; none of them by default."""
    from rcswarm.cli import launch as launch_cli

    def launch_args(cluster: dict[str, Any]) -> list[str]:
        (head,) = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
        return shlex.split(re.search(r"exec (rcswarm launch ray [^)]*)\)", head["args"][0]).group(1))

    default = one(render_scenario(chart, "ray"), "RayCluster")
    assert "--data-root" not in launch_args(default)
    volume = {"name": "frames", "persistentVolumeClaim": {"claimName": "git-frames", "readOnly": True}}
    mount = {"name": "frames", "mountPath": "/data/git-frames-5", "readOnly": True}
    values = {**scenario_values("ray")}
    values["ray"] = {**values["ray"], "workerGroup": {"extraVolumes": [volume], "extraVolumeMounts": [mount]},
                     "launch": {"dataRoot": "/data"}}
    found = objects(render(chart, values, SCENARIO_APIS["ray"]))
    cluster = one(found, "RayCluster")
    group = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert [v["name"] for v in group["volumes"]] == ["shm", "tmp", "frames"] and group["volumes"][-1] == volume
    assert group["containers"][0]["volumeMounts"][-1] == mount
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert "frames" not in [v["name"] for v in head["volumes"]]
    launch = launch_args(cluster)
    assert flag(launch, "--data-root") == "/data"
    assert launch_cli.parser().parse_args(launch[3:]).data_root == Path("/data")
    strictly_valid(k8s_validate, found)


def test_the_ray_pods_keep_the_tls_files_beside_their_own_volumes(chart):
    values = {**scenario_values("ray"), "tls": {"enabled": True, "secretName": "coordinator-tls",
                                                "mutual": {"enabled": True, "clientSecretName": "worker-client"}}}
    cluster = one(objects(render(chart, values, SCENARIO_APIS["ray"])), "RayCluster")
    for spec in (cluster["spec"]["headGroupSpec"]["template"]["spec"], cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]):
        assert [v["name"] for v in spec["volumes"]] == ["shm", "tmp", "tls-ca", "tls-client"]
        assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["shm", "tmp", "tls-ca", "tls-client"]


def test_notes_tell_how_to_reach_the_run(chart):
    notes = render(chart)["rcswarm/templates/NOTES.txt"]
    assert f"kubectl port-forward -n {NAMESPACE} svc/{RELEASE}-rcswarm-coordinator 50051" in notes
    assert "rcswarm status --coordinator localhost:50051" in notes
    assert "auth.existingSecret" in notes


def test_notes_status_command_presents_the_client_certificate_under_mutual_tls(chart):
    """A coordinator with tls.mutual.enabled refuses a client without a certificate, `rcswarm status` included."""
    notes = render(chart, scenario_values("external-tls"))["rcswarm/templates/NOTES.txt"]
    status = "rcswarm status --coordinator localhost:50051 --tls-ca ca.crt --tls-cert client.crt --tls-key client.key\n"
    assert status in notes
    assert "rcswarm worker --coordinator EXTERNAL_NAME:443 --tls-ca ca.crt --tls-cert client.crt --tls-key client.key\n" in notes
    plain_tls = render(chart, scenario_values("ingress-tls"))["rcswarm/templates/NOTES.txt"]
    assert "rcswarm status --coordinator localhost:50051 --tls-ca ca.crt\n" in plain_tls and "--tls-cert" not in plain_tls


@pytest.mark.parametrize(("key", "jsonpath"), [("token", "{.data.token}"), ("join-token", "{.data.join-token}"),
                                               ("join.token", r"{.data.join\.token}")])
def test_notes_token_jsonpath_escapes_dots_in_the_key(chart, key, jsonpath):
    """kubectl's JSONPath reads a dot as a field separator: {.data.join.token} finds nothing."""
    values = {"auth": {"existingSecret": "swarm-join-token", "existingSecretKey": key}}
    notes = render(chart, values)["rcswarm/templates/NOTES.txt"]
    assert f"kubectl get secret -n {NAMESPACE} swarm-join-token -o jsonpath='{jsonpath}' | base64 -d" in notes


def test_the_cli_accepts_the_chart_arguments(chart):
    """The arguments the chart passes are ones `rcswarm coordinator` and `rcswarm worker` parse."""
    from rcswarm.cli import coordinator as coordinator_cli
    from rcswarm.cli import worker

    for scenario in ("default", "external-tls"):
        found = render_scenario(chart, scenario)
        coordinator_args = coordinator_container(found)["args"]
        assert coordinator_args[0] == "coordinator"
        parsed = coordinator_cli.parse_args(coordinator_args[1:])  # a flag the parser lacks exits 2: the test fails
        assert parsed.host == "0.0.0.0" and parsed.port == 50051
        # --insecure without TLS, the plaintext --health-port for the probes with it (#14): parsed, not skipped.
        assert (parsed.insecure, parsed.health_port) == ((True, None) if scenario == "default" else (False, 50052))
        worker_args = [a.replace("$(CPU_LIMIT)", "2").replace("$(POD_NAME)", "w-0") for a in worker_container(found)["args"]]
        assert worker_args[0] == "worker"
        assert worker.parse_args(worker_args[1:]).threads == 2


INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "HEALTHCHECK", "EXPOSE", "LABEL"}
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|build-essential|make|cmake|nvcc)\b")


def stages(path: Path) -> list[dict[str, Any]]:
    """The Dockerfile's stages as BuildKit parses them: name, base, instructions; plus global ARGs."""
    dockerfile = need("dockerfile", "dockerfile")
    parsed = dockerfile.parse_file(str(path))
    unknown = {c.cmd for c in parsed} - INSTRUCTIONS
    assert not unknown, f"{path.name}: unexpected instructions {unknown}"
    found: list[dict[str, Any]] = [{"name": "(global)", "base": "", "commands": []}]
    for command in parsed:
        if command.cmd == "FROM":
            value = command.value
            found.append({"name": value[2] if len(value) == 3 else "", "base": value[0], "commands": []})
        else:
            found[-1]["commands"].append(command)
    return found


def arg_default(path: Path, name: str) -> str:
    for stage in stages(path):
        for command in stage["commands"]:
            if command.cmd == "ARG" and command.value[0].startswith(f"{name}="):
                return command.value[0].split("=", 1)[1]
    raise AssertionError(f"{path.name} has no ARG {name}")


def final_stages(path: Path) -> list[dict[str, Any]]:
    """Stages an image can be built from: every stage but the global one and `build`."""
    return [s for s in stages(path)[1:] if s["name"] != "build"]


def torch_pin() -> str:
    match = re.search(r"^TORCH_PIN \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile's TORCH_PIN"
    return match.group(1)


def package_folders() -> set[str]:
    """Top-level folders that install as rcswarm.<folder> (setup.py's rule)."""
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_copies_what_exists_and_what_the_wheel_needs(name):
    path = DOCKER / name
    ignore = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = []
    for stage in stages(path):
        for command in stage["commands"]:
            if command.cmd == "COPY" and not any(f.startswith("--from=") for f in command.flags):
                sources += [s.rstrip("/") for s in command.value[:-1]]
    for source in sources:
        assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist"
        assert source in kept, f"{name}: COPY {source} is excluded by {name}.dockerignore"
    assert package_folders() <= set(sources), f"{name} misses package folders {package_folders() - set(sources)}"
    assert {"pyproject.toml", "setup.py", tomllib.loads((ROOT / 'pyproject.toml').read_text())["project"]["readme"]} <= set(sources)


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_run_rcswarm_as_a_user_without_compilers(name):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["rcswarm"] == "rcswarm.cli.main:main"
    path = DOCKER / name
    for stage in final_stages(path):
        if stage["base"] != "runtime":
            assert stage["base"].startswith("${") and "-devel" not in arg_default(path, stage["base"][2:-1])
        commands = {c.cmd: c for c in stage["commands"]}
        for command in stage["commands"]:
            if command.cmd == "RUN":
                assert not COMPILERS.search(command.value[0]), f"{name}: {command.original}"
        if stage["name"] == "runtime":
            assert commands["ENTRYPOINT"].json and commands["ENTRYPOINT"].value == ("rcswarm",)
            assert commands["USER"].value[0].split(":")[0] == "10001"
            assert any(c.cmd == "COPY" and "--from=build" in c.flags for c in stage["commands"])


def test_pinned_versions_agree():
    """torch: the Makefile's pin is what both images install; Python: the CPU base satisfies requires-python."""
    pin = torch_pin()
    assert arg_default(DOCKER / "Dockerfile.cpu", "TORCH_VERSION") == pin
    assert arg_default(DOCKER / "Dockerfile.cuda", "TORCH_VERSION") == pin
    cuda_base = arg_default(DOCKER / "Dockerfile.cuda", "PYTORCH_IMAGE")
    assert re.fullmatch(rf"pytorch/pytorch:{re.escape(pin)}-cuda[0-9.]+-cudnn[0-9]+-runtime", cuda_base), cuda_base
    python = re.fullmatch(r"python:(\d+)\.(\d+)-slim-\w+", arg_default(DOCKER / "Dockerfile.cpu", "PYTHON_IMAGE"))
    floor = re.fullmatch(r">=(\d+)\.(\d+)", tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert python and floor and tuple(map(int, python.groups())) >= tuple(map(int, floor.groups()))


def test_the_chart_uses_the_images_the_dockerfiles_build(chart):
    """Tags: <appVersion>-coordinator is the CPU Dockerfile's `coordinator` stage, the one with the HEALTHCHECK."""
    coordinator = coordinator_container(render_scenario(chart, "default"))
    assert coordinator["image"] == f"rcswarm:{chart.metadata['appVersion']}-coordinator"
    (stage,) = [s for s in stages(DOCKER / "Dockerfile.cpu") if s["name"] == "coordinator"]
    (check,) = [c for c in stage["commands"] if c.cmd == "HEALTHCHECK"]
    assert check.value[0] == "CMD" and check.value[-1] == "/opt/rcswarm/healthcheck.py"
    port = int(re.search(r":(\d+)$", next(c for c in stage["commands"] if c.cmd == "ENV").value[1]).group(1))
    assert port == coordinator["ports"][0]["containerPort"]
    assert not [c for s in stages(DOCKER / "Dockerfile.cuda") for c in s["commands"] if c.cmd == "HEALTHCHECK"]


def test_healthcheck_script_fails_without_a_server(health_server):
    _, address = health_server
    host, port = address.rsplit(":", 1)
    healthy, seen = load_healthcheck().check(f"{host}:{int(port) + 1 if int(port) < 65535 else 1}", COORDINATOR_SERVICE, 1.0)
    assert not healthy and seen.split(":")[0] in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def test_readme_files_reference_the_vendored_sources():
    readme = (SCHEMAS / "README.md").read_text()
    for path in CUSTOM_SCHEMAS.values():
        assert path.relative_to(SCHEMAS).as_posix() in readme
        assert (path.parent / "LICENSE").is_file()
