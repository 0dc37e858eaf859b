"""The control plane of a hivemind worker (worker/hivemind_control.py) at a real coordinator on loopback (review of
the hivemind path, 2026-11-29): the rows of a curriculum.schedule's longer windows are stored (the coordinator bounded
a row's tokens by the assignment at its own version, which stays 0 under hivemind, and refused every row once L
lengthened); a batch the coordinator refuses is dropped with one WARNING instead of blocking every later row; the Leave
is sent though the last report was refused (it was in the same try and never sent). And the coordinator backend's
flags are refused with `--backend hivemind` (accepted and dropped: no state-dir lock)."""

from __future__ import annotations

import logging
import math

import pytest

from rcswarm.cli import worker as worker_cli
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.worker.hivemind_control import ControlPlane
from tests.helpers.specs import TOKEN, tiny_spec, write_spec

# inner.steps 5: run step 10, where L lengthens, is version 2's start.
SCHEDULE = {"schedule": [[0, 32, 4], [10, 64, 4]]}


def hivemind_schedule_spec():
    return tiny_spec(run={"name": "hm", "rounds": 6}, sync={"backend": "hivemind", "codec": "int8"},
                     curriculum=SCHEDULE)


def rows(version: int, seq_len: int, loss: float = 3.0) -> list[pb.Metric]:
    """A round's rows as a hivemind peer reports them: its steps, then the row of the version it reached."""
    steps = [pb.Metric(version=version, step=version * 5 + k, seq_len=seq_len, batch=4, tokens=4 * seq_len, loss=loss,
                       compute_seconds=0.01 * k) for k in range(1, 6)]
    return [*steps, pb.Metric(version=version + 1, step=version * 5 + 5, seq_len=seq_len, batch=4, loss=math.nan)]


def test_the_rows_of_a_lengthened_schedule_are_stored_and_a_refused_batch_does_not_block_the_queue(
        start_coordinator, caplog: pytest.LogCaptureFixture) -> None:
    local = start_coordinator(hivemind_schedule_spec())
    control = ControlPlane(local.target, TOKEN, "a", "cpu", patience_s=5.0)
    try:
        member = control.join()
        for version in range(4):
            control.report(rows(version, 32 if version < 2 else 64))
            control._beat()
        assert not control._pending and local.service.status().version == 4
        with caplog.at_level(logging.WARNING, logger="rcswarm.worker"):
            control.report(rows(4, 64, loss=-1.0))  # refused: no cross-entropy is negative
            control._beat()
            control.report(rows(5, 64))
            control._beat()
        assert not control._pending and local.service.status().version == 6
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "ReportMetrics refused: INVALID_ARGUMENT" in warnings[0], warnings
        assert "6 metric rows dropped" in warnings[0]
        stored = {(row.version, row.seq_len) for row in local.service.store.metric_rows()
                  if row.tokens > 0}
        assert {(2, 64), (3, 64), (5, 64)} <= stored and (4, 64) not in stored
    finally:
        control.report(rows(6, 64, loss=-1.0))  # refused at the Leave's flush: the Leave is sent all the same
        control.close("finished")
    states = {w.worker_id: w.state for w in local.service.status().workers}
    assert states[member.worker_id] == pb.WORKER_STATE_LEFT, states


@pytest.mark.parametrize("flag", [["--state-dir", "state"], ["--membership-file", "m.json"],
                                  ["--transfer-timeout-s", "9"]])
def test_the_coordinator_backends_flags_are_refused_with_hivemind(flag: list[str], tmp_path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    config = write_spec(hivemind_schedule_spec(), tmp_path / "run.toml")
    status = worker_cli.main(["--backend", "hivemind", "--config", str(config), *flag])
    assert status == 2
    assert f"{flag[0]}: only with the coordinator backend, not with --backend hivemind" in capsys.readouterr().err
