"""Tests of the stdlib byte corpus and the byte window sampler."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from rcswarm.data.text import ByteWindowSampler, load_stdlib_corpus, stdlib_source_files


def test_stdlib_source_files_are_sorted_python_sources_outside_excluded_dirs() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_source_files()
    assert len(files) > 100
    relative = [f.relative_to(root).as_posix() for f in files]
    assert relative == sorted(relative)
    assert all(r.endswith(".py") for r in relative)
    assert "os.py" in relative
    assert "json/decoder.py" in relative
    for r in relative:
        parts = set(Path(r).parts[:-1])
        assert not parts & {"site-packages", "dist-packages", "test", "tests", "__pycache__"}, r
    assert files == stdlib_source_files()


def test_corpus_is_deterministic_nonempty_and_truncated() -> None:
    a = load_stdlib_corpus(max_bytes=300_000)
    b = load_stdlib_corpus(max_bytes=300_000)
    assert a == b
    assert len(a) == 300_000
    assert a.startswith(b"# file: ")
    assert a.count(b"\n# file: ") >= 1
    assert load_stdlib_corpus(max_bytes=1000) == a[:1000]


def test_full_corpus_contains_every_file_in_order() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_source_files()
    corpus = load_stdlib_corpus()
    expected_len = sum(
        len(f"# file: {f.relative_to(root).as_posix()}\n".encode()) + f.stat().st_size
        for f in files
    )
    assert len(corpus) == expected_len
    first = files[0]
    header = f"# file: {first.relative_to(root).as_posix()}\n".encode()
    assert corpus.startswith(header + first.read_bytes())


def test_corpus_of_custom_root_and_empty_root(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "b.py").write_bytes(b"B\n")
    (tmp_path / "a.py").write_bytes(b"A\n")
    (tmp_path / "notes.txt").write_bytes(b"ignored\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_bytes(b"ignored\n")
    assert load_stdlib_corpus(root=tmp_path) == b"# file: a.py\nA\n# file: pkg/b.py\nB\n"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert stdlib_source_files(empty) == []
    with pytest.raises(FileNotFoundError, match="no .py files found"):
        load_stdlib_corpus(root=empty)


@pytest.mark.parametrize("max_bytes", [0, -5, 1.5, True])
def test_corpus_rejects_bad_max_bytes(max_bytes: object) -> None:
    with pytest.raises(ValueError, match="max_bytes=.*positive int or None"):
        load_stdlib_corpus(max_bytes=max_bytes)  # type: ignore[arg-type]


def test_sampler_same_seed_same_batches_different_seed_differs(corpus: bytes) -> None:
    a = ByteWindowSampler(corpus, seq_len=32, batch_size=4, seed=5)
    b = ByteWindowSampler(corpus, seq_len=32, batch_size=4, seed=5)
    c = ByteWindowSampler(corpus, seq_len=32, batch_size=4, seed=6)
    batches_a = [a.next_batch() for _ in range(3)]
    batches_b = [b.next_batch() for _ in range(3)]
    batches_c = [c.next_batch() for _ in range(3)]
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(batches_a[0][0], batches_a[1][0])
    assert not all(torch.equal(xa, xc) for (xa, _), (xc, _) in zip(batches_a, batches_c))


def test_batches_are_corpus_windows_with_shifted_targets(corpus: bytes) -> None:
    sampler = ByteWindowSampler(corpus, seq_len=48, batch_size=8, seed=0)
    inputs, targets = sampler.next_batch()
    assert inputs.shape == targets.shape == (8, 48)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.is_contiguous() and targets.is_contiguous()
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    start, end = sampler.split_bounds
    for row_in, row_tgt in zip(inputs.tolist(), targets.tolist()):
        window = bytes(row_in + row_tgt[-1:])
        assert window in corpus[start:end]
    assert sampler.tokens_per_batch == 8 * 48


def test_train_and_val_splits_are_disjoint() -> None:
    corpus = b"a" * 950 + b"b" * 50
    train = ByteWindowSampler(corpus, seq_len=20, batch_size=64, seed=0, split="train")
    val = ByteWindowSampler(corpus, seq_len=20, batch_size=64, seed=0, split="val")
    assert train.split_bounds == (0, 950)
    assert val.split_bounds == (950, 1000)
    for _ in range(20):
        train_inputs, train_targets = train.next_batch()
        val_inputs, val_targets = val.next_batch()
        assert (train_inputs == ord("a")).all() and (train_targets == ord("a")).all()
        assert (val_inputs == ord("b")).all() and (val_targets == ord("b")).all()


def test_window_may_fill_the_split_exactly() -> None:
    corpus = bytes(range(100)) * 10
    sampler = ByteWindowSampler(corpus, seq_len=949, batch_size=2, seed=0)
    inputs, targets = sampler.next_batch()
    assert inputs[0].tolist() == list(corpus[:949])
    assert targets[1].tolist() == list(corpus[1:950])


def test_split_shorter_than_window_is_rejected() -> None:
    corpus = b"x" * 1000
    with pytest.raises(
        ValueError, match=r"'train' split has 950 bytes.*at least seq_len \+ 1 = 951"
    ):
        ByteWindowSampler(corpus, seq_len=950, batch_size=1, seed=0)
    with pytest.raises(ValueError, match=r"'val' split has 50 bytes"):
        ByteWindowSampler(corpus, seq_len=50, batch_size=1, seed=0, split="val")
    with pytest.raises(ValueError, match=r"'val' split has 0 bytes"):
        ByteWindowSampler(corpus, seq_len=4, batch_size=1, seed=0, split="val", val_fraction=0.0)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"seq_len": 0}, r"seq_len=0.*positive int"),
        ({"batch_size": 2.0}, r"batch_size=2\.0.*positive int"),
        ({"seed": -1}, r"seed=-1.*non-negative int"),
        ({"split": "test"}, r"split='test'.*\('train', 'val'\)"),
        ({"val_fraction": 1.0}, r"val_fraction=1\.0.*0 <= val_fraction < 1"),
        ({"corpus": "text"}, r"corpus of type str.*bytes"),
    ],
)
def test_sampler_validation_messages(kwargs: dict, pattern: str) -> None:
    arguments = {"corpus": b"y" * 1000, "seq_len": 8, "batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        ByteWindowSampler(**arguments)


def test_sampler_repr_omits_corpus() -> None:
    sampler = ByteWindowSampler(b"z" * 10_000, seq_len=8, batch_size=2, seed=0)
    assert "zzz" not in repr(sampler)
