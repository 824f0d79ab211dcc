"""Normalisers scored densely: ``log Z`` of a transitions graph whose shape allows a recursion
over frames instead of the arc-by-arc graph kernels, with its gradients.

A normalised criterion's loss is ``log Z(normaliser) - log Z(numerator)``. Two normalisers are
common enough to have their own kernels:

* :class:`FullyConnected`: ASG's fully connected graph over ``C`` labels, ``(C + 1, C)`` scores
  (row 0 the start scores, ``transitions[i + 1, j]`` label ``i`` after label ``j``), by
  :mod:`lightning_gtn.kernels.dense_torch` (a numba loop per example on the CPU up to
  ``NUMBA_MAX_CLASSES`` labels, matrix products per frame beyond and on other devices). ASG uses
  it, and the transducer for the research bigram (plus end weights on the last frame).
* :class:`Unigram`: one start and accepting node looping on every label ``c`` with weight
  ``w[c]``, ``log Z = sum_t logsumexp_c(E[t, c] + w[c])``, by
  :func:`lightning_gtn.kernels.dense_numba.unigram_pass` (the transducer's ``ngram=1``).

:func:`combine` joins a normaliser with the numerators' losses. Nothing here records an autograd
graph: the criteria call these inside their custom op.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from ..kernels import dense_numba, dense_torch

__all__ = ["use_fully_connected", "FullyConnected", "Unigram", "combine"]


def use_fully_connected(C: int, device: torch.device) -> bool:
    """Whether a fully connected normaliser over ``C`` labels on ``device`` is scored by
    :class:`FullyConnected` (else arc by arc by the graph kernels); see
    ``dense_torch.DENSE_MIN_CLASSES`` and ``CPU_DENSE_MIN_CLASSES``."""
    return dense_torch.use_dense(C, device)


class FullyConnected:
    """``log Z`` of the fully connected transitions graph per example, and its gradients.

    Args:
        emissions: ``(B, T, C)`` float32/float64 frame scores.
        transitions: ``(C + 1, C)`` scores on the emissions' device.
        lengths: ``(B,)`` frames per example (numpy or tensor), ``<= T``.
        need_grad: also compute the gradients.

    Attributes:
        logz: ``(B,)`` in the emissions' dtype; ``-inf`` for an example of length 0 (no path).
        grad_emissions: ``(B, T, C)`` ``d logz_b / d emissions_b`` (a fresh buffer the caller may
            change in place, after :meth:`transitions_grad`), or None without ``need_grad``.
    """

    __slots__ = ("logz", "grad_emissions", "_parts")

    def __init__(self, emissions: torch.Tensor, transitions: torch.Tensor, lengths, need_grad: bool) -> None:
        self.logz, self.grad_emissions, self._parts = dense_torch.full_pass(emissions, transitions, lengths, need_grad)

    def transitions_grad(self, coef: Optional[torch.Tensor]) -> torch.Tensor:
        """``(C + 1, C)``: ``sum_b coef[b] * d logz_b / d transitions`` (``coef`` 1 when None).
        It reads :attr:`grad_emissions`: call it before changing that buffer."""
        return dense_torch.transition_grad(self.grad_emissions, self._parts, coef)


class Unigram:
    """``log Z`` of the unigram graph (one start and accepting node, a self-loop per label ``c``
    with weight ``w[c]``) per example, and its gradients.

    Args:
        emissions: ``(B, T, C)`` float32/float64 frame scores.
        weights: ``(C,)`` label weights in the emissions' dtype.
        lengths: ``(B,)`` numpy int frames per example, ``<= T``.
        need_grad: also compute the gradients.

    Attributes:
        logz: ``(B,)`` float64.
        grad_emissions: ``(B, T, C)`` each valid frame's softmax of ``E[t] + w``
            (``d logz_b / d emissions_b``), a fresh buffer into which the caller may add its own
            terms, or None without ``need_grad``.
        label_sums: ``(B, C)`` float64, the softmax summed over the frames of each example
            (``d logz_b / d w``), or None without ``need_grad``.
    """

    __slots__ = ("logz", "grad_emissions", "label_sums")

    def __init__(self, emissions: torch.Tensor, weights: torch.Tensor, lengths: np.ndarray, need_grad: bool) -> None:
        if need_grad:
            self.logz, self.label_sums, self.grad_emissions = dense_numba.unigram_pass(
                emissions, weights, lengths, new_buffer=True
            )
        else:
            self.logz = dense_numba.unigram_pass(emissions, weights, lengths)[0]
            self.label_sums = self.grad_emissions = None

    def drop(self, rows: torch.Tensor) -> None:
        """Zeroes the gradients of ``rows`` (a ``(B,)`` bool mask): examples that add nothing."""
        self.grad_emissions[rows] = 0
        self.label_sums[rows] = 0

    def weights_grad(self, coef: torch.Tensor) -> torch.Tensor:
        """``(C,)`` float64: ``sum_b coef[b] * d logz_b / d w``."""
        return torch.mv(self.label_sums.t(), coef.to(self.label_sums.dtype))


def combine(
    logz: torch.Tensor, num_loss: torch.Tensor, zero_infinity: bool
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(losses, feasible mask, its float)`` of a normaliser's ``logz`` and the numerators'
    ``-log Z`` (``(B,)`` each); no path through either (``-inf + inf``) is an infeasible row
    (``inf``), not NaN; with ``zero_infinity`` infeasible rows give 0 (not a row whose
    normaliser is ``+inf``: an infinite emission or weight is never hidden)."""
    losses = logz + num_loss
    losses = torch.where((logz == -np.inf) & (num_loss == np.inf), torch.full_like(losses, np.inf), losses)
    ok = torch.isfinite(losses)
    if zero_infinity:  # infeasible rows only: a normaliser of +inf (an infinite emission) stays
        losses = torch.where((losses == np.inf) & (logz != np.inf), torch.zeros_like(losses), losses)
    return losses, ok, ok.to(logz.dtype)
