"""Auto Segmentation criterion (ASG): no blank, learned transition scores."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core import criterion, normalisers
from ..core.criterion_graphs import compiled_asg_full, compiled_asg_target
from ..core.scoring import Plan, normalised_plan, score, unique_graphs

__all__ = ["asg_loss"]


class _ASG(criterion.Criterion):
    """Row ``b``: ``log Z(full transition graph) - log Z(target graph)``; arc weights are
    gathered from the transitions.

    The fully connected normaliser is scored by
    :class:`lightning_gtn.core.normalisers.FullyConnected` (a numba recursion per example or
    matrix products per frame; off the CPU from ``DENSE_MIN_CLASSES`` classes on) instead of arc
    by arc; the target graphs keep the graph path.
    """

    kind = "asg"
    name = "asg_loss"
    backends = criterion.NATIVE_BACKENDS + ("gtn",)

    def check_options(self, C, blank, weights, device):
        check_transitions(weights, C, device)
        return 0, weights

    def gtn_losses(self, emissions, weights, seqs, lengths, blank, zero_infinity):
        from ..core.gtn_backend import gtn_asg_losses

        return gtn_asg_losses(emissions, weights, seqs, lengths, zero_infinity)

    def plan(self, seqs, lengths, C, blank):
        full = compiled_asg_full(C)
        plan = normalised_plan(full, [compiled_asg_target(t, C) for t in seqs], lengths)
        return plan, plan.batch.weight_index()

    def score(self, E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef):
        C = E.shape[2]
        if not normalisers.use_fully_connected(C, E.device):
            return super().score(E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef)
        B = E.shape[0]
        need_w = w_coef is not None
        full = normalisers.FullyConnected(E, weights, lengths, need_e or need_w)
        logz, gE_f = full.logz, full.grad_emissions
        ok_full = (logz > -float("inf")).to(E.dtype)  # length 0: no path through the full graph
        graphs, ids = unique_graphs([compiled_asg_target(t, C) for t in seqs])
        plan = Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B)
        widx = torch.from_numpy(plan.batch.weight_index()).to(E.device)
        t_coef = None if w_coef is None else w_coef.to(E.dtype) * ok_full
        t_loss, gE_t, gw_t = score(plan, E, weights.reshape(-1)[widx].to(E.dtype), impl, False, need_e, t_coef)
        losses = torch.where(ok_full > 0, logz + t_loss, torch.full_like(logz, float("inf")))
        ok = torch.isfinite(losses).to(E.dtype)
        if zero_infinity:  # infeasible rows only: a normaliser of +inf (an infinite emission) stays
            losses = torch.where((losses == float("inf")) & (logz != float("inf")), torch.zeros_like(losses), losses)
        gE = gW = None
        if need_w:  # first: it reads the full graph's occupancies gE_f
            gW = full.transitions_grad(w_coef.to(E.dtype) * ok)
            gW = gW.reshape(-1).index_add_(0, widx, gw_t).reshape(weights.shape)
        if need_e:
            gE = gE_f.add_(gE_t).mul_(ok.reshape(-1, 1, 1))  # fresh buffers: in place
        return losses, gE, gW


criterion.CRITERIA["asg"] = _ASG()


def check_transitions(transitions, C: int, device: torch.device, name: str = "transitions") -> None:
    """``transitions`` must be a float ``(C + 1, C)`` tensor on the emissions' device."""
    if not isinstance(transitions, torch.Tensor) or tuple(transitions.shape) != (C + 1, C):
        got = tuple(transitions.shape) if isinstance(transitions, torch.Tensor) else type(transitions).__name__
        raise ValueError(f"{name} must be a tensor of shape (C + 1, C) = ({C + 1}, {C}), got {got}")
    if not transitions.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor, got {transitions.dtype}")
    if transitions.device != device:
        raise ValueError(f"{name} is on {transitions.device} but the emissions are on {device}")


def asg_loss(
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    transitions: torch.Tensor,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
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
        targets: padded ``(B, S)``, concatenated 1-D (with ``target_lengths``), or a list of
            B label sequences. Labels in ``[0, C)``.
        input_lengths: ``(B,)`` integer frames per example, ``<= T``.
        target_lengths: ``(B,)``; needed with tensor targets.
        transitions: keyword-only, ``(C + 1, C)`` scores on the emissions' device; row 0 holds
            the start scores. Receives a gradient when it requires one.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its
            target length (at least 1), then averaged.
        zero_infinity: a target longer than its input has no path (infinite loss); with
            ``zero_infinity=True`` its loss is 0. Its gradient is zero either way.
        impl: as :func:`~lightning_gtn.functional.ctc_loss`.

    Returns:
        Loss in the emissions' dtype and device (scalar, or ``(B,)`` for ``"none"``).
    """
    return criterion.apply_loss(
        criterion.CRITERIA["asg"],
        emissions,
        targets,
        input_lengths,
        target_lengths,
        weights=transitions,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
    )
