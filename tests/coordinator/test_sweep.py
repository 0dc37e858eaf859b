"""Sweeps: the assignment and move decisions over several runs, and the [sweep] and [curriculum] keys' validation.

Workers scheduled across a sweep's runs by a real coordinator are tests/swarm/test_sweep.py."""

from __future__ import annotations

import pytest

from rcswarm.coordinator.sweep import RunLoad, SweepCoordinator, decide_assignment, decide_move
from tests.helpers.specs import tiny_spec


def loads(*items: tuple[int, bool]) -> list[RunLoad]:
    return [RunLoad(i, f"L{i}", active, finished) for i, (active, finished) in enumerate(items)]


def test_assignment_goes_to_the_emptiest_unfinished_run():
    assert decide_assignment(loads((1, False), (0, False), (0, False)))[0] == 1
    assert decide_assignment(loads((0, True), (2, False), (3, False)))[0] == 1
    index, reason = decide_assignment(loads((0, True), (0, True)))
    assert index is None and "finished" in reason


def test_moves_happen_when_a_run_finished_or_is_unbalanced():
    assert decide_move(loads((1, True), (1, False)), 0)[0]
    assert decide_move(loads((3, False), (1, False)), 0)[0]
    assert not decide_move(loads((2, False), (1, False)), 0)[0]
    move, reason = decide_move(loads((1, False), (0, True)), 0)
    assert not move and "no other unfinished run" in reason


def test_a_sweep_needs_lengths(tmp_path):
    with pytest.raises(ValueError, match="sweep.seq_lens"):
        SweepCoordinator(tiny_spec(), tmp_path)


def test_curriculum_schedules_are_validated():
    from rcswarm.config.runspec import RunSpec

    with pytest.raises(ValueError, match="curriculum.schedule"):
        RunSpec.from_dict({"curriculum": {"schedule": [[5, 16, 4]]}})
    with pytest.raises(ValueError, match="curriculum.schedule"):
        RunSpec.from_dict({"curriculum": {"schedule": [[0, 16, 4], [0, 32, 2]]}})
    with pytest.raises(ValueError, match="curriculum.schedule"):
        RunSpec.from_dict({"curriculum": {"schedule": [[0, 16]]}})
