"""The padded-table torch implementation of the batched forward-backward (any device).

Padded ``(E, S, K)`` incoming-arc tables, one gather + logsumexp per frame for all examples at
once; occupancies in bulk at the end. The default off the CPU without Triton, and for graphs with
epsilon arcs. The functions take a ``State`` of :mod:`.compiled_graphs` (duck-typed).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .compiled_graphs import GraphBatch

NEG_INF = -math.inf
OCC_BLOCK_ELEMENTS = 1 << 24  # occupancies are formed this many entries at a time


# ---------------------------------------------------------------------------
# torch implementation (any device)
# ---------------------------------------------------------------------------


class Tables:
    """Padded per-example tables on a device (built from a :class:`~.compiled_graphs.Problem`).

    ``(Ne, Smax, K)`` incoming (``in_*``) and outgoing (``out_*``) emitting arcs of each node of
    each example (``*_mask`` marks the real entries), ``(Ne, Smax)`` start and accept masks, and
    with epsilon arcs their levels and ``(Ne, Smax, K)`` tables (``ein_*``, ``eout_*``).
    """

    Smax: int
    in_arc: torch.Tensor
    in_mask: torch.Tensor
    in_src: torch.Tensor
    in_lab: torch.Tensor
    out_arc: torch.Tensor
    out_mask: torch.Tensor
    out_dst: torch.Tensor
    out_lab: torch.Tensor
    start: torch.Tensor
    accept: torch.Tensor
    has_eps: bool
    eps_levels_in: int
    eps_levels_out: int
    lin: torch.Tensor
    lout: torch.Tensor
    ein_arc: torch.Tensor
    ein_mask: torch.Tensor
    ein_src: torch.Tensor
    eout_arc: torch.Tensor
    eout_mask: torch.Tensor
    eout_dst: torch.Tensor
    rows: torch.Tensor
    lens: torch.Tensor


def _pad_table(node_of_entry: np.ndarray, entries: np.ndarray, cnt: np.ndarray, num_rows: int, K: int):
    """``(num_rows + 1, K)`` table whose row r lists the entries of row r (-1 padded)."""
    tab = np.full((num_rows + 1, max(K, 1)), -1, dtype=np.int64)
    if len(entries):
        starts = np.zeros(len(cnt), dtype=np.int64)
        np.cumsum(cnt[:-1], out=starts[1:])
        pos = np.arange(len(entries)) - np.repeat(starts, cnt)
        tab[node_of_entry, pos] = entries
    return tab


def build_tables(st) -> Tables:
    """The padded per-example tables of a ``State`` (its ``problem`` and ``E``), on ``E``'s device:
    what the torch recursions (and the Viterbi paths of :mod:`.viterbi_paths`) read."""
    p, bt = st.problem, st.problem.batch
    dev = st.E.device
    N = int(bt.node_off[-1])
    tb = Tables()
    Smax = max(int(p.ex_nodes.max(initial=0)), 1)
    tb.Smax = Smax
    # node index of each (example, local node) into the global node space; N = padding row
    loc = np.arange(Smax)
    gnode = bt.node_off[p.ex_graph][:, None] + loc[None, :]
    gnode = np.where(loc[None, :] < p.ex_nodes[:, None], gnode, N)
    node_graph = np.repeat(np.arange(len(bt.graphs)), np.diff(bt.node_off))

    def table(off, arcs, K):
        cnt = np.diff(off)
        owner = np.repeat(np.arange(N), cnt)
        return _pad_table(owner, arcs.astype(np.int64), cnt, N, K)[gnode]  # (Ne, Smax, K)

    def arcs_and_mask(tab):
        """Arc ids (padding -> arc 0) and the mask of real entries, on the device."""
        return torch.from_numpy(np.maximum(tab, 0)).to(dev), torch.from_numpy(tab >= 0).to(dev)

    def per_entry(tab, per_arc):
        """``per_arc`` of each table entry (0 for padding) as int64, on the device."""
        return torch.from_numpy(np.where(tab >= 0, per_arc[np.maximum(tab, 0)], 0).astype(np.int64)).to(dev)

    in_tab = table(bt.in_off, bt.in_arc, bt.max_in)
    out_tab = table(bt.out_off, bt.out_arc, bt.max_out)
    src_p, dst_p, lab_p = (np.append(v, 0) for v in (bt.src, bt.dst, bt.label))  # arc 0 valid if none
    tb.in_arc, tb.in_mask = arcs_and_mask(in_tab)
    tb.in_src = per_entry(in_tab, src_p)
    tb.in_lab = per_entry(in_tab, lab_p)
    tb.out_arc, tb.out_mask = arcs_and_mask(out_tab)
    tb.out_dst = per_entry(out_tab, dst_p)
    tb.out_lab = per_entry(out_tab, lab_p)
    start = np.zeros(N + 1, dtype=bool)
    accept = np.zeros(N + 1, dtype=bool)
    gs = np.repeat(np.arange(len(bt.graphs)), np.diff(bt.start_off))
    start[bt.node_off[gs] + bt.start] = True
    ga = np.repeat(np.arange(len(bt.graphs)), np.diff(bt.accept_off))
    accept[bt.node_off[ga] + bt.accept] = True
    tb.start = torch.from_numpy(start[gnode]).to(dev)
    tb.accept = torch.from_numpy(accept[gnode]).to(dev)
    tb.has_eps = bt.has_eps
    if bt.has_eps:
        ein_cnt = np.zeros(N, dtype=np.int64)
        eout_cnt = np.zeros(N, dtype=np.int64)
        # global node of each eps-in / eps-out group
        gin = node_graph_nodes(bt, "eps_in")
        gout = node_graph_nodes(bt, "eps_out")
        ein_cnt[gin] = np.diff(bt.eps_in_off)
        eout_cnt[gout] = np.diff(bt.eps_out_off)
        # reorder arc groups by global node id
        order_in = np.argsort(gin, kind="stable")
        order_out = np.argsort(gout, kind="stable")
        ein_arcs = np.concatenate([bt.eps_in_arc[bt.eps_in_off[i] : bt.eps_in_off[i + 1]] for i in order_in]).astype(
            np.int64
        )
        eout_arcs = np.concatenate(
            [bt.eps_out_arc[bt.eps_out_off[i] : bt.eps_out_off[i + 1]] for i in order_out]
        ).astype(np.int64)
        ein_off = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(ein_cnt, out=ein_off[1:])
        eout_off = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(eout_cnt, out=eout_off[1:])
        etab_in = table(ein_off, ein_arcs, bt.max_eps)
        etab_out = table(eout_off, eout_arcs, bt.max_eps)
        # levels: forward (longest eps path into the node), backward (longest eps path out)
        lin = np.zeros(N + 1, dtype=np.int64)
        for i in range(len(gin)):  # groups are in topological order within each graph
            n = gin[i]
            a = bt.eps_in_arc[bt.eps_in_off[i] : bt.eps_in_off[i + 1]]
            lin[n] = 1 + lin[bt.node_off[node_graph[n]] + bt.src[a]].max()
        lout = np.zeros(N + 1, dtype=np.int64)
        for i in range(len(gout)):
            n = gout[i]
            a = bt.eps_out_arc[bt.eps_out_off[i] : bt.eps_out_off[i + 1]]
            lout[n] = 1 + lout[bt.node_off[node_graph[n]] + bt.dst[a]].max()
        tb.eps_levels_in = int(lin.max())
        tb.eps_levels_out = int(lout.max())
        tb.lin = torch.from_numpy(lin[gnode]).to(dev)
        tb.lout = torch.from_numpy(lout[gnode]).to(dev)
        tb.ein_arc, tb.ein_mask = arcs_and_mask(etab_in)
        tb.ein_src = per_entry(etab_in, src_p)
        tb.eout_arc, tb.eout_mask = arcs_and_mask(etab_out)
        tb.eout_dst = per_entry(etab_out, dst_p)
    tb.rows = torch.from_numpy(p.ex_row).to(dev)
    tb.lens = torch.from_numpy(p.ex_len).to(dev)
    return tb


def node_graph_nodes(bt: GraphBatch, kind: str) -> np.ndarray:
    """Global node id of each epsilon group (``kind`` = ``"eps_in"`` or ``"eps_out"``)."""
    node_off = getattr(bt, kind + "_node_off")
    nodes = getattr(bt, kind + "_nodes").astype(np.int64)
    g = np.repeat(np.arange(len(bt.graphs)), np.diff(node_off))
    return bt.node_off[g] + nodes


def _lse_last(x: torch.Tensor, use_max: bool) -> torch.Tensor:
    if use_max:
        return x.max(-1).values
    return torch.logsumexp(x, -1)


def _gather_nodes(vec: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``vec`` (Ne, S), ``idx`` (Ne, S, K) -> (Ne, S, K)."""
    Ne, S, K = idx.shape
    return vec.gather(1, idx.reshape(Ne, S * K)).reshape(Ne, S, K)


def _eps_closure(vec, levels, level, other, arc, mask, w, use_max):
    """Epsilon closure of ``vec`` ``(Ne, S)`` one level at a time: nodes of level ``lev`` combine
    their value with ``vec[other] + w[arc]`` over their (masked) epsilon arcs ``(Ne, S, K)``."""
    ninf = torch.tensor(NEG_INF, dtype=vec.dtype, device=vec.device)
    for lev in range(1, levels + 1):
        cand = _gather_nodes(vec, other) + w[arc]
        cand = torch.where(mask, cand, ninf)
        new = _lse_last(torch.cat([vec.unsqueeze(-1), cand], -1), use_max)
        vec = torch.where(level == lev, new, vec)
    return vec


def _eps_step_forward(alpha, tb, w, use_max):
    return _eps_closure(alpha, tb.eps_levels_in, tb.lin, tb.ein_src, tb.ein_arc, tb.ein_mask, w, use_max)


def torch_forward(st, use_max: bool) -> None:
    """Forward pass over all examples of ``st.problem`` with torch operations, on ``st.E``'s device.

    Sets ``st.alpha`` ``(N, T + 1, S_max)`` (the forward scores of each example's nodes, padded),
    ``st.logz`` ``(N,)`` and ``st.extra`` (the padded arc tables the backward reuses). ``use_max``:
    the max semiring (Viterbi) instead of the log semiring.
    """
    p = st.problem
    tb = build_tables(st)
    st.extra = tb
    E = st.E
    w = torch.cat([st.w, st.w.new_zeros(1)])  # padded table entries point at arc 0: keep it valid
    dev, dtype = E.device, E.dtype
    Ne = p.num_examples
    T = int(p.ex_len.max(initial=0))
    ninf = torch.tensor(NEG_INF, dtype=dtype, device=dev)
    alpha = torch.where(tb.start, torch.zeros((), dtype=dtype, device=dev), ninf)
    if tb.has_eps:
        alpha = _eps_step_forward(alpha, tb, w, use_max)
    alphas = torch.empty((Ne, T + 1, tb.Smax), dtype=dtype, device=dev)
    alphas[:, 0] = alpha
    Er = E[tb.rows] if Ne else E[:0]
    Ne_, S, K = tb.in_src.shape
    w_in = torch.where(tb.in_mask, w[tb.in_arc], ninf)
    lab = tb.in_lab.reshape(Ne, S * K)
    for t in range(T):
        em = Er[:, t].gather(1, lab).reshape(Ne, S, K)
        cand = torch.where(tb.in_mask, _gather_nodes(alpha, tb.in_src) + w_in + em, ninf)
        new = _lse_last(cand, use_max)
        if tb.has_eps:
            new = _eps_step_forward(new, tb, w, use_max)
        alpha = torch.where((t < tb.lens).unsqueeze(1), new, alpha)
        alphas[:, t + 1] = alpha
    final = torch.where(tb.accept, alpha, ninf)
    st.logz = _lse_last(final, use_max) if Ne else torch.zeros(0, dtype=dtype, device=dev)
    st.alpha = alphas


def torch_backward(st, coef: torch.Tensor, need_e: bool, need_w: bool):
    """Backward pass of :func:`torch_forward` (log semiring).

    Args:
        st: the state the forward filled.
        coef: ``(N,)`` the gradient of the output with respect to each example's score.
        need_e, need_w: which gradients to compute.

    Returns:
        ``(grad_E (B, T, C) or None, grad_w (num_arcs,) or None)`` in the dtype and on the
        device of ``st.E``.
    """
    p, tb = st.problem, st.extra
    E, alphas, logz = st.E, st.alpha, st.logz
    w = torch.cat([st.w, st.w.new_zeros(1)])
    dev, dtype = E.device, E.dtype
    Ne = p.num_examples
    T = alphas.shape[1] - 1
    ninf = torch.tensor(NEG_INF, dtype=dtype, device=dev)
    coef = coef.to(device=dev, dtype=dtype)
    valid = (logz != NEG_INF) & (coef != 0)
    lz = torch.where(valid, logz, torch.zeros((), dtype=dtype, device=dev))
    scale = torch.where(valid, coef, torch.zeros((), dtype=dtype, device=dev))

    def eps_back(beta):
        return _eps_closure(beta, tb.eps_levels_out, tb.lout, tb.eout_dst, tb.eout_arc, tb.eout_mask, w, False)

    beta_init = torch.where(tb.accept, torch.zeros((), dtype=dtype, device=dev), ninf)
    if tb.has_eps:
        beta_init = eps_back(beta_init)
    betas = torch.empty_like(alphas)
    betas[:, T] = beta_init
    Er = E[tb.rows]
    _, S, Ko = tb.out_dst.shape
    w_out = torch.where(tb.out_mask, w[tb.out_arc], ninf)
    lab_out = tb.out_lab.reshape(Ne, S * Ko)
    beta = beta_init
    for t in range(T - 1, -1, -1):
        em = Er[:, t].gather(1, lab_out).reshape(Ne, S, Ko)
        cand = torch.where(tb.out_mask, _gather_nodes(beta, tb.out_dst) + w_out + em, ninf)
        new = torch.logsumexp(cand, -1)
        if tb.has_eps:
            new = eps_back(new)
        beta = torch.where((t < tb.lens).unsqueeze(1), new, beta_init)
        betas[:, t] = beta
    # occupancies of emitting arcs, grouped by destination: (Ne, tb, S, K) per block of frames
    _, S, K = tb.in_src.shape
    w_in = torch.where(tb.in_mask, w[tb.in_arc], ninf)
    zero = torch.zeros((), dtype=dtype, device=dev)
    gE: torch.Tensor | None = None
    gw: torch.Tensor | None = None
    if need_e:
        gE = torch.zeros_like(E)
    occ_w = torch.zeros((Ne, S, K), dtype=dtype, device=dev) if need_w else None
    block = max(1, min(T, OCC_BLOCK_ELEMENTS // max(Ne * S * K, 1)))
    src_idx = tb.in_src.reshape(Ne, 1, S * K)
    lab_idx = tb.in_lab.reshape(Ne, 1, S * K)
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        n = t1 - t0
        a_src = alphas[:, t0:t1].gather(2, src_idx.expand(Ne, n, S * K)).reshape(Ne, n, S, K)
        em = Er[:, t0:t1].gather(2, lab_idx.expand(Ne, n, S * K)).reshape(Ne, n, S, K)
        tmask = (torch.arange(t0, t1, device=dev).unsqueeze(0) < tb.lens.unsqueeze(1)).reshape(Ne, n, 1, 1)
        occ = torch.exp(
            a_src + w_in.unsqueeze(1) + em + betas[:, t0 + 1 : t1 + 1].unsqueeze(-1) - lz.reshape(Ne, 1, 1, 1)
        )
        occ = torch.where(tmask & tb.in_mask.unsqueeze(1), occ, zero) * scale.reshape(Ne, 1, 1, 1)
        if gE is not None:  # need_e
            gEe = torch.zeros((Ne, n, E.shape[2]), dtype=dtype, device=dev)
            gEe.scatter_add_(2, lab_idx.expand(Ne, n, S * K), occ.reshape(Ne, n, S * K))
            gE[:, t0:t1].index_add_(0, tb.rows, gEe)
        if occ_w is not None:  # need_w
            occ_w += occ.sum(1)
    if occ_w is not None:  # need_w
        gw = torch.zeros(st.w.shape[0] + 1, dtype=dtype, device=dev)
        gw.index_add_(0, tb.in_arc.reshape(-1), occ_w.reshape(-1))
        if tb.has_eps:
            _, _, Ke = tb.ein_src.shape
            a_e = alphas.gather(2, tb.ein_src.reshape(Ne, 1, S * Ke).expand(Ne, T + 1, S * Ke)).reshape(
                Ne, T + 1, S, Ke
            )
            we = torch.where(tb.ein_mask, w[tb.ein_arc], ninf)
            occe = torch.exp(a_e + we.unsqueeze(1) + betas.unsqueeze(-1) - lz.reshape(Ne, 1, 1, 1))
            tm = (torch.arange(T + 1, device=dev).unsqueeze(0) <= tb.lens.unsqueeze(1)).reshape(Ne, T + 1, 1, 1)
            occe = torch.where(tm & tb.ein_mask.unsqueeze(1), occe, torch.zeros((), dtype=dtype, device=dev))
            occe = occe * scale.reshape(Ne, 1, 1, 1)
            gw.index_add_(0, tb.ein_arc.reshape(-1), occe.sum(1).reshape(-1))
    return gE, (None if gw is None else gw[:-1])
