"""The regular RNN-T loss as numba kernels (CPU), the log-softmax fused.

Three passes, no ``(B, T, U + 1, V)`` temporary besides the gradient buffer itself:

1. :func:`_normalise_rows` (threads over ``(b, t)`` rows): one read of each vector
   ``x = logits[b, t, u]`` gives its normaliser ``logsumexp_v x[v] = m + log s`` (``m`` the row's
   maximum, ``s = sum_v exp(x[v] - m)``) and the two log-probabilities the lattice reads,
   ``lp_blank`` and ``lp_emit``. When the gradient is wanted, the exponentials ``exp(x[v] - m)``
   are written straight into the gradient buffer (the only exponential per element).
2. the shared lattice, :func:`.transducer_lattice_numba.lattice_examples` (threads over
   examples): blank arcs ``(1, 0)`` and token arcs ``(0, 1)`` over ``(T_b + 1, U_b + 1)`` nodes
   in log space, float64; ``logZ = beta[0, 0]`` and, with the gradient, the posteriors of the
   two arcs of every node. Extra memory ``O(B * T * U)``.
3. :func:`_grad_rows` (threads over rows) turns the buffer into the gradient in place:
   ``grad[v] = (gamma + lam * p_emit) * softmax[v] - p_blank [v == blank] - (1 + lam) * p_emit [v == y_u]``
   with ``gamma = p_blank + p_emit`` the occupancy of node ``(t, u)`` (``p_blank``, ``p_emit`` the
   posteriors of its two arcs, from the lattice), ``softmax[v] = exp(x[v] - m) / s``
   and ``lam`` the FastEmit weight (the emit arcs' gradient scaled by ``1 + lam``, as
   NeMo/warprnnt-numba do), then clipped to ``[-clamp, clamp]`` (``clamp > 0``) and multiplied by
   the example's reduction coefficient. Without the fused log-softmax (``fused=False``: the logits
   are log-probabilities already) only the two arc entries are non-zero: ``-p_blank`` and
   ``-(1 + lam) * p_emit`` (torchaudio's convention).

The buffer may be the logits' own storage (``inplace_grad``): pass 1 reads the two entries the
lattice needs before it overwrites a row. float32 logits take their exponentials from
:func:`_exp32_parts`, a polynomial that LLVM vectorises (``math.exp`` is a libm call per element),
float64 logits from ``math.exp``.

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
from .transducer_lattice_numba import LOG, POST_ALL, POST_NONE, lattice_examples

__all__ = ["rnnt_cost_grad"]

NEG_INF = -math.inf
_DI = np.array([1, 0], dtype=np.int64)  # the arc kinds: blank (1, 0), token (0, 1)
_DJ = np.array([0, 1], dtype=np.int64)
_NO_PATH = np.zeros((1, 1, 3), dtype=np.int64)  # the max semiring's outputs, unused here
_NO_LEN = np.zeros(1, dtype=np.int64)


# fast-math flags that keep NaN and inf semantics (no "nnan"/"ninf"): reductions vectorise, NaN
# checks stay
_FM = {"reassoc", "contract", "nsz", "arcp"}
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split in two (Cody and Waite): n * _LN2_HI is exact in float32
_LN2_LO = 1.428606765330187e-06


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _exp32_parts(y, p, ib):
    """``exp(y[v]) = p[v] * 2 ** ((ib[v] >> 23) - 127)`` for float32 ``y``: the polynomial part
    into ``p``, the power of two's bits into ``ib`` (plain arithmetic, which LLVM vectorises;
    ``math.exp`` is one libm call per element). Cody and Waite's reduction ``y = n ln 2 + r``,
    ``|r| <= ln(2) / 2``, then ``exp(r)`` by a degree-7 polynomial (Cephes' ``expf`` coefficients);
    relative error about 1e-7 of float32's rounding. ``y`` is clipped to ``[-87, 88]`` first; below
    -87 (``-inf`` included) the result is exactly 0."""
    for v in range(y.shape[0]):
        w = min(max(y[v], np.float32(-87.0)), np.float32(88.0))
        n = np.floor(w * np.float32(_LOG2E) + np.float32(0.5))  # float32 (math.floor gives an int64)
        r = w - n * np.float32(_LN2_HI)
        r = r - n * np.float32(_LN2_LO)
        q = np.float32(1.9875691500e-4)
        q = q * r + np.float32(1.3981999507e-3)
        q = q * r + np.float32(8.3334519073e-3)
        q = q * r + np.float32(4.1665795894e-2)
        q = q * r + np.float32(1.6666665459e-1)
        q = q * r + np.float32(5.0000001201e-1)
        p[v] = q * (r * r) + r + np.float32(1.0)
        e = (np.int32(n) + np.int32(127)) << np.int32(23)
        ib[v] = np.int32(0) if y[v] < np.float32(-87.0) else e  # underflow (and -inf): exactly 0


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _exp_row32(row, m, out, p, ib, fb):
    """``out[v] = exp(row[v] - m)`` for a float32 row (``out`` may be ``row``); returns
    ``(sum_v out[v], 0 or NaN)``: NaN when the row holds a NaN or a +inf (as ``log_softmax``
    gives; ``-inf`` entries, masked classes, are fine)."""
    V = row.shape[0]
    bad = np.float32(0.0)
    for v in range(V):
        bad += np.float32(0.0) if row[v] == np.float32(NEG_INF) else row[v] - row[v]
        out[v] = row[v] - m
    _exp32_parts(out, p, ib)
    s = np.float32(0.0)
    for v in range(V):
        w = p[v] * fb[v]
        out[v] = w
        s += w
    return float(s), float(bad)


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _row_max(row):
    """The largest entry of a row (NaN is caught by :func:`_exp_row32`)."""
    m = row[0]
    for v in range(1, row.shape[0]):
        m = max(m, row[v])
    return m


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _scale_row(out, c):
    """``out[v] *= c``."""
    for v in range(out.shape[0]):
        out[v] *= c


@njit(cache=True, nogil=True, fastmath=_FM, inline="always")
def _clip_row(out, c, s):
    """``out[v] = s * clip(out[v], -c, c)`` (NaN stays NaN)."""
    for v in range(out.shape[0]):
        w = out[v]
        w = c if w > c else w
        w = -c if w < -c else w
        out[v] = w * s


@njit(cache=True, nogil=True, fastmath=_FM)
def _normalise_rows(x, g, has_g, tg, tl, il, blank, fused, fast, r0, r1, rs, lpb, lpe):
    """Rows ``r = b * T + t`` in ``[r0, r1)`` with ``t < il[b]`` (pass 1), for ``u <= tl[b]``:
    ``lpb``, ``lpe`` and, with the fused log-softmax, ``rs = 1 / sum_v exp(x[v] - max)`` (NaN
    when the row holds a NaN or an inf); with ``has_g`` the exponentials ``exp(x[v] - max)`` go
    to ``g`` (which may be ``x``: the two entries the lattice reads are read first), so the
    gradient pass only scales them. ``fast``: float32, exponentials by :func:`_exp32_parts`."""
    T = x.shape[1]
    V = x.shape[3]
    y = np.empty(V, dtype=x.dtype)
    p = np.empty(V, dtype=np.float32)
    ib = np.empty(V, dtype=np.int32)
    fb = ib.view(np.float32)
    for r in range(r0, r1):
        b = r // T
        t = r - b * T
        if t >= il[b]:
            continue
        Ub = tl[b]
        for u in range(Ub + 1):
            row = x[b, t, u]
            xb = row[blank]
            xe = row[tg[b, u]] if u < Ub else 0.0
            d = 0.0
            if fused:
                out = g[b, t, u] if has_g else y
                m = _row_max(row)
                if fast:
                    s, bad = _exp_row32(row, m, out, p, ib, fb)
                else:
                    s = 0.0
                    bad = 0.0
                    for v in range(V):
                        bad += 0.0 if row[v] == NEG_INF else row[v] - row[v]
                        w = math.exp(row[v] - m)
                        out[v] = w
                        s += w
                if m == NEG_INF:  # every class -inf: NaN, as log_softmax gives
                    bad = math.nan
                d = m + math.log(s) + bad
                rs[b, t, u] = 1.0 / s + bad
            lpb[b, t, u] = xb - d
            if u < Ub:
                lpe[b, t, u] = xe - d


@njit(cache=True, nogil=True, fastmath=_FM)
def _grad_rows(g, tg, tl, il, blank, fused, lam, clamp, scale, r0, r1, rs, post_b, post_e, logz):
    """Rows ``r = b * T + t`` in ``[r0, r1)`` (pass 3): the gradient of example b's cost times
    ``scale[b]`` into ``g[b, t]``, which holds the exponentials of pass 1 where the fused
    log-softmax is on (zeros outside the example's lattice and for examples whose cost is
    infinite; NaN for examples whose cost is NaN)."""
    T = g.shape[1]
    U1 = g.shape[2]
    V = g.shape[3]
    cbuf = np.empty(2, dtype=g.dtype)  # the row's factors in g's dtype: the loop stays in float32 for float32
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
            pb = post_b[b, t, u]
            pe = 0.0
            y = 0
            if u < Ub:
                y = tg[b, u]
                pe = post_e[b, t, u]
            sc = 1.0 if clamp > 0.0 else s
            if fused:  # (occupancy + lam * p_emit) * softmax; the occupancy of (t, u) is pb + pe
                cbuf[0] = (pb + (1.0 + lam) * pe) * sc * rs[b, t, u]
                _scale_row(out, cbuf[0])
            else:
                for v in range(V):
                    out[v] = 0.0
            out[blank] -= pb * sc
            if u < Ub:
                out[y] -= (1.0 + lam) * pe * sc
            if clamp > 0.0:
                cbuf[0] = clamp
                cbuf[1] = s
                _clip_row(out, cbuf[0], cbuf[1])


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
    fast = x.dtype == np.float32
    has_g = grad is not None
    if grad is not None:
        if grad.shape != x.shape or grad.dtype != x.dtype or not grad.flags.c_contiguous:
            raise ValueError("rnnt_cost_grad: grad must be a C-contiguous buffer of x's shape and dtype")
        g = grad
    else:
        g = np.empty((1, 1, 1, 1), dtype=x.dtype)
    rs = np.zeros((B, T, U1), dtype=np.float64)
    lpb = np.full((B, T, U1), NEG_INF, dtype=np.float64)
    lpe = np.full((B, T + 1, U1), NEG_INF, dtype=np.float64)  # the row T: no token arcs
    logz = np.empty(B, dtype=np.float64)
    starts, ends = _chunks(B * T, 4)
    parallel_map(
        lambda r0, r1: _normalise_rows(x, g, has_g, tg, tl, il, blank, fused, fast, r0, r1, rs, lpb, lpe),
        starts,
        ends,
    )
    # the lattice over (T_b + 1, U_b + 1) nodes, blank (1, 0) then token (0, 1); no frame: no path
    bnd = np.zeros((B, 4), dtype=np.int64)
    bnd[:, 2] = np.where(il > 0, il, -1)
    bnd[:, 3] = tl
    pshape = (B, T, U1) if has_g else (1, 1, 1)
    post_b = np.zeros(pshape, dtype=np.float64)
    post_e = np.zeros((B, T + 1, U1) if has_g else pshape, dtype=np.float64)
    scores = (lpb, lpe)
    post_mode = POST_ALL if has_g else POST_NONE
    posts = (post_b, post_e)
    e0, e1 = _chunks(B, 1)
    parallel_map(
        lambda a, b: lattice_examples(
            a, b, scores, _DI, _DJ, bnd, LOG, post_mode, True, logz, posts, _NO_PATH, _NO_LEN
        ),
        e0,
        e1,
    )
    if has_g:
        sc = np.ones(B, dtype=np.float64) if scale is None else np.ascontiguousarray(scale, dtype=np.float64)
        lam = float(fastemit_lambda)
        cl = float(clamp)
        parallel_map(
            lambda r0, r1: _grad_rows(g, tg, tl, il, blank, fused, lam, cl, sc, r0, r1, rs, post_b, post_e, logz),
            starts,
            ends,
        )
    return -logz
