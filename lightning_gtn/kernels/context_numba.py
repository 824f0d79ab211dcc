"""Numba steps of a context graph (an Aho-Corasick automaton over token ids) for biased search.

The arrays are those of :class:`lightning_gtn.decode.context_graph.ContextArrays`: the trie's
sorted children (``c_off`` (N + 1,) int64, ``c_tok`` / ``c_node`` int32), the failure links
``c_fail`` (N,) int32, and per state the pending bonus ``c_acc`` and the kept bonus ``c_floor``
(N,) float64. State 0 is the root. The host range-checks them; every index here stays in bounds.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def _goto(c_off, c_tok, c_node, n, a):
    """The child of state ``n`` by symbol ``a``, or -1."""
    lo = c_off[n]
    end = c_off[n + 1]
    hi = end
    while lo < hi:
        mid = (lo + hi) // 2
        if c_tok[mid] < a:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and c_tok[lo] == a:
        return c_node[lo]
    return -1


@njit(cache=True, nogil=True)
def context_step(c_off, c_tok, c_node, c_fail, c_acc, c_floor, n, a):
    """``(next state, bonus)`` after symbol ``a`` in state ``n``.

    A match that goes on earns ``acc[next] - acc[n]`` (the bonus of the new token); one that
    fails falls back along the failure links to the longest suffix that is still a phrase
    prefix, gives back the pending ``acc[n] - floor[n]`` and takes that state's ``acc``.
    """
    m = n
    k = -1
    steps = 0
    N = c_fail.shape[0]
    while steps <= N:
        k = _goto(c_off, c_tok, c_node, m, a)
        if k >= 0 or m == 0:
            break
        m = c_fail[m]
        steps += 1
    if k < 0:
        k = 0
    r = c_acc[k] - c_acc[n]
    if m != n:  # a failure: what the matched phrases earned is kept
        r += c_floor[n]
    return k, r


@njit(cache=True, nogil=True)
def context_table(c_off, c_tok, c_node, c_fail, c_acc, c_floor, S):
    """The dense tables ``(next (N, S) int64, bonus (N, S) float64)`` of every state and symbol."""
    N = c_fail.shape[0]
    nxt = np.empty((N, S), dtype=np.int64)
    bon = np.empty((N, S), dtype=np.float64)
    for n in range(N):
        for a in range(S):
            k, r = context_step(c_off, c_tok, c_node, c_fail, c_acc, c_floor, n, a)
            nxt[n, a] = k
            bon[n, a] = r
    return nxt, bon


@njit(cache=True, nogil=True)
def context_row(c_off, c_tok, c_node, c_fail, c_acc, c_floor, n, C):
    """``(next (C,) int64, bonus (C,) float64)`` of state ``n`` for every symbol ``0..C-1``."""
    nxt = np.empty(C, dtype=np.int64)
    bon = np.empty(C, dtype=np.float64)
    for a in range(C):
        k, r = context_step(c_off, c_tok, c_node, c_fail, c_acc, c_floor, n, a)
        nxt[a] = k
        bon[a] = r
    return nxt, bon
