"""The SSM's initial step sizes (`[model.overrides] dt_min`, `dt_max`; review of the specs, 2026-11): dt_min = 5e-324
rounded Δ to 0 in float32 and its bias to −inf, dt_max = 1e300 overflowed it: both were accepted and the parameters
were not finite after one step. Now MIN_DT <= dt_min <= dt_max <= MAX_DT (models/baselines/config.py says why)."""

from __future__ import annotations

import pytest
import torch

from rcswarm.config.runspec import RunSpec
from rcswarm.coordinator.capacity import ParameterLimit, model_problem
from rcswarm.models import registry
from rcswarm.models.baselines.config import MAX_DT, MIN_DT, SSMConfig


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"dt_min": 5e-324}, "SSMConfig.dt_min=5e-324: expected >= 1e-08"),
    ({"dt_min": 1e-9}, "SSMConfig.dt_min=1e-09: expected >= 1e-08"),
    ({"dt_max": 1e300}, "SSMConfig.dt_max=1e+300: expected <= 100"),
    ({"dt_min": 1e38, "dt_max": 1e38}, "SSMConfig.dt_max=1e+38: expected <= 100"),
    ({"dt_max": 101.0}, "SSMConfig.dt_max=101.0: expected <= 100"),
])
def test_a_step_size_out_of_range_is_refused_naming_the_field(overrides, fragment) -> None:
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.").replace("+", r"\+")):
        registry.make_config("ssm", "tiny", overrides)
    spec = RunSpec.from_dict({"model": {"name": "ssm", "preset": "tiny", "overrides": overrides}})
    with pytest.raises(ValueError, match="SSMConfig.dt_m"):  # what the coordinator and `rcswarm run` refuse
        model_problem(spec, ParameterLimit.of(10**7))


@pytest.mark.parametrize("overrides", [{"dt_min": MIN_DT}, {"dt_min": MIN_DT, "dt_max": MAX_DT},
                                       {"dt_min": MAX_DT, "dt_max": MAX_DT}, {}])
def test_the_range_trains_to_finite_parameters(overrides) -> None:
    model = registry.build_model("ssm", "tiny", overrides, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, model.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_default_range_is_mambas() -> None:
    assert (SSMConfig().dt_min, SSMConfig().dt_max) == (1e-3, 1e-1)
