"""rcswarm.models: the model families, their registry (`registry.py`) and the interfaces models implement.

Every family folder follows one template: `config.py` (the config dataclass, validated in
`__post_init__` with `validation.py`), `model.py` (the nn.Module; several model files when a
folder holds several small families, as `baselines/` does), `presets.py` (named presets),
and `__init__.py`, which registers the family with `registry.register(ModelEntry(...))`.
`protocols.py` holds `StepModel`, the per-step encoder + core shape streaming BPTT trains.
"""
