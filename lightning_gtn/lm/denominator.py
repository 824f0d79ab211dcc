"""LF-MMI denominator graphs: a token n-gram ``P`` composed with a topology, and their plain data.

``P`` is a back-off n-gram model over token ids ``1..N`` estimated by
:func:`lightning_gtn.lm.estimate` from training transcripts (each token id becomes the word
``str(id)``; the vocabulary is every id ``1..N``, so a token never seen still gets its
smoothed share). As a graph, ``P`` is an **epsilon-free, deterministic** acceptor over token ids
(:func:`token_lm_graph`):

* its states are the model's histories (the states of :meth:`NGramLM.arrays`: the sentence
  start ``<s>`` and every explicit n-gram of order ``< order``) reachable from ``<s>``;
* every state has exactly one arc for every token ``w``: to the state of ``h + (w,)`` (the
  longest suffix that is a history) with weight ``ln P(w | h)`` **as the back-off model scores
  it** (the explicit probability when ``h + (w,)`` is an explicit n-gram, else
  ``ln bow(h) + ln P(w | h[1:])`` recursively). This *folds* the back-off arcs: no epsilon arc is
  left and every token sequence has exactly one path, whose weight is the model's
  ``ln P(w_1 .. w_k)`` exactly (what :meth:`NGramLM.sentence_score` with ``eos=False`` gives,
  up to float32 rounding of each arc). Kaldi's chain denominator LM has the same shape (every
  phone from every kept history state); folding instead the epsilon back-off arcs by epsilon
  removal (icefall's ``P``) keeps both the explicit and the backed-off path of a seen n-gram
  and so over-counts it, which this construction does not.
* ``</s>`` and ``<unk>`` have no token id and no arc: every state accepts with weight 0 (as
  Kaldi chain makes every denominator state final with probability one), so the paths of ``T``
  frames score the prefix probabilities ``ln P(w_1 .. w_k)`` without the end-of-sentence
  factor, and the arcs leaving a state sum to ``1 - P(</s> | h) - P(<unk> | h)`` in
  probability.

Its size is ``states * N`` arcs: ``order=2`` has ``N + 1`` states (``<s>`` and each token);
``prune`` removes rare n-grams of order 2 and more and with them the histories of higher orders
(it changes a bigram's probabilities, not its size).

The **denominator** (:func:`denominator_graph`) is the topology (:mod:`lightning_gtn.core.
topologies`) composed with ``P``: nodes are the reachable pairs (topology node, ``P`` state),
every arc reads one emission class, arcs that emit a token carry ``P``'s weight and the others
0. It is built directly from ``P``'s tables, level by level with numpy.

:func:`graph_to_data` / :func:`graph_from_data` turn such an acceptor into plain data (ints,
floats, strings, lists) for configs and checkpoints, and back with every field checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np

from ..core.topologies import TOPOLOGIES, compose_token_acceptor
from ..wfst import Graph
from .estimate import estimate
from .ngram import NGramLM

__all__ = [
    "MAX_ORDER",
    "MAX_DATA_NODES",
    "MAX_DATA_ARCS",
    "DATA_FORMAT",
    "token_lm",
    "token_lm_tables",
    "token_lm_graph",
    "denominator_graph",
    "graph_to_data",
    "graph_from_data",
]

MAX_ORDER = 4
"""The highest n-gram order of ``P`` (every state has an arc per token, so sizes grow fast)."""

MAX_DATA_NODES = 1 << 22
"""The most nodes :func:`graph_from_data` accepts."""

MAX_DATA_ARCS = 1 << 24
"""The most arcs :func:`graph_from_data` accepts."""

DATA_FORMAT = "lightning_gtn.acceptor"
"""The ``format`` field of :func:`graph_to_data`."""

_DATA_VERSION = 1


def _check_sequences(sequences, num_tokens: int) -> list[list[str]]:
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Iterable):
        raise ValueError("sequences must be an iterable of token-id sequences")
    out = []
    for i, seq in enumerate(sequences):
        if isinstance(seq, (str, bytes)):
            raise ValueError(f"sequences[{i}] must be a sequence of integer token ids, got a string")
        try:
            ids = np.asarray(seq)
        except Exception:
            raise ValueError(f"sequences[{i}] must be a sequence of integer token ids") from None
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"sequences[{i}] must be a 1-D sequence of integer token ids")
        if ids.size and (int(ids.min()) < 1 or int(ids.max()) > num_tokens):
            bad = int(ids.min()) if int(ids.min()) < 1 else int(ids.max())
            raise ValueError(f"sequences[{i}] holds {bad}, outside the token ids [1, {num_tokens}]")
        out.append([str(int(v)) for v in ids.tolist()])
    return out


def _check_args(num_tokens, order, prune, method) -> tuple[int, Optional[list[int]]]:
    if isinstance(num_tokens, (bool, np.bool_)) or not isinstance(num_tokens, (int, np.integer)):
        raise ValueError(f"num_tokens must be an integer, got {type(num_tokens).__name__}")
    n = int(num_tokens)
    if not 1 <= n <= 1 << 16:
        raise ValueError(f"num_tokens={n} must lie in [1, 65536]")
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= int(order) <= MAX_ORDER:
        raise ValueError(f"order must be an int in [1, {MAX_ORDER}], got {order!r}")
    if method not in ("kneser_ney", "kn", "witten_bell", "wb"):
        raise ValueError(f"method must be 'kneser_ney' or 'witten_bell', got {method!r}")
    order = int(order)
    if prune is None:
        return n, None
    if isinstance(prune, (int, np.integer)) and not isinstance(prune, bool):
        per = [int(prune)] * (order - 1)
    elif isinstance(prune, Sequence) and not isinstance(prune, (str, bytes)):
        per = list(prune)
        if len(per) != order - 1 or any(isinstance(p, bool) or not isinstance(p, (int, np.integer)) for p in per):
            raise ValueError(f"prune must be an int or {order - 1} ints (orders 2..{order})")
        per = [int(p) for p in per]
    else:
        raise ValueError(f"prune must be None, an int or a sequence of ints, got {type(prune).__name__}")
    if any(p < 0 for p in per):
        raise ValueError(f"prune thresholds must be >= 0, got {per}")
    if not any(per):
        return n, None
    # keep an n-gram (order >= 2) seen more than prune times: estimate's minimum counts
    return n, [0] + [p + 1 for p in per]


def token_lm(
    sequences: Iterable[Sequence[int]],
    num_tokens: int,
    *,
    order: int = 2,
    prune: Union[None, int, Sequence[int]] = None,
    method: str = "kneser_ney",
) -> NGramLM:
    """The back-off n-gram model ``P`` over token ids ``1..N`` (words ``"1" .. "N"``).

    Args:
        sequences: training transcripts as token-id sequences (ids ``1..N``).
        num_tokens: ``N``.
        order: n-gram order, 1 to :data:`MAX_ORDER`.
        prune: None or 0: keep every n-gram; an int ``k``: drop the n-grams of order 2 and more
            seen ``k`` times or fewer; or ``order - 1`` such ints, one per order ``2..order``.
            A history that loses n-grams gets its back-off weight renormalised.
        method: ``"kneser_ney"`` (interpolated modified Kneser-Ney) or ``"witten_bell"``.

    Returns:
        The :class:`NGramLM` (natural logs).

    Raises:
        ValueError: a token id outside ``1..N`` or a bad argument.
    """
    n, min_counts = _check_args(num_tokens, order, prune, method)
    seqs = _check_sequences(sequences, n)
    return estimate(seqs, order=int(order), method=method, prune=min_counts, vocab=[str(k) for k in range(1, n + 1)])


def token_lm_tables(lm: NGramLM, num_tokens: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``P`` with its back-off folded, as dense tables over its reachable states.

    Args:
        lm: a model whose words include ``"1" .. "N"`` (:func:`token_lm`).
        num_tokens: ``N``.

    Returns:
        ``(next_state, logp, start)``: ``next_state`` ``(S, N + 1)`` int64 and ``logp``
        ``(S, N + 1)`` float64, column ``w`` for token ``w`` (column 0 unused: ``-1`` and
        ``-inf``); state 0 is ``<s>`` (``start`` is 0); states are numbered breadth first.

    Raises:
        ValueError: the model lacks a token's word.
    """
    a = lm.arrays()
    wid = np.array([lm.word_id(str(k)) for k in range(1, num_tokens + 1)], dtype=np.int64)
    if np.any(wid == lm.unk) and "<unk>" not in [str(k) for k in range(1, num_tokens + 1)]:
        raise ValueError("the model lacks a word for some token id (build it with token_lm)")
    S0 = a.backoff_logp.shape[0]
    V = len(lm.words)
    counts = np.diff(a.state_offsets)
    arc_state = np.repeat(np.arange(S0, dtype=np.int64), counts)
    keys = arc_state * V + a.arc_word.astype(np.int64)  # sorted: states, then words ascending
    # fold the back-off of every (state, token) pair at once
    cur = np.repeat(np.arange(S0, dtype=np.int64), num_tokens)
    w = np.tile(wid, S0)
    acc = np.zeros(cur.shape[0])
    logp = np.full(cur.shape[0], -math.inf)
    nxt = np.full(cur.shape[0], -1, dtype=np.int64)
    todo = np.arange(cur.shape[0])
    while len(todo):
        q = cur[todo] * V + w[todo]
        k = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
        hit = keys[k] == q if len(keys) else np.zeros(len(q), dtype=bool)
        done = todo[hit]
        logp[done] = acc[done] + a.arc_logp[k[hit]].astype(np.float64)
        nxt[done] = a.arc_next[k[hit]]
        miss = todo[~hit]
        acc[miss] += a.backoff_logp[cur[miss]].astype(np.float64)
        cur[miss] = a.backoff_state[cur[miss]]
        todo = miss[cur[miss] >= 0]  # the root has every word: never -1 for a token
    nxt = nxt.reshape(S0, num_tokens)
    logp = logp.reshape(S0, num_tokens)
    # keep the states reachable from <s>, numbered breadth first
    start = int(a.start_state)
    new_id = np.full(S0, -1, dtype=np.int64)
    new_id[start] = 0
    order_l = [np.array([start])]
    frontier = order_l[0]
    num = 1
    while len(frontier):
        dst = np.unique(nxt[frontier].ravel())
        dst = dst[(dst >= 0)]
        dst = dst[new_id[dst] < 0]
        new_id[dst] = np.arange(num, num + len(dst))
        num += len(dst)
        order_l.append(dst)
        frontier = dst
    old = np.concatenate(order_l)
    table = np.full((num, num_tokens + 1), -1, dtype=np.int64)
    lp = np.full((num, num_tokens + 1), -math.inf)
    table[:, 1:] = np.where(nxt[old] >= 0, new_id[np.maximum(nxt[old], 0)], -1)
    lp[:, 1:] = logp[old]
    return table, lp, 0


def token_lm_graph(
    sequences: Iterable[Sequence[int]],
    num_tokens: int,
    *,
    order: int = 2,
    prune: Union[None, int, Sequence[int]] = None,
    method: str = "kneser_ney",
) -> Graph:
    """The token n-gram ``P`` as an epsilon-free deterministic acceptor over token ids.

    States: ``<s>`` (node 0, the start) and the model's histories reachable from it; each has
    one arc per token ``1..N`` weighing ``ln P(token | history)`` (back-off folded, see the
    module docstring); every node accepts (no ``</s>`` factor).

    Args:
        sequences: training transcripts as token-id sequences (ids ``1..N``).
        num_tokens: ``N``.
        order: n-gram order, 1 to :data:`MAX_ORDER`.
        prune: see :func:`token_lm`.
        method: ``"kneser_ney"`` or ``"witten_bell"``.

    Returns:
        The acceptor (``calc_grad=False``): labels ``1..N``, arcs sorted by node then label.

    Example:
        >>> g = token_lm_graph([[1, 2], [2, 1, 1]], 2, order=2)
        >>> g.num_nodes(), g.num_arcs()
        (3, 6)
    """
    lm = token_lm(sequences, num_tokens, order=order, prune=prune, method=method)
    table, lp, start = token_lm_tables(lm, int(num_tokens))
    S, n = table.shape[0], int(num_tokens)
    src = np.repeat(np.arange(S), n)
    lab = np.tile(np.arange(1, n + 1), S)
    return Graph.from_arrays(
        S,
        [start],
        np.arange(S),
        src,
        table[:, 1:].ravel(),
        lab,
        None,
        lp[:, 1:].ravel().astype(np.float32),
        calc_grad=False,
    )


def denominator_graph(
    sequences: Iterable[Sequence[int]],
    num_tokens: int,
    *,
    order: int = 2,
    topology: str = "ctc",
    prune: Union[None, int, Sequence[int]] = None,
    method: str = "kneser_ney",
) -> Graph:
    """The LF-MMI denominator: ``topology`` composed with the token n-gram ``P``.

    An epsilon-free acceptor over the topology's emission classes (``num_classes(N, topology)``
    of them): every arc reads one frame; arcs that emit a token weigh ``ln P(token | history)``,
    the others 0; node 0 is the start, every node whose topology node accepts is accepting.

    Args:
        sequences: training transcripts as token-id sequences (ids ``1..N``).
        num_tokens: ``N``.
        order: n-gram order of ``P``, 1 to :data:`MAX_ORDER`.
        topology: one of :data:`~lightning_gtn.core.topologies.TOPOLOGIES`.
        prune: see :func:`token_lm`.
        method: ``"kneser_ney"`` or ``"witten_bell"``.

    Returns:
        The denominator acceptor (``calc_grad=False``), arcs sorted by node then class.

    Raises:
        ValueError: a bad argument or a token id outside ``1..N``.

    Example:
        >>> g = denominator_graph([[1, 2], [2, 1, 1]], 2, order=2, topology="ctc")
        >>> g.num_nodes(), g.num_arcs()
        (5, 15)
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
    lm = token_lm(sequences, num_tokens, order=order, prune=prune, method=method)
    n = int(num_tokens)
    table, lp, start = token_lm_tables(lm, n)
    return compose_token_acceptor(n, topology, table, lp, start, np.ones(table.shape[0], dtype=bool))


# -- plain data ----------------------------------------------------------------------------------


def graph_to_data(graph: Graph, *, info: Optional[Mapping[str, Any]] = None) -> dict:
    """A weighted acceptor as plain data (ints, floats, strings and lists of them).

    Args:
        graph: an epsilon-free acceptor (labels ``>= 0``, input and output labels equal), e.g.
            a denominator graph.
        info: optional flat mapping of short strings to ints, floats or strings stored with it
            (a topology name, an order).

    Returns:
        ``{"format": DATA_FORMAT, "version": 1, "num_nodes", "num_classes", "start", "accept",
        "src", "dst", "label", "weight", "info"}``: ``num_classes`` is one more than the highest
        label; the lists hold one entry per arc (weights as Python floats, exact float32 values).

    Raises:
        ValueError: the graph has an epsilon, differing input/output labels, a non-finite
            weight, or more than :data:`MAX_DATA_NODES` nodes / :data:`MAX_DATA_ARCS` arcs.

    Example:
        >>> g = denominator_graph([[1, 2]], 2, topology="hmm1")
        >>> graph_from_data(graph_to_data(g)).num_arcs() == g.num_arcs()
        True
    """
    if not isinstance(graph, Graph):
        raise ValueError(f"graph must be a lightning_gtn.wfst.Graph, got {type(graph).__name__}")
    a = graph.arrays()
    if a.num_nodes > MAX_DATA_NODES or len(a.src) > MAX_DATA_ARCS:
        raise ValueError(f"graph too large for data: {a.num_nodes} nodes, {len(a.src)} arcs")
    if len(a.ilabel) and int(a.ilabel.min()) < 0:
        raise ValueError("graph has an epsilon arc: only epsilon-free acceptors become data")
    if not np.array_equal(a.ilabel, a.olabel):
        raise ValueError("graph is not an acceptor (input and output labels differ)")
    if not np.all(np.isfinite(a.weights)):
        raise ValueError("graph has a non-finite weight")
    data = {
        "format": DATA_FORMAT,
        "version": _DATA_VERSION,
        "num_nodes": int(a.num_nodes),
        "num_classes": int(a.ilabel.max()) + 1 if len(a.ilabel) else 0,
        "start": a.start.tolist(),
        "accept": a.accept.tolist(),
        "src": a.src.tolist(),
        "dst": a.dst.tolist(),
        "label": a.ilabel.tolist(),
        "weight": [float(x) for x in a.weights.tolist()],
        "info": _check_info(dict(info) if info is not None else {}),
    }
    return data


_KEYS = ("format", "version", "num_nodes", "num_classes", "start", "accept", "src", "dst", "label", "weight", "info")
_MAX_INFO = 64
_MAX_STR = 256


def _check_info(info) -> dict:
    if not isinstance(info, Mapping):
        raise ValueError(f"data: info must be a mapping, got {type(info).__name__}")
    if len(info) > _MAX_INFO:
        raise ValueError(f"data: info has more than {_MAX_INFO} entries")
    out = {}
    for k, v in info.items():
        if not isinstance(k, str) or len(k) > _MAX_STR:
            raise ValueError(f"data: info keys must be strings of at most {_MAX_STR} characters")
        if isinstance(v, str):
            if len(v) > _MAX_STR:
                raise ValueError(f"data: info[{k!r}] is a string longer than {_MAX_STR}")
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        elif isinstance(v, (float, np.floating)):
            v = float(v)
            if not math.isfinite(v):
                raise ValueError(f"data: info[{k!r}] is not finite")
        else:
            raise ValueError(f"data: info[{k!r}] must be a str, int, float, bool or None, got {type(v).__name__}")
        out[k] = v
    return out


def _int(data: Mapping, key: str, low: int, high: int) -> int:
    v = data[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"data: {key} must be an integer, got {type(v).__name__}")
    v = int(v)
    if not low <= v <= high:
        raise ValueError(f"data: {key}={v} must lie in [{low}, {high}]")
    return v


def _list(data: Mapping, key: str, max_len: int, low: int, high: int) -> np.ndarray:
    """An integer list field as int64, every entry in ``[low, high)``."""
    v = data[key]
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
        raise ValueError(f"data: {key} must be a list of integers, got {type(v).__name__}")
    if len(v) > max_len:
        raise ValueError(f"data: {key} has {len(v)} entries, more than {max_len}")
    items = list(v)
    for x in items:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise ValueError(f"data: {key} must hold integers only, found {type(x).__name__}")
    try:
        arr = np.array(items, dtype=np.int64)
    except (OverflowError, ValueError):
        raise ValueError(f"data: {key} holds an integer outside int64") from None
    if arr.size and (int(arr.min()) < low or int(arr.max()) >= high):
        bad = int(arr.min()) if int(arr.min()) < low else int(arr.max())
        raise ValueError(f"data: {key} holds {bad}, outside [{low}, {high - 1}]")
    return arr


def graph_from_data(data: Mapping[str, Any]) -> Graph:
    """The acceptor of :func:`graph_to_data`, every field checked (never trusting the data).

    Args:
        data: the mapping (a ``dict``, or any ``Mapping`` such as an OmegaConf ``DictConfig``).

    Returns:
        The acceptor (``calc_grad=False``).

    Raises:
        ValueError: naming the field: a missing or unknown key, a wrong format or version, a
            count or list length beyond :data:`MAX_DATA_NODES` / :data:`MAX_DATA_ARCS`, a node id
            outside ``[0, num_nodes)``, a label outside ``[0, num_classes)``, a repeated start or
            accept id, lists of different lengths, a weight that is not a finite real number.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"data must be a mapping, got {type(data).__name__}")
    keys = set(data.keys())
    missing = [k for k in _KEYS if k not in keys]
    if missing:
        raise ValueError(f"data: missing {missing}")
    extra = sorted(str(k)[:40] for k in keys - set(_KEYS))
    if extra:
        raise ValueError(f"data: unknown keys {extra[:5]}")
    if data["format"] != DATA_FORMAT:
        raise ValueError(f"data: format must be {DATA_FORMAT!r}")
    _int(data, "version", _DATA_VERSION, _DATA_VERSION)
    n = _int(data, "num_nodes", 0, MAX_DATA_NODES)
    c = _int(data, "num_classes", 0, 1 << 24)
    start = _list(data, "start", n, 0, n)
    accept = _list(data, "accept", n, 0, n)
    for name, ids in (("start", start), ("accept", accept)):
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"data: {name} names a node more than once")
    src = _list(data, "src", MAX_DATA_ARCS, 0, n)
    e = len(src)
    dst = _list(data, "dst", e, 0, n)
    lab = _list(data, "label", e, 0, c)
    w = data["weight"]
    if isinstance(w, (str, bytes, Mapping)) or not isinstance(w, Sequence):
        raise ValueError(f"data: weight must be a list of numbers, got {type(w).__name__}")
    if len(w) > e:
        raise ValueError(f"data: weight has {len(w)} entries, more than the {e} arcs")
    wl = list(w)
    for x in wl:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise ValueError(f"data: weight must hold real numbers only, found {type(x).__name__}")
    try:
        weights = np.array(wl, dtype=np.float64)
    except (OverflowError, ValueError):
        raise ValueError("data: weight holds a number that is not a float") from None
    if len(dst) != e or len(lab) != e or len(weights) != e:
        raise ValueError(f"data: src, dst, label and weight must all have {e} entries (one per arc)")
    if e and (not np.all(np.isfinite(weights)) or np.abs(weights).max() > 3.0e38):
        raise ValueError("data: weight must hold finite float32 numbers")
    _check_info(data["info"])
    return Graph.from_arrays(n, start, accept, src, dst, lab, None, weights.astype(np.float32), calc_grad=False)
