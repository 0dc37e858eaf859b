"""rcswarm.data.diagnostics: synthetic diagnostic tasks for long-sequence recurrent models.

Four tasks with one shape (see `base`): FRJT ("frjt", forward-referencing
jumps), withheld maze position tracking ("maze"), multi-query associative
recall ("mqar") and S5 state tracking ("s5"). `make_task(name, **config)`
builds one from its config fields, e.g. `make_task("s5", max_length=18)`;
then `task.batch(n, seed)` gives padded [B, T] tensors and `task.vocab` the
vocabulary and target space.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rcswarm.data.diagnostics.base import (
    IGNORE_INDEX,
    Batch,
    DiagnosticTask,
    Example,
    Vocab,
    collate,
)
from rcswarm.data.diagnostics.frjt import FRJTConfig, FRJTTask
from rcswarm.data.diagnostics.maze import MazeConfig, MazeTask
from rcswarm.data.diagnostics.mqar import MQARConfig, MQARTask
from rcswarm.data.diagnostics.s5 import (
    LengthCurriculum,
    S5Config,
    S5Task,
    evaluation_configs,
)

TASKS: dict[str, type[DiagnosticTask]] = {
    "frjt": FRJTTask,
    "maze": MazeTask,
    "mqar": MQARTask,
    "s5": S5Task,
}
"""Task classes by name; each has `config_type`, the dataclass `make_task` fills."""


def make_task(name: str, **config: Any) -> DiagnosticTask:
    """The task `name` with `config_type(**config)`; ValueError for an unknown name or field."""
    if name not in TASKS:
        raise ValueError(f"name={name!r}: expected one of {sorted(TASKS)}")
    task_type = TASKS[name]
    known = {f.name for f in fields(task_type.config_type)}
    for key in config:
        if key not in known:
            raise ValueError(
                f"{task_type.config_type.__name__}.{key}: unknown field; expected one of {sorted(known)}"
            )
    return task_type(task_type.config_type(**config))


__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Batch",
    "DiagnosticTask",
    "Example",
    "FRJTConfig",
    "FRJTTask",
    "LengthCurriculum",
    "MQARConfig",
    "MQARTask",
    "MazeConfig",
    "MazeTask",
    "S5Config",
    "S5Task",
    "Vocab",
    "collate",
    "evaluation_configs",
    "make_task",
]
