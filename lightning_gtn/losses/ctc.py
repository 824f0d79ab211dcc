"""Connectionist temporal classification (CTC) on batch-first emissions."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core import checks, criterion
from ..core.criterion_graphs import compiled_ctc
from ..core.scoring import Plan, unique_graphs

__all__ = ["ctc_loss"]


class _CTC(criterion.Criterion):
    """One CTC graph per distinct target; the loss of a row is ``-log Z`` of its graph."""

    kind = "ctc"
    name = "ctc_loss"
    backends = criterion.NATIVE_BACKENDS + ("gtn",)

    def check_options(self, C, blank, weights, device):
        return checks.check_label(blank, "blank", C), weights

    def gtn_losses(self, emissions, weights, seqs, lengths, blank, zero_infinity):
        from ..core.gtn_backend import gtn_ctc_losses

        return gtn_ctc_losses(emissions, seqs, lengths, blank, zero_infinity)

    def forbidden_label(self, blank: int) -> Optional[int]:
        return blank

    def plan(self, seqs, lengths, C, blank):
        graphs, ids = unique_graphs([compiled_ctc(t, blank) for t in seqs])
        B = len(seqs)
        return Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B), None


criterion.CRITERIA["ctc"] = _CTC()


def ctc_loss(
    log_probs: torch.Tensor,
    targets,
    input_lengths,
    target_lengths,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    *,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """The CTC loss of a batch: torch's ``ctc_loss`` semantics, batch first.

    Each target's CTC graph (:func:`lightning_gtn.wfst.criterion.ctc_graph`, cached per target)
    is scored against its emissions in one batched forward-backward pass on
    ``log_probs.device``; the loss of an example is ``-log`` of the total score of its CTC
    alignments. A ``torch.library`` custom op: works under ``torch.compile(fullgraph=True)``.

    Args:
        log_probs: ``(B, T, C)`` log-probabilities (normally ``log_softmax`` outputs; any
            scores work, the loss is then ``-logsumexp`` of the alignment scores). float32 or
            float64; float16/bfloat16 are scored in float32.
        targets: padded ``(B, S)`` integer labels, all targets concatenated
            ``(sum(target_lengths),)``, or a list of B label sequences. Labels lie in ``[0, C)``
            and are never ``blank``. On ``log_probs.device`` or the CPU.
        input_lengths: ``(B,)`` integer frames per example, ``0 <= input_lengths[b] <= T``.
        target_lengths: ``(B,)`` integer labels per example (``<= S`` for padded targets).
        blank: the blank label, an integer in ``[0, C)``.
        reduction: ``"none"`` gives the ``(B,)`` losses; ``"sum"`` their sum; ``"mean"`` divides
            each loss by its target length (clamped to at least 1) and averages over the batch.
        zero_infinity: infeasible examples (a target that needs more frames than it has) give
            an infinite loss; with ``zero_infinity=True`` they give 0 instead. Either way their
            gradient is zero.
        impl: None (numba on the CPU, Triton or torch on CUDA), ``"numba"``, ``"numba_log"``,
            ``"torch"``, ``"triton"``, or ``"gtn"`` (the real ``gtn`` package, one graph per
            example on the host; eager only; ImportError when not installed).

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
    return criterion.apply_loss(
        criterion.CRITERIA["ctc"],
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="log_probs",
    )
