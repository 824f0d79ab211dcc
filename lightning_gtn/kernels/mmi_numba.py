"""The shared-graph kernel on the CPU: log Z of one epsilon-free graph against every row of a
batch of emissions, with its gradients, in probability space.

LF-MMI's denominator is one graph (thousands of arcs) scored against all ``B`` rows. The
recursion runs over frames with the batch as the innermost, contiguous axis (every state holds
``nb`` values, one per row of a chunk), so each arc costs one vectorised multiply-add over the
chunk's rows. Per frame ``t`` (``alpha`` the state distribution before the frame, times a per-row
scale):

* the frames of a segment of the chunk's rows are transposed into ``(C, nbp)`` blocks (the batch
  innermost, the rows padded to whole vectors; :func:`_transpose_segment`), each frame's maxima
  ``m_t`` taken and ``e[c] = exp(E[t, c] - m_t) * r`` computed eight rows at a time
  (:mod:`lightning_gtn.kernels.simd`), with ``r = 1 / s_{t-1}`` the previous frame's scale folded
  in; kept for the segment's frames so the backward reuses them;
* ``u[g] = sum_{arcs a of group g} alpha[src a] * p_a`` for every group ``g`` (the arcs sharing a
  destination ``d_g`` and a label ``l_g``; ``p_a = exp(w_a - shift)``), summed in vector registers
  and stored once (:func:`gather32`, :func:`gather16`, :func:`gather8`); a graph's shared sources
  are summed first (sum nodes, :meth:`~lightning_gtn.core.shared_graph.SharedGraph.factored`);
* ``alpha'[d] = sum_{groups g into d} e[l_g] * u[g]`` with ``s_t = sum_d alpha'[d]`` added up in the
  same loop; ``alpha'`` becomes the next ``alpha`` as it is (no pass divides it by ``s_t``: the next
  frame's ``e`` carries ``1 / s_t``, so ``alpha`` is the state distribution times ``s_{t-1}``, and
  it is normalised explicitly only when ``s_t`` leaves ``[2^-30, 2^30]``); ``s_t`` is multiplied
  into a float64 product folded into the row's log-scale (with ``m_t``) only when it would leave
  ``[1e-250, 1e250]``: Kaldi's per-frame rescaling without a ``log`` per row and frame;
* leaky HMM, between two frames of a row: ``alpha[d] += leaky * s_t * init[d]`` (Kaldi's
  ``alpha + leaky * tot_alpha * init``).

``log Z = logscale + log(sum over accept states of alpha) + T * shift``.

The backward walks the frames in reverse with ``beta``, whose scale is folded into the
next frame's product the same way (``beta`` times ``1 / sum beta``, applied while reading):
``v[g] = e[l_g] * beta[d_g] / sum(beta)``; the posterior of group ``g`` at frame ``t`` is
``u[g] v[g] / sum_g u[g] v[g]`` (every path crosses exactly one arc per frame, so each frame's
posteriors sum to one and no scale needs to be tracked; the scales folded into ``u`` and ``e``
cancel in the ratio); ``beta_prev[s] = sum_{arcs a from s} p_a v[g_a]`` followed by the leak's
transpose ``beta_prev += leaky * (init . beta_prev)``. The emission gradient of class ``c`` at
frame ``t`` is the sum of the posteriors of the groups with label ``c`` (summed unscaled in the
``v`` loop, scaled once as they are written back to the ``(B, T, C)`` layout); the
arc-weight gradient adds ``alpha[src a] p_a v[g_a] / sum_g u v`` per frame.

Memory: the forward keeps ``u`` and ``e`` (``G + C`` values per row and frame, ``G`` about the
number of states) for the frames of one segment of ``K`` frames and the state vector (with its
scale) at the start of every segment (a checkpoint every ``K`` frames); the backward recomputes ``u`` segment by segment
and ``e`` from the checkpoints (one more forward pass when ``K < T``). With ``K >= T`` nothing is
recomputed: two arc passes in all (forward, backward).

Rows run in chunks (rows sorted by length, dealt round-robin) on the engine's thread pool
(:func:`lightning_gtn.wfst.parallel.parallel_map`; the kernels release the GIL). A chunk is one
call of :func:`_chunk`, which also writes its rows' results into the batch's arrays: no numpy
work per chunk in Python (each such call took tens of microseconds right after a pause, on the
thread that had just woken, and held the GIL that the other thread wanted).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map
from .buffers import OUTPUTS
from .simd import LANES, ld, st, vadd, vexp, vfma, vload, vmax, vmul, vsplat, vstore, vsub, vtrans8, vzero

__all__ = [
    "shared_scores",
    "checkpoint_interval",
    "chunks_of",
    "gather32",
    "gather16",
    "gather8",
    "SEGMENT_BUDGET",
    "CHUNK_ROWS",
    "SCALE_RANGE",
]

#: per-frame helpers allocate nothing and run without numba's reference counting (an atomic
#: increment and decrement of every array argument at every call: 29% of the kernel's time before)
_NO_REFCOUNT: Dict[str, Any] = {"_nrt": False}
#: bytes the per-segment buffers of all chunks may take before frames are checkpointed
SEGMENT_BUDGET = 512 << 20
#: the fewest rows a chunk gets when the batch is split over threads (see :func:`chunks_of`)
CHUNK_ROWS = 16


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _transpose_segment(Y, rows, lens, t0, t1, EX, offr, offx, into_ex):
    """Between the ``(B, T, C)`` array ``Y`` and the segment blocks ``EX[t - t0]`` (``(C, nbp)``,
    the batch innermost), for the frames ``t0 <= t < t1`` of each of the chunk's rows within its
    length: ``EX[t - t0][:, b] = Y[rows[b], t]`` (``into_ex``: the emissions, before the frames
    are scored) or the reverse (the gradient, after). One pass per segment rather than per frame
    (a vector load right after the scalar stores that wrote its lanes would wait for them), in
    blocks of :data:`TRANSPOSE_FRAMES` frames, eight rows at a time within a block (eight
    sequential streams of ``Y``; the block's ``EX`` stays in the cache between the row groups),
    eight rows by eight classes transposed in registers
    (:func:`~lightning_gtn.kernels.simd.vtrans8`), the rest one by one. ``offr``, ``offx``: int64
    scratch of eight."""
    C = EX.shape[1]
    nbp = EX.shape[2]
    T = Y.shape[1]
    for j in range(LANES):
        offx[j] = j * nbp
    nrows = lens.shape[0]
    for tb in range(t0, t1, TRANSPOSE_FRAMES):
        te = min(tb + TRANSPOSE_FRAMES, t1)
        for b in range(0, nrows, LANES):
            if lens[b] <= tb:  # rows sorted by length, longest first: none from here on is active
                break
            for t in range(tb, te):
                n = min(b + LANES, nrows)
                while n > b and lens[n - 1] <= t:
                    n -= 1
                if n == b:
                    break
                xo = (t - t0) * C * nbp
                if n == b + LANES:  # rows in [0, B), t < lens <= T: the caller's
                    for i in range(LANES):
                        offr[i] = (ld(rows, b + i) * T + t) * C
                    c = 0
                    while c + LANES <= C:
                        if into_ex:
                            vtrans8(Y, offr, c, EX, offx, xo + c * nbp + b)
                        else:
                            vtrans8(EX, offx, xo + c * nbp + b, Y, offr, c)
                        c += LANES
                    for i in range(LANES):
                        _copy_tail(Y, offr[i], EX, xo + b + i, nbp, c, C, into_ex)
                else:
                    for bb in range(b, n):
                        _copy_tail(Y, (ld(rows, bb) * T + t) * C, EX, xo + bb, nbp, 0, C, into_ex)


#: frames per block of :func:`_transpose_segment`
TRANSPOSE_FRAMES = 64


@njit(cache=True, inline="always", **_NO_REFCOUNT)
def _copy_tail(Y, yo, EX, xo, nbp, c0, C, into_ex):
    """Classes ``c0 <= c < C`` of one row and frame, one by one: ``EX.flat[xo + c * nbp] =
    Y.flat[yo + c]`` (``into_ex``) or the reverse."""
    for c in range(c0, C):
        if into_ex:
            st(EX, xo + c * nbp, ld(Y, yo + c))
        else:
            st(Y, yo + c, ld(EX, xo + c * nbp))


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _max_frame(X, nact, mt, chk, bad):
    """Each row's maximum over the classes of its frame ``X`` (``(C, nbp)``, from
    :func:`_transpose_segment`) into ``mt``; a row reading a NaN or ``+inf`` is marked in ``bad`` and
    its frame set to ``-inf`` (it reads nothing, ``mt = -inf``)."""
    C = X.shape[0]
    nbp = X.shape[1]
    for k in range(0, _width(nact), LANES):  # the padding columns' maxima are never read
        m = vload(X, k)
        ch = vsub(m, m)
        for c in range(1, C):
            x = vload(X, c * nbp + k)
            m = vmax(x, m)
            ch = vadd(ch, vsub(x, x))  # NaN if any value is NaN or infinite
        vstore(mt, k, m)
        vstore(chk, k, ch)
    for b in range(nact):
        if chk[b] != chk[b]:
            mm = -np.inf
            for c in range(C):
                y = X[c, b]
                if y != y or y == np.inf:
                    bad[b] = True
                elif y > mm:
                    mm = y
            if bad[b]:
                mm = -np.inf
                for c in range(C):
                    X[c, b] = -np.inf
            mt[b] = mm


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _exp_frame(e, mt, r, nact, ms):
    """``e[c, b] = exp(e[c, b] - mt[b]) * r[b]`` in place (0 where ``mt`` is ``-inf``), vectorised over
    the rows (one array read and written at the same place: no overlap check for the compiler);
    zero in the columns from ``nact`` to the next multiple of :data:`LANES` (rows that are done,
    or padding), which the vector passes read."""
    C = e.shape[0]
    nbp = e.shape[1]
    nw = _width(nact)
    for b in range(nact):
        ms[b] = mt[b] if mt[b] > -np.inf else 0.0
    for k in range(0, nw, LANES):
        m = vload(ms, k)
        rk = vload(r, k)
        for c in range(C):
            o = c * nbp + k
            vstore(e, o, vmul(vexp(vsub(vload(e, o), m)), rk))
    for c in range(C):
        for b in range(nact, nw):
            e[c, b] = 0.0


@njit(cache=True, inline="always")
def _width(n):
    """``n`` rounded up to a multiple of :data:`LANES`: the columns the vector passes compute."""
    return (n + LANES - 1) // LANES * LANES


@njit(cache=True, inline="always")
def gather32(x, nbp, k, idx, p, a0, a1):
    """``sum_{a0 <= a < a1} x[idx[a], k:k + 32] * p[a]`` as four vectors (``x``: ``(n, nbp)``),
    two arcs per step into eight accumulators kept in registers."""
    c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = vzero(x)
    a = a0
    while a + 2 <= a1:
        o0 = ld(idx, a) * nbp + k
        o1 = ld(idx, a + 1) * nbp + k
        p0 = vsplat(ld(p, a))
        p1 = vsplat(ld(p, a + 1))
        c0 = vfma(c0, vload(x, o0), p0)
        c1 = vfma(c1, vload(x, o0 + 8), p0)
        c2 = vfma(c2, vload(x, o0 + 16), p0)
        c3 = vfma(c3, vload(x, o0 + 24), p0)
        d0 = vfma(d0, vload(x, o1), p1)
        d1 = vfma(d1, vload(x, o1 + 8), p1)
        d2 = vfma(d2, vload(x, o1 + 16), p1)
        d3 = vfma(d3, vload(x, o1 + 24), p1)
        a += 2
    if a < a1:
        o0 = ld(idx, a) * nbp + k
        p0 = vsplat(ld(p, a))
        c0 = vfma(c0, vload(x, o0), p0)
        c1 = vfma(c1, vload(x, o0 + 8), p0)
        c2 = vfma(c2, vload(x, o0 + 16), p0)
        c3 = vfma(c3, vload(x, o0 + 24), p0)
    return vadd(c0, d0), vadd(c1, d1), vadd(c2, d2), vadd(c3, d3)


@njit(cache=True, inline="always")
def gather16(x, nbp, k, idx, p, a0, a1):
    """``sum_{a0 <= a < a1} x[idx[a], k:k + 16] * p[a]`` as two vectors, four arcs per step into
    eight accumulators."""
    c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = vzero(x)
    a = a0
    while a + 4 <= a1:
        o0 = ld(idx, a) * nbp + k
        o1 = ld(idx, a + 1) * nbp + k
        o2 = ld(idx, a + 2) * nbp + k
        o3 = ld(idx, a + 3) * nbp + k
        p0 = vsplat(ld(p, a))
        p1 = vsplat(ld(p, a + 1))
        p2 = vsplat(ld(p, a + 2))
        p3 = vsplat(ld(p, a + 3))
        c0 = vfma(c0, vload(x, o0), p0)
        d0 = vfma(d0, vload(x, o0 + 8), p0)
        c1 = vfma(c1, vload(x, o1), p1)
        d1 = vfma(d1, vload(x, o1 + 8), p1)
        c2 = vfma(c2, vload(x, o2), p2)
        d2 = vfma(d2, vload(x, o2 + 8), p2)
        c3 = vfma(c3, vload(x, o3), p3)
        d3 = vfma(d3, vload(x, o3 + 8), p3)
        a += 4
    while a < a1:
        o0 = ld(idx, a) * nbp + k
        p0 = vsplat(ld(p, a))
        c0 = vfma(c0, vload(x, o0), p0)
        d0 = vfma(d0, vload(x, o0 + 8), p0)
        a += 1
    return vadd(vadd(c0, c1), vadd(c2, c3)), vadd(vadd(d0, d1), vadd(d2, d3))


@njit(cache=True, inline="always")
def gather8(x, nbp, k, idx, p, a0, a1):
    """``sum_{a0 <= a < a1} x[idx[a], k:k + 8] * p[a]`` as one vector, four arcs per step into
    four accumulators."""
    c0 = c1 = c2 = c3 = vzero(x)
    a = a0
    while a + 4 <= a1:
        c0 = vfma(c0, vload(x, ld(idx, a) * nbp + k), vsplat(ld(p, a)))
        c1 = vfma(c1, vload(x, ld(idx, a + 1) * nbp + k), vsplat(ld(p, a + 1)))
        c2 = vfma(c2, vload(x, ld(idx, a + 2) * nbp + k), vsplat(ld(p, a + 2)))
        c3 = vfma(c3, vload(x, ld(idx, a + 3) * nbp + k), vsplat(ld(p, a + 3)))
        a += 4
    while a < a1:
        c0 = vfma(c0, vload(x, ld(idx, a) * nbp + k), vsplat(ld(p, a)))
        a += 1
    return vadd(vadd(c0, c1), vadd(c2, c3))


@njit(cache=True, inline="always")
def _vadd_to(y, o, v):
    """``y[o:o + 8] += v``."""
    vstore(y, o, vadd(vload(y, o), v))


@njit(cache=True, inline="always")
def _vstore2(y, o, v0, v1):
    """``y[o:o + 16] = (v0, v1)``."""
    vstore(y, o, v0)
    vstore(y, o + 8, v1)


@njit(cache=True, inline="always")
def _vstore4(y, o, v0, v1, v2, v3):
    """``y[o:o + 32] = (v0, v1, v2, v3)``."""
    _vstore2(y, o, v0, v1)
    _vstore2(y, o + 16, v2, v3)


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _frame(nw, alpha, anew, e, U, tot, state_off, group_label, fwd_off, fwd_src, p):
    """One forward frame for the first ``nw`` columns (a multiple of :data:`LANES`): the group
    sums ``U`` (``(G, nbp)``, written), ``anew[d] = sum_{groups g into d} e[label g] * U[g]``
    (written) and ``tot = sum_d anew[d]``. ``e``: ``(C, nbp)`` the frame's emissions with the
    previous frame's scale folded in (zero in the columns of rows that are done). The columns
    run in blocks of 32, 16, 8, each over all states with its sums ``tot`` in registers."""
    S = alpha.shape[0]
    nbp = alpha.shape[1]
    z = vzero(alpha)
    k = 0
    while k + 32 <= nw:
        t0 = t1 = t2 = t3 = z
        for d in range(S):
            s0 = s1 = s2 = s3 = z
            for g in range(ld(state_off, d), ld(state_off, d + 1)):
                u0, u1, u2, u3 = gather32(alpha, nbp, k, fwd_src, p, ld(fwd_off, g), ld(fwd_off, g + 1))
                uo = g * nbp + k
                _vstore4(U, uo, u0, u1, u2, u3)
                eo = ld(group_label, g) * nbp + k
                s0 = vfma(s0, u0, vload(e, eo))
                s1 = vfma(s1, u1, vload(e, eo + 8))
                s2 = vfma(s2, u2, vload(e, eo + 16))
                s3 = vfma(s3, u3, vload(e, eo + 24))
            ao = d * nbp + k
            _vstore4(anew, ao, s0, s1, s2, s3)
            t0, t1, t2, t3 = vadd(t0, s0), vadd(t1, s1), vadd(t2, s2), vadd(t3, s3)
        _vstore4(tot, k, t0, t1, t2, t3)
        k += 32
    if k + 16 <= nw:
        t0 = t1 = z
        for d in range(S):
            s0 = s1 = z
            for g in range(ld(state_off, d), ld(state_off, d + 1)):
                u0, u1 = gather16(alpha, nbp, k, fwd_src, p, ld(fwd_off, g), ld(fwd_off, g + 1))
                uo = g * nbp + k
                _vstore2(U, uo, u0, u1)
                eo = ld(group_label, g) * nbp + k
                s0 = vfma(s0, u0, vload(e, eo))
                s1 = vfma(s1, u1, vload(e, eo + 8))
            ao = d * nbp + k
            _vstore2(anew, ao, s0, s1)
            t0, t1 = vadd(t0, s0), vadd(t1, s1)
        _vstore2(tot, k, t0, t1)
        k += 16
    while k < nw:
        t0 = z
        for d in range(S):
            s0 = z
            for g in range(ld(state_off, d), ld(state_off, d + 1)):
                u0 = gather8(alpha, nbp, k, fwd_src, p, ld(fwd_off, g), ld(fwd_off, g + 1))
                vstore(U, g * nbp + k, u0)
                s0 = vfma(s0, u0, vload(e, ld(group_label, g) * nbp + k))
            vstore(anew, d * nbp + k, s0)
            t0 = vadd(t0, s0)
        vstore(tot, k, t0)
        k += LANES


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _back_gather(nw, v, bprev, zs, src_off, bwd_group, p, nreal, real_virt_off, real_virt):
    """``bprev[s] = sum_{arcs a from s} p[a] * v[group a]`` for the first ``nw`` columns, the
    sum nodes (rows ``nreal ..``) first, each then added into its members, and
    ``zs = sum_{s < nreal} bprev[s]`` (in registers: the columns run in blocks of 32, 16, 8)."""
    S = bprev.shape[0]
    nbp = bprev.shape[1]
    z = vzero(bprev)
    k = 0
    while k + 32 <= nw:
        for s in range(nreal, S):
            b0, b1, b2, b3 = gather32(v, nbp, k, bwd_group, p, ld(src_off, s), ld(src_off, s + 1))
            bo = s * nbp + k
            _vstore4(bprev, bo, b0, b1, b2, b3)
        t0 = t1 = t2 = t3 = z
        for s in range(nreal):
            b0, b1, b2, b3 = gather32(v, nbp, k, bwd_group, p, ld(src_off, s), ld(src_off, s + 1))
            for j in range(ld(real_virt_off, s), ld(real_virt_off, s + 1)):
                vo = ld(real_virt, j) * nbp + k
                b0 = vadd(b0, vload(bprev, vo))
                b1 = vadd(b1, vload(bprev, vo + 8))
                b2 = vadd(b2, vload(bprev, vo + 16))
                b3 = vadd(b3, vload(bprev, vo + 24))
            bo = s * nbp + k
            _vstore4(bprev, bo, b0, b1, b2, b3)
            t0, t1, t2, t3 = vadd(t0, b0), vadd(t1, b1), vadd(t2, b2), vadd(t3, b3)
        _vstore4(zs, k, t0, t1, t2, t3)
        k += 32
    if k + 16 <= nw:
        for s in range(nreal, S):
            b0, b1 = gather16(v, nbp, k, bwd_group, p, ld(src_off, s), ld(src_off, s + 1))
            bo = s * nbp + k
            _vstore2(bprev, bo, b0, b1)
        t0 = t1 = z
        for s in range(nreal):
            b0, b1 = gather16(v, nbp, k, bwd_group, p, ld(src_off, s), ld(src_off, s + 1))
            for j in range(ld(real_virt_off, s), ld(real_virt_off, s + 1)):
                vo = ld(real_virt, j) * nbp + k
                b0 = vadd(b0, vload(bprev, vo))
                b1 = vadd(b1, vload(bprev, vo + 8))
            bo = s * nbp + k
            _vstore2(bprev, bo, b0, b1)
            t0, t1 = vadd(t0, b0), vadd(t1, b1)
        _vstore2(zs, k, t0, t1)
        k += 16
    while k < nw:
        for s in range(nreal, S):
            vstore(bprev, s * nbp + k, gather8(v, nbp, k, bwd_group, p, ld(src_off, s), ld(src_off, s + 1)))
        t0 = z
        for s in range(nreal):
            b0 = gather8(v, nbp, k, bwd_group, p, ld(src_off, s), ld(src_off, s + 1))
            for j in range(ld(real_virt_off, s), ld(real_virt_off, s + 1)):
                b0 = vadd(b0, vload(bprev, ld(real_virt, j) * nbp + k))
            vstore(bprev, s * nbp + k, b0)
            t0 = vadd(t0, b0)
        vstore(zs, k, t0)
        k += LANES


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _scale_rows(nw, x, z, y):
    """``y[c] = x[c] * z`` (``(C, nbp)`` by ``(nbp,)``) for the first ``nw`` columns."""
    nbp = x.shape[1]
    for k in range(0, nw, LANES):
        zk = vload(z, k)
        for c in range(x.shape[0]):
            vstore(y, c * nbp + k, vmul(vload(x, c * nbp + k), zk))


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _sum_nodes(nw, x, nreal, virt_off, virt_member):
    """``x[nreal + h] = sum of x[m]`` over the members ``m`` of sum node ``h`` (two or more), for
    the first ``nw`` columns."""
    nbp = x.shape[1]
    for h in range(virt_off.shape[0] - 1):
        m0 = ld(virt_off, h)
        m1 = ld(virt_off, h + 1)
        o = (nreal + h) * nbp
        for k in range(0, nw, LANES):
            acc = vload(x, ld(virt_member, m0) * nbp + k)
            for m in range(m0 + 1, m1):
                acc = vadd(acc, vload(x, ld(virt_member, m) * nbp + k))
            vstore(x, o + k, acc)


@njit(cache=True, inline="always")
def _posterior(g, k, nbp, rk, e, beta, Ut, v, gbuf, group_dst, group_label, need_e):
    """Group ``g``, columns ``k:k + 8``: ``v[g] = e[label g] * beta[dst g] * rk`` stored, and
    ``Ut[g] v[g]`` returned (and added into ``gbuf[label g]`` with ``need_e``)."""
    lo = ld(group_label, g) * nbp + k
    go = g * nbp + k
    vv = vmul(vmul(vload(e, lo), vload(beta, ld(group_dst, g) * nbp + k)), rk)
    vstore(v, go, vv)
    uv = vmul(vload(Ut, go), vv)
    if need_e:
        _vadd_to(gbuf, lo, uv)
    return uv


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _posteriors(nw, e, beta, rz, Ut, v, z, gbuf, group_dst, group_label, need_e):
    """``v[g] = e[label g] * beta[dst g] * rz`` and ``z = sum_g Ut[g] v[g]`` for the first ``nw``
    columns; with ``need_e`` also ``gbuf[c] = sum_{groups g of label c} Ut[g] v[g]`` (``gbuf``
    zeroed here). Eight columns at a time over all groups, ``z`` in a register."""
    G = v.shape[0]
    nbp = v.shape[1]
    zero = vzero(v)
    if need_e:
        for c in range(gbuf.shape[0]):
            for k in range(0, nw, LANES):
                vstore(gbuf, c * nbp + k, zero)
    for k in range(0, nw, LANES):
        rk = vload(rz, k)
        z0 = z1 = zero
        g = 0
        while g + 2 <= G:  # two groups per step: two independent sums
            z0 = vadd(z0, _posterior(g, k, nbp, rk, e, beta, Ut, v, gbuf, group_dst, group_label, need_e))
            z1 = vadd(z1, _posterior(g + 1, k, nbp, rk, e, beta, Ut, v, gbuf, group_dst, group_label, need_e))
            g += 2
        if g < G:
            z0 = vadd(z0, _posterior(g, k, nbp, rk, e, beta, Ut, v, gbuf, group_dst, group_label, need_e))
        vstore(z, k, vadd(z0, z1))


#: a state vector whose sum leaves ``[1 / SCALE_RANGE, SCALE_RANGE]`` is normalised explicitly
SCALE_RANGE = 2.0**30


@njit(cache=True, nogil=True, **_NO_REFCOUNT)
def _rescale(t, nact, lens, anew, tot, r, cl, prod, logs, lam, leak, track):
    """After frame ``t``: ``r = 1 / tot`` (folded into the next frame's emissions instead of a
    pass over ``anew``; ``anew`` is normalised explicitly only when its sum leaves
    :data:`SCALE_RANGE`), the leak ``anew[d] += lam * tot * leak[d]`` for the rows that go on,
    and (``track``) ``tot`` multiplied into ``prod``, which is folded into ``logs`` as a log
    when it would leave ``[1e-250, 1e250]``. Dead rows (``tot == 0``) get ``r = 0``."""
    S = anew.shape[0]
    for b in range(nact):
        tt = tot[b]
        if tt > 0.0:
            if track:
                q = prod[b] * tt
                if q < 1e-250 or q > 1e250:
                    logs[b] += math.log(prod[b]) + math.log(tt)
                    prod[b] = 1.0
                else:
                    prod[b] = q
            if tt < 1.0 / SCALE_RANGE or tt > SCALE_RANGE:
                for d in range(S):
                    anew[d, b] = anew[d, b] / tt
                tt = 1.0
                r[b] = 1.0
            else:
                r[b] = 1.0 / tt
            cl[b] = lam * tt if t + 1 < lens[b] else 0.0
        else:
            if track:
                logs[b] = -np.inf
            r[b] = 0.0
            cl[b] = 0.0
    if lam > 0.0:
        for d in range(S):
            lk = leak[d]
            for b in range(nact):
                anew[d, b] += cl[b] * lk


@njit(cache=True, nogil=True)
def _finish(rows, lens, lz, bad, shift, need_e, gacc, fwd_arc, need_w, logz, gE, gW):
    """A chunk's results into the batch's arrays: ``logz[rows] = lz + lens * shift`` (NaN for the
    ``bad`` rows, whose emission gradient is zeroed) and (``need_w``) ``gW[rows, fwd_arc[a]] =
    gacc[a]`` (zero for the bad rows)."""
    for b in range(rows.shape[0]):
        row = rows[b]
        if bad[b]:
            logz[row] = np.nan
            if need_e:
                gE[row] = 0.0
        else:
            logz[row] = lz[b] + lens[b] * shift
        if need_w:
            for a in range(fwd_arc.shape[0]):
                gW[row, fwd_arc[a]] = 0.0 if bad[b] else gacc[a, b]


@njit(cache=True, nogil=True)
def _chunk(
    rows,
    lengths,
    E,
    start,
    accept,
    state_off,
    group_dst,
    group_label,
    fwd_off,
    fwd_src,
    p_fwd,
    src_off,
    bwd_group,
    p_bwd,
    leak,
    lam,
    nreal,
    virt_off,
    virt_member,
    real_virt_off,
    real_virt,
    fwd_arc,
    shift,
    K,
    need_e,
    need_w,
    logz,
    gE,
    gW,
    work,
):
    """log Z and gradients of one chunk of rows, from start to finish in one call (the GIL
    released throughout).

    ``E``: ``(B, T, C)`` the emissions of the whole batch; ``rows`` the chunk's distinct rows,
    sorted by their ``lengths`` (longest first; ``lengths`` the batch's, in ``[0, T]``: both
    checked by the caller). Each frame is transposed into a ``(C, nb)`` block and its
    ``exp(E - max)`` computed vectorised over the rows, with the previous frame's ``1 / sum``
    folded in (the state vectors are never rescaled by a pass of their own); kept for the
    segment's frames. Writes (:func:`_finish`) ``logz[rows]`` with the weight shift, NaN for rows
    that read a NaN or ``+inf``, ``gE[rows]`` (zero past each row's length) and ``gW[rows]`` (the
    graph's arc order)."""
    nb = rows.shape[0]
    if nb == 0:
        return
    lens = np.empty(nb, np.int64)
    for b in range(nb):
        lens[b] = lengths[rows[b]]
    lz = np.full(nb, -np.inf)  # log Z without the weight shift
    bad = np.zeros(nb, np.bool_)  # rows that read a NaN or +inf
    S = state_off.shape[0] - 1
    G = group_dst.shape[0]
    A = fwd_src.shape[0]
    C = E.shape[2]
    Tm = lens[0]
    gacc = np.zeros((A if need_w else 1, nb), np.float64)  # the arc weights' gradient
    dt = p_fwd.dtype
    nbp = _width(nb)  # the state vectors' columns: the rows padded to whole vectors
    alpha = np.zeros((S, nbp), dt)
    anew = np.zeros((S, nbp), dt)
    mt = np.zeros(nbp, dt)
    chk = np.zeros(nbp, dt)
    ms = np.zeros(nbp, dt)
    offs = np.empty(LANES, np.int64)  # scratch of the segment transposes
    offd = np.empty(LANES, np.int64)
    tot = np.zeros(nbp, dt)
    r = np.ones(nbp, dt)
    cl = np.zeros(nb, dt)
    prod = np.ones(nb, np.float64)
    logs = np.zeros(nb, np.float64)
    ns = start.shape[0]
    for b in range(nb):
        if ns == 0:
            logs[b] = -np.inf
        else:
            logs[b] = math.log(ns)
            for i in range(ns):
                alpha[start[i], b] = 1.0 / ns
    _sum_nodes(nbp, alpha, nreal, virt_off, virt_member)
    nseg = (Tm + K - 1) // K
    KK = min(K, Tm) if Tm > 0 else 1
    # written before they are read (only the active rows' columns are ever read): no zeroing
    ck = np.empty((max(nseg, 1), S, nb), dt)
    ckr = np.empty((max(nseg, 1), nb), dt)
    nU = KK * G * nbp
    nX = KK * C * nbp
    U = work[:nU].reshape((KK, G, nbp))
    EX = work[nU : nU + nX].reshape((KK, C, nbp))  # the segment's emissions, scale folded in, (C, nbp) per frame
    AS = work[nU + nX : nU + nX + (KK * S * nbp if need_w else nbp)].reshape(
        (KK if need_w else 1, S if need_w else 1, nbp)
    )
    for b in range(nb):
        if lens[b] == 0:
            acc = 0.0
            for i in range(accept.shape[0]):
                acc += alpha[accept[i], b]
            lz[b] = logs[b] + math.log(acc) if acc > 0.0 else -np.inf
    nact = nb
    for t in range(Tm):
        while nact > 0 and lens[nact - 1] <= t:
            nact -= 1
        if t % K == 0 and nseg > 1:
            for s in range(S):
                for b in range(nact):
                    ck[t // K, s, b] = alpha[s, b]
            for b in range(nact):
                ckr[t // K, b] = r[b]
        if need_w:
            for s in range(S):
                for b in range(nact):
                    AS[t % K, s, b] = alpha[s, b]
        if t % K == 0:
            _transpose_segment(E, rows, lens, t, min(t + K, Tm), EX, offs, offd, True)
        _max_frame(EX[t % K], nact, mt, chk, bad)
        for b in range(nact):
            logs[b] += mt[b]
        _exp_frame(EX[t % K], mt, r, nact, ms)
        _frame(_width(nact), alpha, anew, EX[t % K], U[t % K], tot, state_off, group_label, fwd_off, fwd_src, p_fwd)
        _rescale(t, nact, lens, anew, tot, r, cl, prod, logs, lam, leak, True)
        _sum_nodes(_width(nact), anew, nreal, virt_off, virt_member)
        alpha, anew = anew, alpha
        for b in range(nact):
            if lens[b] == t + 1:
                acc = 0.0
                for i in range(accept.shape[0]):
                    acc += alpha[accept[i], b]
                acc *= r[b]
                lz[b] = logs[b] + math.log(prod[b]) + math.log(acc) if acc > 0.0 else -np.inf
    if need_e:  # gE is not zeroed by the caller: the frames past each row's length
        for b in range(nb):
            gE[rows[b], lens[b] :] = 0.0
    if not (need_e or need_w) or Tm == 0:
        _finish(rows, lens, lz, bad, shift, need_e, gacc, fwd_arc, need_w, logz, gE, gW)
        return
    # ---- backward, segment by segment from the last
    beta = np.zeros((S, nbp), dt)
    bprev = np.zeros((S, nbp), dt)
    v = np.zeros((G, nbp), dt)
    z = np.zeros(nbp, dt)
    zs = np.zeros(nbp, dt)
    rz = np.ones(nbp, dt)
    q = np.zeros(nb, dt)
    gbuf = np.zeros((C, nbp), dt)
    nact = 0
    for seg in range(nseg - 1, -1, -1):
        t0 = seg * K
        t1 = min(t0 + K, Tm)
        if seg != nseg - 1:  # recompute this segment's group sums and emissions from its checkpoint
            n0 = 0
            while n0 < nb and lens[n0] > t0:
                n0 += 1
            for s in range(S):
                for b in range(n0):
                    alpha[s, b] = ck[seg, s, b]
            for b in range(n0):
                r[b] = ckr[seg, b]
            for t in range(t0, t1):
                nt = 0
                while nt < nb and lens[nt] > t:
                    nt += 1
                if need_w:
                    for s in range(S):
                        for b in range(nt):
                            AS[t - t0, s, b] = alpha[s, b]
                if t == t0:
                    _transpose_segment(E, rows, lens, t0, t1, EX, offs, offd, True)
                _max_frame(EX[t - t0], nt, mt, chk, bad)
                _exp_frame(EX[t - t0], mt, r, nt, ms)
                _frame(
                    _width(nt), alpha, anew, EX[t - t0], U[t - t0], tot, state_off, group_label, fwd_off, fwd_src, p_fwd
                )
                _rescale(t, nt, lens, anew, tot, r, cl, prod, logs, lam, leak, False)
                _sum_nodes(_width(nt), anew, nreal, virt_off, virt_member)
                alpha, anew = anew, alpha
        for t in range(t1 - 1, t0 - 1, -1):
            while nact < nb and lens[nact] >= t + 1:
                for s in range(S):
                    beta[s, nact] = 0.0
                for i in range(accept.shape[0]):
                    beta[accept[i], nact] = 1.0
                rz[nact] = 1.0
                nact += 1
            e = EX[t - t0]
            Ut = U[t - t0]
            _posteriors(_width(nact), e, beta, rz, Ut, v, z, gbuf, group_dst, group_label, need_e)
            for b in range(nact):
                z[b] = 1.0 / z[b] if (z[b] > 0.0 and lz[b] > -np.inf) else 0.0
            if need_e:  # the posteriors scaled into this frame's emission slot, transposed into gE per segment
                _scale_rows(_width(nact), gbuf, z, e)
            if need_w:
                At = AS[t - t0]
                for g in range(G):
                    for a in range(fwd_off[g], fwd_off[g + 1]):
                        s = fwd_src[a]
                        pa = p_fwd[a]
                        for b in range(nact):
                            gacc[a, b] += At[s, b] * pa * v[g, b] * z[b]
            if t == 0:
                continue
            _back_gather(_width(nact), v, bprev, zs, src_off, bwd_group, p_bwd, nreal, real_virt_off, real_virt)
            if lam > 0.0:
                for b in range(nact):
                    q[b] = 0.0
                for s in range(nreal):
                    lk = leak[s]
                    for b in range(nact):
                        q[b] += lk * bprev[s, b]
                for b in range(nact):
                    q[b] *= lam
                    zs[b] += nreal * q[b]
                for s in range(nreal):
                    for b in range(nact):
                        bprev[s, b] += q[b]
            for b in range(nact):
                tt = zs[b]
                if tt > 0.0:
                    if tt < 1.0 / SCALE_RANGE or tt > SCALE_RANGE:
                        for s in range(S):
                            bprev[s, b] = bprev[s, b] / tt
                        rz[b] = 1.0
                    else:
                        rz[b] = 1.0 / tt
                else:
                    rz[b] = 0.0
            beta, bprev = bprev, beta
        if need_e:
            _transpose_segment(gE, rows, lens, t0, t1, EX, offs, offd, False)
    _finish(rows, lens, lz, bad, shift, need_e, gacc, fwd_arc, need_w, logz, gE, gW)


#: bytes of the per-thread segment buffer kept between calls (a larger one is freed after the call)
WORKSPACE_KEEP = 64 << 20
_local = threading.local()


def work_size(nb: int, KK: int, S: int, G: int, C: int, need_w: bool) -> int:
    """Values of the segment buffer of a chunk of ``nb`` rows and ``KK`` frames per segment: the
    group sums, the emissions, and (``need_w``) the state vectors."""
    KK = max(1, KK)
    nb = (nb + LANES - 1) // LANES * LANES
    return KK * (G + C) * nb + (KK * S * nb if need_w else nb)


def _workspace(n: int, dtype) -> np.ndarray:
    """A 1-D buffer of at least ``n`` values of ``dtype`` for the calling thread, the previous
    call's when it is large enough. Fresh memory costs a page fault per page at its first write
    (milliseconds for the megabytes of a segment, and the allocator hands fresh memory back
    whenever other allocations, torch's, came in between); kept while it takes at most
    :data:`WORKSPACE_KEEP` bytes. Each chunk's kernel runs on one thread and is done with the
    buffer when it returns."""
    dt = np.dtype(dtype)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(dt.str)
    if buf is None or buf.size < n:
        bufs.pop(dt.str, None)
        buf = np.empty(max(n, 1), dtype=dt)
        if buf.nbytes <= WORKSPACE_KEEP:
            bufs[dt.str] = buf
    return buf


def checkpoint_interval(B: int, T: int, S: int, G: int, itemsize: int, need_w: bool, C: int = 0) -> int:
    """Frames per segment: all ``T`` (no recompute) when the segment buffers of the batch
    (``B * T * (G + C + S if need_w)`` values: group sums, emissions, states) fit
    :data:`SEGMENT_BUDGET`, else about ``sqrt(T * S / (G + C))`` (balances the segment buffers,
    ``K (G + C)`` per row, against the checkpoints, ``(T / K) S`` per row)."""
    per = B * max(T, 1) * (G + C + (S if need_w else 0)) * itemsize
    if per <= SEGMENT_BUDGET:
        return max(T, 1)
    return max(1, min(T, int(math.sqrt(max(T, 1) * max(S, 1) / max(G + C, 1)))))


def chunks_of(lengths: np.ndarray, threads: int, min_rows: int = CHUNK_ROWS) -> List[np.ndarray]:
    """Rows sorted by length (longest first) dealt round-robin into chunks of at least
    ``min_rows`` rows (the batch is the kernels' vectorised axis: wider chunks use the vector
    units better), at most ``threads`` chunks."""
    B = len(lengths)
    order = np.argsort(-np.asarray(lengths), kind="stable")
    n = max(1, min(threads, B // max(min_rows, 1)))
    return [np.ascontiguousarray(order[i::n]) for i in range(n)]


def shared_scores(
    graph: Any,
    E: np.ndarray,
    lengths: np.ndarray,
    leaky: float = 0.0,
    need_e: bool = True,
    need_w: bool = False,
    checkpoint: Optional[int] = None,
    threads: Optional[int] = None,
    min_rows: int = CHUNK_ROWS,
) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """log Z of a compiled shared graph against each row of ``E`` and its gradients.

    Args:
        graph: a compiled shared graph (:class:`lightning_gtn.core.shared_graph.SharedGraph`),
            labels already checked against ``C``.
        E: ``(B, T, C)`` float32 or float64 emissions (log-space scores).
        lengths: ``(B,)`` int64 frames per row, in ``[0, T]`` (checked by the caller).
        leaky: the leaky-HMM coefficient in ``[0, 1)``.
        need_e: also return ``d logZ[b] / d E[b]`` ``(B, T, C)`` in E's dtype.
        need_w: also return ``d logZ[b] / d w`` ``(B, num_arcs)`` float64.
        checkpoint: frames per segment (see :func:`checkpoint_interval`), None for automatic.
        threads: chunks run in parallel (default: the engine's pool size).
        min_rows: the fewest rows of a chunk (see :func:`chunks_of`).

    Returns:
        ``(logz (B,) float64, grad_E or None, grad_w or None)``; rows with no path get
        ``-inf`` and zero gradients; rows reading a NaN or ``+inf`` get NaN.
    """
    B, T, C = E.shape
    dt = E.dtype
    if not need_w:  # shared sources summed first (the arc-weight gradient wants every arc as it is)
        graph = graph.factored()
    S, G, A = graph.num_states, graph.num_groups, graph.num_arcs
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.shape != (B,) or (B and (lens.min() < 0 or lens.max() > T)):
        raise ValueError(f"lengths must be {B} values in [0, {T}]")
    if graph.max_label >= C:  # the kernel reads emissions by these labels
        raise ValueError(f"the graph's arc label {graph.max_label} is out of range for C={C} classes")
    leak = graph.leak_distribution() if leaky > 0.0 else np.zeros(max(S, 1), dtype=np.float64)
    K = int(checkpoint) if checkpoint else checkpoint_interval(B, T, S, G, dt.itemsize, need_w, C)
    if K < 1:
        raise ValueError(f"checkpoint must be >= 1, got {checkpoint}")
    logz = np.full(B, -np.inf, dtype=np.float64)
    # the kernel writes every frame; a pooled array: no fresh pages to fault in at every call
    gE = OUTPUTS.empty((B, T, C), dt) if need_e else np.empty((1, 1, 1), dtype=dt)
    gW = np.zeros((B, A) if need_w else (1, 1), dtype=np.float64)
    if B == 0:
        return logz, (gE if need_e else None), (gW if need_w else None)
    p_fwd, p_bwd = graph.probabilities(dt)
    chunks = chunks_of(lens, threads or get_num_threads(), min_rows)
    Ec = np.ascontiguousarray(E)

    def run(rows: np.ndarray) -> None:
        _chunk(
            rows,
            lens,
            Ec,
            graph.start,
            graph.accept,
            graph.state_off,
            graph.group_dst,
            graph.group_label,
            graph.group_off,
            graph.fwd_src,
            p_fwd,
            graph.src_off,
            graph.bwd_group,
            p_bwd,
            leak,
            float(leaky),
            graph.num_real,
            graph.virt_off,
            graph.virt_member,
            graph.real_virt_off,
            graph.real_virt,
            graph.fwd_arc,
            float(graph.shift),
            K,
            bool(need_e),
            bool(need_w),
            logz,
            gE,
            gW,
            _workspace(work_size(len(rows), min(K, T), S, G, C, need_w), dt),
        )

    if len(chunks) == 1:
        run(chunks[0])
    else:
        parallel_map(run, chunks)
    return logz, (gE if need_e else None), (gW if need_w else None)
