"""STC's criterion graph scored as the chain it is (CPU, numba).

In the STC graph of a target ``y_0 .. y_{L-1}`` (:func:`.stc.stc_graph`) the three nodes of a
gap ``l`` (the blank ``2l``, the star ``s_l`` and the token node ``2l - 1`` just before it)
are entered from exactly the same nodes: ``2l``, ``s_l`` and ``2l - 1``. So the forward score
of the graph only depends on ``U_t[l] = alpha_t(2l) + alpha_t(s_l) + alpha_t(2l - 1)``, and
``U`` follows a chain of ``L + 1`` states: at each frame state ``l`` stays (reading the blank or
its star column ``sigma_l``) or moves to ``l + 1`` (reading ``y_l``)::

    U_0 = [1, 0, ..., 0]
    U_t[l] = U_{t-1}[l] * (P_t[blank] + P_t[sigma_l]) + U_{t-1}[l - 1] * P_t[y_{l-1}]
    Z = U_T[L]                    (the accepting nodes 2L, s_L and 2L - 1 are gap L's)

with ``P_t = exp(emissions[t])`` of the augmented emissions. Three arcs per gap instead of the
graph's eight, no index tables, and the same numbers: the emission occupancies of the arcs
split the stay term between the blank and the star. The recursion is scaled (max 1 per frame,
float64 log scale); as in the graph kernels, every frame's occupancies must sum to 1, and an
example that fails the check (underflow on extreme inputs) is reported for the graph path.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

NEG_INF = -math.inf


@njit(cache=True, nogil=True)
def _stc_kernel(e0, e1, E, tok, tok_off, lens, blank, C, logz, flag, gE, need_e, tol):
    """Examples ``e0 .. e1 - 1``: ``logz[e]`` (log Z of the STC graph) and, with ``need_e``,
    ``gE[e] = -d log Z / d E[e]`` (the loss's gradient); ``flag[e] = 1`` when the example must be
    scored by the graph path instead (nothing written to ``gE[e]`` then)."""
    T = E.shape[1]
    W = E.shape[2]
    for e in range(e0, e1):
        k0 = tok_off[e]
        L = tok_off[e + 1] - k0
        n = lens[e]
        flag[e] = 0
        if n == 0:
            logz[e] = 0.0 if L == 0 else NEG_INF
            continue
        if n < L:  # each token reads its own frame: no path
            logz[e] = NEG_INF
            continue
        U = np.zeros((n + 1, L + 1))
        m = np.zeros(n + 1)
        P = np.empty((n, W))
        mxs = np.empty(n)
        U[0, 0] = 1.0
        dead = False
        for t in range(1, n + 1):
            f = t - 1
            mx = NEG_INF
            for c in range(W):
                v = E[e, f, c]
                if not v <= mx:
                    mx = v
            if not (mx > NEG_INF and mx < math.inf):
                dead = True
                if mx == NEG_INF:  # every column -inf: no path
                    logz[e] = NEG_INF
                elif mx != mx:
                    logz[e] = math.nan
                else:  # +inf: the graph path decides
                    flag[e] = 1
                break
            for c in range(W):
                P[f, c] = math.exp(E[e, f, c] - mx)
            mxs[f] = mx
            pb = P[f, blank]
            vmax = 0.0
            for l in range(L + 1):
                sig = C + (blank if l == L else tok[k0 + l])
                v = U[t - 1, l] * (pb + P[f, sig])
                if l > 0:
                    v += U[t - 1, l - 1] * P[f, tok[k0 + l - 1]]
                U[t, l] = v
                if v > vmax:
                    vmax = v
            if not (vmax > 0.0 and vmax < math.inf):
                flag[e] = 1  # underflow or overflow: the graph path decides
                dead = True
                break
            inv = 1.0 / vmax
            for l in range(L + 1):
                U[t, l] *= inv
            m[t] = m[t - 1] + mx + math.log(vmax)
        if dead:
            continue
        if not U[n, L] > 0.0:
            flag[e] = 1  # a feasible chain (n >= L, finite emissions) whose end underflowed
            continue
        lz = m[n] + math.log(U[n, L])
        logz[e] = lz
        if not need_e:
            continue
        G = np.zeros((n, W))
        beta = np.zeros(L + 1)
        nb = np.empty(L + 1)
        beta[L] = 1.0
        mb = 0.0
        ok = True
        for t in range(n, 0, -1):
            f = t - 1
            F = math.exp(m[t - 1] + mxs[f] + mb - lz)
            pb = P[f, blank]
            total = 0.0
            gb = 0.0
            vmax = 0.0
            for l in range(L + 1):
                sig = C + (blank if l == L else tok[k0 + l])
                u = U[t - 1, l] * F
                stay = u * beta[l]
                gb += stay * pb
                s_sig = stay * P[f, sig]
                G[f, sig] += s_sig
                total += stay * pb + s_sig
                v = (pb + P[f, sig]) * beta[l]
                if l < L:
                    y = tok[k0 + l]
                    adv = u * P[f, y] * beta[l + 1]
                    G[f, y] += adv
                    total += adv
                    v += P[f, y] * beta[l + 1]
                nb[l] = v
                if v > vmax:
                    vmax = v
            G[f, blank] += gb
            if not abs(total - 1.0) <= tol or not vmax > 0.0:
                ok = False
                break
            inv = 1.0 / vmax
            for l in range(L + 1):
                beta[l] = nb[l] * inv
            mb = mb + mxs[f] + math.log(vmax)
        if not ok:
            flag[e] = 1
            continue
        for f in range(n):
            for c in range(W):
                if G[f, c] != 0.0:
                    gE[e, f, c] = -G[f, c]


TOL = 1e-6


def stc_chain(E: torch.Tensor, seqs, lengths: np.ndarray, blank: int, need_e: bool):
    """``(logz (B,) float64 numpy, flag (B,) numpy, gE (B, T, 2C) or None)`` of the STC graphs of
    ``seqs`` against the augmented CPU emissions ``E``; ``gE`` holds ``-d log Z / d E`` of the
    unflagged rows (zeros elsewhere); flagged rows must be scored by the graph path."""
    B, T, W = E.shape
    C = W // 2
    En = E.detach().contiguous().numpy()
    ln = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
    sizes = np.asarray([len(s) for s in seqs], dtype=np.int64)
    tok_off = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(sizes, out=tok_off[1:])
    tok = np.fromiter((v for s in seqs for v in s), dtype=np.int64, count=int(tok_off[-1]))
    # the kernel indexes columns by these: checked here whatever the caller did
    if ln.shape != (B,) or (B and (ln.min() < 0 or ln.max() > T)):
        raise ValueError(f"lengths must be {B} values in [0, {T}]")
    if len(tok) and (tok.min() < 0 or tok.max() >= C):
        raise ValueError(f"targets: labels must lie in [0, {C})")
    if not 0 <= blank < C:
        raise ValueError(f"blank must lie in [0, {C})")
    logz = np.zeros(B, dtype=np.float64)
    flag = np.zeros(B, dtype=np.int64)
    gE = torch.zeros_like(E) if need_e else torch.zeros((1, 1, 1), dtype=E.dtype)
    gEn = gE.numpy()

    def run(e0, e1):
        _stc_kernel(e0, e1, En, tok, tok_off, ln, int(blank), C, logz, flag, gEn, need_e, TOL)

    threads = get_num_threads()
    work = float(((ln + 1) * (sizes + 1)).sum())
    if threads <= 1 or B <= 1 or work < 20_000:
        run(0, B)
    else:
        cum = np.cumsum((ln + 1) * (sizes + 1))
        cuts = sorted({0, B, *[int(np.searchsorted(cum, cum[-1] * i / threads)) + 1 for i in range(1, threads)]})
        cuts = [c for c in cuts if 0 <= c <= B]
        parallel_map(run, cuts[:-1], cuts[1:])
    return logz, flag, (gE if need_e else None)
