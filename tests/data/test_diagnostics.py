"""Tests of the synthetic diagnostic tasks: FRJT, maze position tracking, MQAR and S5."""

from __future__ import annotations

import re
from collections import deque
from itertools import islice

import numpy as np
import pytest
import torch

from rcswarm.data.diagnostics import IGNORE_INDEX, TASKS, make_task
from rcswarm.data.diagnostics.frjt import (
    HALT_A,
    HALT_B,
    LABEL_A,
    LABEL_B,
    Block,
    FRJTCodec,
    FRJTConfig,
    FRJTTask,
    Program,
    evaluate_by_table,
    generate_program,
    run_program,
)
from rcswarm.data.diagnostics.maze import (
    DELTAS,
    UNCHANGED_ID,
    WITHHELD_ID,
    MazeConfig,
    MazeTask,
    generate_maze,
)
from rcswarm.data.diagnostics.mqar import MQARConfig, MQARTask
from rcswarm.data.diagnostics.s5 import (
    PAD_ID,
    PERMUTATIONS,
    LengthCurriculum,
    S5Config,
    S5Task,
    compose,
    evaluation_configs,
    index_to_permutation,
    permutation_to_index,
    running_products,
)
from tests.helpers.data import SMALL_CONFIGS, batch_digest


def test_frjt_hand_written_program_runs_as_specified() -> None:
    # r0 += 3 (=3); 3 < 5 -> block 2; r0 += 4 (=7); 7 < 2 false -> B. Block 1 is skipped.
    blocks = (
        Block(label=10, ops=((0, 3),), cond_register=0, cond_bound=5, if_target=2, else_target=1),
        Block(label=11, ops=((0, 1),), cond_register=0, cond_bound=7, if_target=HALT_A, else_target=2),
        Block(label=12, ops=((0, 4),), cond_register=0, cond_bound=2, if_target=HALT_A, else_target=HALT_B),
    )
    program = Program(blocks, num_registers=1, modulus=8)
    execution = run_program(program)
    assert execution.label == LABEL_B
    assert execution.path == (0, 2)
    assert execution.registers == (7,)
    assert evaluate_by_table(program) == LABEL_B
    flipped = Program((*blocks[:2], Block(12, ((0, 4),), 0, 2, HALT_B, HALT_A)), 1, 8)
    assert run_program(flipped).label == evaluate_by_table(flipped) == LABEL_A


def test_frjt_interpreter_agrees_with_table_evaluator_on_random_programs() -> None:
    configs = [
        FRJTConfig(max_depth=32),
        FRJTConfig(max_depth=24, num_registers=3, modulus=5, ops_per_block=2, shuffle_labels=False),
        FRJTConfig(max_depth=16, num_registers=1, modulus=2, p_end=0.3, p_near=0.9),
        FRJTConfig(max_depth=20, num_registers=4, modulus=3, p_end=0.0, p_near=0.2),
    ]
    rng = np.random.default_rng(1234)
    checked, labels, long_runs = 0, [], 0
    for config in configs:
        for _ in range(600):
            depth = int(rng.integers(1, config.max_depth + 1))
            program = generate_program(config, depth, rng)
            execution = run_program(program)
            assert evaluate_by_table(program) == execution.label, program
            labels.append(execution.label)
            long_runs += len(execution.path) >= 5
            checked += 1
    assert checked >= 2000
    assert 0.3 < np.mean(labels) < 0.7
    assert long_runs > 300


def test_frjt_programs_follow_the_paper_grammar() -> None:
    config = FRJTConfig(max_depth=32)
    rng = np.random.default_rng(7)
    end_jumps = block_jumps = 0
    distances: list[int] = []
    coverage = []
    for depth in range(1, 33):
        for _ in range(40):
            program = generate_program(config, depth, rng)
            assert program.depth == depth
            assert len({b.label for b in program.blocks}) == depth
            last = program.blocks[-1]
            assert {last.if_target, last.else_target} == {HALT_A, HALT_B}
            for i, block in enumerate(program.blocks):
                assert block.if_target != block.else_target
                for target in (block.if_target, block.else_target):
                    assert target in (HALT_A, HALT_B) or target > i
                    if i < depth - 1:
                        if target < 0:
                            end_jumps += 1
                        else:
                            block_jumps += 1
                            distances.append(target - i)
            coverage.append(len(run_program(program).path) / depth)
    assert 0 < end_jumps < 0.25 * block_jumps
    counts = np.bincount(distances)
    assert counts[1] > counts[2] > counts[3] > counts[4]
    assert 0.4 < np.mean(coverage) < 0.6


@pytest.mark.parametrize("a_fraction", [None, 0.5])
def test_frjt_labels_are_balanced(a_fraction: float | None) -> None:
    task = FRJTTask(FRJTConfig(max_depth=16, a_fraction=a_fraction))
    labels = task.batch(4000, seed=3).meta["label"].float()
    assert 0.45 <= float((labels == LABEL_A).float().mean()) <= 0.55


def test_frjt_balance_control_sets_the_label_and_keeps_labels_true() -> None:
    task = FRJTTask(FRJTConfig(max_depth=10, a_fraction=0.8))
    stream = task.examples(seed=5)
    labels = []
    for _ in range(1500):
        example = next(stream)
        program = task.codec.decode(example.tokens.tolist())
        labels.append(int(example.targets[-1]))
        assert run_program(program).label == labels[-1] == example.meta["label"]
    assert 0.75 <= np.mean(np.array(labels) == LABEL_A) <= 0.85


def test_frjt_serialization_round_trips_and_reruns() -> None:
    task = FRJTTask(FRJTConfig(max_depth=20, num_registers=3, ops_per_block=2))
    stream = task.examples(seed=11)
    for _ in range(300):
        tokens, targets, mask = next(stream)
        program = task.codec.decode(tokens.tolist())
        assert task.codec.encode(program) == tokens.tolist()
        assert mask.nonzero().flatten().tolist() == [len(tokens) - 1]
        assert run_program(program).label == int(targets[-1]) == evaluate_by_table(program)
        assert (targets[:-1] == IGNORE_INDEX).all()


def test_frjt_decode_rejects_malformed_tokens() -> None:
    codec = FRJTCodec.for_config(FRJTConfig())
    blocks = (
        Block(3, ((0, 1),), 0, 4, 1, HALT_A),
        Block(5, ((1, 2),), 1, 3, HALT_B, HALT_A),
    )
    tokens = codec.encode(Program(blocks, 2, 8))
    assert codec.decode(tokens) == Program(blocks, 2, 8)
    with pytest.raises(ValueError, match="QUERY"):
        codec.decode(tokens[:-1])
    backward = list(tokens)
    backward[tokens.index(codec.ids["B"])] = codec.lbl0 + 3
    with pytest.raises(ValueError, match="later block"):
        codec.decode(backward)
    unknown = list(tokens)
    unknown[7] = codec.lbl0 + 40
    with pytest.raises(ValueError, match="LBL_40"):
        codec.decode(unknown)



def test_maze_is_a_fixed_perfect_maze() -> None:
    maze = generate_maze(32, 0)
    assert maze.passages.shape == (1024, 4)
    assert maze is generate_maze(32, 0)
    assert not np.array_equal(maze.passages, generate_maze(32, 1).passages)
    edges: set[frozenset[int]] = set()
    for cell in range(1024):
        row, col = divmod(cell, 32)
        for direction, (d_row, d_col) in enumerate(DELTAS):
            if maze.passages[cell, direction]:
                r, c = row + d_row, col + d_col
                assert 0 <= r < 32 and 0 <= c < 32
                other = r * 32 + c
                back = DELTAS.index((-d_row, -d_col))
                assert maze.passages[other, back]
                edges.add(frozenset((cell, other)))
    assert len(edges) == 1023
    adjacent: dict[int, list[int]] = {cell: [] for cell in range(1024)}
    for a, b in map(tuple, edges):
        adjacent[a].append(b)
        adjacent[b].append(a)
    seen, queue = {0}, deque([0])
    while queue:
        cell = queue.popleft()
        for other in adjacent[cell]:
            if other not in seen:
                seen.add(other)
                queue.append(other)
    assert len(seen) == 1024


def test_maze_replay_matches_targets_and_visible_results() -> None:
    task = MazeTask(MazeConfig(num_moves=200, p_withheld=0.3))
    passages = task.maze.passages
    batch = task.batch(40, seed=2)
    moved_total = 0
    for tokens, targets, mask in zip(batch.tokens.tolist(), batch.targets.tolist(), batch.mask.tolist()):
        row, col = 0, 0
        for step in range(200):
            direction = tokens[2 * step] - 1
            result = tokens[2 * step + 1]
            d_row, d_col = DELTAS[direction]
            moved = bool(passages[row * 32 + col, direction])
            if moved:
                row, col = row + d_row, col + d_col
                moved_total += 1
            expected = tokens[2 * step] if moved else UNCHANGED_ID
            assert result in (expected, WITHHELD_ID)
            assert mask[2 * step + 1] and not mask[2 * step]
            assert targets[2 * step + 1] == row * 32 + col
            assert targets[2 * step] == IGNORE_INDEX
    assert 0.3 < moved_total / (40 * 200) < 0.7


def test_maze_withheld_fraction_and_depth() -> None:
    task = MazeTask(MazeConfig(num_moves=160, p_withheld=0.2))
    batch = task.batch(200, seed=4)
    results = batch.tokens[:, 1::2]
    withheld = results == WITHHELD_ID
    assert abs(float(withheld.float().mean()) - 0.2) < 0.01
    assert torch.equal(batch.meta["depth"], withheld.sum(dim=1))
    assert torch.equal(batch.position_meta["withheld_so_far"][:, 1::2], withheld.long().cumsum(dim=1))
    assert torch.equal(batch.position_meta["move"][:, 1::2], torch.arange(1, 161).expand(200, 160))
    for flags, run in zip(withheld.tolist(), batch.meta["max_withheld_run"].tolist()):
        text = "".join("1" if f else "0" for f in flags)
        assert run == max(len(part) for part in text.split("0"))
    exact = MazeTask(MazeConfig(num_moves=160, p_withheld=0.2, exact_depth=True)).batch(50, seed=4)
    assert (exact.meta["depth"] == 32).all()
    assert ((exact.tokens == WITHHELD_ID).sum(dim=1) == 32).all()
    visible = MazeTask(MazeConfig(num_moves=100, p_withheld=0.0)).batch(20, seed=4)
    assert not (visible.tokens == WITHHELD_ID).any() and (visible.meta["depth"] == 0).all()


def test_maze_final_scoring_marks_only_the_last_result() -> None:
    _, targets, mask = MazeTask(MazeConfig(num_moves=30, scored="final")).batch(3, seed=0)
    assert mask.sum(dim=1).tolist() == [1, 1, 1] and mask[:, -1].all()
    every = MazeTask(MazeConfig(num_moves=30)).batch(3, seed=0)
    assert torch.equal(targets[:, -1], every.targets[:, -1])



def test_mqar_targets_are_the_bound_values() -> None:
    for placement in ("uniform", "nearby"):
        config = MQARConfig(vocab_size=512, num_kv_pairs=16, seq_len=128, placement=placement)
        task = MQARTask(config)
        batch = task.batch(100, seed=8)
        rows = zip(
            batch.tokens.tolist(), batch.targets.tolist(), batch.mask.tolist(), batch.position_meta["distance"].tolist()
        )
        for tokens, targets, mask, distance in rows:
            keys, values = tokens[0:32:2], tokens[1:32:2]
            assert len(set(keys)) == 16
            assert all(2 <= k < config.first_value_id <= v < 512 for k, v in zip(keys, values))
            bound = dict(zip(keys, values))
            queried = [t for t, m in zip(tokens, mask) if m]
            assert sorted(queried) == sorted(keys)
            assert sum(2 <= t < config.first_value_id for t in tokens[32:]) == 16
            for pos, (token, target, scored) in enumerate(zip(tokens, targets, mask)):
                if scored:
                    assert target == bound[token]
                    assert distance[pos] == pos - keys.index(token) * 2
                else:
                    assert target == IGNORE_INDEX


def test_mqar_placements_differ_in_key_query_distance() -> None:
    def distances(placement: str) -> torch.Tensor:
        task = MQARTask(MQARConfig(vocab_size=1024, num_kv_pairs=8, seq_len=256, placement=placement))
        batch = task.batch(200, seed=9)
        return batch.position_meta["distance"][batch.mask].float()

    uniform, nearby = distances("uniform"), distances("nearby")
    slots = (256 - 16) // 2
    assert abs(float(uniform.mean()) - (16 + slots - 1 - 7)) < 8
    assert float(nearby.mean()) < 0.6 * float(uniform.mean())
    assert float(nearby.median()) < float(uniform.median()) / 2


def test_mqar_blank_filler() -> None:
    tokens, _, mask = MQARTask(MQARConfig(vocab_size=128, seq_len=64, filler="blank")).batch(5, seed=0)
    assert (tokens[:, 16:][~mask[:, 16:]] == 1).all()



def test_s5_tokens_and_permutations_are_a_bijection() -> None:
    assert len(PERMUTATIONS) == 120 and len(set(PERMUTATIONS)) == 120
    assert PERMUTATIONS[0] == (0, 1, 2, 3, 4)
    for index in range(120):
        perm = index_to_permutation(index)
        assert sorted(perm) == [0, 1, 2, 3, 4]
        assert permutation_to_index(perm) == index
    with pytest.raises(ValueError, match="perm="):
        permutation_to_index((0, 0, 1, 2, 3))
    with pytest.raises(ValueError, match="index=120"):
        index_to_permutation(120)


def test_s5_composition_convention() -> None:
    swap01, swap12 = (1, 0, 2, 3, 4), (0, 2, 1, 3, 4)
    assert compose(swap01, swap12) == (2, 0, 1, 3, 4)
    task = S5Task(S5Config(2, 2))
    tokens = [permutation_to_index(swap01), permutation_to_index(swap12)]
    assert [PERMUTATIONS[i] for i in running_products(tokens)] == [swap01, (2, 0, 1, 3, 4)]
    assert task.vocab.num_classes == 120 and task.vocab.vocab_size == 121


def test_s5_targets_are_running_products_of_explicit_arrays() -> None:
    batch = S5Task(S5Config(1, 60)).batch(100, seed=12)
    for tokens, targets, mask, length in zip(batch.tokens, batch.targets, batch.mask, batch.lengths.tolist()):
        state = np.arange(5)
        for t in range(length):
            g = np.array(PERMUTATIONS[int(tokens[t])])
            state = g[state]
            assert PERMUTATIONS[int(targets[t])] == tuple(state.tolist())
        assert mask[:length].all() and not mask[length:].any()
        assert (tokens[length:] == PAD_ID).all() and (targets[length:] == IGNORE_INDEX).all()


def test_s5_length_curriculum_and_evaluation_lengths() -> None:
    curriculum = LengthCurriculum(start_length=4, final_length=18, steps_per_length=100)
    assert [curriculum.length_at(s) for s in (0, 99, 100, 1399, 1400, 10**6)] == [4, 4, 5, 17, 18, 18]
    assert curriculum.config_at(250) == S5Config(4, 6)
    assert LengthCurriculum(keep_shorter=False, steps_per_length=10).config_at(25) == S5Config(6, 6)
    lengths = S5Task(curriculum.config_at(250)).batch(300, seed=0).lengths
    assert set(lengths.tolist()) == {4, 5, 6}
    configs = evaluation_configs()
    assert [c.max_length for c in configs] == list(range(20, 181, 20))
    assert S5Task(configs[-1]).batch(2, seed=0).tokens.shape == (2, 180)



@pytest.mark.parametrize("name", sorted(TASKS))
def test_batches_are_well_formed(name: str) -> None:
    task = make_task(name, **SMALL_CONFIGS[name])
    vocab = task.vocab
    batch = task.batch(16, seed=0)
    tokens, targets, mask = batch
    assert tokens.dtype == targets.dtype == torch.int64 and mask.dtype == torch.bool
    assert tokens.shape == targets.shape == mask.shape and tokens.shape[0] == 16 == len(batch)
    assert ((tokens >= 0) & (tokens < vocab.vocab_size)).all()
    assert ((targets[mask] >= 0) & (targets[mask] < vocab.num_classes)).all()
    assert (targets[~mask] == IGNORE_INDEX).all()
    positions = torch.arange(tokens.shape[1])
    padding = positions[None, :] >= batch.lengths[:, None]
    assert (tokens[padding] == vocab.pad_id).all() and not mask[padding].any()
    assert (tokens[~padding] != vocab.pad_id).all()
    assert all(v.shape == (16,) for v in batch.meta.values())
    assert all(v.shape == tokens.shape for v in batch.position_meta.values())
    assert vocab.decode(tokens[0, :3])[0] == vocab.token_names[int(tokens[0, 0])]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_seed_same_tensors_and_different_seeds_differ(name: str) -> None:
    task = make_task(name, **SMALL_CONFIGS[name])
    first, again = task.batch(8, seed=21), make_task(name, **SMALL_CONFIGS[name]).batch(8, seed=21)
    assert batch_digest(first) == batch_digest(again)
    others = {batch_digest(task.batch(8, seed=s)) for s in (22, 23, 121, 2**40)}
    assert len(others | {batch_digest(first)}) == 5
    streamed = list(islice(task.examples(21), 8))
    assert torch.equal(streamed[3].tokens, first.tokens[3, : len(streamed[3])])


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("frjt", "max_depth", 0),
        ("frjt", "p_end", 0.6),
        ("frjt", "modulus", 1),
        ("frjt", "a_fraction", 1.5),
        ("frjt", "shuffle_labels", "yes"),
        ("maze", "p_withheld", -0.1),
        ("maze", "start_cell", 1024),
        ("maze", "scored", "sometimes"),
        ("maze", "num_moves", 2.5),
        ("mqar", "seq_len", 20),
        ("mqar", "placement", "random"),
        ("mqar", "vocab_size", 10),
        ("s5", "min_length", 0),
        ("s5", "max_length", True),
    ],
)
def test_config_validation_names_the_field(name: str, field: str, value: object) -> None:
    config_name = TASKS[name].config_type.__name__
    with pytest.raises(ValueError, match="^" + re.escape(f"{config_name}.{field}={value!r}: expected")):
        make_task(name, **{field: value})


def test_registry_and_argument_errors() -> None:
    assert set(TASKS) == {"frjt", "maze", "mqar", "s5"}
    with pytest.raises(ValueError, match="name='lm'"):
        make_task("lm")
    with pytest.raises(ValueError, match=r"S5Config\.length: unknown field"):
        make_task("s5", length=4)
    task = make_task("s5")
    with pytest.raises(ValueError, match="seed=-1"):
        task.batch(2, seed=-1)
    with pytest.raises(ValueError, match=r"batch\.n=0"):
        task.batch(0, seed=0)
    with pytest.raises(ValueError, match="expected a S5Config"):
        S5Task(MQARConfig())
    with pytest.raises(ValueError, match=r"LengthCurriculum\.final_length=2"):
        LengthCurriculum(start_length=4, final_length=2)
