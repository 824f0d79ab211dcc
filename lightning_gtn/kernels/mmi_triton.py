"""The shared-graph recursion of :mod:`.mmi_numba` as two Triton kernels (CUDA tensors).

:mod:`.mmi_torch` launches about thirty small kernels per frame, so on a GPU a 500-frame batch
costs tens of thousands of launches (half a second measured on an H200, slower than the CPU
kernel). Here one program per row of the batch walks all of the row's frames inside one kernel,
as :mod:`.graph_triton` does for the generic scorer, but in probability space with Kaldi's
per-frame rescaling, so an arc costs a gather and a multiply-add (no ``exp`` per arc):

* forward, frame ``t``: ``alpha'[d] = e_t[l_d] * (sum_{arcs a into d} p_a P[t-1][src a] + leaky * c_d)``
  with ``P[t-1]`` the previous frame's normalised distribution (the start distribution at
  ``t = 0``), ``c_d = sum_{a into d} p_a init[src a]`` the leaky HMM's share (Kaldi's
  ``alpha + leaky * tot_alpha * init``, ``tot_alpha = 1`` after rescaling, added between two
  frames), ``e_t[c] = exp(E[t, c] - m_t)``; ``P[t] = alpha' / sum(alpha')`` is stored
  (``(B, T, S)``: O(B * states) per frame) and ``log sum(alpha') + m_t`` added to the row's
  log-scale;
* backward, frame ``t`` (reverse): the posterior of state ``d`` at frame ``t`` is
  ``P[t][d] beta[d] / sum_d P[t][d] beta[d]``, added to the emission gradient at ``(t, l_d)``;
  ``beta_prev[s] = sum_{arcs a from s} p_a e_t[l_{dst a}] beta[dst a]`` plus the leak's transpose
  ``leaky * (init . beta_prev)``, then rescaled by its sum.

The kernels walk nodes that each carry one label (:class:`_Nodes`): the states themselves
when every arc into a state carries the same label (the CTC and HMM topologies), else a node per
``(destination, label)`` group plus a copy of each state (the modified CTC topology). At most
``MAX_NODES`` nodes (the whole vector lives in one program); the arc-weight gradient goes to
:mod:`.mmi_torch`. Arc tables are ``(N, K)`` lists of each node's incoming (forward) or outgoing
(backward) arcs, padded with -1 to the largest degree, built once per compiled graph and device.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np
import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs do not need it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None

__all__ = ["available", "supports", "shared_scores", "MAX_NODES", "MAX_TILE", "MAX_TABLE"]

MAX_NODES = 4096  # one program holds the whole state vector
MAX_TILE = 4096  # state x arc entries one program holds per step
MAX_TABLE = 1 << 24  # entries of a padded (S, K) arc table (int32 indexing, device memory)


def available() -> bool:
    """True when Triton is importable (it needs a CUDA device to run, or TRITON_INTERPRET=1)."""
    return triton is not None


class _Nodes:
    """The graph as the kernels walk it: nodes that each carry one label, their incoming arcs
    ``(node, predecessor node, probability)``, and the start, accept and leak vectors over them.

    When every arc into a state carries the same label (the CTC and HMM topologies) the nodes are
    the states. Otherwise (the modified CTC topology: its blank state is entered under the blank
    and under a token) each group ``(destination, label)`` is a node, and each state gets a copy
    node with no label and no incoming arc that holds the start distribution and the leak's
    ``init`` mass: an arc ``a`` of group ``g`` then comes from every node standing for its source
    state (the groups entering it and its copy). Every path of the graph is one path of nodes with
    the same labels and weight, so ``log Z`` and its gradient are unchanged.
    """

    def __init__(self, graph: Any) -> None:
        S, G = graph.num_states, graph.num_groups
        arc_group = np.repeat(np.arange(G), np.diff(graph.group_off))
        src = graph.fwd_src.astype(np.int64)
        gd = graph.group_dst.astype(np.int64)
        p = graph.fwd_prob
        init = graph.leak_distribution()
        self.split = bool(len(gd) and np.any(gd[1:] == gd[:-1]))  # groups are sorted by (destination, label)
        if not self.split:
            N = S
            self.lab = np.full(S, -1, dtype=np.int64)
            self.lab[gd] = graph.group_label
            rows, cols, vals = gd[arc_group], src, p
            state_of = np.arange(S)
            copy = np.arange(S)
        else:
            N = G + S
            self.lab = np.concatenate([graph.group_label.astype(np.int64), np.full(S, -1)])
            off = graph.state_off.astype(np.int64)
            k = off[src + 1] - off[src]  # groups entering each arc's source state
            rep = np.repeat(np.arange(len(src)), k)
            first = np.repeat(np.cumsum(k) - k, k)
            pred = off[src][rep] + (np.arange(len(rep)) - first)
            rows = np.concatenate([arc_group[rep], arc_group])
            cols = np.concatenate([pred, G + src])
            vals = np.concatenate([p[rep], p])
            state_of = np.concatenate([gd, np.arange(S)])
            copy = G + np.arange(S)
        self.num_nodes = N
        self.rows, self.cols, self.vals = rows, cols, vals
        self.start = np.zeros(N)
        if len(graph.start):
            self.start[copy[graph.start]] = 1.0 / len(graph.start)
        acc = np.zeros(S)
        acc[graph.accept] = 1.0
        self.accept = acc[state_of]
        self.init = np.zeros(N)
        self.init[copy] = init
        self.leak_in = np.bincount(rows, weights=vals * self.init[cols], minlength=N)  # each arc once: via the copy
        ins = np.bincount(rows, minlength=N)
        outs = np.bincount(cols, minlength=N)
        self.degree = int(max(ins.max(initial=0), outs.max(initial=0)))


def _nodes(graph: Any) -> _Nodes:
    """The kernels' node view of a compiled shared graph, cached on it."""
    hit = graph._device.get("triton/nodes")
    if hit is None:
        hit = graph._device["triton/nodes"] = _Nodes(graph)
    return hit


def supports(graph: Any, need_w: bool = False) -> bool:
    """Whether these kernels score ``graph`` (a :class:`~lightning_gtn.core.shared_graph.SharedGraph`):
    Triton importable, at most ``MAX_NODES`` nodes (states, or groups + states when a state is
    entered under two labels: see :class:`_Nodes`), padded tables of at most ``MAX_TABLE`` entries,
    no arc-weight gradient."""
    if not available() or need_w or graph.num_states == 0 or graph.num_states > MAX_NODES:
        return False
    nd = _nodes(graph)
    return nd.num_nodes <= MAX_NODES and nd.num_nodes * max(1, nd.degree) <= MAX_TABLE


def _padded(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, S: int) -> Tuple[np.ndarray, np.ndarray, int]:
    """``(S, K)`` tables of ``cols`` (-1 padded) and ``vals`` (0 padded) per row, ``K`` >= 1."""
    order = np.argsort(rows, kind="stable")
    rows, cols, vals = rows[order], cols[order], vals[order]
    counts = np.bincount(rows, minlength=S)
    K = max(1, int(counts.max(initial=0)))
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(len(rows)) - first[rows]
    ct = np.full((S, K), -1, dtype=np.int32)
    vt = np.zeros((S, K), dtype=np.float64)
    ct[rows, pos] = cols
    vt[rows, pos] = vals
    return ct, vt, K


def _tables(graph: Any, device: torch.device, dtype: torch.dtype) -> dict:
    """Device tables of a compiled shared graph's nodes, cached on it per (device, dtype)."""
    key = f"triton/{device}/{dtype}"
    hit = graph._device.get(key)
    if hit is not None:
        return hit
    nd = _nodes(graph)
    N = nd.num_nodes
    in_src, in_p, k_in = _padded(nd.rows, nd.cols, nd.vals, N)
    out_dst, out_p, k_out = _padded(nd.cols, nd.rows, nd.vals, N)

    def f(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    def i(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device=device)

    t = dict(
        N=N,
        lab=i(np.maximum(nd.lab, 0)),
        has=i(nd.lab >= 0),
        in_src=i(in_src),
        in_p=f(in_p),
        k_in=k_in,
        out_dst=i(out_dst),
        out_p=f(out_p),
        k_out=k_out,
        init=f(nd.init),
        leak_in=f(nd.leak_in),
        start=f(nd.start),
        accept=f(nd.accept),
    )
    graph._device[key] = t
    return t


def _blocks(S: int, K: int) -> Tuple[int, int, int]:
    """``(BLOCK_S, BLOCK_K, num_warps)`` for states of up to ``K`` arcs."""
    bs = triton.next_power_of_2(S)
    bk = max(1, min(triton.next_power_of_2(K), MAX_TILE // bs))
    return bs, bk, 4 if bs * bk <= 1024 else 8


@torch.no_grad()
def shared_scores(
    graph: Any, E: torch.Tensor, lengths: np.ndarray, leaky: float = 0.0, need_e: bool = True
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(logz (B,) float64, d logz[b] / d E[b] (B, T, C) or None)`` of the shared graph against
    every row of ``E`` ``(B, T, C)`` (float32 or float64, on the device the kernels run on), rows
    of ``lengths[b]`` frames. A row with a NaN or ``+inf`` emission in its frames scores NaN (and
    no gradient), as on the CPU. ``graph`` must satisfy :func:`supports`."""
    B, T, C = E.shape
    dev, dt = E.device, E.dtype
    if graph.max_label >= C:
        raise ValueError(f"the denominator's labels must be < C={C}, got {graph.max_label}")
    lens_np = np.asarray(lengths, dtype=np.int64)
    if lens_np.shape != (B,) or np.any(lens_np < 0) or np.any(lens_np > T):
        raise ValueError(f"lengths must be ({B},) in [0, {T}]")
    tb = _tables(graph, dev, dt)
    S = tb["N"]  # nodes: the states, or groups + states (see _Nodes)
    E = E.contiguous()
    lens = torch.from_numpy(lens_np.astype(np.int32)).to(dev)
    frames = torch.arange(T, device=dev)[None, :] < lens.to(torch.int64)[:, None]
    bad = ((torch.isnan(E) | torch.isposinf(E)).any(2) & frames).any(1)
    ns = len(graph.start)
    P = torch.empty((max(B, 1), max(T, 1), S), dtype=dt, device=dev)
    logz = torch.full((max(B, 1),), math.log(ns) if ns else -math.inf, dtype=torch.float64, device=dev)
    gE = torch.zeros_like(E) if need_e else None
    if B == 0:
        return logz[:0], gE
    bs, bk, nw = _blocks(S, tb["k_in"])
    # the leak's vectors are scaled here, in E's dtype (a Python float would reach the kernels as float32)
    leak_in, leak_init = tb["leak_in"] * leaky, tb["init"] * leaky
    _forward_kernel[(B,)](
        E, E.stride(0), E.stride(1), lens, tb["lab"], tb["has"], tb["in_src"], tb["in_p"], leak_in,
        tb["start"], tb["accept"], P, logz, S, tb["k_in"], T,
        BLOCK_S=bs, BLOCK_K=bk, ONE_K=bk >= tb["k_in"], LEAK=leaky > 0, num_warps=nw,
    )  # fmt: skip
    logz = logz + lens.to(torch.float64) * graph.shift
    logz = torch.where(bad, torch.full_like(logz, math.nan), logz)
    if not need_e or gE is None:
        return logz, None
    ok = torch.isfinite(logz).to(torch.int32)
    V = torch.empty((B, S), dtype=dt, device=dev)
    bs, bk, nw = _blocks(S, tb["k_out"])
    _backward_kernel[(B,)](
        E, gE, E.stride(0), E.stride(1), lens, ok, tb["lab"], tb["has"], tb["out_dst"], tb["out_p"],
        leak_init, tb["accept"], P, V, S, tb["k_out"], T,
        BLOCK_S=bs, BLOCK_K=bk, ONE_K=bk >= tb["k_out"], LEAK=leaky > 0, num_warps=nw,
    )  # fmt: skip
    return logz, gE


if triton is not None:

    @triton.jit
    def _emissions(erow, lab, has, nmask):
        """``(exp(E[t, l_d] - m), m)`` per state (0 where the state has no label or E is -inf)."""
        x = tl.load(erow + lab, mask=nmask & (has != 0), other=-float("inf"))
        m = tl.max(x, 0)
        m = tl.where(m == -float("inf"), 0.0, m)
        return tl.where(x == -float("inf"), 0.0, tl.exp(x - m)), m

    @triton.jit
    def _gather(
        vec, src_tab, p_tab, ns, nmask, ks, K, BLOCK_S: tl.constexpr, ONE_K: tl.constexpr, BLOCK_K: tl.constexpr
    ):
        """``sum_k p[d, k] * vec[src[d, k]]`` per state ``d`` of an ``(S, K)`` table."""
        acc = tl.zeros((BLOCK_S,), vec.dtype.element_ty)
        if ONE_K:
            tm = nmask[:, None] & (ks[None, :] < K)
            s = tl.load(src_tab + ns[:, None] * K + ks[None, :], mask=tm, other=-1)
            p = tl.load(p_tab + ns[:, None] * K + ks[None, :], mask=tm, other=0.0)
            acc += tl.sum(p * tl.load(vec + s, mask=s >= 0, other=0.0), 1)
        else:
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + ks
                tm = nmask[:, None] & (kk[None, :] < K)
                s = tl.load(src_tab + ns[:, None] * K + kk[None, :], mask=tm, other=-1)
                p = tl.load(p_tab + ns[:, None] * K + kk[None, :], mask=tm, other=0.0)
                acc += tl.sum(p * tl.load(vec + s, mask=s >= 0, other=0.0), 1)
        return acc

    @triton.jit
    def _row(lab_t, has_t, P, E, sEb, S, T, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
        """This program's row ``b``, the state and arc-slot ranges, the states' labels, and the
        row's bases in ``P`` ``(B, T, S)`` and ``E``."""
        b = tl.program_id(0)
        ns = tl.arange(0, BLOCK_S)
        nmask = ns < S
        lab = tl.load(lab_t + ns, mask=nmask, other=0)
        has = tl.load(has_t + ns, mask=nmask, other=0)
        return b, ns, nmask, tl.arange(0, BLOCK_K), lab, has, P + b.to(tl.int64) * T * S, E + b.to(tl.int64) * sEb

    @triton.jit
    def _forward_kernel(
        E, sEb, sEt, lens, lab_t, has_t, in_src, in_p, leak_in, start, accept, P, logz, S, K, T,
        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ONE_K: tl.constexpr, LEAK: tl.constexpr,
    ):  # fmt: skip
        b, ns, nmask, ks, lab, has, pbase, ebase = _row(lab_t, has_t, P, E, sEb, S, T, BLOCK_S, BLOCK_K)
        L = tl.load(lens + b)
        logs = tl.load(logz + b)
        if LEAK:
            lk = tl.load(leak_in + ns, mask=nmask, other=0.0)  # leaky * c_d
        prev = start
        for t in range(0, L):
            e, m = _emissions(ebase + t * sEt, lab, has, nmask)
            acc = _gather(prev, in_src, in_p, ns, nmask, ks, K, BLOCK_S, ONE_K, BLOCK_K)
            if LEAK:
                acc += tl.where(t > 0, lk, 0.0)
            a = e * acc
            s = tl.sum(a, 0)
            inv = tl.where(s > 0, 1.0 / tl.where(s > 0, s, 1.0), 0.0)
            prev = pbase + t * S
            tl.store(prev + ns, a * inv, mask=nmask)
            logs += tl.where(s > 0, tl.log(tl.where(s > 0, s, 1.0)).to(tl.float64) + m.to(tl.float64), -float("inf"))
            tl.debug_barrier()
        fin = tl.sum(tl.load(prev + ns, mask=nmask, other=0.0) * tl.load(accept + ns, mask=nmask, other=0.0), 0)
        tl.store(logz + b, tl.where(fin > 0, logs + tl.log(tl.where(fin > 0, fin, 1.0)).to(tl.float64), -float("inf")))

    @triton.jit
    def _backward_kernel(
        E, gE, sEb, sEt, lens, ok, lab_t, has_t, out_dst, out_p, init, accept, P, V, S, K, T,
        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, ONE_K: tl.constexpr, LEAK: tl.constexpr,
    ):  # fmt: skip
        b, ns, nmask, ks, lab, has, pbase, ebase = _row(lab_t, has_t, P, E, sEb, S, T, BLOCK_S, BLOCK_K)
        L = tl.where(tl.load(ok + b) != 0, tl.load(lens + b), 0)
        gbase = gE + b.to(tl.int64) * sEb
        vbase = V + b.to(tl.int64) * S
        beta = tl.load(accept + ns, mask=nmask, other=0.0)
        if LEAK:
            ini = tl.load(init + ns, mask=nmask, other=0.0)  # leaky * init
        for i in range(0, L):
            t = L - 1 - i
            q = tl.load(pbase + t * S + ns, mask=nmask, other=0.0) * beta
            z = tl.sum(q, 0)
            post = q * tl.where(z > 0, 1.0 / tl.where(z > 0, z, 1.0), 0.0)
            tl.atomic_add(gbase + t * sEt + lab, post, mask=nmask & (has != 0) & (post != 0), sem="relaxed")
            if t > 0:
                e, m = _emissions(ebase + t * sEt, lab, has, nmask)
                tl.store(vbase + ns, e * beta, mask=nmask)
                tl.debug_barrier()
                bp = _gather(vbase, out_dst, out_p, ns, nmask, ks, K, BLOCK_S, ONE_K, BLOCK_K)
                if LEAK:
                    bp += tl.sum(ini * bp, 0)
                s = tl.sum(bp, 0)
                beta = bp * tl.where(s > 0, 1.0 / tl.where(s > 0, s, 1.0), 0.0)
                tl.debug_barrier()
