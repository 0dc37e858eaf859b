"""The same seed gives the same draws in another process: models, byte windows, diagnostic tasks, typing frames."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import torch

from rcswarm.data.diagnostics import make_task
from rcswarm.data.frames import FrameWindowSpec, TypingFrameSource
from rcswarm.data.text import ByteWindowSampler
from rcswarm.models import registry
from tests.helpers.data import CONFIG, SMALL_CONFIGS, batch_digest


def _state_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def test_seeded_build_is_identical_in_another_process() -> None:
    here = _state_digest(registry.build_model("lstm_lm", "tiny", {"n_layers": 2}, seed=3))
    script = textwrap.dedent(
        """
        import hashlib, torch
        from rcswarm.models import registry
        torch.manual_seed(999)
        model = registry.build_model("lstm_lm", "tiny", {"n_layers": 2}, seed=3)
        digest = hashlib.sha256()
        for name, tensor in model.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        print(digest.hexdigest())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == here


def test_sampler_is_identical_in_another_process(corpus: bytes) -> None:
    sampler = ByteWindowSampler(corpus, seq_len=16, batch_size=3, seed=11)
    sampler.next_batch()
    here = sampler.next_batch()[0].tolist()
    script = textwrap.dedent(
        """
        from rcswarm.data.text import ByteWindowSampler, load_stdlib_corpus
        sampler = ByteWindowSampler(load_stdlib_corpus(max_bytes=200_000), 16, 3, 11)
        sampler.next_batch()
        print(sampler.next_batch()[0].tolist())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == str(here)


def test_batches_are_identical_in_another_process() -> None:
    here = {name: batch_digest(make_task(name, **cfg).batch(6, seed=99)) for name, cfg in SMALL_CONFIGS.items()}
    script = textwrap.dedent(
        f"""
        import hashlib
        from rcswarm.data.diagnostics import make_task
        for name, cfg in {SMALL_CONFIGS!r}.items():
            b = make_task(name, **cfg).batch(6, seed=99)
            digest = hashlib.sha256()
            for t in (b.tokens, b.targets, b.mask, b.lengths, *b.meta.values(), *b.position_meta.values()):
                digest.update(t.numpy().tobytes())
            print(name, digest.hexdigest())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout
    there = dict(line.split() for line in out.strip().splitlines())
    assert there == here


FINGERPRINT = """
import hashlib, sys
from rcswarm.data.frames import FrameWindowSpec, TypingConfig, TypingFrameSource
source = TypingFrameSource(TypingConfig(rows=12, cols=40, char_vocab=256, n_documents=16),
                           FrameWindowSpec(batch_size=2, window=64, seed=5))
frames, actions = source.next_batch()
print(hashlib.sha256(frames.numpy().tobytes() + actions.numpy().tobytes()).hexdigest())
print(sorted(m for m in sys.modules if m.startswith("rcswarm.") and not m.startswith("rcswarm.data")))
"""


def test_another_process_draws_the_same_batch_and_data_imports_nothing_else_of_ours() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FINGERPRINT], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    frames, actions = TypingFrameSource(CONFIG, FrameWindowSpec(batch_size=2, window=64, seed=5)).next_batch()
    assert out[0] == hashlib.sha256(frames.numpy().tobytes() + actions.numpy().tobytes()).hexdigest()
    assert out[1] == "[]"
