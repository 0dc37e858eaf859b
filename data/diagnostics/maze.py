"""Maze Position Tracking, after Sections 8.1.2-8.1.4 of the source paper (004).

What the paper specifies: one fixed 32 x 32 maze for all examples (so the
layout can be learned as a prior); a sequence of movements; each movement is
an intent token followed by a result token, where the result repeats the
direction when the agent moved and is `UNCHANGED` when a wall blocked it
(e.g. `LEFT, LEFT` / `LEFT, UNCHANGED`); in the withheld variant each result
is replaced by `WITHHELD` with probability p (p = 20% in its table);
depth = the number of withheld movements in the sequence (so sequences are
much longer than depth); a prediction of the position after each movement,
teacher-forced at every step. `p_withheld=0` is the unwithheld variant.

What we chose where the paper is silent:

- The maze: a perfect maze (a spanning tree of the grid: every cell
  reachable, exactly one path between two cells, size*size - 1 passages),
  carved by randomized depth-first search (recursive backtracker, iterative)
  from cell 0 with `numpy.random.default_rng(maze_seed)`; `maze_seed=0`.
  Cells are indexed `row * size + col`, row 0 at the top; UP is row - 1.
- The walk: start at `start_cell` (default 0, the top-left corner); each
  intent is uniform over UP, DOWN, LEFT, RIGHT; leaving the grid is blocked.
- The target: the cell index after the move (num_classes = size**2 = 1024)
  instead of the paper's regression on (row, col); scored at every result
  token (`scored="every_move"`) or at the last one only (`"final"`).
- `exact_depth=True` withholds exactly round(p * num_moves) results (a
  uniformly random subset), so every example has the same depth, as in the
  paper's depth-32 / depth-64 rows (p 20%: 160 / 320 moves). Otherwise each
  result is withheld independently with probability p.

Tokens: PAD 0, UP 1, DOWN 2, LEFT 3, RIGHT 4, UNCHANGED 5, WITHHELD 6; the
sequence is `intent_1 result_1 intent_2 result_2 ...` (2 * num_moves tokens).
Metadata: `depth` (withheld results), `moves`, `max_withheld_run` (longest
run of consecutive withheld results); per position `withheld_so_far` (depth of
the prediction at that result token) and `move` (1-based move count).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rcswarm.data.diagnostics.base import (
    MAX_EXAMPLE_TOKENS,
    PAD,
    DiagnosticTask,
    Example,
    Vocab,
    make_example,
)
from rcswarm.data.validation import check_bool, check_choice, check_int, check_probability

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3
"""Direction indices; the token of direction d is d + 1."""
DIRECTION_NAMES: tuple[str, ...] = ("UP", "DOWN", "LEFT", "RIGHT")
DELTAS: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
"""(row, col) offset of each direction."""
TOKEN_NAMES: tuple[str, ...] = (PAD, *DIRECTION_NAMES, "UNCHANGED", "WITHHELD")
UNCHANGED_ID = 5
WITHHELD_ID = 6
SCORING: tuple[str, ...] = ("every_move", "final")


def direction_token(direction: int) -> int:
    """Token id of an intent (or of the result "moved in that direction")."""
    return direction + 1


@dataclass(frozen=True, eq=False)
class Maze:
    """A size x size maze; `passages[cell, d]` is True when a move from `cell` in direction d succeeds."""

    size: int
    passages: np.ndarray

    @property
    def num_cells(self) -> int:
        return self.size * self.size

    def neighbor(self, cell: int, direction: int) -> int | None:
        """The adjacent cell in `direction`, or None at the grid border (walls ignored)."""
        row, col = divmod(cell, self.size)
        d_row, d_col = DELTAS[direction]
        row, col = row + d_row, col + d_col
        if 0 <= row < self.size and 0 <= col < self.size:
            return row * self.size + col
        return None

    def step(self, cell: int, direction: int) -> int:
        """Position after trying to move from `cell` in `direction` (unchanged if blocked)."""
        if self.passages[cell, direction]:
            return self.neighbor(cell, direction)
        return cell

    def transition_table(self) -> list[list[int]]:
        """`table[cell][d]` = `step(cell, d)`, as nested lists for fast walks."""
        return [[self.step(c, d) for d in range(4)] for c in range(self.num_cells)]

    def render(self) -> str:
        """ASCII drawing: `#` walls, `.` cells and passages."""
        width = 2 * self.size + 1
        grid = [["#"] * width for _ in range(width)]
        for cell in range(self.num_cells):
            row, col = divmod(cell, self.size)
            grid[2 * row + 1][2 * col + 1] = "."
            for direction in (DOWN, RIGHT):
                if self.passages[cell, direction]:
                    d_row, d_col = DELTAS[direction]
                    grid[2 * row + 1 + d_row][2 * col + 1 + d_col] = "."
        return "\n".join("".join(line) for line in grid)


def _opposite(direction: int) -> int:
    return {UP: DOWN, DOWN: UP, LEFT: RIGHT, RIGHT: LEFT}[direction]


@lru_cache(maxsize=8)
def generate_maze(size: int = 32, seed: int = 0) -> Maze:
    """The perfect maze of `size` x `size` carved by randomized DFS from cell 0 with `seed`."""
    check_int("generate_maze", "size", size, 2)
    check_int("generate_maze", "seed", seed, 0)
    rng = np.random.default_rng(seed)
    maze = Maze(size, np.zeros((size * size, 4), dtype=np.bool_))
    visited = np.zeros(size * size, dtype=np.bool_)
    visited[0] = True
    stack = [0]
    while stack:
        cell = stack[-1]
        options = [
            (d, n) for d in range(4) if (n := maze.neighbor(cell, d)) is not None and not visited[n]
        ]
        if not options:
            stack.pop()
            continue
        direction, nxt = options[int(rng.integers(len(options)))]
        maze.passages[cell, direction] = True
        maze.passages[nxt, _opposite(direction)] = True
        visited[nxt] = True
        stack.append(nxt)
    maze.passages.setflags(write=False)
    return maze


@dataclass(frozen=True)
class MazeConfig:
    """Maze task settings; validated on construction. Defaults: the paper's 32 x 32, p 20%, 160 moves.

    An example is 2 × num_moves tokens (`max_tokens`), at most MAX_EXAMPLE_TOKENS.
    """

    length_fields = ("num_moves",)
    """The fields that set `max_tokens`."""

    size: int = 32
    maze_seed: int = 0
    start_cell: int = 0
    num_moves: int = 160
    p_withheld: float = 0.2
    exact_depth: bool = False
    scored: str = "every_move"

    def __post_init__(self) -> None:
        owner = "MazeConfig"
        check_int(owner, "size", self.size, 2, 256)
        check_int(owner, "maze_seed", self.maze_seed, 0)
        check_int(owner, "start_cell", self.start_cell, 0, self.size * self.size - 1)
        check_int(owner, "num_moves", self.num_moves, 1, MAX_EXAMPLE_TOKENS // 2)
        check_probability(owner, "p_withheld", self.p_withheld)
        check_bool(owner, "exact_depth", self.exact_depth)
        check_choice(owner, "scored", self.scored, SCORING)

    @property
    def max_tokens(self) -> int:
        """Tokens of every example: an intent and a result a move."""
        return 2 * self.num_moves


@dataclass(frozen=True, eq=False)
class Walk:
    """One random walk: intents, true results (moved?), withheld flags, positions after each move."""

    directions: np.ndarray
    moved: np.ndarray
    withheld: np.ndarray
    positions: np.ndarray


def _longest_run(flags: np.ndarray) -> int:
    best = run = 0
    for flag in flags.tolist():
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


class MazeTask(DiagnosticTask[MazeConfig]):
    """Withheld (or, at p 0, unwithheld) maze position tracking on one fixed maze."""

    name = "maze"
    config_type = MazeConfig

    def __init__(self, config: MazeConfig | None = None) -> None:
        super().__init__(config)
        self.maze = generate_maze(self.config.size, self.config.maze_seed)
        self._table = self.maze.transition_table()
        self._vocab = Vocab(
            vocab_size=len(TOKEN_NAMES),
            specials={PAD: 0, "UNCHANGED": UNCHANGED_ID, "WITHHELD": WITHHELD_ID},
            num_classes=self.maze.num_cells,
            target_space="cell index row * size + col of the agent after the move",
            targets_share_token_ids=False,
            token_names=TOKEN_NAMES,
        )

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    def _withheld(self, rng: np.random.Generator) -> np.ndarray:
        n, p = self.config.num_moves, self.config.p_withheld
        if not self.config.exact_depth:
            return rng.random(n) < p
        flags = np.zeros(n, dtype=np.bool_)
        flags[rng.choice(n, size=round(p * n), replace=False)] = True
        return flags

    def sample_walk(self, rng: np.random.Generator) -> Walk:
        """A random walk from `start_cell` with its withheld flags."""
        directions = rng.integers(4, size=self.config.num_moves)
        withheld = self._withheld(rng)
        positions = np.empty(self.config.num_moves, dtype=np.int64)
        cell = self.config.start_cell
        for i, direction in enumerate(directions.tolist()):
            cell = self._table[cell][direction]
            positions[i] = cell
        previous = np.concatenate(([self.config.start_cell], positions[:-1]))
        return Walk(directions, positions != previous, withheld, positions)

    def encode(self, walk: Walk) -> np.ndarray:
        """Interleaved intent / result tokens of a walk."""
        results = np.where(walk.moved, walk.directions + 1, UNCHANGED_ID)
        results = np.where(walk.withheld, WITHHELD_ID, results)
        tokens = np.empty(2 * len(walk.directions), dtype=np.int64)
        tokens[0::2] = walk.directions + 1
        tokens[1::2] = results
        return tokens

    def sample(self, rng: np.random.Generator) -> Example:
        walk = self.sample_walk(rng)
        n = self.config.num_moves
        tokens = self.encode(walk)
        targets = np.zeros(2 * n, dtype=np.int64)
        targets[1::2] = walk.positions
        mask = np.zeros(2 * n, dtype=np.bool_)
        if self.config.scored == "every_move":
            mask[1::2] = True
        else:
            mask[-1] = True
        so_far = np.zeros(2 * n, dtype=np.int64)
        so_far[1::2] = np.cumsum(walk.withheld)
        move = np.zeros(2 * n, dtype=np.int64)
        move[1::2] = np.arange(1, n + 1)
        meta = {
            "depth": int(walk.withheld.sum()),
            "moves": n,
            "max_withheld_run": _longest_run(walk.withheld),
        }
        return make_example(tokens, targets, mask, meta, {"withheld_so_far": so_far, "move": move})
