"""The transducer lattice as one numba kernel (CPU): a grid of nodes, a few arc kinds.

Every transducer loss of the engine walks the same kind of lattice. Example ``b`` has the nodes
``(i, j)`` of a rectangle ``i0 <= i <= i1``, ``j0 <= j <= j1`` (its boundary
``bnd[b] = [i0, j0, i1, j1]``), starts at ``(i0, j0)`` and ends at ``(i1, j1)``. An arc of kind
``k`` leaves node ``(i, j)`` for ``(i + di[k], j + dj[k])`` (``di, dj >= 0``, not both 0) when that
node lies inside the rectangle, with the score ``scores[k][b, i, j]`` (one plane per kind, each
indexed by the arc's source node; a plane need only cover the nodes its arcs leave from). The
callers map their variants onto it:

* regular RNN-T (``i`` the frame, ``j`` the label): blank ``(1, 0)``, token ``(0, 1)`` over
  ``(T + 1, U + 1)`` nodes ending at ``(T, U)``; the row ``i = T`` has no token arcs (their
  scores are ``-inf``), so a path ends with a blank from ``(T - 1, U)``;
* multi-blank RNN-T: more blanks ``(d, 0)``; TDT: tokens ``(d, 1)`` and blanks ``(d, 0)`` per
  duration (a token landing on the row ``T`` is given the score ``-inf``: it ends nothing);
* k2's mutual-information recursion (``i`` the symbol, ``j`` the frame): ``px`` is ``(1, 0)``
  (``(1, 1)`` in the modified recursion), ``py`` is ``(0, 1)``, with k2's boundary.

Two semirings. In the log semiring the total is ``log sum_paths exp(score)`` and the posterior of an
arc, the gradient of the total with respect to its score, is
``exp(alpha[src] + score + beta[dst] - total)`` (forward and backward variables in float64). In the
max semiring the total is the best path's score, found with back pointers (ties go to the kind
listed first), and the posterior is 1 on the best path's arcs, 0 elsewhere. A rectangle with
``i1 < i0`` or ``j1 < j0`` has no path: total ``-inf``. An example whose total is ``-inf`` gets no
posteriors (the caller's zeros stay); a NaN read on the way gives a NaN total and NaN posteriors.

The kernel (:func:`lattice_examples`) is what the engine's entry points call, over ranges of
examples on their own threads; :func:`transducer_lattice` checks its arguments first, for any other
caller. Three log-adds: :data:`LOG` (:func:`~.logmath.log_add`), :data:`LOG_CHECKED`
(:func:`~.logmath.log_add_checked`: two ``+inf`` give ``+inf``, for user scores) and :data:`MAX`.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
from numba import njit

from ..wfst.parallel import get_num_threads, parallel_map
from .logmath import log_add, log_add_checked

__all__ = [
    "LOG",
    "LOG_CHECKED",
    "MAX",
    "POST_ALL",
    "POST_MARKED",
    "POST_NONE",
    "lattice_examples",
    "transducer_lattice",
]

NEG_INF = -math.inf

#: the log semiring with :func:`~.logmath.log_add`
LOG = 0
#: the log semiring with :func:`~.logmath.log_add_checked`
LOG_CHECKED = 1
#: the max semiring, with back pointers
MAX = 2
#: no posteriors
POST_NONE = 0
#: every arc's posterior
POST_ALL = 1
#: the posteriors of the arcs marked by a non-zero entry of ``post`` on the way in (in the log
#: semirings; the max semiring's posteriors mark its best path): the rest is left as it is
POST_MARKED = 2

_SEMIRINGS = {"log": LOG, "log_checked": LOG_CHECKED, "max": MAX}


@njit(cache=True, nogil=True, inline="always")
def _plus(acc, v, semiring):
    """The semiring's sum of the log semirings (``MAX`` is handled by the callers, with the arg-max)."""
    if semiring == LOG:
        return log_add(acc, v)
    return log_add_checked(acc, v)


@njit(cache=True, nogil=True)
def _forward(scores, di, dj, b, i0, j0, ni, nj, semiring, a, bp, with_post, be, tot, post):
    """``a[i, j]``: the forward variable of node ``(i0 + i, j0 + j)``; in ``MAX``, ``bp[i, j]`` the
    kind of its best incoming arc (-1: none). ``with_post`` (log semirings, ``be`` the backward
    variables and ``tot`` the total; :data:`POST_ALL` or :data:`POST_MARKED`): the posteriors of
    the arcs into the node, on the way."""
    A = di.shape[0]
    for i in range(ni):
        for j in range(nj):
            acc = NEG_INF
            arg = -1
            if i == 0 and j == 0:
                acc = 0.0
            else:
                for k in range(A):
                    pi = i - di[k]
                    pj = j - dj[k]
                    if pi >= 0 and pj >= 0:
                        v = a[pi, pj] + scores[k][b, i0 + pi, j0 + pj]
                        if with_post == POST_ALL or (with_post == POST_MARKED and post[k][b, i0 + pi, j0 + pj] != 0.0):
                            post[k][b, i0 + pi, j0 + pj] = math.exp(v + be[i, j] - tot)
                        if arg < 0:  # the first incoming arc (the semiring's zero plus v is v)
                            acc = v
                            arg = k
                        elif semiring == MAX:
                            if v > acc:
                                acc = v
                                arg = k
                        else:
                            acc = _plus(acc, v, semiring)
            a[i, j] = acc
            if semiring == MAX:
                bp[i, j] = arg


@njit(cache=True, nogil=True)
def _backward(scores, di, dj, b, i0, j0, ni, nj, semiring, be, with_post, a, tot, post):
    """``be[i, j]``: the log semiring's backward variable of node ``(i0 + i, j0 + j)``;
    ``with_post`` (``a`` the forward variables, ``tot`` the total; :data:`POST_ALL` or
    :data:`POST_MARKED`): the posteriors of the arcs out of the node, on the way."""
    A = di.shape[0]
    for i in range(ni - 1, -1, -1):
        for j in range(nj - 1, -1, -1):
            if i == ni - 1 and j == nj - 1:
                be[i, j] = 0.0
                continue
            acc = NEG_INF
            first = True
            for k in range(A):
                qi = i + di[k]
                qj = j + dj[k]
                if qi < ni and qj < nj:
                    sc = scores[k][b, i0 + i, j0 + j]
                    bq = be[qi, qj]
                    if with_post == POST_ALL or (with_post == POST_MARKED and post[k][b, i0 + i, j0 + j] != 0.0):
                        post[k][b, i0 + i, j0 + j] = math.exp(a[i, j] + sc + bq - tot)
                    v = sc + bq
                    if first:  # the semiring's zero plus v is v
                        acc = v
                        first = False
                    else:
                        acc = _plus(acc, v, semiring)
            be[i, j] = acc


@njit(cache=True, nogil=True)
def _backtrack(di, dj, b, i0, j0, ni, nj, bp, need_post, post, path, path_len):
    """The best path from the back pointers, start first, into ``path[b, n] = (i, j, k)``."""
    i = ni - 1
    j = nj - 1
    n = 0
    while i > 0 or j > 0:
        k = bp[i, j]
        i -= di[k]
        j -= dj[k]
        path[b, n, 0] = i0 + i
        path[b, n, 1] = j0 + j
        path[b, n, 2] = k
        n += 1
        if need_post:
            post[k][b, i0 + i, j0 + j] = 1.0
    path_len[b] = n
    for m in range(n // 2):  # reverse: start first
        for c in range(3):
            w = path[b, m, c]
            path[b, m, c] = path[b, n - 1 - m, c]
            path[b, n - 1 - m, c] = w


@njit(cache=True, nogil=True)
def lattice_examples(e0, e1, scores, di, dj, bnd, semiring, need_post, from_end, total, post, path, path_len):
    """Examples ``e0 .. e1 - 1`` of the lattice (see the module docstring).

    Args:
        scores: a tuple of ``A`` arrays, ``scores[k][b, i, j]`` the score of the arc of kind ``k``
            leaving node ``(i, j)`` (any float dtype; sums run in float64).
        di, dj: ``(A,)`` int64 advances of each kind.
        bnd: ``(B, 4)`` int64 ``[i0, j0, i1, j1]`` per example.
        semiring: :data:`LOG`, :data:`LOG_CHECKED` or :data:`MAX`.
        need_post: :data:`POST_NONE`, :data:`POST_ALL` (every posterior into ``post``, a tuple
            like ``scores``; only the arcs inside each rectangle are written, the caller
            zero-fills) or :data:`POST_MARKED` (only those of the arcs whose ``post`` entry is
            non-zero: the best path of a max-semiring call, rescored in the log semiring).
        from_end: in the log semirings, the total is the backward variable of the start node
            (else the forward variable of the end node); without posteriors only that direction
            runs.
        total: ``(B,)`` float64 out.
        path, path_len: in ``MAX``, ``(B, L, 3)`` int64 ``(i, j, k)`` of each arc of the best path,
            start first, and ``(B,)`` the number of arcs (``L >= i1 - i0 + j1 - j0``; 0 without a
            path). Unused in the log semirings.
    """
    for b in range(e0, e1):
        i0 = bnd[b, 0]
        j0 = bnd[b, 1]
        ni = bnd[b, 2] - i0 + 1
        nj = bnd[b, 3] - j0 + 1
        if semiring == MAX:
            path_len[b] = 0
        if ni <= 0 or nj <= 0:
            total[b] = NEG_INF
            continue
        if semiring == MAX:
            a = np.empty((ni, nj))
            bp = np.empty((ni, nj), dtype=np.int64)
            _forward(scores, di, dj, b, i0, j0, ni, nj, semiring, a, bp, POST_NONE, a, 0.0, post)
            tot = a[ni - 1, nj - 1]
            total[b] = tot
            if tot > NEG_INF:
                _backtrack(di, dj, b, i0, j0, ni, nj, bp, need_post != POST_NONE, post, path, path_len)
            continue
        bp = np.empty((1, 1), dtype=np.int64)
        a = np.empty((ni, nj))
        be = np.empty((ni, nj))
        if from_end:  # beta, then alpha with the posteriors
            _backward(scores, di, dj, b, i0, j0, ni, nj, semiring, be, POST_NONE, a, 0.0, post)
            tot = be[0, 0]
            total[b] = tot
            if need_post != POST_NONE and tot != NEG_INF:
                _forward(scores, di, dj, b, i0, j0, ni, nj, semiring, a, bp, need_post, be, tot, post)
        else:  # alpha, then beta with the posteriors
            _forward(scores, di, dj, b, i0, j0, ni, nj, semiring, a, bp, POST_NONE, be, 0.0, post)
            tot = a[ni - 1, nj - 1]
            total[b] = tot
            if need_post != POST_NONE and tot != NEG_INF:
                _backward(scores, di, dj, b, i0, j0, ni, nj, semiring, be, need_post, a, tot, post)


def _as_planes(scores: Sequence[np.ndarray], B: int) -> Tuple[np.ndarray, ...]:
    planes = tuple(np.ascontiguousarray(s) for s in scores)
    if not planes:
        raise ValueError("scores must hold at least one arc kind, got none")
    dt = planes[0].dtype
    for k, p in enumerate(planes):
        if p.ndim != 3 or p.shape[0] != B or p.dtype != dt or dt not in (np.float32, np.float64):
            raise ValueError(
                f"scores[{k}] must be a float32/float64 array (B, I, J) with B={B} and the dtype of scores[0], "
                f"got {p.dtype} {p.shape}"
            )
    return planes


def transducer_lattice(
    scores: Sequence[np.ndarray],
    di: Sequence[int],
    dj: Sequence[int],
    boundary: np.ndarray,
    semiring: str = "log",
    need_post: bool = True,
    from_end: bool = False,
    marked: Optional[Sequence[np.ndarray]] = None,
) -> Tuple[np.ndarray, Optional[Tuple[np.ndarray, ...]], Optional[np.ndarray]]:
    """The lattice of the module docstring, every argument checked.

    Args:
        scores: ``A`` float32/float64 arrays ``(B, I_k, J_k)`` of one dtype: ``scores[k][b, i, j]``
            the score of the arc of kind ``k`` leaving node ``(i, j)``.
        di, dj: ``A`` advances each, in ``[0, I]`` and ``[0, J]``, ``di[k] + dj[k] >= 1``.
        boundary: ``(B, 4)`` integer ``[i0, j0, i1, j1]`` per example, ``i0, j0 >= 0``; a
            rectangle with ``i1 < i0`` or ``j1 < j0`` has no path. Each plane must cover the nodes
            its arcs leave from: ``I_k >= i1 - di[k] + 1`` and ``J_k >= j1 - dj[k] + 1``.
        semiring: ``"log"``, ``"log_checked"`` (two ``+inf`` add to ``+inf``) or ``"max"``.
        need_post: compute the posteriors.
        from_end: the log semirings' total from the backward variables.
        marked: with ``need_post`` in a log semiring, arrays like ``scores`` (the max semiring's
            posteriors, say): only the arcs whose entry is non-zero get their posterior, the
            others keep the entry they have here.

    Returns:
        ``(total (B,) float64, posteriors, path)``: the posteriors are a tuple like ``scores`` (in
        its dtype; None without ``need_post``), the path ``(B, L, 3)`` int64 rows ``(i, j, k)`` of
        the best path's arcs, start first, padded with -1 (``"max"`` only, else None).
    """
    if semiring not in _SEMIRINGS:
        raise ValueError(f"semiring must be one of {sorted(_SEMIRINGS)}, got {semiring!r}")
    bnd = np.asarray(boundary)
    if bnd.ndim != 2 or bnd.shape[1] != 4 or not np.issubdtype(bnd.dtype, np.integer):
        raise ValueError(f"boundary must be an integer array of shape (B, 4), got {bnd.dtype} {bnd.shape}")
    bnd = np.ascontiguousarray(bnd, dtype=np.int64)
    B = bnd.shape[0]
    planes = _as_planes(scores, B)
    A = len(planes)
    d_i = np.ascontiguousarray(di, dtype=np.int64)
    d_j = np.ascontiguousarray(dj, dtype=np.int64)
    if d_i.shape != (A,) or d_j.shape != (A,) or (A and (min(d_i.min(), d_j.min()) < 0 or (d_i + d_j).min() < 1)):
        raise ValueError(f"di and dj must hold {A} advances >= 0 each, di[k] + dj[k] >= 1, got {d_i} and {d_j}")
    live = (bnd[:, 2] >= bnd[:, 0]) & (bnd[:, 3] >= bnd[:, 1])
    if B and (bnd[:, :2].min() < 0):
        raise ValueError("boundary rows [i0, j0, i1, j1] must have i0 >= 0 and j0 >= 0")
    for k, p in enumerate(planes):
        need_i = np.where(live, bnd[:, 2] - d_i[k] + 1, 0)
        need_j = np.where(live, bnd[:, 3] - d_j[k] + 1, 0)
        if B and (need_i.max() > p.shape[1] or need_j.max() > p.shape[2]):
            raise ValueError(
                f"scores[{k}] must cover the nodes its arcs leave from: shape (B, >= {need_i.max()}, "
                f">= {need_j.max()}), got {p.shape}"
            )
    sr = _SEMIRINGS[semiring]
    total = np.empty(B, dtype=np.float64)
    post = tuple(np.zeros(p.shape if need_post else (1, 1, 1), dtype=p.dtype) for p in planes)
    mode = POST_ALL if need_post else POST_NONE
    if marked is not None and need_post and sr != MAX:
        post = tuple(np.array(m, dtype=p.dtype, order="C") for m, p in zip(marked, planes))
        if len(post) != A or any(m.shape != p.shape for m, p in zip(post, planes)):
            raise ValueError("marked must hold one array of each scores plane's shape")
        mode = POST_MARKED
    L = int((np.where(live, bnd[:, 2] - bnd[:, 0] + bnd[:, 3] - bnd[:, 1], 0)).max()) if B and sr == MAX else 0
    path = np.full((B, max(L, 1), 3) if sr == MAX else (1, 1, 3), -1, dtype=np.int64)
    path_len = np.zeros(max(B, 1), dtype=np.int64)
    pieces = max(1, min(B, get_num_threads()))
    cuts = [round(i * B / pieces) for i in range(pieces + 1)]

    def run(e0: int, e1: int) -> None:
        lattice_examples(e0, e1, planes, d_i, d_j, bnd, sr, mode, bool(from_end), total, post, path, path_len)

    if B:
        parallel_map(run, cuts[:-1], cuts[1:])
    return total, (post if need_post else None), (path if sr == MAX else None)
