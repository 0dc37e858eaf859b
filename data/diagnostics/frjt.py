"""Forward-Referencing Jumps Task (FRJT), after Section 8.1.1 of the source paper (004).

What the paper specifies: a program of depth d contains d labels; programs of
every depth 1..d are mixed in equal numbers; every block ends in two jumps,
only one of which executes depending on a condition; both jumps reference
future labels (no loops); blocks occasionally jump straight to the terminating
state, but a jump to a future block is more likely, and nearer blocks are more
likely than farther ones; the program halts in A or B, about 50/50, according
to where the program counter ends; the target is that halting label, scored at
the last position only (binary head). Section 4 adds that instructions modify
variables and that conditions read the current state of a variable, so
whether an instruction executes is known only once the previous one resolved.

What we chose where the paper is silent:

- State: `num_registers` registers holding integers mod `modulus`, all 0 at
  the start. Execution starts at block 0.
- Block grammar (one token per symbol):
  `LBL_l (ADD REG_r NUM_c){ops_per_block} JLT REG_s NUM_b T1 JMP T2`
  i.e. the block's ops run `r <- (r + c) mod modulus` (c in 1..modulus-1),
  then control goes to T1 if `s < b` (b in 1..modulus-1) and to T2
  otherwise. A target T is a later block's label `LBL_x` or a terminal `A` /
  `B`. The two targets of a block always differ, so every condition matters.
- Jump targets: with probability `p_end` a terminal (A or B with equal
  probability), otherwise a later block at forward distance k >= 1 drawn from
  a geometric law with parameter `p_near`, truncated to the blocks left; the
  last block can only jump to terminals (one A, one B). The second jump is
  drawn from the same law conditioned on differing from the first. With the
  defaults (p_end 0.05, p_near 0.6) the mean coverage (executed / depth) is
  about 0.86, 0.68, 0.55, 0.43, 0.34 at depths 2, 4, 8, 16, 32, and about 0.48
  averaged over depths 1..32: the "approximately 50%" of the paper, with the
  premature ends accumulating along the run as it describes.
- Depth d = number of blocks (= labels; the terminals A and B are not
  counted), uniform in [min_depth, max_depth]. Label names are `d` distinct
  names drawn from a pool of `label_pool` (shuffled unless
  `shuffle_labels=False`), so a label's name says nothing about its position.
- Balance: A and B are symmetric in the generator, so labels are 50/50 by
  construction. `a_fraction` additionally fixes P(A) exactly: the wanted
  label is drawn first and, if the program halts elsewhere, A and B are
  swapped in all its jumps (the executed path is unchanged). At 0.5 this
  leaves the distribution of programs unchanged; `None` keeps natural labels.

Sequence: the blocks in order, then `QUERY`; the target at `QUERY` is class 0
(halt in A) or 1 (halt in B); nothing else is scored. Metadata: `depth`,
`executed` (blocks run, the true serial depth), `label`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rcswarm.data.diagnostics.base import (
    MAX_EXAMPLE_TOKENS,
    MAX_VOCAB,
    PAD,
    DiagnosticTask,
    Example,
    Vocab,
    make_example,
)
from rcswarm.data.validation import check_bool, check_int, check_probability, is_int

HALT_A = -1
"""Jump target meaning "halt in state A"."""
HALT_B = -2
"""Jump target meaning "halt in state B"."""
LABEL_A = 0
"""Target class of programs that halt in A."""
LABEL_B = 1
"""Target class of programs that halt in B."""

SPECIAL_TOKENS: tuple[str, ...] = (PAD, "QUERY", "ADD", "JLT", "JMP", "A", "B")
SPECIAL_IDS: dict[str, int] = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
MAX_DEPTH = 1024
"""The deepest program a config may ask for: 32 × the paper's 32. Drawing the jumps of a program is quadratic in its
depth (0.06 s a program at 1024 and 0.7 s at 2048; 104,857 blocks, the most MAX_EXAMPLE_TOKENS holds, never ended)."""
BLOCK_TOKENS = 7
"""Tokens of a block besides its ops: LBL, JLT REG NUM, T1 JMP T2 (each op adds ADD REG NUM: 3)."""


@dataclass(frozen=True)
class FRJTConfig:
    """FRJT generator settings; validated on construction.

    Defaults: depths 1..8, two registers mod 8, one op per block, a pool of
    64 label names, p_end 0.05, p_near 0.6, labels balanced to 50% A.
    `p_end` must stay below 0.5 (the paper: a jump to a block is more likely
    than a jump to the end). `p_near` must leave the near-jump law a normaliser: 1 - p_near < 1 in floats.
    The label pool is at most MAX_VOCAB names, a program at most MAX_DEPTH blocks and an example at most
    MAX_EXAMPLE_TOKENS tokens (`max_tokens`: max_depth × (7 + 3 × ops_per_block) + 1).
    """

    length_fields = ("max_depth", "ops_per_block")
    """The fields that set `max_tokens`."""

    min_depth: int = 1
    max_depth: int = 8
    num_registers: int = 2
    modulus: int = 8
    ops_per_block: int = 1
    label_pool: int = 64
    shuffle_labels: bool = True
    p_end: float = 0.05
    p_near: float = 0.6
    a_fraction: float | None = 0.5

    def __post_init__(self) -> None:
        owner = "FRJTConfig"
        check_int(owner, "label_pool", self.label_pool, 1, MAX_VOCAB)
        check_int(owner, "min_depth", self.min_depth, 1, min(self.label_pool, MAX_DEPTH))
        check_int(owner, "max_depth", self.max_depth, self.min_depth, min(self.label_pool, MAX_DEPTH))
        check_int(owner, "num_registers", self.num_registers, 1, 64)
        check_int(owner, "modulus", self.modulus, 2, 1024)
        most_ops = ((MAX_EXAMPLE_TOKENS - 1) // self.max_depth - BLOCK_TOKENS) // 3
        if not (is_int(self.ops_per_block) and 1 <= self.ops_per_block <= most_ops):
            raise ValueError(
                f"{owner}.ops_per_block={self.ops_per_block!r}: expected an int in [1, {most_ops}] (examples of at "
                f"most {MAX_EXAMPLE_TOKENS} tokens: max_depth × ({BLOCK_TOKENS} + 3 × ops_per_block) + 1, "
                f"max_depth = {self.max_depth})"
            )
        check_bool(owner, "shuffle_labels", self.shuffle_labels)
        check_probability(owner, "p_near", self.p_near, open_low=True)
        if not 1.0 - self.p_near < 1.0:  # q = 1 - p_near rounds to 1: the law's normaliser 1 - q**k is 0
            raise ValueError(
                f"{owner}.p_near={self.p_near!r}: expected a number in (0, 1] with 1 - p_near < 1 in floats "
                "(at least about 1.2e-16: the near-jump law's normaliser 1 - (1 - p_near)**k must not be 0)"
            )
        check_probability(owner, "p_end", self.p_end)
        if not self.p_end < 0.5:
            raise ValueError(
                f"{owner}.p_end={self.p_end!r}: expected a number in [0, 0.5) "
                "(the paper: jumping to a block is more likely than to the end)"
            )
        if self.a_fraction is not None:
            check_probability(owner, "a_fraction", self.a_fraction)

    @property
    def max_tokens(self) -> int:
        """Tokens of the longest example: max_depth blocks of ops_per_block ops, then QUERY."""
        return self.max_depth * (BLOCK_TOKENS + 3 * self.ops_per_block) + 1


@dataclass(frozen=True)
class Block:
    """One labelled block: `ops` as (register, addend) pairs, then the conditional jump pair."""

    label: int
    ops: tuple[tuple[int, int], ...]
    cond_register: int
    cond_bound: int
    if_target: int
    else_target: int


@dataclass(frozen=True)
class Program:
    """A straight-line program of blocks; targets are later block indices or HALT_A / HALT_B."""

    blocks: tuple[Block, ...]
    num_registers: int
    modulus: int

    def __post_init__(self) -> None:
        check_int("Program", "num_registers", self.num_registers, 1)
        check_int("Program", "modulus", self.modulus, 2)
        if not self.blocks:
            raise ValueError("Program.blocks=(): expected at least one block")
        labels = [b.label for b in self.blocks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"Program.blocks labels={labels}: expected distinct labels")
        for i, block in enumerate(self.blocks):
            self._check_block(i, block)

    def _check_block(self, i: int, block: Block) -> None:
        owner = f"Program.blocks[{i}]"
        check_int(owner, "label", block.label, 0)
        for j, (register, addend) in enumerate(block.ops):
            check_int(f"{owner}.ops[{j}]", "register", register, 0, self.num_registers - 1)
            check_int(f"{owner}.ops[{j}]", "addend", addend, 0, self.modulus - 1)
        check_int(owner, "cond_register", block.cond_register, 0, self.num_registers - 1)
        check_int(owner, "cond_bound", block.cond_bound, 0, self.modulus - 1)
        for name in ("if_target", "else_target"):
            target = getattr(block, name)
            if target not in (HALT_A, HALT_B) and not (i < target < len(self.blocks)):
                raise ValueError(
                    f"{owner}.{name}={target!r}: expected HALT_A, HALT_B or a later block index "
                    f"in ({i}, {len(self.blocks)})"
                )

    @property
    def depth(self) -> int:
        return len(self.blocks)

    def swap_terminals(self) -> Program:
        """The same program with A and B exchanged in every jump."""
        swap = {HALT_A: HALT_B, HALT_B: HALT_A}
        blocks = tuple(
            Block(
                b.label, b.ops, b.cond_register, b.cond_bound,
                swap.get(b.if_target, b.if_target), swap.get(b.else_target, b.else_target),
            )
            for b in self.blocks
        )
        return Program(blocks, self.num_registers, self.modulus)


@dataclass(frozen=True)
class Execution:
    """Result of running a program: halting class, executed block indices, final registers."""

    label: int
    path: tuple[int, ...]
    registers: tuple[int, ...]


def run_program(program: Program) -> Execution:
    """Interpret `program` step by step from block 0 with all registers 0."""
    registers = [0] * program.num_registers
    path: list[int] = []
    pc = 0
    while pc >= 0:
        path.append(pc)
        block = program.blocks[pc]
        for register, addend in block.ops:
            registers[register] = (registers[register] + addend) % program.modulus
        taken = registers[block.cond_register] < block.cond_bound
        pc = block.if_target if taken else block.else_target
    return Execution(LABEL_A if pc == HALT_A else LABEL_B, tuple(path), tuple(registers))


def evaluate_by_table(program: Program) -> int:
    """Halting class computed without simulation: a backward table over all register states.

    For every block, from the last to the first, and for every one of the
    `modulus ** num_registers` register states on entry, the table holds the
    class the program halts in from there; forward-only jumps make each row
    depend on later rows only. The answer is row 0 at the all-zero state.
    Cost O(depth * modulus ** num_registers); meant for cross-checking
    `run_program`.
    """
    m, r = program.modulus, program.num_registers
    digits = np.indices((m,) * r).reshape(r, -1).T
    place = m ** np.arange(r - 1, -1, -1)
    outcome = np.zeros((program.depth, digits.shape[0]), dtype=np.int64)
    for index in range(program.depth - 1, -1, -1):
        block = program.blocks[index]
        after = digits.copy()
        for register, addend in block.ops:
            after[:, register] = (after[:, register] + addend) % m
        entry_of_successor = after @ place
        branch = {}
        for target in (block.if_target, block.else_target):
            if target == HALT_A:
                branch[target] = np.full(digits.shape[0], LABEL_A)
            elif target == HALT_B:
                branch[target] = np.full(digits.shape[0], LABEL_B)
            else:
                branch[target] = outcome[target][entry_of_successor]
        taken = after[:, block.cond_register] < block.cond_bound
        outcome[index] = np.where(taken, branch[block.if_target], branch[block.else_target])
    return int(outcome[0, 0])


@dataclass(frozen=True)
class FRJTCodec:
    """Token ids of FRJT programs for one config, and program <-> tokens conversion.

    Ids: PAD 0, QUERY 1, ADD 2, JLT 3, JMP 4, A 5, B 6, then REG_0..REG_{R-1},
    NUM_0..NUM_{M-1}, LBL_0..LBL_{P-1} (R registers, modulus M, label pool P).
    """

    num_registers: int
    modulus: int
    label_pool: int

    @classmethod
    def for_config(cls, config: FRJTConfig) -> FRJTCodec:
        return cls(config.num_registers, config.modulus, config.label_pool)

    @property
    def ids(self) -> dict[str, int]:
        """Ids of the special tokens by name."""
        return dict(SPECIAL_IDS)

    @property
    def reg0(self) -> int:
        return len(SPECIAL_TOKENS)

    @property
    def num0(self) -> int:
        return self.reg0 + self.num_registers

    @property
    def lbl0(self) -> int:
        return self.num0 + self.modulus

    @property
    def vocab(self) -> Vocab:
        names = (
            *SPECIAL_TOKENS,
            *(f"REG_{i}" for i in range(self.num_registers)),
            *(f"NUM_{i}" for i in range(self.modulus)),
            *(f"LBL_{i}" for i in range(self.label_pool)),
        )
        return Vocab(
            vocab_size=len(names),
            specials=dict(self.ids),
            num_classes=2,
            target_space="halting state: 0 = A, 1 = B (scored at the final QUERY token)",
            targets_share_token_ids=False,
            token_names=names,
        )

    def encode(self, program: Program) -> list[int]:
        """Token ids of `program` followed by QUERY."""
        if program.num_registers != self.num_registers or program.modulus != self.modulus:
            raise ValueError(
                f"program has num_registers={program.num_registers}, modulus={program.modulus}: "
                f"expected {self.num_registers}, {self.modulus}"
            )
        tokens: list[int] = []
        for block in program.blocks:
            tokens.extend(self._encode_block(program, block))
        tokens.append(self.ids["QUERY"])
        return tokens

    def _encode_block(self, program: Program, block: Block) -> list[int]:
        check_int("Block", "label", block.label, 0, self.label_pool - 1)
        out = [self.lbl0 + block.label]
        for register, addend in block.ops:
            out += [self.ids["ADD"], self.reg0 + register, self.num0 + addend]
        out += [self.ids["JLT"], self.reg0 + block.cond_register, self.num0 + block.cond_bound]
        out += [self._encode_target(program, block.if_target), self.ids["JMP"]]
        out.append(self._encode_target(program, block.else_target))
        return out

    def _encode_target(self, program: Program, target: int) -> int:
        if target == HALT_A:
            return self.ids["A"]
        if target == HALT_B:
            return self.ids["B"]
        return self.lbl0 + program.blocks[target].label

    def decode(self, tokens: Sequence[int]) -> Program:
        """Parse token ids (as produced by `encode`) back into a Program; ValueError if malformed."""
        reader = _Reader([int(t) for t in tokens], self)
        raw_blocks = []
        while reader.peek() != self.ids["QUERY"]:
            raw_blocks.append(reader.block())
        reader.expect_end()
        index_of = {label: i for i, (label, *_rest) in enumerate(raw_blocks)}
        blocks = []
        for label, ops, cond_register, cond_bound, if_ref, else_ref in raw_blocks:
            resolved = [reader.resolve(ref, index_of) for ref in (if_ref, else_ref)]
            blocks.append(Block(label, ops, cond_register, cond_bound, *resolved))
        return Program(tuple(blocks), self.num_registers, self.modulus)


class _Reader:
    """Cursor over FRJT token ids for `FRJTCodec.decode`."""

    def __init__(self, tokens: list[int], codec: FRJTCodec) -> None:
        self.tokens, self.codec, self.pos = tokens, codec, 0

    def peek(self) -> int:
        if self.pos >= len(self.tokens):
            raise ValueError(f"tokens end at {self.pos}: expected a block or QUERY")
        return self.tokens[self.pos]

    def take(self, low: int, count: int, what: str) -> int:
        token = self.peek()
        if not low <= token < low + count:
            raise ValueError(f"tokens[{self.pos}]={token}: expected {what}")
        self.pos += 1
        return token - low

    def keyword(self, name: str) -> None:
        self.take(self.codec.ids[name], 1, name)

    def block(self) -> tuple:
        codec = self.codec
        label = self.take(codec.lbl0, codec.label_pool, "a label LBL_*")
        ops = []
        while self.peek() == codec.ids["ADD"]:
            self.keyword("ADD")
            register = self.take(codec.reg0, codec.num_registers, "REG_*")
            ops.append((register, self.take(codec.num0, codec.modulus, "NUM_*")))
        self.keyword("JLT")
        cond_register = self.take(codec.reg0, codec.num_registers, "REG_*")
        cond_bound = self.take(codec.num0, codec.modulus, "NUM_*")
        if_ref = self.target()
        self.keyword("JMP")
        return label, tuple(ops), cond_register, cond_bound, if_ref, self.target()

    def target(self) -> tuple[str, int]:
        token = self.peek()
        if token in (self.codec.ids["A"], self.codec.ids["B"]):
            self.pos += 1
            return ("halt", HALT_A if token == self.codec.ids["A"] else HALT_B)
        return ("label", self.take(self.codec.lbl0, self.codec.label_pool, "A, B or a label LBL_*"))

    def expect_end(self) -> None:
        self.keyword("QUERY")
        if self.pos != len(self.tokens):
            raise ValueError(f"tokens continue after QUERY at {self.pos}: expected the end")

    @staticmethod
    def resolve(ref: tuple[str, int], index_of: dict[int, int]) -> int:
        kind, value = ref
        if kind == "halt":
            return value
        if value not in index_of:
            raise ValueError(f"jump to LBL_{value}: expected a label defined in the program")
        return index_of[value]


@lru_cache(maxsize=1024)
def _jump_law(p_end: float, p_near: float, remaining: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Relative jump targets (HALT_A, HALT_B, then +1..+remaining) and their probabilities."""
    if remaining == 0:
        return (HALT_A, HALT_B), (0.5, 0.5)
    q = 1.0 - p_near
    norm = 1.0 - q**remaining
    near = [(1.0 - p_end) * p_near * q ** (k - 1) / norm for k in range(1, remaining + 1)]
    return (HALT_A, HALT_B, *range(1, remaining + 1)), (p_end / 2, p_end / 2, *near)


def _pick(options: list[int], weights: list[float], u: float) -> int:
    """Inverse-CDF draw: the option whose slice of `u * sum(weights)` holds the point."""
    threshold = u * sum(weights)
    chosen = options[0]
    for option, weight in zip(options, weights):
        if weight > 0.0:
            chosen = option
            if threshold < weight:
                return option
            threshold -= weight
    return chosen


def _draw_targets(rng: np.random.Generator, config: FRJTConfig, index: int, depth: int) -> tuple[int, int]:
    """The two jump targets of block `index`: the first from the jump law, the second from it
    conditioned on differing from the first (a terminal if nothing else has positive probability)."""
    relative, weights = _jump_law(config.p_end, config.p_near, depth - 1 - index)
    options = [t if t < 0 else index + t for t in relative]
    first_u, second_u = rng.random(2)
    first = _pick(options, list(weights), first_u)
    rest = [w if t != first else 0.0 for t, w in zip(options, weights)]
    if sum(rest) <= 0.0:
        rest = [1.0 if t in (HALT_A, HALT_B) else 0.0 for t in options]
    return first, _pick(options, rest, second_u)


def generate_program(config: FRJTConfig, depth: int, rng: np.random.Generator) -> Program:
    """A random program with `depth` blocks, labels not yet balanced (see `FRJTTask`)."""
    check_int("generate_program", "depth", depth, 1, config.label_pool)
    if config.shuffle_labels:
        labels = rng.choice(config.label_pool, size=depth, replace=False)
    else:
        labels = np.arange(depth)
    k = config.ops_per_block
    op_registers = rng.integers(config.num_registers, size=(depth, k))
    op_addends = rng.integers(1, config.modulus, size=(depth, k))
    cond_registers = rng.integers(config.num_registers, size=depth)
    cond_bounds = rng.integers(1, config.modulus, size=depth)
    blocks = []
    for i in range(depth):
        ops = tuple((int(r), int(c)) for r, c in zip(op_registers[i], op_addends[i]))
        targets = _draw_targets(rng, config, i, depth)
        blocks.append(Block(int(labels[i]), ops, int(cond_registers[i]), int(cond_bounds[i]), *targets))
    return Program(tuple(blocks), config.num_registers, config.modulus)


class FRJTTask(DiagnosticTask[FRJTConfig]):
    """FRJT examples: program tokens + QUERY, target = halting class at QUERY."""

    name = "frjt"
    config_type = FRJTConfig

    def __init__(self, config: FRJTConfig | None = None) -> None:
        super().__init__(config)
        self.codec = FRJTCodec.for_config(self.config)
        self._vocab = self.codec.vocab

    @property
    def vocab(self) -> Vocab:
        return self._vocab

    def sample_program(self, rng: np.random.Generator) -> tuple[Program, Execution]:
        """A program of uniformly drawn depth with its execution, balanced per `a_fraction`."""
        config = self.config
        depth = int(rng.integers(config.min_depth, config.max_depth + 1))
        wanted = None
        if config.a_fraction is not None:
            wanted = LABEL_A if rng.random() < config.a_fraction else LABEL_B
        program = generate_program(config, depth, rng)
        execution = run_program(program)
        if wanted is not None and execution.label != wanted:
            program = program.swap_terminals()
            execution = Execution(wanted, execution.path, execution.registers)
        return program, execution

    def sample(self, rng: np.random.Generator) -> Example:
        program, execution = self.sample_program(rng)
        tokens = self.codec.encode(program)
        mask = np.zeros(len(tokens), dtype=np.bool_)
        mask[-1] = True
        targets = np.zeros(len(tokens), dtype=np.int64)
        targets[-1] = execution.label
        meta = {"depth": program.depth, "executed": len(execution.path), "label": execution.label}
        return make_example(tokens, targets, mask, meta)
