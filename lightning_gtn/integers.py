"""Integer arguments: the one check every layer uses, from the WFST engine up to the models.

Standard library only, so that the engine (``lightning_gtn.wfst``) can use it as well as the
layers above; :mod:`lightning_gtn.core.checks` re-exports it with the other argument checks.
"""

from __future__ import annotations

import numbers
from typing import Optional

__all__ = ["NotAnIntegerError", "check_int"]


class NotAnIntegerError(TypeError, ValueError):
    """An argument that must be an integer is not one (a float, a bool, a string, None).

    Both a TypeError (a wrong type) and a ValueError (what every other argument error of this
    library raises), so callers catching either see it."""


def check_int(value, name: str, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
    """``value`` as an int within ``[minimum, maximum]`` (a bound of None is open).

    An integer is a Python ``int`` or a numpy integer (any :class:`numbers.Integral`), never a
    bool: ``True``, ``8.0`` and ``"8"`` are refused, never converted.

    Args:
        value: the argument.
        name: how messages name it (``"num_tokens"``, ``"model.channels"``).
        minimum: the smallest value allowed, or None.
        maximum: the largest value allowed, or None.

    Raises:
        NotAnIntegerError: ``value`` is not an integer.
        ValueError: it lies outside the bounds. Both messages name ``name`` and the bounds:
            ``"stride must be an integer >= 1, got 0"``, ``"order must be an integer in [1, 10],
            got 12"``.
    """
    if minimum is not None and maximum is not None:
        bound = f" in [{minimum}, {maximum}]"
    elif minimum is not None:
        bound = f" >= {minimum}"
    elif maximum is not None:
        bound = f" <= {maximum}"
    else:
        bound = ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise NotAnIntegerError(f"{name} must be an integer{bound}, got {value!r}")
    v = int(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ValueError(f"{name} must be an integer{bound}, got {v}")
    return v
