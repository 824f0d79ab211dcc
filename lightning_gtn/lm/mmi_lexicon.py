"""LF-MMI numerators of word transcripts: the words spelled through a lexicon, then a topology.

:func:`lexicon_numerator_graph` turns a word sequence into the numerator that LF-MMI scores: the
acceptor over emission classes of every alignment of every token sequence the words may spell.

1. The **token acceptor**: the words one after the other, each the union of its spellings in
   the lexicon (token ids ``1..N``), with ``word_separator`` (a token id) between two words, which
   ``optional_separator=True`` lets a path skip. It is determinised (subset construction), so a
   token sequence that two choices of spellings both spell is one path, not two.
2. Composed with the topology by :func:`lightning_gtn.core.topologies.compose_token_acceptor`
   (dense tables per acceptor state, breadth first with numpy); for ``"modified_ctc"`` and
   ``"hmm1"``, where a run of one class may hold one token or several equal ones, the result is
   determinised again over classes, as :func:`~lightning_gtn.core.topologies.numerator_graph`
   does. Every accepted class sequence then has exactly one path.
3. With ``denominator``, intersected with it, so every alignment weighs what the denominator
   gives it and ``log Z_num <= log Z_den``.

With one spelling per word (and a separator that is not optional) the result accepts the same
class sequences as ``numerator_graph`` of the concatenated spelling; the numerator of a
transcript with alternatives is the *union* of the numerators of the token sequences it may
spell (their forward scores add in probability where their alignments are disjoint, always in
``"ctc"`` and ``"hmm2"``).

The lexicon is a mapping ``word -> spellings``: one token-id sequence, or a sequence of them
(:func:`lightning_gtn.lm.lexicon.read_lexicon` reads Kaldi's ``lexicon.txt`` into
``word -> [[token, ...], ...]`` with token strings: map them to ids first). Only the words of
the transcript are read and checked.

Sizes are bounded before anything large is built: at most :data:`MAX_LEXICON_ARCS` arcs in the
token acceptor (the lengths of the spellings of every word of the transcript, plus the
separators), at most :data:`MAX_LEXICON_STATES` states in each determinised acceptor, and at
most :data:`MAX_TABLE_ENTRIES` entries in the composition's dense tables (states of the token
acceptor times ``max(N + 1, topology nodes)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from ..core.topologies import compose_token_acceptor, determinise_acceptor, num_classes, topology_arrays
from ..wfst import Graph, intersect

__all__ = [
    "MAX_LEXICON_ARCS",
    "MAX_LEXICON_STATES",
    "MAX_TABLE_ENTRIES",
    "lexicon_numerator_graph",
]

MAX_LEXICON_ARCS = 1 << 15
"""The most arcs of the token acceptor of one transcript (the summed lengths of the spellings of
its words, plus one or two arcs per separator); refused before the acceptor is built. Far above
a training utterance (30 s of speech is a few hundred characters); the composition's trimming
grows with depth times arcs, so a transcript at this bound takes 1-2 s to build on a 2-core CPU."""

MAX_LEXICON_STATES = 1 << 16
"""The most states a determinised acceptor (over tokens, or over classes for ``"modified_ctc"``
and ``"hmm1"``) may reach; the subset construction stops with a ``ValueError`` beyond it."""

MAX_TABLE_ENTRIES = 1 << 24
"""The most entries of the composition's dense tables: states of the token acceptor times
``max(N + 1, topology nodes)``."""

_EPS = 0  # the epsilon label inside the token acceptor (token ids are 1..N)


def _token_id(v, word: str, n: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(
            f"lexicon: word {word[:40]!r} has a spelling holding {str(v)[:40]!r}, not an integer token id "
            "(map token strings to ids 1..N first)"
        )
    if not 1 <= int(v) <= n:
        raise ValueError(f"lexicon: word {word[:40]!r} has a spelling holding {int(v)}, outside the token ids [1, {n}]")
    return int(v)


def _spellings(lexicon: Mapping, word: str, n: int) -> list[tuple[int, ...]]:
    """The checked, deduplicated spellings of ``word`` (token-id tuples, in lexicon order)."""
    if word not in lexicon:
        raise ValueError(f"word {word[:40]!r} is not in the lexicon")
    value = lexicon[word]
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise ValueError(f"lexicon: word {word[:40]!r} maps to a {type(value).__name__}, not a sequence of spellings")
    if len(value) == 0:
        raise ValueError(f"lexicon: word {word[:40]!r} has no spellings")
    if isinstance(value[0], (int, np.integer)) and not isinstance(value[0], (bool, np.bool_)):
        value = [value]  # one spelling given as a flat sequence of ids
    out: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    size = 0
    for sp in value:
        if isinstance(sp, (str, bytes)) or not isinstance(sp, (Sequence, np.ndarray)):
            raise ValueError(
                f"lexicon: word {word[:40]!r} has a spelling {str(sp)[:40]!r} that is not a sequence of token ids"
            )
        if len(sp) == 0:
            raise ValueError(f"lexicon: word {word[:40]!r} has an empty spelling")
        size += len(sp)
        if size > MAX_LEXICON_ARCS:  # before reading them all
            raise ValueError(
                f"lexicon: the spellings of word {word[:40]!r} have more than "
                f"MAX_LEXICON_ARCS={MAX_LEXICON_ARCS} tokens"
            )
        t = tuple(_token_id(v, word, n) for v in sp)
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def _determinise(num_nodes: int, accept: Sequence[int], arcs, what: str, eps_label: Optional[int] = None):
    """:func:`lightning_gtn.core.topologies.determinise_acceptor`, bounded by
    :data:`MAX_LEXICON_STATES` (a ValueError beyond it)."""
    try:
        return determinise_acceptor(
            num_nodes, accept, arcs, eps_label=eps_label, max_states=MAX_LEXICON_STATES, what=what
        )
    except ValueError as e:
        raise ValueError(f"{e} (MAX_LEXICON_STATES={MAX_LEXICON_STATES})") from None


def lexicon_numerator_graph(
    words: Sequence[str],
    lexicon: Mapping[str, Sequence],
    num_tokens: int,
    topology: str = "ctc",
    denominator: Optional[Graph] = None,
    *,
    word_separator: Optional[int] = None,
    optional_separator: bool = False,
) -> Graph:
    """The LF-MMI numerator of a word transcript spelled through a lexicon (module docstring).

    An epsilon-free acceptor over emission classes (the classes of ``topology``, as
    :func:`~lightning_gtn.core.topologies.num_classes` counts them) whose paths are the
    alignments of every token sequence the words may spell, one path per class sequence; arcs
    weigh 0, or, with ``denominator``, what the denominator gives them
    (``intersect(numerator, denominator)``, as
    :func:`~lightning_gtn.core.topologies.numerator_graph` does).

    Args:
        words: the transcript as a sequence of words (``text.split()``; a bare string is refused);
            may be empty (the numerator of the empty token sequence).
        lexicon: ``word -> spellings``: one sequence of token ids ``1..N``, or a sequence of such
            sequences or a 2-D integer array (alternative pronunciations or spellings;
            duplicates count once).
        num_tokens: ``N``.
        topology: one of :data:`~lightning_gtn.core.topologies.MMI_TOPOLOGIES`.
        denominator: optional denominator acceptor over the same classes.
        word_separator: a token id in ``1..N`` put between two words (e.g. a word-boundary
            token ``|``), or None for none.
        optional_separator: let a path skip the separator (needs ``word_separator``).

    Returns:
        The numerator acceptor (``calc_grad=False``).

    Raises:
        ValueError: a word missing from the lexicon (named), a word with no or an empty
            spelling, a token id outside ``1..N`` or not an integer, a bad separator, topology or
            denominator, or a size beyond :data:`MAX_LEXICON_ARCS`, :data:`MAX_LEXICON_STATES`
            or :data:`MAX_TABLE_ENTRIES`.

    Example:
        >>> lex = {"a": [[1], [1, 2]], "b": [2]}
        >>> g = lexicon_numerator_graph(["a", "b"], lex, 2, "ctc")
        >>> g.num_nodes(), g.num_arcs()
        (7, 14)
    """
    num_classes(num_tokens, topology)  # checks num_tokens and topology
    n = int(num_tokens)
    if isinstance(words, (str, bytes)):
        raise ValueError("words must be a sequence of words (e.g. text.split()), not a string")
    try:
        words = list(words)
    except TypeError:
        raise ValueError(f"words must be a sequence of strings, got {type(words).__name__}") from None
    for i, w in enumerate(words):
        if not isinstance(w, str):
            raise ValueError(f"words[{i}] is a {type(w).__name__}, not a string")
    if not isinstance(lexicon, Mapping):
        raise ValueError(f"lexicon must be a mapping word -> spellings, got {type(lexicon).__name__}")
    sep: Optional[int] = None
    if word_separator is not None:
        sep = _token_id(word_separator, "<word_separator>", n)
    if optional_separator and sep is None:
        raise ValueError("optional_separator=True needs a word_separator")
    if denominator is not None and not isinstance(denominator, Graph):
        raise ValueError(f"denominator must be a lightning_gtn.wfst.Graph, got {type(denominator).__name__}")

    cache: dict[str, list[tuple[int, ...]]] = {}
    per_word = []
    size = 0
    for i, w in enumerate(words):
        if w not in cache:
            cache[w] = _spellings(lexicon, w, n)
        per_word.append(cache[w])
        size += sum(len(sp) for sp in cache[w])
        if i and sep is not None:
            size += 2 if optional_separator else 1
        if size > MAX_LEXICON_ARCS:  # counted before the acceptor is built
            raise ValueError(
                f"the token acceptor of these {len(words)} words would have more than "
                f"MAX_LEXICON_ARCS={MAX_LEXICON_ARCS} arcs"
            )

    # the token acceptor: a chain of words, each the union of its spellings into one exit node
    arcs: list[tuple[int, int, int]] = []
    cur, num = 0, 1
    for i, spellings in enumerate(per_word):
        if i and sep is not None:
            arcs.append((cur, num, sep))
            if optional_separator:
                arcs.append((cur, num, _EPS))
            cur, num = num, num + 1
        exit_node = num
        num += 1
        for sp in spellings:
            prev = cur
            for j, tok in enumerate(sp):
                if j == len(sp) - 1:
                    dst = exit_node
                else:
                    dst, num = num, num + 1
                arcs.append((prev, dst, tok))
                prev = dst
        cur = exit_node
    S, accept, dfa = _determinise(num, [cur], arcs, "token", _EPS)

    t_nodes = topology_arrays(n, topology).num_nodes
    if S * max(n + 1, t_nodes) > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"the token acceptor has {S} states: its tables for {n} tokens would exceed "
            f"MAX_TABLE_ENTRIES={MAX_TABLE_ENTRIES} entries"
        )
    next_state = np.full((S, n + 1), -1, dtype=np.int64)
    for s, d, lab in dfa:
        next_state[s, lab] = d
    acc = np.zeros(S, dtype=bool)
    acc[accept] = True
    g = compose_token_acceptor(n, topology, next_state, None, 0, acc)
    if topology in ("modified_ctc", "hmm1") and g.num_arcs():
        a = g.arrays()
        num_c, accept_c, arcs_c = _determinise(
            a.num_nodes,
            a.accept.tolist(),
            list(zip(a.src.tolist(), a.dst.tolist(), a.ilabel.tolist())),
            "class",
        )
        arcs_c.sort(key=lambda x: (x[0], x[2], x[1]))  # by node, then class
        c_src, c_dst, c_lab = zip(*arcs_c)
        g = Graph.from_arrays(num_c, [0], accept_c, c_src, c_dst, c_lab, calc_grad=False)
    if denominator is None:
        return g
    out = intersect(g, denominator)
    out.calc_grad = False
    return out
