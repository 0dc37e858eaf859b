"""Model registry: names -> (config dataclass, builder, presets).

A model is addressed by a registered name, a preset name and optional
overrides of individual config fields, e.g.

    from rcswarm.models import registry
    model = registry.build_model("lstm_lm", "tiny", {"dropout": 0.1}, seed=0)

Built-in models (the packages in `_BUILTIN_MODULES`) register themselves when
their package is imported; the registry imports them lazily on first lookup.

Contract every registered model satisfies:

- `model(inputs)` with `inputs` a LongTensor [B, T] of token ids in
  [0, vocab_size) returns logits, a FloatTensor [B, T, vocab_size].
- It is causal: logits[:, t] depend on inputs[:, : t + 1] only.
- It has an attribute `model.config` (an instance of the entry's config
  dataclass) with `model.config.vocab_size`.
- All parameters are float32, and `named_parameters()` yields them in a
  deterministic order (the order of module construction), with shared
  (tied) parameters listed once.
- The builder draws every random initial value from torch's global CPU RNG
  and builds on the CPU, so `build_model(..., seed=s)` is bit-identical
  across processes for the same (name, preset, overrides, seed).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_BUILTIN_MODULES: tuple[str, ...] = (
    "rcswarm.models.lstm_lm",
    "rcswarm.models.baselines",
    "rcswarm.models.psm",
    "rcswarm.models.frame",
    "rcswarm.models.chaingpt",
)

_REGISTRY: dict[str, ModelEntry] = {}


@dataclass(frozen=True)
class ModelEntry:
    """One registered model family.

    `build(config)` constructs the model from an instance of `config_cls`;
    `presets` maps a preset name to the config fields it sets (fields not
    named keep the dataclass defaults).
    """

    name: str
    config_cls: type
    build: Callable[[Any], nn.Module]
    presets: Mapping[str, Mapping[str, Any]]
    description: str


def _config_fields(config_cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(config_cls) if f.init]


def register(entry: ModelEntry) -> None:
    """Add `entry` to the registry; ValueError if its name is taken or it is malformed.

    Every preset is validated by constructing its config, so a bad preset
    fails here rather than at first use. The presets are copied into
    read-only mappings.
    """
    if not isinstance(entry, ModelEntry):
        raise ValueError(f"register(entry={entry!r}): expected a ModelEntry")
    if not isinstance(entry.name, str) or not entry.name:
        raise ValueError(f"ModelEntry.name={entry.name!r}: expected a non-empty str")
    if entry.name in _REGISTRY:
        raise ValueError(
            f"ModelEntry.name={entry.name!r}: a model of that name is already registered"
        )
    if not (isinstance(entry.config_cls, type) and dataclasses.is_dataclass(entry.config_cls)):
        raise ValueError(
            f"ModelEntry.config_cls={entry.config_cls!r} of model {entry.name!r}: "
            "expected a dataclass type"
        )
    if not callable(entry.build):
        raise ValueError(
            f"ModelEntry.build={entry.build!r} of model {entry.name!r}: expected a callable"
        )
    if not isinstance(entry.presets, Mapping) or not entry.presets:
        raise ValueError(
            f"ModelEntry.presets={entry.presets!r} of model {entry.name!r}: "
            "expected a non-empty mapping of preset name -> config fields"
        )
    frozen_presets: dict[str, Mapping[str, Any]] = {}
    for preset_name, values in entry.presets.items():
        if not isinstance(values, Mapping):
            raise ValueError(
                f"ModelEntry.presets[{preset_name!r}]={values!r} of model {entry.name!r}: "
                "expected a mapping of config field -> value"
            )
        _check_keys(entry, values, f"preset {preset_name!r}")
        entry.config_cls(**values)
        frozen_presets[preset_name] = MappingProxyType(dict(values))
    _REGISTRY[entry.name] = dataclasses.replace(
        entry, presets=MappingProxyType(frozen_presets)
    )


def _load_builtin() -> None:
    for module_name in _BUILTIN_MODULES:
        importlib.import_module(module_name)


def list_models() -> list[str]:
    """Names of all registered models, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


# The most characters of a name a refusal quotes (a run spec's model.name of 10^5 characters was echoed whole).
MAX_SHOWN_CHARS = 200


def _shown(value: Any) -> str:
    """`repr(value)` for a message, cut to MAX_SHOWN_CHARS characters (and its length said) when longer."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}… ({len(value) if isinstance(value, str) else len(text):,} characters)"


def get(name: str) -> ModelEntry:
    """The entry registered under `name`; ValueError naming model.name (the run spec's key) and listing the known
    names if none."""
    _load_builtin()
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"model.name = {_shown(name)} is unknown: expected a registered model name, one of "
                         f"{sorted(_REGISTRY)}")
    return entry


def _check_keys(entry: ModelEntry, values: Mapping[str, Any], what: str) -> None:
    valid = _config_fields(entry.config_cls)
    for key in values:
        if key not in valid:
            raise ValueError(
                f"{what} of model {entry.name!r} sets unknown config field {_shown(key)}: "
                f"expected one of {valid}"
            )


def make_config(name: str, preset: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """The config of model `name`: preset values, updated by `overrides`.

    ValueError for an unknown model or preset (listing the valid ones), for an
    override key that is not a field of the config (listing the fields), and
    whatever ValueError the config's own validation raises.
    """
    entry = get(name)
    values = entry.presets.get(preset)
    if values is None:
        raise ValueError(
            f"model.preset = {_shown(preset)} is unknown for model {name!r}: expected one of "
            f"{sorted(entry.presets)}"
        )
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, Mapping):
        raise ValueError(
            f"overrides={overrides!r}: expected a mapping of config field -> value or None"
        )
    _check_keys(entry, overrides, "override")
    return entry.config_cls(**{**values, **overrides})


def build_model(
    name: str,
    preset: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
) -> nn.Module:
    """Build model `name` from `preset` (+ `overrides`), on the CPU.

    With `seed`, initialization runs on a forked CPU RNG seeded with `seed`:
    the parameters are bit-identical for the same arguments in any process,
    and the caller's global RNG state is left untouched. Without it, the
    global RNG is used (and advanced) as usual.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed={seed!r}: expected a non-negative int or None")
    entry = get(name)
    config = make_config(name, preset, overrides)
    if seed is None:
        model = entry.build(config)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            model = entry.build(config)
    _check_contract(entry, model)
    return model


# Tensor methods that fill a tensor with random values (what initializers call).
_RANDOM_FILLS = frozenset({
    "normal_", "uniform_", "random_", "exponential_", "bernoulli_", "log_normal_", "cauchy_", "geometric_", "erfinv_",
})


class _SkipInitialization(TorchFunctionMode):
    """`torch.nn.init` and the random fills return their tensor untouched: on the meta device only shapes count,
    and the meta kernels of the random fills are Python references whose first call imports torch._dynamo
    (seconds of a worker's start-up)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", "") == "torch.nn.init" or getattr(func, "__name__", "") in _RANDOM_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def parameter_count_of(name: str, preset: str, overrides: Mapping[str, Any] | None = None) -> int:
    """`parameter_count` of `build_model(name, preset, overrides)`, counted without allocating the parameters:
    the model is built on the meta device (shapes only), its initialization skipped, the caller's RNG state
    left untouched. ValueError as `make_config` raises it."""
    entry = get(name)
    config = make_config(name, preset, overrides)
    with torch.random.fork_rng(devices=[]), torch.device("meta"), _SkipInitialization():
        model = entry.build(config)
    return parameter_count(model)


def _check_contract(entry: ModelEntry, model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"builder of model {entry.name!r} returned {type(model)!r}: expected an nn.Module"
        )
    config = getattr(model, "config", None)
    if not isinstance(config, entry.config_cls) or not hasattr(config, "vocab_size"):
        raise TypeError(
            f"model {entry.name!r} has config {config!r}: expected a {entry.config_cls.__name__} "
            "with a vocab_size field"
        )
    for param_name, param in model.named_parameters():
        if param.dtype != torch.float32:
            raise TypeError(
                f"model {entry.name!r} parameter {param_name!r} has dtype {param.dtype}: "
                "expected float32"
            )


def parameter_count(model: nn.Module) -> int:
    """Number of scalar parameters, counting tied (shared) parameters once."""
    return sum(p.numel() for p in model.parameters())
