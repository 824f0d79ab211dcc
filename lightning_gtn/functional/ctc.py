"""Connectionist temporal classification (CTC) on batch-first emissions."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import _common
from ._graphs import compiled_ctc

__all__ = ["ctc_loss"]


class _CTCFunction(_common.ScoreFunction):
    """Per-example CTC losses ``(B,)`` = ``-log Z`` of each target's CTC graph."""


def ctc_plan(targets_list, lengths: np.ndarray, blank: int, B: int) -> _common.Plan:
    """The :class:`~._common.Plan` of a CTC batch (one graph per distinct target)."""
    per = [compiled_ctc(t, blank) for t in targets_list]
    graphs, ids = _common.unique_graphs(per)
    return _common.Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B)


def ctc_loss(
    log_probs: torch.Tensor,
    targets,
    input_lengths,
    target_lengths,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    backend: str = "native",
    _impl: Optional[str] = None,
) -> torch.Tensor:
    """The CTC loss of a batch, torch's ``ctc_loss`` semantics but batch first.

    Each target's CTC graph (:func:`lightning_gtn.wfst.criterion.ctc_graph`, cached per target)
    is scored against its emissions in one batched forward-backward pass on
    ``log_probs.device``; the loss of an example is ``-log`` of the total score of its CTC
    alignments.

    Args:
        log_probs: ``(B, T, C)`` log-probabilities (normally ``log_softmax`` outputs; any
            scores work, the loss is then ``-logsumexp`` of the alignment scores). float32 or
            float64; float16/bfloat16 are scored in float32.
        targets: padded ``(B, S)`` integer labels, or all targets concatenated ``(sum(target_lengths),)``.
            Labels lie in ``[0, C)`` and are never ``blank``. On ``log_probs.device`` or the CPU.
        input_lengths: ``(B,)`` frames per example, ``0 <= input_lengths[b] <= T``.
        target_lengths: ``(B,)`` labels per example (``<= S`` for padded targets).
        blank: the blank label, ``0 <= blank < C``.
        reduction: ``"none"`` gives the ``(B,)`` losses; ``"sum"`` their sum; ``"mean"`` divides
            each loss by its target length (clamped to at least 1) and averages over the batch.
        zero_infinity: infeasible examples (a target that needs more frames than it has) give
            an infinite loss; with ``zero_infinity=True`` they give 0 instead. Either way their
            gradient is zero.
        backend: ``"native"`` (this library's batched scoring) or ``"gtn"`` (the real ``gtn``
            package, one graph per example on the host; raises ImportError when not installed).

    Returns:
        A scalar (or ``(B,)`` for ``reduction="none"``) in ``log_probs``'s dtype and device.
        NaN emissions give NaN losses.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import ctc_loss
        >>> lp = torch.randn(2, 10, 5).log_softmax(-1)
        >>> loss = ctc_loss(lp, torch.tensor([[1, 2], [3, 0]]), [10, 8], [2, 1])
        >>> loss.shape
        torch.Size([])
    """
    B, T, C = _common.check_call(log_probs, "log_probs", reduction)
    if not isinstance(blank, (int, np.integer)) or not 0 <= int(blank) < C:
        raise ValueError(f"blank must be an integer label in [0, C) with C={C}, got {blank!r}")
    blank = int(blank)
    lengths, seqs, tlen = _common.lengths_and_targets(input_lengths, targets, target_lengths, (B, T, C),
                                                      log_probs.device, blank=blank)
    if _common.use_gtn(backend):
        from ._gtn_backend import gtn_ctc_losses

        losses = gtn_ctc_losses(log_probs, seqs, lengths, blank, zero_infinity)
        return _common.reduce_losses(losses, reduction, tlen)
    impl = _common.pick_impl(log_probs, _impl)
    x = log_probs.to(_common.compute_dtype(log_probs))
    plan = ctc_plan(seqs, lengths, blank, B)
    losses = _CTCFunction.apply(x, _common.graph_weights(plan, x), plan, impl, bool(zero_infinity), False)
    return _common.reduce_losses(losses, reduction, tlen).to(log_probs.dtype)
