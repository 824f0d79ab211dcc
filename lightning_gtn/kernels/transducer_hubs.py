"""The transducer's numerators scored through their hubs (CPU, numba).

The alignment acceptor of a target (``TransducerGraphs.alignment`` in
:mod:`lightning_gtn.losses.transducer_graphs`) has a token node per lattice arc ``i`` (reading
token ``K[i]`` from grapheme position ``P[i]`` to ``Q[i]``), a blank node per position (unless
``blank="none"``) and a start node; every node that ends at position ``p`` continues into the
same *hub*: the blank of ``p`` and every token starting at ``p``. So a frame of the forward
pass needs, per position, only the sums of the nodes feeding the hub::

    Ab[p] = what feeds the blank of p,   At[p] = what feeds the tokens starting at p
    optional:  Ab[p] = At[p] = start(p = 0) + blank_p + sum_{Q[i] = p} token_i
    none:      At[p] = start(p = 0) + sum_{Q[i] = p} token_i
    forced:    Ab[p] = start(p = 0) + blank_p + sum_{Q[i] = p} token_i,  At[p] = blank_p
    blank_p' = Ab[p] * P[blank],   token_i' = (At[P[i]] + token_i) * P[K[i]]

(tokens loop on themselves), and the backward pass the mirror sums. That is O(nodes) per frame
instead of O(arcs): each position of a word-piece lattice starts many tokens. Every node reads
one label, so the emission occupancies are the nodes' posteriors. The recursion is scaled (max
1 per frame, float64 log scales); every frame's occupancies must sum to 1, and examples that
fail (underflow on extreme inputs) are reported for the graph kernels. ``allow_repeats=False``
with the optional blank has no such hubs and is not handled here.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from numba import njit

from .dense_numba import run_rows

NEG_INF = -math.inf
MODES = {"none": 0, "optional": 1, "forced": 2}


@njit(cache=True, nogil=True)
def _hub_kernel(
    e0, e1, E, wl, lat_off, Lp, Kp, Qp, tlen, lab_off, labs, lens, mode, logz, flag, gE, lsum, need_e, need_l, tol
):
    """Examples (rows) ``e0 .. e1 - 1``: ``logz[e]`` of the numerator, ``gE[e] = -d logZ / d E[e]``
    (with ``need_e``) and ``lsum[e, c]`` = the occupancy of label ``c`` summed over the frames
    (with ``need_l``); ``flag[e] = 1``: left to the graph kernels (nothing written). Label ``c``
    scores ``E[e, t, c] + wl[c]``; the gradient is added to what ``gE`` holds.

    ``labs[lab_off[e] : lab_off[e + 1]]`` are the labels the example reads (its tokens, then the
    blank last); ``Kp`` holds each lattice arc's token as an index into them, so a frame
    exponentiates only those labels."""
    has_blank = mode != 0
    for e in range(e0, e1):
        a0 = lat_off[e]
        nA = lat_off[e + 1] - a0
        L = tlen[e]
        n = lens[e]
        flag[e] = 0
        if n == 0:
            logz[e] = 0.0 if L == 0 else NEG_INF
            continue
        if L > 0 and nA == 0:  # not spelled by the tokens
            logz[e] = NEG_INF
            continue
        l0 = lab_off[e]
        C = lab_off[e + 1] - l0  # the labels read, local ids 0 .. C - 1
        blank = C - 1
        nb = L + 1 if has_blank else 0
        S = nA + nb  # token nodes 0 .. nA - 1, then the blanks
        A = np.zeros((n + 1, S))
        cs = np.zeros(n + 1)
        mxs = np.empty(n)
        Pf = np.empty((n, max(C, 1)))
        Ab = np.zeros(L + 1)
        At = np.zeros(L + 1)
        ok = True
        for t in range(1, n + 1):
            f = t - 1
            mx = NEG_INF
            for c in range(C):
                v = E[e, f, labs[l0 + c]] + wl[labs[l0 + c]]
                if not v <= mx:
                    mx = v
            if not (mx > NEG_INF and mx < math.inf):
                if mx == NEG_INF:
                    logz[e] = NEG_INF
                elif mx != mx:
                    logz[e] = math.nan
                else:
                    flag[e] = 1
                ok = False
                break
            for c in range(C):
                Pf[f, c] = math.exp(E[e, f, labs[l0 + c]] + wl[labs[l0 + c]] - mx)
            mxs[f] = mx
            # the hub sums of frame t - 1
            for p in range(L + 1):
                Ab[p] = 0.0
                At[p] = 0.0
            if t == 1:  # only the start node is alive before the first frame
                if mode == 2:
                    Ab[0] = 1.0
                else:
                    At[0] = 1.0
                    Ab[0] = 1.0
            else:
                for i in range(nA):
                    v = A[t - 1, i]
                    q = Qp[a0 + i]
                    if mode == 2:
                        Ab[q] += v
                    else:
                        At[q] += v
                        Ab[q] += v
                if has_blank:
                    for p in range(L + 1):
                        v = A[t - 1, nA + p]
                        Ab[p] += v
                        At[p] += v
            vmax = 0.0
            for i in range(nA):
                v = (At[Lp[a0 + i]] + A[t - 1, i]) * Pf[f, Kp[a0 + i]]
                A[t, i] = v
                if v > vmax:
                    vmax = v
            if has_blank:
                pb = Pf[f, blank]
                for p in range(L + 1):
                    v = Ab[p] * pb
                    A[t, nA + p] = v
                    if v > vmax:
                        vmax = v
            if not (vmax > 0.0 and vmax < math.inf):
                if vmax == 0.0:  # no node reachable with these frames: no path
                    logz[e] = NEG_INF
                else:
                    flag[e] = 1
                ok = False
                break
            inv = 1.0 / vmax
            for k in range(S):
                A[t, k] *= inv
            cs[t] = cs[t - 1] + mx + math.log(vmax)
        if not ok:
            continue
        z = 0.0
        if mode != 2:
            for i in range(nA):
                if Qp[a0 + i] == L:
                    z += A[n, i]
        if has_blank:
            z += A[n, nA + L]
        if not z > 0.0:
            flag[e] = 1  # a path may have underflowed: the graph kernels decide
            continue
        lz = cs[n] + math.log(z)
        logz[e] = lz
        if not (need_e or need_l):
            continue
        # backward: beta of frame t (emission of t excluded), scaled, with log scale ds
        beta = np.zeros(S)
        Gb = np.zeros(L + 1)
        Gt = np.zeros(L + 1)
        if mode != 2:
            for i in range(nA):
                if Qp[a0 + i] == L:
                    beta[i] = 1.0
        if has_blank:
            beta[nA + L] = 1.0
        ds = 0.0
        G = np.zeros((n, C))
        for t in range(n, 0, -1):
            f = t - 1
            F = math.exp(cs[t] + ds - lz)
            total = 0.0
            for k in range(S):
                o = A[t, k] * beta[k] * F
                if o != 0.0:
                    lab = Kp[a0 + k] if k < nA else blank
                    G[f, lab] += o
                    total += o
            if not abs(total - 1.0) <= tol:
                ok = False
                break
            if t == 1:
                break
            # beta of frame t - 1 from beta of frame t
            for p in range(L + 1):
                Gb[p] = 0.0
                Gt[p] = 0.0
            for i in range(nA):
                Gt[Lp[a0 + i]] += Pf[f, Kp[a0 + i]] * beta[i]
            if has_blank:
                pb = Pf[f, blank]
                for p in range(L + 1):
                    Gb[p] = pb * beta[nA + p]
            bmax = 0.0
            for i in range(nA):
                q = Qp[a0 + i]
                v = Pf[f, Kp[a0 + i]] * beta[i]  # the self-loop
                if mode == 0:
                    v += Gt[q]
                elif mode == 1:
                    v += Gt[q] + Gb[q]
                else:
                    v += Gb[q]
                beta[i] = v
                if v > bmax:
                    bmax = v
            if has_blank:
                for p in range(L + 1):
                    v = Gb[p] + Gt[p]
                    beta[nA + p] = v
                    if v > bmax:
                        bmax = v
            if not bmax > 0.0:
                ok = False
                break
            inv = 1.0 / bmax
            for k in range(S):
                beta[k] *= inv
            ds = ds + mxs[f] + math.log(bmax)
        if not ok:
            flag[e] = 1
            continue
        for f in range(n):
            for c in range(C):
                g = G[f, c]
                if g != 0.0:
                    lab = labs[l0 + c]
                    if need_e:
                        gE[e, f, lab] -= g
                    if need_l:
                        lsum[e, lab] += g


TOL = 1e-6


def numerators(
    E: torch.Tensor,
    lattices,
    lengths: np.ndarray,
    mode: str,
    blank: int,
    need_e: bool,
    need_l: bool,
    w: Optional[torch.Tensor] = None,
    gE: Optional[torch.Tensor] = None,
):
    """``(logz (B,) numpy, flag (B,) numpy, gE (B, T, C) or None, lsum (B, C) numpy or None)`` of
    the numerator graphs given as lattices ``(P, Q, K, L)`` per row (see the module's text),
    against ``E + w`` (``w``: ``(C,)`` label weights, default none); ``gE``, when given, is the
    buffer the gradient is added to (a new zero buffer otherwise)."""
    B, T, C = E.shape
    En = E.detach().contiguous().numpy()
    ln = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
    sizes = np.asarray([len(lat[0]) for lat in lattices], dtype=np.int64)
    lat_off = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(sizes, out=lat_off[1:])
    cat = (
        (lambda k: np.ascontiguousarray(np.concatenate([lat[k] for lat in lattices]), dtype=np.int64))
        if B
        else (lambda k: np.zeros(0, np.int64))
    )
    Pp, Qp, Kp = cat(0), cat(1), cat(2)
    tlen = np.asarray([lat[3] for lat in lattices], dtype=np.int64)
    # the kernel indexes by all of these: checked whatever the caller did
    if ln.shape != (B,) or (B and (ln.min() < 0 or ln.max() > T)):
        raise ValueError(f"lengths must be {B} values in [0, {T}]")
    if len(Kp) and (Kp.min() < 0 or Kp.max() >= C):
        raise ValueError(f"lattice tokens must lie in [0, {C})")
    m = MODES[mode]
    if m != 0 and not 0 <= blank < C:
        raise ValueError(f"blank must lie in [0, {C})")
    # per example: the labels it reads (sorted tokens, then the blank) and its arcs' local ids
    labs_l, koff = [], []
    for lat in lattices:
        u = np.unique(lat[2])
        if m != 0:
            u = np.append(u[u != blank], blank)
        labs_l.append(u)
        koff.append(np.searchsorted(u[:-1] if m != 0 else u, lat[2]))
    lab_off = np.zeros(B + 1, dtype=np.int64)
    np.cumsum([len(u) for u in labs_l], out=lab_off[1:])
    labs = np.ascontiguousarray(np.concatenate(labs_l) if B else np.zeros(0), dtype=np.int64)
    Kloc = np.ascontiguousarray(np.concatenate(koff) if B else np.zeros(0), dtype=np.int64)
    rep = np.repeat(tlen, sizes)
    if len(Pp) and (Pp.min() < 0 or (Qp <= Pp).any() or (Qp > rep).any()):
        raise ValueError("lattice arcs must satisfy 0 <= P < Q <= L")
    logz = np.zeros(B, dtype=np.float64)
    flag = np.zeros(B, dtype=np.int64)
    wl = np.zeros(C) if w is None else np.ascontiguousarray(w.detach().to(torch.float64).reshape(-1).numpy())
    if wl.shape != (C,):
        raise ValueError(f"w must have shape ({C},), got {wl.shape}")
    if gE is not None and (tuple(gE.shape) != (B, T, C) or gE.dtype != E.dtype or not gE.is_contiguous()):
        raise ValueError(f"gE must be a contiguous {E.dtype} tensor of shape {(B, T, C)}")
    if not need_e:
        gE = torch.zeros((1, 1, 1), dtype=E.dtype)
    elif gE is None:
        gE = torch.zeros_like(E)
    lsum = np.zeros((B, C) if need_l else (1, 1), dtype=np.float64)
    gEn = gE.numpy()

    def run(e0, e1):
        _hub_kernel(
            e0,
            e1,
            En,
            wl,
            lat_off,
            Pp,
            Kloc,
            Qp,
            tlen,
            lab_off,
            labs,
            ln,
            m,
            logz,
            flag,
            gEn,
            lsum,
            need_e,
            need_l,
            TOL,
        )

    run_rows(run, (ln + 1) * (sizes + tlen + 2), 20_000)
    return logz, flag, (gE if need_e else None), (lsum if need_l else None)
