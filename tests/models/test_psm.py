"""Transformer-PSM: sequential-parallel duality, causality, compression variants."""

import pytest
import torch

from rcswarm.models.psm import TransformerPSM, TransformerPSMConfig


def make(chunk: int, compression: str = "right_half", dtype=torch.float64, seed: int = 0) -> TransformerPSM:
    torch.manual_seed(seed)
    config = TransformerPSMConfig(vocab_size=11, d_model=16, n_heads=2, agg_layers=2, inf_layers=1,
                                  chunk_size=chunk, compression=compression)
    model = TransformerPSM(config).to(dtype).eval()
    with torch.no_grad():  # non-trivial values everywhere, including the learned identity
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("chunk, length", [(1, 1), (1, 11), (3, 3), (3, 17), (4, 21), (5, 9)])
@pytest.mark.parametrize("compression", ["right_half", "linear"])
def test_training_predictions_equal_streaming_predictions(chunk, length, compression):
    model = make(chunk, compression)
    tokens = torch.randint(0, 11, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        parallel = model(tokens)  # [B, T, V]
        stream = model.stream(batch_size=2)
        sequential = torch.stack([stream.step(tokens[:, t]) for t in range(length)], dim=1)
    torch.testing.assert_close(sequential, parallel, rtol=1e-10, atol=1e-12)


def test_streaming_keeps_logarithmic_state():
    model = make(chunk=1)
    stream = model.stream(batch_size=1)
    with torch.no_grad():
        for t in range(1, 65):
            stream.step(torch.tensor([t % 11]))
            assert stream.stored_states <= (t).bit_length()


def test_causal_across_chunks():
    model = make(chunk=3)
    tokens = torch.randint(0, 11, (1, 14), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 11
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_the_scan_state_carries_information_across_chunks():
    model = make(chunk=2)
    tokens = torch.randint(0, 11, (1, 10), generator=torch.Generator().manual_seed(2))
    changed = tokens.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 11
    with torch.no_grad():
        assert not torch.allclose(model(tokens)[:, 8:], model(changed)[:, 8:])


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="chunk_size=0"):
        TransformerPSMConfig(chunk_size=0)
    with pytest.raises(ValueError, match="compression='mean'"):
        TransformerPSMConfig(compression="mean")
    with pytest.raises(ValueError, match="d_model=30"):
        TransformerPSMConfig(d_model=30, n_heads=4)


def test_it_learns_a_copy_task():
    torch.manual_seed(0)
    model = TransformerPSM(TransformerPSMConfig(vocab_size=8, d_model=32, n_heads=2, chunk_size=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):
        tokens = torch.randint(0, 8, (8, 12), generator=gen)
        targets = torch.roll(tokens, 1, dims=1)  # predict the previous token
        loss = torch.nn.functional.cross_entropy(model(tokens)[:, 1:].reshape(-1, 8), targets[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
