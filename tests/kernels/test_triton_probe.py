"""`kernels/triton_probe.on_tensor_device`: an autograd Function's step runs with the current CUDA device set to its
tensors' (Triton launches on the current device). Here: the pass-through on the CPU; the switch needs 2 GPUs."""

from __future__ import annotations

import pytest
import torch

from rcswarm.kernels.triton_probe import on_tensor_device


def _current_device_of(ctx: object, x: object, scale: float) -> tuple[object, int | None, float]:
    return ctx, torch.cuda.current_device() if torch.cuda.is_available() else None, scale


def test_cpu_tensors_and_other_arguments_pass_through() -> None:
    step = on_tensor_device(_current_device_of)
    ctx = object()
    assert step(ctx, torch.ones(2), 3.0)[0] is ctx and step(ctx, torch.ones(2), 3.0)[2] == 3.0
    assert step.__name__ == "_current_device_of"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="switching devices needs two GPUs")
def test_a_step_on_the_second_gpu_runs_with_it_current() -> None:
    torch.cuda.set_device(0)
    assert on_tensor_device(_current_device_of)(None, torch.ones(2, device="cuda:1"), 1.0)[1] == 1
    assert torch.cuda.current_device() == 0
