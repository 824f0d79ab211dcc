"""Numba kernels of the lattice: a DAG whose arcs read any position of a dense tensor (CPU).

A lattice (see :mod:`lightning_gtn.core.lattice`) is an acyclic graph whose nodes are numbered in
a topological order once compiled; arc ``a`` goes from ``src[a]`` to ``dst[a]`` (``src < dst``
after renumbering), carries its own weight ``w[a]`` and reads ``S[b, pos[a]]`` from its example's
row of the flattened scores ``S (B, N)`` (``pos[a] == -1``: reads nothing). For an example ``e``
(lattice ``g``, row ``b``)::

    alpha[n] = logsumexp( 0 if n is a start node,  alpha[src[a]] + w[a] + S[b, pos[a]] for the arcs a into n )
    log Z    = logsumexp over the accept nodes n of alpha[n]
    beta[n]  = logsumexp( 0 if n is an accept node, w[a] + S[b, pos[a]] + beta[dst[a]] for the arcs a out of n )
    d log Z / d S[b, pos[a]] += exp(alpha[src[a]] + w[a] + S[b, pos[a]] + beta[dst[a]] - log Z)

Nodes are visited in index order (forward) and reverse index order (backward), each once: the
work is one exp per arc and one log per node in each direction. In the max semiring
(``use_max``) the forward keeps the best incoming arc of each node, and the "gradient" is the
indicator of the best path (found by backtracking), which is also what Viterbi returns.

Examples are sorted by row; chunks of whole rows run on the engine's bounded thread pool (the
kernels release the GIL), so two threads never add into the same row of the gradient.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

__all__ = ["topological_order", "lattice_pass", "row_chunks"]

NEG_INF = -math.inf


@njit(cache=True, nogil=True)
def topological_order(num_nodes, src, dst):
    """A topological order of the nodes of the arcs ``src -> dst`` (Kahn's algorithm, smallest
    ready id first among equals is not promised); fewer than ``num_nodes`` entries: a cycle."""
    indeg = np.zeros(num_nodes, dtype=np.int64)
    outc = np.zeros(num_nodes + 1, dtype=np.int64)
    for a in range(len(src)):
        indeg[dst[a]] += 1
        outc[src[a] + 1] += 1
    for n in range(num_nodes):
        outc[n + 1] += outc[n]
    fill = outc[:-1].copy()
    adj = np.empty(len(src), dtype=np.int64)
    for a in range(len(src)):
        adj[fill[src[a]]] = dst[a]
        fill[src[a]] += 1
    order = np.empty(num_nodes, dtype=np.int64)
    head = 0
    tail = 0
    for n in range(num_nodes):
        if indeg[n] == 0:
            order[tail] = n
            tail += 1
    while head < tail:
        n = order[head]
        head += 1
        for k in range(outc[n], outc[n + 1]):
            d = adj[k]
            indeg[d] -= 1
            if indeg[d] == 0:
                order[tail] = d
                tail += 1
    return order[:tail]


@njit(cache=True, nogil=True)
def _forward_one(
    e, S, w, ex_graph, ex_row, node_off, in_off, in_arc, src, pos, start, accept, alpha_off, alpha, bp, buf, use_max,
    badpos,
):  # fmt: skip
    """Alphas of example ``e`` (and its back pointers in max); returns its score."""
    g = ex_graph[e]
    b = ex_row[e]
    n0 = node_off[g]
    nn = node_off[g + 1] - n0
    base = alpha_off[e]
    for n in range(nn):
        gn = n0 + n
        if start[gn]:
            m = 0.0
            best = -1  # the path starts here
        else:
            m = NEG_INF
            best = -2  # unreachable
        k0 = in_off[gn]
        k1 = in_off[gn + 1]
        for k in range(k0, k1):
            a = in_arc[k]
            p = pos[a]
            v = alpha[base + src[a]] + w[a]
            if p >= 0:
                x = S[b, p]
                if not x < math.inf and badpos[e] < 0:  # NaN or +inf: reported by the caller
                    badpos[e] = p
                v += x
            buf[k - k0] = v
            if not v <= m:  # NaN-propagating max
                m = v
                best = a
        if use_max:
            alpha[base + n] = m
            bp[base + n] = best
        elif m == NEG_INF:
            alpha[base + n] = NEG_INF
        else:
            s = math.exp(-m) if start[gn] else 0.0
            for k in range(k1 - k0):
                s += math.exp(buf[k] - m)
            alpha[base + n] = m + math.log(s)
    m = NEG_INF
    for n in range(nn):
        if accept[n0 + n]:
            v = alpha[base + n]
            if not v <= m:
                m = v
    if use_max or m == NEG_INF:
        return m
    s = 0.0
    for n in range(nn):
        if accept[n0 + n]:
            s += math.exp(alpha[base + n] - m)
    return m + math.log(s)


@njit(cache=True, nogil=True)
def _backward_one(
    e, S, w, coef, ex_graph, ex_row, node_off, arc_off, out_off, out_arc, dst, pos, accept, alpha_off, alpha, lz,
    beta, buf, grad, gw, gw_off, need_s, need_w,
):  # fmt: skip
    """Adds ``coef * d lz / d S`` into ``grad[row]`` and ``coef * d lz / d w`` into ``gw[gw_off[e]:]``."""
    g = ex_graph[e]
    b = ex_row[e]
    n0 = node_off[g]
    nn = node_off[g + 1] - n0
    base = alpha_off[e]
    a0 = arc_off[g]
    for n in range(nn - 1, -1, -1):
        gn = n0 + n
        m = 0.0 if accept[gn] else NEG_INF
        k0 = out_off[gn]
        k1 = out_off[gn + 1]
        for k in range(k0, k1):
            a = out_arc[k]
            p = pos[a]
            v = w[a] + beta[dst[a]]
            if p >= 0:
                v += S[b, p]
            buf[k - k0] = v
            if not v <= m:
                m = v
        if m == NEG_INF:
            beta[n] = NEG_INF
            continue
        s = math.exp(-m) if accept[gn] else 0.0
        for k in range(k1 - k0):
            s += math.exp(buf[k] - m)
        beta[n] = m + math.log(s)
        an = alpha[base + n] - lz
        if an == NEG_INF:
            continue
        for k in range(k0, k1):
            occ = math.exp(an + buf[k - k0])
            if occ == 0.0:
                continue
            a = out_arc[k]
            p = pos[a]
            if need_s and p >= 0:
                grad[b, p] += coef * occ
            if need_w:
                gw[gw_off[e] + a - a0] += coef * occ


@njit(cache=True, nogil=True)
def _backtrack_one(
    e, coef, ex_graph, ex_row, node_off, arc_off, src, pos, accept, alpha_off, alpha, bp, path, path_len, grad, gw,
    gw_off, need_s, need_w,
):  # fmt: skip
    """Best path of example ``e`` (max semiring): its arcs (local ids, in path order) into
    ``path[alpha_off[e]:]``; adds ``coef`` at the positions and arcs it uses."""
    g = ex_graph[e]
    b = ex_row[e]
    n0 = node_off[g]
    nn = node_off[g + 1] - n0
    base = alpha_off[e]
    a0 = arc_off[g]
    best = -1
    m = NEG_INF
    for n in range(nn):
        if accept[n0 + n]:
            v = alpha[base + n]
            if v > m:
                m = v
                best = n
    path_len[e] = -1
    if best < 0:
        return
    count = 0
    n = best
    while bp[base + n] >= 0 and count < nn:  # an acyclic graph: at most nn - 1 arcs
        a = bp[base + n]
        path[base + count] = a - a0
        count += 1
        p = pos[a]
        if need_s and p >= 0:
            grad[b, p] += coef
        if need_w:
            gw[gw_off[e] + a - a0] += coef
        n = src[a]
    for i in range(count // 2):  # path order: first arc first
        t = path[base + i]
        path[base + i] = path[base + count - 1 - i]
        path[base + count - 1 - i] = t
    path_len[e] = count


@njit(cache=True, nogil=True)
def _chunk(
    e0, e1, S, w, coef, ex_graph, ex_row, node_off, arc_off, in_off, in_arc, out_off, out_arc, src, dst, pos, start,
    accept, alpha_off, alpha, bp, logz, beta, max_deg, grad, gw, gw_off, path, path_len, use_max, need_s, need_w,
    need_path, badpos,
):  # fmt: skip
    buf = np.empty(max(max_deg, 1), dtype=alpha.dtype)
    for e in range(e0, e1):
        lz = _forward_one(
            e, S, w, ex_graph, ex_row, node_off, in_off, in_arc, src, pos, start, accept, alpha_off, alpha, bp, buf,
            use_max, badpos,
        )  # fmt: skip
        if badpos[e] >= 0:
            continue  # the caller raises
        logz[e] = lz
        if use_max:
            if need_s or need_w or need_path:
                _backtrack_one(
                    e, coef[e], ex_graph, ex_row, node_off, arc_off, src, pos, accept, alpha_off, alpha, bp, path,
                    path_len, grad, gw, gw_off, need_s, need_w,
                )  # fmt: skip
        elif (need_s or need_w) and lz > NEG_INF and lz < math.inf and coef[e] != 0.0:
            _backward_one(
                e, S, w, coef[e], ex_graph, ex_row, node_off, arc_off, out_off, out_arc, dst, pos, accept, alpha_off,
                alpha, lz, beta, buf, grad, gw, gw_off, need_s, need_w,
            )  # fmt: skip


def row_chunks(ex_row: np.ndarray, cost: np.ndarray, threads: int):
    """Example ranges ``[e0, e1)`` of similar cost that never split a row (examples sorted by row)."""
    N = len(ex_row)
    if N == 0:
        return []
    total = float(cost.sum())
    if threads <= 1 or N == 1 or total < 100_000:
        return [(0, N)]
    cum = np.cumsum(cost)
    ends = np.nonzero(np.append(ex_row[1:] != ex_row[:-1], True))[0] + 1  # valid cut points
    cuts = [0]
    for i in range(1, threads):
        j = int(np.searchsorted(cum[ends - 1], total * i / threads))
        if j < len(ends) and cuts[-1] < int(ends[j]) < N:
            cuts.append(int(ends[j]))
    cuts.append(N)
    return [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


def lattice_pass(
    S: np.ndarray,
    w: np.ndarray,
    coef: np.ndarray,
    batch,
    ex_graph: np.ndarray,
    ex_row: np.ndarray,
    use_max: bool,
    need_s: bool,
    need_w: bool,
    need_path: bool,
):
    """Scores every example of a lattice batch, with gradients and best paths on request.

    Args:
        S: ``(B, N)`` float32/float64 C-contiguous scores (each example reads its row).
        w: ``(num_arcs,)`` arc weights of ``batch`` (S's dtype).
        coef: ``(E,)`` float64 coefficient of each example's score in the gradients.
        batch: a ``LatticeBatch`` of :mod:`lightning_gtn.core.lattice` (its arrays, range-checked).
        ex_graph, ex_row: ``(E,)`` int64 lattice and row of each example, rows non-decreasing.
        use_max: the max semiring (Viterbi) instead of the log semiring.
        need_s, need_w: also return ``sum_e coef[e] * d score_e / d S`` (``(B, N)``) and the
            per-example arc gradients ``coef[e] * d score_e / d w`` (flat, see ``gw_off``).
        need_path: (max semiring) also return the best paths.

    Returns:
        ``(logz (E,), grad (B, N) or None, gw (sum of arcs,) or None, gw_off (E + 1,), path, path_len,
        badpos)``; ``badpos[e]`` is the first position example ``e`` read a NaN or +inf at (-1: none;
        such an example is not differentiated);
        ``path[alpha_off[e] : alpha_off[e] + path_len[e]]`` are the local arc ids of example
        ``e``'s best path (``path_len[e] == -1``: no path).
    """
    E = len(ex_graph)
    dtype = S.dtype
    nodes = np.diff(batch.node_off)[ex_graph] if E else np.zeros(0, np.int64)
    arcs = np.diff(batch.arc_off)[ex_graph] if E else np.zeros(0, np.int64)
    alpha_off = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(nodes, out=alpha_off[1:])
    alpha = np.empty(int(alpha_off[-1]), dtype=dtype)
    bp = np.empty(int(alpha_off[-1]) if use_max else 0, dtype=np.int64)
    logz = np.empty(E, dtype=dtype)
    grad = np.zeros(S.shape if need_s else (1, 1), dtype=dtype)
    gw_off = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(arcs, out=gw_off[1:])
    gw = np.zeros(int(gw_off[-1]) if need_w else 0, dtype=np.float64)
    want_path = use_max and need_path
    path = np.empty(int(alpha_off[-1]) if use_max else 0, dtype=np.int64)  # the backtrack's scratch too
    path_len = np.full(E, -1, dtype=np.int64)
    badpos = np.full(E, -1, dtype=np.int64)
    chunks = row_chunks(ex_row, arcs + nodes, get_num_threads())

    def run(e0: int, e1: int) -> None:
        beta = np.empty(max(batch.max_nodes, 1), dtype=dtype)
        _chunk(
            e0, e1, S, w, coef, ex_graph, ex_row, batch.node_off, batch.arc_off, batch.in_off, batch.in_arc,
            batch.out_off, batch.out_arc, batch.src, batch.dst, batch.pos, batch.start, batch.accept, alpha_off,
            alpha, bp, logz, beta, batch.max_deg, grad, gw, gw_off, path, path_len, use_max, need_s, need_w,
            want_path, badpos,
        )  # fmt: skip

    if len(chunks) <= 1:
        for c in chunks:
            run(*c)
    else:
        parallel_map(run, [c[0] for c in chunks], [c[1] for c in chunks])
    return (
        logz,
        grad if need_s else None,
        gw if need_w else None,
        gw_off,
        (path, alpha_off) if want_path else None,
        path_len,
        badpos,
    )
