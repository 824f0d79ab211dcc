"""The regular RNN-T loss in plain torch ops (any device): the reference for the numba kernel and
the fallback where no kernel of this library runs.

``log_softmax`` over the classes (unless the logits are log-probabilities already), then the
lattice of :mod:`.transducer_lattice_torch` with two arc kinds, blank ``(1, 0)`` and token
``(0, 1)``, over the nodes ``(t, u)``, ``t <= T``: a path ends with the blank that lands on row
``t = T``. :func:`rnnt_costs_torch` is differentiable (the lattice's backward pass gives the
arcs' posteriors); :func:`rnnt_cost_grad_torch` writes the logits' gradient from them by hand.

Impossible arcs carry a large negative finite score instead of ``-inf``, so that no
log-add-exp meets ``-inf - -inf`` (NaN); costs at or above :data:`INFEASIBLE` are reported as
``inf``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .transducer_lattice_torch import lattice_logz, lattice_posteriors, transducer_arc_mask

__all__ = ["rnnt_costs_torch", "rnnt_cost_grad_torch", "INFEASIBLE"]

#: the score of an impossible node (finite: see the module docstring)
_NEG = -1.0e30
#: costs from here up are infeasible examples (reported as ``inf``)
INFEASIBLE = 1.0e29


def rnnt_costs_torch(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused_log_softmax: bool = True,
    fastemit_lambda: float = 0.0,
) -> Tensor:
    """``(B,)`` costs ``-log P(y_b | x_b)`` of logits ``(B, T, U + 1, V)``, differentiable.

    Args:
        logits: ``(B, T, U + 1, V)`` joiner outputs (or log-probabilities with
            ``fused_log_softmax=False``), any float dtype and device.
        targets: ``(B, S)`` int64 on ``logits.device``, ``S >= max(target_lengths)``; entries past
            a target's length are ignored. Ids must lie in ``[0, V)``.
        logit_lengths: ``(B,)`` int64, ``0 <= logit_lengths <= T``.
        target_lengths: ``(B,)`` int64, ``0 <= target_lengths <= U``.
        blank: the blank's class id in ``[0, V)``.
        fused_log_softmax: apply ``log_softmax`` over the classes first (torchaudio's meaning).
        fastemit_lambda: FastEmit: the gradient of every emit arc is scaled by ``1 + lambda``
            (the value is unchanged; the caller scales the reported cost).

    Returns:
        ``(B,)`` costs in the logits' dtype; ``inf`` for infeasible examples (their gradient is 0).
    """
    B, T, U1, V = logits.shape
    dev = logits.device
    if T == 0 or B == 0:  # no frames: every example is infeasible
        return torch.full((B,), float("inf"), dtype=logits.dtype, device=dev) + logits.sum() * 0
    lp = torch.log_softmax(logits, dim=-1) if fused_log_softmax else logits
    lp = lp.clamp(min=_NEG)  # -inf log-probabilities: finite and far below any path
    U = U1 - 1
    if U > 0:
        blank_lp, emit_lp, _ = _emit_and_blank(lp, targets, target_lengths, blank)
        if fastemit_lambda:
            lam = float(fastemit_lambda)
            emit_lp = (1.0 + lam) * emit_lp - lam * emit_lp.detach()
    else:
        blank_lp, emit_lp = lp[..., blank], lp.new_zeros((B, T, 0))
    Tb = logit_lengths.to(device=dev, dtype=torch.long)
    begin, end = _corners(Tb, target_lengths.to(device=dev, dtype=torch.long))
    logz = lattice_logz(_arc_scores(blank_lp, emit_lp, Tb), _DT, _DU, begin, end)
    costs = -logz
    infeasible = (Tb <= 0) | (costs >= INFEASIBLE)
    return torch.where(infeasible, torch.full_like(costs, float("inf")), costs)


#: the arc kinds of the regular lattice: blank (one frame), then token (one label)
_DT, _DU = (1, 0), (0, 1)


def _arc_scores(blank_lp: Tensor, emit_lp: Tensor, Tb: Tensor) -> Tensor:
    """``(B, T + 1, U + 1, 2)`` arc scores of the regular lattice (blank, token) from ``blank_lp``
    ``(B, T, U + 1)`` and ``emit_lp`` ``(B, T, U)``; row ``T`` and the arcs that no path of an
    example with ``Tb`` frames takes (see :func:`transducer_arc_mask`) are :data:`_NEG`."""
    B, T, U1 = blank_lp.shape
    s = blank_lp.new_full((B, T + 1, U1, 2), _NEG, dtype=torch.promote_types(blank_lp.dtype, torch.float32))
    s[:, :T, :, 0] = blank_lp
    s[:, :T, : U1 - 1, 1] = emit_lp
    return s.masked_fill(~transducer_arc_mask(T + 1, _DT, _DU, Tb), _NEG)


def _corners(Tb: Tensor, Ub: Tensor) -> Tuple[Tensor, Tensor]:
    """The lattice's first and last nodes, ``(B, 2)`` each: ``(0, 0)`` and ``(Tb, Ub)`` (the end row
    ``t = Tb`` is reached by the final blank); ``Tb`` is clipped to ``>= 0``."""
    end = torch.stack([Tb.clamp(min=0), Ub], dim=1)
    return torch.zeros_like(end), end


def _emit_and_blank(lp: Tensor, targets: Tensor, target_lengths: Tensor, blank: int) -> Tuple[Tensor, Tensor, Tensor]:
    """``(blank_lp (B, T, U + 1), emit_lp (B, T, U), ids (B, U))`` of log-probabilities ``lp``
    (padding ids replaced by 0)."""
    B, T, U1, V = lp.shape
    U = U1 - 1
    blank_lp = lp[..., blank]
    S = targets.shape[1]
    tg = targets[:, :U] if S >= U else torch.nn.functional.pad(targets, (0, U - S))
    valid_u = torch.arange(U, device=lp.device)[None, :] < target_lengths[:, None]
    tg = torch.where(valid_u, tg, torch.zeros_like(tg)).clamp(0, V - 1)
    emit_lp = lp[:, :, :U].gather(3, tg[:, None, :, None].expand(B, T, U, 1)).squeeze(3)
    return blank_lp, emit_lp, tg


def rnnt_cost_grad_torch(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused_log_softmax: bool,
    fastemit_lambda: float,
    clamp: float,
    scale: Optional[Tensor],
) -> Tuple[Tensor, Optional[Tensor]]:
    """``(costs (B,), grad or None)`` from the lattice's arc posteriors (no autograd: usable inside
    a custom op), the same formulas as
    :mod:`lightning_gtn.kernels.rnnt_numba`: ``grad`` is ``scale[b] * d cost[b] / d logits``
    (clipped to ``[-clamp, clamp]`` first when ``clamp > 0``; FastEmit scales the emit arcs'
    gradient by ``1 + lambda``), zero outside each example's grid and for infinite costs. No
    gradient when ``scale`` is None. Inputs as :func:`rnnt_costs_torch`.
    """
    B, T, U1, V = logits.shape
    dev = logits.device
    x = logits.detach()
    if T == 0 or B == 0:
        costs = torch.full((B,), float("inf"), dtype=x.dtype, device=dev)
        return costs, (None if scale is None else torch.zeros_like(x))
    U = U1 - 1
    lp = torch.log_softmax(x, dim=-1) if fused_log_softmax else x.clone()
    # -inf log-probabilities become _NEG in the arc scores (the lattice's rule)
    blank_lp, emit_lp, tg = _emit_and_blank(lp, targets, target_lengths, blank)
    Tb = logit_lengths.to(device=dev, dtype=torch.long)
    Ub = target_lengths.to(device=dev, dtype=torch.long)
    begin, end = _corners(Tb, Ub)
    logz, post = lattice_posteriors(_arc_scores(blank_lp, emit_lp, Tb), _DT, _DU, begin, end, scale is not None)
    costs = -logz.to(x.dtype)
    infeasible = (Tb <= 0) | (costs >= INFEASIBLE)
    costs = torch.where(infeasible, torch.full_like(costs, float("inf")), costs)
    if post is None or scale is None:
        return costs, None
    lam = float(fastemit_lambda)
    ts = torch.arange(T, device=dev).reshape(1, T, 1)
    us = torch.arange(U1, device=dev).reshape(1, 1, U1)
    valid = (ts < Tb.reshape(B, 1, 1)) & (us <= Ub.reshape(B, 1, 1)) & ~infeasible.reshape(B, 1, 1)
    post = post.to(lp.dtype)
    pb = post[:, :T, :, 0]  # the arcs' posteriors: blank (the final one included) and token
    pe = post[:, :T, :, 1]
    if fused_log_softmax:
        coef = pb + (1.0 + lam) * pe  # the node's occupancy, FastEmit's extra share of the tokens
        g = lp.exp_().mul_(coef.unsqueeze(3))  # softmax * coef, in the log_softmax buffer
    else:
        g = lp.zero_()
    g[..., blank] -= pb
    if U:
        g[:, :, :U].scatter_add_(3, tg[:, None, :, None].expand(B, T, U, 1), -((1.0 + lam) * pe[:, :, :U]).unsqueeze(3))
    g.masked_fill_(~valid.unsqueeze(3), 0.0)
    if clamp > 0:
        g.clamp_(-clamp, clamp)
    g.mul_(scale.to(device=dev, dtype=g.dtype).reshape(B, 1, 1, 1))
    return costs, g
