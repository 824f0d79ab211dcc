"""Criterion graphs: their builders and the per-target caches of their compiled form.

Every loss builds its criterion graphs with the engine (:class:`lightning_gtn.wfst.Graph`),
then compiles each one (:func:`lightning_gtn.kernels.compiled_graphs.compile_graph`) into the flat arrays
the kernels read.

Compiled graphs of targets are cached in small LRU dictionaries keyed by the target tuple, so a
training loop that sees the same transcripts again pays only for the concatenation. A user's own
graphs are cached by identity and :attr:`Graph.version` (:func:`compiled_user_graph`), so
passing the same, unchanged graphs again compiles nothing.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Dict, Hashable, List, Sequence

import numpy as np

from .. import wfst as _wfst
from ..kernels.compiled_graphs import INDEX_DTYPE, CompiledGraph, compile_graph
from ..wfst import Graph
from ..wfst.criterion import ctc_graph
from .cache import LRU

__all__ = [
    "compiled_user_graph",
    "ctc_graph",
    "force_align_graph",
    "asg_full_graph",
    "asg_target_graph",
    "all_paths_graph",
    "cached",
    "clear_cache",
]


# ---------------------------------------------------------------------------
# The caches
# ---------------------------------------------------------------------------


_CACHES: Dict[str, LRU[CompiledGraph]] = {}
_CACHES_LOCK = threading.Lock()  # guards the creation of a kind's cache
CACHE_SIZE = 4096  # compiled graphs per kind; a CTC graph of 50 tokens takes about 12 kB


def set_cache_size(n: int) -> None:
    """Bounds each criterion-graph cache to ``n`` compiled graphs (``n >= 1``)."""
    global CACHE_SIZE
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    CACHE_SIZE = int(n)
    with _CACHES_LOCK:
        for c in _CACHES.values():
            c.resize(CACHE_SIZE)


def cached(kind: str, key: Hashable, make: Callable[[], CompiledGraph]) -> CompiledGraph:
    """The compiled graph of ``(kind, key)``, built by ``make()`` on a miss (LRU per kind)."""
    c = _CACHES.get(kind)
    if c is None:
        with _CACHES_LOCK:
            c = _CACHES.setdefault(kind, LRU(CACHE_SIZE))
    return c.get(key, make)


def clear_cache() -> None:
    """Empties every criterion-graph cache (user graphs' included)."""
    with _CACHES_LOCK:
        for c in _CACHES.values():
            c.clear()
    _USER_GRAPHS.clear()


USER_CACHE_SIZE = 1024  # compiled user graphs kept (least recently used dropped first)
#: id(g) -> (weak reference to g, version, compiled); an entry goes when its graph does
_USER_GRAPHS: LRU[tuple] = LRU(USER_CACHE_SIZE)


def compiled_user_graph(g: Graph) -> CompiledGraph:
    """The compiled form of a user's graph, compiled again only when the graph changed.

    Entries are keyed by ``id(g)``, hold a weak reference to ``g`` (an entry goes when its
    graph does) and the :attr:`Graph.version` it was compiled at; a later call with the
    same live graph at the same version returns the same :class:`CompiledGraph` object
    (so caches keyed on it, like the GPU arc tables, stay warm). At most
    ``USER_CACHE_SIZE`` graphs are kept (read at each call).

    Raises:
        TypeError: if ``g`` is not a :class:`lightning_gtn.wfst.Graph`.
        ValueError: as :func:`compile_graph` (an epsilon cycle).
    """
    if not isinstance(g, Graph):
        raise TypeError(f"graphs must hold lightning_gtn.wfst.Graph objects, got {type(g).__name__}")
    if _USER_GRAPHS.maxsize != USER_CACHE_SIZE:
        _USER_GRAPHS.resize(USER_CACHE_SIZE)
    key, version = id(g), g.version  # the version before compiling: a change meanwhile misses next time
    hit = _USER_GRAPHS.get(key)
    if hit is not None and hit[0]() is g and hit[1] == version:
        return hit[2]
    cg = compile_graph(g)
    entry: list = []

    def forget(ref: weakref.ref, key: int = key) -> None:
        if entry:
            _USER_GRAPHS.discard(key, entry[0])

    entry.append((weakref.ref(g, forget), version, cg))
    _USER_GRAPHS.put(key, entry[0])
    return cg


# ---------------------------------------------------------------------------
# Builders (engine graphs)
# ---------------------------------------------------------------------------


def force_align_graph(target: Sequence[int]) -> Graph:
    """The acceptor where token ``i`` of ``target`` covers one or more consecutive frames.

    ``len(target) + 1`` nodes in a chain: node 0 starts, node ``L`` accepts; arc ``l -> l+1``
    reads ``target[l]`` and node ``l + 1`` loops on ``target[l]``. An empty target accepts only
    the empty input.
    """
    return build_force_align(_wfst, target)


def build_force_align(gtn, target: Sequence[int]):
    """:func:`force_align_graph` built with ``gtn.Graph`` of the given module (the engine, or
    the real ``gtn`` package for ``impl="gtn"``)."""
    target = [int(t) for t in target]
    L = len(target)
    g = gtn.Graph(False)
    g.add_node(True, L == 0)
    for i, tok in enumerate(target):
        g.add_node(False, i == L - 1)
        g.add_arc(i, i + 1, tok)
        g.add_arc(i + 1, i + 1, tok)
    return g


def all_paths_graph(num_classes: int) -> Graph:
    """One node, start and accept, looping on every label: scores every label at every frame."""
    g = Graph(False)
    g.add_node(True, True)
    for c in range(num_classes):
        g.add_arc(0, 0, c)
    return g


def asg_full_graph(num_classes: int) -> tuple:
    """ASG's fully connected transition acceptor and the index of each arc's weight.

    Node 0 is the start; node ``i + 1`` means "the last token was ``i``" and accepts. Arc
    ``0 -> i+1`` reads ``i`` with weight ``transitions[0, i]``; arc ``j+1 -> i+1`` reads ``i``
    with weight ``transitions[i + 1, j]``. Returns ``(graph, weight_index)`` where
    ``weight_index[a]`` is the flat (row-major) index into ``transitions`` of arc ``a``.
    """
    C = int(num_classes)
    i = np.arange(C, dtype=INDEX_DTYPE)
    # start arcs, then for each destination token i all source tokens j
    src = np.concatenate([np.zeros(C, INDEX_DTYPE), np.tile(i + 1, C)])
    dst = np.concatenate([i + 1, np.repeat(i + 1, C)])
    lab = np.concatenate([i, np.repeat(i, C)])
    g = Graph.from_arrays(C + 1, [0], np.arange(1, C + 1), src, dst, lab, calc_grad=False)
    widx = np.arange(len(src), dtype=np.int64)  # arc order matches the row-major layout
    return g, widx


def asg_target_graph(target: Sequence[int], num_classes: int) -> tuple:
    """The force-align graph of ``target`` intersected with ASG's transitions.

    ``L + 1`` nodes in a chain; entering token ``l`` scores ``transitions[y_l + 1, y_{l-1}]``
    (``transitions[0, y_0]`` for the first), staying on it ``transitions[y_l + 1, y_l]``.
    Returns ``(graph, weight_index)`` as :func:`asg_full_graph`.
    """
    target = [int(t) for t in target]
    C = int(num_classes)
    g = force_align_graph(target)
    widx = []
    prev = None
    for tok in target:
        widx.append(tok if prev is None else (tok + 1) * C + prev)  # enter
        widx.append((tok + 1) * C + tok)  # stay
        prev = tok
    return g, np.asarray(widx, dtype=np.int64)


def target_key(target) -> tuple:
    return tuple(int(t) for t in target)


def compiled_ctc(target: Sequence[int], blank: int) -> CompiledGraph:
    key = (target_key(target), int(blank))
    return cached("ctc", key, lambda: compile_graph(ctc_graph(key[0], key[1])))


def compiled_force_align(target: Sequence[int]) -> CompiledGraph:
    key = target_key(target)
    return cached("align", key, lambda: compile_graph(force_align_graph(key)))


def compiled_all_paths(num_classes: int) -> CompiledGraph:
    return cached("all", int(num_classes), lambda: compile_graph(all_paths_graph(num_classes)))


def compiled_asg_full(num_classes: int) -> CompiledGraph:
    return cached("asg_full", int(num_classes), lambda: compile_graph(*asg_full_graph(num_classes)))


def compiled_asg_target(target: Sequence[int], num_classes: int) -> CompiledGraph:
    key = (target_key(target), int(num_classes))
    return cached("asg", key, lambda: compile_graph(*asg_target_graph(key[0], key[1])))


def graphs_for(targets: List[Sequence[int]], make: Callable) -> List[CompiledGraph]:
    return [make(t) for t in targets]
