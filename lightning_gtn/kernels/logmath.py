"""Log-space arithmetic: the one log-add of the log semiring, in each form a kernel needs.

``log_add(a, b) = log(exp(a) + exp(b))``, the sum of the log semiring (the max semiring's sum is
``max`` and needs no helper):

* :func:`log_add` (numba, also callable from Python): -inf safe; NaN in gives NaN out through
  the arithmetic; two +inf give NaN (``inf - inf``). Inlined into its numba callers, so it
  compiles under each caller's fast-math flags (the RNN-T kernels').
* :func:`log_add_checked` (numba, for callers compiled without fast-math): NaN tested first and
  equal arguments give ``a + log 2``, so two +inf give +inf. The mutual-information recursion of
  k2's losses, whose inputs are any user scores, uses it.
* :func:`log_add_torch` (torch, elementwise): ``m + log(exp(a - m) + exp(b - m))`` with ``m`` the
  larger; for finite inputs (the torch RNN-T reference keeps impossible nodes at a finite floor,
  so its gradients stay finite).
* ``log_add_triton`` (a ``triton.jit`` function, where triton is installed): -inf when both are
  -inf, NaN when either is NaN, for the Triton RNN-T and duration-lattice kernels.
"""

from __future__ import annotations

import math

import torch
from numba import njit

try:  # Triton ships with CUDA builds of torch; CPU-only installs do not need it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

__all__ = ["NEG_INF", "LOG2", "log_add", "log_add_checked", "log_add_torch"]

NEG_INF = -math.inf
LOG2 = math.log(2.0)


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


@njit(cache=True, nogil=True, inline="always")
def log_add_checked(a, b):
    """``log(exp(a) + exp(b))``; NaN when either is NaN (tested first), ``a + log 2`` when equal."""
    if a != a or b != b:
        return math.nan
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a == b:
        return a + LOG2
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


def log_add_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``log(exp(a) + exp(b))`` elementwise for finite inputs (gradients stay finite)."""
    m = torch.maximum(a, b)
    return m + torch.log(torch.exp(a - m) + torch.exp(b - m))


if triton is not None:

    @triton.jit
    def log_add_triton(a, b):
        """``log(exp(a) + exp(b))``, -inf when both are -inf, NaN when either is NaN."""
        m = tl.maximum(a, b)
        inf_only = (m == -float("inf")) & (a == a) & (b == b)
        safe = tl.where(m == -float("inf"), 0.0, m)
        return tl.where(inf_only, -float("inf"), safe + tl.log(tl.exp(a - safe) + tl.exp(b - safe)))
