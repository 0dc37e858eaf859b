"""`data_problem` refuses, naming the key, what a fuzz review of the data checks found accepted (2026-11-29).

H1: a held-out (or training) window longer than the real "stdlib" split: the check assumed the corpus holds
data.max_bytes and skipped max_bytes = 0, so every worker died at its first held-out window. H3: a diagnostic
[data.task_config] that hung or ran out of memory in the check, or passed and killed the worker at its first
batch. M1: a frame model whose char_vocab or n_styles cannot embed the typing frames' cells (IndexError in the
first step).
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

from rcswarm.config.runspec import RunSpec
from rcswarm.data.text import split_boundary
from rcswarm.models import registry
from rcswarm.train import inner
from rcswarm.train.inner import data_problem, make_sampler

LSTM = {"name": "lstm_lm", "preset": "tiny"}
WIDE_LSTM = {"name": "lstm", "preset": "tiny", "overrides": {"vocab_size": 4096, "num_classes": 4096}}
FRAME = {"name": "frame", "preset": "tiny"}


def spec_of(model: dict, data: dict, **tables: dict) -> RunSpec:
    return RunSpec.from_dict({"run": {"name": "t", **tables.pop("run", {})}, "model": model, "data": data, **tables})


def whole_corpus() -> int:
    return len(inner._stdlib_corpus(None))


def test_a_held_out_window_longer_than_the_whole_corpus_split_is_refused():
    """max_bytes = 0: the whole corpus; its held-out split (~607 KB) is shorter than run.eval_seq_len."""
    size = whole_corpus()
    held_out = size - split_boundary(size, 0.05)
    spec = spec_of(LSTM, {"seq_len": 16}, run={"eval_every": 1, "eval_seq_len": held_out})
    problem = data_problem(spec)
    assert problem is not None and problem.startswith(
        f"run.eval_seq_len = {held_out}: data.max_bytes = 0 (the whole corpus, {size} bytes) with data.val_fraction = "
        f"0.05 leaves a held-out split of {held_out} bytes, shorter than a window of {held_out} positions"), problem
    assert data_problem(spec_of(LSTM, {"seq_len": 16}, run={"eval_every": 1, "eval_seq_len": held_out - 1})) is None


def test_the_review_snippets_are_refused_naming_the_key():
    size = whole_corpus()
    if size - split_boundary(size, 0.05) < 700_001:
        problem = data_problem(spec_of(LSTM, {"seq_len": 16}, run={"eval_every": 1, "eval_seq_len": 700_000}))
        assert problem is not None and problem.startswith("run.eval_seq_len = 700000: ") and "data.val_fraction" in problem
    if size - split_boundary(size, 0.001) < 16_385:
        problem = data_problem(spec_of(LSTM, {"seq_len": 16384, "val_fraction": 0.001}))
        assert problem is not None and problem.startswith("data.seq_len = 16384: ") and (
            f"data.val_fraction = 0.001 leaves a held-out split of {size - split_boundary(size, 0.001)} bytes") in problem


def test_max_bytes_beyond_the_corpus_is_checked_against_the_corpus():
    """max_bytes = 20,000,000 > the corpus: the split is cut from what the corpus holds, not from max_bytes."""
    size = whole_corpus()
    held_out = size - split_boundary(size, 0.05)
    spec = spec_of(LSTM, {"seq_len": 16, "max_bytes": size * 2}, run={"eval_seq_len": held_out})
    problem = data_problem(spec)
    assert problem is not None and problem.startswith(
        f"run.eval_seq_len = {held_out}: data.max_bytes = {size * 2} (the corpus holds only {size} bytes)"), problem


def test_a_training_length_longer_than_the_training_split_is_refused_naming_its_key():
    problem = data_problem(spec_of(LSTM, {"seq_len": 16, "max_bytes": 2000}, run={"eval_seq_len": 16},
                                   curriculum={"schedule": [[0, 16, 2], [5, 4096, 1]]}))
    assert problem is not None and problem.startswith("curriculum.schedule = ") and \
        "leaves a training split of 1900 bytes" in problem, problem


@pytest.mark.parametrize(
    "task, key, value",
    [
        ("frjt", "label_pool", 2**31),  # built 2^31 label names: MemoryError or a hang in the check
        ("frjt", "label_pool", 2**63 - 1),
        ("mqar", "vocab_size", 2**31),
        ("mqar", "seq_len", 2**31),
        ("mqar", "num_kv_pairs", 2**31),
        ("frjt", "ops_per_block", 2**31),  # accepted; the sampler asked for 64 GiB
        ("frjt", "max_depth", 4096),  # accepted; drawing a program is quadratic in its depth
        ("maze", "num_moves", 2**31),  # accepted; the sampler hung
        ("s5", "max_length", 2**31),
        ("s5", "min_length", 2**31),
        ("frjt", "p_near", 5e-324),  # accepted; ZeroDivisionError at the first batch
    ],
)
def test_a_task_config_that_hung_or_killed_the_worker_is_refused_at_once_naming_the_field(task, key, value):
    config = {key: value, **({"label_pool": 4096} if key == "max_depth" else {})}
    spec = spec_of(WIDE_LSTM, {"source": "diag", "task": task, "seq_len": 16, "batch_size": 2, "task_config": config})
    start = time.perf_counter()
    problem = data_problem(spec)
    assert time.perf_counter() - start < 1.0
    assert problem is not None and f".{key}=" in problem, problem


def test_a_batch_of_too_many_positions_is_refused_naming_the_batch_and_the_length():
    spec = spec_of(WIDE_LSTM, {"source": "diag", "task": "s5", "batch_size": 4, "task_config": {"max_length": 2**20}})
    problem = data_problem(spec)
    assert problem is not None and problem.startswith(
        "data.batch_size = 4 with data.task_config.max_length = 1048576: examples of up to 1048576 tokens make "
        "4194304 positions a batch; expected at most 2097152"), problem


def test_an_arithmetic_failure_building_the_task_names_the_task_config(monkeypatch):
    """What the config checks miss still ends in a message naming data.task_config.<field>, not a traceback."""
    def boom(name, **config):
        raise MemoryError()

    monkeypatch.setattr(inner, "make_task", boom)
    spec = spec_of(WIDE_LSTM, {"source": "diag", "task": "frjt", "task_config": {"label_pool": 100}})
    problem = data_problem(spec)
    assert problem is not None and problem.startswith(
        "data.task_config.label_pool = 100: task 'frjt' raised MemoryError building the task"), problem


def test_an_arithmetic_failure_drawing_a_batch_names_the_fields_set(monkeypatch):
    from rcswarm.data.diagnostics import FRJTTask

    spec = spec_of(WIDE_LSTM, {"source": "diag", "task": "frjt", "task_config": {"p_near": 0.25}})
    config = registry.make_config("lstm", "tiny", WIDE_LSTM["overrides"])
    sampler = make_sampler(spec.data, seed=0, model_config=config)

    def divide(self, rng):
        return 1 / 0

    monkeypatch.setattr(FRJTTask, "sample", divide)
    with pytest.raises(ValueError, match=r"^data\.task_config\.p_near = 0\.25: task 'frjt' raised ZeroDivisionError "
                                         r"drawing a batch"):
        sampler.next_batch()


def test_a_tiny_p_near_the_law_can_normalise_samples():
    spec = spec_of(WIDE_LSTM, {"source": "diag", "task": "frjt", "task_config": {"p_near": 1e-15}})
    assert data_problem(spec) is None
    config = registry.make_config("lstm", "tiny", WIDE_LSTM["overrides"])
    tokens, targets = make_sampler(spec.data, seed=0, model_config=config).next_batch()
    assert tokens.shape == targets.shape


def test_a_typing_minimum_no_document_reaches_blames_min_document_chars():
    """Before: "TypingConfig.n_documents=64: expected at most 0" at the worker, for min_document_chars = 2^31."""
    problem = data_problem(spec_of(FRAME, {"source": "typing", "task_config": {"min_document_chars": 2**31}}))
    assert problem is not None and problem.startswith("TypingConfig.min_document_chars=2147483648: expected at most "), \
        problem


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"char_vocab": 3}, '[model.overrides] char_vocab = 3: data.source = "typing" types a charset of '),
        ({"char_vocab": 32}, "[model.overrides] char_vocab = 32: "),  # the empty cell is a space, id 32
        ({"char_vocab": 64}, "[model.overrides] char_vocab = 64: "),  # letters and punctuation would share ids
        ({"n_styles": 1}, '[model.overrides] n_styles = 1: data.source = "typing" frames use 4 styles'),
        ({"n_styles": 3}, "expected n_styles >= 4"),
    ],
)
def test_a_frame_model_that_cannot_embed_the_typing_cells_is_refused(overrides, expected):
    """Accepted before; the first step raised IndexError in the char or style embedding."""
    spec = spec_of({**FRAME, "overrides": overrides}, {"source": "typing", "task_config": {"n_documents": 4}})
    problem = data_problem(spec)
    assert problem is not None and expected in problem, problem
    config = registry.make_config("frame", "tiny", overrides)
    with pytest.raises(ValueError, match=r"^\[model\.overrides\] "):
        make_sampler(spec.data, seed=0, model_config=config)


@pytest.mark.parametrize("overrides", [{}, {"char_vocab": 127}, {"n_styles": 4}])
def test_a_frame_model_that_embeds_the_typing_cells_trains_a_step(overrides):
    from rcswarm.train.inner import make_inner_optimizer, train_step

    spec = spec_of({**FRAME, "overrides": overrides}, {"source": "typing", "seq_len": 4, "batch_size": 1,
                                                       "task_config": {"n_documents": 4}})
    assert data_problem(spec) is None
    model = registry.build_model("frame", "tiny", overrides, seed=0)
    frames, actions = make_sampler(spec.data, seed=0, model_config=model.config).next_batch()
    assert frames.shape[:2] == actions.shape
    loss = train_step(model, make_inner_optimizer(model, spec.inner), frames, actions, grad_clip=1.0)
    assert math.isfinite(loss)  # the step ran through both embeddings


@pytest.mark.parametrize("data, tables, key", [
    ({"seq_len": 100_000}, {}, "data.seq_len = 100000"),
    ({"seq_len": 16}, {"run": {"eval_seq_len": 100_000}}, "run.eval_seq_len = 100000"),
])
def test_a_typing_window_longer_than_the_typing_stream_is_refused_naming_the_key(data, tables, key):
    """The same gap as H1 for the typing source: every worker died building its source."""
    spec = spec_of(FRAME, {"source": "typing", **data, "task_config": {"n_documents": 4}}, **tables)
    problem = data_problem(spec)
    assert problem is not None and problem.startswith(f"{key}: windows of 100000 steps, longer than the typing "
                                                       "stream's "), problem
    config = registry.make_config("frame", "tiny", {})
    with pytest.raises(ValueError, match="expected at most the stream's"):
        make_sampler(dataclasses.replace(spec.data, seq_len=100_000), seed=0, model_config=config)
