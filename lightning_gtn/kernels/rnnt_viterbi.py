"""RNN-T forced alignment on the CPU: the best path through the ``(T, U + 1)`` lattice, with
forward-backward posteriors, in numba.

For example ``b`` (``T = logit_lengths[b]`` frames, ``U = target_lengths[b]`` tokens ``y``)
the lattice node ``(t, u)`` means "``u`` tokens emitted, at frame ``t``". With the per-node
normaliser ``Z(t, u) = logsumexp_v x[t, u, v]`` (computed once per node, the logits are never
copied)::

    blank(t, u) = x[t, u, blank] - Z(t, u)          (t, u) -> (t + 1, u)
    emit(t, u)  = x[t, u, y[u]] - Z(t, u)           (t, u) -> (t, u + 1), u < U

    delta(0, 0) = 0
    delta(t, u) = max(delta(t - 1, u) + blank(t - 1, u), delta(t, u - 1) + emit(t, u - 1))
    score       = delta(T - 1, U) + blank(T - 1, U)       (the final blank ends the path)

On ties the blank predecessor wins (the later emission). The backtrack gives each token's
emission frame (non-decreasing, in ``[0, T)``). ``alpha``/``beta`` are the same recursions in the
log semiring; ``log Z = alpha(T - 1, U) + blank(T - 1, U)`` is minus the RNN-T loss, and the
posterior probability that token ``u`` is emitted at frame ``t`` is
``exp(alpha(t, u) + emit(t, u) + beta(t, u + 1) - log Z)``.

Both recursions are the engine's shared lattice (:mod:`.transducer_lattice_numba`: blank arcs
``(1, 0)``, token arcs ``(0, 1)``, over ``(T + 1, U + 1)`` nodes ending at ``(T, U)``), in the max
semiring with back pointers and in the log semiring with the arc posteriors.

``T = 0`` has no path (score ``-inf``, frames ``-1``). :func:`rnnt_viterbi` checks every input
(shapes, dtypes, ranges, NaN/+inf) before the compiled loops index with them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .transducer_lattice_numba import LOG, MAX, POST_ALL, POST_MARKED, lattice_examples

__all__ = ["rnnt_viterbi"]

_NEG = -np.inf


@njit(cache=True, nogil=True)
def _node_logps(x, y, T, U, blank, normalize, lp_blank, lp_emit):
    """``blank(t, u)`` and ``emit(t, u)`` of one example (``x``: ``(T', U' + 1, V)``)."""
    V = x.shape[2]
    for t in range(T):
        for u in range(U + 1):
            if not normalize:
                lp_blank[t, u] = x[t, u, blank]
                if u < U:
                    lp_emit[t, u] = x[t, u, y[u]]
                continue
            m = -np.inf
            for v in range(V):
                if x[t, u, v] > m:
                    m = x[t, u, v]
            if m == -np.inf:
                lp_blank[t, u] = -np.inf
                if u < U:
                    lp_emit[t, u] = -np.inf
                continue
            s = 0.0
            for v in range(V):
                s += math.exp(x[t, u, v] - m)
            z = m + math.log(s)
            lp_blank[t, u] = x[t, u, blank] - z
            if u < U:
                lp_emit[t, u] = x[t, u, y[u]] - z


_DI = np.array([1, 0], dtype=np.int64)  # the arc kinds: blank (1, 0) first (it wins ties), token (0, 1)
_DJ = np.array([0, 1], dtype=np.int64)


@njit(cache=True, nogil=True)
def _batch(x, y, T, U, blank, normalize, frames, tok_logp, tok_post, score, logz):
    """Every example: the node log-probabilities, then the shared lattice twice (the max semiring
    with its best path, the log semiring with the posteriors of that path's arcs), then the token
    rows."""
    B, Tm, U1 = x.shape[0], x.shape[1], x.shape[2]
    lp_blank = np.full((B, Tm, U1), -np.inf)
    lp_emit = np.full((B, Tm + 1, U1), -np.inf)  # the row T: no token arcs
    bnd = np.zeros((B, 4), dtype=np.int64)
    for b in range(B):
        bnd[b, 2] = T[b] if T[b] > 0 else -1  # no frame: no path
        bnd[b, 3] = U[b]
        if T[b] > 0:
            _node_logps(x[b], y[b], T[b], U[b], blank, normalize, lp_blank[b], lp_emit[b])
    scores = (lp_blank, lp_emit)
    post_b = np.zeros((B, Tm, U1))
    post_e = np.zeros((B, Tm + 1, U1))
    posts = (post_b, post_e)
    path = np.empty((B, Tm + U1, 3), dtype=np.int64)
    path_len = np.zeros(B, dtype=np.int64)
    # the best path (its arcs marked 1 in posts), then the log semiring's posteriors of those arcs
    lattice_examples(0, B, scores, _DI, _DJ, bnd, MAX, POST_ALL, False, score, posts, path, path_len)
    lattice_examples(0, B, scores, _DI, _DJ, bnd, LOG, POST_MARKED, False, logz, posts, path, path_len)
    for b in range(B):
        if score[b] == -np.inf:
            continue
        for n in range(path_len[b]):
            if path[b, n, 2] == 1:  # a token arc from (t, u)
                t = path[b, n, 0]
                u = path[b, n, 1]
                frames[b, u] = t
                tok_logp[b, u] = lp_emit[b, t, u]
                tok_post[b, u] = min(1.0, post_e[b, t, u]) if logz[b] > -np.inf else 0.0


def rnnt_viterbi(
    logits: np.ndarray,
    targets: np.ndarray,
    logit_lengths: np.ndarray,
    target_lengths: np.ndarray,
    blank: int,
    normalize: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The best RNN-T path of each example, and the posteriors of its emissions (see the module docstring).

    Args:
        logits: ``(B, T, U + 1, V)`` float32 or float64 joiner outputs (unnormalised: the
            normaliser over ``V`` is taken here; log-probabilities pass unchanged). NaN or
            ``+inf`` is an error; ``-inf`` is allowed.
        targets: ``(B, U)`` integer token ids in ``[0, V)``, never ``blank`` within each length.
        logit_lengths: ``(B,)`` integer frames, ``0 <= logit_lengths[b] <= T``.
        target_lengths: ``(B,)`` integer tokens, ``0 <= target_lengths[b] <= U``.
        blank: the blank id in ``[0, V)``.
        normalize: take the normaliser ``Z(t, u)`` (True) or read ``logits`` as
            log-probabilities (False: ``Z = 0``).

    Returns:
        ``(frames (B, U) int64, token_logp (B, U) float64, token_posterior (B, U) float64,
        score (B,) float64, log_z (B,) float64)``: each token's emission frame (-1 past the
        target's length or without a path), its log-probability there, the posterior
        probability of that emission at that frame, the best path's log-probability, the
        log-probability of all paths.

    Raises:
        ValueError: naming the argument at fault.
    """
    x, y, T, U, blank = _check(logits, targets, logit_lengths, target_lengths, blank)
    B, Umax = y.shape
    frames = np.full((B, Umax), -1, dtype=np.int64)
    tok_logp = np.zeros((B, Umax))
    tok_post = np.zeros((B, Umax))
    score = np.empty(B)
    logz = np.empty(B)
    _batch(x, y, T, U, blank, bool(normalize), frames, tok_logp, tok_post, score, logz)
    return frames, tok_logp, tok_post, score, logz


def _int_array(a, name: str, ndim: int, shape_text: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype == object or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array of shape {shape_text}, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(arr.shape)}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check(logits, targets, logit_lengths, target_lengths, blank):
    x = np.asarray(logits)
    if x.ndim != 4 or x.dtype not in (np.float32, np.float64):
        raise ValueError(f"logits must be a float32/float64 array of shape (B, T, U + 1, V), got {x.dtype} {x.shape}")
    B, T, U1, V = x.shape
    if U1 < 1 or V < 1:
        raise ValueError(f"logits must have U + 1 >= 1 and V >= 1, got shape {x.shape}")
    y = _int_array(targets, "targets", 2, f"(B, U) = ({B}, {U1 - 1})")
    if y.shape != (B, U1 - 1):
        raise ValueError(f"targets must have shape (B, U) = ({B}, {U1 - 1}) for logits {x.shape}, got {y.shape}")
    tl = _int_array(logit_lengths, "logit_lengths", 1, f"(B,) = ({B},)")
    ul = _int_array(target_lengths, "target_lengths", 1, f"(B,) = ({B},)")
    if tl.shape != (B,):
        raise ValueError(f"logit_lengths must have shape (B,) = ({B},), got {tl.shape}")
    if ul.shape != (B,):
        raise ValueError(f"target_lengths must have shape (B,) = ({B},), got {ul.shape}")
    if B and (tl.min() < 0 or tl.max() > T):
        raise ValueError(f"logit_lengths must lie in [0, T={T}], got [{tl.min()}, {tl.max()}]")
    if B and (ul.min() < 0 or ul.max() > U1 - 1):
        raise ValueError(f"target_lengths must lie in [0, U={U1 - 1}], got [{ul.min()}, {ul.max()}]")
    if isinstance(blank, (bool, np.bool_)) or not isinstance(blank, (int, np.integer)) or not 0 <= blank < V:
        raise ValueError(f"blank must be an int in [0, V={V}), got {blank!r}")
    blank = int(blank)
    mask = np.arange(U1 - 1)[None, :] < ul[:, None]
    used = y[mask]
    if used.size and (used.min() < 0 or used.max() >= V):
        raise ValueError(f"targets must lie in [0, V={V}) within target_lengths")
    if used.size and (used == blank).any():
        raise ValueError(f"targets must not contain the blank ({blank}) within target_lengths")
    y = np.where(mask, y, 0)  # padding is never read, but keep it in range
    x = np.ascontiguousarray(x)
    if x.size:
        top = x.max()  # max propagates NaN
        if np.isnan(top) or top == np.inf:
            raise ValueError("logits must not contain NaN or +inf")
    return x, y, tl, ul, blank
