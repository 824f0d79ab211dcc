"""One transducer lattice whose arcs advance time by a duration, as a numba kernel (CPU).

The lattice of an example with ``T`` frames and ``U`` target labels has the nodes ``(t, u)``,
``0 <= t < T``, ``0 <= u <= U``, and reads the joiner output ``x[t, u, :]`` at node ``(t, u)``.
Every arc leaving ``(t, u)`` is one of

* a *token arc* ``k``: emits the next label ``y[u]`` (``u < U``) and goes to
  ``(t + tok_dur[k], u + 1)``;
* a *blank arc* ``k``: emits the class ``blank_ids[k]`` and goes to ``(t + blank_dur[k], u)``
  (``blank_dur[k] >= 1``).

An arc's score is the label's log-probability (the log-softmax of ``x[t, u, :K]``, minus
``sigma``) plus, when its duration index ``*_didx[k] >= 0``, the log-probability of that duration
(the log-softmax of ``x[t, u, K:K + D]``). A path ends with a blank arc from ``(t, U)`` that lands
exactly on ``t + d == T``; a token arc landing on or after ``T`` ends nothing. This covers

* regular RNN-T: one token arc of duration 0, one blank arc of duration 1, no duration logits;
* multi-blank RNN-T (Xu et al., 2022): more blank arcs ("big blanks") with longer durations;
* TDT (token-and-duration transducer, Xu et al., 2023): a token arc per duration and a blank arc
  per positive duration, each adding the duration's log-probability.

:func:`lattice_loss` computes ``-log`` of the total score of the complete paths of every example
and, in the same call, its gradient with respect to ``x``, in three passes (the log-softmax fused:
the normalisers of a node are computed once, the gradient is written straight into one buffer,
scaled per example by the reduction's coefficient):

1. :func:`_arc_rows` (threads over ``(e, t)`` rows): each node's normalisers and the score of
   each of its arcs, one ``(T + 1, U + 1)`` plane per arc kind;
2. the engine's shared lattice, :func:`.transducer_lattice_numba.lattice_examples` (threads over
   examples): token arcs ``(tok_dur[k], 1)`` then blank arcs ``(blank_dur[k], 0)``, ending at
   ``(T, U)``; forward and backward variables in log space, in float64; the arc posteriors;
3. :func:`_grad_rows` (threads over rows): the gradient of each node from its arcs' posteriors
   (FastEmit scales the token arcs' there).

:func:`lattice_viterbi` runs pass 1, then the shared lattice in the max semiring (the best path,
from back pointers) and in the log semiring (the posteriors of that path's arcs): forced
alignment for TDT and multi-blank RNN-T.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map
from .rnnt_viterbi import _check
from .transducer_lattice_numba import LOG, MAX, POST_ALL, POST_MARKED, POST_NONE, lattice_examples

__all__ = ["lattice_loss", "lattice_viterbi", "viterbi_inputs", "Arcs"]

NEG_INF = -math.inf
_NO_PATH = np.zeros((1, 1, 3), dtype=np.int64)  # the max semiring's outputs, unused by the loss
_NO_LEN = np.zeros(1, dtype=np.int64)

#: ``(tok_dur, tok_didx, blank_ids, blank_dur, blank_didx)``: int64 arrays describing the arcs
Arcs = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@njit(cache=True, nogil=True, inline="always")
def _lse_row(x, lo, hi):
    """``logsumexp(x[lo:hi])`` of a 1-D view."""
    m = NEG_INF
    for i in range(lo, hi):
        if x[i] > m:
            m = x[i]
    if m == math.inf:  # the softmax of a +inf logit is undefined: NaN, as torch's log_softmax
        return math.nan
    if m == NEG_INF:
        return m
    s = 0.0
    for i in range(lo, hi):
        s += math.exp(x[i] - m)
    return m + math.log(s)


@njit(cache=True, nogil=True)
def _arc_rows(r0, r1, ex, K, D, arcs, sigma, normalise, lz, dz, sc):
    """Rows ``r = e * T + t`` in ``[r0, r1)`` with ``t < tlen[e]`` (pass 1): the normalisers
    ``lz``, ``dz`` of each node and the arc scores ``sc[k, e, t, u]``, token arcs first (``-inf``,
    as initialised, for a token that would land on or after ``T``), then blank arcs. ``ex`` is
    ``(x, targets, tlen, ulen)``, ``arcs`` the :data:`Arcs`."""
    x, targets, tlen, ulen = ex
    tok_dur, tok_didx, blank_ids, _, blank_didx = arcs
    Tmax = x.shape[1]
    NT = tok_dur.shape[0]
    NB = blank_ids.shape[0]
    for r in range(r0, r1):
        e = r // Tmax
        t = r - e * Tmax
        T = tlen[e]
        if t >= T:
            continue
        U = ulen[e]
        for u in range(U + 1):
            row = x[e, t, u]
            zl = 0.0
            zd = 0.0
            if normalise:
                zl = _lse_row(row, 0, K)
                if D > 0:
                    zd = _lse_row(row, K, K + D)
            lz[e, t, u] = zl
            dz[e, t, u] = zd
            if u < U:
                base = row[targets[e, u]] - zl - sigma
                for k in range(NT):
                    if t + tok_dur[k] < T:
                        v = base
                        if tok_didx[k] >= 0:
                            v += row[K + tok_didx[k]] - zd
                        sc[k, e, t, u] = v
            for k in range(NB):
                v = row[blank_ids[k]] - zl - sigma
                if blank_didx[k] >= 0:
                    v += row[K + blank_didx[k]] - zd
                sc[NT + k, e, t, u] = v


@njit(cache=True, nogil=True)
def _grad_rows(r0, r1, ex, K, D, arcs, normalise, coef, scale, accumulate, ll, lz, dz, post, grad, lam):
    """Rows ``r = e * T + t`` in ``[r0, r1)`` (pass 3): ``grad[e, t] (+)= scale * coef[e] *
    d(-log Z_e)/dx[e, t]`` from the arc posteriors ``post[k, e, t, u]`` (``+=`` with
    ``accumulate``; positions outside the example's lattice are then left alone, else set to 0,
    as are the rows of an example whose total ``ll[e]`` is not finite). ``lam`` is FastEmit's
    weight: every token arc's share of the gradient is scaled by ``1 + lam``. ``ex`` and ``arcs``
    as for :func:`_arc_rows`."""
    x, targets, tlen, ulen = ex
    _, tok_didx, blank_ids, _, blank_didx = arcs
    Tmax = x.shape[1]
    U1max = x.shape[2]
    NT = tok_didx.shape[0]
    NB = blank_ids.shape[0]
    w_tok = 1.0 + lam
    for r in range(r0, r1):
        e = r // Tmax
        t = r - e * Tmax
        T = tlen[e]
        U = ulen[e]
        lle = ll[e]
        dead = t >= T or not (lle > NEG_INF and lle < math.inf)
        g = scale * coef[e]
        for u in range(U1max):
            gr = grad[e, t, u]
            if not accumulate:
                gr[:] = 0.0
            if dead or u > U:
                continue
            occ = 0.0  # the node's occupancy, plus lam times its token arcs' posteriors (FastEmit)
            if u < U:
                for k in range(NT):
                    occ += post[k, e, t, u]
                if lam != 0.0:
                    for k in range(NT):
                        occ += lam * post[k, e, t, u]
            for k in range(NB):
                occ += post[NT + k, e, t, u]
            if occ == 0.0:
                continue
            row = x[e, t, u]
            if normalise:
                lzn = lz[e, t, u]
                for v in range(K):
                    gr[v] += g * occ * math.exp(row[v] - lzn)
                if D > 0:
                    dzn = dz[e, t, u]
                    for i in range(D):
                        gr[K + i] += g * occ * math.exp(row[K + i] - dzn)
            if u < U:
                y = targets[e, u]
                for k in range(NT):
                    p = g * post[k, e, t, u]
                    if lam != 0.0:
                        p *= w_tok
                    gr[y] -= p
                    if tok_didx[k] >= 0:
                        gr[K + tok_didx[k]] -= p
            for k in range(NB):
                p = g * post[NT + k, e, t, u]
                gr[blank_ids[k]] -= p
                if blank_didx[k] >= 0:
                    gr[K + blank_didx[k]] -= p


def _pieces(n: int, per: int) -> Tuple[list, list]:
    """``n`` items cut into about ``per`` pieces per thread: ``(starts, ends)``."""
    pieces = max(1, min(n, get_num_threads() * per))
    cuts = [round(i * n / pieces) for i in range(pieces + 1)]
    return cuts[:-1], cuts[1:]


def _run(fn, n: int, per: int) -> None:
    starts, ends = _pieces(n, per)
    if len(starts) == 1:
        fn(starts[0], ends[0])
    else:
        parallel_map(fn, starts, ends)


def _arc_scores(x: torch.Tensor, targets, tlen, ulen, K: int, D: int, arcs: Arcs, sigma: float, normalise: bool):
    """Pass 1 over the contiguous CPU tensor ``x``: ``(ex, arcs, lz, dz, sc)``, the kernel's
    inputs ``ex = (x, targets, tlen, ulen)`` and ``arcs`` as contiguous int64 arrays, the
    normalisers ``lz``, ``dz`` ``(B, T, U + 1)`` and the arc scores ``sc`` ``(A, B, T + 1, U + 1)``,
    token arcs first (the row ``T`` has no arcs: ``-inf``)."""
    xn = x.numpy()
    B, T, U1 = xn.shape[0], xn.shape[1], xn.shape[2]
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    tl = np.ascontiguousarray(tlen, dtype=np.int64)
    ul = np.ascontiguousarray(ulen, dtype=np.int64)
    K, D, sigma, normalise = int(K), int(D), float(sigma), bool(normalise)
    arcs_c = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in arcs)
    A = arcs_c[0].shape[0] + arcs_c[2].shape[0]
    lz = np.zeros((B, T, U1))
    dz = np.zeros((B, T, U1))
    sc = np.full((A, B, T + 1, U1), NEG_INF)
    ex = (xn, tg, tl, ul)
    _run(lambda r0, r1: _arc_rows(r0, r1, ex, K, D, arcs_c, sigma, normalise, lz, dz, sc), B * T, 4)
    return ex, arcs_c, lz, dz, sc


def _bounds(tl: np.ndarray, ul: np.ndarray) -> np.ndarray:
    """The shared lattice's rectangles: ``(0, 0)`` to ``(T_b, U_b)`` (none without a frame)."""
    bnd = np.zeros((tl.shape[0], 4), dtype=np.int64)
    bnd[:, 2] = np.where(tl > 0, tl, -1)  # no frame: no path
    bnd[:, 3] = ul
    return bnd


def lattice_loss(
    x: torch.Tensor,
    targets: np.ndarray,
    tlen: np.ndarray,
    ulen: np.ndarray,
    K: int,
    D: int,
    arcs: Arcs,
    sigma: float,
    normalise: bool,
    coef: np.ndarray,
    need_grad: bool,
    grad: Optional[torch.Tensor] = None,
    losses: Optional[np.ndarray] = None,
    scale: float = 1.0,
    fastemit_lambda: float = 0.0,
) -> Tuple[np.ndarray, Optional[torch.Tensor]]:
    """``(losses (B,) float64, grad)`` of the duration lattice (see the module docstring).

    Args:
        x: ``(B, T, U + 1, V)`` float32/float64 CPU tensor (made contiguous here): label logits in
            ``[0, K)``, duration logits in ``[K, K + D)``.
        targets: ``(B, S)`` int64 label ids in ``[0, K)`` (checked by the caller).
        tlen, ulen: ``(B,)`` int64 frames (``<= T``) and labels (``<= min(S, U)``) per example.
        K, D: the widths of the label and duration groups.
        arcs: the arc description :data:`Arcs`.
        sigma: subtracted from every label log-probability (logit under-normalisation).
        normalise: log-softmax each group (False: ``x`` already holds log-probabilities).
        coef: ``(B,)`` float64 coefficient of each example's gradient (the reduction's).
        need_grad: compute the gradient.
        grad: with ``losses``, the buffer of an earlier call to add ``scale`` times this
            lattice's gradient into (a second lattice mixed in); None: a fresh buffer.
        losses: ``(B,)`` float64 of an earlier call to add ``scale`` times the losses into
            (then ``grad`` must be that call's buffer when ``need_grad``); None: fresh.
        scale: the weight of this lattice when accumulating.
        fastemit_lambda: FastEmit's weight: the gradient of every token arc (its label and its
            duration score) is scaled by ``1 + fastemit_lambda``; the losses are unchanged.
    """
    x = x.detach().contiguous()
    accumulate = losses is not None
    if grad is None:
        grad = torch.empty_like(x) if need_grad else x.new_empty((x.shape[0], 1, 1, 1))
    if losses is None:
        losses = np.zeros(x.shape[0], dtype=np.float64)
    gn = grad.numpy()
    B, T, U1 = x.shape[0], x.shape[1], x.shape[2]
    K, D, normalise = int(K), int(D), bool(normalise)
    # pass 1: the arc scores
    ex, arcs_c, lz, dz, sc = _arc_scores(x, targets, tlen, ulen, K, D, arcs, sigma, normalise)
    tok_dur, _, _, blank_dur, _ = arcs_c
    tl, ul = ex[2], ex[3]
    NT = tok_dur.shape[0]
    A = sc.shape[0]
    # pass 2: the lattice, token arcs (d, 1) then blank arcs (d, 0), ending at (T_b, U_b)
    di = np.ascontiguousarray(np.concatenate([tok_dur, blank_dur]), dtype=np.int64)
    dj = np.concatenate([np.ones(NT, dtype=np.int64), np.zeros(A - NT, dtype=np.int64)])
    bnd = _bounds(tl, ul)
    post = np.zeros((A, B, T + 1, U1) if need_grad else (A, 1, 1, 1))
    scores = tuple(sc[k] for k in range(A))
    posts = tuple(post[k] for k in range(A))
    ll = np.empty(B, dtype=np.float64)
    _run(
        lambda e0, e1: lattice_examples(
            e0, e1, scores, di, dj, bnd, LOG, POST_ALL if need_grad else POST_NONE, True, ll, posts, _NO_PATH, _NO_LEN
        ),
        B,
        1,
    )
    cost = np.where(tl > 0, -ll, math.inf)
    if accumulate:
        losses += float(scale) * cost
    else:
        losses[:] = np.where(tl > 0, float(scale) * cost, math.inf)
    if need_grad:  # pass 3: the gradient rows
        cf = np.ascontiguousarray(coef, dtype=np.float64)
        sc_, acc, lam = float(scale), bool(accumulate), float(fastemit_lambda)
        _run(
            lambda r0, r1: _grad_rows(r0, r1, ex, K, D, arcs_c, normalise, cf, sc_, acc, ll, lz, dz, post, gn, lam),
            B * T,
            4,
        )
    return losses, (grad if need_grad else None)


def lattice_viterbi(
    x: torch.Tensor,
    targets: np.ndarray,
    tlen: np.ndarray,
    ulen: np.ndarray,
    K: int,
    D: int,
    arcs: Arcs,
    sigma: float,
    normalise: bool,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The best path of each example through the duration lattice (see the module docstring).

    Pass 1 of :func:`lattice_loss` (the arc scores), then the shared lattice twice: in the max
    semiring with back pointers (the blank arcs listed first, so a tie goes to a blank: the later
    emission, as :func:`~.rnnt_viterbi.rnnt_viterbi`), then in the log semiring for the total and
    the posteriors of the best path's arcs only.

    Args:
        x, targets, tlen, ulen, K, D, arcs, sigma, normalise: as :func:`lattice_loss`.

    Returns:
        ``(score (B,), log_z (B,), path (B, L, 4) int64, arc_score (B, L), arc_post (B, L))``:
        the best path's score (``-inf`` without a path) and the log of the total over all
        paths; the path's arcs, start first, as rows ``(t, u, kind, duration)`` (``kind`` indexes
        ``arcs``: ``k < len(tok_dur)`` is token arc ``k``, else blank arc ``k - len(tok_dur)``),
        padded with -1; each arc's score and its posterior probability (0 past the path).
    """
    x = x.detach().contiguous()
    B, T, U1 = x.shape[0], x.shape[1], x.shape[2]
    ex, arcs_c, _, _, sc = _arc_scores(x, targets, tlen, ulen, K, D, arcs, sigma, normalise)
    tok_dur, _, _, blank_dur, _ = arcs_c
    NT = tok_dur.shape[0]
    A = sc.shape[0]
    order = np.concatenate([np.arange(NT, A), np.arange(NT)]).astype(np.int64)  # blanks first
    di = np.ascontiguousarray(np.concatenate([blank_dur, tok_dur]), dtype=np.int64)
    dj = np.concatenate([np.zeros(A - NT, dtype=np.int64), np.ones(NT, dtype=np.int64)])
    bnd = _bounds(ex[2], ex[3])
    post = np.zeros((A, B, T + 1, U1))
    scores = tuple(sc[k] for k in order)
    posts = tuple(post[k] for k in order)
    L = T + U1  # every arc advances the frame or the label
    path = np.full((B, L, 3), -1, dtype=np.int64)
    path_len = np.zeros(B, dtype=np.int64)
    score = np.empty(B)
    logz = np.empty(B)
    _run(
        lambda e0, e1: lattice_examples(
            e0, e1, scores, di, dj, bnd, MAX, POST_ALL, False, score, posts, path, path_len
        ),
        B,
        1,
    )
    _run(
        lambda e0, e1: lattice_examples(
            e0, e1, scores, di, dj, bnd, LOG, POST_MARKED, False, logz, posts, path, path_len
        ),
        B,
        1,
    )
    live = np.arange(L)[None, :] < path_len[:, None]
    kind = np.where(live, order[np.where(live, path[:, :, 2], 0)], -1)
    out = np.full((B, L, 4), -1, dtype=np.int64)
    out[:, :, :2] = np.where(live[:, :, None], path[:, :, :2], -1)
    out[:, :, 2] = kind
    durs = np.concatenate([tok_dur, blank_dur])
    out[:, :, 3] = np.where(live, durs[np.maximum(kind, 0)], -1)
    bi, ni = np.nonzero(live)
    k, t, u = kind[bi, ni], out[bi, ni, 0], out[bi, ni, 1]
    arc_score = np.zeros((B, L))
    arc_post = np.zeros((B, L))
    arc_score[bi, ni] = sc[k, bi, t, u]
    arc_post[bi, ni] = np.where(logz[bi] > NEG_INF, np.minimum(1.0, post[k, bi, t, u]), 0.0)
    score = np.where(ex[2] > 0, score, NEG_INF)
    return score, logz, out, arc_score, arc_post


def viterbi_inputs(logits: np.ndarray, targets, logit_lengths, target_lengths, blank: int):
    """``(x, targets, logit_lengths, target_lengths, blank)`` checked and made contiguous (int64
    indices, padding zeroed) as :func:`~.rnnt_viterbi.rnnt_viterbi` checks them: shapes, dtypes,
    ranges (targets in ``[0, V)``, never ``blank``), NaN/``+inf``; ValueError naming the argument."""
    return _check(logits, targets, logit_lengths, target_lengths, blank)
