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
  up to float32 rounding of each arc). Kaldi's chain phone LM is also an epsilon-free
  deterministic acceptor, but unsmoothed (arcs only for the phones seen after a history);
  removing instead the epsilons of ARPA back-off arcs (icefall's ``P``) keeps both the
  explicit and the backed-off path of a seen n-gram, which this construction does not.
* ``</s>`` and ``<unk>`` have no token id and no arc: every state accepts with weight 0 (as
  Kaldi chain treats every denominator state as final with probability one at the end of a
  training chunk), so the paths of ``T``
  frames score the prefix probabilities ``ln P(w_1 .. w_k)`` without the end-of-sentence
  factor, and the arcs leaving a state sum to ``1 - P(</s> | h) - P(<unk> | h)`` in
  probability.

Its size is ``states * N`` arcs: ``order=2`` has ``N + 1`` states (``<s>`` and each token);
``prune`` removes rare n-grams of order 2 and more and with them the histories of higher orders
(it changes a bigram's probabilities, not its size).

The **denominator** (:func:`denominator_graph`) is the topology
(:mod:`lightning_gtn.core.topologies`) composed with ``P``: nodes are the reachable pairs
(topology node, ``P`` state), every arc reads one emission class, arcs that emit a token carry
``P``'s weight and the others 0. It is built directly from ``P``'s tables, level by level with numpy.

:func:`graph_to_data` / :func:`graph_from_data` turn such an acceptor into plain data (ints,
floats, strings, lists) for configs and checkpoints, and back with every field checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from ..core.topologies import MMI_TOPOLOGIES, compose_token_acceptor
from ..wfst import Graph
from .estimate import estimate
from .ngram import NGramLM

__all__ = [
    "MAX_ORDER",
    "MAX_P_ARCS",
    "MAX_DATA_NODES",
    "MAX_DATA_ARCS",
    "MAX_DATA_CLASSES",
    "MAX_DATA_WEIGHT",
    "DATA_FORMAT",
    "token_lm",
    "token_lm_tables",
    "PTables",
    "token_lm_graph",
    "denominator_graph",
    "graph_to_data",
    "graph_from_data",
]

MAX_ORDER = 4
"""The highest n-gram order of ``P`` (every state has an arc per token, so sizes grow fast)."""

MAX_P_ARCS = 1 << 25
"""The most arcs ``P`` may have (states times tokens) before folding refuses to allocate it."""

MAX_DATA_NODES = 1 << 22
"""The most nodes :func:`graph_from_data` accepts."""

MAX_DATA_ARCS = 1 << 22
"""The most arcs :func:`graph_from_data` accepts."""

MAX_DATA_CLASSES = 1 << 24
"""The most emission classes :func:`graph_from_data` accepts."""

MAX_DATA_WEIGHT = 1.0e4
"""The largest arc weight magnitude :func:`graph_from_data` accepts (a log-score: an n-gram's are
tens at most). A path of ``T`` arcs then scores at most ``T * (MAX_DATA_WEIGHT + log(arcs))``, so
``log Z`` stays finite in float32 for any realistic ``T``; a weight of ``3e38`` would overflow
within two frames."""

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


class PTables(NamedTuple):
    """``P`` with its back-off folded, as dense tables (see :func:`token_lm_tables`).

    Attributes:
        next_state: ``(S, N + 1)`` int64, the state after token ``w`` (column ``w``; column 0
            unused, ``-1``).
        logp: ``(S, N + 1)`` float64 ``ln P(w | state)`` (column 0: ``-inf``).
        start: the state of ``<s>`` (0).
        final: ``(S,)`` float64 ``ln P(</s> | state)``.
    """

    next_state: np.ndarray
    logp: np.ndarray
    start: int
    final: np.ndarray


def token_lm_tables(lm: NGramLM, num_tokens: int) -> PTables:
    """``P`` with its back-off folded, as dense tables over its reachable states.

    Args:
        lm: a model whose words include ``"1" .. "N"`` (:func:`token_lm`).
        num_tokens: ``N``.

    Returns:
        :class:`PTables`: state 0 is ``<s>`` (``start`` is 0), states are numbered breadth
        first; ``</s>`` is scored like a token (back-off included) into ``final``.

    Raises:
        ValueError: the model lacks a token's word, or ``P`` would have more than
            :data:`MAX_P_ARCS` arcs.
    """
    a = lm.arrays()
    S0 = a.backoff_logp.shape[0]
    if S0 * num_tokens > MAX_P_ARCS:
        raise ValueError(
            f"P would have {S0} states x {num_tokens} tokens = {S0 * num_tokens} arcs, more than "
            f"{MAX_P_ARCS}: lower the order or prune more"
        )
    wid = np.array([lm.word_id(str(k)) for k in range(1, num_tokens + 1)], dtype=np.int64)
    if np.any(wid == lm.unk):
        raise ValueError("the model lacks a word for some token id (build it with token_lm)")
    wid = np.append(wid, lm.eos)  # the last column: </s>
    cols = num_tokens + 1
    V = len(lm.words)
    counts = np.diff(a.state_offsets)
    arc_state = np.repeat(np.arange(S0, dtype=np.int64), counts)
    keys = arc_state * V + a.arc_word.astype(np.int64)  # sorted: states, then words ascending
    # fold the back-off of every (state, token) pair at once
    cur = np.repeat(np.arange(S0, dtype=np.int64), cols)
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
    nxt2 = nxt.reshape(S0, cols)[:, :num_tokens]
    logp2 = logp.reshape(S0, cols)
    final = logp2[:, num_tokens]
    logp2 = logp2[:, :num_tokens]
    # keep the states reachable from <s>, numbered breadth first
    start = int(a.start_state)
    new_id = np.full(S0, -1, dtype=np.int64)
    new_id[start] = 0
    order_l = [np.array([start])]
    frontier = order_l[0]
    num = 1
    while len(frontier):
        dst = np.unique(nxt2[frontier].ravel())
        dst = dst[(dst >= 0)]
        dst = dst[new_id[dst] < 0]
        new_id[dst] = np.arange(num, num + len(dst))
        num += len(dst)
        order_l.append(dst)
        frontier = dst
    old = np.concatenate(order_l)
    table = np.full((num, num_tokens + 1), -1, dtype=np.int64)
    lp = np.full((num, num_tokens + 1), -math.inf)
    table[:, 1:] = np.where(nxt2[old] >= 0, new_id[np.maximum(nxt2[old], 0)], -1)
    lp[:, 1:] = logp2[old]
    return PTables(table, lp, 0, final[old])


def token_lm_graph(
    sequences: Iterable[Sequence[int]],
    num_tokens: int,
    *,
    order: int = 2,
    prune: Union[None, int, Sequence[int]] = None,
    method: str = "kneser_ney",
    eos: bool = False,
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
        eos: include ``ln P(</s> | history)``: every arc gets a copy, weighing that much more,
            into one new accepting node (the last; the only accepting one), so a non-empty path
            scores the whole sentence; twice the arcs.

    Returns:
        The acceptor (``calc_grad=False``): labels ``1..N``, arcs sorted by node then label.

    Example:
        >>> g = token_lm_graph([[1, 2], [2, 1, 1]], 2, order=2)
        >>> g.num_nodes(), g.num_arcs()
        (3, 6)
    """
    lm = token_lm(sequences, num_tokens, order=order, prune=prune, method=method)
    p = token_lm_tables(lm, int(num_tokens))
    S, n = p.next_state.shape[0], int(num_tokens)
    src = np.repeat(np.arange(S), n)
    dst = p.next_state[:, 1:].ravel()
    lab = np.tile(np.arange(1, n + 1), S)
    w = p.logp[:, 1:].ravel()
    accept = np.arange(S)
    if eos:
        src, lab = np.concatenate([src, src]), np.concatenate([lab, lab])
        w = np.concatenate([w, w + p.final[dst]])
        dst = np.concatenate([dst, np.full(len(dst), S)])
        o = np.lexsort((dst, lab, src))
        src, dst, lab, w = src[o], dst[o], lab[o], w[o]
        S, accept = S + 1, np.array([S])
    return Graph.from_arrays(S, [p.start], accept, src, dst, lab, None, w.astype(np.float32), calc_grad=False)


def denominator_graph(
    sequences: Iterable[Sequence[int]],
    num_tokens: int,
    *,
    order: int = 2,
    topology: str = "ctc",
    prune: Union[None, int, Sequence[int]] = None,
    method: str = "kneser_ney",
    eos: bool = False,
) -> Graph:
    """The LF-MMI denominator: ``topology`` composed with the token n-gram ``P``.

    An epsilon-free acceptor over the topology's emission classes (``num_classes(N, topology)``
    of them): every arc reads one frame; arcs that emit a token weigh ``ln P(token | history)``,
    the others 0; node 0 is the start, every node whose topology node accepts is accepting.

    Args:
        sequences: training transcripts as token-id sequences (ids ``1..N``).
        num_tokens: ``N``.
        order: n-gram order of ``P``, 1 to :data:`MAX_ORDER`.
        topology: one of :data:`~lightning_gtn.core.topologies.MMI_TOPOLOGIES`.
        prune: see :func:`token_lm`.
        method: ``"kneser_ney"`` or ``"witten_bell"``.
        eos: include ``ln P(</s> | history)`` at the end of every path of one or more frames:
            the arcs that may end a path get a copy into one new accepting node (the last, the
            only accepting one) weighing that much more (about twice the arcs; see
            :func:`~lightning_gtn.core.topologies.compose_token_acceptor`). Without it every
            node of an accepting topology node accepts with weight 0.

    Returns:
        The denominator acceptor (``calc_grad=False``), arcs sorted by node then class.

    Raises:
        ValueError: a bad argument or a token id outside ``1..N``.

    Example:
        >>> g = denominator_graph([[1, 2], [2, 1, 1]], 2, order=2, topology="ctc")
        >>> g.num_nodes(), g.num_arcs()
        (5, 15)
        >>> g = denominator_graph([[1, 2], [2, 1, 1]], 2, order=2, topology="ctc", eos=True)
        >>> g.num_nodes(), g.num_arcs(), g.accept()
        (6, 30, [5])
    """
    if topology not in MMI_TOPOLOGIES:
        raise ValueError(f"topology must be one of {MMI_TOPOLOGIES}, got {topology!r}")
    lm = token_lm(sequences, num_tokens, order=order, prune=prune, method=method)
    n = int(num_tokens)
    p = token_lm_tables(lm, n)
    return compose_token_acceptor(
        n,
        topology,
        p.next_state,
        p.logp,
        p.start,
        np.ones(p.next_state.shape[0], dtype=bool),
        final=p.final if eos else None,
    )


# -- plain data ----------------------------------------------------------------------------------

_INT = r"[0-9]{1,10}"
# every repeat bounded and no two alternatives overlap: matching stays linear on hostile text
_FLOAT = r"-?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][-+]?[0-9]{1,3})?"
_IDS_RE = re.compile(rf"(?:{_INT}(?: {_INT})*)?")
_ARC_RE = re.compile(rf"{_INT} {_INT} {_INT} {_FLOAT}")
_ARCS_RE = re.compile(rf"(?:{_ARC_RE.pattern}(?:\n{_ARC_RE.pattern})*)?")
_MAX_ARC_CHARS = 64  # a line: three ids of at most 10 digits, a weight of at most 9 digits + exponent
_KEYS = ("format", "version", "num_nodes", "num_classes", "start", "accept", "arcs", "info")
_MAX_INFO = 64
_MAX_STR = 256


def graph_to_data(graph: Graph, *, info: Optional[Mapping[str, Any]] = None) -> dict:
    """A weighted acceptor as plain data (ints and strings) for configs and checkpoints.

    Arcs travel as one string (a config or checkpoint holds it as one value, not as hundreds of
    thousands of list entries), one line ``"src dst label weight"`` per arc, in arc order, the
    weight with 9 significant digits (what a float32 needs to come back exactly).

    Args:
        graph: an epsilon-free acceptor (labels ``>= 0``, input and output labels equal, finite
            weights), e.g. a denominator graph.
        info: optional flat mapping of short strings to ints, floats, strings, bools or None
            stored with it (a topology name, an order).

    Returns:
        ``{"format": DATA_FORMAT, "version": 1, "num_nodes": int, "num_classes": int,
        "start": "ids", "accept": "ids", "arcs": "lines", "info": {...}}``: ``num_classes`` is
        one more than the highest label; ``start``/``accept`` are space-separated node ids.

    Raises:
        ValueError: the graph has an epsilon, differing input/output labels, a non-finite
            weight, or more than :data:`MAX_DATA_NODES` nodes / :data:`MAX_DATA_ARCS` arcs.

    Example:
        >>> g = denominator_graph([[1, 2]], 2, topology="hmm1")
        >>> data = graph_to_data(g)
        >>> data["arcs"].splitlines()[0]
        '0 1 0 -0.437213808'
        >>> graph_from_data(data).num_arcs() == g.num_arcs()
        True
    """
    if not isinstance(graph, Graph):
        raise ValueError(f"graph must be a lightning_gtn.wfst.Graph, got {type(graph).__name__}")
    a = graph.arrays()
    if a.num_nodes > MAX_DATA_NODES or len(a.src) > MAX_DATA_ARCS:
        raise ValueError(
            f"graph too large for data: {a.num_nodes} nodes, {len(a.src)} arcs "
            f"(at most {MAX_DATA_NODES} and {MAX_DATA_ARCS})"
        )
    if len(a.ilabel) and int(a.ilabel.min()) < 0:
        raise ValueError("graph has an epsilon arc: only epsilon-free acceptors become data")
    if not np.array_equal(a.ilabel, a.olabel):
        raise ValueError("graph is not an acceptor (input and output labels differ)")
    if not np.all(np.isfinite(a.weights)):
        raise ValueError("graph has a non-finite weight")
    arcs = "\n".join(
        f"{s} {d} {lab} {w:.9g}"
        for s, d, lab, w in zip(a.src.tolist(), a.dst.tolist(), a.ilabel.tolist(), a.weights.tolist())
    )
    return {
        "format": DATA_FORMAT,
        "version": _DATA_VERSION,
        "num_nodes": int(a.num_nodes),
        "num_classes": int(a.ilabel.max()) + 1 if len(a.ilabel) else 0,
        "start": " ".join(str(i) for i in a.start.tolist()),
        "accept": " ".join(str(i) for i in a.accept.tolist()),
        "arcs": arcs,
        "info": _check_info(dict(info) if info is not None else {}),
    }


def _check_info(info) -> dict:
    if not isinstance(info, Mapping):
        raise ValueError(f"data: info must be a mapping, got {type(info).__name__}")
    if len(info) > _MAX_INFO:
        raise ValueError(f"data: info has more than {_MAX_INFO} entries")
    out: dict = {}
    for k, v in info.items():
        if not isinstance(k, str) or len(k) > _MAX_STR:
            raise ValueError(f"data: info keys must be strings of at most {_MAX_STR} characters")
        if isinstance(v, str):
            if len(v) > _MAX_STR:
                raise ValueError(f"data: info[{k!r}] is a string longer than {_MAX_STR}")
        elif isinstance(v, (bool, np.bool_)) or v is None:
            v = None if v is None else bool(v)
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


def _ids(data: Mapping, key: str, num_nodes: int) -> np.ndarray:
    """A string of distinct space-separated node ids in ``[0, num_nodes)``."""
    v = data[key]
    if not isinstance(v, str):
        raise ValueError(f"data: {key} must be a string of space-separated node ids, got {type(v).__name__}")
    if len(v) > 11 * max(num_nodes, 1):
        raise ValueError(f"data: {key} is longer than {num_nodes} node ids can be")
    if not _IDS_RE.fullmatch(v):
        raise ValueError(f"data: {key} must be node ids (decimal digits) separated by single spaces")
    ids = np.array([int(t) for t in v.split()], dtype=np.int64)
    if ids.size and int(ids.max()) >= num_nodes:
        raise ValueError(f"data: {key} holds {int(ids.max())}, outside [0, {num_nodes - 1}]")
    if len(np.unique(ids)) != len(ids):
        raise ValueError(f"data: {key} names a node more than once")
    return ids


def _arcs(data: Mapping, num_nodes: int, num_classes: int):
    v = data["arcs"]
    if not isinstance(v, str):
        raise ValueError(f"data: arcs must be a string of 'src dst label weight' lines, got {type(v).__name__}")
    if len(v) > MAX_DATA_ARCS * _MAX_ARC_CHARS:
        raise ValueError(f"data: arcs is longer than {MAX_DATA_ARCS} arcs can be")
    if not _ARCS_RE.fullmatch(v):
        for no, line in enumerate(v.split("\n"), start=1):
            if not _ARC_RE.fullmatch(line):
                raise ValueError(f"data: arcs line {no} is not 'src dst label weight' (decimal numbers): {line[:60]!r}")
        raise ValueError("data: arcs must be lines 'src dst label weight' separated by single newlines")
    toks = v.split()
    e = len(toks) // 4
    if e > MAX_DATA_ARCS:
        raise ValueError(f"data: arcs has {e} lines, more than {MAX_DATA_ARCS}")
    rows = np.array(toks, dtype=object).reshape(e, 4)
    ints = rows[:, :3].astype(np.int64)
    weights = rows[:, 3].astype(np.float64)
    for col, name, high in ((0, "src", num_nodes), (1, "dst", num_nodes), (2, "label", num_classes)):
        if e and int(ints[:, col].max()) >= high:
            raise ValueError(f"data: arcs hold {name} {int(ints[:, col].max())}, outside [0, {high - 1}]")
    if e and (not np.all(np.isfinite(weights)) or float(np.abs(weights).max()) > 3.0e38):
        raise ValueError("data: arcs hold a weight beyond float32")
    return ints[:, 0], ints[:, 1], ints[:, 2], weights.astype(np.float32)


def graph_from_data(data: Mapping[str, Any]) -> Graph:
    """The acceptor of :func:`graph_to_data`, every field checked (never trusting the data).

    Args:
        data: the mapping (a ``dict``, or any ``Mapping`` such as an OmegaConf ``DictConfig``).

    Returns:
        The acceptor (``calc_grad=False``).

    Raises:
        ValueError: naming the field: a missing or unknown key, a wrong format or version, a
            count beyond :data:`MAX_DATA_NODES` / :data:`MAX_DATA_ARCS` or a string longer than
            such counts allow (checked before parsing), a malformed line, a node id outside
            ``[0, num_nodes)``, a label outside ``[0, num_classes)``, a repeated start or accept
            id, a weight that is not a finite float32 or beyond :data:`MAX_DATA_WEIGHT`, no
            start or accept node, or no path from a start node to an accept node.
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
    c = _int(data, "num_classes", 0, MAX_DATA_CLASSES)
    start = _ids(data, "start", n)
    accept = _ids(data, "accept", n)
    src, dst, lab, weights = _arcs(data, n, c)
    if len(weights) and float(np.abs(weights).max()) > MAX_DATA_WEIGHT:
        at = int(np.abs(weights).argmax())
        raise ValueError(
            f"data: arcs line {at + 1} has weight {float(weights[at]):.6g}, beyond +-MAX_DATA_WEIGHT="
            f"{MAX_DATA_WEIGHT:g} (log Z would overflow)"
        )
    if not start.size or not accept.size:
        raise ValueError(f"data: {'start' if not start.size else 'accept'} names no node: the acceptor has no path")
    if not _reaches(n, start, accept, src, dst):
        raise ValueError("data: no accept node can be reached from a start node: the acceptor has no path")
    _check_info(data["info"])
    return Graph.from_arrays(n, start, accept, src, dst, lab, None, weights, calc_grad=False)


def _reaches(n: int, start: np.ndarray, accept: np.ndarray, src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether a path of arcs leads from a node of ``start`` to one of ``accept`` (a depth-first
    walk over the arcs sorted by source, each node and arc visited once)."""
    order = np.argsort(src, kind="stable")
    nxt = dst[order].tolist()
    off = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    goal = np.zeros(n, dtype=bool)
    goal[accept] = True
    is_goal = goal.tolist()
    seen = [False] * n
    stack = [int(v) for v in start]
    for v in stack:
        seen[v] = True
    while stack:
        u = stack.pop()
        if is_goal[u]:
            return True
        for v in nxt[off[u] : off[u + 1]]:
            if not seen[v]:
                seen[v] = True
                stack.append(v)
    return False
