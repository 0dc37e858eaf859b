"""Checkpoint schedules for reversing a chain of segments: store-all, uniform (√n) and binomial (revolve).

Streaming BPTT with core checkpointing (`rcswarm.train.bptt.checkpointed`) treats a window
of L steps as a chain of n = ceil(L / k) segments. Segment i maps the core's state at
boundary i to the state at boundary i + 1; the state at boundary 0 is the initial (zero)
state and costs nothing to keep. Reversing the chain means running the backward pass of
every segment, last to first, each from its input state. A schedule says which boundary
states are kept and how often segments are run forward again to recover the others. It
is a stream of actions `(name, index)`:

    ("advance", i)   run segment i forward without gradients: state i -> state i + 1
    ("store", b)     keep the current state (at boundary b) in a slot
    ("restore", b)   make the state kept at boundary b (or the initial state, b = 0) current
    ("free", b)      drop the state kept at boundary b
    ("turn", i)      the backward pass of segment i from the current state (at boundary i),
                     taking the state's gradient at i + 1 and yielding the one at i;
                     turns come in the order n - 1, n - 2, ..., 0

`simulate` checks these rules and counts advances and the most states kept at once
(boundary 0 not counted). Every schedule's first sweep advances segments 0 .. n - 2 in
order before the first turn, so the caller sees every segment once before any backward.

Schedules (`Schedule.actions()` generates the actions lazily, with memory O(slots)):

* "all": keep every boundary state; n - 1 advances, n - 2 stored states (the last is
  turned at once).
* "uniform": checkpoints every m boundaries (m = round(√n) by default); each interval is
  run forward again once, keeping its states, then reversed. About 2n advances and
  n/m + m states: O(√L) stored states at one extra forward pass.
* "binomial": the optimal schedule for a given number of slots c (Griewank 1992; Griewank
  & Walther 2000, "Algorithm 799: revolve", ACM TOMS 26(1)). With β(s, r) = C(s + r, s)
  and s = c + 1 snapshots (the initial state is one), let r be the least integer with
  β(s, r) ≥ n; then the fewest advances are r·n − β(s + 1, r − 1) (`binomial_advances`),
  and the schedule reaches it by splitting [a, a + n) at a + m for any m in
  [max(β(s, r − 2), n − β(s − 1, r)), min(β(s, r − 1), n − β(s − 1, r − 1))]: advance to
  a + m, store, reverse the right part with c − 1 slots, then the left part with c. With
  c = ⌈log2 n⌉ slots the chain is reversed with O(log L) stored states in O(L log L)
  advances. (The split interval was derived here and checked against the exhaustive
  dynamic program `naive_min_advances`, whose optimal split sets it equals exactly for
  n ≤ 400, c ≤ 7; the tests check the counts.)

`plan_schedule` picks one from a budget of stored states.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache

ADVANCE, STORE, RESTORE, FREE, TURN = "advance", "store", "restore", "free", "turn"
KINDS = ("all", "uniform", "binomial")

Action = tuple[str, int]


class MemoryBudgetError(ValueError):
    """A memory budget too small for the core states a schedule must keep: `states` the fewest it needs kept,
    `state_bytes` the bytes of one (0 where it was raised without knowing them), `needed_bytes` their product."""

    def __init__(self, message: str, states: int, state_bytes: int = 0) -> None:
        super().__init__(message)
        self.states, self.state_bytes = states, state_bytes

    @property
    def needed_bytes(self) -> int:
        """The least budget in bytes the schedule fits (0 when `state_bytes` is not known)."""
        return self.states * self.state_bytes


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an int >= {minimum}")
    return value


def beta(s: int, r: int) -> int:
    """β(s, r) = C(s + r, s): the most steps s snapshots reverse with r repetitions; 0 if r < 0."""
    return math.comb(s + r, s) if r >= 0 else 0


def repetitions(n: int, slots: int) -> int:
    """The least r with β(slots + 1, r) >= n: how often the worst segment is advanced."""
    r = 0
    while beta(slots + 1, r) < n:
        r += 1
    return r


def binomial_advances(n: int, slots: int) -> int:
    """The fewest advances that reverse n segments with `slots` stored states (closed form)."""
    _check_count("n", n, 1)
    _check_count("slots", slots, 0)
    if slots == 0:
        return n * (n - 1) // 2
    r = repetitions(n, slots)
    return r * n - beta(slots + 2, r - 1)


def binomial_split(n: int, slots: int) -> int:
    """An optimal first store position m in [1, n - 1] for reversing n > 1 segments with slots >= 1."""
    s = slots + 1
    r = repetitions(n, slots)
    low = max(beta(s, r - 2), n - beta(s - 1, r), 1)
    high = min(beta(s, r - 1), n - beta(s - 1, r - 1), n - 1)
    assert low <= high, (n, slots, low, high)
    return low


def naive_min_advances(n: int, slots: int) -> int:
    """The reference: the exhaustive dynamic program over every first split (O(n² · slots)).

    F(1, c) = 0, F(n, 0) = n (n - 1) / 2, F(n, c) = min over 1 <= m < n of
    m + F(m, c) + F(n - m, c - 1).
    """
    _check_count("n", n, 1)
    _check_count("slots", slots, 0)

    @cache
    def best(length: int, free: int) -> int:
        if length == 1:
            return 0
        if free == 0:
            return length * (length - 1) // 2
        return min(m + best(m, free) + best(length - m, free - 1) for m in range(1, length))

    return best(n, slots)


def _reverse_binomial(n: int, slots: int) -> Iterator[Action]:
    """The binomial schedule's actions, generated with an explicit stack (depth O(slots))."""
    stack: list[tuple[int, int, int]] = [(0, n, slots)]  # (a, b, free slots); b < 0: free boundary a
    current: int | None = 0
    while stack:
        a, b, free = stack.pop()
        if b < 0:
            yield FREE, a
            continue
        if current != a:
            yield RESTORE, a
        if b - a == 1:
            yield TURN, a
            current = None
            continue
        m = a + (b - a - 1 if free == 0 else binomial_split(b - a, free))
        for i in range(a, m):
            yield ADVANCE, i
        current = m
        if free == 0:
            stack += [(a, m, 0), (m, b, 0)]
            continue
        yield STORE, m
        stack += [(a, m, free), (m, -1, 0), (m, b, free - 1)]


def _reverse_uniform(n: int, interval: int) -> Iterator[Action]:
    """Checkpoints at multiples of `interval`; each interval re-advanced once, its states kept."""
    last = (n - 1) // interval * interval  # start of the last interval
    for i in range(last):
        if i > 0 and i % interval == 0:
            yield STORE, i
        yield ADVANCE, i
    if last > 0:
        yield STORE, last
    for start in range(last, -1, -interval):
        stop = min(start + interval, n)
        if start != last:
            yield RESTORE, start
        for i in range(start, stop - 1):
            if i > start:
                yield STORE, i
            yield ADVANCE, i
        for i in range(stop - 1, start - 1, -1):
            if i < stop - 1:
                yield RESTORE, i
            if i > 0 and (i == start or i < stop - 1):
                yield FREE, i
            yield TURN, i


@dataclass(frozen=True)
class Schedule:
    """A checkpoint schedule for n segments: "all", "uniform" (every `interval`) or "binomial" (`slots`)."""

    kind: str
    n_segments: int
    slots: int = 0
    interval: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Schedule.kind={self.kind!r}: expected one of {KINDS}")
        _check_count("Schedule.n_segments", self.n_segments, 1)
        _check_count("Schedule.slots", self.slots, 0)
        _check_count("Schedule.interval", self.interval, 1)

    def actions(self) -> Iterator[Action]:
        """The actions, lazily; see the module docstring."""
        if self.kind == "binomial":
            return _reverse_binomial(self.n_segments, self.slots)
        interval = self.n_segments if self.kind == "all" else self.interval
        return _reverse_uniform(self.n_segments, interval)

    @property
    def stored_states(self) -> int:
        """The most boundary states (besides boundary 0) kept at once."""
        n = self.n_segments
        if self.kind == "binomial":
            return min(self.slots, n - 1)
        m = n if self.kind == "all" else self.interval
        last = (n - 1) // m * m
        during_last = last // m + max(n - last - 2, 0)
        before = last // m - 1 + max(m - 2, 0) if last >= m else 0
        return max(during_last, before)

    @property
    def advances(self) -> int:
        """Segment forward passes without gradients (the turns' own forward passes not counted)."""
        n = self.n_segments
        if self.kind == "binomial":
            return binomial_advances(n, self.slots)
        m = n if self.kind == "all" else self.interval
        last = (n - 1) // m * m
        return last + n - math.ceil(n / m)

    def describe(self) -> str:
        """One line: the kind, stored states and forward passes per segment."""
        detail = {"all": "", "uniform": f" every {self.interval}", "binomial": f" with {self.slots} slots"}[self.kind]
        per_segment = (self.advances + self.n_segments) / self.n_segments
        return (
            f"{self.kind}{detail}: {self.n_segments} segments, at most {self.stored_states} stored "
            f"core states, {per_segment:.2f} core forward passes per segment"
        )


def store_all(n: int) -> Schedule:
    """Keep every boundary state: no recomputation beyond each segment's own turn."""
    return Schedule("all", n)


def uniform(n: int, interval: int | None = None) -> Schedule:
    """Checkpoints every `interval` boundaries (default round(√n)): O(√n) states, ~2n advances."""
    if interval is None:
        interval = max(1, round(math.sqrt(n)))
    return Schedule("uniform", n, interval=interval)


def binomial(n: int, slots: int | None = None) -> Schedule:
    """The optimal schedule with `slots` stored states (default ceil(log2 n), at least 1)."""
    if slots is None:
        slots = max(1, math.ceil(math.log2(n))) if n > 1 else 0
    return Schedule("binomial", n, slots=slots)


@dataclass(frozen=True)
class ScheduleCount:
    """What `simulate` counted: advances, turns and the most stored states at once."""

    advances: int
    turns: int
    stored_states: int


def simulate(actions: Iterable[Action], n: int) -> ScheduleCount:
    """Replay `actions` on a chain of n segments, checking every rule; raise ValueError on a breach."""
    stored: set[int] = set()
    current: int | None = 0
    next_turn = n - 1
    advances = turns = peak = 0
    for name, index in actions:
        if name == ADVANCE:
            if current != index or index >= n - 1:
                raise ValueError(f"advance {index} from boundary {current}: expected a segment below {n - 1} at the current boundary")
            current, advances = index + 1, advances + 1
        elif name == STORE:
            if current != index or index == 0 or index in stored:
                raise ValueError(f"store {index} at boundary {current}: expected the current boundary, > 0, not yet stored")
            stored.add(index)
            peak = max(peak, len(stored))
        elif name == RESTORE:
            if index != 0 and index not in stored:
                raise ValueError(f"restore {index}: boundary {index} is not stored")
            current = index
        elif name == FREE:
            if index not in stored:
                raise ValueError(f"free {index}: boundary {index} is not stored")
            stored.remove(index)
        elif name == TURN:
            if index != next_turn or current != index:
                raise ValueError(f"turn {index} at boundary {current}: expected turn {next_turn} at boundary {next_turn}")
            next_turn, current, turns = next_turn - 1, None, turns + 1
        else:
            raise ValueError(f"action {name!r}: expected one of advance, store, restore, free, turn")
    if next_turn != -1 or stored:
        raise ValueError(f"the schedule ended with turn {next_turn} next and boundaries {sorted(stored)} stored")
    return ScheduleCount(advances=advances, turns=turns, stored_states=peak)


def plan_schedule(n: int, max_states: int | None, kind: str = "auto") -> Schedule:
    """The schedule for n segments that keeps at most `max_states` boundary states (None: no limit).

    "auto": every state if they fit, else the binomial schedule with as many slots as fit
    (the fewest advances for that memory). "uniform" and "all" raise ValueError when
    their stored states exceed `max_states`; "binomial" uses ceil(log2 n) slots, or fewer
    if fewer fit.
    """
    _check_count("n", n, 1)
    if max_states is not None:
        _check_count("max_states", max_states, 0)
    if kind == "auto":
        if max_states is None or max_states >= store_all(n).stored_states:
            return store_all(n)
        chosen = binomial(n, max_states)
    elif kind == "binomial":
        chosen = binomial(n)
        if max_states is not None and chosen.slots > max_states:
            chosen = binomial(n, max_states)
    elif kind == "uniform":
        chosen = uniform(n)
    elif kind == "all":
        chosen = store_all(n)
    else:
        raise ValueError(f"schedule kind={kind!r}: expected 'auto' or one of {KINDS}")
    if max_states is not None and chosen.stored_states > max_states:
        raise MemoryBudgetError(
            f"the {kind} schedule of {n} segments keeps {chosen.stored_states} core states: "
            f"expected at most {max_states} (the memory budget); raise the budget or use 'binomial'",
            chosen.stored_states,
        )
    if chosen.kind == "binomial" and chosen.slots == 0 and n > 2:
        raise MemoryBudgetError(
            f"no core state fits the memory budget for {n} segments: the binomial schedule "
            "needs at least 1 slot (with none, each segment is recomputed from the start)",
            1,
        )
    return chosen
