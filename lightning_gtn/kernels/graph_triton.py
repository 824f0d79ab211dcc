"""The forward-backward dynamic programme as Triton kernels (CUDA tensors, epsilon-free graphs).

The torch implementation in :mod:`.graph_torch` launches a handful of kernels per frame, so on a GPU
a 1000-frame batch costs tens of thousands of launches. Here one program per example walks all
its frames inside a single kernel: the frame's node vector ``(S,)`` is spread over the program's
threads, the previous frame is read back from global memory through the arc tables (a gather),
and a block barrier separates the frames. Examples run side by side as separate programs.

Tables are per graph, not per example: each graph's ``(S_g, K_g)`` table lists the incoming
(or outgoing) arcs of each node, -1 padded to the graph's own largest degree, and is built once
per compiled graph (criterion graphs are cached per target), so a batch only concatenates them;
a graph shared by every example (ASG's transition graph) is stored once. Nodes with more than
``BLOCK_K`` arcs are read in chunks with an online logsumexp.

Gradients: the backward pass computes ``beta`` frame by frame in the same way. When every
emitting arc into a node carries the same label (CTC, ASG, the sequence criterion), the emission
gradient of a frame is the node posteriors ``exp(alpha + beta - log Z)`` added at the nodes'
labels (one atomic add per node and frame); otherwise each arc's occupancy is added at its own
label. Arc-weight gradients are summed over frames per example and table entry (in registers, or
in the example's own slice of a buffer when the table is read in chunks), then added at each
arc's global id at the end of the kernel.
Float atomics make the emission gradient's last bits depend on the order of additions, as with
torch's own CUDA ``ctc_loss``.

Graphs with epsilon arcs, or with more than ``MAX_NODES`` nodes, are scored by the torch
implementation instead.
"""

from __future__ import annotations

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
    """Whether these kernels can score a :class:`~.compiled_graphs.GraphBatch`: no epsilon arcs, and at
    most ``MAX_NODES`` nodes per graph (a CTC target of up to 2047 tokens)."""
    return available() and not batch.has_eps and batch.max_nodes <= MAX_NODES


class Tables:
    """Arc tables of a batch's graphs on a device (see :func:`build_tables`)."""

    __slots__ = (
        "S",
        "K_in",
        "K_out",
        "g_nodes",
        "g_kin",
        "g_kout",
        "g_tin",
        "g_tout",
        "g_node",
        "g_arc",
        "in_src",
        "in_lab",
        "in_arc",
        "out_dst",
        "out_lab",
        "out_arc",
        "start",
        "accept",
        "node_lab",
        "ex_graph",
        "ex_row",
        "ex_len",
        "ex_occ_size",
    )
    S: int  # the largest graph's node count
    K_in: int  # the largest in-degree (emitting arcs)
    K_out: int  # the largest out-degree
    g_nodes: torch.Tensor  # (G,) per graph: nodes, in-/out-degree bounds, table offsets
    g_kin: torch.Tensor
    g_kout: torch.Tensor
    g_tin: torch.Tensor
    g_tout: torch.Tensor
    g_node: torch.Tensor
    g_arc: torch.Tensor
    in_src: torch.Tensor  # the graphs' padded tables, concatenated
    in_lab: torch.Tensor
    in_arc: torch.Tensor
    out_dst: torch.Tensor
    out_lab: torch.Tensor
    out_arc: torch.Tensor
    start: torch.Tensor
    accept: torch.Tensor
    node_lab: Optional[torch.Tensor]
    ex_graph: torch.Tensor  # (N,) per example
    ex_row: torch.Tensor
    ex_len: torch.Tensor
    ex_occ_size: np.ndarray


def _graph_tables(cg) -> dict:
    """One compiled graph's padded tables (local ids, numpy), cached on the graph.

    ``in_*``/``out_*``: ``(S, K)`` emitting arcs into / out of each node, -1 padded (``K`` the
    graph's own largest in-/out-degree); ``node_lab``: the label shared by every arc into a node
    (-1 where there are none), or None when some node's arcs differ.
    """
    t = getattr(cg, "device_tables", None)
    if t is not None:
        return t
    S = cg.num_nodes
    lab = np.append(cg.label, 0).astype(np.int64)

    def padded(cnt, arcs):
        cnt = np.asarray(cnt, dtype=np.int64)
        tab = np.full((S, max(int(cnt.max(initial=0)), 1)), -1, dtype=np.int64)
        if len(arcs):
            pos = np.arange(len(arcs)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            tab[np.repeat(np.arange(S), cnt), pos] = arcs
        return tab

    t = {"S": S}
    for side, cnt, arcs, other in (("in", cg.in_cnt, cg.in_arc, cg.src), ("out", cg.out_cnt, cg.out_arc, cg.dst)):
        tab = padded(cnt, arcs)
        t[side + "_arc"] = tab.astype(np.int32)
        t[side + "_node"] = np.where(tab >= 0, np.append(other, 0)[tab], -1).astype(np.int32)
        t[side + "_lab"] = np.where(tab >= 0, lab[tab], 0).astype(np.int32)
    for name, ids in (("start", cg.start), ("accept", cg.accept)):
        mark = np.zeros(S, dtype=np.int32)
        mark[ids] = 1
        t[name] = mark
    in_tab = t["in_arc"].astype(np.int64)
    in_lab = np.where(in_tab >= 0, lab[in_tab], -1)
    lo = np.where(in_tab >= 0, in_lab, np.iinfo(np.int64).max).min(-1, initial=np.iinfo(np.int64).max)
    hi = in_lab.max(-1, initial=-1)
    t["node_lab"] = None if bool(((lo != hi) & (hi >= 0)).any()) else hi.astype(np.int32)
    cg.device_tables = t
    return t


_TABLE_KEYS = ("in_node", "in_lab", "in_arc", "out_node", "out_lab", "out_arc", "start", "accept", "node_lab")


def _device_tables(cg, device: torch.device) -> dict:
    """The graph's tables (:func:`_graph_tables`) flattened into int32 tensors on ``device``,
    cached per device (a batch then only concatenates them there)."""
    t = _graph_tables(cg)
    cache = t.setdefault("on_device", {})
    key = str(device)
    d = cache.get(key)
    if d is None:
        d = {
            k: torch.from_numpy(np.ascontiguousarray(t[k].ravel())).to(device) for k in _TABLE_KEYS if t[k] is not None
        }
        cache[key] = d
    return d


def build_tables(problem, device: torch.device) -> Tables:
    """Arc tables of ``problem``'s graphs, concatenated, and its example arrays, on ``device``.

    Each graph keeps its own table width (ASG's transition graph is 1000 arcs wide on C=1000,
    its target graphs 2), located through the per-graph offsets ``g_tin``/``g_tout`` (tables),
    ``g_node`` (node arrays) and ``g_arc`` (its first arc in the batch's arc order: tables hold
    the graph's own arc ids).
    """
    bt = problem.batch
    device = torch.device(device)
    parts = [_graph_tables(cg) for cg in bt.graphs]
    on_dev = [_device_tables(cg, device) for cg in bt.graphs]
    sizes = np.array([p["S"] for p in parts], dtype=np.int64)
    kin = np.array([p["in_arc"].shape[1] for p in parts], dtype=np.int64)
    kout = np.array([p["out_arc"].shape[1] for p in parts], dtype=np.int64)

    def starts(counts):
        return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if len(counts) else counts

    def cat(key):
        if not on_dev:
            return torch.zeros(0, dtype=torch.int32, device=device)
        return torch.cat([d[key] for d in on_dev])

    def dev(a, dtype=np.int32):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype)).to(device)

    t = Tables()
    t.S = max(int(sizes.max(initial=0)), 1)
    t.K_in, t.K_out = int(kin.max(initial=1)), int(kout.max(initial=1))
    t.g_nodes, t.g_kin, t.g_kout = dev(sizes), dev(kin), dev(kout)
    t.g_tin, t.g_tout, t.g_node = (
        dev(starts(sizes * kin), np.int64),
        dev(starts(sizes * kout), np.int64),
        dev(starts(sizes), np.int64),
    )
    t.g_arc = dev(bt.arc_off[:-1], np.int64)
    t.in_src, t.in_lab, t.in_arc = cat("in_node"), cat("in_lab"), cat("in_arc")
    t.out_dst, t.out_lab, t.out_arc = cat("out_node"), cat("out_lab"), cat("out_arc")
    t.start, t.accept = cat("start"), cat("accept")
    t.node_lab = None if any(p["node_lab"] is None for p in parts) else cat("node_lab")
    t.ex_graph, t.ex_row, t.ex_len = dev(problem.ex_graph), dev(problem.ex_row), dev(problem.ex_len)
    t.ex_occ_size = (sizes * kout)[problem.ex_graph] if problem.num_examples else np.zeros(0, np.int64)
    return t


def _blocks(S: int, K: int, tile: Optional[int] = None) -> Tuple[int, int, int]:
    """``(BLOCK_S, BLOCK_K, num_warps)`` for nodes of up to ``K`` arcs, at most ``tile``
    (default ``MAX_TILE``) entries per step."""
    bs = triton.next_power_of_2(S)
    bk = max(1, min(triton.next_power_of_2(K), (tile or MAX_TILE) // bs))
    tile = bs * bk
    return bs, bk, 4 if tile <= 1024 else 8


def forward(
    problem, tables: Tables, E: torch.Tensor, w: torch.Tensor, use_max: bool = False, tile: Optional[int] = None
):
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
        E,
        E.stride(0),
        E.stride(1),
        tables.ex_graph,
        tables.ex_row,
        tables.ex_len,
        tables.g_nodes,
        tables.g_kin,
        tables.g_tin,
        tables.g_node,
        tables.g_arc,
        tables.in_src,
        tables.in_lab,
        tables.in_arc,
        w.contiguous(),
        tables.start,
        tables.accept,
        alpha,
        logz,
        tables.S,
        T1,
        BLOCK_S=bs,
        BLOCK_K=bk,
        ONE_K=bk >= tables.K_in,
        USE_MAX=use_max,
        num_warps=nw,
    )
    return alpha, logz


def backward(
    problem,
    tables: Tables,
    E: torch.Tensor,
    w: torch.Tensor,
    alpha: torch.Tensor,
    logz: torch.Tensor,
    coef: torch.Tensor,
    need_e: bool,
    need_w: bool,
    tile: Optional[int] = None,
):
    """Gradient of ``sum_e coef[e] * logz[e]`` (``coef`` ``(N,)``) after :func:`forward`:
    ``(grad_E (B, T, C) or None, grad_w (num_arcs,) or None)``; ``tile`` overrides ``MAX_TILE``."""
    N = problem.num_examples
    dev, dtype = E.device, E.dtype
    gE = torch.zeros_like(E) if need_e else None
    gw = torch.zeros(max(w.shape[0], 1), dtype=dtype, device=dev) if need_w else None
    if N == 0 or not (need_e or need_w):
        return gE, (gw[: w.shape[0]] if gw is not None else None)  # gw is None unless need_w
    S, K = tables.S, tables.K_out
    coef = coef.to(device=dev, dtype=dtype).contiguous()
    beta = torch.empty((N, 2, S), dtype=dtype, device=dev)
    bs, bk, nw = _blocks(S, K, tile)
    one_k = bk >= K
    # arcs too many for one tile: each example sums its arc occupancies over frames in its own
    # slice of ``occ`` (laid out as its graph's out-table) before they go to ``gw``
    sizes = tables.ex_occ_size
    ex_occ = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)).to(dev)
    occ = torch.zeros(int(sizes.sum()), dtype=dtype, device=dev) if need_w and not one_k else beta
    node_lab = tables.node_lab
    _backward_kernel[(N,)](
        E,
        gE if need_e else E,
        E.stride(0),
        E.stride(1),
        tables.ex_graph,
        tables.ex_row,
        tables.ex_len,
        coef,
        logz,
        tables.g_nodes,
        tables.g_kout,
        tables.g_tout,
        tables.g_node,
        tables.g_arc,
        tables.out_dst,
        tables.out_lab,
        tables.out_arc,
        w.contiguous(),
        tables.accept,
        node_lab if node_lab is not None else tables.accept,
        alpha,
        beta,
        occ,
        ex_occ,
        gw if need_w else beta,
        S,
        alpha.shape[1],
        BLOCK_S=bs,
        BLOCK_K=bk,
        ONE_K=one_k,
        NODE_E=need_e and node_lab is not None,
        ARC_E=need_e and node_lab is None,
        NEED_W=need_w,
        num_warps=nw,
    )
    return gE, (gw[: w.shape[0]] if gw is not None else None)  # gw is None unless need_w


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
    def _table_tile(node_tab, lab_tab, arc_tab, w, tbase, arc0, ns, nmask, kk, K):
        """Arcs ``kk`` of nodes ``ns`` from a graph's ``(S, K)`` table starting at ``tbase``:
        (real?, other node, label, weight); the graph's arc ``a`` weighs ``w[arc0 + a]``."""
        idx = tbase + ns[:, None] * K + kk[None, :]
        tm = nmask[:, None] & (kk[None, :] < K)
        other = tl.load(node_tab + idx, mask=tm, other=-1)
        ok = other >= 0
        lab = tl.load(lab_tab + idx, mask=ok, other=0)
        arc = tl.load(arc_tab + idx, mask=ok, other=0)
        wt = tl.load(w + arc0 + arc, mask=ok, other=-float("inf"))
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
    def _graph_of(e, ex_graph, g_nodes, g_k, g_tab, g_node, g_arc):
        """Example ``e``'s graph: (node count, table width, table offset, node offset, arc offset)."""
        g = tl.load(ex_graph + e)
        return tl.load(g_nodes + g), tl.load(g_k + g), tl.load(g_tab + g), tl.load(g_node + g), tl.load(g_arc + g)

    @triton.jit
    def _forward_kernel(
        E,
        sEb,
        sEt,
        ex_graph,
        ex_row,
        ex_len,
        g_nodes,
        g_k,
        g_tab,
        g_node,
        g_arc,
        in_src,
        in_lab,
        in_arc,
        w,
        start,
        accept,
        alpha,
        logz,
        S,
        T1,
        BLOCK_S: tl.constexpr,
        BLOCK_K: tl.constexpr,
        ONE_K: tl.constexpr,
        USE_MAX: tl.constexpr,
    ):
        e = tl.program_id(0)
        Sg, K, tbase, nbase, arc0 = _graph_of(e, ex_graph, g_nodes, g_k, g_tab, g_node, g_arc)
        row = tl.load(ex_row + e).to(tl.int64)
        L = tl.load(ex_len + e)
        ns = tl.arange(0, BLOCK_S)
        nmask = ns < Sg
        ks = tl.arange(0, BLOCK_K)
        abase = alpha + e.to(tl.int64) * T1 * S  # frames of S (the batch's largest graph) values
        ebase = E + row * sEb
        st = tl.load(start + nbase + ns, mask=nmask, other=0)
        a = tl.where(st != 0, 0.0, -float("inf")).to(alpha.dtype.element_ty)
        tl.store(abase + ns, a, mask=nmask)
        tl.debug_barrier()
        if ONE_K:  # the whole table fits: read it once
            ok, src, lab, wt = _table_tile(in_src, in_lab, in_arc, w, tbase, arc0, ns, nmask, ks, K)
        for t in range(0, L):
            prev = abase + t * S
            m = tl.full((BLOCK_S,), -float("inf"), alpha.dtype.element_ty)
            s = tl.zeros((BLOCK_S,), alpha.dtype.element_ty)
            if ONE_K:
                m, s = _lse_step(m, s, _candidates(ok, src, lab, wt, prev, ebase + t * sEt), USE_MAX)
            else:
                for k0 in range(0, K, BLOCK_K):
                    ok, src, lab, wt = _table_tile(in_src, in_lab, in_arc, w, tbase, arc0, ns, nmask, k0 + ks, K)
                    m, s = _lse_step(m, s, _candidates(ok, src, lab, wt, prev, ebase + t * sEt), USE_MAX)
            tl.store(prev + S + ns, _lse_value(m, s, USE_MAX), mask=nmask)
            tl.debug_barrier()
        last = tl.load(abase + L * S + ns, mask=nmask, other=-float("inf"))
        acc = tl.load(accept + nbase + ns, mask=nmask, other=0)
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
        E,
        gE,
        sEb,
        sEt,
        ex_graph,
        ex_row,
        ex_len,
        coef,
        logz,
        g_nodes,
        g_k,
        g_tab,
        g_node,
        g_arc,
        out_dst,
        out_lab,
        out_arc,
        w,
        accept,
        node_lab,
        alpha,
        beta,
        occ,
        ex_occ,
        gw,
        S,
        T1,
        BLOCK_S: tl.constexpr,
        BLOCK_K: tl.constexpr,
        ONE_K: tl.constexpr,
        NODE_E: tl.constexpr,
        ARC_E: tl.constexpr,
        NEED_W: tl.constexpr,
    ):
        e = tl.program_id(0)
        Sg, K, tbase, nbase, arc0 = _graph_of(e, ex_graph, g_nodes, g_k, g_tab, g_node, g_arc)
        row = tl.load(ex_row + e).to(tl.int64)
        c = tl.load(coef + e)
        lz = tl.load(logz + e)
        L = tl.load(ex_len + e)
        L = tl.where((c == 0) | (lz == -float("inf")), 0, L)  # nothing flows back
        ns = tl.arange(0, BLOCK_S)
        nmask = ns < Sg
        ks = tl.arange(0, BLOCK_K)
        abase = alpha + e.to(tl.int64) * T1 * S
        bbase = beta + e.to(tl.int64) * 2 * S
        ebase = E + row * sEb
        gbase = gE + row * sEb
        acc = tl.load(accept + nbase + ns, mask=nmask, other=0)
        b = tl.where(acc != 0, 0.0, -float("inf")).to(alpha.dtype.element_ty)
        tl.store(bbase + (L % 2) * S + ns, b, mask=nmask)
        tl.debug_barrier()
        if NODE_E:
            nl = tl.load(node_lab + nbase + ns, mask=nmask, other=-1)
        if ONE_K:
            ok, dst, lab, wt = _table_tile(out_dst, out_lab, out_arc, w, tbase, arc0, ns, nmask, ks, K)
            wacc = tl.zeros((BLOCK_S, BLOCK_K), alpha.dtype.element_ty)
        else:
            obase = occ + tl.load(ex_occ + e)  # this example's (Sg, K) occupancy sums
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
                    ok, dst, lab, wt = _table_tile(out_dst, out_lab, out_arc, w, tbase, arc0, ns, nmask, kk, K)
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
        if NEED_W:  # the arc weights' gradient: each arc's summed occupancy, at its global id
            if ONE_K:
                tm = nmask[:, None] & (ks[None, :] < K)
                arc = tl.load(out_arc + tbase + ns[:, None] * K + ks[None, :], mask=tm, other=-1)
                tl.atomic_add(gw + arc0 + arc, wacc, mask=(arc >= 0) & (wacc != 0), sem="relaxed")
            else:
                for k0 in range(0, K, BLOCK_K):
                    kk = k0 + ks
                    tm = nmask[:, None] & (kk[None, :] < K)
                    arc = tl.load(out_arc + tbase + ns[:, None] * K + kk[None, :], mask=tm, other=-1)
                    o = tl.load(obase + ns[:, None] * K + kk[None, :], mask=tm, other=0.0)
                    tl.atomic_add(gw + arc0 + arc, o, mask=(arc >= 0) & (o != 0), sem="relaxed")
