"""Dense normalisers as numba kernels, one compiled loop per example (CPU).

* :func:`full_pass`: ASG's fully connected recursion
  (:class:`lightning_gtn.core.normalisers.FullyConnected`). The torch version runs a handful
  of small ops per frame: for alphabets of letters those ops' fixed cost dominates the
  ``C x C`` products. Here each example runs its whole forward and backward in one
  loop, in float64, on the engine's thread pool, and returns exactly what the torch version
  returns (``logz``, the emission occupancies, the factors ``R``, ``L`` of the transition
  gradient), so the callers are unchanged.
* :func:`unigram_pass`: the one-node graph looping on every label with weight ``w[c]``
  (``log Z = sum_t logsumexp_c(E[t, c] + w[c])``), its softmax added into a gradient buffer in
  the same pass (torch needs six passes over ``(B, T, C)`` and as many temporaries).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map

NEG_INF = -math.inf


@njit(cache=True, nogil=True, inline="always")
def _failed(v):
    """log Z of an example whose recursion met ``v`` (a frame maximum that is 0, inf or NaN)."""
    if v != v:
        return math.nan
    return math.inf if v > 1.0 else NEG_INF


@njit(cache=True, nogil=True)
def _dense_kernel(e0, e1, E, tr0, K, KT, r, lens, logz, gE, R, L, need_grad):
    """Examples ``e0 .. e1 - 1``: ``logz[e]`` and, with ``need_grad``, ``gE[e]``, ``R[e]``,
    ``L[e]`` (frames past the example's length are left as they are: zeros).

    ``K[i, j] = exp(trans[i + 1, j] - r[i])`` with ``r[i]`` its row maximum (0 for a row of
    -inf), ``tr0`` the start scores. Scaled forward ``a_t`` (max 1) with a float64 log scale
    ``m_t``, scaled backward ``b_t`` with ``mb_t``; ``Q_t[i] = exp(E[t, i] + r[i] - qm_t)``.
    """
    T = E.shape[1]
    C = E.shape[2]
    a = np.empty((max(T, 1), C))
    Q = np.empty((max(T, 1), C))
    m = np.empty(max(T, 1))
    qm = np.empty(max(T, 1))
    s = np.empty(C)
    u = np.empty(C)
    bb = np.empty(C)
    for e in range(e0, e1):
        n = lens[e]
        if n <= 0:
            logz[e] = NEG_INF
            continue
        mx = NEG_INF
        for i in range(C):
            v = E[e, 0, i] + tr0[i]
            a[0, i] = v
            if not v <= mx:
                mx = v
        if not (mx > NEG_INF and mx < math.inf):
            logz[e] = _failed(0.0 if mx == NEG_INF else mx)
            continue
        for i in range(C):
            a[0, i] = math.exp(a[0, i] - mx)
        m[0] = mx
        bad = 0.0
        ok = True
        for t in range(1, n):
            qmx = NEG_INF
            for i in range(C):
                v = E[e, t, i] + r[i]
                Q[t, i] = v
                if not v <= qmx:
                    qmx = v
            if not (qmx > NEG_INF and qmx < math.inf):
                bad = 0.0 if qmx == NEG_INF else qmx
                ok = False
                break
            for i in range(C):
                Q[t, i] = math.exp(Q[t, i] - qmx)
            qm[t] = qmx
            for i in range(C):
                s[i] = 0.0
            for j in range(C):  # s_i = sum_j a_{t-1}[j] K[i, j]
                aj = a[t - 1, j]
                if aj != 0.0:
                    for i in range(C):
                        s[i] += aj * KT[j, i]
            smax = 0.0
            for i in range(C):
                v = s[i] * Q[t, i]
                s[i] = v
                if not v <= smax:
                    smax = v
            if not (smax > 0.0 and smax < math.inf):
                bad = smax
                ok = False
                break
            inv = 1.0 / smax
            for i in range(C):
                a[t, i] = s[i] * inv
            m[t] = m[t - 1] + qmx + math.log(smax)
        if not ok:
            logz[e] = _failed(bad)
            continue
        z = 0.0
        for i in range(C):
            z += a[n - 1, i]
        lz = m[n - 1] + math.log(z)
        logz[e] = lz
        if not need_grad:
            continue
        for i in range(C):
            bb[i] = 1.0
        mb = 0.0
        for t in range(n - 1, -1, -1):
            f = math.exp(m[t] + mb - lz)
            for i in range(C):
                gE[e, t, i] = a[t, i] * bb[i] * f
            if t == 0:
                break
            fr = math.exp(m[t - 1] + qm[t] + mb - lz)
            for i in range(C):
                u[i] = bb[i] * Q[t, i]
                R[e, t - 1, i] = u[i] * fr
                L[e, t - 1, i] = a[t - 1, i]
                s[i] = 0.0
            for i in range(C):  # s_j = sum_i u_i K[i, j]
                ui = u[i]
                if ui != 0.0:
                    for j in range(C):
                        s[j] += ui * K[i, j]
            smax = 0.0
            for j in range(C):
                if s[j] > smax:
                    smax = s[j]
            if not smax > 0.0:  # every continuation dead: the frames before carry no mass
                for i in range(C):
                    bb[i] = 0.0
                mb = 0.0
                continue
            inv = 1.0 / smax
            for j in range(C):
                bb[j] = s[j] * inv
            mb = mb + qm[t] + math.log(smax)


def run_rows(run, cost: np.ndarray, min_total: float) -> None:
    """Calls ``run(e0, e1)`` over row ranges of about equal total ``cost``, one per thread of the
    engine's pool (one range when the total is below ``min_total``: not worth sharing)."""
    B = len(cost)
    cum = np.cumsum(np.asarray(cost, dtype=np.float64))
    threads = get_num_threads()
    if threads <= 1 or B <= 1 or cum[-1] < min_total:
        run(0, B)
        return
    cuts = sorted({0, B, *[min(B, int(np.searchsorted(cum, cum[-1] * i / threads)) + 1) for i in range(1, threads)]})
    parallel_map(run, cuts[:-1], cuts[1:])


@torch.no_grad()
def full_pass(E: torch.Tensor, tr: torch.Tensor, lens: torch.Tensor, need_grad: bool):
    """As :func:`.dense_torch.full_pass` for CPU tensors (``tr`` already in E's dtype, ``lens``
    int64): ``(logz, gE, (R, L, K))``."""
    B, T, C = E.shape
    dtype = E.dtype
    En = E.detach().contiguous().numpy()
    trn = tr.detach().to(torch.float64).numpy()
    rows = trn[1:]
    r = rows.max(1)
    dead = ~np.isfinite(r) & (r < 0)  # a row of -inf: label i is never entered after frame 0
    r = np.where(dead, 0.0, r)
    with np.errstate(invalid="ignore", over="ignore"):
        Kn = np.ascontiguousarray(np.where(dead[:, None], 0.0, np.exp(rows - r[:, None])))
    KTn = np.ascontiguousarray(Kn.T)
    tr0 = np.ascontiguousarray(trn[0])
    ln = np.ascontiguousarray(lens.detach().cpu().numpy().astype(np.int64))
    if ln.shape != (B,) or (B and (ln.min() < 0 or ln.max() > T)):  # the kernel indexes frames by them
        raise ValueError(f"lengths must be {B} values in [0, {T}], got {ln.tolist()}")
    logz = np.empty(B, dtype=np.float64)
    shape = (B, T, C) if need_grad else (1, 1, 1)
    gE = torch.zeros(shape, dtype=dtype)
    Rt = torch.zeros((B, max(T - 1, 0), C) if need_grad else (1, 1, 1), dtype=dtype)
    Lt = torch.zeros_like(Rt)
    gEn, Rn, Ln = gE.numpy(), Rt.numpy(), Lt.numpy()

    def run(e0, e1):
        _dense_kernel(e0, e1, En, tr0, Kn, KTn, r, ln, logz, gEn, Rn, Ln, need_grad)

    run_rows(run, (np.maximum(ln, 0) + 1) * C * C, 200_000)
    logz_t = torch.from_numpy(logz).to(dtype)
    if not need_grad:
        return logz_t, None, None
    K = torch.from_numpy(Kn).to(dtype)
    return logz_t, gE, ((Rt, Lt, K) if T > 1 else (None, None, K))


@njit(cache=True, nogil=True)
def _unigram_kernel(e0, e1, E, w, lens, logz, gE, psum, need_grad):
    """Rows ``e0 .. e1 - 1``: ``logz[e] = sum_{t < lens[e]} logsumexp_c(E[e, t, c] + w[c])``;
    with ``need_grad`` the softmax of each frame is added to ``gE[e, t]`` and summed over the
    frames into ``psum[e]``. A frame of -inf gives -inf (and no gradient), NaN gives NaN."""
    C = E.shape[2]
    buf = np.empty(C)
    for e in range(e0, e1):
        total = 0.0
        for t in range(lens[e]):
            m = NEG_INF
            for c in range(C):
                v = E[e, t, c] + w[c]
                buf[c] = v
                if not v <= m:
                    m = v
            if not (m > NEG_INF and m < math.inf):
                total += m if m == m else math.nan
                continue
            s = 0.0
            for c in range(C):
                v = math.exp(buf[c] - m)
                buf[c] = v
                s += v
            total += m + math.log(s)
            if need_grad:
                inv = 1.0 / s
                for c in range(C):
                    p = buf[c] * inv
                    gE[e, t, c] += p
                    psum[e, c] += p
        logz[e] = total


#: from this many labels on, the unigram pass runs as torch ops: their vectorised exp beats
#: numba's scalar one (B=32, T=150, 2 cores: C=28 1.1 vs 1.1 ms, C=228 6 vs 13 ms, C=1028 28 vs
#: 51 ms), below it the one pass saves the temporaries
UNIGRAM_TORCH_MIN_CLASSES = 128


def _unigram_torch(E, w, ln, gE, new_buffer):
    """:func:`unigram_pass` by torch ops (any device), one exp per element: ``z = E + w``,
    ``exp(z - max)`` in place, its sums, then the softmax by division."""
    B, T, C = E.shape
    z = E.detach() + w.detach().reshape(-1).to(E.dtype)
    m = z.amax(dim=-1, keepdim=True)  # (B, T, 1)
    fin = torch.isfinite(m)
    all_fin = bool(fin.all())
    if not all_fin:  # dead frames (-inf: sums 0, log -inf), NaN or inf frames propagate through the sums
        m = torch.where(fin, m, torch.zeros_like(m))
    z.sub_(m).exp_()
    sums = z.sum(dim=-1)  # (B, T)
    lse = m.squeeze(-1).to(torch.float64) + torch.log(sums.to(torch.float64))
    valid = torch.arange(T, device=E.device)[None, :] < torch.as_tensor(ln, device=E.device)[:, None]
    logz = torch.where(valid, lse, torch.zeros_like(lse)).sum(1)
    if gE is None and not new_buffer:
        return logz, None
    z.div_(sums.unsqueeze(-1))  # the softmax (NaN in dead frames: zeroed below)
    for b in np.nonzero(ln < T)[0].tolist():  # frames past each length
        z[b, int(ln[b]) :] = 0
    if not all_fin or not bool(torch.isfinite(lse).all()):
        z.masked_fill_(~torch.isfinite(lse).unsqueeze(-1), 0.0)
    psum = z.sum(1).to(torch.float64)
    if new_buffer:
        return logz, psum, z
    gE.add_(z)
    return logz, psum


def unigram_pass(
    E: torch.Tensor, w: torch.Tensor, lens: np.ndarray, gE: Optional[torch.Tensor] = None, new_buffer: bool = False
):
    """``(logz (B,), psum (B, C) or None)`` of the unigram normaliser of emissions ``(B, T, C)``
    with label weights ``w (C,)``; when ``gE`` (a ``(B, T, C)`` buffer) is given, each valid
    frame's softmax is added into it and ``psum[b]`` is its sum over the frames of row b. With
    ``new_buffer`` (and no ``gE``) the softmax goes to a new buffer, returned third:
    ``(logz, psum, buffer)``. One numba pass on the CPU below ``UNIGRAM_TORCH_MIN_CLASSES``
    labels, torch ops from there and on other devices."""
    B, T, C = E.shape
    ln = np.ascontiguousarray(np.asarray(lens, dtype=np.int64))
    if w.numel() != C or ln.shape != (B,) or (B and (ln.min() < 0 or ln.max() > T)):
        raise ValueError(f"unigram_pass: w must be ({C},) and lengths {B} values in [0, {T}]")
    if gE is not None and (
        tuple(gE.shape) != (B, T, C) or not gE.is_contiguous() or gE.dtype != E.dtype or gE.device != E.device
    ):
        raise ValueError(f"unigram_pass: gE must be a contiguous {E.dtype} buffer of shape {(B, T, C)} on {E.device}")
    new_buffer = new_buffer and gE is None
    if E.device.type != "cpu" or C >= UNIGRAM_TORCH_MIN_CLASSES:
        return _unigram_torch(E, w, ln, gE, new_buffer)
    if new_buffer:
        gE = torch.zeros((B, T, C), dtype=E.dtype)
    need_grad = gE is not None
    En = E.detach().contiguous().numpy()
    wn = np.ascontiguousarray(w.detach().to(torch.float64).reshape(-1).numpy())
    logz = np.zeros(B, dtype=np.float64)
    psum = np.zeros((B, C) if need_grad else (1, 1), dtype=np.float64)
    gEn = gE.numpy() if gE is not None else np.zeros((1, 1, 1), dtype=En.dtype)  # need_grad

    def run(e0, e1):
        _unigram_kernel(e0, e1, En, wn, ln, logz, gEn, psum, need_grad)

    run_rows(run, (ln + 1) * C, 200_000)
    if new_buffer:
        return torch.from_numpy(logz), torch.from_numpy(psum), gE
    return torch.from_numpy(logz), (torch.from_numpy(psum) if need_grad else None)
