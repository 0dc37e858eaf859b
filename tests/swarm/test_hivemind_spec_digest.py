"""The hivemind spec digest hashes the typed configs a run spec's free-form tables become, not the tables as written:
[model.overrides] and [data.task_config] that configure the same model and task (0 or 0.0 in a float field, a default
written out or left out, keys in another order, another preset overridden to the same config) give one digest, so
their peers form one swarm; a value that differs gives another. In-process: no peer is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcswarm.config.runspec import RunSpec

pytest.importorskip("hivemind")

from rcswarm.worker.hivemind_worker import spec_digest  # noqa: E402

HEAD = """[run]
name = "hm"
rounds = 3

[sync]
backend = "hivemind"
codec = "int8"
"""


def _digest(tmp_path: Path, tables: str) -> str:
    """The spec digest of the RUN.toml of HEAD and `tables`, read as a worker reads it."""
    path = tmp_path / f"run{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(HEAD + tables)
    return spec_digest(RunSpec.from_toml(path))


def _model(overrides: str, preset: str = "tiny", name: str = "lstm_lm") -> str:
    return f'[model]\nname = "{name}"\npreset = "{preset}"\n\n[model.overrides]\n{overrides}\n'


def _diag(task_config: str) -> str:
    return f'{_model("vocab_size = 256")}\n[data]\nsource = "diag"\ntask = "mqar"\n\n[data.task_config]\n{task_config}\n'


def test_model_overrides_that_make_one_config_give_one_digest(tmp_path: Path) -> None:
    same = [
        ("dropout = 0", "dropout = 0.0"),  # an integer in a float field
        ("", "dropout = 0.0\ntie_embeddings = true"),  # defaults written out or left out
        ("d_model = 48\nn_layers = 2", "n_layers = 2\nd_model = 48"),  # keys in another order
        ("", "d_model = 32\nn_layers = 1"),  # the preset's own values
    ]
    for left, right in same:
        assert _digest(tmp_path, _model(left)) == _digest(tmp_path, _model(right)), (left, right)
    # Another preset overridden to the tiny preset's config trains the same model.
    assert _digest(tmp_path, _model("")) == _digest(tmp_path, _model("d_model = 32\nn_layers = 1", preset="small"))
    # A float field of another family: rope_base = 10000 is its default 10000.0.
    assert (_digest(tmp_path, _model("rope_base = 10000", name="transformer"))
            == _digest(tmp_path, _model("", name="transformer")))


def test_model_overrides_that_differ_give_another_digest(tmp_path: Path) -> None:
    assert _digest(tmp_path, _model("d_model = 64")) != _digest(tmp_path, _model("d_model = 65"))
    assert _digest(tmp_path, _model("dropout = 0.1")) != _digest(tmp_path, _model("dropout = 0.2"))
    assert _digest(tmp_path, _model("")) != _digest(tmp_path, _model("tie_embeddings = false"))
    assert _digest(tmp_path, _model("")) != _digest(tmp_path, _model("", preset="small"))
    # Another family with the same fields is another model.
    assert _digest(tmp_path, _model("d_model = 64", name="lstm")) != _digest(tmp_path, _model("d_model = 64"))


def test_an_override_the_model_refuses_is_refused_by_the_digest_naming_it(tmp_path: Path) -> None:
    """d_model = 64.0 is not the integer the model's config needs: refused (as the worker refuses it), not hashed."""
    with pytest.raises(ValueError, match=r"ResidualLSTMConfig\.d_model=64\.0: expected a positive int"):
        _digest(tmp_path, _model("d_model = 64.0"))
    with pytest.raises(ValueError, match="unknown config field 'depth'"):
        _digest(tmp_path, _model("depth = 2"))


def test_task_configs_that_make_one_task_give_one_digest(tmp_path: Path) -> None:
    assert _digest(tmp_path, _diag("power_a = 1")) == _digest(tmp_path, _diag("power_a = 1.0"))
    assert _digest(tmp_path, _diag("")) == _digest(tmp_path, _diag("power_a = 0.01"))  # the default
    assert _digest(tmp_path, _diag("power_a = 0.5")) != _digest(tmp_path, _diag("power_a = 0.25"))
    typing = '[data]\nsource = "typing"\nseq_len = 8\n\n[data.task_config]\n'
    frame = _model("", name="frame")
    assert _digest(tmp_path, frame + typing) == _digest(tmp_path, frame + typing + "n_documents = 64\n")
    assert _digest(tmp_path, frame + typing) != _digest(tmp_path, frame + typing + "n_documents = 4\n")
