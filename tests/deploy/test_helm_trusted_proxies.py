"""The chart's `coordinator.dashboard.trustedProxies`: a list of CIDRs, checked by values.schema.json, rendered as the
coordinator's repeated `--http-trusted-proxy` (which its CLI parses as given), strictly valid; as tests/deploy/
test_helm.py renders the chart (Helm's Go SDK, `kubernetes-validate`), whose scenarios include
helm/rcswarm/ci/ingress-tls-values.yaml with the value set."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.deploy import objects, render, scenario_values

FLAG = "--http-trusted-proxy"


def coordinator_args(found: list[dict[str, Any]]) -> list[str]:
    (statefulset,) = [o for o in found if o["kind"] == "StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return container["args"]


def trusted(args: list[str]) -> list[str]:
    """The values of every --http-trusted-proxy, in order."""
    return [args[index + 1] for index, arg in enumerate(args) if arg == FLAG]


def dashboard_values(**dashboard: Any) -> dict[str, Any]:
    return {"coordinator": {"dashboard": dashboard}}


def test_trusted_proxies_render_as_repeated_flags_the_cli_takes(chart, k8s_validate):
    networks = ["10.244.0.0/16", "fd00:10:244::/56", "192.168.7.3"]
    found = objects(render(chart, dashboard_values(trustedProxies=networks)))
    args = coordinator_args(found)
    assert trusted(args) == networks
    for obj in found:
        for version in ("1.27", k8s_validate.latest_version()):
            k8s_validate.validate(obj, version, strict=True)
    from rcswarm.cli import coordinator as coordinator_cli

    parsed = coordinator_cli.parse_args(args[1:])
    assert parsed.http_trusted_proxy == networks and coordinator_cli._argument_problem(parsed) is None


def test_by_default_and_without_the_dashboard_no_proxy_is_trusted(chart):
    assert trusted(coordinator_args(objects(render(chart)))) == []
    off = objects(render(chart, dashboard_values(enabled=False, trustedProxies=["10.244.0.0/16"])))
    assert FLAG not in coordinator_args(off) and "--http-port" not in coordinator_args(off)


def test_the_ingress_scenario_trusts_the_controllers_pod_network(chart):
    found = objects(render(chart, scenario_values("ingress-tls")))
    assert trusted(coordinator_args(found)) == ["10.244.0.0/16", "fd00:10:244::/56"]
    assert "--http-tls" in coordinator_args(found)


@pytest.mark.parametrize("value", [
    ["ingress-nginx"],
    ["0.0.0.0/0"],            # every address: any client could choose the address it is throttled as
    ["::/0"],
    ["10.0.0.0/33"],
    ["256.0.0.0/8"],
    ["10.0.0.0/8 --http-insecure"],
    [""],
    ["10.0.0.0/8", "10.0.0.0/8"],
    "10.0.0.0/8",
], ids=json.dumps)
def test_bad_trusted_proxies_are_refused_by_the_schema(helm, chart, value):
    with pytest.raises(helm.HelmValuesError) as refused:
        render(chart, dashboard_values(trustedProxies=value))
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert "at '/coordinator/dashboard/trustedProxies" in str(refused.value)
