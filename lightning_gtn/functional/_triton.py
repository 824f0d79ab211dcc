"""The forward-backward dynamic programme as Triton kernels (CUDA tensors, epsilon-free graphs).

The torch implementation in :mod:`._dense` launches a handful of kernels per frame, so on a GPU
a 1000-frame batch costs tens of thousands of launches. Here one program per example walks all
its frames inside a single kernel: the frame's node vector ``(S,)`` is spread over the program's
threads, the previous frame is read back from global memory through the arc tables (a gather),
and a block barrier separates the frames. Examples run side by side, one per streaming
multiprocessor at a time.

Tables are per graph, not per example (``(G, S, K)``: ``K`` incoming or outgoing arcs per node,
padded with -1), so a graph shared by every example (ASG's transition graph) is stored once.
Nodes with more than ``BLOCK_K`` arcs are read in chunks with an online logsumexp.

Gradients: the backward pass computes ``beta`` frame by frame in the same way. When every
emitting arc into a node carries the same label (CTC, ASG, the sequence criterion), the emission
gradient of a frame is the node posteriors ``exp(alpha + beta - log Z)`` added at the nodes'
labels (one atomic add per node and frame); otherwise each arc's occupancy is added at its own
label. Arc-weight gradients are summed per example and table entry, then gathered per arc.
Float atomics make the emission gradient's last bits depend on the order of additions, as with
torch's own CUDA ``ctc_loss``.

Graphs with epsilon arcs, or with more than ``MAX_NODES`` nodes, are scored by the torch
implementation instead.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs do not need it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

__all__ = ["available", "supports", "Tables", "build_tables", "forward", "backward"]

MAX_TILE = 4096  # node x arc entries one program holds per step
MAX_NODES = 4096  # one program holds a graph's whole node vector: larger graphs go to torch


def available() -> bool:
    """True when Triton is importable (it needs a CUDA device to run, or TRITON_INTERPRET=1)."""
    return triton is not None


def supports(batch) -> bool:
    """Whether these kernels can score a :class:`~._graphs.GraphBatch`: no epsilon arcs, and at
    most ``MAX_NODES`` nodes per graph (a CTC target of up to 2047 tokens)."""
    return available() and not batch.has_eps and batch.max_nodes <= MAX_NODES


class Tables:
    """Per-graph padded arc tables on a device (see :func:`build_tables`)."""

    __slots__ = ("S", "K_in", "K_out", "in_src", "in_lab", "in_arc", "out_dst", "out_lab", "out_arc",
                 "start", "accept", "node_lab", "ex_graph", "ex_row", "ex_len")


def _padded(off: np.ndarray, entries: np.ndarray, gnode: np.ndarray, K: int) -> np.ndarray:
    """``(G, S, K)`` table of ``entries`` grouped by global node (CSR ``off``), -1 padded."""
    n = len(off) - 1
    cnt = np.diff(off)
    tab = np.full((n + 1, max(K, 1)), -1, dtype=np.int64)
    if len(entries):
        pos = np.arange(len(entries)) - np.repeat(off[:-1], cnt)
        tab[np.repeat(np.arange(n), cnt), pos] = entries
    return tab[gnode]


def build_tables(problem, device: torch.device) -> Tables:
    """Arc tables of ``problem``'s graphs and its example arrays, as int32 tensors on ``device``."""
    bt = problem.batch
    G = len(bt.graphs)
    N = int(bt.node_off[-1])
    S = max(int(bt.max_nodes), 1)
    loc = np.arange(S)
    sizes = np.diff(bt.node_off)
    gnode = np.where(loc[None, :] < sizes[:, None], bt.node_off[:-1, None] + loc[None, :], N)  # (G, S)
    in_tab = _padded(bt.in_off, bt.in_arc.astype(np.int64), gnode, bt.max_in)
    out_tab = _padded(bt.out_off, bt.out_arc.astype(np.int64), gnode, bt.max_out)
    src = np.append(bt.src, 0).astype(np.int64)
    dst = np.append(bt.dst, 0).astype(np.int64)
    lab = np.append(bt.label, 0).astype(np.int64)
    t = Tables()
    t.S, t.K_in, t.K_out = S, in_tab.shape[2], out_tab.shape[2]

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)

    t.in_arc = dev(in_tab)
    t.in_src = dev(np.where(in_tab >= 0, src[in_tab], -1))
    t.in_lab = dev(np.where(in_tab >= 0, lab[in_tab], 0))
    t.out_arc = dev(out_tab)
    t.out_dst = dev(np.where(out_tab >= 0, dst[out_tab], -1))
    t.out_lab = dev(np.where(out_tab >= 0, lab[out_tab], 0))
    start = np.zeros(N + 1, dtype=np.int32)
    accept = np.zeros(N + 1, dtype=np.int32)
    start[bt.node_off[np.repeat(np.arange(G), np.diff(bt.start_off))] + bt.start] = 1
    accept[bt.node_off[np.repeat(np.arange(G), np.diff(bt.accept_off))] + bt.accept] = 1
    t.start, t.accept = dev(start[gnode]), dev(accept[gnode])
    # the label shared by all emitting arcs into a node, -1 where they differ or there are none
    in_lab = np.where(in_tab >= 0, lab[in_tab], -1)
    lo = np.where(in_tab >= 0, in_lab, np.iinfo(np.int64).max).min(-1)
    hi = in_lab.max(-1)
    t.node_lab = None if bool(((lo != hi) & (hi >= 0)).any()) else dev(hi)
    t.ex_graph, t.ex_row, t.ex_len = dev(problem.ex_graph), dev(problem.ex_row), dev(problem.ex_len)
    return t


def _blocks(S: int, K: int, tile: Optional[int] = None) -> Tuple[int, int, int]:
    """``(BLOCK_S, BLOCK_K, num_warps)`` for nodes of up to ``K`` arcs, at most ``tile``
    (default ``MAX_TILE``) entries per step."""
    bs = triton.next_power_of_2(S)
    bk = max(1, min(triton.next_power_of_2(K), (tile or MAX_TILE) // bs))
    tile = bs * bk
    return bs, bk, 4 if tile <= 1024 else 8


def _weights(w: torch.Tensor, arc_tab: torch.Tensor) -> torch.Tensor:
    """Arc weights in table layout, -inf at padding."""
    wp = torch.cat([w, w.new_full((1,), -math.inf)])
    idx = torch.where(arc_tab >= 0, arc_tab.long(), w.shape[0])
    return wp[idx].contiguous()


def forward(problem, tables: Tables, E: torch.Tensor, w: torch.Tensor, use_max: bool = False,
            tile: Optional[int] = None):
    """Alpha pass: ``(alpha (N, T + 1, S), logz (N,))`` in ``E``'s dtype and device.

    ``E`` is ``(B, T, C)`` and contiguous, ``w`` the ``(num_arcs,)`` arc weights (same dtype and
    device); ``tile`` overrides ``MAX_TILE``."""
    N, T1 = problem.num_examples, int(problem.ex_len.max(initial=0)) + 1
    alpha = torch.empty((max(N, 1), T1, tables.S), dtype=E.dtype, device=E.device)
    logz = torch.empty(N, dtype=E.dtype, device=E.device)
    if N == 0:
        return alpha[:0], logz
    bs, bk, nw = _blocks(tables.S, tables.K_in, tile)
    _forward_kernel[(N,)](
        E, E.stride(0), E.stride(1), tables.ex_graph, tables.ex_row, tables.ex_len,
        tables.in_src, tables.in_lab, _weights(w, tables.in_arc), tables.start, tables.accept,
        alpha, logz, tables.S, tables.K_in, T1,
        BLOCK_S=bs, BLOCK_K=bk, ONE_K=bk >= tables.K_in, USE_MAX=use_max, num_warps=nw,
    )
    return alpha, logz


def backward(problem, tables: Tables, E: torch.Tensor, w: torch.Tensor, alpha: torch.Tensor,
             logz: torch.Tensor, coef: torch.Tensor, need_e: bool, need_w: bool, tile: Optional[int] = None):
    """Gradient of ``sum_e coef[e] * logz[e]`` (``coef`` ``(N,)``) after :func:`forward`:
    ``(grad_E (B, T, C) or None, grad_w (num_arcs,) or None)``; ``tile`` overrides ``MAX_TILE``."""
    N = problem.num_examples
    dev, dtype = E.device, E.dtype
    gE = torch.zeros_like(E) if need_e else None
    gw = torch.zeros(w.shape[0], dtype=dtype, device=dev) if need_w else None
    if N == 0 or not (need_e or need_w):
        return gE, gw
    S, K = tables.S, tables.K_out
    coef = coef.to(device=dev, dtype=dtype).contiguous()
    beta = torch.empty((N, 2, S), dtype=dtype, device=dev)
    occ = torch.zeros((N, S, K), dtype=dtype, device=dev) if need_w else beta
    node_lab = tables.node_lab
    bs, bk, nw = _blocks(S, K, tile)
    _backward_kernel[(N,)](
        E, gE if need_e else E, E.stride(0), E.stride(1), tables.ex_graph, tables.ex_row, tables.ex_len,
        coef, logz, tables.out_dst, tables.out_lab, _weights(w, tables.out_arc), tables.accept,
        node_lab if node_lab is not None else tables.accept, alpha, beta, occ, S, K, alpha.shape[1],
        BLOCK_S=bs, BLOCK_K=bk, ONE_K=bk >= K, NODE_E=need_e and node_lab is not None,
        ARC_E=need_e and node_lab is None, NEED_W=need_w, num_warps=nw,
    )
    if need_w:
        arcs = tables.out_arc.long()[tables.ex_graph.long()]  # (N, S, K)
        keep = arcs >= 0
        gw.index_add_(0, arcs[keep], occ[keep])
    return gE, gw


if triton is not None:

    @triton.jit
    def _lse_step(m, s, v, USE_MAX: tl.constexpr):
        """Folds the ``(BLOCK_S, BLOCK_K)`` candidates ``v`` into a running (max, scaled sum)."""
        cm = tl.max(v, 1)
        nm = tl.maximum(m, cm)
        if USE_MAX:
            return nm, s
        safe = tl.where(nm == -float("inf"), 0.0, nm)
        s = s * tl.exp(m - safe) + tl.sum(tl.exp(v - safe[:, None]), 1)
        return nm, s

    @triton.jit
    def _lse_value(m, s, USE_MAX: tl.constexpr):
        if USE_MAX:
            return m
        # a NaN candidate makes s NaN: the result is NaN even when every other value is -inf
        return tl.where((m == -float("inf")) & (s == s), -float("inf"), m + tl.log(s))

    @triton.jit
    def _table_tile(node_tab, lab_tab, w_tab, tbase, ns, nmask, kk, K):
        """Arcs ``kk`` of nodes ``ns`` from a ``(G, S, K)`` table: (real?, other node, label, weight)."""
        idx = tbase + ns[:, None] * K + kk[None, :]
        tm = nmask[:, None] & (kk[None, :] < K)
        other = tl.load(node_tab + idx, mask=tm, other=-1)
        ok = other >= 0
        lab = tl.load(lab_tab + idx, mask=ok, other=0)
        wt = tl.load(w_tab + idx, mask=ok, other=-float("inf"))
        return ok, other, lab, wt

    @triton.jit
    def _candidates(ok, other, lab, wt, vec, erow):
        """``vec[other] + weight + erow[label]`` per arc, -inf at padding."""
        v = tl.load(vec + other, mask=ok, other=-float("inf")) + wt + tl.load(erow + lab, mask=ok, other=0.0)
        return tl.where(ok, v, -float("inf"))

    @triton.jit
    def _occupancies(ok, lab, v, an, c, grow, ARC_E: tl.constexpr):
        """``exp(alpha - log Z + v) * coef`` per arc; with ``ARC_E`` also added to the gradient
        row ``grow`` at each arc's label."""
        o = tl.where(ok, tl.exp(an[:, None] + v) * c, 0.0)
        if ARC_E:
            tl.atomic_add(grow + lab, o, mask=ok & (o != 0), sem="relaxed")
        return o

    @triton.jit
    def _forward_kernel(
        E, sEb, sEt, ex_graph, ex_row, ex_len, in_src, in_lab, in_w, start, accept,
        alpha, logz, S, K, T1,
        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ONE_K: tl.constexpr, USE_MAX: tl.constexpr,
    ):
        e = tl.program_id(0)
        g = tl.load(ex_graph + e).to(tl.int64)
        row = tl.load(ex_row + e).to(tl.int64)
        L = tl.load(ex_len + e)
        ns = tl.arange(0, BLOCK_S)
        nmask = ns < S
        ks = tl.arange(0, BLOCK_K)
        abase = alpha + e.to(tl.int64) * T1 * S
        ebase = E + row * sEb
        tbase = g * S * K
        st = tl.load(start + g * S + ns, mask=nmask, other=0)
        a = tl.where(st != 0, 0.0, -float("inf")).to(alpha.dtype.element_ty)
        tl.store(abase + ns, a, mask=nmask)
        tl.debug_barrier()
        if ONE_K:  # the whole table fits: read it once
            ok, src, lab, wt = _table_tile(in_src, in_lab, in_w, tbase, ns, nmask, ks, K)
        for t in range(0, L):
            prev = abase + t * S
            m = tl.full((BLOCK_S,), -float("inf"), alpha.dtype.element_ty)
            s = tl.zeros((BLOCK_S,), alpha.dtype.element_ty)
            if ONE_K:
                m, s = _lse_step(m, s, _candidates(ok, src, lab, wt, prev, ebase + t * sEt), USE_MAX)
            else:
                for k0 in range(0, K, BLOCK_K):
                    ok, src, lab, wt = _table_tile(in_src, in_lab, in_w, tbase, ns, nmask, k0 + ks, K)
                    m, s = _lse_step(m, s, _candidates(ok, src, lab, wt, prev, ebase + t * sEt), USE_MAX)
            tl.store(prev + S + ns, _lse_value(m, s, USE_MAX), mask=nmask)
            tl.debug_barrier()
        last = tl.load(abase + L * S + ns, mask=nmask, other=-float("inf"))
        acc = tl.load(accept + g * S + ns, mask=nmask, other=0)
        v = tl.where(acc != 0, last, -float("inf"))
        m = tl.max(v, 0)
        if USE_MAX:
            tl.store(logz + e, m)
        else:
            safe = tl.where(m == -float("inf"), 0.0, m)
            s = tl.sum(tl.exp(v - safe), 0)
            tl.store(logz + e, tl.where((m == -float("inf")) & (s == s), -float("inf"), safe + tl.log(s)))

    @triton.jit
    def _backward_kernel(
        E, gE, sEb, sEt, ex_graph, ex_row, ex_len, coef, logz, out_dst, out_lab, out_w, accept,
        node_lab, alpha, beta, occ, S, K, T1,
        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ONE_K: tl.constexpr, NODE_E: tl.constexpr,
        ARC_E: tl.constexpr, NEED_W: tl.constexpr,
    ):
        e = tl.program_id(0)
        g = tl.load(ex_graph + e).to(tl.int64)
        row = tl.load(ex_row + e).to(tl.int64)
        c = tl.load(coef + e)
        lz = tl.load(logz + e)
        L = tl.load(ex_len + e)
        L = tl.where((c == 0) | (lz == -float("inf")), 0, L)  # nothing flows back
        ns = tl.arange(0, BLOCK_S)
        nmask = ns < S
        ks = tl.arange(0, BLOCK_K)
        abase = alpha + e.to(tl.int64) * T1 * S
        bbase = beta + e.to(tl.int64) * 2 * S
        obase = occ + e.to(tl.int64) * S * K
        ebase = E + row * sEb
        gbase = gE + row * sEb
        tbase = g * S * K
        acc = tl.load(accept + g * S + ns, mask=nmask, other=0)
        b = tl.where(acc != 0, 0.0, -float("inf")).to(alpha.dtype.element_ty)
        tl.store(bbase + (L % 2) * S + ns, b, mask=nmask)
        tl.debug_barrier()
        if NODE_E:
            nl = tl.load(node_lab + g * S + ns, mask=nmask, other=-1)
        if ONE_K:
            ok, dst, lab, wt = _table_tile(out_dst, out_lab, out_w, tbase, ns, nmask, ks, K)
            wacc = tl.zeros((BLOCK_S, BLOCK_K), alpha.dtype.element_ty)
        for i in range(0, L):
            t = L - 1 - i
            nxt = bbase + ((t + 1) % 2) * S
            if NODE_E:  # posteriors of the nodes reached at frame t
                post = tl.exp(tl.load(abase + (t + 1) * S + ns, mask=nmask, other=-float("inf")) + b - lz) * c
                pm = nmask & (nl >= 0) & (post != 0)
                tl.atomic_add(gbase + t * sEt + nl, post, mask=pm, sem="relaxed")
            if NEED_W or ARC_E:
                an = tl.load(abase + t * S + ns, mask=nmask, other=-float("inf")) - lz
            m = tl.full((BLOCK_S,), -float("inf"), alpha.dtype.element_ty)
            s = tl.zeros((BLOCK_S,), alpha.dtype.element_ty)
            if ONE_K:
                v = _candidates(ok, dst, lab, wt, nxt, ebase + t * sEt)
                m, s = _lse_step(m, s, v, False)
                if NEED_W or ARC_E:
                    o = _occupancies(ok, lab, v, an, c, gbase + t * sEt, ARC_E)
                    if NEED_W:
                        wacc += o
            else:
                for k0 in range(0, K, BLOCK_K):
                    kk = k0 + ks
                    ok, dst, lab, wt = _table_tile(out_dst, out_lab, out_w, tbase, ns, nmask, kk, K)
                    v = _candidates(ok, dst, lab, wt, nxt, ebase + t * sEt)
                    m, s = _lse_step(m, s, v, False)
                    if NEED_W or ARC_E:
                        o = _occupancies(ok, lab, v, an, c, gbase + t * sEt, ARC_E)
                        if NEED_W:  # each program owns its slice: a plain read-modify-write
                            op = obase + ns[:, None] * K + kk[None, :]
                            tm = nmask[:, None] & (kk[None, :] < K)
                            tl.store(op, tl.load(op, mask=tm, other=0.0) + o, mask=tm)
            b = _lse_value(m, s, False)
            tl.store(bbase + (t % 2) * S + ns, b, mask=nmask)
            tl.debug_barrier()
        if ONE_K and NEED_W:
            tm = nmask[:, None] & (ks[None, :] < K)
            tl.store(obase + ns[:, None] * K + ks[None, :], wacc, mask=tm)
