"""Log-space arithmetic shared by the numba kernels."""

from __future__ import annotations

import math

from numba import njit

__all__ = ["NEG_INF", "log_add"]

NEG_INF = -math.inf


@njit(cache=True, nogil=True, inline="always")
def log_add(a, b):
    """``log(exp(a) + exp(b))`` of two scalars; -inf safe, NaN in gives NaN out.

    Inlined into its callers at numba's IR level, so it compiles under each caller's fast-math flags.
    """
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))
