"""The hivemind `rcswarm run` in a run directory an earlier launch used (review of the hivemind backend, 2026-11-29):
`start_bootstrap` took the earlier launch's maddrs.txt, naming a bootstrap peer that no longer exists, before its own
peer wrote its own, and the workers dialed the dead one until they gave up. The review of those fixes: the launch
kept the earlier launch's state/ (its run, rows and curriculum mixed with the new launch's), wrote run.toml before its
bootstrap peer took it, and a bootstrap peer that exited at once was reported as one that "did not start within 60s"
with the log of every launch. A real `rcswarm dht` (and, in the launch, a worker the launch stops at once) here."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path

import pytest
from rich.console import Console

from rcswarm.cli import run_hivemind
from rcswarm.cli.dht import Mirror
from rcswarm.cli.run import LAUNCH_MARK
from rcswarm.cli.run_hivemind import HivemindSwarm
from rcswarm.cli.signals import StopSignal
from rcswarm.state.store import StateStore
from tests.helpers.specs import hivemind_spec
from tests.helpers.verified_state import committed_run

STALE = "/ip4/127.0.0.1/tcp/9/p2p/QmZbu4JNiutb7YtWzhPGyQAdWC2Hxv7utPbGJRPe3ovPUT"


def test_the_bootstrap_peer_of_a_launch_is_its_own_not_the_earlier_launchs(tmp_path: Path, no_new_p2pd: None) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "maddrs.txt").write_text(f"{STALE}\n")
    swarm = HivemindSwarm(hivemind_spec(), run_dir, 1)
    try:
        maddrs = swarm.start_bootstrap(mirror=False)
        assert STALE not in maddrs, maddrs
        assert maddrs and all(m.startswith("/ip4/127.0.0.1/tcp/") for m in maddrs), maddrs
        peer_id = maddrs[0].rsplit("/p2p/", 1)[1]
        log = (run_dir / "logs" / "dht.log").read_text(errors="replace")
        assert f"bootstrap peer {peer_id} up" in log, log[-3000:]
    finally:
        swarm.stop()
    assert swarm.bootstrap is not None and swarm.bootstrap.returncode == 0


def test_a_bootstrap_peer_that_exits_at_once_is_reported_with_its_code_and_this_launchs_log(
        tmp_path: Path, no_new_p2pd: None) -> None:
    """Its mirror refuses the state dir (a coordinator's run): the error said it "did not start within 60s" and
    quoted the end of dht.log, every launch's. Now it says the exit code and this launch's part of the log, and the
    run directory's run.toml is left as it was (the config is staged as run.toml.launching until the peer serves)."""
    run_dir = tmp_path / "run"
    committed_run(run_dir / "state")
    (run_dir / "run.toml").write_text("the earlier launch's config\n")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "dht.log").write_text(f"{LAUNCH_MARK} 2026-11-28 10:00:00 ---\nan earlier launch's line\n")
    swarm = HivemindSwarm(hivemind_spec(), run_dir, 1)
    try:
        with pytest.raises(RuntimeError) as raised:
            swarm.start_bootstrap(mirror=True)
    finally:
        swarm.stop()
    message = str(raised.value)
    assert message.startswith(f"the bootstrap peer exited with code 2 at start; {run_dir / 'logs' / 'dht.log'} ends:\n"
                              f"{LAUNCH_MARK} "), message
    assert "holds a coordinator's run (its checkpoints); give the mirror a state dir of its own" in message, message
    assert "an earlier launch's line" not in message, message
    assert (run_dir / "run.toml").read_text() == "the earlier launch's config\n"
    assert not (run_dir / "run.toml.launching").exists()


def test_a_launch_sets_the_earlier_launchs_results_and_state_aside_before_it_starts(
        tmp_path: Path, no_new_p2pd: None) -> None:
    """`launch` itself moves the earlier launch's results, its state/ among them, to earlier/<time>/ before its
    bootstrap peer starts: the new mirror's state/ holds this launch's run alone. A signal before the launch (its
    stop already set) ends it as soon as its processes started."""
    run_dir = tmp_path / "run"
    Mirror(hivemind_spec(run={"name": "first", "workers": 1}), run_dir / "state").close()
    (run_dir / "summary.json").write_text('{"outcome": "completed"}')
    (run_dir / "peers" / "worker-0").mkdir(parents=True)
    (run_dir / "maddrs.txt").write_text(f"{STALE}\n")
    spec = hivemind_spec(run={"name": "second", "workers": 1, "rounds": 1})
    stop = StopSignal()
    stop.handle(signal.SIGINT, None)
    console = Console(file=io.StringIO(), width=400)

    assert run_hivemind.launch(spec, run_dir, None, console, stop) == 128 + signal.SIGINT

    said = console.file.getvalue()
    [earlier] = (run_dir / "earlier").iterdir()
    assert f"holds an earlier launch's summary.json, peers, state: moved to {earlier}" in said, said
    assert said.index("moved to") < said.index("bootstrap peer (in"), said
    assert json.loads((earlier / "summary.json").read_text()) == {"outcome": "completed"}
    moved = StateStore.open_read_only(earlier / "state")
    try:
        assert moved.get("run_id") == "first"
    finally:
        moved.close()
    state = StateStore.open_read_only(run_dir / "state")
    try:
        assert state.get("run_id") == "second"
    finally:
        state.close()
    assert (run_dir / "run.toml").read_text() == spec.to_toml()
    assert STALE not in (run_dir / "maddrs.txt").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["outcome"] == "interrupted"


def test_a_coordinator_that_does_not_start_ends_the_launch_with_one_message_and_status_1(
        tmp_path: Path, no_new_p2pd: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The RuntimeError of a service that did not start (here the coordinator of an adaptive curriculum refuses
    the model, above its --max-params) went up through `launch` as a traceback. Now it is one `rcswarm run:` message,
    exit status 1, the bootstrap peer is stopped, and run.toml is not written (the coordinator never served)."""
    run_dir = tmp_path / "run"
    spec = hivemind_spec(run={"name": "hm", "rounds": 1, "workers": 1}, inner={"steps": 5}, data={"batch_size": 4},
                         curriculum={"policy": "adaptive", "seq_lens": [4, 8, 16], "alpha_inf": 2.0, "tau": 1.0,
                                     "budget_seconds": 600.0})
    console = Console(file=io.StringIO(), width=400)

    assert run_hivemind.launch(spec, run_dir, None, console, StopSignal(), max_params=1) == 1

    err = capsys.readouterr().err
    assert err.startswith(f"rcswarm run: the coordinator exited with code 2 at start; "
                          f"{run_dir / 'logs' / 'coordinator.log'} ends:\n{LAUNCH_MARK} "), err
    assert "Traceback" not in err, err
    assert not (run_dir / "run.toml").exists() and not (run_dir / "run.toml.launching").exists()
    assert not (run_dir / "summary.json").exists()
