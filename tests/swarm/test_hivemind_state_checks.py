"""What a hivemind peer takes from another (review of the hivemind backend, 2026-11-28): a donor's served version at
most what it declares (one declaring 6 served 2**61, which ended a newcomer's run at once); only a state of the same
run spec (a newcomer with another dropout and learning rates loaded it, exit 0, no warning), and the averagers of
another spec are another swarm; a re-sync for being behind takes only a state past this peer's version; a worker
stopped during its averaging step takes no outer step and publishes nothing. Real averagers on 127.0.0.1 where the
download is the point, stand-ins for the peer where the worker's decision is."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from tests.helpers.hivemind import ResyncDonors
from tests.helpers.specs import hivemind_spec
from tests.helpers.waiting import wait_for

hs = pytest.importorskip("rcswarm.worker.hivemind_sync")
from rcswarm.worker import hivemind_worker  # noqa: E402

RUN = "sc"
SHAPES = [(40,), (4, 5)]
NAMES = ["a", "b"]
LOAD_S = 8.0


def _state(version: int, seed: int, spec: str = "") -> tuple[dict[str, Any], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    metadata = {"run": RUN, "version": version, **({"spec": spec} if spec else {})}
    return metadata, [torch.randn(shape, generator=generator) for shape in SHAPES * 2]


def _peer(initial: Any, state: Any, version: int | None, spec_digest: str = "") -> Any:
    """A peer of RUN dialing `initial` (a peer, or None), serving `state` at `version` (None: serving nothing)."""
    options = hs.HivemindOptions.loopback(hs.visible_maddrs(initial.dht) if initial is not None else ())
    extra = {"spec_digest": spec_digest} if spec_digest else {}
    peer = hs.HivemindPeer(RUN, SHAPES, "fp32", 256, options, lambda: state, **extra)
    peer.set_state_version(version or 0, shareable=version is not None)
    return peer


def test_a_served_version_above_the_declared_one_is_refused() -> None:
    assert hs.served_version_problem(5, 5.0) == "" and hs.served_version_problem(6, 5.0) == ""  # one round on
    assert hs.served_version_problem(3, 3.5) == "" and hs.served_version_problem(2**61, None) == ""
    assert "it served version 7, above the version it declares (5; at most 6" in hs.served_version_problem(7, 5.0)


@pytest.mark.slow
def test_a_donor_serving_far_above_its_declared_version_is_refused(no_new_p2pd: None) -> None:
    """The hostile donor declares 6 (above the honest donor's 5, so it is asked first) and serves version 2**61, in
    range: taken, it made the newcomer's run end at once. The newcomer asks the honest donor next."""
    honest = _state(5, 1)
    started: list[Any] = []
    try:
        started.append(_peer(None, honest, 5))
        started.append(_peer(started[0], _state(2**61, 2), 6))
        joiner = _peer(started[0], _state(0, 0), None)
        started.append(joiner)
        wait_for(lambda: sorted(v for v in joiner.declared_versions() if v is not None) == [5.0, 6.0], 20.0,
                 "the joiner to see both donors' declarations")
        loaded = joiner.load_state(NAMES, SHAPES, LOAD_S)
        assert loaded is not None and loaded[0] == 5, f"loaded version {loaded and loaded[0]}"
        assert all(torch.equal(a, b) for a, b in zip(loaded[1], honest[1]))
    finally:
        for peer in reversed(started):
            peer.shutdown()


def test_the_spec_digest_tells_run_configs_apart() -> None:
    base = hivemind_spec()
    other = hivemind_spec(model={"overrides": {"dropout": 0.5}}, inner={"lr": 0.5}, outer={"lr": 0.1})
    assert hivemind_worker.spec_digest(base) == hivemind_worker.spec_digest(hivemind_spec())
    assert hivemind_worker.spec_digest(base) != hivemind_worker.spec_digest(other)
    # What a launch rewrites (`rcswarm run --workers 3 --minutes 5`) is not the training: the same swarm.
    launched = hivemind_spec(run={"name": "hm", "rounds": 3, "workers": 3, "minutes": 5.0},
                             sync={"backend": "hivemind", "codec": "int8", "min_reports": 3},
                             coordinator={"lease_s": 99.0})
    assert hivemind_worker.spec_digest(launched) == hivemind_worker.spec_digest(base)
    mine, theirs = hivemind_worker.spec_digest(base), hivemind_worker.spec_digest(other)
    metadata, tensors = _state(3, 0, theirs)
    problem, state = hs._check_state((metadata, tensors), RUN, NAMES, SHAPES, mine)
    assert state is None and f"the donor's run spec differs from this peer's (digest '{theirs}'" in problem
    assert hs._check_state((metadata, tensors), RUN, NAMES, SHAPES, theirs)[1][0] == 3
    assert hs.averager_prefix(RUN, mine) != hs.averager_prefix(RUN, theirs)
    worker = hivemind_worker.HivemindWorker(base, hs.HivemindOptions.loopback())
    assert worker.state()[0]["spec"] == mine


@pytest.mark.slow
def test_peers_of_another_run_spec_never_see_each_others_state(no_new_p2pd: None) -> None:
    """A newcomer of another spec neither sees the donor's declaration nor loads its state (its averagers are under
    another prefix, so the two never average either); one of the donor's spec loads it."""
    ours, theirs = "a" * 64, "b" * 64
    started: list[Any] = []
    try:
        started.append(_peer(None, _state(3, 1, ours), 3, ours))
        same = _peer(started[0], _state(0, 0, ours), None, ours)
        started.append(same)
        other = _peer(started[0], _state(0, 0, theirs), None, theirs)
        started.append(other)
        wait_for(lambda: same.declared_versions() == [3.0], 20.0, "the same-spec newcomer to see the declaration")
        assert other.declared_versions() == [] and other.load_state(NAMES, SHAPES, 3.0) is None
        loaded = same.load_state(NAMES, SHAPES, LOAD_S)
        assert loaded is not None and loaded[0] == 3
        # Digest records share the run's key: each peer counts only its own spec's in its decisions.
        for peer, version in ((started[0], 3), (other, 9)):
            record = hs.digest_record(RUN, version, {"w": torch.ones(4)}, spec=peer.spec_digest)
            assert peer.publish(hs.DIGEST_KEY, record)
        wait_for(lambda: len(same.records(hs.DIGEST_KEY, RUN, other_specs=True)) == 1, 20.0, "the other's record")
        assert [r["version"] for r in same.records(hs.DIGEST_KEY, RUN).values()] == [3]
        assert [r["version"] for r in same.records(hs.DIGEST_KEY, RUN, other_specs=True).values()] == [9]
        assert [r["version"] for r in other.records(hs.DIGEST_KEY, RUN).values()] == [9]
    finally:
        for peer in reversed(started):
            peer.shutdown()


def test_a_resync_for_being_behind_takes_only_a_later_version() -> None:
    """Behind a peer or a group, a state at this peer's own version is no progress (the peer ahead may have left);
    a drift re-sync takes one at its version; none takes a version past the run's last (run.rounds = 6: a donor that
    declared and served 2**62 − 1 ended a joiner's run at once)."""
    for ahead, donors, expected, taken in ((True, (3,), 3, []), (True, (3, 4), 4, [4]), (False, (3,), 3, [3]),
                                           (False, (2,), 3, []), (True, (2**62 - 1, 5), 5, [5]),
                                           (False, (7, 6), 6, [6])):
        worker = object.__new__(hivemind_worker.HivemindWorker)  # only what `_resync` reads and writes
        worker.spec = hivemind_spec(run={"rounds": 6})
        worker.name, worker.names, worker.shapes, worker.version = "w", ["w"], [(2,)], 3
        worker.options, worker.stop = hs.HivemindOptions.loopback(), threading.Event()
        worker.peer = ResyncDonors(*donors)
        adopted: list[int] = []
        worker._adopt = lambda tensors, adopted=adopted: adopted.append(int(tensors[0][0]))
        worker._resync("behind: version 3 < 4", ahead=ahead)
        assert worker.version == expected and adopted == taken, (ahead, donors)


class _StoppedPeer:
    """A HivemindPeer stand-in whose averaging step is cut by the worker's stop (a SIGTERM), as `average` ends then."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self.timer, self.published, self.declared = stop, hs.RoundTimer(2.0), [], []
        self.peer_id = "me"

    def failure(self) -> str:
        return ""

    def average(self, *args: Any, **kwargs: Any) -> None:
        self.stop.set()

    def set_state_version(self, version: float, shareable: bool = True) -> None:
        self.declared.append(version)

    def records(self, key: str, run: str) -> dict[str, dict[str, Any]]:
        return {}

    def publish(self, key: str, value: dict[str, Any]) -> bool:
        self.published.append(key)
        return True


def test_a_worker_stopped_during_its_averaging_step_takes_no_outer_step() -> None:
    """Stopped 8 s into a step, the worker stepped with its own Δ and published version 1 on its way out."""
    worker = hivemind_worker.HivemindWorker(hivemind_spec(), hs.HivemindOptions.loopback(), data_seed=1)
    worker.peer = _StoppedPeer(worker.stop)
    base = worker._params()
    worker._round()
    assert worker.version == 0 and worker.peer.published == [] and worker.peer.declared == []
    assert all(torch.equal(a, b) for a, b in zip(worker._params(), base))
