"""The regular RNN-T loss as numba kernels (CPU), the log-softmax fused.

Three passes, no ``(B, T, U + 1, V)`` temporary besides the gradient itself:

1. :func:`_rows_pass` (threads over ``(b, t)`` rows): one read of each vector ``logits[b, t, u]``
   gives its normaliser ``den = logsumexp_v logits[b, t, u, v]`` and the two log-probabilities the
   lattice reads, ``lp_blank = logits[.., blank] - den`` and ``lp_emit = logits[.., y_u] - den``.
2. :func:`_lattice_pass` (threads over examples): alpha and beta over the ``(T_b, U_b + 1)`` grid in
   log space, float64; ``logZ = beta[0, 0]``. Extra memory ``O(B * T * U)``.
3. :func:`_rows_pass` again, writing the gradient straight into one buffer (the logits' own storage
   when the caller allows):
   ``grad[v] = (gamma + lam * p_emit) * softmax[v] - p_blank [v == blank] - (1 + lam) * p_emit [v == y_u]``
   with ``gamma = exp(alpha + beta - logZ)`` the occupancy of node ``(t, u)``, ``p_blank`` and
   ``p_emit`` the posteriors of its two arcs and ``lam`` the FastEmit weight (the emit arcs'
   gradient scaled by ``1 + lam``, as NeMo/warprnnt-numba do), then clipped to ``[-clamp, clamp]``
   (``clamp > 0``) and multiplied by the example's reduction coefficient. Without the fused
   log-softmax (``fused=False``: the logits are log-probabilities already) only the two arc
   entries are non-zero: ``-p_blank`` and ``-(1 + lam) * p_emit`` (torchaudio's convention).

The kernels release the GIL and run on the engine's bounded thread pool
(:func:`lightning_gtn.wfst.parallel.parallel_map`), which is fork-safe and never nests; every
index they read was range-checked by the caller (:func:`rnnt_cost_grad` checks again what a
kernel would read out of bounds with).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

__all__ = ["rnnt_cost_grad"]

NEG_INF = -math.inf


@njit(cache=True, nogil=True, inline="always")
def _lse(a, b):
    """``log(exp(a) + exp(b))``, NaN in gives NaN out."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@njit(cache=True, nogil=True)
def _normalise_rows(x, tg, tl, il, blank, fused, r0, r1, den, lpb, lpe):
    """Rows ``r = b * T + t`` in ``[r0, r1)`` with ``t < il[b]``: ``den``, ``lpb``, ``lpe`` for
    ``u <= tl[b]`` (pass 1)."""
    T = x.shape[1]
    V = x.shape[3]
    for r in range(r0, r1):
        b = r // T
        t = r - b * T
        if t >= il[b]:
            continue
        Ub = tl[b]
        for u in range(Ub + 1):
            row = x[b, t, u]
            d = 0.0
            if fused:
                m = row[0]
                for v in range(1, V):
                    if row[v] > m:
                        m = row[v]
                s = 0.0
                for v in range(V):
                    s += math.exp(row[v] - m)
                d = m + math.log(s)
            den[b, t, u] = d
            lpb[b, t, u] = row[blank] - d
            if u < Ub:
                lpe[b, t, u] = row[tg[b, u]] - d


@njit(cache=True, nogil=True)
def _lattice(e0, e1, il, tl, lpb, lpe, alpha, beta, logz):
    """Examples ``e0 .. e1 - 1``: alpha, beta and ``logz[b] = beta[b, 0, 0]`` (-inf when
    ``il[b] == 0``: no frame to emit the final blank from)."""
    for b in range(e0, e1):
        T = il[b]
        U = tl[b]
        if T <= 0:
            logz[b] = NEG_INF
            continue
        a = alpha[b]
        p = lpb[b]
        q = lpe[b]
        a[0, 0] = 0.0
        for u in range(1, U + 1):
            a[0, u] = a[0, u - 1] + q[0, u - 1]
        for t in range(1, T):
            a[t, 0] = a[t - 1, 0] + p[t - 1, 0]
            for u in range(1, U + 1):
                a[t, u] = _lse(a[t - 1, u] + p[t - 1, u], a[t, u - 1] + q[t, u - 1])
        z = beta[b]
        z[T - 1, U] = p[T - 1, U]
        for u in range(U - 1, -1, -1):
            z[T - 1, u] = z[T - 1, u + 1] + q[T - 1, u]
        for t in range(T - 2, -1, -1):
            z[t, U] = z[t + 1, U] + p[t, U]
            for u in range(U - 1, -1, -1):
                z[t, u] = _lse(z[t + 1, u] + p[t, u], z[t, u + 1] + q[t, u])
        logz[b] = z[0, 0]


@njit(cache=True, nogil=True)
def _grad_rows(x, g, tg, tl, il, blank, fused, lam, clamp, scale, r0, r1, den, lpb, lpe, alpha, beta, logz):
    """Rows ``r = b * T + t`` in ``[r0, r1)``: the gradient of example b's cost times
    ``scale[b]`` into ``g[b, t]`` (zeros outside the example's lattice and for examples whose
    cost is infinite; NaN for examples whose cost is NaN). ``g`` may be ``x`` itself."""
    T = x.shape[1]
    U1 = x.shape[2]
    V = x.shape[3]
    kbuf = np.empty(1, dtype=g.dtype)  # k in g's dtype: the loop over V stays in float32 for float32 logits
    for r in range(r0, r1):
        b = r // T
        t = r - b * T
        Tb = il[b]
        Ub = tl[b]
        lz = logz[b]
        s = scale[b]
        dead = t >= Tb or lz == NEG_INF or lz == math.inf
        for u in range(U1):
            out = g[b, t, u]
            if dead or u > Ub:
                for v in range(V):
                    out[v] = 0.0
                continue
            a = alpha[b, t, u]
            if t + 1 < Tb:
                nb = beta[b, t + 1, u]
            elif u == Ub:
                nb = 0.0
            else:
                nb = NEG_INF
            pb = math.exp(a + lpb[b, t, u] + nb - lz)
            pe = 0.0
            y = 0
            if u < Ub:
                y = tg[b, u]
                pe = math.exp(a + lpe[b, t, u] + beta[b, t, u + 1] - lz)
            if clamp > 0.0:
                sc = 1.0
            else:
                sc = s
            if fused:
                coef = (math.exp(a + beta[b, t, u] - lz) + lam * pe) * sc
                if coef == 0.0:
                    kbuf[0] = NEG_INF
                else:  # NaN stays NaN
                    kbuf[0] = math.log(coef) - den[b, t, u]
                k = kbuf[0]
                row = x[b, t, u]
                for v in range(V):
                    out[v] = math.exp(row[v] + k)
            else:
                for v in range(V):
                    out[v] = 0.0
            out[blank] -= pb * sc
            if u < Ub:
                out[y] -= (1.0 + lam) * pe * sc
            if clamp > 0.0:
                for v in range(V):
                    w = out[v]
                    if w > clamp:
                        w = clamp
                    elif w < -clamp:
                        w = -clamp
                    out[v] = w * s


def _chunks(n: int, per: int) -> Tuple[list, list]:
    """``n`` items cut into about ``per`` pieces per thread: ``(starts, ends)``."""
    pieces = max(1, min(n, get_num_threads() * per))
    cuts = [round(i * n / pieces) for i in range(pieces + 1)]
    return cuts[:-1], cuts[1:]


def rnnt_cost_grad(
    x: np.ndarray,
    targets: np.ndarray,
    logit_lengths: np.ndarray,
    target_lengths: np.ndarray,
    blank: int,
    fused: bool,
    fastemit_lambda: float,
    clamp: float,
    scale: Optional[np.ndarray],
    grad: Optional[np.ndarray],
) -> np.ndarray:
    """The RNN-T costs ``-log P(y | x)`` ``(B,)`` float64 of C-contiguous logits
    ``x (B, T, U + 1, V)`` (float32 or float64), and, when ``grad`` is given (a C-contiguous
    buffer of ``x``'s shape and dtype, or ``x`` itself), ``scale[b] * d cost[b] / d x`` written
    into it (see the module docstring; FastEmit scales the emit arcs' gradient, not the cost).

    ``targets (B, S)`` int64 with ``S >= max(target_lengths)``, lengths int64 with
    ``0 <= logit_lengths <= T`` and ``0 <= target_lengths <= U``; target ids in ``[0, V)``;
    ``0 <= blank < V``. Costs are ``inf`` for infeasible examples (no frames, or every path
    through a ``-inf`` log-probability) and NaN where the lattice reads a NaN.
    """
    B, T, U1, V = x.shape
    il = np.ascontiguousarray(logit_lengths, dtype=np.int64)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64)
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    if tg.ndim != 2 or tg.shape[0] != B:
        tg = tg.reshape(B, -1)
    if not x.flags.c_contiguous or x.dtype not in (np.float32, np.float64):
        raise ValueError("rnnt_cost_grad: x must be a C-contiguous float32/float64 array")
    if il.shape != (B,) or tl.shape != (B,) or (B and (il.min() < 0 or il.max() > T or tl.min() < 0 or tl.max() >= U1)):
        raise ValueError(
            f"rnnt_cost_grad: lengths must be ({B},) with 0 <= logit_lengths <= {T}, target_lengths < {U1}"
        )
    if B and tl.max() > tg.shape[1]:
        raise ValueError("rnnt_cost_grad: targets are shorter than target_lengths")
    if not 0 <= blank < V:
        raise ValueError(f"rnnt_cost_grad: blank must lie in [0, {V})")
    if tg.size and B and tl.max() > 0:
        mask = np.arange(tg.shape[1])[None, :] < tl[:, None]
        used = tg[mask]
        if used.size and (used.min() < 0 or used.max() >= V):
            raise ValueError(f"rnnt_cost_grad: target ids must lie in [0, {V})")
    if tg.shape[1] == 0:
        tg = np.zeros((B, 1), dtype=np.int64)
    den = np.zeros((B, T, U1), dtype=np.float64)
    lpb = np.full((B, T, U1), NEG_INF, dtype=np.float64)
    lpe = np.full((B, T, U1), NEG_INF, dtype=np.float64)
    alpha = np.full((B, T, U1), NEG_INF, dtype=np.float64)
    beta = np.full((B, T, U1), NEG_INF, dtype=np.float64)
    logz = np.empty(B, dtype=np.float64)
    starts, ends = _chunks(B * T, 4)
    parallel_map(
        lambda r0, r1: _normalise_rows(x, tg, tl, il, blank, fused, r0, r1, den, lpb, lpe),
        starts,
        ends,
    )
    e0, e1 = _chunks(B, 1)
    parallel_map(lambda a, b: _lattice(a, b, il, tl, lpb, lpe, alpha, beta, logz), e0, e1)
    if grad is not None:
        if grad.shape != x.shape or grad.dtype != x.dtype or not grad.flags.c_contiguous:
            raise ValueError("rnnt_cost_grad: grad must be a C-contiguous buffer of x's shape and dtype")
        sc = np.ones(B, dtype=np.float64) if scale is None else np.ascontiguousarray(scale, dtype=np.float64)
        lam = float(fastemit_lambda)
        cl = float(clamp)
        parallel_map(
            lambda r0, r1: _grad_rows(
                x, grad, tg, tl, il, blank, fused, lam, cl, sc, r0, r1, den, lpb, lpe, alpha, beta, logz
            ),
            starts,
            ends,
        )
    return -logz
