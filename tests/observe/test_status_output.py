"""What `rcswarm status` and /api/status show (review of the observation layer, 2026-11-28).

/api/status and `rcswarm status --json` carry numbers as numbers:
protobuf's MessageToDict writes 64-bit integers as strings and NaN/infinity as "NaN"/"Infinity", so
`forecast.loss` was a string while a run had no forecast and a number once it had one, and `fp32_bytes`,
`val_version` and `curriculum.decided_version` were always strings. And a peer's strings are text: rich turned
":skull:" in a worker's name into an emoji."""

from __future__ import annotations

import json
import math

from rcswarm.cli import status as status_cli
from rcswarm.observe.dashboard.views import message_data
from rcswarm.protos.v1 import coordinator_pb2 as pb


def a_status() -> pb.GetStatusResponse:
    status = pb.GetStatusResponse(run_id="r", version=7, target_rounds=10, latest_loss=math.nan, fp32_bytes=100736,
                                  val_loss=math.nan, val_version=-1, run_state=pb.RUN_STATE_RUNNING)
    status.forecast.CopyFrom(pb.ForecastStatus(made_at_version=3, at_round=40, loss=math.nan, low=1.0, high=math.inf,
                                               target_seconds=math.inf, note="not enough rounds"))
    status.curriculum.decided_version = -1
    status.curriculum.seconds_per_step[32] = 0.5
    status.curriculum.seconds_per_step[64] = math.nan
    status.workers.add(worker_id="w1", base_version=6, trained_tokens=2**40, step_seconds=0.25)
    return status


def test_message_data_has_ints_floats_and_nulls_never_numbers_as_strings() -> None:
    data = message_data(a_status())
    assert (data["version"], data["fp32_bytes"], data["val_version"]) == (7, 100736, -1)
    assert data["latest_loss"] is None and data["val_loss"] is None and data["run_state"] == "RUN_STATE_RUNNING"
    forecast = data["forecast"]
    assert (forecast["made_at_version"], forecast["at_round"], forecast["low"]) == (3, 40, 1.0)
    assert forecast["loss"] is None and forecast["high"] is None and forecast["target_seconds"] is None
    assert data["curriculum"]["decided_version"] == -1
    assert data["curriculum"]["seconds_per_step"] == {"32": 0.5, "64": None}
    assert data["workers"][0]["trained_tokens"] == 2**40 and data["workers"][0]["base_version"] == 6

    def strings(value):
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert not [s for s in strings(data) if s in ("NaN", "Infinity", "-Infinity") or s.lstrip("-").isdigit()]


def test_rcswarm_status_json_is_strict_json_with_numbers(capsys) -> None:
    args = status_cli.parser().parse_args(["--coordinator", "127.0.0.1:1", "--json"])
    assert status_cli.show(args, a_status()) == 0

    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    shown = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert shown["fp32_bytes"] == 100736 and shown["forecast"]["loss"] is None and shown["version"] == 7


def test_emoji_codes_in_a_peers_strings_are_shown_as_written(capsys) -> None:
    status = a_status()
    status.workers[0].name, status.workers[0].device = ":skull: gpu-0", ":fire:"
    args = status_cli.parser().parse_args(["--coordinator", "127.0.0.1:1"])
    assert status_cli.show(args, status) == 0
    shown = capsys.readouterr().out
    assert ":skull: gpu-0" in shown and ":fire:" in shown and "\N{SKULL}" not in shown
