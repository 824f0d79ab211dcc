"""Token n-gram transition graphs learned from training transcripts, with back-off and
pruning of rare n-grams (the "pruned n-gram with back-off" transition model of the
differentiable-WFST papers), and their files.

A transition graph is an acceptor over the token labels ``[0, num_tokens)``. Its states are
the *histories* kept from the training sequences: the unigram state ``()``, the
sentence-start state ``(<s>,)``, and one state per kept n-gram shorter than ``order``. From a
history ``h`` there is an arc for every kept continuation ``w`` (the n-gram ``h + (w,)`` was
seen more than ``prune`` times), going to the longest suffix of ``h + (w,)`` that is a state.
Continuations that were pruned (or never seen) are reached through a *back-off* epsilon arc
from ``h`` to its longest proper suffix state, down to the unigram state, which has an arc for
every token: with ``backoff=True`` every token sequence is accepted. End of sentence is an
epsilon arc from a history into the one accept state (``end=True``).

Arc weights are 0 by default: a loss keeps one parameter per arc and learns them. With
``init="counts"`` they are log relative frequencies of the training counts (see
:func:`transitions_graph`).

Determinism: without back-off arcs the graph is deterministic on tokens (a state has at most
one arc per label; the only epsilon arc goes to the accept state and ends the path). Back-off
makes it non-deterministic, as the research graph is: a token seen after ``h`` can be read
from ``h`` directly or after the back-off epsilon, so ``forward_score`` sums both paths
(the usual approximation of back-off models as WFSTs), while Viterbi picks one.

Typical use with word pieces (a run's token set and its transition model)::

    pieces = train_word_pieces(train_texts, 200)                 # lightning_gtn.wordpieces
    save_word_pieces(pieces, run_dir / "word_pieces.txt")
    seqs = [greedy_segment(t, pieces) for t in train_texts]
    C = len(pieces) + 1                                          # the blank last
    T = transitions_graph(seqs, C, order=2, prune=5, blank="optional", self_loops=True)
    save_transitions(run_dir / "transitions.bin", T, C, tokens=pieces + ["<blank>"],
                     info={"order": 2, "prune": 5, "blank": "optional"})

Example:
    >>> import lightning_gtn.wfst as gtn
    >>> from lightning_gtn.wfst.ngram import transitions_graph
    >>> g = transitions_graph([[0, 1, 1], [0, 1]], num_tokens=3, order=2)
    >>> g.num_nodes(), g.num_arcs()
    (5, 11)
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from ..files import open_regular
from ..integers import check_int
from .graph import _FLOAT, _INT, Graph, epsilon
from .utils import load, save

__all__ = [
    "SENTENCE_START",
    "SENTENCE_END",
    "MAX_ORDER",
    "MAX_TOKENS",
    "DEFAULT_MAX_BYTES",
    "count_ngrams",
    "prune_ngrams",
    "transitions_graph",
    "save_transitions",
    "load_transitions",
]

SENTENCE_START = -2
"""The sentence-start symbol ``<s>`` in the n-grams of :func:`count_ngrams` (never a label)."""

SENTENCE_END = -3
"""The sentence-end symbol ``</s>`` in the n-grams of :func:`count_ngrams` (never a label)."""

MAX_ORDER = 5
"""The highest n-gram order accepted."""

MAX_TOKENS = 1 << 20
"""The most tokens a transition graph may have (the unigram state has one arc per token)."""

DEFAULT_MAX_BYTES = 256 * 2**20
"""The largest transition graph file (and sidecar) :func:`load_transitions` reads by default."""

_FORMAT = "lightning_gtn.transitions"
_VERSION = 1
_BLANKS = ("none", "optional", "forced")
_INITS = ("zeros", "counts")
_UNSEEN = 0.5  # the count given to unseen unigrams and to a back-off with no pruned mass

Gram = Tuple[int, ...]


# -- validation -----------------------------------------------------------------------------------


def _check_sequences(sequences, num_tokens: Optional[int], name: str = "sequences") -> List[Gram]:
    """Token sequences as tuples of Python ints, each id in ``[0, num_tokens)``."""
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Iterable):
        raise TypeError(f"{name} must be a sequence of token-id sequences, got {type(sequences).__name__}")
    out = []
    for i, seq in enumerate(sequences):
        if isinstance(seq, (str, bytes)):
            raise TypeError(f"{name}[{i}] is a {type(seq).__name__}: map tokens to integer ids first")
        if hasattr(seq, "tolist"):  # numpy arrays and torch tensors
            if getattr(seq, "ndim", 1) != 1:
                raise ValueError(f"{name}[{i}] must be 1-D, got shape {tuple(seq.shape)}")
            seq = seq.tolist()
        if not isinstance(seq, Iterable):
            raise TypeError(f"{name}[{i}] must be a sequence of ints, got {type(seq).__name__}")
        seq = tuple(seq)
        if not all(type(t) is int for t in seq):  # the fast path takes plain ints only
            for t in seq:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise TypeError(f"{name}[{i}] must hold ints, got {type(t).__name__}")
            seq = tuple(int(t) for t in seq)
        if seq and (min(seq) < 0 or (num_tokens is not None and max(seq) >= num_tokens)):
            bad = min(seq) if min(seq) < 0 else max(seq)
            bound = f"[0, {num_tokens})" if num_tokens is not None else ">= 0"
            raise ValueError(f"{name}[{i}] has token id {bad}, expected ids in {bound}")
        out.append(seq)
    return out


def _thresholds(prune, order: int) -> List[int]:
    if isinstance(prune, (int, np.integer)) and not isinstance(prune, bool):
        p = check_int(prune, "prune", 0)
        return [0] + [p] * (order - 1)
    if isinstance(prune, (str, bytes)) or not isinstance(prune, Iterable):
        raise TypeError(f"prune must be an int or a sequence of {order} ints, got {type(prune).__name__}")
    prune = list(prune)
    if len(prune) != order:
        raise ValueError(f"prune must have one threshold per order ({order}), got {len(prune)}")
    prune = [check_int(p, f"prune[{i}]", 0) for i, p in enumerate(prune)]
    if any(a > b for a, b in zip(prune, prune[1:])):
        raise ValueError(f"prune thresholds must be non-decreasing with the order, got {prune}")
    return prune


# -- counting -------------------------------------------------------------------------------------


def count_ngrams(sequences, order: int, *, start: bool = True, end: bool = True) -> List[Counter]:
    """Counts the token n-grams of the sequences, orders 1 to ``order``.

    Each sequence is padded with one :data:`SENTENCE_START` in front (``start=True``) and one
    :data:`SENTENCE_END` behind (``end=True``). An n-gram is counted at each position it
    *predicts*: ``<s>`` is never predicted (there is no ``(<s>,)`` unigram, and ``<s>`` only
    starts n-grams), ``</s>`` is predicted once per sequence. A sequence shorter than the
    order gives shorter n-grams from ``<s>`` (no repeated padding).

    Args:
        sequences: token-id sequences (lists, tuples, or 1-D arrays/tensors of ints >= 0).
        order: the highest order ``n`` (1 to :data:`MAX_ORDER`).
        start: pad with the sentence-start symbol.
        end: pad with the sentence-end symbol.

    Returns:
        ``counts``, a list of ``order`` Counters: ``counts[k - 1][gram]`` is how often the
        k-gram ``gram`` (a tuple of ints) occurs.

    Example:
        >>> c = count_ngrams([[5, 6]], 2)
        >>> dict(c[0]), dict(c[1])
        ({(5,): 1, (6,): 1, (-3,): 1}, {(-2, 5): 1, (5, 6): 1, (6, -3): 1})
    """
    order = check_int(order, "order", 1, MAX_ORDER)
    return _count(_check_sequences(sequences, None), order, bool(start), bool(end))


def _count(seqs: List[Gram], order: int, start: bool, end: bool) -> List[Counter]:
    counts: List[Counter] = [Counter() for _ in range(order)]
    head = (SENTENCE_START,) if start else ()
    tail = (SENTENCE_END,) if end else ()
    first = 1 if start else 0  # <s> is context only: no n-gram ends on it
    for seq in seqs:
        line = head + seq + tail
        for k in range(1, order + 1):
            # the k-grams ending at positions >= max(first, k - 1)
            lo = max(first, k - 1) - (k - 1)
            counts[k - 1].update(zip(*(line[lo + j :] for j in range(k))))
    return counts


def prune_ngrams(counts: Sequence[Counter], prune) -> List[Dict[Gram, int]]:
    """Keeps the n-grams seen more than their order's threshold.

    Args:
        counts: what :func:`count_ngrams` returns.
        prune: an int ``p`` (thresholds ``(0, p, p, ...)``: unigrams are all kept) or one
            non-decreasing threshold per order; a k-gram is kept if its count is larger than
            ``prune[k - 1]``.

    Returns:
        One dict per order, kept n-gram to count.
    """
    thr = _thresholds(prune, len(counts))
    return [{g: c for g, c in cnt.items() if c > t} for cnt, t in zip(counts, thr)]


# -- blank and self-loop n-grams ------------------------------------------------------------------


def _blank_grams(kept: List[Dict[Gram, int]], blank_id: int, mode: str, start: bool) -> List[set]:
    """The n-grams the blank adds (the research code's blank handling, rewritten).

    In the research code every kept n-gram is spelled with blanks inserted before any token
    and after the last (``optional``: every subset of those slots; ``forced``: all of them),
    never before ``<s>`` or after ``</s>``, and each contiguous piece of a spelling, up to the
    order, that contains a blank becomes an n-gram; ``(blank,)`` always does. Such a piece
    covers a contiguous sub-gram of the kept n-gram, which is kept too (thresholds do not
    decrease with the order), so the same set is made here piece by piece: for every kept
    n-gram (and ``(<s>,)``), its tokens with blanks between them (any, or all for ``forced``)
    and optionally one before and one after, up to the order. With ``forced`` the
    blank-free n-grams above unigrams are dropped by the caller, since a blank must separate
    any two tokens.
    """
    order = len(kept)
    added: List[set] = [set() for _ in range(order)]
    added[0].add((blank_id,))
    grams = [g for level in kept for g in level]
    if start:
        grams.append((SENTENCE_START,))
    b = (blank_id,)
    for g in grams:
        n = len(g)
        if mode == "optional":
            inners: Iterable = itertools.product((0, 1), repeat=n - 1)
        else:
            inners = ((1,) * (n - 1),)
        leads = (0, 1) if g[0] != SENTENCE_START else (0,)
        trails = (0, 1) if g[-1] != SENTENCE_END else (0,)
        for inner in inners:
            k = n + sum(inner)
            if k > order:
                continue
            body = [g[0]]
            for j in range(1, n):
                if inner[j - 1]:
                    body.append(blank_id)
                body.append(g[j])
            body_t = tuple(body)
            for lead in leads:
                for trail in trails:
                    if k + lead + trail > order or not (lead or trail or k > n):
                        continue
                    sub = b * lead + body_t + b * trail
                    added[len(sub) - 1].add(sub)
    return added


def _self_loop_grams(grams: List[set]) -> List[set]:
    """Adds, for each k-gram (k < order), the (k+1)-grams that repeat one of its tokens
    (the research code's ``add_self_loops``): frame-level label sequences repeat a token for
    as many frames as it lasts."""
    for k in range(1, len(grams)):
        for g in sorted(grams[k - 1]):
            for pos, tok in enumerate(g):
                if tok >= 0:
                    grams[k].add(g[:pos] + (tok,) + g[pos:])
    return grams


# -- the graph ------------------------------------------------------------------------------------


def transitions_graph(
    sequences,
    num_tokens: int,
    order: int = 2,
    prune: Union[int, Sequence[int]] = 0,
    backoff: bool = True,
    start: bool = True,
    end: bool = True,
    *,
    blank: str = "none",
    self_loops: bool = False,
    init: str = "zeros",
    calc_grad: bool = True,
) -> Graph:
    """A token n-gram transition acceptor built from training sequences.

    States are the kept histories: ``()`` (the unigram state), ``(<s>,)`` (the start state
    when ``start`` and ``order >= 2``), and every kept k-gram with ``k < order`` (and every
    prefix of a kept n-gram). Arcs:

    * from ``()``, one arc per token ``t`` in ``[0, num_tokens)``, seen or not, to the state
      ``(t,)`` if it exists, else back to ``()``;
    * for each kept k-gram ``h + (w,)`` with ``k >= 2``, an arc from ``h`` reading ``w`` to the
      longest suffix of ``h + (w,)`` (at most ``order - 1`` long) that is a state;
    * with ``backoff``, one epsilon arc from every state but ``()`` to its longest proper
      suffix state; pruned and unseen continuations are reached through it;
    * with ``end``, an epsilon arc into the single accept state for ``()`` and for every
      history whose sentence-end n-gram was kept. Without ``end`` every history accepts.

    So the graph has ``O(kept n-grams + states + num_tokens)`` arcs, never
    ``num_tokens ** order`` unless that many n-grams are kept.

    **Blank.** With ``blank="optional"`` or ``"forced"``, the last label ``num_tokens - 1`` is
    the blank, which the sequences must not contain (the transducer's frame labels put it
    last). As in the research code, each kept n-gram is also spelled with blanks between its
    tokens (optional: any of them; forced: all of them), and the n-grams of those spellings
    that contain a blank are added; with ``forced`` the blank-free n-grams above unigrams are
    dropped. ``self_loops=True`` adds, for each kept k-gram below the order, the (k+1)-grams
    repeating one of its tokens (frame labels repeat a token while it lasts); without it
    repeats go through back-off.

    **Weights.** ``init="zeros"`` (default): every arc weighs 0, to be learned.
    ``init="counts"``: log relative frequencies of the unpruned counts: the arc for ``w``
    from ``h`` weighs ``log c(h w) / c(h .)``, where ``c(h .)`` is how often ``h`` is followed
    by anything (``</s>`` included); a back-off arc weighs ``log m / c(h .)``, ``m`` being the
    count mass of the pruned continuations of ``h`` (at least 0.5, so with no pruning the
    back-off is finite and lighter than any seen continuation); a token never seen gets 0.5
    counts on its unigram arc. Arcs that only the blank or self-loop options add weigh 0.
    Without pruning and back-off, the score of a sequence is its maximum-likelihood n-gram
    log-probability.

    Args:
        sequences: the training token-id sequences (ids in ``[0, num_tokens)``).
        num_tokens: the number of labels ``C`` (the blank included when there is one).
        order: the n-gram order, 1 to :data:`MAX_ORDER`.
        prune: an int ``p``: every n-gram of order >= 2 seen ``p`` times or fewer is dropped
            (all seen tokens keep their unigram history); or one non-decreasing threshold per
            order (``prune[0]`` for the unigram histories), as the research script takes.
        backoff: add the back-off epsilon arcs (needed to accept unseen n-grams).
        start: condition the first token on sentence start (``(<s>,)`` is the start state);
            otherwise ``()`` is.
        end: model sentence end (epsilon arcs into one accept state); otherwise every state
            accepts.
        blank: ``"none"``, ``"optional"`` or ``"forced"``.
        self_loops: add n-grams that repeat a token.
        init: ``"zeros"`` or ``"counts"``.
        calc_grad: the graph's ``calc_grad``.

    Returns:
        A :class:`Graph` acceptor over labels ``[0, num_tokens)`` and epsilon. Node and arc
        numbering is deterministic (arcs grouped by source state, epsilons first).

    Raises:
        TypeError, ValueError: for malformed arguments (the message names the argument).

    Example:
        >>> g = transitions_graph([[0, 1]], num_tokens=2, order=1, init="counts")
        >>> g.num_arcs()  # one arc per token, and the end of sentence
        3
    """
    num_tokens = check_int(num_tokens, "num_tokens", 1, MAX_TOKENS)
    order = check_int(order, "order", 1, MAX_ORDER)
    if blank not in _BLANKS:
        raise ValueError(f"blank must be one of {_BLANKS}, got {blank!r}")
    if init not in _INITS:
        raise ValueError(f"init must be one of {_INITS}, got {init!r}")
    for name, v in (("backoff", backoff), ("start", start), ("end", end), ("self_loops", self_loops)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    has_blank = blank != "none"
    if has_blank and num_tokens < 2:
        raise ValueError(f"num_tokens must be >= 2 with a blank (the blank is the last id), got {num_tokens}")
    blank_id = num_tokens - 1 if has_blank else None
    seqs = _check_sequences(sequences, num_tokens - 1 if has_blank else num_tokens)
    thr = _thresholds(prune, order)

    counts = _count(seqs, order, bool(start), bool(end))
    data_kept = [{g: c for g, c in cnt.items() if c > t} for cnt, t in zip(counts, thr)]
    grams: List[set] = [set(k) for k in data_kept]
    if blank_id is not None:  # has_blank
        extra = _blank_grams(data_kept, blank_id, blank, bool(start))
        if blank == "forced":
            grams = [grams[0]] + [set() for _ in range(order - 1)]
        grams = [a | b for a, b in zip(grams, extra)]
    if self_loops:
        grams = _self_loop_grams(grams)

    # -- states -----------------------------------------------------------------------------
    states: Set[Gram] = {()}
    start_state: Gram = (SENTENCE_START,) if (start and order >= 2) else ()
    states.add(start_state)
    for k in range(1, order + 1):
        for g in grams[k - 1]:
            if k < order and SENTENCE_END not in g:
                states.add(g)
            if k >= 2:
                states.add(g[:-1])
    ordered = sorted(states, key=lambda h: (len(h), h))
    node: Dict[Gram, int] = {h: i for i, h in enumerate(ordered)}
    final = len(ordered)  # the accept node that ends sentences: only with end
    num_nodes = len(ordered) + (1 if end else 0)

    def state_of(g: Gram) -> int:
        g = g[len(g) - (order - 1) :] if order > 1 else ()
        while g not in node:
            g = g[1:]
        return node[g]

    # -- counts for init="counts" -------------------------------------------------------------
    ctx: Dict[Gram, int] = Counter()
    for cnt in counts:
        for g, c in cnt.items():
            ctx[g[:-1]] += c
    kept_mass: Dict[Gram, int] = Counter()  # count mass of the continuations with an arc
    for k in range(2, order + 1):
        for g in grams[k - 1]:
            kept_mass[g[:-1]] += data_kept[k - 1].get(g, 0)
    use_counts = init == "counts"

    def weight(g: Gram) -> float:
        if not use_counts:
            return 0.0
        c = data_kept[len(g) - 1].get(g, 0) if len(g) > 1 else counts[0].get(g, 0)
        if len(g) > 1 and c == 0:
            return 0.0  # an arc only the blank or self-loop options add
        if len(g) == 1 and has_blank and g[0] == blank_id:
            return 0.0
        total = ctx.get(g[:-1], 0)
        if total == 0:
            return 0.0
        return math.log(max(c, _UNSEEN) / total)

    # -- arcs: (src, label, dst, weight) -----------------------------------------------------
    arcs: List[Tuple[int, int, int, float]] = []
    root = node[()]
    for t in range(num_tokens):
        arcs.append((root, t, state_of((t,)), weight((t,))))
    if end:
        arcs.append((root, epsilon, final, weight((SENTENCE_END,))))
    for k in range(2, order + 1):
        for g in grams[k - 1]:
            src_node = node[g[:-1]]
            if g[-1] == SENTENCE_END:
                if end:
                    arcs.append((src_node, epsilon, final, weight(g)))
            else:
                arcs.append((src_node, g[-1], state_of(g), weight(g)))
    if backoff:
        for h in ordered:
            if not h:
                continue
            b = h[1:]
            while b not in node:
                b = b[1:]
            w = 0.0
            if use_counts and ctx.get(h, 0) > 0:
                w = math.log(max(ctx[h] - kept_mass.get(h, 0), _UNSEEN) / ctx[h])
            arcs.append((node[h], epsilon, node[b], w))

    arcs.sort(key=lambda a: (a[0], a[1], a[2]))
    src = np.fromiter((a[0] for a in arcs), dtype=_INT, count=len(arcs))
    lab = np.fromiter((a[1] for a in arcs), dtype=_INT, count=len(arcs))
    dst = np.fromiter((a[2] for a in arcs), dtype=_INT, count=len(arcs))
    wts = np.fromiter((a[3] for a in arcs), dtype=_FLOAT, count=len(arcs))
    accept = [final] if end else list(range(len(ordered)))
    return Graph.from_arrays(
        num_nodes, [node[start_state]], accept, src, dst, lab, None, wts, calc_grad=bool(calc_grad)
    )


# -- files ----------------------------------------------------------------------------------------


def _sidecar(path) -> str:
    return os.fspath(path) + ".json"


def save_transitions(
    path, graph: Graph, num_tokens: int, *, tokens: Optional[Sequence[str]] = None, info: Optional[dict] = None
) -> None:
    """Saves a transition graph: the graph in the engine's binary format at ``path`` and a
    JSON sidecar at ``path + ".json"`` with the label count, the token names and free-form
    build information.

    Args:
        path: the graph file to write.
        graph: a transition acceptor over ``[0, num_tokens)`` (as :func:`transitions_graph` makes).
        num_tokens: the number of labels.
        tokens: optional names of the ``num_tokens`` labels (e.g. the word pieces, and the blank).
        info: optional JSON-serialisable details (order, prune, blank, ...), stored as given.

    Raises:
        ValueError: if a label of ``graph`` is outside ``[0, num_tokens)`` (epsilon aside), the
            graph is not an acceptor, or ``tokens`` has the wrong length.
    """
    num_tokens = check_int(num_tokens, "num_tokens", 1, MAX_TOKENS)
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a Graph, got {type(graph).__name__}")
    _check_labels(graph, num_tokens, "graph")
    if tokens is not None:
        tokens = list(tokens)
        if len(tokens) != num_tokens or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"tokens must be {num_tokens} strings, got {len(tokens)} items")
    meta = {
        "format": _FORMAT,
        "version": _VERSION,
        "num_tokens": num_tokens,
        "num_nodes": graph.num_nodes(),
        "num_arcs": graph.num_arcs(),
        "tokens": tokens,
        "info": info if info is not None else {},
    }
    text = json.dumps(meta, ensure_ascii=True, indent=1)
    save(path, graph)
    with open(_sidecar(path), "w", encoding="utf-8") as f:
        f.write(text)


def _check_labels(graph: Graph, num_tokens: int, where: str) -> None:
    il = np.asarray(graph.labels_to_list(True), dtype=np.int64)
    ol = np.asarray(graph.labels_to_list(False), dtype=np.int64)
    if not np.array_equal(il, ol):
        raise ValueError(f"{where}: a transition graph must be an acceptor (input label == output label)")
    if len(il) and (il.min() < epsilon or il.max() >= num_tokens):
        raise ValueError(f"{where}: a label is outside [0, {num_tokens}) (epsilon aside)")


def _read_bounded(path: str, max_bytes: int, what: str) -> bytes:
    with open_regular(path, what) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path!r}: {what} larger than max_bytes={max_bytes}")
    return data


def load_transitions(path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Tuple[Graph, dict]:
    """Loads a transition graph saved by :func:`save_transitions`, checking it.

    Args:
        path: the graph file (its sidecar is ``path + ".json"``).
        max_bytes: refuse a graph file or sidecar larger than this (default 256 MiB).

    Returns:
        ``(graph, meta)``: the graph (``calc_grad=True``) and the sidecar's contents, a dict
        with ``num_tokens`` (int), ``tokens`` (list of str, or None), ``info`` (dict),
        ``num_nodes`` and ``num_arcs``.

    Raises:
        FileNotFoundError: if the graph file or its sidecar is missing.
        ValueError: if either file is too large, truncated or malformed, or they disagree
            (node or arc counts, a label outside ``[0, num_tokens)``).
    """
    max_bytes = check_int(max_bytes, "max_bytes", 1)
    gpath, spath = os.fspath(path), _sidecar(path)
    raw = _read_bounded(spath, max_bytes, "transition sidecar")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{spath!r}: not a transition sidecar (invalid JSON: {type(e).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{spath!r}: not a transition sidecar (no format {_FORMAT!r})")
    if meta.get("version") != _VERSION:
        raise ValueError(f"{spath!r}: unsupported version {meta.get('version')!r} (expected {_VERSION})")
    try:
        num_tokens = check_int(meta.get("num_tokens"), "num_tokens", 1, MAX_TOKENS)
        num_nodes = check_int(meta.get("num_nodes"), "num_nodes", 0)
        num_arcs = check_int(meta.get("num_arcs"), "num_arcs", 0)
    except TypeError as e:
        raise ValueError(f"{spath!r}: {e}") from None
    tokens = meta.get("tokens")
    if tokens is not None and (
        not isinstance(tokens, list) or len(tokens) != num_tokens or not all(isinstance(t, str) for t in tokens)
    ):
        raise ValueError(f"{spath!r}: tokens must be null or a list of {num_tokens} strings")
    info = meta.get("info", {})
    if not isinstance(info, dict):
        raise ValueError(f"{spath!r}: info must be an object")

    data = _read_bounded(gpath, max_bytes, "transition graph file")
    buf = io.BytesIO(data)
    buf.name = gpath
    graph = load(buf)
    if graph.num_nodes() != num_nodes or graph.num_arcs() != num_arcs:
        raise ValueError(
            f"{gpath!r}: the graph has {graph.num_nodes()} nodes and {graph.num_arcs()} arcs, "
            f"its sidecar says {num_nodes} and {num_arcs}"
        )
    _check_labels(graph, num_tokens, repr(gpath))
    return graph, {
        "num_tokens": num_tokens,
        "tokens": tokens,
        "info": info,
        "num_nodes": num_nodes,
        "num_arcs": num_arcs,
    }
