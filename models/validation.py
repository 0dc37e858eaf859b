"""Checks of model config fields: each raises ValueError naming `<Config>.<field>`, the value and what was expected.

Every check takes the config instance (a dataclass, usually `self` in `__post_init__`)
and a field name; the message starts with the config's class name, so a field inherited
from a base config is reported under the subclass that was built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _fail(config: object, field: str, expected: str) -> None:
    raise ValueError(f"{type(config).__name__}.{field}={getattr(config, field)!r}: expected {expected}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(config: object, field: str, minimum: int = 1) -> None:
    """`config.<field>` is an int >= `minimum` (bools rejected): "a positive int" or "an int >= m"."""
    value = getattr(config, field)
    if not _is_int(value) or value < minimum:
        _fail(config, field, "a positive int" if minimum == 1 else f"an int >= {minimum}")


def check_ints(config: object, fields: Sequence[str], minimum: int = 1) -> None:
    """`check_int` on every field of `fields`, in order."""
    for field in fields:
        check_int(config, field, minimum)


def check_optional_int(config: object, field: str) -> None:
    """`config.<field>` is None or an int >= 1."""
    value = getattr(config, field)
    if value is not None and (not _is_int(value) or value < 1):
        _fail(config, field, "a positive int or None")


def check_positive_float(config: object, field: str) -> None:
    """`config.<field>` is a finite real number > 0."""
    value = getattr(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        _fail(config, field, "a finite float > 0")


def check_fraction(config: object, field: str) -> None:
    """`config.<field>` is a real number in [0, 1) (a dropout probability)."""
    value = getattr(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        _fail(config, field, f"a float with 0 <= {field} < 1")


def check_bool(config: object, field: str) -> None:
    """`config.<field>` is True or False."""
    if not isinstance(getattr(config, field), bool):
        _fail(config, field, "a bool")


def check_choice(config: object, field: str, choices: Sequence[str]) -> None:
    """`config.<field>` is one of `choices`."""
    value = getattr(config, field)
    if not isinstance(value, str) or value not in choices:
        _fail(config, field, f"one of {list(choices)}")
