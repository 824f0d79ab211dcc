"""Numba kernels of the batched forward-backward over criterion graphs and dense emissions (CPU).

The recursion is described in :mod:`._dispatch`. Two families of kernels:

* log-domain ``_forward_kernel`` / ``_backward_kernel`` (alphas stored, betas in the backward;
  also the max semiring and the Viterbi backtrack), one example at a time, each node grouping its
  incoming arcs so that it costs one max, one exp per arc and one log;
* ``_fused_kernel``: the scaled linear-domain forward-backward that gives the score and the
  emission gradient (and arc occupancies) in one call, verified per example.

Batch chunks run on the engine's bounded thread pool (the kernels release the GIL). The drivers
take a ``State`` / ``Problem`` of :mod:`._dispatch` (duck-typed, so this module imports nothing
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
    e0, e1, ex_graph, ex_row, ex_len, alpha_off, E, w, src, label,
    node_off, in_off, in_arc, start_off, start, accept_off, accept,
    eps_node_off, eps_nodes, eps_off, eps_arc, alpha, logz, max_in, use_max,
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
def _eps_backward(beta, alpha, ar, g, w, dst, eps_node_off, eps_nodes, eps_off, eps_arc,
                  buf, lz, coef, gw, need_w):
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
    e0, e1, ex_graph, ex_row, ex_len, ex_coef, alpha_off, E, w, dst, label,
    node_off, out_off, out_arc, accept_off, accept,
    eps_node_off, eps_nodes, eps_off, eps_arc, alpha, logz, max_nodes, max_out,
    gE, gw, need_e, need_w,
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
        _eps_backward(nxt, alpha, base + T * S, g, w, dst, eps_node_off, eps_nodes, eps_off,
                      eps_arc, buf, lz, coef, gw, need_w)
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
            _eps_backward(cur, alpha, ar, g, w, dst, eps_node_off, eps_nodes, eps_off,
                          eps_arc, buf, lz, coef, gw, need_w)
            tmp = nxt
            nxt = cur
            cur = tmp


@njit(cache=True, nogil=True)
def _viterbi_backtrack(e, ex_graph, ex_row, ex_len, alpha_off, E, w, src, label,
                       node_off, in_off, in_arc, accept_off, accept,
                       eps_node_off, eps_nodes, eps_off, eps_arc, alpha, out_labels):
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
def _scaled_eps_out(beta, A, r, F, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc,
                    gw_ex, wo, need_w):
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


@njit(cache=True, nogil=True)
def _fused_kernel(
    e0, e1, ex_graph, ex_row, ex_len, ex_sign, E, w, src, dst,
    node_off, arc_off, in_off, in_arc, in_src, in_lp, out_off, out_arc, out_dst, out_lp,
    start_off, start, accept_off, accept,
    ein_node_off, ein_nodes, ein_off, ein_arc, eout_node_off, eout_nodes, eout_off, eout_arc,
    lab_off, labs, logz, flag, gE, need_e, tol, gw_ex, gw_off, need_w,
):
    """Scaled linear-domain forward-backward with the emission gradient, per example.

    With ``need_w``, the occupancy of every arc of example ``e`` (summed over frames, no sign)
    goes to ``gw_ex[gw_off[e] + local arc id]``.

    alpha and beta are float64 vectors normalised to max 1 per frame plus a log scale, so
    nothing is exponentiated per arc: only each used label once per frame. Underflow can
    silently drop paths, so the result is verified: at every frame the occupancies of the
    emitting arcs must sum to 1 (every path crosses a frame on exactly one emitting arc).
    Examples that fail (or meet -inf/NaN emissions, large weights, no path) keep
    ``flag = 1`` and get nothing written; the caller scores them with the log-domain kernels.
    Graphs whose arcs all weigh 0 (CTC, the sequence criterion) take loops without the arc
    weight products (20% faster on the CTC benchmark's small shape).
    """
    for e in range(e0, e1):
        g, b, T, n0, S = _example(e, ex_graph, ex_row, ex_len, node_off)
        sign = ex_sign[e]
        a0 = arc_off[g]
        k0 = in_off[n0]
        nk = in_off[n0 + S] - k0
        flag[e] = 1
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
        ew_in = np.empty(nk)
        ew_out = np.empty(nk)
        for k in range(nk):
            ew_in[k] = ew_all[in_arc[k0 + k] - a0]
            ew_out[k] = ew_all[out_arc[k0 + k] - a0]
        l0 = lab_off[g]
        nl = lab_off[g + 1] - l0
        P = np.empty((T, nl))  # exp(emission - frame max) of the used labels
        mxs = np.empty(T)
        A = np.zeros((T + 1) * S)
        ls = np.empty(T + 1)
        for k in range(start_off[g], start_off[g + 1]):
            A[start[k]] = 1.0
        _scaled_eps_in(A, 0, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc)
        m = _vmax(A, 0, S)
        if not m > 0.0:
            continue
        for n in range(S):
            A[n] /= m
        ls[0] = math.log(m)
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
            prev = t * S
            cur = prev + S
            if unit:
                for n in range(S):
                    acc = 0.0
                    for k in range(in_off[n0 + n], in_off[n0 + n + 1]):
                        acc += A[prev + in_src[k]] * P[t, in_lp[k]]
                    A[cur + n] = acc
            else:
                for n in range(S):
                    acc = 0.0
                    for k in range(in_off[n0 + n] - k0, in_off[n0 + n + 1] - k0):
                        acc += A[prev + in_src[k0 + k]] * ew_in[k] * P[t, in_lp[k0 + k]]
                    A[cur + n] = acc
            _scaled_eps_in(A, cur, g, ew_all, a0, src, ein_node_off, ein_nodes, ein_off, ein_arc)
            m = _vmax(A, cur, S)
            if not (m > 0.0 and m < math.inf):
                ok = False
                break
            inv = 1.0 / m
            for n in range(S):
                A[cur + n] *= inv
            ls[t + 1] = ls[t] + math.log(m) + mx
        if not ok:
            continue
        z = 0.0
        last = T * S
        for k in range(accept_off[g], accept_off[g + 1]):
            z += A[last + accept[k]]
        if not z > 0.0:
            continue
        lz = ls[T] + math.log(z)
        # backward, with the occupancies of the emitting arcs (G: per frame and used label)
        G = np.zeros((T, nl))
        nxt = np.zeros(S)
        cur_b = np.empty(S)
        for k in range(accept_off[g], accept_off[g + 1]):
            nxt[accept[k]] = 1.0
        FT = math.exp(ls[T] - lz)
        wo = gw_off[e]
        _scaled_eps_out(nxt, A, last, FT, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc,
                        gw_ex, wo, need_w)
        m = _vmax(nxt, 0, S)
        for n in range(S):
            nxt[n] /= m
        lb = math.log(m)
        for t in range(T - 1, -1, -1):
            mx = mxs[t]
            F = math.exp(ls[t] + mx + lb - lz)
            total = 0.0
            prev = t * S
            if unit and not need_w:
                for n in range(S):
                    acc = 0.0
                    an = A[prev + n] * F
                    for k in range(out_off[n0 + n], out_off[n0 + n + 1]):
                        j = out_lp[k]
                        v = P[t, j] * nxt[out_dst[k]]
                        acc += v
                        G[t, j] += an * v
                    cur_b[n] = acc
                    total += an * acc
            else:
                for n in range(S):
                    acc = 0.0
                    an = A[prev + n] * F
                    for k in range(out_off[n0 + n] - k0, out_off[n0 + n + 1] - k0):
                        j = out_lp[k0 + k]
                        v = ew_out[k] * P[t, j] * nxt[out_dst[k0 + k]]
                        acc += v
                        G[t, j] += an * v
                        if need_w:
                            gw_ex[wo + out_arc[k0 + k] - a0] += an * v
                    cur_b[n] = acc
                    total += an * acc
            if not abs(total - 1.0) <= tol:
                ok = False
                break
            _scaled_eps_out(cur_b, A, prev, F, g, ew_all, a0, dst, eout_node_off, eout_nodes, eout_off, eout_arc,
                            gw_ex, wo, need_w)
            m = _vmax(cur_b, 0, S)
            if not (m > 0.0 and m < math.inf):
                ok = False
                break
            inv = 1.0 / m
            for n in range(S):
                nxt[n] = cur_b[n] * inv
            lb = lb + math.log(m) + mx
        if not ok:
            continue
        flag[e] = 0
        logz[e] = lz
        if need_e:
            for t in range(T):
                for i in range(nl):
                    gE[b, t, labs[l0 + i]] += sign * G[t, i]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()



def _run_chunks(fn, chunks):
    if len(chunks) <= 1:
        for c in chunks:
            fn(*c)
        return
    parallel_map(fn, [c[0] for c in chunks], [c[1] for c in chunks])



def numba_forward(st, use_max: bool) -> None:
    p, bt = st.problem, st.problem.batch
    E = st.E
    dtype = E.dtype
    alpha = torch.empty(int(p.alpha_off[-1]), dtype=dtype)
    logz = torch.empty(p.num_examples, dtype=dtype)
    En, wn, an, ln = _np(E), _np(st.w), _np(alpha), _np(logz)

    def run(e0, e1):
        _forward_kernel(
            e0, e1, p.ex_graph, p.ex_row, p.ex_len, p.alpha_off, En, wn, bt.src, bt.label,
            bt.node_off, bt.in_off, bt.in_arc, bt.start_off, bt.start, bt.accept_off, bt.accept,
            bt.eps_in_node_off, bt.eps_in_nodes, bt.eps_in_off, bt.eps_in_arc, an, ln,
            max(bt.max_in, bt.max_eps), use_max,
        )

    _run_chunks(run, p.chunks(get_num_threads()))
    st.alpha = alpha
    st.logz = logz


def numba_backward(st, coef: torch.Tensor, need_e: bool, need_w: bool):
    p, bt = st.problem, st.problem.batch
    E = st.E
    gE = torch.zeros_like(E) if need_e else torch.zeros((1, 1, 1), dtype=E.dtype)
    chunks = p.chunks(get_num_threads())
    nw = bt.num_arcs if need_w else 1
    gw = torch.zeros((max(len(chunks), 1), nw), dtype=E.dtype)
    coefn = np.ascontiguousarray(coef.detach().cpu().numpy().astype(_np(E).dtype, copy=False))
    En, wn, an, ln, gEn, gwn = _np(E), _np(st.w), _np(st.alpha), _np(st.logz), _np(gE), _np(gw)

    def run(i, e0, e1):
        _backward_kernel(
            e0, e1, p.ex_graph, p.ex_row, p.ex_len, coefn, p.alpha_off, En, wn, bt.dst, bt.label,
            bt.node_off, bt.out_off, bt.out_arc, bt.accept_off, bt.accept,
            bt.eps_out_node_off, bt.eps_out_nodes, bt.eps_out_off, bt.eps_out_arc, an, ln,
            bt.max_nodes, max(bt.max_out, bt.max_eps), gEn, gwn[i], need_e, need_w,
        )

    if len(chunks) <= 1:
        for c in chunks:
            run(0, *c)
    else:
        parallel_map(run, list(range(len(chunks))), [c[0] for c in chunks], [c[1] for c in chunks])
    return (gE if need_e else None), (gw.sum(0) if need_w else None)



FUSED_TOL = 1e-6


def fused_scaled(p, E: torch.Tensor, w: torch.Tensor, sign: np.ndarray, need_e: bool, need_w: bool):
    """Runs :func:`_fused_kernel` on all examples of ``p`` (a ``Problem``).

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
    En, wn, gEn = _np(E), _np(w).astype(np.float64), _np(gE)
    signn = np.ascontiguousarray(sign, dtype=np.float64)
    arcs = np.diff(bt.arc_off)[p.ex_graph] if N else np.zeros(0, np.int64)
    gw_off = np.zeros(N + 1, dtype=np.int64)
    if need_w:
        np.cumsum(arcs, out=gw_off[1:])
    gw_ex = np.zeros(max(int(gw_off[-1]), 1), dtype=np.float64)

    def run(e0, e1):
        _fused_kernel(
            e0, e1, p.ex_graph, p.ex_row, p.ex_len, signn, En, wn, bt.src, bt.dst,
            bt.node_off, bt.arc_off, bt.in_off, bt.in_arc, bt.in_src, bt.in_lp,
            bt.out_off, bt.out_arc, bt.out_dst, bt.out_lp, bt.start_off, bt.start, bt.accept_off, bt.accept,
            bt.eps_in_node_off, bt.eps_in_nodes, bt.eps_in_off, bt.eps_in_arc,
            bt.eps_out_node_off, bt.eps_out_nodes, bt.eps_out_off, bt.eps_out_arc,
            bt.lab_off, bt.labels, logz, flag, gEn, need_e, FUSED_TOL, gw_ex, gw_off, need_w,
        )

    _run_chunks(run, p.chunks(get_num_threads()))
    return logz, flag, gE, gw_ex, gw_off, arcs


def viterbi_labels(st) -> list:
    """Frame labels of the best path of each example (numba state, max semiring), or None if none."""
    p, bt = st.problem, st.problem.batch
    En, wn, an = _np(st.E), _np(st.w), _np(st.alpha)
    out = []
    for e in range(p.num_examples):
        labels = np.full(int(p.ex_len[e]), -1, dtype=np.int64)
        ok = _viterbi_backtrack(
            e, p.ex_graph, p.ex_row, p.ex_len, p.alpha_off, En, wn, bt.src, bt.label,
            bt.node_off, bt.in_off, bt.in_arc, bt.accept_off, bt.accept,
            bt.eps_in_node_off, bt.eps_in_nodes, bt.eps_in_off, bt.eps_in_arc, an, labels,
        )
        out.append(labels if ok else None)
    return out
