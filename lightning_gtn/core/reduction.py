"""The reduction of per-example losses (``"none"``, ``"sum"``, ``"mean"``), for every loss.

Two forms of the same rule:

* :func:`reduction_coefficients`: ``(B,)`` weights ``r`` with ``reduce(losses) = sum_b r[b] *
  losses[b]``, for the losses whose op computes its gradients in the forward (the gradient of row
  ``b`` is scaled by ``r[b]``, and the op's backward scales by the incoming gradient only).
* :func:`reduce_losses`: the reduction applied to a ``(B,)`` loss tensor with torch operations,
  for the losses that autograd differentiates through it.

``"mean"`` is the batch mean; with ``divisors`` (the target lengths, for the losses that follow
torch's ``ctc_loss``) each loss is first divided by its divisor clamped to at least 1; with
``count`` the sum is divided by ``count`` instead of ``B`` (the TDT loss's ``"mean_volume"``
divides by the total target length).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

__all__ = ["reduction_coefficients", "reduce_losses"]


def reduction_coefficients(
    reduction: str,
    B: int,
    divisors=None,
    *,
    count: Optional[int] = None,
    dtype: torch.dtype = torch.float64,
    device=None,
) -> torch.Tensor:
    """``(B,)`` coefficients ``r`` with ``reduce(losses) = sum_b r[b] * losses[b]``.

    Args:
        reduction: ``"none"`` and ``"sum"`` give ones (with ``"none"`` each row's gradient is its
            own), ``"mean"`` ``1 / (max(divisors[b], 1) * B)`` (``1 / B`` without divisors).
        B: the number of examples.
        divisors: ``(B,)`` integers (a tensor or an array) each loss is divided by for ``"mean"``,
            or None.
        count: what ``"mean"`` divides the sum by instead of ``B`` (at least 1), or None.
        dtype, device: of the result (default float64 on the CPU).
    """
    if reduction != "mean":
        return torch.ones(B, dtype=dtype, device=device)
    n = max(B if count is None else int(count), 1)
    if divisors is None:
        return torch.full((B,), 1.0 / n, dtype=dtype, device=device)
    d = torch.as_tensor(np.asarray(divisors) if not isinstance(divisors, torch.Tensor) else divisors)
    return 1.0 / (d.to(device=device, dtype=dtype).clamp(min=1) * n)


def reduce_losses(losses: torch.Tensor, reduction: str, divisors=None) -> torch.Tensor:
    """``reduction`` applied to ``(B,)`` losses by torch operations (autograd flows through):
    ``"none"`` the losses, ``"sum"`` their sum, ``"mean"`` their mean after dividing each by its
    divisor clamped to at least 1 (a ``(B,)`` tensor or array; None: no division)."""
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if divisors is not None:
        d = torch.as_tensor(np.asarray(divisors) if not isinstance(divisors, torch.Tensor) else divisors)
        losses = losses / d.to(device=losses.device, dtype=losses.dtype).clamp(min=1)
    return losses.mean()
