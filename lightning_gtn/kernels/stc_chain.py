"""STC's criterion graph scored as the chain it is (CPU, numba).

In the STC graph of a target ``y_0 .. y_{L-1}`` (:func:`lightning_gtn.losses.stc.stc_graph`) the three nodes of a
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

from .dense_numba import run_rows

NEG_INF = -math.inf


@njit(cache=True, nogil=True)
def _stc_kernel(e0, e1, X, log_p, eps, tok, tok_off, lens, blank, logz, flag, gX, gp, need_grad, tol):
    """Examples ``e0 .. e1 - 1`` of the raw emissions ``X (B, T, C)``: ``logz[e]`` (log Z of the
    STC graph against the augmented emissions) and, with ``need_grad``, ``gX[e] = -d log Z /
    d X[e]`` and ``gp[e] = -d log Z / d log_p`` (the loss's gradients); ``flag[e] = 1`` when the
    example must be scored by the graph path instead (nothing written to ``gX[e]`` then).

    The star columns are used in the linear domain, scaled like the labels by ``exp(-max_t)``:
    ``star = p * S`` with ``S`` the sum of the non-blank labels' ``P``, ``star except k =
    p * ((1 + eps) * S - P[k])`` (the research code's ``star + log1p(eps - exp(x_k - star))``).
    """
    C = X.shape[2]
    pp = math.exp(log_p)
    for e in range(e0, e1):
        k0 = tok_off[e]
        L = tok_off[e + 1] - k0
        n = lens[e]
        flag[e] = 0
        gp[e] = 0.0
        if n == 0:
            logz[e] = 0.0 if L == 0 else NEG_INF
            continue
        if n < L:  # each token reads its own frame: no path
            logz[e] = NEG_INF
            continue
        U = np.zeros((n + 1, L + 1))
        m = np.zeros(n + 1)
        P = np.empty((n, C))
        Ssum = np.empty(n)
        mxs = np.empty(n)
        U[0, 0] = 1.0
        dead = False
        for t in range(1, n + 1):
            f = t - 1
            mx = NEG_INF
            for c in range(C):
                v = X[e, f, c]
                if not v <= mx:
                    mx = v
            if not (mx > NEG_INF and mx < math.inf):
                dead = True
                if mx == NEG_INF:  # every label -inf (and so every star): no path
                    logz[e] = NEG_INF
                elif mx != mx:
                    logz[e] = math.nan
                else:  # +inf: the graph path decides
                    flag[e] = 1
                break
            S = 0.0
            for c in range(C):
                v = math.exp(X[e, f, c] - mx)
                P[f, c] = v
                if c != blank:
                    S += v
            Ssum[f] = S
            mxs[f] = mx
            pb = P[f, blank]
            vmax = 0.0
            for l in range(L + 1):
                if l == L:
                    ps = pp * S
                else:
                    ps = pp * ((1.0 + eps) * S - P[f, tok[k0 + l]])
                v = U[t - 1, l] * (pb + ps)
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
        if not need_grad:
            continue
        G = np.zeros((n, C))  # d log Z / d X
        occ_not = np.zeros(C)  # per frame: occupancy of "star except k" columns
        beta = np.zeros(L + 1)
        nb = np.empty(L + 1)
        beta[L] = 1.0
        mb = 0.0
        g_lp = 0.0
        ok = True
        for t in range(n, 0, -1):
            f = t - 1
            F = math.exp(m[t - 1] + mxs[f] + mb - lz)
            pb = P[f, blank]
            S = Ssum[f]
            total = 0.0
            gb = 0.0
            o_star = 0.0
            vmax = 0.0
            for l in range(L + 1):
                u = U[t - 1, l] * F
                stay = u * beta[l]
                gb += stay * pb
                if l == L:
                    ps = pp * S
                    o = stay * ps
                    o_star += o
                else:
                    y = tok[k0 + l]
                    ps = pp * ((1.0 + eps) * S - P[f, y])
                    o = stay * ps
                    occ_not[y] += o
                total += stay * pb + o
                v = (pb + ps) * beta[l]
                if l < L:
                    y = tok[k0 + l]
                    adv = u * P[f, y] * beta[l + 1]
                    G[f, y] += adv
                    total += adv
                    v += P[f, y] * beta[l + 1]
                nb[l] = v
                if v > vmax:
                    vmax = v
            if not abs(total - 1.0) <= tol or not vmax > 0.0:
                ok = False
                break
            G[f, blank] += gb
            # the star columns' occupancies, through d log(star) / d x_j = P_j / S and
            # d log(star except k) / d x_j = ((1 + eps) P_j - [j == k] P_k) / ((1 + eps) S - P_k)
            if S > 0.0:
                acc = o_star / S
                for c in range(C):
                    if occ_not[c] != 0.0:
                        acc += (1.0 + eps) * occ_not[c] / ((1.0 + eps) * S - P[f, c])
                for c in range(C):
                    if c != blank:
                        v = acc
                        if occ_not[c] != 0.0:
                            v -= occ_not[c] / ((1.0 + eps) * S - P[f, c])
                        G[f, c] += P[f, c] * v
            g_lp += o_star
            for c in range(C):
                g_lp += occ_not[c]
                occ_not[c] = 0.0
            inv = 1.0 / vmax
            for l in range(L + 1):
                beta[l] = nb[l] * inv
            mb = mb + mxs[f] + math.log(vmax)
        if not ok:
            flag[e] = 1
            continue
        gp[e] = -g_lp
        for f in range(n):
            for c in range(C):
                if G[f, c] != 0.0:
                    gX[e, f, c] = -G[f, c]


TOL = 1e-6


def stc_chain(X: torch.Tensor, log_p: float, eps: float, seqs, lengths: np.ndarray, blank: int, need_grad: bool):
    """``(logz (B,) float64 numpy, flag (B,) numpy, gX (B, T, C) or None, gp (B,) numpy)`` of
    the STC graphs of ``seqs`` against the CPU emissions ``X`` (the star columns computed
    inside); ``gX`` holds ``-d log Z / d X`` and ``gp`` ``-d log Z / d log_p`` of the unflagged
    rows (zeros elsewhere); flagged rows must be scored by the graph path."""
    B, T, C = X.shape
    Xn = X.detach().contiguous().numpy()
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
    gp = np.zeros(B, dtype=np.float64)
    gX = torch.zeros_like(X) if need_grad else torch.zeros((1, 1, 1), dtype=X.dtype)
    gXn = gX.numpy()

    def run(e0, e1):
        _stc_kernel(
            e0, e1, Xn, float(log_p), float(eps), tok, tok_off, ln, int(blank), logz, flag, gXn, gp, need_grad, TOL
        )

    run_rows(run, (ln + 1) * (sizes + 1), 20_000)
    return logz, flag, (gX if need_grad else None), gp
