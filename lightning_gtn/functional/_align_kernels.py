"""Batched Viterbi (max-plus) with backpointers over epsilon-free criterion graphs.

For example ``e`` (graph ``g``, emission row ``b``, ``T`` frames)::

    delta_0[n]     = 0 at the start nodes of g, -inf elsewhere
    delta_{t+1}[d] = max over arcs a = (s -> d, label l, weight w) of delta_t[s] + w + E[b, t, l]
    bp[t, d]       = the position, among d's incoming arcs, of the arc reaching that maximum
                     (the first one on ties): one byte per (frame, node) when no node has
                     more than 255 incoming arcs
    score          = max over accept nodes n of delta_T[n] (the smallest node id on ties)

then the backtrack from the best accept node gives the arc of every frame. Two
implementations with the same tie rules:

* :func:`numba_viterbi_arcs` (CPU): one compiled kernel over a chunk of examples, chunks on the
  engine's bounded thread pool; only two rows of ``delta`` per example.
* :func:`torch_viterbi_arcs` (any device): the padded incoming-arc tables of
  :mod:`._torch_impl`, one gather + max per frame for all examples at once (a loop over
  frames, never over examples), then one vectorised backtrack step per frame.

:func:`viterbi_arcs` runs either on groups of examples whose backpointers fit
``BP_BUDGET`` entries, so memory stays bounded by the budget or the largest single example
(``T * nodes`` bytes). Both take a :class:`._dispatch.Problem` whose graphs have no epsilon arcs (the alignment graphs
never do) and whose examples' labels, rows and lengths the caller has checked against ``E``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

NEG_INF = -math.inf

__all__ = ["viterbi_arcs", "numba_viterbi_arcs", "torch_viterbi_arcs", "check_problem", "BP_BUDGET"]

#: backpointer entries (frames x nodes, padded for torch) of one pass over a group of examples
BP_BUDGET = 1 << 27
#: the most backpointer bytes one alignment call may need (frames x graph nodes of every example,
#: one byte each, four past 255 in-arcs); larger inputs are refused before anything is allocated
MAX_BACKPOINTER_BYTES = 1 << 30


@njit(cache=True, nogil=True, inline="always")
def _best_accept(scores, accept, a0, a1):
    """``(score, node)`` of the best accept node among ``accept[a0:a1]``, the smallest id on
    ties; ``(-inf, -1)`` when none is reached."""
    m = NEG_INF
    best = -1
    for k in range(a0, a1):
        n = accept[k]
        v = scores[n]
        if v > m or (v == m and best >= 0 and n < best):
            m = v
            best = n
    return m, best


@njit(cache=True, nogil=True)
def _viterbi_kernel(e0, e1, ex_graph, ex_row, ex_len, bp_off, E, in_w, in_src, in_lab, node_off, in_off,
                    in_arc, start_off, start, accept_off, accept, max_nodes, bp, score, out_arc):
    """``in_w``, ``in_src``, ``in_lab``: weight, source node and label of each incoming-arc
    position (``in_arc[k]``), so the inner loop reads three arrays in order."""
    prev = np.empty(max(max_nodes, 1), dtype=E.dtype)
    cur = np.empty(max(max_nodes, 1), dtype=E.dtype)
    for e in range(e0, e1):
        g = ex_graph[e]
        b = ex_row[e]
        T = ex_len[e]
        n0 = node_off[g]
        S = node_off[g + 1] - n0
        base = bp_off[e]
        for n in range(S):
            prev[n] = NEG_INF
        for k in range(start_off[g], start_off[g + 1]):
            prev[start[k]] = 0.0
        for t in range(T):
            row = base + t * S
            for n in range(S):
                m = NEG_INF
                best = 0
                k0 = in_off[n0 + n]
                for k in range(k0, in_off[n0 + n + 1]):
                    v = prev[in_src[k]] + in_w[k] + E[b, t, in_lab[k]]
                    if v > m:
                        m = v
                        best = k - k0
                cur[n] = m
                bp[row + n] = best  # the position among the node's incoming arcs
            tmp = prev
            prev = cur
            cur = tmp
        m, best = _best_accept(prev, accept, accept_off[g], accept_off[g + 1])
        score[e] = m
        if best < 0:
            continue
        n = best
        for t in range(T - 1, -1, -1):
            k = in_off[n0 + n] + bp[base + t * S + n]
            out_arc[e, t] = in_arc[k]
            n = in_src[k]


@njit(cache=True, nogil=True)
def _ctc_viterbi_kernel(e0, e1, ex_graph, ex_row, ex_len, bp_off, E, node_lab, node_deg, node_off, in_off,
                        in_arc, accept_off, accept, max_nodes, bp, score, out_arc):
    """:func:`_viterbi_kernel` for CTC's graphs (``wfst.criterion.ctc_graph``: weightless arcs,
    node ``n``'s in-arcs are its self-loop, ``n - 1`` and, for ``node_deg[n] == 3``, ``n - 2``,
    in that order, all reading ``node_lab[n]``). The same sums in the same order, so the same
    paths to the bit (ties to the first in-arc), without the per-arc indirection, and only over
    the nodes frame ``t`` can reach (``n <= 2 t + 1``)."""
    prev = np.empty(max(max_nodes, 1), dtype=E.dtype)
    cur = np.empty(max(max_nodes, 1), dtype=E.dtype)
    for e in range(e0, e1):
        g = ex_graph[e]
        b = ex_row[e]
        T = ex_len[e]
        n0 = node_off[g]
        S = node_off[g + 1] - n0
        base = bp_off[e]
        for n in range(S):
            prev[n] = NEG_INF
            cur[n] = NEG_INF
        prev[0] = 0.0
        lab = node_lab[n0:n0 + S]
        deg = node_deg[n0:n0 + S]
        for t in range(T):
            row = base + t * S
            hi = min(S, 2 * t + 2)
            er = E[b, t]
            cur[0] = prev[0] + er[lab[0]]
            bp[row] = 0
            # nodes past hi cannot be reached yet: their scores stay -inf, their backpointers
            # are never read (the backtrack only visits reachable nodes)
            for n in range(1, hi):
                x = er[lab[n]]
                m = prev[n] + x
                best = 0
                v = prev[n - 1] + x
                if v > m:
                    m = v
                    best = 1
                if deg[n] == 3:
                    v = prev[n - 2] + x
                    if v > m:
                        m = v
                        best = 2
                cur[n] = m
                bp[row + n] = best
            tmp = prev
            prev = cur
            cur = tmp
        m, best = _best_accept(prev, accept, accept_off[g], accept_off[g + 1])
        score[e] = m
        if best < 0:
            continue
        n = best
        for t in range(T - 1, -1, -1):
            c = bp[base + t * S + n]
            out_arc[e, t] = in_arc[in_off[n0 + n] + c]
            n = n - c


def _starts_at_zero(batch) -> bool:
    """Every graph's only start node is its node 0."""
    ng = len(batch.node_off) - 1
    return bool(np.array_equal(np.diff(batch.start_off), np.ones(ng, dtype=np.diff(batch.start_off).dtype))
                and np.all(batch.start[:ng] == 0))


def ctc_chain_tables(batch):
    """``(node_lab, node_deg)`` when every graph of ``batch`` has CTC's chain shape (see
    :func:`_ctc_viterbi_kernel`), else None (the general kernel then runs)."""
    n_nodes = int(batch.node_off[-1])
    if batch.has_eps or n_nodes == 0:
        return None
    ng = len(batch.node_off) - 1
    in_off = np.asarray(batch.in_off[: n_nodes + 1], dtype=np.int64)
    deg = np.diff(in_off)
    total = int(in_off[-1])
    node = np.repeat(np.arange(n_nodes), deg)  # the node of each in-arc position
    graph_of_node = np.repeat(np.arange(ng), np.diff(batch.node_off))
    local_node = np.arange(n_nodes) - np.asarray(batch.node_off)[graph_of_node]
    pos = np.arange(total) - in_off[:-1][node]  # position among the node's in-arcs
    src = np.asarray(batch.in_src[:total], dtype=np.int64)  # local source ids
    lab = np.asarray(batch.label)[np.asarray(batch.in_arc[:total])]
    if np.any(deg < 1) or np.any(deg > 3):
        return None
    node_lab = lab[in_off[:-1]]
    if (np.any(src != local_node[node] - pos) or np.any(lab != node_lab[node])
            or np.any((local_node == 0) & (deg != 1)) or np.any((local_node > 0) & (deg < 2))):
        return None
    return np.ascontiguousarray(node_lab), deg.astype(np.int32)


def check_problem(problem, E: torch.Tensor, w: torch.Tensor) -> None:
    """Raises ValueError unless every index the kernels read lies inside ``E`` and ``w``."""
    bt = problem.batch
    B, T, C = E.shape
    if bt.has_eps:
        raise ValueError("alignment graphs must not have epsilon arcs")
    if bt.max_label >= C:
        raise ValueError(f"a graph reads label {bt.max_label} but the emissions have C={C}")
    if w.shape[0] != bt.num_arcs:
        raise ValueError(f"expected {bt.num_arcs} arc weights, got {w.shape[0]}")
    if problem.num_examples:
        if problem.ex_len.min() < 0 or problem.ex_len.max() > T:
            raise ValueError(f"example lengths must lie in [0, T={T}]")
        if problem.ex_row.min() < 0 or problem.ex_row.max() >= B:
            raise ValueError(f"example rows must lie in [0, B={B})")
        cells = problem.ex_len.astype(np.int64) * problem.ex_nodes.astype(np.int64)
        need = int(cells.sum()) * (1 if bt.max_in <= 255 else 4)
        if need > MAX_BACKPOINTER_BYTES:
            e = int(np.argmax(cells))
            raise ValueError(
                f"forced alignment keeps a backpointer per frame and graph node: example {int(problem.ex_row[e])} "
                f"has T={int(problem.ex_len[e])} frames and S={int(problem.ex_nodes[e])} nodes (2 per target token "
                f"plus one with a blank), and the batch needs {need} bytes in all, more than "
                f"MAX_BACKPOINTER_BYTES={MAX_BACKPOINTER_BYTES}; align shorter pieces (split the audio and its "
                "transcript) or raise lightning_gtn.functional._align_kernels.MAX_BACKPOINTER_BYTES"
            )


def numba_viterbi_arcs(problem, E: torch.Tensor, w: torch.Tensor):
    """Best-path arcs on the CPU: ``(arcs (N, T) int64 global arc ids or -1, score (N,))``.

    ``E`` is a contiguous float32/float64 CPU tensor ``(B, T, C)``, ``w`` the ``(num_arcs,)``
    arc weights in its dtype. Examples with no path get score ``-inf`` and arcs -1.
    """
    check_problem(problem, E, w)
    p, bt = problem, problem.batch
    N, T = p.num_examples, E.shape[1]
    En = E.detach().contiguous().numpy()
    wn = np.ascontiguousarray(w.detach().cpu().numpy(), dtype=En.dtype)
    bp_off = np.zeros(N + 1, dtype=np.int64)
    if N:
        np.cumsum(p.ex_len * p.ex_nodes, out=bp_off[1:])
    bp = np.empty(max(int(bp_off[-1]), 1), dtype=np.uint8 if bt.max_in <= 255 else np.int32)
    score = np.full(N, NEG_INF, dtype=En.dtype)
    out = np.full((N, max(T, 1)), -1, dtype=np.int64)

    chain = ctc_chain_tables(bt) if (not np.any(wn) and _starts_at_zero(bt)) else None
    if chain is not None:
        node_lab, node_deg = chain

        def run(e0, e1):
            _ctc_viterbi_kernel(e0, e1, p.ex_graph, p.ex_row, p.ex_len, bp_off, En, node_lab, node_deg,
                                bt.node_off, bt.in_off, bt.in_arc, bt.accept_off, bt.accept, bt.max_nodes, bp,
                                score, out)
    else:
        in_w = np.ascontiguousarray(wn[bt.in_arc])
        in_lab = np.ascontiguousarray(bt.label[bt.in_arc])

        def run(e0, e1):
            _viterbi_kernel(e0, e1, p.ex_graph, p.ex_row, p.ex_len, bp_off, En, in_w, bt.in_src, in_lab,
                            bt.node_off, bt.in_off, bt.in_arc, bt.start_off, bt.start, bt.accept_off,
                            bt.accept, bt.max_nodes, bp, score, out)

    # both cores when torch may use two threads (and the engine's pool allows them)
    chunks = p.chunks(max(1, min(get_num_threads(), torch.get_num_threads())))
    if len(chunks) <= 1:
        for c in chunks:
            run(*c)
    else:
        parallel_map(run, [c[0] for c in chunks], [c[1] for c in chunks])
    return torch.from_numpy(out[:, :T]), torch.from_numpy(score)


class _TableState:
    """What :func:`._torch_impl._build_tables` reads (duck-typed State)."""

    def __init__(self, problem, E):
        self.problem, self.E = problem, E


def torch_viterbi_arcs(problem, E: torch.Tensor, w: torch.Tensor):
    """Best-path arcs on ``E``'s device (see :func:`numba_viterbi_arcs`); results on that device."""
    from ._torch_impl import _build_tables, _gather_nodes

    check_problem(problem, E, w)
    p = problem
    dev, dtype = E.device, E.dtype
    N = p.num_examples
    T = E.shape[1]
    out = torch.full((N, T), -1, dtype=torch.int64, device=dev)
    if N == 0:
        return out, torch.zeros(0, dtype=dtype, device=dev)
    tb = _build_tables(_TableState(p, E))
    ninf = torch.tensor(NEG_INF, dtype=dtype, device=dev)
    wp = torch.cat([w.to(device=dev, dtype=dtype), w.new_zeros(1, dtype=dtype, device=dev)])
    _, S, K = tb.in_src.shape
    w_in = torch.where(tb.in_mask, wp[tb.in_arc], ninf)
    lab = tb.in_lab.reshape(N, S * K)
    Er = E[tb.rows]
    Tm = int(p.ex_len.max(initial=0))
    bp_dtype = torch.uint8 if K <= 255 else torch.int64
    bp = torch.zeros((N, max(Tm, 1), S), dtype=bp_dtype, device=dev)
    delta = torch.where(tb.start, torch.zeros((), dtype=dtype, device=dev), ninf)
    for t in range(Tm):
        em = Er[:, t].gather(1, lab).reshape(N, S, K)
        cand = torch.where(tb.in_mask, _gather_nodes(delta, tb.in_src) + w_in + em, ninf)
        new, arg = cand.max(-1)
        bp[:, t] = arg.to(bp_dtype)
        delta = torch.where((t < tb.lens).unsqueeze(1), new, delta)
    # best accept node, the smallest id on ties (max returns the first maximum)
    score, node = torch.where(tb.accept, delta, ninf).max(-1)
    ok = score > NEG_INF
    in_arc = tb.in_arc.reshape(N, S * K)
    in_src = tb.in_src.reshape(N, S * K)
    for t in range(Tm - 1, -1, -1):
        active = ok & (t < tb.lens)
        k = bp[:, t].gather(1, node.unsqueeze(1)).squeeze(1).long()
        flat = (node * K + k).unsqueeze(1)
        a = in_arc.gather(1, flat).squeeze(1)
        s = in_src.gather(1, flat).squeeze(1)
        out[:, t] = torch.where(active, a, torch.full_like(a, -1))
        node = torch.where(active, s, node)
    return out, score


def _groups(problem, padded: bool):
    """Index arrays of consecutive examples whose backpointers fit :data:`BP_BUDGET`."""
    N = problem.num_examples
    if padded:  # the torch tables pad every example to the group's longest and largest
        size = np.maximum.accumulate(problem.ex_len) * np.maximum.accumulate(problem.ex_nodes) * np.arange(1, N + 1)
    else:
        size = np.cumsum(problem.ex_len * problem.ex_nodes)
    if N == 0 or size[-1] <= BP_BUDGET:
        return None
    groups, start = [], 0
    while start < N:
        ln = problem.ex_len[start:]
        nd = problem.ex_nodes[start:]
        if padded:
            c = np.maximum.accumulate(ln) * np.maximum.accumulate(nd) * np.arange(1, N - start + 1)
        else:
            c = np.cumsum(ln * nd)
        stop = start + max(1, int(np.searchsorted(c, BP_BUDGET, side="right")))
        groups.append(np.arange(start, stop))
        start = stop
    return groups


def viterbi_arcs(problem, E: torch.Tensor, w: torch.Tensor, impl: str):
    """:func:`numba_viterbi_arcs` (``impl="numba"``) or :func:`torch_viterbi_arcs`
    (``"torch"``), over groups of examples within :data:`BP_BUDGET` backpointers."""
    from ._dispatch import Subset

    fn = numba_viterbi_arcs if impl == "numba" else torch_viterbi_arcs
    groups = _groups(problem, impl != "numba")
    if groups is None:
        return fn(problem, E, w)
    outs = [fn(Subset(problem, idx), E, w) for idx in groups]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
