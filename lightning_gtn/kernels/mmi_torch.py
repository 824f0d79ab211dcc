"""The shared-graph recursion of :mod:`.mmi_numba` in torch ops, for tensors on any device
(CUDA's path; tested on the CPU against the numba kernel).

Per frame, two sparse-dense products: ``u = alpha @ M`` (``M`` the ``(S, G)`` arc-probability
matrix from source states to groups) and ``alpha' = (e[:, labels] * u) @ D`` (``D`` the ``(G, S)``
0/1 matrix of group destinations), then the same per-frame rescaling and leaky HMM as the numba
kernel. The backward runs the transposed products in reverse. The group sums ``u`` of every frame
are kept (``(T, B, G)``: O(B * states) per frame), and the state distributions too when the
arc-weight gradient is asked for.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np
import torch

__all__ = ["shared_scores"]


def _tables(graph: Any, device: torch.device, dtype: torch.dtype):
    """Device tensors of a compiled shared graph, cached on it per (device, dtype)."""
    key = f"{device}/{dtype}"
    hit = graph._device.get(key)
    if hit is not None:
        return hit
    S, G, A = graph.num_states, graph.num_groups, graph.num_arcs
    arc_group = np.repeat(np.arange(G), np.diff(graph.group_off))
    src = torch.from_numpy(graph.fwd_src.astype(np.int64))
    grp = torch.from_numpy(arc_group.astype(np.int64))
    p = torch.from_numpy(graph.fwd_prob)
    M = torch.sparse_coo_tensor(
        torch.stack([grp, src]), p, (G, S), check_invariants=True
    ).coalesce()  # u^T = M @ alpha^T
    Mt = torch.sparse_coo_tensor(
        torch.stack([src, grp]), p, (S, G), check_invariants=True
    ).coalesce()  # beta^T = Mt @ v^T
    gd = torch.from_numpy(graph.group_dst.astype(np.int64))
    D = torch.sparse_coo_tensor(
        torch.stack([gd, torch.arange(G)]), torch.ones(G, dtype=torch.float64), (S, G), check_invariants=True
    ).coalesce()  # alpha'^T = D @ (e u)^T
    t = dict(
        M=M.to(device=device, dtype=dtype),
        Mt=Mt.to(device=device, dtype=dtype),
        D=D.to(device=device, dtype=dtype),
        gl=torch.from_numpy(graph.group_label.astype(np.int64)).to(device),
        gd=gd.to(device),
        src=src.to(device),
        grp=grp.to(device),
        p=p.to(device=device, dtype=dtype),
        arc=torch.from_numpy(graph.fwd_arc.astype(np.int64)).to(device),
        start=torch.from_numpy(graph.start.astype(np.int64)).to(device),
        accept=torch.from_numpy(graph.accept.astype(np.int64)).to(device),
        A=A,
    )
    graph._device[key] = t
    return t


def _emissions(Et: torch.Tensor):
    """``(e, m, bad)``: ``exp(E - max)``, the max (0 where no class is finite), rows with NaN/+inf."""
    bad = torch.isnan(Et).any(1) | torch.isposinf(Et).any(1)
    m = Et.max(1).values
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(Et - m[:, None])
    e = torch.where(bad[:, None] | torch.isnan(e), torch.zeros_like(e), e)
    return e, m, bad


@torch.no_grad()
def shared_scores(
    graph: Any,
    E: torch.Tensor,
    lengths: np.ndarray,
    leaky: float = 0.0,
    need_e: bool = True,
    need_w: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """As :func:`.mmi_numba.shared_scores` for a tensor ``E`` ``(B, T, C)`` on any device:
    ``(logz (B,) float64, grad_E (B, T, C) or None, grad_w (B, num_arcs) float64 or None)``.

    Half-precision emissions are scored in float32 (the gradient is returned in their dtype), and
    autocast is off inside: under ``precision="bf16-mixed"`` it would otherwise run the sparse
    products in bfloat16, which CUDA's sparse kernels refuse and which would lose the sums' precision."""
    if E.dtype in (torch.float16, torch.bfloat16):
        logz, gE, gW = shared_scores(graph, E.float(), lengths, leaky, need_e, need_w)
        return logz, (gE.to(E.dtype) if gE is not None else None), gW
    if torch.is_autocast_enabled(E.device.type):
        with torch.autocast(E.device.type, enabled=False):
            return shared_scores(graph, E, lengths, leaky, need_e, need_w)
    B, T, C = E.shape
    dev, dt = E.device, E.dtype
    S, G = graph.num_states, graph.num_groups
    if graph.max_label >= C or np.any(np.asarray(lengths) > T) or np.any(np.asarray(lengths) < 0):
        raise ValueError(f"labels must be < C={C} and lengths in [0, {T}]")
    tb = _tables(graph, dev, dt)
    lens = torch.as_tensor(np.asarray(lengths, dtype=np.int64), device=dev)
    Tm = int(lens.max()) if B else 0
    leak = torch.as_tensor(graph.leak_distribution() if leaky > 0 else np.zeros(S), device=dev, dtype=dt)
    alpha = torch.zeros(B, S, dtype=dt, device=dev)
    ns = len(graph.start)
    logs = torch.full((B,), math.log(ns) if ns else -math.inf, dtype=torch.float64, device=dev)
    if ns:
        alpha[:, tb["start"]] = 1.0 / ns
    bad_all = torch.zeros(B, dtype=torch.bool, device=dev)
    keep = need_e or need_w
    U = torch.zeros((Tm if keep else 0, B, G), dtype=dt, device=dev)
    AS = torch.zeros((Tm if need_w else 0, B, S), dtype=dt, device=dev)
    for t in range(Tm):
        act = lens > t
        e, m, bad = _emissions(E[:, t])
        bad_all |= bad & act
        if need_w:
            AS[t] = alpha
        u = torch.sparse.mm(tb["M"], alpha.T).T  # (B, G)
        if keep:
            U[t] = u
        an = torch.sparse.mm(tb["D"], (e[:, tb["gl"]] * u).T).T  # (B, S)
        tot = an.sum(1).to(torch.float64)
        live = tot > 0
        inv = torch.where(live, 1.0 / torch.where(live, tot, torch.ones_like(tot)), torch.zeros_like(tot))
        an = an * inv.to(dt)[:, None]
        new_logs = torch.where(live, logs + m.to(torch.float64) + torch.log(torch.where(live, tot, 1.0)), -math.inf)
        if leaky > 0:
            more = (lens > t + 1) & live
            an = an + torch.where(more[:, None], leaky * leak[None, :], torch.zeros_like(an))
        alpha = torch.where(act[:, None], an, alpha)
        logs = torch.where(act, new_logs, logs)
    fin = alpha[:, tb["accept"]].sum(1).to(torch.float64) if len(graph.accept) else torch.zeros(B, device=dev)
    logz = torch.where(fin > 0, logs + torch.log(torch.where(fin > 0, fin, 1.0)), -math.inf)
    logz = logz + lens.to(torch.float64) * graph.shift
    logz = torch.where(bad_all, torch.full_like(logz, math.nan), logz)
    if not keep:
        return logz, None, None
    ok = torch.isfinite(logz)
    gE = torch.zeros((B, T, C), dtype=dt, device=dev) if need_e else None
    gW = torch.zeros((B, tb["A"]), dtype=torch.float64, device=dev) if need_w else None
    beta = torch.zeros(B, S, dtype=dt, device=dev)
    fin_ind = torch.zeros(S, dtype=dt, device=dev)
    fin_ind[tb["accept"]] = 1.0
    for t in range(Tm - 1, -1, -1):
        act = (lens > t) & ok
        beta = torch.where((lens == t + 1)[:, None], fin_ind[None, :], beta)
        e, _, _ = _emissions(E[:, t])
        v = e[:, tb["gl"]] * beta[:, tb["gd"]]  # (B, G)
        uv = U[t] * v
        z = uv.sum(1)
        zi = torch.where(act & (z > 0), 1.0 / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(z))
        if need_e and gE is not None:
            gE[:, t] = torch.zeros(B, C, dtype=dt, device=dev).index_add_(1, tb["gl"], uv * zi[:, None])
        if need_w and gW is not None:
            contrib = AS[t][:, tb["src"]] * tb["p"][None, :] * v[:, tb["grp"]] * zi[:, None]
            gW[:, tb["arc"]] += contrib.to(torch.float64)
        if t == 0:
            break
        bp = torch.sparse.mm(tb["Mt"], v.T).T  # (B, S)
        if leaky > 0:
            bp = bp + leaky * (bp @ leak)[:, None]
        s = bp.sum(1)
        bp = bp * torch.where(s > 0, 1.0 / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))[:, None]
        beta = torch.where((lens > t)[:, None], bp, beta)
    return logz, gE, gW
