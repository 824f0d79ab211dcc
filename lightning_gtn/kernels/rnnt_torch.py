"""The regular RNN-T loss in plain torch ops (any device, autograd): the reference for the
numba kernel and the fallback where no kernel of this library runs.

``log_softmax`` over the classes (unless the logits are log-probabilities already), then the
forward recursion over the anti-diagonals ``n = t + u`` of the ``(T, U + 1)`` grid: every node of
a diagonal depends only on the previous one, so a diagonal is one vectorised step. The gradient
comes from autograd through that recursion.

Impossible nodes carry a large negative finite score instead of ``-inf``, so that autograd never
meets ``-inf - -inf`` (NaN) in a log-add-exp; costs at or above :data:`INFEASIBLE` are reported as
``inf``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .logmath import log_add_torch

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
    blank_lp = lp[..., blank]  # (B, T, U + 1)
    if U > 0:
        S = targets.shape[1]
        tg = targets[:, :U] if S >= U else torch.nn.functional.pad(targets, (0, U - S))
        valid_u = torch.arange(U, device=dev)[None, :] < target_lengths[:, None]
        tg = torch.where(valid_u, tg, torch.zeros_like(tg)).clamp(0, V - 1)
        emit_lp = lp[:, :, :U].gather(3, tg[:, None, :, None].expand(B, T, U, 1)).squeeze(3)  # (B, T, U)
        if fastemit_lambda:
            lam = float(fastemit_lambda)
            emit_lp = (1.0 + lam) * emit_lp - lam * emit_lp.detach()
    else:
        emit_lp = lp.new_zeros((B, T, 0))
    neg = torch.full((B, 1), _NEG, dtype=lp.dtype, device=dev)
    us = torch.arange(U1, device=dev)
    # diagonal n holds alpha(n - u, u) at position u
    prev = torch.cat([lp.new_zeros((B, 1)), neg.expand(B, U)], dim=1)  # n = 0
    diagonals = [prev]
    for n in range(1, T + U):
        t_b = n - 1 - us  # blank arc from (t_b, u) at diagonal n - 1
        ok_b = (t_b >= 0) & (t_b < T)
        from_blank = prev + blank_lp[:, t_b.clamp(0, T - 1), us]
        from_blank = torch.where(ok_b[None, :], from_blank, neg)
        if U > 0:
            t_e = n - us[1:]  # emit arc from (t_e, u - 1)
            ok_e = (t_e >= 0) & (t_e < T)
            e = prev[:, :U] + emit_lp[:, t_e.clamp(0, T - 1), us[:-1]]
            e = torch.where(ok_e[None, :], e, neg)
            from_emit = torch.cat([neg, e], dim=1)
            cur = log_add_torch(from_blank, from_emit)
        else:
            cur = from_blank
        ok = ((n - us) >= 0) & ((n - us) < T)
        cur = torch.where(ok[None, :], cur, neg)
        diagonals.append(cur)
        prev = cur
    alpha = torch.stack(diagonals, dim=1)  # (B, T + U, U + 1)
    Tb = logit_lengths.to(torch.long)
    Ub = target_lengths.to(torch.long)
    n_end = (Tb - 1 + Ub).clamp(min=0)
    bi = torch.arange(B, device=dev)
    last = alpha[bi, n_end, Ub] + blank_lp[bi, (Tb - 1).clamp(min=0), Ub]
    costs = -last
    infeasible = (Tb <= 0) | (costs >= INFEASIBLE)
    return torch.where(infeasible, torch.full_like(costs, float("inf")), costs)


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
    """``(costs (B,), grad or None)`` by hand-written alpha/beta recursions in torch ops (no
    autograd: usable inside a custom op), the same formulas as
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
    safe = lp.clamp(min=_NEG)
    blank_lp, emit_lp, tg = _emit_and_blank(safe, targets, target_lengths, blank)
    Tb = logit_lengths.to(torch.long).reshape(B, 1)
    Ub = target_lengths.to(torch.long).reshape(B, 1)
    neg = torch.tensor(_NEG, dtype=x.dtype, device=dev)
    alpha = torch.full((B, T, U1), _NEG, dtype=x.dtype, device=dev)
    beta = torch.full((B, T, U1), _NEG, dtype=x.dtype, device=dev)
    alpha[:, 0, 0] = 0.0
    for n in range(1, T + U):
        u = torch.arange(max(0, n - T + 1), min(n, U) + 1, device=dev)
        t = n - u
        fb = torch.where(
            (t >= 1)[None, :], alpha[:, (t - 1).clamp(min=0), u] + blank_lp[:, (t - 1).clamp(min=0), u], neg
        )
        if U:
            um = (u - 1).clamp(min=0)
            fe = torch.where((u >= 1)[None, :], alpha[:, t, um] + emit_lp[:, t, um], neg)
            alpha[:, t, u] = log_add_torch(fb, fe)
        else:
            alpha[:, t, u] = fb
    for n in range(T + U - 1, -1, -1):
        u = torch.arange(max(0, n - T + 1), min(n, U) + 1, device=dev)
        t = n - u
        tt, uu = t[None, :], u[None, :]
        nxt_b = beta[:, (t + 1).clamp(max=T - 1), u]
        final = (tt == Tb - 1) & (uu == Ub)
        fb = torch.where(tt + 1 < Tb, nxt_b, torch.where(final, torch.zeros_like(nxt_b), neg)) + blank_lp[:, t, u]
        if U:
            nxt_e = beta[:, t, (u + 1).clamp(max=U)] + emit_lp[:, t, u.clamp(max=U - 1)]
            fe = torch.where(uu < Ub, nxt_e, neg)
        else:
            fe = torch.full_like(fb, _NEG)
        val = log_add_torch(fb, fe)
        beta[:, t, u] = torch.where((tt < Tb) & (uu <= Ub), val, neg)
    logz = beta[:, 0, 0]
    costs = -logz
    infeasible = (Tb.reshape(B) <= 0) | (costs >= INFEASIBLE)
    costs = torch.where(infeasible, torch.full_like(costs, float("inf")), costs)
    if scale is None:
        return costs, None
    lam = float(fastemit_lambda)
    ts = torch.arange(T, device=dev).reshape(1, T, 1)
    us = torch.arange(U1, device=dev).reshape(1, 1, U1)
    valid = (ts < Tb.reshape(B, 1, 1)) & (us <= Ub.reshape(B, 1, 1)) & ~infeasible.reshape(B, 1, 1)
    lz = logz.reshape(B, 1, 1)
    nb = torch.cat([beta[:, 1:], torch.full((B, 1, U1), _NEG, dtype=x.dtype, device=dev)], dim=1)
    final = (ts == Tb.reshape(B, 1, 1) - 1) & (us == Ub.reshape(B, 1, 1))
    nb = torch.where(final, torch.zeros_like(nb), nb)
    pb = torch.exp(alpha + blank_lp + nb - lz)
    pe = torch.zeros_like(pb)
    if U:
        pe[:, :, :U] = torch.exp(alpha[:, :, :U] + emit_lp + beta[:, :, 1:] - lz)
        pe[:, :, :U] *= (torch.arange(U, device=dev).reshape(1, 1, U) < Ub.reshape(B, 1, 1)).to(x.dtype)
    if fused_log_softmax:
        coef = torch.exp(alpha + beta - lz) + lam * pe
        g = lp.exp_().mul_(coef.unsqueeze(3))  # softmax * coef, in the log_softmax buffer
    else:
        g = lp.zero_()
    g[..., blank] -= pb
    if U:
        g[:, :, :U].scatter_add_(3, tg[:, None, :, None].expand(B, T, U, 1), -((1.0 + lam) * pe[:, :, :U]).unsqueeze(3))
    g = torch.where(valid.unsqueeze(3), g, torch.zeros((), dtype=g.dtype, device=dev))
    if clamp > 0:
        g.clamp_(-clamp, clamp)
    g.mul_(scale.to(device=dev, dtype=g.dtype).reshape(B, 1, 1, 1))
    return costs, g
