"""Loss modules: each holds its options (and ASG its transitions) and calls the functional loss."""

from __future__ import annotations


import torch
from torch import nn

from .. import functional as lgf  # not torch.nn.functional: the engine computes every loss

__all__ = ["CTCLoss", "ASGLoss", "SequenceLoss", "GraphLoss"]


class CTCLoss(nn.Module):
    """:func:`lightning_gtn.functional.ctc_loss` as a module (batch-first ``(B, T, C)``).

    Args:
        blank: the blank label.
        reduction: ``"none"`` | ``"mean"`` | ``"sum"`` (torch's meanings).
        zero_infinity: infeasible examples give 0 instead of ``inf``.
        backend: ``"native"`` or ``"gtn"``.

    Shape:
        ``forward(log_probs (B, T, C), targets (B, S) or (sum(target_lengths),),
        input_lengths (B,), target_lengths (B,))`` -> scalar, or ``(B,)`` with ``"none"``.
    """

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False,
                 backend: str = "native") -> None:
        super().__init__()
        self.blank = blank
        self.reduction = reduction
        self.zero_infinity = zero_infinity
        self.backend = backend

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return lgf.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=self.blank,
                          reduction=self.reduction, zero_infinity=self.zero_infinity, backend=self.backend)

    def extra_repr(self) -> str:
        return f"blank={self.blank}, reduction={self.reduction!r}, zero_infinity={self.zero_infinity}"


class ASGLoss(nn.Module):
    """:func:`lightning_gtn.functional.asg_loss` with its transitions as an ``nn.Parameter``.

    Args:
        num_classes: ``C``; the transitions have shape ``(C + 1, C)`` (row 0: start scores,
            ``transitions[i + 1, j]``: label ``i`` after label ``j``), initialised to zeros.
        reduction: ``"none"`` | ``"mean"`` (per target length, then batch) | ``"sum"``.
        zero_infinity: infeasible examples give 0.
        backend: ``"native"`` or ``"gtn"``.

    Shape:
        ``forward(emissions (B, T, C), targets, input_lengths (B,), target_lengths (B,))``.
    """

    def __init__(self, num_classes: int, reduction: str = "mean", zero_infinity: bool = False,
                 backend: str = "native") -> None:
        super().__init__()
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = int(num_classes)
        self.transitions = nn.Parameter(torch.zeros(self.num_classes + 1, self.num_classes))
        self.reduction = reduction
        self.zero_infinity = zero_infinity
        self.backend = backend

    def forward(self, emissions, targets, input_lengths, target_lengths=None):
        tr = self.transitions
        if tr.device != emissions.device:
            raise ValueError(f"ASGLoss: transitions are on {tr.device} but emissions on {emissions.device}; "
                             "move the module with .to(device)")
        return lgf.asg_loss(emissions, tr, targets, input_lengths, target_lengths, reduction=self.reduction,
                          zero_infinity=self.zero_infinity, backend=self.backend)

    def viterbi(self, emissions, input_lengths=None, return_paths: bool = False):
        """Best paths through emissions plus these transitions, repeats collapsed."""
        return lgf.viterbi(emissions, input_lengths, blank=None, transitions=self.transitions,
                         return_paths=return_paths)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, reduction={self.reduction!r}"


class SequenceLoss(nn.Module):
    """:func:`lightning_gtn.functional.sequence_loss` (GTN's alignment-free criterion) as a module."""

    def __init__(self, reduction: str = "mean", zero_infinity: bool = False, backend: str = "native") -> None:
        super().__init__()
        self.reduction = reduction
        self.zero_infinity = zero_infinity
        self.backend = backend

    def forward(self, emissions, targets, input_lengths, target_lengths=None):
        return lgf.sequence_loss(emissions, targets, input_lengths, target_lengths, reduction=self.reduction,
                               zero_infinity=self.zero_infinity, backend=self.backend)


class GraphLoss(nn.Module):
    """:func:`lightning_gtn.functional.graph_loss` as a module.

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        zero_infinity: examples without a path give 0.

    Shape:
        ``forward(emissions (B, T, C), graphs, input_lengths (B,), denominators=None)``.
    """

    def __init__(self, reduction: str = "mean", zero_infinity: bool = False) -> None:
        super().__init__()
        self.reduction = reduction
        self.zero_infinity = zero_infinity

    def forward(self, emissions, graphs, input_lengths, denominators=None, weights=None):
        return lgf.graph_loss(emissions, graphs, input_lengths, reduction=self.reduction,
                            denominators=denominators, weights=weights, zero_infinity=self.zero_infinity)
