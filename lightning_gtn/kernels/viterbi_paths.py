"""Batched Viterbi (max-plus) with backpointers over epsilon-free criterion graphs.

For example ``e`` (graph ``g``, emission row ``b``, ``T`` frames)::

    delta_0[n]     = 0 at the start nodes of g, -inf elsewhere
    delta_{t+1}[d] = max over arcs a = (s -> d, label l, weight w) of delta_t[s] + w + E[b, t, l]
    bp[t, d]       = the position, among d's incoming arcs, of the arc reaching that maximum
                     (the first one on ties): one byte per (frame, node) when no node has
                     more than 255 incoming arcs
    score          = max over accept nodes n of delta_T[n] (the smallest node id on ties)

then the backtrack from the best accept node gives the arc of every frame. Implementations:

* :func:`ctc_states` (CPU, CTC without star or transitions): no graph at all, the
  torchaudio-compatible recursion over the ``2 L + 1`` nodes of the target, only inside the
  feasible band (node ``s`` after ``t`` frames must be reachable in ``t`` frames and still
  reach the end in ``T - t``), examples dealt to ``torch.get_num_threads()`` threads.
* :func:`numba_viterbi_arcs` (CPU, any epsilon-free graph): one compiled kernel, examples
  dealt to the same threads.
* :func:`torch_viterbi_arcs` (any device): the padded incoming-arc tables of
  :mod:`.graph_torch`, one gather + max per frame for all examples at once (a loop over
  frames, never over examples), then one vectorised backtrack step per frame; groups of
  examples whose backpointers fit ``BP_BUDGET`` entries (:func:`viterbi_arcs`).

Memory on the CPU is bounded per example, whatever ``T`` and ``S``: its backpointers
(``T * S`` bytes) when they fit ``BP_BUDGET``, else those of a chunk of ``K`` frames at a
time, recomputed from scores checkpointed every ``K`` frames (``K`` about
``max(BP_BUDGET / S, sqrt(T * itemsize))``; twice the compute). What remains is capped by
:data:`MAX_ALIGN_BYTES` with an error naming ``T``, ``S`` and the bytes; the torch path is
capped the same way (it has no checkpoints). Both kernels take a :class:`.compiled_graphs.Problem`
whose graphs have no epsilon arcs (the alignment graphs never do) and whose examples' labels,
rows and lengths the caller has checked against ``E``.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Callable, Optional

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

NEG_INF = -math.inf

__all__ = [
    "viterbi_arcs",
    "numba_viterbi_arcs",
    "torch_viterbi_arcs",
    "ctc_states",
    "check_problem",
    "check_path_inputs",
    "feasible_band",
    "kernel_chunk_frames",
    "run_dealt",
    "frame_progress",
    "report_frames",
    "BP_BUDGET",
    "MAX_ALIGN_BYTES",
]

#: backpointer entries (frames x nodes) one example holds at once on the CPU (more: checkpointed
#: chunks), and of one pass over a group of examples with torch (padded)
BP_BUDGET = 1 << 27


@njit(cache=True, nogil=True)
def _viterbi_frames(E, b, n0, S, in_w, in_src, in_lab, in_off, t0, t1, prev, cur, bp, store):
    """Frames ``t0 .. t1 - 1`` of one example from ``prev`` (scores after ``t0`` frames);
    returns ``(scores after t1 frames, the other buffer)``; backpointers in ``bp[t - t0]``."""
    for t in range(t0, t1):
        row = t - t0
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
            if store:
                bp[row, n] = best  # the position among the node's incoming arcs
        tmp = prev
        prev = cur
        cur = tmp
    return prev, cur


@njit(cache=True, nogil=True)
def _viterbi_kernel(
    e0,
    e1,
    stride,
    ex_graph,
    ex_row,
    ex_len,
    E,
    in_w,
    in_src,
    in_lab,
    node_off,
    in_off,
    in_arc,
    start_off,
    start,
    accept_off,
    accept,
    cells,
    bp_proto,
    score,
    out_arc,
):
    """Examples ``e0, e0 + stride, ... < e1``. ``in_w``, ``in_src``, ``in_lab``: weight,
    source node and label of each incoming-arc position (``in_arc[k]``), so the inner loop
    reads three arrays in order. Each example holds its own buffers: the backpointers of all
    its frames when ``T * S <= cells``, else of one chunk of frames at a time, recomputed
    from checkpointed scores (``bp_proto`` gives their dtype)."""
    isz = E.itemsize
    for e in range(e0, e1, stride):
        g = ex_graph[e]
        b = ex_row[e]
        T = ex_len[e]
        n0 = node_off[g]
        S = node_off[g + 1] - n0
        if T * S <= cells:
            K = max(T, 1)
        else:
            K = min(T, max(1, cells // max(S, 1), int(np.sqrt(T * isz)) + 1))
        nck = (T + K - 1) // K if T > 0 else 1
        prev = np.full(max(S, 1), NEG_INF, dtype=E.dtype)
        cur = np.full(max(S, 1), NEG_INF, dtype=E.dtype)
        bp = np.empty((K, max(S, 1)), dtype=bp_proto.dtype)
        ck = np.empty((nck if nck > 1 else 0, max(S, 1)), dtype=E.dtype)
        for k in range(start_off[g], start_off[g + 1]):
            prev[start[k]] = 0.0
        if nck > 1:
            for c in range(nck):
                ck[c, :] = prev
                prev, cur = _viterbi_frames(
                    E, b, n0, S, in_w, in_src, in_lab, in_off, c * K, min(T, (c + 1) * K), prev, cur, bp, False
                )
        else:
            prev, cur = _viterbi_frames(E, b, n0, S, in_w, in_src, in_lab, in_off, 0, T, prev, cur, bp, True)
        m = NEG_INF
        best = -1
        for k in range(accept_off[g], accept_off[g + 1]):
            n = accept[k]
            v = prev[n]
            if v > m or (v == m and best >= 0 and n < best):
                m = v
                best = n
        score[e] = m
        if best < 0:
            continue
        n = best
        for c in range(nck - 1, -1, -1):
            t0 = c * K
            t1 = min(T, t0 + K)
            if nck > 1:
                prev[:] = ck[c]
                _viterbi_frames(E, b, n0, S, in_w, in_src, in_lab, in_off, t0, t1, prev, cur, bp, True)
            for t in range(t1 - 1, t0 - 1, -1):
                k = in_off[n0 + n] + bp[t - t0, n]
                out_arc[e, t] = in_arc[k]
                n = in_src[k]


def check_problem(problem, E: torch.Tensor, w: torch.Tensor) -> None:
    """Raises ValueError unless every index the kernels read lies inside ``E`` and ``w``."""
    if problem.batch.has_eps:
        raise ValueError("alignment graphs must not have epsilon arcs")
    problem.check(E, w)


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
    for e in range(N):
        check_search_bytes(int(p.ex_len[e]), int(p.ex_nodes[e]), En.itemsize, f"example {int(p.ex_row[e])}: ")
    bp_proto = np.zeros(0, dtype=np.uint8 if bt.max_in <= 255 else np.int32)
    score = np.full(N, NEG_INF, dtype=En.dtype)
    out = np.full((N, max(T, 1)), -1, dtype=np.int64)

    in_w = np.ascontiguousarray(wn[bt.in_arc])
    in_lab = np.ascontiguousarray(bt.label[bt.in_arc])

    def run(j, k):
        _viterbi_kernel(
            j,
            N,
            k,
            p.ex_graph,
            p.ex_row,
            p.ex_len,
            En,
            in_w,
            bt.in_src,
            in_lab,
            bt.node_off,
            bt.in_off,
            bt.in_arc,
            bt.start_off,
            bt.start,
            bt.accept_off,
            bt.accept,
            BP_BUDGET,
            bp_proto,
            score,
            out,
        )

    k = min(num_threads(), N) if len(p.chunks(2)) > 1 else 1
    if k <= 1:
        run(0, 1)
    else:
        parallel_map(run, list(range(k)), [k])
    return torch.from_numpy(out[:, :T]), torch.from_numpy(score)


class _TableState:
    """What :func:`.graph_torch.build_tables` reads (duck-typed State)."""

    def __init__(self, problem, E):
        self.problem, self.E = problem, E


def torch_viterbi_arcs(problem, E: torch.Tensor, w: torch.Tensor):
    """Best-path arcs on ``E``'s device (see :func:`numba_viterbi_arcs`); results on that device."""
    from .graph_torch import _gather_nodes, build_tables

    check_problem(problem, E, w)
    p = problem
    dev, dtype = E.device, E.dtype
    N = p.num_examples
    T = E.shape[1]
    out = torch.full((N, T), -1, dtype=torch.int64, device=dev)
    if N == 0:
        return out, torch.zeros(0, dtype=dtype, device=dev)
    tb = build_tables(_TableState(p, E))
    ninf = torch.tensor(NEG_INF, dtype=dtype, device=dev)
    wp = torch.cat([w.to(device=dev, dtype=dtype), w.new_zeros(1, dtype=dtype, device=dev)])
    _, S, K = tb.in_src.shape
    w_in = torch.where(tb.in_mask, wp[tb.in_arc], ninf)
    lab = tb.in_lab.reshape(N, S * K)
    Er = E[tb.rows]
    Tm = int(p.ex_len.max(initial=0))
    bp_dtype = torch.uint8 if K <= 255 else torch.int64
    need = N * Tm * S * (1 if K <= 255 else 8)
    if need > MAX_ALIGN_BYTES:
        raise ValueError(
            f"forced alignment (impl='torch') of T={Tm} frames against a graph of S={S} nodes needs "
            f"{need} bytes, more than the limit of {MAX_ALIGN_BYTES} (backpointers) "
            f"(lightning_gtn.kernels.viterbi_paths.MAX_ALIGN_BYTES); split the utterance or "
            f"use impl='numba' on the CPU (checkpointed)"
        )
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
    from .compiled_graphs import Subset

    if impl == "numba":  # each example holds its own (checkpointed) buffers
        return numba_viterbi_arcs(problem, E, w)
    fn = torch_viterbi_arcs
    groups = _groups(problem, True)
    if groups is None:
        return fn(problem, E, w)
    outs = [fn(Subset(problem, idx), E, w) for idx in groups]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


# ---------------------------------------------------------------------------
# Memory: per-example buffers, checkpointed when the backpointers do not fit
# ---------------------------------------------------------------------------

#: bytes one example's search may hold (backpointers plus checkpointed scores); more raises
#: a ValueError naming T, S and the bytes. The default, 2 GiB, is reached only by inputs like
#: 100k tokens against 2M frames: below it the checkpointed search always fits.
MAX_ALIGN_BYTES = 1 << 31


def chunk_frames(T: int, S: int, itemsize: int, cells: int) -> int:
    """Frames per backpointer chunk for one example of ``T`` frames and ``S`` nodes: all ``T``
    when ``T * S <= cells`` (one pass), else at least ``sqrt(T * itemsize)`` (which about
    minimises the chunk's ``K * S`` bytes plus the checkpoints' ``ceil(T / K) * S * itemsize``)
    and ``cells // S``."""
    if T * S <= cells:
        return max(T, 1)
    return int(min(T, max(1, cells // max(S, 1), math.isqrt(T * itemsize) + 1)))


def search_bytes(T: int, S: int, itemsize: int, cells: int, bp_row: Optional[int] = None) -> int:
    """Bytes of one example's search: ``K * bp_row`` backpointer bytes of a chunk (``bp_row``:
    bytes per frame, default one per node), the ``ceil(T / K)`` checkpointed score rows of ``S``
    entries when ``K < T``, two score rows."""
    row = S if bp_row is None else bp_row
    K = chunk_frames(T, row, itemsize, cells)
    n = -(-T // K) if T else 1
    return K * row + (n * S * itemsize if n > 1 else 0) + 2 * S * itemsize


def check_search_bytes(T: int, S: int, itemsize: int, what: str = "", *, bp_row: Optional[int] = None) -> None:
    """Raises ValueError when one example needs more than :data:`MAX_ALIGN_BYTES`."""
    need = search_bytes(T, S, itemsize, BP_BUDGET, bp_row)
    if need > MAX_ALIGN_BYTES:
        raise ValueError(
            f"forced alignment of {what}T={T} frames against a graph of S={S} nodes needs "
            f"{need} bytes, more than the limit of {MAX_ALIGN_BYTES} "
            f"(lightning_gtn.kernels.viterbi_paths.MAX_ALIGN_BYTES); split the utterance"
        )


# ---------------------------------------------------------------------------
# CTC without a graph: the torchaudio-compatible kernel
# ---------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _ctc_frames(E, b, lab, skip_add, band_a, band_z, t0, t1, prev, cur, em, bp, store):
    """Frames ``t0 .. t1 - 1`` of one example from ``prev`` (the scores after ``t0`` frames,
    node ``s`` at ``prev[s + 2]``: two leading ``-inf`` so that ``s - 1`` and ``s - 2`` need no
    test); returns the buffers ``(scores after t1 frames, the other)``. Only the feasible band
    ``band_a[t] .. band_z[t]`` of the scores after ``t + 1`` frames is computed (see
    :func:`feasible_band`). Branch-free selects in the inner loop (the comparisons of random
    scores are not predictable)."""
    ninf = -np.inf
    for t in range(t0, t1):
        a = band_a[t]
        z = band_z[t]
        cur[a] = ninf  # nodes a - 2 and a - 1: outside the band from now on
        cur[a + 1] = ninf
        # views from node a, indexed by j = s - a >= 0 (a start read from an array would make
        # numba test every index for wraparound, and the loops would not vectorise)
        n = z + 1 - a
        Et = E[b, t]
        lb = lab[a : a + n]
        ev = em[:n]
        for j in range(n):
            ev[j] = Et[lb[j]]
        p0 = prev[a + 2 : a + 2 + n]
        p1 = prev[a + 1 : a + 1 + n]
        p2 = prev[a : a + n]
        sk = skip_add[a : a + n]
        cv = cur[a + 2 : a + 2 + n]
        # torchaudio's order: stay, then from s - 1, then the skip from s - 2 (skip_add is
        # -inf where CTC has no skip); the first strictly larger predecessor wins, compared
        # before the frame's score is added. Two copies of the loop: without the test of
        # ``store`` inside, each compiles to selects.
        if store:
            brow = bp[t - t0, a : a + n]
            for j in range(n):
                x0 = p0[j]
                x1 = p1[j]
                x2 = p2[j] + sk[j]
                m = max(x0, x1)
                c2 = x2 > m
                cv[j] = max(m, x2) + ev[j]
                brow[j] = np.uint8(2) if c2 else (np.uint8(1) if x1 > x0 else np.uint8(0))
        else:
            for j in range(n):
                cv[j] = max(max(p0[j], p1[j]), p2[j] + sk[j]) + ev[j]
        tmp = prev
        prev = cur
        cur = tmp
    return prev, cur


@njit(cache=True, nogil=True)
def feasible_band(lo, hi, T, band_a, band_z):
    """The feasible nodes after ``t + 1`` frames, ``band_a[t] .. band_z[t]``: node ``s`` needs
    ``lo[s] <= t + 1`` (reachable) and ``hi[s] <= T - t - 1`` (it can still reach an accept
    node). ``lo`` and ``hi`` are monotone in ``s``, so both ends only move up. (Kept out of the
    frame loop: there the two while loops stop LLVM from vectorising the inner loops.)"""
    S = lo.shape[0]
    a = 0
    z = -1
    for t in range(T):
        while a < S and hi[a] > T - t - 1:
            a += 1
        while z + 1 < S and lo[z + 1] <= t + 1:
            z += 1
        band_a[t] = a
        band_z[t] = z


@njit(cache=True, nogil=True)
def _ctc_kernel(order, i0, stride, E, targets, tlen, ilen, blank, cells, states, score, progress):
    """Examples ``order[i0::stride]``: ``states[b, t]`` the node (``0 .. 2L``) after frame
    ``t`` on the best path, ``score[b]`` its score (``-inf`` and states -1 when none);
    ``progress[i0]`` counts the frames done (both passes)."""
    ninf = -np.inf
    isz = E.itemsize
    for i in range(i0, order.shape[0], stride):
        b = order[i]
        L = tlen[b]
        T = ilen[b]
        S = 2 * L + 1
        lab = np.empty(S, dtype=np.int64)
        skip = np.zeros(S, dtype=np.bool_)
        skip_add = np.full(S, ninf, dtype=E.dtype)
        for s in range(S):
            if s % 2 == 0:
                lab[s] = blank
            else:
                lab[s] = targets[b, (s - 1) // 2]
                skip[s] = s > 1 and lab[s] != targets[b, (s - 1) // 2 - 1]
                if skip[s]:
                    skip_add[s] = 0.0
        lo = np.empty(S, dtype=np.int64)  # fewest frames from the start to s
        hi = np.empty(S, dtype=np.int64)  # fewest frames from s to an accept node
        lo[0] = 0
        for s in range(1, S):
            m = lo[s - 1]
            if skip[s] and lo[s - 2] < m:
                m = lo[s - 2]
            lo[s] = m + 1
        hi[S - 1] = 0
        if S >= 2:
            hi[S - 2] = 0
        for s in range(S - 3, -1, -1):
            m = hi[s + 1]
            if skip[s + 2] and hi[s + 2] < m:
                m = hi[s + 2]
            hi[s] = m + 1
        score[b] = ninf
        if hi[0] > T:
            continue
        K = kernel_chunk_frames(T, S, isz, cells)
        n = (T + K - 1) // K if T > 0 else 1
        band_a = np.empty(T, dtype=np.int64)
        band_z = np.empty(T, dtype=np.int64)
        feasible_band(lo, hi, T, band_a, band_z)
        prev = np.full(S + 2, ninf, dtype=E.dtype)
        cur = np.full(S + 2, ninf, dtype=E.dtype)
        em = np.empty(S, dtype=E.dtype)
        prev[2] = 0.0
        bp = np.empty((K, S), dtype=np.uint8)
        ck = np.empty((n if n > 1 else 0, S + 2), dtype=E.dtype)
        if n > 1:
            for c in range(n):
                ck[c, :] = prev
                prev, cur = _ctc_frames(
                    E, b, lab, skip_add, band_a, band_z, c * K, min(T, (c + 1) * K), prev, cur, em, bp, False
                )
                progress[i0] += min(T, (c + 1) * K) - c * K
        else:
            prev, cur = _ctc_frames(E, b, lab, skip_add, band_a, band_z, 0, T, prev, cur, em, bp, True)
            progress[i0] += T
        node = S - 1
        if S >= 2 and not prev[S + 1] > prev[S]:
            node = S - 2
        best = prev[node + 2]
        if best == ninf:
            continue
        score[b] = best
        for c in range(n - 1, -1, -1):
            t0 = c * K
            t1 = min(T, t0 + K)
            if n > 1:
                prev[:] = ck[c]
                cur[:] = ninf
                _ctc_frames(E, b, lab, skip_add, band_a, band_z, t0, t1, prev, cur, em, bp, True)
                progress[i0] += t1 - t0
            for t in range(t1 - 1, t0 - 1, -1):
                states[b, t] = node
                node -= bp[t - t0, node]


def num_threads() -> int:
    """Threads of the CPU kernels: torch's ``get_num_threads()``, at most the engine's pool."""
    return max(1, min(torch.get_num_threads(), get_num_threads()))


def ctc_states(E: torch.Tensor, targets: np.ndarray, target_lengths: np.ndarray, input_lengths: np.ndarray, blank: int):
    """CTC's best paths on the CPU without graphs: ``(states (B, T) int64, score (B,))``.

    ``states[b, t]`` is the node of CTC's graph (``2 l + 1`` token ``l``, even nodes the blank)
    after frame ``t``, -1 past the length and for an example with no path (score ``-inf``).
    The same paths as :func:`numba_viterbi_arcs` on :func:`lightning_gtn.wfst.criterion.ctc_graph`
    and as torchaudio's ``forced_align`` (its comparisons and tie rules: stay, then the
    previous node, then the skip, each only when strictly better; the last token over the
    final blank unless the blank is strictly better). ``E`` is a contiguous float CPU tensor
    ``(B, T, C)``, ``targets`` int64 ``(B, S)`` checked by the caller (labels in ``[0, C)``, never
    ``blank``), lengths within ``T`` and ``S``. Examples run interleaved on :func:`num_threads`
    threads; each holds at most :func:`search_bytes` (checked against :data:`MAX_ALIGN_BYTES`).
    """
    B, T, C = E.shape[0], E.shape[1], E.shape[2]
    En = E.detach().contiguous().numpy()
    tg, tl, il = check_path_inputs(B, T, C, targets, target_lengths, input_lengths, blank)
    for b in range(B):
        check_search_bytes(int(il[b]), 2 * int(tl[b]) + 1, En.itemsize, f"example {b}: ")
    states = np.full((B, max(T, 1)), -1, dtype=np.int64)
    score = np.full(B, NEG_INF, dtype=En.dtype)
    cells = BP_BUDGET

    def kernel(order, j, k, progress):
        _ctc_kernel(order, j, k, En, tg, tl, il, blank, cells, states, score, progress)

    run_dealt(kernel, il, 2 * tl + 1, En.itemsize, cells)
    return torch.from_numpy(states[:, :T]), torch.from_numpy(score)


def check_path_inputs(B, T, C, targets, target_lengths, input_lengths, blank, allow_no_blank=False):
    """``(targets (B, S), target_lengths (B,), input_lengths (B,))`` as contiguous int64 arrays,
    checked for the graph-free kernels (they index with all of these: the last check before
    them, whoever called); ``blank`` in ``[0, C)``, or -1 with ``allow_no_blank``."""
    tg = np.ascontiguousarray(targets, dtype=np.int64).reshape(B, -1)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64)
    if not (0 <= blank < C or (allow_no_blank and blank == -1)):
        raise ValueError(f"blank={blank} must lie in [0, C={C})" + (" or be -1 (none)" if allow_no_blank else ""))
    if tl.shape != (B,) or il.shape != (B,) or (B and (tl.min() < 0 or tl.max() > tg.shape[1])):
        raise ValueError(f"target_lengths must be (B,) = ({B},) within [0, S={tg.shape[1]}]")
    if B and (il.min() < 0 or il.max() > T):
        raise ValueError(f"input_lengths must be (B,) = ({B},) within [0, T={T}]")
    if tg.size and (tg.min() < 0 or tg.max() >= C):
        raise ValueError(f"targets must lie in [0, C={C})")
    return tg, tl, il


@njit(cache=True, nogil=True)
def kernel_chunk_frames(T, row, isz, cells):
    """:func:`chunk_frames` inside the kernels (``row``: backpointer bytes per frame)."""
    if T * row <= cells:
        return max(T, 1)
    return min(T, max(1, cells // max(row, 1), int(np.sqrt(T * isz)) + 1))


def run_dealt(kernel, input_lengths: np.ndarray, bp_rows: np.ndarray, itemsize: int, cells: int) -> None:
    """Runs ``kernel(order, j, k, progress)`` for ``j < k``: the examples sorted by work
    (frames times backpointer bytes per frame, largest first) and dealt round-robin to
    ``k <= num_threads()`` threads (one for small batches); thread ``j`` adds the frames it has
    done (each pass) to ``progress[j]``. Inside :func:`frame_progress` the hook hears of the
    frames done while the kernel runs."""
    work = input_lengths * bp_rows
    B = len(work)
    order = np.argsort(-work, kind="stable")
    k = min(num_threads(), B) if int(work.sum()) >= 20_000 else 1
    progress = np.zeros(max(k, 1), dtype=np.int64)

    def go():
        if k <= 1:
            kernel(order, 0, 1, progress)
        else:
            parallel_map(lambda j: kernel(order, j, k, progress), range(k))

    hook = _PROGRESS[-1] if _PROGRESS else None
    if hook is None:
        go()
        return
    # frames done = the frames of the call times the share of the passes done
    passes = [1 if chunk_frames(int(t), int(r), itemsize, cells) >= t else 2 for t, r in zip(input_lengths, bp_rows)]
    steps = int(np.dot(input_lengths, passes)) if B else 0
    _run_reporting(go, progress, steps, int(input_lengths.sum()), hook)


# ---------------------------------------------------------------------------
# Progress of long searches
# ---------------------------------------------------------------------------

#: the hooks of the open :func:`frame_progress` contexts (the innermost is called)
_PROGRESS: list = []
#: seconds between two reports while a kernel runs
PROGRESS_INTERVAL = 0.2


@contextlib.contextmanager
def frame_progress(hook: Callable[[int], None]):
    """Within the context, alignment searches call ``hook(n)`` with the number of frames
    newly aligned: every :data:`PROGRESS_INTERVAL` seconds while a graph-free kernel runs (the
    kernel runs on another thread; ``hook`` is called on the caller's), and once per search
    elsewhere. Over a search the ``n`` sum to its input frames."""
    _PROGRESS.append(hook)
    try:
        yield
    finally:
        _PROGRESS.remove(hook)


def report_frames(n: int) -> None:
    """Tells the innermost :func:`frame_progress` hook (if any) that ``n`` frames are done."""
    if _PROGRESS and n > 0:
        _PROGRESS[-1](int(n))


def _run_reporting(go, progress: np.ndarray, steps: int, frames: int, hook) -> None:
    errors: list = []

    def target():
        try:
            go()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(e)

    th = threading.Thread(target=target, name="lightning-gtn-align", daemon=True)
    th.start()
    done = 0
    while th.is_alive():
        th.join(PROGRESS_INTERVAL)
        now = min(frames, frames * int(progress.sum()) // max(steps, 1))
        if now > done:
            hook(now - done)
            done = now
    if errors:
        raise errors[0]
    if frames > done:
        hook(frames - done)
