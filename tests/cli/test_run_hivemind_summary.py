"""The hivemind `rcswarm run`'s summary (review of the hivemind backend, 2026-11-29): a launch in a run directory an
earlier one used reported the earlier launch's peers and final parameters as its own, and a worker that the budget
or a signal ended before its first round (an empty history) crashed the summary before summary.json was written."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import torch
from rich.console import Console
from safetensors.torch import save_file

from rcswarm.cli.signals import StopSignal
from tests.helpers.specs import tiny_spec


def write_peer(run_dir: Path, name: str, losses: list[float]) -> Path:
    """RUN_DIR/peers/`name`/ as a hivemind worker's --out leaves it: summary.json with a history of `losses`, and
    final.safetensors."""
    peer = run_dir / "peers" / name
    peer.mkdir(parents=True)
    history = [{"loss": loss, "skipped": False, "drift": 0.0} for loss in losses]
    (peer / "summary.json").write_text(json.dumps({"name": name, "version": len(losses), "history": history}))
    save_file({"w": torch.full((3,), float(len(losses)))}, str(peer / "final.safetensors"))
    return peer


def test_an_earlier_launchs_results_are_moved_aside_whole_and_the_summary_is_this_launchs(tmp_path: Path) -> None:
    from rcswarm.cli import run_hivemind

    run_dir = tmp_path / "run"
    write_peer(run_dir, "worker-0", [5.0, 4.0])
    (run_dir / "summary.json").write_text('{"outcome": "completed"}')
    save_file({"w": torch.ones(3)}, str(run_dir / "final.safetensors"))
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "worker-0.log").write_text("the earlier launch\n")
    before = {path.relative_to(run_dir): path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    written = time.mktime((2026, 11, 28, 10, 0, 0, 0, 0, -1))
    for path in run_dir.rglob("*"):
        os.utime(path, (written, written))
    console = Console(file=io.StringIO(), width=300)

    assert run_hivemind.announce_earlier_results(run_dir, console)

    earlier = run_dir / "earlier" / "20261128-100000"
    said = console.file.getvalue()
    assert "summary.json, final.safetensors, peers: moved to" in said and str(earlier) in said, said
    for relative, content in before.items():
        kept = run_dir / relative if relative.parts[0] == "logs" else earlier / relative
        assert kept.read_bytes() == content, relative
    assert sorted(path.name for path in run_dir.iterdir()) == ["earlier", "logs"]
    result = run_hivemind.summarize(tiny_spec(run={"workers": 1}), run_dir, 1, evaluated=False)
    assert result == {"peers": {}, "rounds": 0}

    write_peer(run_dir, "worker-0", [3.0])  # a second reuse whose results carry the same time: a folder of its own
    for path in [run_dir / "peers", *(run_dir / "peers").rglob("*")]:
        os.utime(path, (written, written))
    assert run_hivemind.set_aside_earlier_results(run_dir) == run_dir / "earlier" / "20261128-100000-2"
    assert run_hivemind.set_aside_earlier_results(run_dir) is None  # nothing left to move


def test_workers_the_budget_ended_before_their_first_round_get_a_summary_and_summary_json(tmp_path: Path) -> None:
    from rcswarm.cli import run_hivemind

    spec = tiny_spec(run={"workers": 2, "rounds": 2})
    write_peer(tmp_path, "worker-0", [])
    write_peer(tmp_path, "worker-1", [])
    swarm = run_hivemind.HivemindSwarm(spec, tmp_path, 2)
    console = Console(file=io.StringIO(), width=300)

    ended = run_hivemind.summarize_and_write(spec, tmp_path, swarm, console, StopSignal(), True, 0.5)

    assert (ended.kind, ended.status) == ("budget", 0)
    assert ended.message == "stopped at the 0.5-minute budget after 0 rounds"
    printed = console.file.getvalue()
    assert "worker-0: version 0, no round trained, 0 skipped, max drift 0" in printed, printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["outcome"] == "budget" and summary["rounds"] == 0
    assert summary["peers"]["worker-1"]["first_round_loss"] is None
    assert summary["peers"]["worker-1"]["last_round_loss"] is None


def test_a_peer_line_shows_a_missing_loss_as_a_dash() -> None:
    from rcswarm.cli.run_hivemind import peer_line

    peer = {"version": 3, "first_round_loss": 5.0, "last_round_loss": float("nan"), "skipped_rounds": 1, "max_drift": 0.25}
    assert peer_line("worker-2", peer) == "worker-2: version 3, round loss 5.000 → —, 1 skipped, max drift 0.25"


def test_a_torn_peer_summary_is_named_in_the_summary_and_summary_json_is_written(tmp_path: Path) -> None:
    """A worker SIGKILLed while it wrote its summary.json (after its final.safetensors) left it torn, and
    `summarize`'s json.loads ended the launcher with a traceback before the launch's summary.json was written. Now
    the peer is left out with one line naming the file and the error, in the output and in summary.json."""
    from rcswarm.cli import run_hivemind

    spec = tiny_spec(run={"workers": 2, "rounds": 1})
    write_peer(tmp_path, "worker-0", [5.0])
    torn = write_peer(tmp_path, "worker-1", [5.0]) / "summary.json"
    torn.write_text('{"name": "worker-1", "version": 1, "hist')
    swarm = run_hivemind.HivemindSwarm(spec, tmp_path, 2)
    console = Console(file=io.StringIO(), width=300)

    run_hivemind.summarize_and_write(spec, tmp_path, swarm, console, StopSignal(), True, 0.5)

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["peers"]) == ["worker-0"]
    [problem] = summary["peer_problems"]
    assert problem.startswith(f"{torn}: cannot be read (JSONDecodeError: Unterminated string"), problem
    printed = console.file.getvalue()
    assert f"{problem}: its peer is left out of this summary" in printed, printed
