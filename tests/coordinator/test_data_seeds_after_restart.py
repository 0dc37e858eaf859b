"""A join's data seed and worker id number after a coordinator restart (a review's finding), on coordinators opened as
a restart opens them (`open_group` over a real SQLite state dir, served over real gRPC on 127.0.0.1).

Before, the count of joins both came from started at 0 in every process: after a restart (a Helm rollout, a crash)
the first new worker got data seed 1 and id w1-…, the sampler stream of the run's first worker, and retrained its
windows in the same order. The count is now stored in each join's transaction (state/store.py `JOINS_KEY`) and resumed from
it; a state dir of an older rcswarm, which has no stored count, resumes from the joins it recorded."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from rcswarm.coordinator.guards import serving_until
from rcswarm.coordinator.records import Refusal
from rcswarm.coordinator.service import SwarmCoordinator
from rcswarm.coordinator.sweep import open_group
from rcswarm.protos.v1 import coordinator_pb2 as pb
from rcswarm.state.store import JOINS_KEY, StateStore
from rcswarm.worker.client import CoordinatorClient, Identity
from tests.helpers.coordinator import serving
from tests.helpers.specs import TOKEN, tiny_spec

SPEC = tiny_spec(coordinator={"durable": False})


def number_of(worker_id: str) -> int:
    """The join number in a worker id `<prefix>w<N>-<hex>` (a sweep's prefix is r<index>)."""
    head = worker_id.split("-", 1)[0]
    return int(head[head.index("w") + 1:])


def join_and_leave(target: str, names: list[str]) -> list[tuple[str, int]]:
    """Join the served run once per name over gRPC, each leaving at once: (worker id, data seed) of each join."""
    client = CoordinatorClient(target, TOKEN)
    try:
        joined = []
        for name in names:
            response = client.join(name, "cpu", 1)
            joined.append((response.worker_id, response.data_seed))
            client.leave(Identity.of(response), "done")
        return joined
    finally:
        client.close()


def test_a_join_after_a_restart_takes_a_data_seed_and_number_no_earlier_join_had(tmp_path: Path) -> None:
    with serving(SPEC, tmp_path) as (_, target):
        before = join_and_leave(target, ["a", "b", "c"])
    assert [seed for _, seed in before] == [1, 2, 3]
    assert [number_of(worker_id) for worker_id, _ in before] == [1, 2, 3]
    with serving(SPEC, tmp_path) as (_, target):
        (worker_id, seed), = join_and_leave(target, ["d"])
    assert seed not in {s for _, s in before}, (seed, before)
    assert number_of(worker_id) not in {number_of(w) for w, _ in before}, (worker_id, before)
    assert (seed, number_of(worker_id)) == (4, 4)
    # A second restart goes on from there too.
    with serving(SPEC, tmp_path) as (_, target):
        (worker_id, seed), = join_and_leave(target, ["e"])
    assert (seed, number_of(worker_id)) == (5, 5)


def test_each_run_of_a_sweep_resumes_its_own_count(tmp_path: Path) -> None:
    spec = tiny_spec(sweep={"seq_lens": [4, 8]}, run={"workers": 1}, coordinator={"durable": False})
    seen: dict[str, set[int]] = {}
    for life in range(2):
        group = open_group(spec, tmp_path)
        try:
            for index, run in enumerate(group.runs):
                for name in ("a", "b"):
                    joined = run.join(pb.JoinRequest(worker_name=f"{name}{life}"))
                    assert joined.worker_id.startswith(f"r{index}w"), joined.worker_id
                    assert number_of(joined.worker_id) == joined.data_seed
                    assert joined.data_seed not in seen.setdefault(run.run_id, set()), (life, run.run_id, seen)
                    seen[run.run_id].add(joined.data_seed)
                    run.leave(pb.LeaveRequest(worker_id=joined.worker_id, worker_secret=joined.worker_secret))
        finally:
            group.close()
    assert sorted(map(sorted, seen.values())) == [[1, 2, 3, 4], [1, 2, 3, 4]], seen


def forget_the_count(state_dir: Path, statements: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> None:
    """Make `state_dir` what an older rcswarm left: no stored count (then `statements` run on it too)."""
    with contextlib.closing(sqlite3.connect(state_dir / "state.sqlite")) as db, db:
        db.execute("DELETE FROM run_state WHERE key = ?", (JOINS_KEY,))
        for statement, values in statements:
            db.execute(statement, values)


def test_a_state_dir_without_a_stored_count_resumes_from_the_joins_it_recorded(tmp_path: Path) -> None:
    with serving(SPEC, tmp_path) as (_, target):
        before = join_and_leave(target, ["a", "b", "c"])
    forget_the_count(tmp_path)
    with serving(SPEC, tmp_path) as (_, target):
        (worker_id, seed), = join_and_leave(target, ["d"])
    assert (seed, number_of(worker_id)) == (4, 4), (worker_id, before)


def test_an_older_rcswarms_restarts_numbered_again_from_one(tmp_path: Path) -> None:
    """An older rcswarm numbered each life from 1: the join rows of its second life (w1, w2) follow the first's (w1 to
    w3). The largest number recorded is 3, but 5 joins were: 6 is above both."""
    with serving(SPEC, tmp_path) as (_, target):
        before = join_and_leave(target, ["a", "b", "c"])
    second_life = "INSERT INTO events VALUES (0, ?, 'join', 'an older rcswarm after its restart')"
    forget_the_count(tmp_path, ((second_life, ("w1-00000000",)), (second_life, ("w2-00000000",))))
    with serving(SPEC, tmp_path) as (_, target):
        (worker_id, seed), = join_and_leave(target, ["f"])
    assert (seed, number_of(worker_id)) == (6, 6), (worker_id, before)


def test_pruned_join_rows_still_leave_the_largest_number(tmp_path: Path) -> None:
    """The oldest event and member_secrets rows are pruned in a long run: what is left of an older rcswarm's joins
    (w3 alone, one row) still names number 3, so the next join is 4, not 2."""
    with serving(SPEC, tmp_path) as (_, target):
        before = join_and_leave(target, ["a", "b", "c"])
    pruned = tuple(worker_id for worker_id, _ in before[:2])
    forget_the_count(tmp_path, (("DELETE FROM events WHERE worker_id IN (?, ?)", pruned),
                                ("DELETE FROM member_secrets WHERE worker_id IN (?, ?)", pruned)))
    with serving(SPEC, tmp_path) as (_, target):
        (worker_id, seed), = join_and_leave(target, ["d"])
    assert (seed, number_of(worker_id)) == (4, 4), (worker_id, before)


class SlowJoinStore(StateStore):
    """A real store whose `record_join` takes `delay` seconds longer (a slow disk)."""

    delay = 0.0

    def record_join(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.delay)
        super().record_join(*args, **kwargs)


def test_an_undone_joins_number_is_the_next_joins_and_a_restart_numbers_above_it(tmp_path: Path) -> None:
    """A join its call's deadline ends after its write (DEADLINE_EXCEEDED, `_unadmit`) was never answered: the next
    join takes its number (no worker holds that seed or id), and a restart numbers on above every join recorded."""
    store = SlowJoinStore(tmp_path, durable=False)
    run = SwarmCoordinator(SPEC, store)
    try:
        a = run.join(pb.JoinRequest(worker_name="a"))
        store.delay = 0.4
        with serving_until(time.monotonic() + 0.3), pytest.raises(Refusal) as undone:
            run.join(pb.JoinRequest(worker_name="ghost"))
        assert undone.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, undone.value.message
        store.delay = 0.0
        ghost = [event.worker_id for event in store.events("join")][-1]
        b = run.join(pb.JoinRequest(worker_name="b"))
        assert (a.data_seed, b.data_seed) == (1, 2) and number_of(ghost) == number_of(b.worker_id) == 2
    finally:
        run.close()
    restarted = SwarmCoordinator(SPEC, StateStore(tmp_path, durable=False))
    try:
        c = restarted.join(pb.JoinRequest(worker_name="c"))
        # Above the stored count (2) and the 3 join rows (the undone one's included): a number skipped, none repeated.
        assert (c.data_seed, number_of(c.worker_id)) == (4, 4)
    finally:
        restarted.close()


def test_a_fresh_run_starts_at_one(tmp_path: Path) -> None:
    with serving(SPEC, tmp_path) as (_, target):
        joined = join_and_leave(target, ["a"])
    assert [(number_of(w), s) for w, s in joined] == [(1, 1)]


def test_a_count_an_older_rcswarm_left_behind_its_joins_is_not_trusted_alone(tmp_path: Path) -> None:
    """A review: this version stored count 2; an older rcswarm then served the state dir and numbered 6 joins from 1
    again without updating it; upgraded again, the count resumed from 2 and handed out seeds the older life had
    used. The start now takes the larger of the count and the joins recorded."""
    with serving(SPEC, tmp_path) as (_, target):
        join_and_leave(target, ["a", "b"])
    store = StateStore(tmp_path, durable=False)
    try:
        for number in range(1, 7):  # the older life's joins: their rows, the stored count untouched
            store.add_event(f"w{number}-old", "join", "an older rcswarm's join", 0.0)
    finally:
        store.close()
    with serving(SPEC, tmp_path) as (_, target):
        joined = join_and_leave(target, ["c"])
    assert joined[0][1] == 9 and number_of(joined[0][0]) == 9  # 2 + 6 join rows recorded before it
