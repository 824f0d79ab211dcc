"""The shared-graph kernel on the CPU: log Z of one epsilon-free graph against every row of a
batch of emissions, with its gradients, in probability space.

LF-MMI's denominator is one graph (thousands of arcs) scored against all ``B`` rows. The
recursion runs over frames with the batch as the innermost, contiguous axis (every state holds
``nb`` values, one per row of a chunk), so each arc costs one vectorised multiply-add over the
chunk's rows. Per frame ``t`` (``alpha`` the state distribution before the frame, summing to 1):

* ``e[c] = exp(E[t, c] - m_t)`` once per frame, ``m_t = max_c E[t, c]``;
* ``u[g] = sum_{arcs a of group g} alpha[src a] * p_a`` for every group ``g`` (the arcs sharing a
  destination ``d_g`` and a label ``l_g``; ``p_a = exp(w_a - shift)``);
* ``alpha'[d] = sum_{groups g into d} e[l_g] * u[g]``; ``s = sum_d alpha'[d]``; ``alpha = alpha' / s``
  and ``log s + m_t`` is added to the row's log-scale (float64), Kaldi's per-frame rescaling;
* leaky HMM, between two frames of a row: ``alpha[d] += leaky * init[d]`` (``sum alpha == 1``, so
  this is Kaldi's ``alpha + leaky * tot_alpha * init``).

``log Z = logscale + log(sum over accept states of alpha) + T * shift``.

The backward walks the frames in reverse with ``beta`` (rescaled by its sum each frame):
``v[g] = e[l_g] * beta[d_g]``; the posterior of group ``g`` at frame ``t`` is
``u[g] v[g] / sum_g u[g] v[g]`` (every path crosses exactly one arc per frame, so each frame's
posteriors sum to one and no scale needs to be tracked); ``beta_prev[s] = sum_{arcs a from s}
p_a v[g_a]`` followed by the leak's transpose ``beta_prev += leaky * (init . beta_prev)``. The
emission gradient of class ``c`` at frame ``t`` is the sum of the posteriors of the groups with
label ``c``; the arc-weight gradient adds ``alpha[src a] p_a v[g_a] / sum_g u v`` per frame.

Memory: the forward keeps ``u`` (``G`` values per row and frame, ``G`` about the number of
states) for the frames of one segment of ``K`` frames and the state distribution at the start of
every segment (a checkpoint every ``K`` frames); the backward recomputes ``u`` segment by segment
from the checkpoints (one more forward pass when ``K < T``). With ``K >= T`` nothing is
recomputed: two arc passes in all (forward, backward).

Rows run in chunks (rows sorted by length, dealt round-robin) on the engine's thread pool
(:func:`lightning_gtn.wfst.parallel.parallel_map`; the kernels release the GIL).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

__all__ = ["shared_scores", "checkpoint_interval", "SEGMENT_BUDGET"]

#: bytes the per-segment buffers of all chunks may take before frames are checkpointed
SEGMENT_BUDGET = 512 << 20


@njit(cache=True, nogil=True)
def _emissions(E, rows, t, nact, e, m, bad):
    """``e[c, b] = exp(E[rows[b], t, c] - m[b])``; ``m[b]`` the row's max; a NaN or ``+inf``
    marks the row bad, a row of ``-inf`` gives zeros (the row dies)."""
    C = E.shape[2]
    for b in range(nact):
        r = rows[b]
        mx = -np.inf
        for c in range(C):
            x = E[r, t, c]
            if x != x or x == np.inf:
                bad[b] = True
            elif x > mx:
                mx = x
        if bad[b] or mx == -np.inf:
            m[b] = 0.0
            for c in range(C):
                e[c, b] = 0.0
        else:
            m[b] = mx
            for c in range(C):
                e[c, b] = math.exp(E[r, t, c] - mx)


@njit(cache=True, nogil=True)
def _frame(
    E, rows, lens, t, nact, alpha, anew, e, m, bad, U, logs, tot, lam, leak, state_off, group_label, fwd_off, fwd_src, p
):
    """One forward frame for the first ``nact`` rows: fills ``U`` (``(G, nb)``, the group sums),
    moves ``alpha`` on by one frame (rescaled, leaked) and adds to ``logs``."""
    S = alpha.shape[0]
    _emissions(E, rows, t, nact, e, m, bad)
    for b in range(nact):
        tot[b] = 0.0
    for d in range(S):
        for b in range(nact):
            anew[d, b] = 0.0
        for g in range(state_off[d], state_off[d + 1]):
            for b in range(nact):
                U[g, b] = 0.0
            for a in range(fwd_off[g], fwd_off[g + 1]):
                s = fwd_src[a]
                pa = p[a]
                for b in range(nact):
                    U[g, b] += alpha[s, b] * pa
            lab = group_label[g]
            for b in range(nact):
                anew[d, b] += e[lab, b] * U[g, b]
        for b in range(nact):
            tot[b] += anew[d, b]
    for b in range(nact):
        if bad[b]:
            logs[b] = np.nan
            tot[b] = 0.0
        elif tot[b] > 0.0:
            logs[b] += m[b] + math.log(tot[b])
            tot[b] = 1.0 / tot[b]
        else:
            logs[b] = -np.inf
            tot[b] = 0.0
    for d in range(S):
        for b in range(nact):
            alpha[d, b] = anew[d, b] * tot[b]
    if lam > 0.0:
        for b in range(nact):
            if t + 1 < lens[b] and tot[b] > 0.0:
                for d in range(S):
                    alpha[d, b] += lam * leak[d]


@njit(cache=True, nogil=True)
def _chunk(
    E,
    rows,
    lens,
    start,
    accept,
    state_off,
    group_dst,
    group_label,
    fwd_off,
    fwd_src,
    p_fwd,
    fwd_arc,
    src_off,
    bwd_group,
    p_bwd,
    leak,
    lam,
    shift,
    K,
    need_e,
    need_w,
    logz,
    gE,
    gW,
):
    """log Z (and gradients) of the rows ``rows`` (sorted by ``lens``, longest first)."""
    nb = rows.shape[0]
    if nb == 0:
        return
    S = state_off.shape[0] - 1
    G = group_dst.shape[0]
    A = fwd_src.shape[0]
    C = E.shape[2]
    Tm = lens[0]
    dt = p_fwd.dtype
    alpha = np.zeros((S, nb), dt)
    anew = np.zeros((S, nb), dt)
    e = np.zeros((C, nb), dt)
    m = np.zeros(nb, np.float64)
    tot = np.zeros(nb, np.float64)
    logs = np.zeros(nb, np.float64)
    bad = np.zeros(nb, np.bool_)
    ns = start.shape[0]
    for b in range(nb):
        if ns == 0:
            logs[b] = -np.inf
        else:
            logs[b] = math.log(ns)
            for i in range(ns):
                alpha[start[i], b] = 1.0 / ns
    nseg = (Tm + K - 1) // K
    KK = min(K, Tm) if Tm > 0 else 1
    ck = np.zeros((max(nseg, 1), S, nb), dt)
    U = np.zeros((KK, G, nb), dt)
    AS = np.zeros((KK if need_w else 1, S if need_w else 1, nb), dt)
    # rows of no frames
    for b in range(nb):
        if lens[b] == 0:
            acc = 0.0
            for i in range(accept.shape[0]):
                acc += alpha[accept[i], b]
            logz[rows[b]] = logs[b] + math.log(acc) if acc > 0.0 else -np.inf
    nact = nb
    for t in range(Tm):
        while nact > 0 and lens[nact - 1] <= t:
            nact -= 1
        if t % K == 0:
            for s in range(S):
                for b in range(nact):
                    ck[t // K, s, b] = alpha[s, b]
        if need_w:
            for s in range(S):
                for b in range(nact):
                    AS[t % K, s, b] = alpha[s, b]
        _frame(
            E,
            rows,
            lens,
            t,
            nact,
            alpha,
            anew,
            e,
            m,
            bad,
            U[t % K],
            logs,
            tot,
            lam,
            leak,
            state_off,
            group_label,
            fwd_off,
            fwd_src,
            p_fwd,
        )
        for b in range(nact):
            if lens[b] == t + 1:
                acc = 0.0
                for i in range(accept.shape[0]):
                    acc += alpha[accept[i], b]
                if logs[b] != logs[b]:
                    logz[rows[b]] = np.nan
                elif acc > 0.0:
                    logz[rows[b]] = logs[b] + math.log(acc) + lens[b] * shift
                else:
                    logz[rows[b]] = -np.inf
    if not (need_e or need_w) or Tm == 0:
        return
    # ---- backward, segment by segment from the last
    ok = np.zeros(nb, np.bool_)
    for b in range(nb):
        ok[b] = np.isfinite(logz[rows[b]])
    beta = np.zeros((S, nb), dt)
    bprev = np.zeros((S, nb), dt)
    v = np.zeros((G, nb), dt)
    z = np.zeros(nb, np.float64)
    gbuf = np.zeros((C, nb), np.float64)
    gacc = np.zeros((A if need_w else 1, nb), np.float64)
    ra = np.zeros((S, nb), dt)
    rlogs = np.zeros(nb, np.float64)
    rbad = np.zeros(nb, np.bool_)
    nact = 0
    for seg in range(nseg - 1, -1, -1):
        t0 = seg * K
        t1 = min(t0 + K, Tm)
        if seg != nseg - 1:  # recompute this segment's group sums from its checkpoint
            n0 = 0
            while n0 < nb and lens[n0] > t0:
                n0 += 1
            for s in range(S):
                for b in range(n0):
                    ra[s, b] = ck[seg, s, b]
            for b in range(nb):
                rbad[b] = False
            for t in range(t0, t1):
                nt = 0
                while nt < nb and lens[nt] > t:
                    nt += 1
                if need_w:
                    for s in range(S):
                        for b in range(nt):
                            AS[t - t0, s, b] = ra[s, b]
                _frame(
                    E,
                    rows,
                    lens,
                    t,
                    nt,
                    ra,
                    anew,
                    e,
                    m,
                    rbad,
                    U[t - t0],
                    rlogs,
                    tot,
                    lam,
                    leak,
                    state_off,
                    group_label,
                    fwd_off,
                    fwd_src,
                    p_fwd,
                )
        for t in range(t1 - 1, t0 - 1, -1):
            while nact < nb and lens[nact] >= t + 1:
                for s in range(S):
                    beta[s, nact] = 0.0
                for i in range(accept.shape[0]):
                    beta[accept[i], nact] = 1.0
                nact += 1
            _emissions(E, rows, t, nact, e, m, rbad)
            Ut = U[t - t0]
            for b in range(nact):
                z[b] = 0.0
            for g in range(G):
                d = group_dst[g]
                lab = group_label[g]
                for b in range(nact):
                    v[g, b] = e[lab, b] * beta[d, b]
                    z[b] += Ut[g, b] * v[g, b]
            for b in range(nact):
                z[b] = 1.0 / z[b] if (z[b] > 0.0 and ok[b]) else 0.0
            if need_e:
                for c in range(C):
                    for b in range(nact):
                        gbuf[c, b] = 0.0
                for g in range(G):
                    lab = group_label[g]
                    for b in range(nact):
                        gbuf[lab, b] += Ut[g, b] * v[g, b] * z[b]
                for b in range(nact):
                    r = rows[b]
                    for c in range(C):
                        gE[r, t, c] = gbuf[c, b]
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
            for s in range(S):
                for b in range(nact):
                    bprev[s, b] = 0.0
                for a in range(src_off[s], src_off[s + 1]):
                    g = bwd_group[a]
                    pa = p_bwd[a]
                    for b in range(nact):
                        bprev[s, b] += pa * v[g, b]
            if lam > 0.0:
                for b in range(nact):
                    q = 0.0
                    for s in range(S):
                        q += leak[s] * bprev[s, b]
                    z[b] = lam * q
                for s in range(S):
                    for b in range(nact):
                        bprev[s, b] += z[b]
            for b in range(nact):
                z[b] = 0.0
            for s in range(S):
                for b in range(nact):
                    z[b] += bprev[s, b]
            for b in range(nact):
                z[b] = 1.0 / z[b] if z[b] > 0.0 else 0.0
            for s in range(S):
                for b in range(nact):
                    beta[s, b] = bprev[s, b] * z[b]
    if need_w:
        for a in range(A):
            arc = fwd_arc[a]
            for b in range(nb):
                gW[rows[b], arc] = gacc[a, b]


def checkpoint_interval(B: int, T: int, S: int, G: int, itemsize: int, need_w: bool) -> int:
    """Frames per segment: all ``T`` (no recompute) when the segment buffers of the batch
    (``B * T * (G + S if need_w)`` values) fit :data:`SEGMENT_BUDGET`, else about
    ``sqrt(T * G / S)`` (balances the segment buffers against the checkpoints)."""
    per = B * max(T, 1) * (G + (S if need_w else 0)) * itemsize
    if per <= SEGMENT_BUDGET:
        return max(T, 1)
    return max(1, min(T, int(math.sqrt(max(T, 1) * max(G, 1) / max(S, 1)))))


def shared_scores(
    graph: Any,
    E: np.ndarray,
    lengths: np.ndarray,
    leaky: float = 0.0,
    need_e: bool = True,
    need_w: bool = False,
    checkpoint: Optional[int] = None,
    threads: Optional[int] = None,
) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """log Z of a compiled shared graph against each row of ``E`` and its gradients.

    Args:
        graph: a compiled shared graph (:class:`lightning_gtn.core.shared_graph.SharedGraph`),
            labels already checked against ``C``.
        E: ``(B, T, C)`` float32 or float64 C-contiguous emissions (log-space scores).
        lengths: ``(B,)`` int64 frames per row, in ``[0, T]`` (checked by the caller).
        leaky: the leaky-HMM coefficient in ``[0, 1)``.
        need_e: also return ``d logZ[b] / d E[b]`` ``(B, T, C)`` in E's dtype.
        need_w: also return ``d logZ[b] / d w`` ``(B, num_arcs)`` float64.
        checkpoint: frames per segment (see :func:`checkpoint_interval`), None for automatic.
        threads: chunks run in parallel (default: the engine's pool size).

    Returns:
        ``(logz (B,) float64, grad_E or None, grad_w or None)``; rows with no path get
        ``-inf`` and zero gradients; rows reading a NaN or ``+inf`` get NaN.
    """
    B, T, C = E.shape
    dt = E.dtype
    S, G, A = graph.num_states, graph.num_groups, graph.num_arcs
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.shape != (B,) or (B and (lens.min() < 0 or lens.max() > T)):
        raise ValueError(f"lengths must be {B} values in [0, {T}]")
    leak = graph.leak_distribution() if leaky > 0.0 else np.zeros(max(S, 1), dtype=np.float64)
    K = int(checkpoint) if checkpoint else checkpoint_interval(B, T, S, G, dt.itemsize, need_w)
    if K < 1:
        raise ValueError(f"checkpoint must be >= 1, got {checkpoint}")
    logz = np.full(B, -np.inf, dtype=np.float64)
    gE = np.zeros((B, T, C) if need_e else (1, 1, 1), dtype=dt)
    gW = np.zeros((B, A) if need_w else (1, 1), dtype=np.float64)
    if B == 0:
        return logz, (gE if need_e else None), (gW if need_w else None)
    p_fwd = graph.fwd_prob.astype(dt)
    p_bwd = graph.bwd_prob.astype(dt)
    order = np.argsort(-lens, kind="stable")
    n = max(1, min(threads or get_num_threads(), B))
    chunks = [np.ascontiguousarray(order[i::n]) for i in range(n)]

    def run(rows: np.ndarray) -> None:
        _chunk(
            E,
            rows,
            np.ascontiguousarray(lens[rows]),
            graph.start,
            graph.accept,
            graph.state_off,
            graph.group_dst,
            graph.group_label,
            graph.group_off,
            graph.fwd_src,
            p_fwd,
            graph.fwd_arc,
            graph.src_off,
            graph.bwd_group,
            p_bwd,
            leak,
            float(leaky),
            float(graph.shift),
            K,
            bool(need_e),
            bool(need_w),
            logz,
            gE,
            gW,
        )

    if n == 1:
        run(chunks[0])
    else:
        parallel_map(run, chunks)
    return logz, (gE if need_e else None), (gW if need_w else None)
