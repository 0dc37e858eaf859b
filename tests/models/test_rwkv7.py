"""The RWKV-7 baseline: ChainGPT's state layer with M = 1 and no attention."""

import pytest
import torch

from rcswarm.models import registry
from rcswarm.models.baselines import RWKV7Config
from rcswarm.models.chaingpt import RWKVProduct


def test_shapes_causality_and_determinism():
    model = registry.build_model("rwkv7", "tiny", {"vocab_size": 20, "num_classes": 7}, seed=3)
    tokens = torch.randint(0, 20, (2, 13), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 20
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 13, 7)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])
    again = registry.build_model("rwkv7", "tiny", {"vocab_size": 20, "num_classes": 7}, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))


def test_its_layers_are_single_substep_state_layers_without_attention():
    model = registry.build_model("rwkv7", "tiny", seed=0)
    mixers = [layer.mixer for layer in model.layers]
    assert all(isinstance(m, RWKVProduct) for m in mixers)
    assert model.config.layer_config().substeps == 1
    assert not any("attention" in name or "sgsa" in name.lower() for name, _ in model.named_modules())


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="RWKV7Config.n_layers=0"):
        RWKV7Config(n_layers=0)
    with pytest.raises(ValueError, match="RWKV7Config.d_model=30"):
        RWKV7Config(d_model=30, head_dim=16)


def test_it_learns_to_copy_the_previous_token():
    torch.manual_seed(0)
    model = registry.build_model("rwkv7", "tiny", {"vocab_size": 8}, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(60):
        tokens = torch.randint(0, 8, (8, 16), generator=gen)
        logits = model(tokens)[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 8), tokens[:, :-1].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_an_odd_head_size_builds_and_errors_name_rwkv7s_own_fields():
    """RWKV7 has no attention, yet its layer config passed its head size to ChainGPT's attention fields: an odd head
    size was refused as `ChainGPTConfig.attn_head_dim` (RoPE pairs), and num_classes = 0 was named as ChainGPTConfig's
    (review of the models, 2026-11-28)."""
    model = registry.build_model("rwkv7", "tiny", {"head_dim": 15, "d_model": 45}, seed=0)
    logits = model(torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(0)))
    assert logits.shape == (1, 9, 256) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match=r"RWKV7Config\.num_classes=0"):
        RWKV7Config(num_classes=0)
