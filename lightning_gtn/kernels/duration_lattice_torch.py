"""The duration lattice of :mod:`.duration_lattice_numba` in plain torch: a reference on any device.

Differentiable by autograd (no hand-written backward), vectorised over the batch only: one
small step per lattice node, so it is meant for tests, small problems and devices without a
kernel of their own. Same arcs, same meanings as :func:`.duration_lattice_numba.lattice_loss`.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

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
    neg = x.new_full((B,), _NEG)
    zero = x.new_zeros((B,))
    alpha: List[List[torch.Tensor]] = [[neg] * U1 for _ in range(T)]
    for t in range(T):
        for u in range(U1):
            terms = [zero] if (t == 0 and u == 0) else []
            if u > 0:
                for d, di in zip(tok_dur, tok_didx):
                    t0 = t - d
                    if t0 >= 0:
                        s = alpha[t0][u - 1] + ytok[:, t0, u - 1]
                        if di >= 0:
                            s = s + dtok[:, t0, u - 1, di]
                        terms.append(s)
            for c, d, di in zip(blank_ids, blank_dur, blank_didx):
                t0 = t - d
                if t0 >= 0:
                    s = alpha[t0][u] + lab[:, t0, u, c]
                    if di >= 0:
                        s = s + dur[:, t0, u, di]
                    terms.append(s)
            if terms:
                alpha[t][u] = torch.logsumexp(torch.stack(terms), 0).clamp(min=_NEG)
    out = []
    for b in range(B):
        Tb, Ub = int(tlen[b]), int(ulen[b])
        terms = []
        for c, d, di in zip(blank_ids, blank_dur, blank_didx):
            t0 = Tb - d
            if 0 <= t0 < T and Ub < U1:
                s = alpha[t0][Ub][b] + lab[b, t0, Ub, c]
                if di >= 0:
                    s = s + dur[b, t0, Ub, di]
                terms.append(s)
        if not terms:
            out.append(x.new_tensor(float("inf")))
            continue
        ll = torch.logsumexp(torch.stack(terms), 0)
        out.append(torch.where(ll < _INFEASIBLE, ll.new_tensor(float("inf")), -ll))
    return torch.stack(out)


def _scaled_grad(v: torch.Tensor, lam: float) -> torch.Tensor:
    """``v``'s values with ``1 + lam`` times its gradient (a non-finite entry passes unchanged)."""
    d = v - v.detach()
    return v + lam * torch.where(torch.isfinite(v), d, torch.zeros_like(d))
