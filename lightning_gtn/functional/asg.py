"""Auto Segmentation criterion (ASG): no blank, learned transition scores."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import _asg_dense, _common
from ._graphs import compiled_asg_full, compiled_asg_target

__all__ = ["asg_loss"]


class _ASGFunction(_common.ScoreFunction):
    """Per-example ASG losses ``(B,)``: ``log Z(full graph) - log Z(target graph)``."""


def asg_plan(seqs, lengths: np.ndarray, C: int) -> _common.Plan:
    """Examples: the shared fully connected graph (+) and each target's graph (-) per row."""
    full = compiled_asg_full(C)
    return _common.normalised_plan(full, [compiled_asg_target(t, C) for t in seqs], lengths)


def asg_loss(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    reduction: str = "mean",
    zero_infinity: bool = False,
    backend: str = "native",
    _impl: Optional[str] = None,
) -> torch.Tensor:
    """The ASG loss (Collobert et al., 2016): full-graph score minus target score.

    Paths read one label per frame (no blank). A path's score is the sum of its emissions
    plus transition scores: ``transitions[0, y]`` for the first label ``y`` and
    ``transitions[i + 1, j]`` each time label ``i`` follows label ``j`` (staying on a label,
    ``i == j``, is a transition too). The loss of an example is ``logsumexp`` over all label
    paths of its frames minus ``logsumexp`` over the paths that spell the target, each target
    token covering one or more consecutive frames (the layout of gtn_applications' ASG).

    Args:
        emissions: ``(B, T, C)`` frame scores (unnormalised is fine). float32/float64;
            float16/bfloat16 are scored in float32.
        transitions: ``(C + 1, C)`` scores on the emissions' device; row 0 holds the start
            scores. Receives a gradient when it requires one.
        targets: padded ``(B, S)``, concatenated 1-D (with ``target_lengths``), or a list of
            B label sequences. Labels in ``[0, C)``.
        input_lengths: ``(B,)`` frames per example, ``<= T``.
        target_lengths: ``(B,)``; needed with tensor targets.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its
            target length (at least 1), then averaged.
        zero_infinity: a target longer than its input has no path (infinite loss); with
            ``zero_infinity=True`` its loss is 0. Its gradient is zero either way.
        backend: ``"native"`` or ``"gtn"`` (the real ``gtn`` package, when installed).

    Returns:
        Loss in the emissions' dtype and device (scalar, or ``(B,)`` for ``"none"``).
    """
    B, T, C = _common.check_call(emissions, "emissions", reduction)
    if not isinstance(transitions, torch.Tensor) or tuple(transitions.shape) != (C + 1, C):
        shape = tuple(transitions.shape) if isinstance(transitions, torch.Tensor) else type(transitions).__name__
        raise ValueError(f"transitions must be a tensor of shape (C + 1, C) = ({C + 1}, {C}), got {shape}")
    if transitions.device != emissions.device:
        raise ValueError(f"transitions is on {transitions.device} but emissions is on {emissions.device}")
    lengths, seqs, tlen = _common.lengths_and_targets(input_lengths, targets, target_lengths, (B, T, C),
                                                      emissions.device)
    if _common.use_gtn(backend):
        from ._gtn_backend import gtn_asg_losses

        losses = gtn_asg_losses(emissions, transitions, seqs, lengths, zero_infinity)
        return _common.reduce_losses(losses, reduction, tlen)
    impl = _common.pick_impl(emissions, _impl)
    dtype = _common.compute_dtype(emissions)
    x = emissions.to(dtype)
    # --- large alphabets: the normaliser by matrix products (see _asg_dense), targets as below
    if C >= _asg_dense.DENSE_MIN_CLASSES:
        losses = _asg_dense.asg_losses(x, transitions.to(dtype), seqs, lengths, impl, bool(zero_infinity),
                                       _ASGFunction)
        return _common.reduce_losses(losses, reduction, tlen).to(emissions.dtype)
    # ---
    plan = asg_plan(seqs, lengths, C)
    tr = transitions.to(dtype)
    widx = torch.from_numpy(plan.batch.weight_index()).to(x.device)
    w = tr.reshape(-1)[widx]  # one differentiable gather: arc weights follow the transitions
    need_w = bool(tr.requires_grad and torch.is_grad_enabled())
    losses = _ASGFunction.apply(x, w, plan, impl, bool(zero_infinity), need_w)
    return _common.reduce_losses(losses, reduction, tlen).to(emissions.dtype)
