"""One transducer lattice whose arcs advance time by a duration, as a numba kernel (CPU).

The lattice of an example with ``T`` frames and ``U`` target labels has the nodes ``(t, u)``,
``0 <= t < T``, ``0 <= u <= U``, and reads the joiner output ``x[t, u, :]`` at node ``(t, u)``.
Every arc leaving ``(t, u)`` is one of

* a *token arc* ``k``: emits the next label ``y[u]`` (``u < U``) and goes to
  ``(t + tok_dur[k], u + 1)``;
* a *blank arc* ``k``: emits the class ``blank_ids[k]`` and goes to ``(t + blank_dur[k], u)``
  (``blank_dur[k] >= 1``).

An arc's score is the label's log-probability (the log-softmax of ``x[t, u, :K]``, minus
``sigma``) plus, when its duration index ``*_didx[k] >= 0``, the log-probability of that duration
(the log-softmax of ``x[t, u, K:K + D]``). A path ends with a blank arc from ``(t, U)`` that lands
exactly on ``t + d == T``; a token arc landing on or after ``T`` ends nothing. This covers

* regular RNN-T: one token arc of duration 0, one blank arc of duration 1, no duration logits;
* multi-blank RNN-T (Xu et al., 2022): more blank arcs ("big blanks") with longer durations;
* TDT (token-and-duration transducer, Xu et al., 2023): a token arc per duration and a blank arc
  per positive duration, each adding the duration's log-probability.

:func:`lattice_loss` computes ``-log`` of the total score of the complete paths of every example
and, in the same pass, its gradient with respect to ``x`` (the log-softmax fused: the normalisers
of a node are computed once, the gradient is written straight into one buffer, scaled per example
by the reduction's coefficient). Forward and backward variables are in log space, in float64.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map
from .logmath import log_add

__all__ = ["lattice_loss", "Arcs"]

NEG_INF = -math.inf

#: ``(tok_dur, tok_didx, blank_ids, blank_dur, blank_didx)``: int64 arrays describing the arcs
Arcs = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@njit(cache=True, nogil=True, inline="always")
def _lse_row(x, lo, hi):
    """``logsumexp(x[lo:hi])`` of a 1-D view."""
    m = NEG_INF
    for i in range(lo, hi):
        if x[i] > m:
            m = x[i]
    if m == math.inf:  # the softmax of a +inf logit is undefined: NaN, as torch's log_softmax
        return math.nan
    if m == NEG_INF:
        return m
    s = 0.0
    for i in range(lo, hi):
        s += math.exp(x[i] - m)
    return m + math.log(s)


@njit(cache=True, nogil=True)
def _lattice_kernel(
    e0,
    e1,
    x,
    targets,
    tlen,
    ulen,
    K,
    D,
    tok_dur,
    tok_didx,
    blank_ids,
    blank_dur,
    blank_didx,
    sigma,
    normalise,
    coef,
    scale,
    need_grad,
    accumulate,
    losses,
    grad,
    lam,
):
    """Examples ``e0 .. e1 - 1``: ``losses[e] (+)= scale * (-log Z_e)`` and, with ``need_grad``,
    ``grad[e] (+)= scale * coef[e] * d(-log Z_e)/dx[e]`` (``+=`` with ``accumulate``; positions
    outside the example's lattice are then left alone, else set to 0). ``lam`` is FastEmit's
    weight: every token arc's share of the gradient is scaled by ``1 + lam``."""
    Tmax = x.shape[1]
    U1max = x.shape[2]
    NT = tok_dur.shape[0]
    NB = blank_ids.shape[0]
    for e in range(e0, e1):
        T = tlen[e]
        U = ulen[e]
        if need_grad and not accumulate:  # the nodes outside the lattice (the lattice's are written below)
            for t in range(Tmax):
                for u in range(U1max):
                    if t >= T or u > U:
                        grad[e, t, u, :] = 0.0
        if T <= 0:
            if accumulate:
                losses[e] += scale * math.inf
            else:
                losses[e] = math.inf
            continue
        lz = np.zeros((T, U + 1))  # label normalisers
        dz = np.zeros((T, U + 1))  # duration normalisers
        if normalise:
            for t in range(T):
                for u in range(U + 1):
                    row = x[e, t, u]
                    lz[t, u] = _lse_row(row, 0, K)
                    if D > 0:
                        dz[t, u] = _lse_row(row, K, K + D)
        # arc scores at each node: token arcs (NT), blank arcs (NB)
        tok = np.full((T, U + 1, max(NT, 1)), NEG_INF)
        blk = np.full((T, U + 1, max(NB, 1)), NEG_INF)
        for t in range(T):
            for u in range(U + 1):
                row = x[e, t, u]
                if u < U:
                    base = row[targets[e, u]] - lz[t, u] - sigma
                    for k in range(NT):
                        s = base
                        if tok_didx[k] >= 0:
                            s += row[K + tok_didx[k]] - dz[t, u]
                        tok[t, u, k] = s
                for k in range(NB):
                    s = row[blank_ids[k]] - lz[t, u] - sigma
                    if blank_didx[k] >= 0:
                        s += row[K + blank_didx[k]] - dz[t, u]
                    blk[t, u, k] = s
        # backward variables: beta[t, u] = log of the total score from (t, u) to the end
        beta = np.full((T, U + 1), NEG_INF)
        for t in range(T - 1, -1, -1):
            for u in range(U, -1, -1):
                acc = NEG_INF
                if u < U:
                    for k in range(NT):
                        t2 = t + tok_dur[k]
                        if t2 < T:
                            acc = log_add(acc, tok[t, u, k] + beta[t2, u + 1])
                for k in range(NB):
                    t2 = t + blank_dur[k]
                    if t2 < T:
                        acc = log_add(acc, blk[t, u, k] + beta[t2, u])
                    elif t2 == T and u == U:
                        acc = log_add(acc, blk[t, u, k])
                beta[t, u] = acc
        ll = beta[0, 0]
        if accumulate:
            losses[e] += scale * (-ll)
        else:
            losses[e] = scale * (-ll)
        if not need_grad:
            continue
        if not (ll > NEG_INF and ll < math.inf):
            if not accumulate:
                grad[e, :T, : U + 1, :] = 0.0
            continue
        # forward variables
        alpha = np.full((T, U + 1), NEG_INF)
        alpha[0, 0] = 0.0
        for t in range(T):
            for u in range(U + 1):
                acc = alpha[t, u]
                if u > 0:
                    for k in range(NT):
                        t0 = t - tok_dur[k]
                        if t0 >= 0:
                            acc = log_add(acc, alpha[t0, u - 1] + tok[t0, u - 1, k])
                for k in range(NB):
                    t0 = t - blank_dur[k]
                    if t0 >= 0:
                        acc = log_add(acc, alpha[t0, u] + blk[t0, u, k])
                alpha[t, u] = acc
        g = scale * coef[e]
        w_tok = 1.0 + lam
        for t in range(T):
            for u in range(U + 1):
                a = alpha[t, u]
                gr = grad[e, t, u]
                if not accumulate:
                    gr[:] = 0.0
                if a == NEG_INF:
                    continue
                occ = math.exp(a + beta[t, u] - ll)
                row = x[e, t, u]
                if lam != 0.0 and u < U:  # FastEmit: the token arcs' posteriors count 1 + lam times
                    for k in range(NT):
                        t2 = t + tok_dur[k]
                        if t2 < T:
                            occ += lam * math.exp(a + tok[t, u, k] + beta[t2, u + 1] - ll)
                if normalise and occ > 0.0:
                    lzn = lz[t, u]
                    for v in range(K):
                        gr[v] += g * occ * math.exp(row[v] - lzn)
                    if D > 0:
                        dzn = dz[t, u]
                        for i in range(D):
                            gr[K + i] += g * occ * math.exp(row[K + i] - dzn)
                if u < U:
                    y = targets[e, u]
                    for k in range(NT):
                        t2 = t + tok_dur[k]
                        if t2 < T:
                            p = g * math.exp(a + tok[t, u, k] + beta[t2, u + 1] - ll)
                            if lam != 0.0:
                                p *= w_tok
                            gr[y] -= p
                            if tok_didx[k] >= 0:
                                gr[K + tok_didx[k]] -= p
                for k in range(NB):
                    t2 = t + blank_dur[k]
                    if t2 < T:
                        p = g * math.exp(a + blk[t, u, k] + beta[t2, u] - ll)
                    elif t2 == T and u == U:
                        p = g * math.exp(a + blk[t, u, k] - ll)
                    else:
                        continue
                    gr[blank_ids[k]] -= p
                    if blank_didx[k] >= 0:
                        gr[K + blank_didx[k]] -= p


def lattice_loss(
    x: torch.Tensor,
    targets: np.ndarray,
    tlen: np.ndarray,
    ulen: np.ndarray,
    K: int,
    D: int,
    arcs: Arcs,
    sigma: float,
    normalise: bool,
    coef: np.ndarray,
    need_grad: bool,
    grad: Optional[torch.Tensor] = None,
    losses: Optional[np.ndarray] = None,
    scale: float = 1.0,
    fastemit_lambda: float = 0.0,
) -> Tuple[np.ndarray, Optional[torch.Tensor]]:
    """``(losses (B,) float64, grad)`` of the duration lattice (see the module docstring).

    Args:
        x: ``(B, T, U + 1, V)`` float32/float64 CPU tensor (made contiguous here): label logits in
            ``[0, K)``, duration logits in ``[K, K + D)``.
        targets: ``(B, S)`` int64 label ids in ``[0, K)`` (checked by the caller).
        tlen, ulen: ``(B,)`` int64 frames (``<= T``) and labels (``<= min(S, U)``) per example.
        K, D: the widths of the label and duration groups.
        arcs: the arc description :data:`Arcs`.
        sigma: subtracted from every label log-probability (logit under-normalisation).
        normalise: log-softmax each group (False: ``x`` already holds log-probabilities).
        coef: ``(B,)`` float64 coefficient of each example's gradient (the reduction's).
        need_grad: compute the gradient.
        grad: with ``losses``, the buffer of an earlier call to add ``scale`` times this
            lattice's gradient into (a second lattice mixed in); None: a fresh buffer.
        losses: ``(B,)`` float64 of an earlier call to add ``scale`` times the losses into
            (then ``grad`` must be that call's buffer when ``need_grad``); None: fresh.
        scale: the weight of this lattice when accumulating.
        fastemit_lambda: FastEmit's weight: the gradient of every token arc (its label and its
            duration score) is scaled by ``1 + fastemit_lambda``; the losses are unchanged.
    """
    x = x.detach().contiguous()
    accumulate = losses is not None
    if grad is None:
        grad = torch.empty_like(x) if need_grad else x.new_empty((x.shape[0], 1, 1, 1))
    if losses is None:
        losses = np.zeros(x.shape[0], dtype=np.float64)
    xn = x.numpy()
    gn = grad.numpy()
    tok_dur, tok_didx, blank_ids, blank_dur, blank_didx = arcs
    args = (
        xn,
        np.ascontiguousarray(targets, dtype=np.int64),
        np.ascontiguousarray(tlen, dtype=np.int64),
        np.ascontiguousarray(ulen, dtype=np.int64),
        int(K),
        int(D),
        tok_dur,
        tok_didx,
        blank_ids,
        blank_dur,
        blank_didx,
        float(sigma),
        bool(normalise),
        np.ascontiguousarray(coef, dtype=np.float64),
        float(scale),
        bool(need_grad),
        bool(accumulate),
        losses,
        gn,
        float(fastemit_lambda),
    )
    B = x.shape[0]
    chunks = max(1, min(get_num_threads(), B))
    cuts = [round(i * B / chunks) for i in range(chunks + 1)]
    if chunks == 1:
        _lattice_kernel(0, B, *args)
    else:
        parallel_map(lambda a, b: _lattice_kernel(a, b, *args), cuts[:-1], cuts[1:])
    return losses, (grad if need_grad else None)
