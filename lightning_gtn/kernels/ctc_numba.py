"""The CTC loss on dense emissions as numba kernels (CPU), without a criterion graph.

Example ``b`` has ``T = input_lengths[b]`` frames and ``L = target_lengths[b]`` labels
``y_1 .. y_L``; its ``S = 2L + 1`` states are blank, ``y_1``, blank, ``y_2``, ..., ``y_L``, blank
(state ``s`` reads the blank when ``s`` is even, ``y_{(s+1)/2}`` when odd). A path starts in state
0 or 1, moves at each frame to the same state, the next one, or skips a blank between two
distinct labels (``s - 2 -> s`` for an odd ``s`` with ``y`` different from the label two states
back), and ends in state ``S - 1`` or ``S - 2``. The loss is ``-log Z``, ``Z`` the sum over paths
of ``exp`` of the emissions they read; its gradient with respect to the emissions is minus the
state occupancies summed per ``(t, class)``.

:func:`_rows` walks the states frame by frame, one example at a time:

1. A scan of the example's frames for NaN (a NaN emission makes the loss and the row's gradient
   NaN) and the count of repeated neighbours (a target needs ``L + repeats`` frames, else the
   example is infeasible: infinite loss, zero gradient; ``T = 0`` with ``L = 0`` scores 0).
2. The scaled pass: ``exp(emission - frame max)`` of the blank and the ``L`` labels, once per
   frame; alpha and beta in the linear domain in float64, cut into segments of
   :data:`SEGMENT_WIDTH` states, each normalised per frame to a maximum of 1 with its own log
   scale (so nothing is exponentiated per state). The occupancies of every frame must sum to 1
   (every path crosses each frame in one state): an example whose mass underflowed fails that
   check.
3. Examples that fail (and those with infinite emissions) are redone in the log semiring: alpha
   stored, beta walked back, one log-add per transition.

Batch ranges run on the engine's bounded thread pool (the kernels release the GIL, each writes
only its own rows). The kernels index without bounds checks: :func:`ctc_cost_grad` checks every
index they read first.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from numba import njit

from .dense_numba import run_rows
from .logmath import log_add

__all__ = ["ctc_cost_grad", "check_ctc_arrays", "OCCUPANCY_TOL", "SEGMENT_WIDTH"]

NEG_INF = -math.inf

# fast-math flags that keep NaN and inf semantics (no "nnan"/"ninf"): reductions vectorise
_FM = {"reassoc", "contract", "nsz", "arcp"}

#: normalised alpha and beta values below this are set to 0: far below anything that can matter
#: (the occupancy check catches the mass it would drop), and it keeps the recursions off
#: subnormal numbers, whose arithmetic is tens of times slower
FLUSH = 1e-200

#: the largest deviation from 1 of a frame's occupancy sum that the scaled pass accepts
OCCUPANCY_TOL = 1e-6
#: states per log-scale segment of the scaled pass (one scale per frame would underflow on
#: inputs of thousands of frames: alpha peaks far ahead of the states the posterior occupies)
SEGMENT_WIDTH = 32
#: below this much work (state-frames and scanned emissions) a batch runs on one thread
PARALLEL_MIN_WORK = 200_000


@njit(cache=True, nogil=True, inline="always")
def _label(labels, o, s, blank):
    """The class state ``s`` reads: blank for even ``s``, the target's label for odd ``s``."""
    if s % 2 == 0:
        return blank
    return labels[o + (s - 1) // 2]


@njit(cache=True, nogil=True)
def _skips(labels, o, L):
    """``(S,)`` float64: 1 where state ``s`` may be entered from ``s - 2`` (a label state whose
    label differs from the previous label), else 0."""
    S = 2 * L + 1
    sk = np.zeros(S)
    for j in range(1, L):
        if labels[o + j] != labels[o + j - 1]:
            sk[2 * j + 1] = 1.0
    return sk


@njit(cache=True, nogil=True, inline="always")
def _state_row(PS, P, t, L):
    """``PS[s]`` = the entry of ``P[t]`` state ``s`` reads (blank for even ``s``)."""
    pb = P[t, 0]
    for j in range(L):
        PS[2 * j] = pb
        PS[2 * j + 1] = P[t, j + 1]
    PS[2 * L] = pb


@njit(cache=True, nogil=True)
def _fail(b, gE, need_e):
    """``(False, 0.0)`` after zeroing the gradient row the scaled pass may have written."""
    if need_e:
        gE[b, :, :] = 0.0
    return False, 0.0


@njit(cache=True, nogil=True, fastmath=_FM)
def _scaled(b, T, L, o, E, labels, blank, coef, need_e, gE, tol, W, work_a, work_p, work_c):
    """The scaled forward-backward of example ``b``: ``(ok, -log Z)``; with ``need_e`` it adds
    ``-coef * occupancy`` into ``gE[b]`` (only when ``ok``: nothing is written otherwise).

    The states are cut into segments of ``W`` consecutive states, each with its own float64 log
    scale per frame (``alpha_t[s] = A[t, s] * exp(cs[t, s // W])``, beta likewise with ``ds``);
    a dead segment (all zero) has scale ``-inf``. Transitions enter a segment from the one before
    (alpha) or leave to the one after (beta) only at its first or last two states, so the loop
    over the other states has one factor and no branch (LLVM vectorises it). ``W >= 2``.

    ``work_a``, ``work_p``, ``work_c``: flat float64 buffers of at least ``T * S``,
    ``T * (L + 1)`` and ``T * nseg`` values, reused across the examples of a batch range (fresh
    pages for every example cost more than the recursion)."""
    S = 2 * L + 1
    nseg = (S + W - 1) // W
    sk = _skips(labels, o, L)
    P = work_p[: T * (L + 1)].reshape((T, L + 1))  # exp(emission - frame max): blank, labels
    PS = np.empty(S)  # the row of P each state reads, for one frame
    mxs = np.empty(T)
    for t in range(T):
        mx = E[b, t, blank]
        for j in range(L):
            v = E[b, t, labels[o + j]]
            if v > mx:
                mx = v
        if not (mx > NEG_INF and mx < math.inf):
            return False, 0.0
        mxs[t] = mx
        P[t, 0] = math.exp(E[b, t, blank] - mx)
        for j in range(L):
            P[t, j + 1] = math.exp(E[b, t, labels[o + j]] - mx)
    A = work_a[: T * S].reshape((T, S))
    cs = work_c[: T * nseg].reshape((T, nseg))
    for s in range(S):
        A[0, s] = 0.0
    for i in range(nseg):
        cs[0, i] = NEG_INF
    A[0, 0] = P[0, 0]
    m = A[0, 0]
    if L > 0:
        A[0, 1] = P[0, 1]
        m = max(m, A[0, 1])
    if not m > 0.0:
        return False, 0.0
    for s in range(min(S, 2)):
        A[0, s] /= m
    cs[0, 0] = mxs[0] + math.log(m)
    for t in range(1, T):
        p = t - 1
        _state_row(PS, P, t, L)
        alive = False
        for i in range(nseg):
            s0 = i * W
            s1 = min(S, s0 + W)
            ci = cs[p, i]
            cp = cs[p, i - 1] if i > 0 else NEG_INF
            ref = max(ci, cp)
            cs[t, i] = NEG_INF
            if ref == NEG_INF:  # nothing reaches this segment yet
                for s in range(s0, s1):
                    A[t, s] = 0.0
                continue
            fi = math.exp(ci - ref)
            fp = math.exp(cp - ref)
            # the first two states may read the segment before
            v0 = A[p, s0] * fi
            if s0 >= 1:
                v0 += A[p, s0 - 1] * fp
            if s0 >= 2 and sk[s0] > 0.0:
                v0 += A[p, s0 - 2] * fp
            v0 *= PS[s0]
            A[t, s0] = v0
            m = v0
            if s0 + 1 < s1:
                s = s0 + 1
                v1 = A[p, s] * fi + A[p, s0] * fi
                if s0 >= 1 and sk[s] > 0.0:
                    v1 += A[p, s0 - 1] * fp
                v1 *= PS[s]
                A[t, s] = v1
                if v1 > m:
                    m = v1
            for s in range(s0 + 2, s1):
                v = (A[p, s] + A[p, s - 1] + sk[s] * A[p, s - 2]) * (fi * PS[s])
                A[t, s] = v
                m = v if v > m else m
            if m > 0.0:
                inv = 1.0 / m
                for s in range(s0, s1):
                    a = A[t, s] * inv
                    A[t, s] = a if a >= FLUSH else 0.0
                cs[t, i] = ref + mxs[t] + math.log(m)
                alive = True
        if not alive:
            return False, 0.0
    last = T - 1
    lz = NEG_INF
    for s in range(max(0, S - 2), S):
        if A[last, s] > 0.0:
            lz = log_add(lz, cs[last, s // W] + math.log(A[last, s]))
    if not lz > NEG_INF:
        return False, 0.0
    # backward: beta_t[s] = Bv[s] * exp(ds[s // W]); occupancy alpha_t[s] * beta_t[s] / Z
    Bv = np.zeros(S)
    Q = np.zeros(S + 2)
    sk2 = np.zeros(S + 2)
    sk2[:S] = sk
    ds = np.full(nseg, NEG_INF)
    nds = np.empty(nseg)
    oc = np.empty(S)
    c = -coef[b]
    for s in range(max(0, S - 2), S):
        Bv[s] = 1.0
        ds[s // W] = 0.0
    for t in range(T - 1, -1, -1):
        total = 0.0
        for i in range(nseg):
            s0 = i * W
            s1 = min(S, s0 + W)
            f = math.exp(cs[t, i] + ds[i] - lz)
            for s in range(s0, s1):
                occ = A[t, s] * Bv[s] * f
                oc[s] = occ
                total += occ
        if not abs(total - 1.0) <= tol:
            return _fail(b, gE, need_e)
        if need_e:  # written as it goes; a later failure zeroes the row again
            acc = 0.0
            for j in range(L + 1):
                acc += oc[2 * j]
            gE[b, t, blank] += c * acc
            for j in range(L):
                gE[b, t, labels[o + j]] += c * oc[2 * j + 1]
        if t == 0:
            break
        _state_row(PS, P, t, L)
        for s in range(S):
            Q[s] = Bv[s] * PS[s]
        alive = False
        for i in range(nseg):
            s0 = i * W
            s1 = min(S, s0 + W)
            di = ds[i]
            dn = ds[i + 1] if i + 1 < nseg else NEG_INF
            ref = max(di, dn)
            nds[i] = NEG_INF
            if ref == NEG_INF:
                for s in range(s0, s1):
                    Bv[s] = 0.0
                continue
            fi = math.exp(di - ref)
            fn = math.exp(dn - ref)
            m = 0.0
            # all but the last two states read only this segment
            for s in range(s0, max(s0, s1 - 2)):
                v = (Q[s] + Q[s + 1] + sk2[s + 2] * Q[s + 2]) * fi
                Bv[s] = v
                m = v if v > m else m
            for s in range(max(s0, s1 - 2), s1):
                v = Q[s] * fi + Q[s + 1] * (fi if s + 1 < s1 else fn)
                if sk2[s + 2] > 0.0:
                    v += Q[s + 2] * (fi if s + 2 < s1 else fn)
                Bv[s] = v
                if v > m:
                    m = v
            if m > 0.0:
                inv = 1.0 / m
                for s in range(s0, s1):
                    a = Bv[s] * inv
                    Bv[s] = a if a >= FLUSH else 0.0
                nds[i] = ref + mxs[t] + math.log(m)
                alive = True
        if not alive:
            return _fail(b, gE, need_e)
        for i in range(nseg):
            ds[i] = nds[i]
    return True, -lz


@njit(cache=True, nogil=True)
def _log_domain(b, T, L, o, E, labels, blank, coef, need_e, gE):
    """The forward-backward of example ``b`` in the log semiring: ``-log Z`` (``inf`` when no
    path has a finite score); with ``need_e`` and a finite ``Z`` it adds ``-coef * occupancy``
    into ``gE[b]``."""
    S = 2 * L + 1
    sk = _skips(labels, o, L)
    la = np.full((T, S), NEG_INF)
    la[0, 0] = E[b, 0, blank]
    if L > 0:
        la[0, 1] = E[b, 0, labels[o]]
    for t in range(1, T):
        for s in range(S):
            v = la[t - 1, s]
            if s >= 1:
                v = log_add(v, la[t - 1, s - 1])
            if s >= 2 and sk[s] > 0.0:
                v = log_add(v, la[t - 1, s - 2])
            la[t, s] = v + E[b, t, _label(labels, o, s, blank)] if v > NEG_INF else NEG_INF
    lz = la[T - 1, S - 1]
    if L > 0:
        lz = log_add(lz, la[T - 1, S - 2])
    if not lz > NEG_INF:
        return math.inf
    if not need_e or not lz < math.inf:
        return -lz
    lb = np.full(S, NEG_INF)
    nb = np.empty(S)
    lb[S - 1] = 0.0
    if L > 0:
        lb[S - 2] = 0.0
    c = -coef[b]
    for t in range(T - 1, -1, -1):
        for s in range(S):
            v = la[t, s] + lb[s]
            if v > NEG_INF:
                gE[b, t, _label(labels, o, s, blank)] += c * math.exp(v - lz)
        if t == 0:
            break
        for s in range(S):
            v = NEG_INF
            for d in range(3):
                n = s + d
                if n >= S or (d == 2 and not sk[n] > 0.0):
                    continue
                if lb[n] > NEG_INF:
                    v = log_add(v, lb[n] + E[b, t, _label(labels, o, n, blank)])
            nb[s] = v
        for s in range(S):
            lb[s] = nb[s]
    return -lz


@njit(cache=True, nogil=True)
def _has_nan(Eb, T):
    """Whether the first ``T`` frames of one example's ``(T_max, C)`` emissions hold a NaN (a
    count without early exit, which LLVM vectorises)."""
    flat = Eb.reshape(-1)
    n = 0
    for k in range(T * Eb.shape[1]):
        v = flat[k]
        n += v != v
    return n > 0


@njit(cache=True, nogil=True)
def _rows(b0, b1, E, labels, offsets, tlen, ilen, blank, coef, need_e, losses, gE, tol, width):
    """Losses (and gradients) of examples ``b0 .. b1 - 1`` into ``losses`` and ``gE`` (whose rows
    it zeroes first)."""
    na = npn = nc = 1
    for b in range(b0, b1):  # the scaled pass's buffers, once for the whole range
        S = 2 * tlen[b] + 1
        na = max(na, ilen[b] * S)
        npn = max(npn, ilen[b] * (tlen[b] + 1))
        nc = max(nc, ilen[b] * ((S + width - 1) // width))
    work_a = np.empty(na)
    work_p = np.empty(npn)
    work_c = np.empty(nc)
    for b in range(b0, b1):
        T = ilen[b]
        L = tlen[b]
        o = offsets[b]
        if need_e:
            gE[b, :, :] = 0.0  # the buffer is not initialised: each row zeroed by its own thread
        if _has_nan(E[b], T):
            losses[b] = math.nan
            if need_e:
                gE[b, :, :] = math.nan
            continue
        rep = 0
        for j in range(1, L):
            if labels[o + j] == labels[o + j - 1]:
                rep += 1
        if T < L + rep:
            losses[b] = math.inf
            continue
        if T == 0:  # L == 0: the empty path
            losses[b] = 0.0
            continue
        ok, loss = _scaled(b, T, L, o, E, labels, blank, coef, need_e, gE, tol, width, work_a, work_p, work_c)
        if not ok:
            loss = _log_domain(b, T, L, o, E, labels, blank, coef, need_e, gE)
        losses[b] = loss


@njit(cache=True, nogil=True)
def _first_bad(labels, offsets, tlen, ilen, T, C, blank, stride):
    """0 when every index :func:`_rows` reads lies in range and every target label is a class
    other than ``blank``, else a code > 0 (which check failed)."""
    n = len(labels)
    for b in range(len(ilen)):
        if ilen[b] < 0 or ilen[b] > T:
            return 1
        L = tlen[b]
        o = offsets[b]
        if L < 0 or o < 0 or o + L > n or (stride >= 0 and L > stride):
            return 2
        for j in range(o, o + L):
            v = labels[j]
            if v < 0 or v >= C or v == blank:
                return 3
    return 0


def check_ctc_arrays(
    E: torch.Tensor,
    labels: np.ndarray,
    offsets: np.ndarray,
    target_lengths: np.ndarray,
    input_lengths: np.ndarray,
    blank: int,
    stride: int = -1,
) -> None:
    """ValueError unless every index :func:`_rows` reads lies in range: ``E`` a C-contiguous
    ``(B, T, C)`` float32/float64 CPU tensor, ``blank`` in ``[0, C)``, ``0 <= input_lengths <=
    T``, ``0 <= target_lengths`` (``<= stride`` when ``stride >= 0``: padded targets),
    ``offsets[b] + target_lengths[b] <= len(labels)``, and each target's labels in ``[0, C)``,
    never ``blank`` (int64 host arrays: ``labels`` 1-D, the others ``(B,)``)."""
    if E.dim() != 3 or E.dtype not in (torch.float32, torch.float64) or E.device.type != "cpu":
        raise ValueError(
            f"ctc kernel: emissions must be a (B, T, C) float32/float64 CPU tensor, got {E.dtype} {tuple(E.shape)}"
        )
    if not E.is_contiguous():
        raise ValueError("ctc kernel: emissions must be contiguous")
    B, T, C = E.shape
    for name, a in (("offsets", offsets), ("target_lengths", target_lengths), ("input_lengths", input_lengths)):
        if not (isinstance(a, np.ndarray) and a.dtype == np.int64 and a.shape == (B,)):
            raise ValueError(f"ctc kernel: {name} must be an int64 array of shape ({B},)")
    if not (isinstance(labels, np.ndarray) and labels.dtype == np.int64 and labels.ndim == 1):
        raise ValueError("ctc kernel: labels must be a 1-D int64 array")
    if not 0 <= int(blank) < C:
        raise ValueError(f"ctc kernel: blank must lie in [0, {C}), got {blank}")
    code = _first_bad(labels, offsets, target_lengths, input_lengths, T, C, int(blank), int(stride))
    if code:
        what = ("", f"input lengths must lie in [0, {T}]", "target offsets and lengths out of range")
        raise ValueError(
            "ctc kernel: " + (what[code] if code < 3 else f"target labels must lie in [0, {C}) and differ from blank")
        )


def ctc_cost_grad(
    E: torch.Tensor,
    labels: np.ndarray,
    offsets: np.ndarray,
    target_lengths: np.ndarray,
    input_lengths: np.ndarray,
    blank: int,
    coef: Optional[np.ndarray],
    need_e: bool,
    stride: int = -1,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """CTC losses of a batch and, with ``need_e``, their scaled gradients.

    Args:
        E: ``(B, T, C)`` float32/float64 contiguous CPU emissions (log-probabilities or any
            scores).
        labels: 1-D int64 labels; example ``b``'s target is
            ``labels[offsets[b] : offsets[b] + target_lengths[b]]`` (padded targets flattened
            with ``offsets = arange(B) * S``, or concatenated ones with their cumulative offsets).
        offsets, target_lengths, input_lengths: ``(B,)`` int64.
        blank: the blank class.
        coef: ``(B,)`` float64 factors of each row's gradient (the reduction's), None for ones.
        need_e: also compute the gradient.
        stride: the padded targets' row length ``S`` (each target length must be ``<= S``), or -1.

    Returns:
        ``(losses (B,) float64, grad (B, T, C) in E's dtype or None)``: ``grad[b]`` is
        ``coef[b] * d losses[b] / d E[b]``; infeasible examples give ``inf`` and a zero
        gradient, examples with a NaN emission within their length NaN and a NaN gradient row.

    Raises:
        ValueError: from :func:`check_ctc_arrays`, before anything is computed.
    """
    check_ctc_arrays(E, labels, offsets, target_lengths, input_lengths, blank, stride)
    B, T, C = E.shape
    if coef is None:
        coef = np.ones(B)
    coef = np.ascontiguousarray(coef, dtype=np.float64)
    if coef.shape != (B,):
        raise ValueError(f"ctc kernel: coef must have shape ({B},)")
    losses = np.zeros(B)
    gE = torch.empty_like(E) if need_e else torch.zeros((1, 1, 1), dtype=E.dtype)  # rows zeroed by _rows
    En = E.detach().numpy()
    gEn = gE.numpy()
    blank = int(blank)

    def run(b0, b1):
        _rows(
            b0,
            b1,
            En,
            labels,
            offsets,
            target_lengths,
            input_lengths,
            blank,
            coef,
            need_e,
            losses,
            gEn,
            OCCUPANCY_TOL,
            SEGMENT_WIDTH,
        )

    run_rows(run, input_lengths * (2 * target_lengths + 1 + C), PARALLEL_MIN_WORK)
    return torch.from_numpy(losses), (gE if need_e else None)
