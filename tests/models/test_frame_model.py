"""Tests of the frame-based action model: shapes, causality, presets, FLOPs, metrics, training."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from rcswarm.models import registry
from rcswarm.models.frame import (
    NOMINAL_PARAMETERS,
    FrameActionModel,
    FrameModelConfig,
    count_parameters,
    frame_cells,
)
from rcswarm.models.frame.flops import (
    estimate_flops,
    frame_head_closed_form,
    frame_head_components,
    lstm_flops,
    main_components,
    window_flops,
)
from rcswarm.models.frame.frame_head import pool_pairs
from rcswarm.models.frame.metrics import (
    mean_cross_entropy,
    position_losses,
    sustained_accuracy,
    top1_correct,
)


def _tiny(seed: int = 0) -> FrameActionModel:
    model = registry.build_model("frame", "tiny", seed=seed)
    assert isinstance(model, FrameActionModel)
    return model


def _frames(config: FrameModelConfig, batch: int, n_frames: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    chars = torch.randint(0, config.char_vocab, (batch, n_frames, config.rows, config.cols), generator=generator)
    styles = torch.randint(0, config.n_styles, (batch, n_frames, config.rows, config.cols), generator=generator)
    return torch.stack((chars, styles), dim=-1)  # [B, L, R, C, 2]


def test_frame_is_registered_with_its_presets() -> None:
    assert "frame" in registry.list_models()
    entry = registry.get("frame")
    assert entry.config_cls is FrameModelConfig
    assert set(entry.presets) == {"tiny", "small", "82m", "103m", "145m"}


def test_shapes_of_encode_core_and_forward() -> None:
    model = _tiny()
    config = model.config
    frames = _frames(config, batch=3, n_frames=5)
    embeddings = model.encode(frames)
    assert embeddings.shape == (3, 5, config.d_model)
    logits = model(frames)
    assert logits.shape == (3, 5, config.action_vocab)
    assert logits.dtype == torch.float32
    assert torch.allclose(logits, model.core(embeddings), atol=1e-6)
    assert model(frames.to(torch.int16)).shape == logits.shape


def test_contract_fields_and_float32_parameters() -> None:
    model = _tiny()
    assert model.config.vocab_size == model.config.action_vocab == 64
    assert all(p.dtype == torch.float32 for p in model.parameters())
    names = [n for n, _ in model.named_parameters()]
    assert names[0] == "frame_head.char_embed.weight" and names[-1] == "head.weight"
    assert any(".proj." in n for n in names)
    no_projection = registry.build_model("frame", "tiny", {"n_hidden": 32}, seed=0)
    assert not any(".proj." in n for n, _ in no_projection.named_parameters())


@pytest.mark.parametrize(
    ("shape", "dtype", "pattern"),
    [
        ((2, 3, 8, 16), torch.long, r"shape \(2, 3, 8, 16\).*\[batch, frames, 8, 16, 2\]"),
        ((2, 3, 16, 8, 2), torch.long, r"shape \(2, 3, 16, 8, 2\)"),
        ((2, 3, 8, 16, 2), torch.float32, r"dtype torch.float32.*integer"),
    ],
)
def test_bad_frames_are_rejected(shape: tuple[int, ...], dtype: torch.dtype, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        _tiny().encode(torch.zeros(shape, dtype=dtype))


def test_later_frames_do_not_change_earlier_logits() -> None:
    model = _tiny()
    frames = _frames(model.config, batch=2, n_frames=6)
    changed = frames.clone()
    changed[:, 3] = _frames(model.config, batch=2, n_frames=1, seed=1)[:, 0]
    with torch.no_grad():
        before, after = model(frames), model(changed)
    assert torch.allclose(before[:, :3], after[:, :3], rtol=0.0, atol=1e-6)
    assert not torch.allclose(before[:, 3], after[:, 3], atol=1e-4)
    assert not torch.allclose(before[:, 5], after[:, 5], atol=1e-4)


def test_core_in_pieces_with_state_equals_one_call() -> None:
    model = _tiny()
    with torch.no_grad():
        embeddings = model.encode(_frames(model.config, batch=2, n_frames=7))
        whole = model.core(embeddings)
        first, state = model.core(embeddings[:, :3], return_state=True)
        second = model.core(embeddings[:, 3:], state=state)
    assert torch.allclose(torch.cat((first, second), dim=1), whole, atol=1e-6)
    with pytest.raises(ValueError, match=r"state has 1 layer states: expected 2"):
        model.core(embeddings, state=state[:1])


def test_pool_pairs_averages_horizontal_neighbours() -> None:
    x = torch.arange(8.0).view(1, 4, 2)  # tokens [0,1], [2,3], [4,5], [6,7]
    assert torch.equal(pool_pairs(x), torch.tensor([[[1.0, 2.0], [5.0, 6.0]]]))


def test_frame_cells_buckets_code_points() -> None:
    codepoints = torch.tensor([ord("a"), 0x1F600, 300])
    styles = torch.tensor([1, 2, 3])
    cells = frame_cells(codepoints, styles, char_vocab=256)
    assert cells.tolist() == [[97, 1], [0x1F600 % 256, 2], [44, 3]]
    with pytest.raises(ValueError, match="equal shapes"):
        frame_cells(codepoints, styles[:2], char_vocab=256)


def test_seeded_build_is_deterministic_and_keeps_global_rng() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    a, b, c = _tiny(7), _tiny(7), _tiny(8)
    assert torch.equal(torch.rand(3), expected)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["frame_head.char_embed.weight"], sc["frame_head.char_embed.weight"])


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"action_vocab": 0}, r"FrameModelConfig\.action_vocab=0: expected a positive int"),
        ({"d_model": 2.0}, r"FrameModelConfig\.d_model=2\.0: expected a positive int"),
        ({"n_pool": -1}, r"FrameModelConfig\.n_pool=-1: expected an int >= 0"),
        ({"n_frame_layers": True}, r"FrameModelConfig\.n_frame_layers=True"),
        ({"n_heads": 5}, r"FrameModelConfig\.n_heads=5: expected a divisor of d_model=768"),
        ({"cols": 18}, r"FrameModelConfig\.cols=18: expected a multiple of 2\*\*n_pool=4"),
    ],
)
def test_config_validation_names_field_and_value(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        FrameModelConfig(**kwargs)


def test_override_errors_come_through_the_registry() -> None:
    with pytest.raises(ValueError, match=r"n_hidden=0"):
        registry.make_config("frame", "tiny", {"n_hidden": 0})


@pytest.mark.parametrize("preset", ["82m", "103m", "145m"])
def test_paper_presets_are_near_their_names(preset: str) -> None:
    config = registry.make_config("frame", preset)
    assert (config.rows, config.cols, config.d_model, config.n_hidden, config.n_pool) == (48, 160, 768, 768, 2)
    n = count_parameters(config)
    nominal = NOMINAL_PARAMETERS[preset]
    assert abs(n - nominal) / nominal < 0.015, (preset, n)


def test_paper_presets_differ_by_whole_frame_blocks() -> None:
    counts = {p: count_parameters(registry.make_config("frame", p)) for p in ("82m", "103m", "145m")}
    block = 12 * 768**2 + 13 * 768
    assert counts == {"82m": 81_075_456, "103m": 81_075_456 + 3 * block, "145m": 81_075_456 + 9 * block}


def test_meta_count_matches_a_built_model_and_keeps_rng() -> None:
    torch.manual_seed(1)
    expected = torch.rand(2)
    torch.manual_seed(1)
    n = count_parameters(registry.make_config("frame", "tiny"))
    assert torch.equal(torch.rand(2), expected)
    assert n == registry.parameter_count(_tiny()) == 105_376


def _sig(x: float, digits: int = 5) -> str:
    return f"{x:.{digits - 1}e}"


def test_flops_reproduce_the_appendix_j_table() -> None:
    config = registry.make_config("frame", "82m")
    estimate = estimate_flops(config, batch=512, seq_len=1024)
    table = {
        "frame-head TF block (T=7680) x1": (1.4843e14, 51.60),
        "frame-head TF block (T=3840) x1": (5.1024e13, 17.74),
        "frame-head TF blocks (T=1920) x3": (5.9142e13, 20.56),
        "frame-head reduction LSTM (T=1920)": (9.2771e12, 3.22),
        "main LSTM (2 layers, T=1024)": (9.8956e12, 3.44),
        "main MLP (2 layers, T=1024)": (9.8956e12, 3.44),
    }
    assert [c.name for c in estimate.components] == list(table)
    for name, (flops, share) in table.items():
        got = estimate.component(name)
        assert _sig(got) == _sig(flops), name
        assert f"{100 * estimate.share(got):.2f}" == f"{share:.2f}", name
    assert _sig(estimate.frame_head) == _sig(2.6788e14)
    assert _sig(estimate.main) == _sig(1.9791e13)
    assert _sig(estimate.total) == _sig(2.8767e14)
    assert f"{100 * estimate.share(estimate.frame_head):.2f}" == "93.12"


@pytest.mark.parametrize(("n_pool", "n_frame_layers"), [(0, 2), (1, 0), (2, 3), (3, 12)])
def test_eq16_closed_form_equals_eq15_sum(n_pool: int, n_frame_layers: int) -> None:
    parts = frame_head_components(4, 64, 7680, n_pool, n_frame_layers)
    assert sum(c.flops for c in parts) == frame_head_closed_form(4, 64, 7680, n_pool, n_frame_layers)


@pytest.mark.parametrize("n_pool", [0, 2])
@pytest.mark.parametrize("mlp_ratio", [1, 2, 8])
def test_eq16_closed_form_follows_the_mlp_ratio(mlp_ratio: int, n_pool: int) -> None:
    parts = frame_head_components(4, 64, 7680, n_pool, 3, mlp_ratio=mlp_ratio)
    assert sum(c.flops for c in parts) == frame_head_closed_form(4, 64, 7680, n_pool, 3, mlp_ratio=mlp_ratio)


def _linear_flops(run: object) -> int:
    """FLOPs FlopCounterMode counts in the nn.Linear matmuls (aten.mm, aten.addmm) of `run()`."""
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        run()  # type: ignore[operator]
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    return counts.get("aten.mm", 0) + counts.get("aten.addmm", 0)


@pytest.mark.parametrize("mlp_ratio", [1, 2, 4, 8])
def test_flop_estimate_equals_counted_matmuls(mlp_ratio: int) -> None:
    model = registry.build_model("frame", "tiny", {"mlp_ratio": mlp_ratio}, seed=0)
    config = model.config
    batch, n_frames = 2, 3
    frames = _frames(config, batch, n_frames)  # [B, L, R, C, 2]
    embeddings = model.encode(frames).detach()  # [B, L, D]
    head_linear = _linear_flops(lambda: model.encode(frames))
    main_linear = _linear_flops(lambda: model._main_layers(embeddings, None))
    # The counter sees neither nn.LSTM nor CPU SDPA: add their matmuls from the shapes.
    n, d, t_p = batch * n_frames, config.d_model, config.n_cells // 2**config.n_pool
    lengths = [config.n_cells // 2**s for s in range(config.n_pool)] + [t_p] * config.n_frame_layers
    attention = sum(4 * n * d * t * t for t in lengths)  # QK^T and AV
    head_counted = head_linear + attention + lstm_flops(n, d, d, t_p)
    main_lstm = config.n_main_layers * lstm_flops(batch, d, config.n_hidden, n_frames)
    projection = config.n_main_layers * 2 * batch * n_frames * config.n_hidden * d if config.n_hidden != d else 0
    main_counted = main_linear + main_lstm - projection  # the H -> D projection is left out by the paper
    estimate = estimate_flops(config, batch, n_frames)
    assert n_frames * estimate.frame_head == head_counted
    assert estimate.main == main_counted


def test_main_flops_with_h_equal_d_is_32_btd2_per_layer() -> None:
    parts = main_components(batch=8, d_model=96, n_hidden=96, seq_len=50, n_main_layers=3)
    assert sum(c.flops for c in parts) == 32 * 8 * 50 * 96**2 * 3
    wide = main_components(batch=8, d_model=96, n_hidden=192, seq_len=50, n_main_layers=1)
    assert wide[0].flops == 8 * 8 * 50 * (96 * 192 + 192**2)


def test_window_flops_run_the_frame_head_once_per_frame() -> None:
    config = registry.make_config("frame", "82m")
    per_batch = estimate_flops(config, batch=512, seq_len=1024)
    assert window_flops(config, 512, 1024) == 1024 * per_batch.frame_head + per_batch.main
    with pytest.raises(ValueError, match=r"n_cells=7: expected a multiple of 2\*\*n_pool=4"):
        frame_head_components(1, 8, 7, 2, 1)


@pytest.mark.parametrize(
    ("correct", "expected"),
    [
        ([1, 1, 0, 1, 1, 1, 0], 2.5),
        ([1, 1, 1, 1], 4.0),
        ([0, 0, 0], 0.0),
        ([0, 0, 1], 1 / 3),
        ([1, 0, 0, 1, 1], 1.0),
        ([0, 1, 1, 0, 0], 2 / 3),
    ],
)
def test_sustained_accuracy_of_single_sequences(correct: list[int], expected: float) -> None:
    assert sustained_accuracy(torch.tensor(correct, dtype=torch.bool)) == pytest.approx(expected)


def test_sustained_accuracy_pools_runs_over_the_batch_without_crossing_rows() -> None:
    correct = torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.bool)
    assert sustained_accuracy(correct) == pytest.approx(5 / 3)  # runs 3 | 1, 1
    with pytest.raises(ValueError, match="bool tensor"):
        sustained_accuracy(torch.ones(2, 3))


def test_mean_cross_entropy_top1_and_early_late_losses() -> None:
    targets = torch.tensor([[0, 1, 2, 0, 1, 2]])
    logits = torch.zeros(1, 6, 3)
    logits[0, torch.arange(6), (targets[0] + 1) % 3] = 1.0
    logits[0, torch.arange(6), targets[0]] = torch.tensor([5.0, 5.0, 0.0, 0.0, 0.0, -5.0])
    per_position = F.cross_entropy(logits[0], targets[0], reduction="none")
    assert mean_cross_entropy(logits, targets) == pytest.approx(per_position.mean().item())
    losses = position_losses(logits, targets, n=2)
    assert losses.early == pytest.approx(per_position[:2].mean().item())
    assert losses.late == pytest.approx(per_position[-2:].mean().item())
    assert losses.early < math.log(3) < losses.late
    assert top1_correct(logits, targets).tolist() == [[True, True, False, False, False, False]]
    with pytest.raises(ValueError, match=r"n=7: expected an int with 1 <= n <= L=6"):
        position_losses(logits, targets, n=7)


def test_tiny_model_learns_to_read_its_frame() -> None:
    """Every cell of frame t holds the same random character c_t; the action is c_t."""
    torch.manual_seed(0)
    model = _tiny(seed=0)
    config = model.config
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    n_classes = 8
    losses = []
    for step in range(60):
        frames = _frames(config, batch=8, n_frames=4, seed=step)
        actions = torch.randint(0, n_classes, (8, 4), generator=torch.Generator().manual_seed(step))
        frames[..., 0] = actions[:, :, None, None]
        loss = F.cross_entropy(model(frames).reshape(-1, config.action_vocab), actions.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[:5]) / 5 > math.log(n_classes)
    assert sum(losses[-5:]) / 5 < 0.5 * math.log(n_classes), losses
