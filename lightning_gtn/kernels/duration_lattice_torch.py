"""The duration lattice of :mod:`.duration_lattice_numba` in plain torch: a reference on any device.

The arcs become the arc kinds of :mod:`.transducer_lattice_torch` (a token arc of duration ``d``
is ``(d, 1)``, a blank arc ``(d, 0)``), whose recursion takes one vectorised step per
anti-diagonal ``t + u`` and whose backward pass gives the arcs' posteriors; autograd carries them
through the log-softmax. Same arcs, same meanings as :func:`.duration_lattice_numba.lattice_loss`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .transducer_lattice_torch import lattice_logz, transducer_arc_mask

__all__ = ["lattice_loss_torch"]

# a finite stand-in for log(0): torch.logsumexp of all -inf has a NaN gradient; sums of a few of
# these stay finite in float32, and anything below _INFEASIBLE is an infeasible example
_NEG = -1.0e30
_INFEASIBLE = -1.0e29


def lattice_loss_torch(
    x: torch.Tensor,
    targets: torch.Tensor,
    tlen: torch.Tensor,
    ulen: torch.Tensor,
    K: int,
    D: int,
    tok_dur: Sequence[int],
    tok_didx: Sequence[int],
    blank_ids: Sequence[int],
    blank_dur: Sequence[int],
    blank_didx: Sequence[int],
    sigma: float,
    normalise: bool = True,
    fastemit_lambda: float = 0.0,
) -> torch.Tensor:
    """``(B,)`` losses ``-log Z`` (``inf`` for an example without a complete path), differentiable.

    Args:
        x: ``(B, T, U + 1, V)`` float scores: labels in ``[0, K)``, durations in ``[K, K + D)``.
        targets: ``(B, S)`` int64 labels in ``[0, K)``, ``S >= max(ulen)``.
        tlen, ulen: ``(B,)`` int64 frames and labels of each example.
        K, D: widths of the label and duration groups.
        tok_dur, tok_didx, blank_ids, blank_dur, blank_didx: the arcs, as in
            :mod:`.duration_lattice_numba` (a duration index of -1: no duration score).
        sigma: subtracted from every label log-probability.
        normalise: log-softmax each group; False: ``x`` holds log-probabilities.
        fastemit_lambda: FastEmit's weight: the gradient of every token arc's score (label and
            duration) is scaled by ``1 + fastemit_lambda``; the values are unchanged.
    """
    B, T, U1, _ = x.shape
    dev = x.device
    lab = x[..., :K]
    dur = x[..., K : K + D]
    if normalise:
        lab = lab.log_softmax(-1)
        if D > 0:
            dur = dur.log_softmax(-1)
    lab = lab - sigma
    S = targets.shape[1] if targets.dim() == 2 else 0
    tg = torch.zeros((B, U1), dtype=torch.long, device=dev)
    n = min(S, U1)
    if n:
        tg[:, :n] = targets[:, :n].to(dev).clamp(0, K - 1)
    # label log-probability of the next target at every node: (B, T, U1)
    ytok = lab.gather(3, tg[:, None, :, None].expand(B, T, U1, 1)).squeeze(3)
    dtok = dur
    if fastemit_lambda != 0.0:  # the token arcs' scores: same values, gradient times 1 + lambda
        ytok = _scaled_grad(ytok, fastemit_lambda)
        dtok = _scaled_grad(dur, fastemit_lambda)
    # the arc kinds: every token arc (one label), then every blank arc
    dts = [int(d) for d in tok_dur] + [int(d) for d in blank_dur]
    dus = [1] * len(tok_dur) + [0] * len(blank_dur)
    kinds = []
    for di in tok_didx:
        kinds.append(ytok if di < 0 else ytok + dtok[..., di])
    for c, di in zip(blank_ids, blank_didx):
        kinds.append(lab[..., c] if di < 0 else lab[..., c] + dur[..., di])
    s = torch.stack(kinds, dim=3)  # (B, T, U + 1, A), at least float32 (_NEG fits)
    s = s.to(torch.promote_types(s.dtype, torch.float32))
    s = torch.cat([s, s.new_full((B, 1, U1, len(dts)), _NEG)], dim=1)  # the end row t = T
    Tb = tlen.to(device=dev, dtype=torch.long)
    Ub = ulen.to(device=dev, dtype=torch.long)
    s = torch.where(transducer_arc_mask(T + 1, dts, dus, Tb), s, torch.full((), _NEG, dtype=s.dtype, device=dev))
    end = torch.stack([Tb.clamp(min=0), Ub], dim=1)
    ll = lattice_logz(s, dts, dus, torch.zeros_like(end), end)
    out = torch.where((Tb <= 0) | (ll < _INFEASIBLE), torch.full_like(ll, float("inf")), -ll)
    return out.to(x.dtype)


def _scaled_grad(v: torch.Tensor, lam: float) -> torch.Tensor:
    """``v``'s values with ``1 + lam`` times its gradient (a non-finite entry passes unchanged)."""
    d = v - v.detach()
    return v + lam * torch.where(torch.isfinite(v), d, torch.zeros_like(d))
