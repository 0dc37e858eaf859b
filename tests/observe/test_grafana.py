"""The Grafana board shipped in the chart (helm/rcswarm/dashboards/rcswarm.json, issue #30): every query names a
metric the dashboard's /metrics exports, read from a live in-process sweep with forecasts and a pruned run.
The chart's ConfigMap of it is tests/deploy/test_helm.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.helpers.dashboard import get

BOARD = Path(__file__).resolve().parents[2] / "helm" / "rcswarm" / "dashboards" / "rcswarm.json"
# What a query may add to a family's name: a counter's sample suffix, a histogram's.
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def queries(board: dict) -> list[str]:
    """Every PromQL expression of the board: its panels' targets and its query variables."""
    found = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"])
    return found


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_every_query_names_a_metric_that_metrics_exports(served):
    from prometheus_client.parser import text_string_to_metric_families

    _, base = served
    exported = {f.name for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
    board = json.loads(BOARD.read_text())
    named = {name for expr in queries(board) for name in re.findall(r"\brcswarm_[a-z0-9_]+", expr)}
    assert named, "the board has no rcswarm query"
    assert {family(name) for name in named} <= exported, sorted({family(n) for n in named} - exported)
    # The panels: loss per length with the forecasts, the law, utilization, bytes per round, workers.
    for wanted in ("rcswarm_loss", "rcswarm_forecast_loss_low", "rcswarm_fit_alpha_inf", "rcswarm_tokens_per_second",
                   "rcswarm_bytes_up_per_worker_round", "rcswarm_workers_active"):
        assert wanted in named
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in board["panels"])
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])


def test_a_query_naming_a_metric_not_exported_is_caught(served):
    """The check above can fail: a misspelt metric is not in the exported set."""
    from prometheus_client.parser import text_string_to_metric_families

    _, base = served
    exported = {f.name for f in text_string_to_metric_families(get(base + "metrics")[2].decode())}
    assert family("rcswarm_forecast_los") not in exported and family("rcswarm_rounds_closed_total") in exported
