"""Numba kernels of the batched forward-backward over criterion graphs and dense emissions (CPU).

The recursion is described in :mod:`lightning_gtn.core.dispatch`. Two families of kernels:

* log-domain ``_forward_kernel`` / ``_backward_kernel`` (alphas stored, betas in the backward;
  also the max semiring and the Viterbi backtrack), one example at a time, each node grouping its
  incoming arcs so that it costs one max, one exp per arc and one log;
* ``_fused_kernel``: the scaled linear-domain forward-backward that gives the score and the
  emission gradient (and arc occupancies) in one call, verified per example.

Batch chunks run on the engine's bounded thread pool (the kernels release the GIL). The drivers
take a ``State`` / ``Problem`` of :mod:`.compiled_graphs` (duck-typed, so this module imports nothing
from it).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

NEG_INF = -math.inf


# ---------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _example(e, ex_graph, ex_row, ex_len, node_off):
    """``(graph g, emission row b, frames T, first node n0, nodes S)`` of example ``e``."""
    g = ex_graph[e]
    n0 = node_off[g]
    return g, ex_row[e], ex_len[e], n0, node_off[g + 1] - n0


@njit(cache=True, nogil=True, inline="always")
def _init_frame(vec, r, S, ids, k0, k1):
    """``vec[r : r + S]`` = -inf, except 0 at the nodes ``ids[k0:k1]`` (start or accept)."""
    for n in range(S):
        vec[r + n] = NEG_INF
    for k in range(k0, k1):
        vec[r + ids[k]] = 0.0


@njit(cache=True, nogil=True)
def _eps_forward(alpha, r, g, w, src, eps_node_off, eps_nodes, eps_off, eps_arc, buf, use_max):
    for i in range(eps_node_off[g], eps_node_off[g + 1]):
        n = eps_nodes[i]
        cur = alpha[r + n]
        m = cur
        k0 = eps_off[i]
        k1 = eps_off[i + 1]
        for k in range(k0, k1):
            a = eps_arc[k]
            v = alpha[r + src[a]] + w[a]
            buf[k - k0] = v
            if not v <= m:
                m = v
        if m == NEG_INF or use_max:
            alpha[r + n] = m
            continue
        s = math.exp(cur - m)
        for k in range(k1 - k0):
            s += math.exp(buf[k] - m)
        alpha[r + n] = m + math.log(s)


@njit(cache=True, nogil=True)
def _forward_kernel(
    e0,
    e1,
    ex_graph,
    ex_row,
    ex_len,
    alpha_off,
    E,
    w,
    src,
    label,
    node_off,
    in_off,
    in_arc,
    start_off,
    start,
    accept_off,
    accept,
    eps_node_off,
    eps_nodes,
    eps_off,
    eps_arc,
    alpha,
    logz,
    max_in,
    use_max,
):
    buf = np.empty(max(max_in, 1), dtype=alpha.dtype)
    for e in range(e0, e1):
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        base = alpha_off[e]
        _init_frame(alpha, base, S, start, start_off[g], start_off[g + 1])
        _eps_forward(alpha, base, g, w, src, eps_node_off, eps_nodes, eps_off, eps_arc, buf, use_max)
        for t in range(T):
            prev = base + t * S
            cur = prev + S
            for n in range(S):
                k0 = in_off[n0 + n]
                k1 = in_off[n0 + n + 1]
                m = NEG_INF
                for k in range(k0, k1):
                    a = in_arc[k]
                    v = alpha[prev + src[a]] + w[a] + E[b, t, label[a]]
                    buf[k - k0] = v
                    if not v <= m:  # NaN-propagating max
                        m = v
                if m == NEG_INF or use_max:
                    alpha[cur + n] = m
                    continue
                s = 0.0
                for k in range(k1 - k0):
                    s += math.exp(buf[k] - m)
                alpha[cur + n] = m + math.log(s)
            _eps_forward(alpha, cur, g, w, src, eps_node_off, eps_nodes, eps_off, eps_arc, buf, use_max)
        last = base + T * S
        m = NEG_INF
        for k in range(accept_off[g], accept_off[g + 1]):
            v = alpha[last + accept[k]]
            if not v <= m:
                m = v
        if m == NEG_INF or use_max:
            logz[e] = m
        else:
            s = 0.0
            for k in range(accept_off[g], accept_off[g + 1]):
                s += math.exp(alpha[last + accept[k]] - m)
            logz[e] = m + math.log(s)


@njit(cache=True, nogil=True)
def _eps_backward(beta, alpha, ar, g, w, dst, eps_node_off, eps_nodes, eps_off, eps_arc, buf, lz, coef, gw, need_w):
    for i in range(eps_node_off[g], eps_node_off[g + 1]):
        n = eps_nodes[i]
        cur = beta[n]
        m = cur
        k0 = eps_off[i]
        k1 = eps_off[i + 1]
        for k in range(k0, k1):
            a = eps_arc[k]
            v = w[a] + beta[dst[a]]
            buf[k - k0] = v
            if not v <= m:
                m = v
        if m == NEG_INF:
            continue
        s = math.exp(cur - m)
        for k in range(k1 - k0):
            ev = math.exp(buf[k] - m)
            buf[k] = ev
            s += ev
        beta[n] = m + math.log(s)
        if need_w:
            f = math.exp(alpha[ar + n] + m - lz) * coef
            if f != 0.0:
                for k in range(k0, k1):
                    gw[eps_arc[k]] += f * buf[k - k0]


@njit(cache=True, nogil=True)
def _backward_kernel(
    e0,
    e1,
    ex_graph,
    ex_row,
    ex_len,
    ex_coef,
    alpha_off,
    E,
    w,
    dst,
    label,
    node_off,
    out_off,
    out_arc,
    accept_off,
    accept,
    eps_node_off,
    eps_nodes,
    eps_off,
    eps_arc,
    alpha,
    logz,
    max_nodes,
    max_out,
    gE,
    gw,
    need_e,
    need_w,
):
    buf = np.empty(max(max_out, 1), dtype=alpha.dtype)
    beta_a = np.empty(max(max_nodes, 1), dtype=alpha.dtype)
    beta_b = np.empty(max(max_nodes, 1), dtype=alpha.dtype)
    for e in range(e0, e1):
        coef = ex_coef[e]
        lz = logz[e]
        if coef == 0.0 or lz == NEG_INF:
            continue
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        base = alpha_off[e]
        nxt = beta_a
        cur = beta_b
        _init_frame(nxt, 0, S, accept, accept_off[g], accept_off[g + 1])
        _eps_backward(
            nxt, alpha, base + T * S, g, w, dst, eps_node_off, eps_nodes, eps_off, eps_arc, buf, lz, coef, gw, need_w
        )
        for t in range(T - 1, -1, -1):
            ar = base + t * S
            for n in range(S):
                k0 = out_off[n0 + n]
                k1 = out_off[n0 + n + 1]
                m = NEG_INF
                for k in range(k0, k1):
                    a = out_arc[k]
                    v = w[a] + E[b, t, label[a]] + nxt[dst[a]]
                    buf[k - k0] = v
                    if not v <= m:
                        m = v
                if m == NEG_INF:
                    cur[n] = m
                    continue
                s = 0.0
                for k in range(k1 - k0):
                    ev = math.exp(buf[k] - m)
                    buf[k] = ev
                    s += ev
                cur[n] = m + math.log(s)
                f = math.exp(alpha[ar + n] + m - lz) * coef
                if f != 0.0:
                    for k in range(k0, k1):
                        a = out_arc[k]
                        o = f * buf[k - k0]
                        if need_e:
                            gE[b, t, label[a]] += o
                        if need_w:
                            gw[a] += o
            _eps_backward(
                cur, alpha, ar, g, w, dst, eps_node_off, eps_nodes, eps_off, eps_arc, buf, lz, coef, gw, need_w
            )
            tmp = nxt
            nxt = cur
            cur = tmp


@njit(cache=True, nogil=True)
def _viterbi_backtrack(
    e,
    ex_graph,
    ex_row,
    ex_len,
    alpha_off,
    E,
    w,
    src,
    label,
    node_off,
    in_off,
    in_arc,
    accept_off,
    accept,
    eps_node_off,
    eps_nodes,
    eps_off,
    eps_arc,
    alpha,
    out_labels,
):
    """Frame labels of the best path of example ``e`` (after a max-semiring forward)."""
    g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
    base = alpha_off[e]
    last = base + T * S
    best = -1
    m = NEG_INF
    for k in range(accept_off[g], accept_off[g + 1]):
        v = alpha[last + accept[k]]
        if best < 0 or v > m:
            m = v
            best = accept[k]
    if best < 0 or m == NEG_INF:
        return False
    n = best
    t = T
    while True:
        r = base + t * S
        # follow epsilon arcs backwards while one of them explains the score
        moved = True
        while moved:
            moved = False
            for i in range(eps_node_off[g], eps_node_off[g + 1]):
                if eps_nodes[i] != n:
                    continue
                for k in range(eps_off[i], eps_off[i + 1]):
                    a = eps_arc[k]
                    if alpha[r + src[a]] + w[a] == alpha[r + n] and alpha[r + n] != NEG_INF:
                        n = src[a]
                        moved = True
                        break
                break
        if t == 0:
            return True
        prev = r - S
        bestv = NEG_INF
        besta = -1
        for k in range(in_off[n0 + n], in_off[n0 + n + 1]):
            a = in_arc[k]
            v = alpha[prev + src[a]] + w[a] + E[b, t - 1, label[a]]
            if besta < 0 or v > bestv:
                bestv = v
                besta = a
        if besta < 0:
            return False
        out_labels[t - 1] = label[besta]
        n = src[besta]
        t -= 1


@njit(cache=True, nogil=True, inline="always")
def _vmax(v, r, S):
    """``max(0, v[r], ..., v[r + S - 1])`` (NaN entries are skipped)."""
    m = 0.0
    for n in range(S):
        if v[r + n] > m:
            m = v[r + n]
    return m


@njit(cache=True, nogil=True, inline="always")
def _scaled_eps_in(A, r, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc):
    """Linear-domain epsilon closure of the frame vector ``A[r : r + S]`` (forward)."""
    for i in range(ein_node_off[g], ein_node_off[g + 1]):
        n = ein_nodes[i]
        for k in range(ein_off[i], ein_off[i + 1]):
            a = ein_arc[k]
            A[r + n] += A[r + src[a]] * ew_all[a - a0]


@njit(cache=True, nogil=True, inline="always")
def _scaled_eps_out(
    beta, A, r, F, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc, gw_ex, wo, need_w
):
    """Linear-domain epsilon closure of ``beta`` (backward); with ``need_w`` each epsilon arc's
    occupancy ``A[r + n] * v * F`` goes to ``gw_ex[wo + local arc id]``."""
    for i in range(eout_node_off[g], eout_node_off[g + 1]):
        n = eout_nodes[i]
        for k in range(eout_off[i], eout_off[i + 1]):
            a = eout_arc[k]
            v = ew_all[a - a0] * beta[dst[a]]
            beta[n] += v
            if need_w:
                gw_ex[wo + a - a0] += A[r + n] * v * F


SEG_WIDTH = 32  # nodes per scale segment of the fused kernel (graphs without epsilon arcs)
SEG_MIN_FRAMES = 2000  # examples this long or shorter first try one scale per frame
NEG_BIG = -1e300  # log scale of an empty segment: finite, so scale differences never give NaN
GHOST_RANGE = 600.0  # a ghost's factor stays below exp(600): float64 keeps its products finite


@njit(cache=True, nogil=True)
def _ghost_table(S, W, n0, k0, off, other, lp, arc, ew_all, a0):
    """The arcs of one example grouped by node (``off``: CSR over the graph's nodes; ``other``:
    the local node at the far end; ``lp``: label position; ``arc``: global arc id), with each
    far node outside the node's segment replaced by a ghost slot ``S + g``: one per (segment,
    far node), holding that node's value rescaled to the segment's scale.

    Returns ``(loff (S + 1,), lother, llp, lew, larc, ghost_node (G,), ghost_seg (G,))``.
    """
    nk = off[n0 + S] - k0
    loff = np.empty(S + 1, dtype=np.int64)
    lother = np.empty(max(nk, 1), dtype=np.int32)  # int32: the arc loops' tables stay small in cache
    llp = np.empty(max(nk, 1), dtype=np.int32)
    lew = np.empty(max(nk, 1))
    larc = np.empty(max(nk, 1), dtype=np.int64)
    ghost_node = np.empty(max(nk, 1), dtype=np.int64)
    ghost_seg = np.empty(max(nk, 1), dtype=np.int64)
    slot = np.full(S, -1, dtype=np.int64)  # ghost of each far node for the current segment
    owner = np.full(S, -1, dtype=np.int64)
    G = 0
    for n in range(S):
        i = n // W
        loff[n] = off[n0 + n] - k0
        for k in range(off[n0 + n], off[n0 + n + 1]):
            q = k - k0
            o = other[k]
            if o // W == i:
                lother[q] = o
            else:
                if owner[o] != i:
                    owner[o] = i
                    slot[o] = G
                    ghost_node[G] = o
                    ghost_seg[G] = i
                    G += 1
                lother[q] = S + slot[o]
            llp[q] = lp[k]
            larc[q] = arc[k] - a0
            lew[q] = ew_all[arc[k] - a0]
    loff[S] = nk
    return loff, lother, llp, lew, larc, ghost_node[:G], ghost_seg[:G]


@njit(cache=True, nogil=True, inline="always")
def _fill_ghosts(vec, r, S, W, nseg, scale, ghost_node, ghost_seg):
    """Puts each segment on a common scale with the far nodes it reads: the segment's scale is
    raised to ``max far scale - GHOST_RANGE`` where needed (its values rescaled in place), then
    ghost g = ``vec[r + node] * exp(scale[node's segment] - scale[g's segment])``."""
    changed = True
    while changed:  # a raised segment can raise the segments that read it: to a fixed point
        changed = False
        for g in range(len(ghost_node)):
            i = ghost_seg[g]
            v = scale[ghost_node[g] // W] - GHOST_RANGE
            if v > scale[i]:
                f = math.exp(scale[i] - v)
                for n in range(i * W, min(S, (i + 1) * W)):
                    vec[r + n] *= f
                scale[i] = v
                changed = True
    for g in range(len(ghost_node)):
        vec[r + S + g] = vec[r + ghost_node[g]] * math.exp(scale[ghost_node[g] // W] - scale[ghost_seg[g]])


@njit(cache=True, nogil=True, inline="always")
def _normalise_segments(vec, r, src, S, W, nseg, ref, add, scale):
    """``vec[r + n] = src[n] / max over n's segment``; ``scale[i] = ref[i] + log(max) + add``
    (``NEG_BIG`` for an all-zero segment). Returns False on inf/NaN, or when all are zero."""
    any_pos = False
    for i in range(nseg):
        n1 = min(S, (i + 1) * W)
        m = 0.0
        for n in range(i * W, n1):
            if src[n] > m:  # NaNs are skipped (and fail the occupancy check): the loop vectorises
                m = src[n]
        if not m < math.inf:
            return False
        if m > 0.0:
            any_pos = True
            inv = 1.0 / m
            for n in range(i * W, n1):
                vec[r + n] = src[n] * inv
            scale[i] = ref[i] + math.log(m) + add
        else:
            for n in range(i * W, n1):
                vec[r + n] = 0.0
            scale[i] = NEG_BIG
    return any_pos


@njit(cache=True, nogil=True)
def _fused_kernel(
    e0,
    e1,
    ex_graph,
    ex_row,
    ex_len,
    ex_sign,
    E,
    w,
    src,
    dst,
    node_off,
    arc_off,
    in_off,
    in_arc,
    in_src,
    in_lp,
    out_off,
    out_arc,
    out_dst,
    out_lp,
    start_off,
    start,
    accept_off,
    accept,
    ein_node_off,
    ein_nodes,
    ein_off,
    ein_arc,
    eout_node_off,
    eout_nodes,
    eout_off,
    eout_arc,
    lab_off,
    labs,
    logz,
    flag,
    gE,
    need_e,
    tol,
    gw_ex,
    gw_off,
    need_w,
    ex_seg,
):
    """Scaled linear-domain forward-backward with the emission gradient, per example.

    With ``need_w``, the occupancy of every arc of example ``e`` (summed over frames, no sign)
    goes to ``gw_ex[gw_off[e] + local arc id]``. ``ex_seg[e]``: -1 skips example e; 0 scores
    it with one scale per frame; W > 0 cuts alpha and beta into segments of W consecutive nodes
    (one segment when the graph has epsilon arcs).

    alpha and beta are float64 vectors; each segment is normalised to max 1 per frame and
    carries its own float64 log scale, so nothing is exponentiated per arc: only each used label
    once per frame, and one factor per ghost (below). One scale per frame is not enough on long
    inputs: at frame t of a CTC graph alpha peaks far ahead of the states that the posterior
    occupies (more label sequences end there), and with T in the thousands the gap exceeds
    float64's range (exp(-745)), so the states that matter underflowed to 0. Within a segment
    the spread stays small. An arc between two segments reads a ghost: a slot after the
    segment's nodes holding the far node's value on the segment's scale, filled once per frame,
    so every arc loop is the plain one-scale loop. Underflow can still drop paths on extreme
    inputs, so the result is verified: at every frame the occupancies of the emitting arcs must
    sum to 1 (every path crosses a frame on exactly one emitting arc). Examples that fail (or
    meet -inf/NaN emissions, large weights, no path) keep ``flag = 1`` and get nothing written;
    the caller scores them otherwise. Graphs whose arcs all weigh 0 (CTC, the sequence
    criterion) take loops without the arc weight products.
    """
    for e in range(e0, e1):
        if ex_seg[e] < 0:  # not asked for
            continue
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        sign = ex_sign[e]
        a0 = arc_off[g]
        k0 = in_off[n0]
        flag[e] = 1
        if need_w:  # a failed earlier attempt may have left partial sums
            for a in range(gw_off[e], gw_off[e + 1]):
                gw_ex[a] = 0.0
        if T == 0:
            continue
        ok = True
        ew_all = np.empty(arc_off[g + 1] - a0)
        unit = True  # every arc weighs 0 (CTC, the sequence criterion): skip the products
        for a in range(a0, arc_off[g + 1]):
            if not abs(w[a]) <= 30.0:
                ok = False
            if w[a] != 0.0:
                unit = False
            ew_all[a - a0] = math.exp(w[a])
        if not ok:
            continue
        has_eps = ein_node_off[g + 1] > ein_node_off[g] or eout_node_off[g + 1] > eout_node_off[g]
        W = S if has_eps or ex_seg[e] == 0 else max(1, min(ex_seg[e], S))
        nseg = (S + W - 1) // W
        (ioff, isrc, ilp, iew, _, gin_node, gin_seg) = _ghost_table(
            S, W, n0, k0, in_off, in_src, in_lp, in_arc, ew_all, a0
        )
        (ooff, odst, olp, oew, oarc, gout_node, gout_seg) = _ghost_table(
            S, W, n0, k0, out_off, out_dst, out_lp, out_arc, ew_all, a0
        )
        R = S + len(gin_node)  # alpha row: the nodes, then this frame's ghosts
        Fseg = np.empty(nseg)
        l0 = lab_off[g]
        nl = lab_off[g + 1] - l0
        P = np.empty((T, nl))  # exp(emission - frame max) of the used labels
        mxs = np.empty(T)
        A = np.zeros((T + 1) * R)
        cs = np.empty((T + 1, nseg))  # log scale of each segment of alpha, per frame
        acc_v = np.zeros(S)
        for k in range(start_off[g], start_off[g + 1]):
            acc_v[start[k]] = 1.0
        _scaled_eps_in(acc_v, 0, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc)
        Fseg[:] = 0.0
        if not _normalise_segments(A, 0, acc_v, S, W, nseg, Fseg, 0.0, cs[0]):
            continue
        for t in range(T):
            mx = -math.inf
            for i in range(nl):
                v = E[b, t, labs[l0 + i]]
                if v > mx:
                    mx = v
            if not (mx > -math.inf and mx < math.inf):
                ok = False
                break
            for i in range(nl):
                P[t, i] = math.exp(E[b, t, labs[l0 + i]] - mx)
            mxs[t] = mx
            prev = t * R
            _fill_ghosts(A, prev, S, W, nseg, cs[t], gin_node, gin_seg)
            if unit:
                for n in range(S):
                    acc = 0.0
                    for k in range(ioff[n], ioff[n + 1]):
                        acc += A[prev + isrc[k]] * P[t, ilp[k]]
                    acc_v[n] = acc
            else:
                for n in range(S):
                    acc = 0.0
                    for k in range(ioff[n], ioff[n + 1]):
                        acc += A[prev + isrc[k]] * iew[k] * P[t, ilp[k]]
                    acc_v[n] = acc
            _scaled_eps_in(acc_v, 0, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc)
            if not _normalise_segments(A, prev + R, acc_v, S, W, nseg, cs[t], mx, cs[t + 1]):
                ok = False
                break
        if not ok:
            continue
        last = T * R
        cm = NEG_BIG
        for k in range(accept_off[g], accept_off[g + 1]):
            v = cs[T, accept[k] // W]
            if v > cm:
                cm = v
        z = 0.0
        for k in range(accept_off[g], accept_off[g + 1]):
            n = accept[k]
            z += A[last + n] * math.exp(cs[T, n // W] - cm)
        if not z > 0.0:
            continue
        lz = cm + math.log(z)
        # backward, with the occupancies of the emitting arcs (G: per frame and used label)
        G = np.zeros((T, nl))
        nxt = np.zeros(S + len(gout_node))  # beta_{t+1}: the nodes, then the ghosts
        cur_b = np.zeros(S)
        ds = np.full(nseg, NEG_BIG)  # log scale of each segment of beta
        for k in range(accept_off[g], accept_off[g + 1]):
            cur_b[accept[k]] = 1.0
            ds[accept[k] // W] = 0.0
        wo = gw_off[e]
        if has_eps:  # one segment
            _scaled_eps_out(
                cur_b,
                A,
                last,
                math.exp(cs[T, 0] + ds[0] - lz),
                g,
                ew_all,
                a0,
                dst,
                eout_node_off,
                eout_nodes,
                eout_off,
                eout_arc,
                gw_ex,
                wo,
                need_w,
            )
        if not _normalise_segments(nxt, 0, cur_b, S, W, nseg, ds, 0.0, ds):
            continue
        for t in range(T - 1, -1, -1):
            mx = mxs[t]
            _fill_ghosts(nxt, 0, S, W, nseg, ds, gout_node, gout_seg)
            for i in range(nseg):
                Fseg[i] = math.exp(cs[t, i] + ds[i] + mx - lz)
            total = 0.0
            prev = t * R
            for i in range(nseg):
                Fi = Fseg[i]
                if unit and not need_w:
                    for n in range(i * W, min(S, (i + 1) * W)):
                        acc = 0.0
                        an = A[prev + n] * Fi
                        for k in range(ooff[n], ooff[n + 1]):
                            j = olp[k]
                            v = P[t, j] * nxt[odst[k]]
                            acc += v
                            G[t, j] += an * v
                        cur_b[n] = acc
                        total += an * acc
                else:
                    for n in range(i * W, min(S, (i + 1) * W)):
                        acc = 0.0
                        an = A[prev + n] * Fi
                        for k in range(ooff[n], ooff[n + 1]):
                            j = olp[k]
                            v = oew[k] * P[t, j] * nxt[odst[k]]
                            acc += v
                            G[t, j] += an * v
                            if need_w:
                                gw_ex[wo + oarc[k]] += an * v
                        cur_b[n] = acc
                        total += an * acc
            if not abs(total - 1.0) <= tol:
                ok = False
                break
            if has_eps:
                _scaled_eps_out(
                    cur_b,
                    A,
                    prev,
                    Fseg[0],
                    g,
                    ew_all,
                    a0,
                    dst,
                    eout_node_off,
                    eout_nodes,
                    eout_off,
                    eout_arc,
                    gw_ex,
                    wo,
                    need_w,
                )
            if not _normalise_segments(nxt, 0, cur_b, S, W, nseg, ds, mx, ds):
                ok = False
                break
        if not ok:
            continue
        flag[e] = 0
        logz[e] = lz
        if need_e:
            for t in range(T):
                for i in range(nl):
                    gE[b, t, labs[l0 + i]] += sign * G[t, i]


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a numpy array (detached, no copy): what the numba kernels read
    and write in place."""
    return t.detach().numpy()


def _run_chunks(fn, chunks):
    if len(chunks) <= 1:
        for c in chunks:
            fn(*c)
        return
    parallel_map(fn, [c[0] for c in chunks], [c[1] for c in chunks])


def numba_forward(st, use_max: bool) -> None:
    """Forward pass over all examples of ``st.problem`` with the numba kernel, on the CPU.

    Sets ``st.alpha`` (flat, ``(alpha_off[-1],)``: each example's ``(T_e + 1, S_e)`` forward
    scores) and ``st.logz`` ``(N,)``, in the dtype of ``st.E`` ``(B, T, C)``. ``use_max``: the
    max semiring (Viterbi) instead of the log semiring.
    """
    p, bt = st.problem, st.problem.batch
    E = st.E
    dtype = E.dtype
    alpha = torch.empty(int(p.alpha_off[-1]), dtype=dtype)
    logz = torch.empty(p.num_examples, dtype=dtype)
    En, wn, an, ln = numpy_view(E), numpy_view(st.w), numpy_view(alpha), numpy_view(logz)

    def run(e0, e1):
        _forward_kernel(
            e0,
            e1,
            p.ex_graph,
            p.ex_row,
            p.ex_len,
            p.alpha_off,
            En,
            wn,
            bt.src,
            bt.label,
            bt.node_off,
            bt.in_off,
            bt.in_arc,
            bt.start_off,
            bt.start,
            bt.accept_off,
            bt.accept,
            bt.eps_in_node_off,
            bt.eps_in_nodes,
            bt.eps_in_off,
            bt.eps_in_arc,
            an,
            ln,
            max(bt.max_in, bt.max_eps),
            use_max,
        )

    _run_chunks(run, p.chunks(get_num_threads()))
    st.alpha = alpha
    st.logz = logz


def numba_backward(st, coef: torch.Tensor, need_e: bool, need_w: bool):
    """Backward pass of :func:`numba_forward` (log semiring) on the CPU.

    Args:
        st: the state the forward filled.
        coef: ``(N,)`` the gradient of the output with respect to each example's score.
        need_e, need_w: which gradients to compute.

    Returns:
        ``(grad_E (B, T, C) or None, grad_w (num_arcs,) or None)`` in the dtype of ``st.E``.
    """
    p, bt = st.problem, st.problem.batch
    E = st.E
    gE = torch.zeros_like(E) if need_e else torch.zeros((1, 1, 1), dtype=E.dtype)
    chunks = p.chunks(get_num_threads())
    nw = bt.num_arcs if need_w else 1
    gw = torch.zeros((max(len(chunks), 1), nw), dtype=E.dtype)
    coefn = np.ascontiguousarray(coef.detach().cpu().numpy().astype(numpy_view(E).dtype, copy=False))
    En, wn, an, ln, gEn, gwn = (
        numpy_view(E),
        numpy_view(st.w),
        numpy_view(st.alpha),
        numpy_view(st.logz),
        numpy_view(gE),
        numpy_view(gw),
    )

    def run(i, e0, e1):
        _backward_kernel(
            e0,
            e1,
            p.ex_graph,
            p.ex_row,
            p.ex_len,
            coefn,
            p.alpha_off,
            En,
            wn,
            bt.dst,
            bt.label,
            bt.node_off,
            bt.out_off,
            bt.out_arc,
            bt.accept_off,
            bt.accept,
            bt.eps_out_node_off,
            bt.eps_out_nodes,
            bt.eps_out_off,
            bt.eps_out_arc,
            an,
            ln,
            bt.max_nodes,
            max(bt.max_out, bt.max_eps),
            gEn,
            gwn[i],
            need_e,
            need_w,
        )

    if len(chunks) <= 1:
        for c in chunks:
            run(0, *c)
    else:
        parallel_map(run, list(range(len(chunks))), [c[0] for c in chunks], [c[1] for c in chunks])
    return (gE if need_e else None), (gw.sum(0) if need_w else None)


FUSED_TOL = 1e-6


def fused_scaled(p, E: torch.Tensor, w: torch.Tensor, sign: np.ndarray, need_e: bool, need_w: bool):
    """Runs :func:`_fused_kernel` on all examples of ``p`` (a ``Problem``): examples of at most
    ``SEG_MIN_FRAMES`` frames with one scale per frame first, the others (and those that
    failed) with a scale per segment of ``SEG_WIDTH`` nodes.

    Returns ``(logz (N,) float64, flag (N,), gE, gw_ex, gw_off, arcs)``: ``flag[e] = 1`` for the
    examples the kernel could not vouch for (nothing written for them); ``gE`` ``(B, T, C)``
    holds ``sum_e sign[e] * d logZ_e / dE`` of the others; ``gw_ex[gw_off[e] : gw_off[e + 1]]``
    the arc occupancies of example ``e`` (``arcs[e]`` arcs) when ``need_w``.
    """
    bt = p.batch
    dtype = E.dtype
    N = p.num_examples
    logz = np.zeros(N, dtype=np.float64)
    flag = np.ones(N, dtype=np.int64)
    gE = torch.zeros_like(E) if need_e else torch.zeros((1, 1, 1), dtype=dtype)
    En, wn, gEn = numpy_view(E), numpy_view(w).astype(np.float64), numpy_view(gE)
    signn = np.ascontiguousarray(sign, dtype=np.float64)
    arcs = np.diff(bt.arc_off)[p.ex_graph] if N else np.zeros(0, np.int64)
    gw_off = np.zeros(N + 1, dtype=np.int64)
    if need_w:
        np.cumsum(arcs, out=gw_off[1:])
    gw_ex = np.zeros(max(int(gw_off[-1]), 1), dtype=np.float64)

    def run(e0, e1):
        _fused_kernel(
            e0,
            e1,
            p.ex_graph,
            p.ex_row,
            p.ex_len,
            signn,
            En,
            wn,
            bt.src,
            bt.dst,
            bt.node_off,
            bt.arc_off,
            bt.in_off,
            bt.in_arc,
            bt.in_src,
            bt.in_lp,
            bt.out_off,
            bt.out_arc,
            bt.out_dst,
            bt.out_lp,
            bt.start_off,
            bt.start,
            bt.accept_off,
            bt.accept,
            bt.eps_in_node_off,
            bt.eps_in_nodes,
            bt.eps_in_off,
            bt.eps_in_arc,
            bt.eps_out_node_off,
            bt.eps_out_nodes,
            bt.eps_out_off,
            bt.eps_out_arc,
            bt.lab_off,
            bt.labels,
            logz,
            flag,
            gEn,
            need_e,
            FUSED_TOL,
            gw_ex,
            gw_off,
            need_w,
            ex_seg,
        )

    # short examples first try one scale per frame; those it cannot vouch for, and all long ones,
    # are scored with per-segment scales
    ex_seg = np.where(p.ex_len > SEG_MIN_FRAMES, SEG_WIDTH, 0).astype(np.int64)
    chunks = p.chunks(get_num_threads())
    _run_chunks(run, chunks)
    retry = (flag == 1) & (ex_seg == 0) & (p.ex_len > 0)
    if retry.any():
        ex_seg = np.where(retry, SEG_WIDTH, -1).astype(np.int64)
        _run_chunks(run, chunks)
    return logz, flag, gE, gw_ex, gw_off, arcs


def viterbi_labels(st) -> list:
    """Frame labels of the best path of each example (numba state, max semiring), or None if none."""
    p, bt = st.problem, st.problem.batch
    En, wn, an = numpy_view(st.E), numpy_view(st.w), numpy_view(st.alpha)
    out = []
    for e in range(p.num_examples):
        labels = np.full(int(p.ex_len[e]), -1, dtype=np.int64)
        ok = _viterbi_backtrack(
            e,
            p.ex_graph,
            p.ex_row,
            p.ex_len,
            p.alpha_off,
            En,
            wn,
            bt.src,
            bt.label,
            bt.node_off,
            bt.in_off,
            bt.in_arc,
            bt.accept_off,
            bt.accept,
            bt.eps_in_node_off,
            bt.eps_in_nodes,
            bt.eps_in_off,
            bt.eps_in_arc,
            an,
            labels,
        )
        out.append(labels if ok else None)
    return out
