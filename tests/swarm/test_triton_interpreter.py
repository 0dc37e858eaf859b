"""The Triton kernels under Triton's interpreter on the CPU, each in a subprocess: TRITON_INTERPRET=1 must be set
before triton is imported and must not leak into the test process (kernels/rwkv_product, kernels/sgsa)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.kernels import SGSA_CHILD_ENV

TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
SGSA_TESTS = Path(__file__).resolve().parents[1] / "kernels" / "test_sgsa.py"


TRITON_SCRIPT = """
import json, sys
import torch
from rcswarm.kernels.rwkv_product import rwkv_product_naive
from rcswarm.kernels.rwkv_product.triton_kernel import rwkv_product_triton


def compare(batch, length, heads, d_k, d_v, chunk, with_state, w_shift, block_v, dtype_name):
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(length * 31 + d_k)
    kappa = torch.nn.functional.normalize(torch.randn(batch, length, heads, d_k, generator=g, dtype=dtype), dim=-1)
    inputs = {
        "r": torch.randn(batch, length, heads, d_k, generator=g, dtype=dtype),
        "w_raw": torch.randn(batch, length, heads, d_k, generator=g, dtype=dtype) + w_shift,
        "k": torch.randn(batch, length, heads, d_k, generator=g, dtype=dtype) / d_k**0.5,
        "v": torch.randn(batch, length, heads, d_v, generator=g, dtype=dtype),
        "a": -kappa,
        "b": kappa * torch.rand(batch, length, heads, d_k, generator=g, dtype=dtype),
    }
    if with_state:
        inputs["initial_state"] = torch.randn(batch, heads, d_v, d_k, generator=g, dtype=dtype)
    y_cotangent = torch.randn(batch, length, heads, d_v, generator=g, dtype=dtype)
    s_cotangent = torch.randn(batch, heads, d_v, d_k, generator=g, dtype=dtype)
    results = []
    for run in (rwkv_product_naive, lambda *xs: rwkv_product_triton(*xs, chunk_size=chunk, block_v=block_v)):
        leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items()}
        y, state = run(*leaves.values()) if with_state else run(*leaves.values(), None)
        grads = torch.autograd.grad((y * y_cotangent).sum() + (state * s_cotangent).sum(), list(leaves.values()))
        results.append({"y": y, "final_state": state, **dict(zip(leaves, grads))})
    reference, got = results
    return {
        name: {
            "error": float((got[name] - reference[name]).norm() / reference[name].norm()),
            "finite": bool(torch.isfinite(got[name]).all()),
            "dtype": str(got[name].dtype),
        }
        for name in reference
    }


def strong_decays():
    # float32 with w_raw = 90 at some steps (e^90 overflows float32) against the naive loop in float64.
    g = torch.Generator().manual_seed(5)
    shape = (1, 12, 2, 4)
    kappa = torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)
    inputs = {"r": torch.randn(*shape, generator=g), "w_raw": torch.randn(*shape, generator=g),
              "k": torch.randn(*shape, generator=g) / 2, "v": torch.randn(1, 12, 2, 3, generator=g), "a": -kappa,
              "b": kappa * torch.rand(*shape, generator=g), "initial_state": torch.randn(1, 2, 3, 4, generator=g)}
    inputs["w_raw"][:, 3:5] = 90.0
    y_cotangent = torch.randn(1, 12, 2, 3, generator=g)
    results = []
    for run, dtype in ((rwkv_product_naive, torch.float64),
                       (lambda *xs: rwkv_product_triton(*xs, chunk_size=4), torch.float32)):
        leaves = {name: x.to(dtype).requires_grad_(True) for name, x in inputs.items()}
        y, state = run(*leaves.values())
        grads = torch.autograd.grad((y * y_cotangent.to(dtype)).sum() + state.sum(), list(leaves.values()))
        results.append({"y": y, "final_state": state, **dict(zip(leaves, grads))})
    reference, got = results
    return {name: {"error": float((got[name].double() - reference[name]).norm() / reference[name].norm()),
                   "finite": bool(torch.isfinite(got[name]).all())} for name in reference}


torch.set_num_threads(1)
reports = [compare(*case) for case in json.loads(sys.argv[1])]
strong = strong_decays()
x = torch.zeros(1, 2, 1, 2)
try:
    rwkv_product_triton(x, x, x, x, x, x, None, chunk_size=0)
    bad_chunk = "no error"
except ValueError as error:
    bad_chunk = str(error)
try:
    rwkv_product_triton(x, x, x, x, x, x, None, block_v=12)
    bad_block = "no error"
except ValueError as error:
    bad_block = str(error)
print(json.dumps({"reports": reports, "strong": strong, "bad_chunk": bad_chunk, "bad_block": bad_block}))
"""


TRITON_CASES = [
    # (batch, length, heads, d_k, d_v, chunk, with initial state, w_raw shift, block_v, dtype, tolerance):
    # T off the chunk grid with several heads, T below one chunk, d not a power of two with
    # d_v split over two row blocks (partial sums), strong decay, float64; fewer rows per program
    # (5 row blocks of 8, the last one ragged at d_v = 37; one row per program).
    (2, 11, 3, 8, 8, 4, True, 0.0, None, "float32", 1e-4),
    (1, 5, 2, 16, 8, 8, False, 0.0, None, "float32", 1e-4),
    (1, 9, 2, 6, 40, 4, True, 0.0, None, "float32", 1e-4),
    (1, 7, 1, 4, 4, 3, True, 4.0, None, "float32", 1e-4),
    (2, 10, 2, 5, 3, 4, True, 0.0, None, "float64", 1e-10),
    (1, 9, 2, 6, 37, 4, True, 0.0, 8, "float32", 1e-4),
    (2, 6, 1, 4, 3, 4, False, 0.0, 1, "float64", 1e-10),
]


@pytest.fixture(scope="module")
def triton_interpreter_run() -> dict:
    """All TRITON_CASES in one subprocess with TRITON_INTERPRET=1 (the variable must be set before
    triton is imported and must not leak into this process; one process keeps the import cost
    to one). Skips when triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    cases = [list(case[:-1]) for case in TRITON_CASES]
    completed = subprocess.run(
        [sys.executable, "-c", TRITON_SCRIPT, json.dumps(cases)],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(TRITON_CASES)))
def test_triton_interpreter_matches_naive(triton_interpreter_run: dict, index: int) -> None:
    """The Triton kernels under the interpreter on CPU tensors: forward, final state and every
    gradient against autograd through the naive loop."""
    *shape, dtype_name, tolerance = TRITON_CASES[index]
    report = triton_interpreter_run["reports"][index]
    expected = {"y", "final_state", "r", "w_raw", "k", "v", "a", "b"} | ({"initial_state"} if shape[6] else set())
    assert set(report) == expected
    for name, entry in report.items():
        assert entry["finite"], name
        assert entry["dtype"] == f"torch.{dtype_name}", name
        assert entry["error"] <= tolerance, (name, entry)


def test_triton_decays_past_float32s_exponent_give_finite_gradients(triton_interpreter_run: dict) -> None:
    """w_raw = 90 at two steps of every row, float32 (e^90 overflows; the decay is 0): the w_raw gradient was
    0 · ∞ = NaN (review of the eighteenth session); now every output and gradient is finite and within 1e-4 of
    the naive loop in float64."""
    for name, entry in triton_interpreter_run["strong"].items():
        assert entry["finite"] and entry["error"] <= 1e-4, (name, entry)


def test_triton_bad_chunk_raises(triton_interpreter_run: dict) -> None:
    assert "chunk_size=0" in triton_interpreter_run["bad_chunk"]


def test_triton_bad_block_v_raises(triton_interpreter_run: dict) -> None:
    assert "block_v=12" in triton_interpreter_run["bad_block"] and "power of two" in triton_interpreter_run["bad_block"]


SCAN_SCRIPT = """
import json
import torch
from rcswarm.kernels.rwkv_product import chunked, rwkv_product_chunked, rwkv_product_naive
from rcswarm.kernels.rwkv_product.state_scan import state_scan_naive_
from rcswarm.kernels.rwkv_product.state_scan_triton import state_scan_triton_

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
errors = {}
for chunks, heads, d_v, d_k in ((5, 3, 40, 24), (3, 2, 16, 16), (1, 1, 7, 5)):
    x = torch.randn(chunks + 1, heads, d_v, d_k, generator=g)
    m = torch.randn(chunks, heads, d_k, d_k, generator=g) / d_k**0.5
    for reverse in (False, True):
        want = state_scan_naive_(x.clone(), m, reverse)
        got = state_scan_triton_(x.clone(), m, reverse)
        errors[f"scan N={chunks} BH={heads} d_v={d_v} d_k={d_k} reverse={reverse}"] = float(
            (got - want).abs().max() / want.abs().max())
# The chunked path with the kernel as its scan (as on CUDA), forward and every gradient against the naive loop.
chunked.state_scan_ = lambda x, m, reverse=False: state_scan_triton_(x, m.contiguous(), reverse)
batch, length, heads, d = 2, 37, 2, 24
kappa = torch.nn.functional.normalize(torch.randn(batch, length, heads, d, generator=g), dim=-1)
shape = (batch, length, heads, d)
inputs = {"r": torch.randn(*shape, generator=g), "w_raw": torch.randn(*shape, generator=g),
          "k": torch.randn(*shape, generator=g) / d**0.5, "v": torch.randn(*shape, generator=g), "a": -kappa, "b": kappa * torch.rand(batch, length, heads, d, generator=g),
          "initial_state": torch.randn(batch, heads, d, d, generator=g)}
results = []
for run in (rwkv_product_naive, lambda *xs: rwkv_product_chunked(*xs, chunk_size=8)):
    leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items()}
    y, state = run(*leaves.values())
    grads = torch.autograd.grad(y.square().sum() + state.sin().sum(), list(leaves.values()))
    results.append({"y": y, "final_state": state, **dict(zip(leaves, grads))})
for name in results[0]:
    want, got = results[0][name].detach(), results[1][name].detach()
    errors[f"chunked {name}"] = float((got - want).norm() / want.norm())
print(json.dumps(errors))
"""


@pytest.mark.skipif(not TRITON_INSTALLED, reason="triton is not installed")
def test_the_state_scan_kernel_matches_the_loop_and_carries_the_chunked_path() -> None:
    """kernels/rwkv_product/state_scan_triton.py under the interpreter: forward and reverse scans against the loop
    (ragged d_v, d_k, one chunk), and the chunked path run with it as its scan against the naive recurrence."""
    completed = subprocess.run([sys.executable, "-c", SCAN_SCRIPT], env={**os.environ, "TRITON_INTERPRET": "1"},
                               capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    errors = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(errors) == 6 + 9, errors
    for name, error in errors.items():
        assert error <= (1e-5 if name.startswith("scan") else 1e-4), (name, error)


@pytest.mark.skipif(not TRITON_INSTALLED, reason="triton is not installed")
def test_triton_kernels_in_interpreter() -> None:
    """Runs tests/kernels/test_sgsa.py's `test_triton_child_*` tests in a pytest subprocess with TRITON_INTERPRET=1,
    which must be set before triton is imported; this process never imports triton."""
    env = {**os.environ, "TRITON_INTERPRET": "1", SGSA_CHILD_ENV: "1"}
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(SGSA_TESTS), "-k",
               "triton_child"]
    result = subprocess.run(command, check=False, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
