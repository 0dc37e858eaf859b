"""Argument checks of the data package: each raises ValueError naming `owner.name`, the value and what was expected.

Integers may be Python or NumPy ints, never bools. The package imports nothing else of
rcswarm, so the models keep their own checks (`rcswarm.models.validation`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def is_int(value: object) -> bool:
    """True for a Python or NumPy integer that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(owner: str, name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """Raise ValueError unless `value` is an int in `[minimum, maximum]` (no upper bound when None)."""
    if is_int(value) and value >= minimum and (maximum is None or value <= maximum):
        return
    if maximum is not None:
        what = f"an int in [{minimum}, {maximum}]"
    else:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    raise ValueError(f"{owner}.{name}={value!r}: expected {what}")


def check_probability(
    owner: str, name: str, value: object, *, open_low: bool = False, open_high: bool = False
) -> None:
    """Raise ValueError unless `value` is a real number in [0, 1] (ends optionally open)."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, (bool, np.bool_))
    if ok:
        low_ok = value > 0.0 if open_low else value >= 0.0
        high_ok = value < 1.0 if open_high else value <= 1.0
        if low_ok and high_ok:
            return
    interval = f"{'(' if open_low else '['}0, 1{')' if open_high else ']'}"
    raise ValueError(f"{owner}.{name}={value!r}: expected a number in {interval}")


def check_choice(owner: str, name: str, value: object, choices: Sequence[str]) -> None:
    """Raise ValueError unless `value` is one of `choices`."""
    if isinstance(value, str) and value in choices:
        return
    raise ValueError(f"{owner}.{name}={value!r}: expected one of {list(choices)}")


def check_bool(owner: str, name: str, value: object) -> None:
    """Raise ValueError unless `value` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name}={value!r}: expected a bool")


def check_seed(seed: object) -> None:
    """Raise ValueError unless `seed` is a non-negative int."""
    if not is_int(seed) or seed < 0:
        raise ValueError(f"seed={seed!r}: expected a non-negative int")
