"""Every registered token model (all families but frame) checks its token input the same way.

`rcswarm.models.inputs.check_inputs`: a 2-D integer [batch, time] with time >= 1, else a
ValueError naming the shape (and dtype); an empty batch gives an empty output.
"""

from __future__ import annotations

import pytest
import torch

from rcswarm.models import registry

TOKEN_FAMILIES = [name for name in registry.list_models() if name != "frame"]


def _tiny(name: str) -> torch.nn.Module:
    return registry.build_model(name, "tiny", seed=0).eval()


def test_every_shipped_token_family_is_covered() -> None:
    assert {"chaingpt", "lstm_lm", "psm", "rwkv7", "lstm", "ssm", "sum", "transformer"} <= set(TOKEN_FAMILIES)


@pytest.mark.parametrize("name", TOKEN_FAMILIES)
@pytest.mark.parametrize(
    ("inputs", "pattern"),
    [
        (torch.zeros(2, 0, dtype=torch.long), r"inputs has shape \(2, 0\): expected time >= 1"),
        (torch.zeros(2, 3), r"inputs has shape \(2, 3\) and dtype torch\.float32: expected \[batch, time\] integer"),
        (torch.zeros(3, dtype=torch.long), r"inputs has shape \(3,\) and dtype torch\.int64: expected \[batch, time\]"),
        (torch.zeros(1, 2, 3, dtype=torch.long), r"inputs has shape \(1, 2, 3\) and dtype .*expected \[batch, time\]"),
        (torch.zeros(2, 3, dtype=torch.bool), r"inputs has shape \(2, 3\) and dtype torch\.bool: expected"),
    ],
    ids=["T=0", "float", "1-D", "3-D", "bool"],
)
def test_bad_token_inputs_raise_value_error(name: str, inputs: torch.Tensor, pattern: str) -> None:
    model = _tiny(name)
    with torch.no_grad(), pytest.raises(ValueError, match=pattern):
        model(inputs)


@pytest.mark.parametrize("name", TOKEN_FAMILIES)
def test_empty_batch_gives_empty_logits(name: str) -> None:
    model = _tiny(name)
    with torch.no_grad():
        classes = model(torch.zeros(1, 5, dtype=torch.long)).shape[-1]  # [1, T, V]
        logits = model(torch.zeros(0, 5, dtype=torch.long))  # [0, T, V]
    assert logits.shape == (0, 5, classes)
    assert logits.is_floating_point()


@pytest.mark.parametrize("name", TOKEN_FAMILIES)
def test_empty_batch_in_training_mode(name: str) -> None:
    model = registry.build_model(name, "tiny", seed=0).train()
    classes = model(torch.zeros(1, 4, dtype=torch.long)).shape[-1]  # [1, T, V]
    assert model(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, classes)
