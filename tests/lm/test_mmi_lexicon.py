"""Numerators of word transcripts through a lexicon (``lexicon_numerator_graph``).

References: ``numerator_graph`` of the spelled token sequence (one spelling per word), sums of
numerators in probability (alternative spellings whose alignments are disjoint), and brute force:
every token sequence the words may spell, every class sequence that spells it
(:func:`tests.core.test_topologies.alignments`, written from the topology definitions), scored on
random emissions, and with a denominator ``P``'s sentence scores.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import lightning_gtn.lm.mmi_lexicon as mmi_lexicon
import lightning_gtn.wfst as gtn
from lightning_gtn.core.topologies import MMI_TOPOLOGIES, num_classes, numerator_graph
from lightning_gtn.functional import lexicon_numerator_graph
from lightning_gtn.lm.denominator import denominator_graph, token_lm
from tests.core.test_topologies import alignments, graph_paths

TRAIN = [[1, 2, 3], [2, 3], [1, 1, 2], [3, 2, 1, 1], [2, 2], [1], [3, 1, 2, 3]]


def _emissions(T, C, seed):
    e = np.random.default_rng(seed).standard_normal((T, C))
    em = gtn.linear_graph(T, C)
    em.set_weights(e.astype(np.float32).ravel())
    return e, em


def _score(g, em):
    return gtn.forward_score(gtn.intersect(g, em)).item()


@pytest.mark.parametrize("topology", MMI_TOPOLOGIES)
def test_one_spelling_per_word_is_the_numerator_of_the_spelling(topology):
    N = 4
    lex = {"ab": [1, 2], "c": [[3]], "bb": np.array([[2, 2]])}  # one flat spelling, a list, an array
    C = num_classes(N, topology)
    e, em = _emissions(7, C, 0)
    for words, sep, want in (
        (["ab", "c"], None, [1, 2, 3]),
        (["c", "bb", "ab"], None, [3, 2, 2, 1, 2]),
        (["ab", "c", "ab"], 4, [1, 2, 4, 3, 4, 1, 2]),
        ([], None, []),
    ):
        g = lexicon_numerator_graph(words, lex, N, topology, word_separator=sep)
        ref = numerator_graph(want, N, topology)
        assert _score(g, em) == pytest.approx(_score(ref, em), abs=1e-4), (words, sep)
    den = denominator_graph(TRAIN, N, topology=topology)
    g = lexicon_numerator_graph(["ab", "c"], lex, N, topology, den)
    assert _score(g, em) == pytest.approx(_score(numerator_graph([1, 2, 3], N, topology, den), em), abs=1e-4)


@pytest.mark.parametrize("topology", ["ctc", "hmm2"])
def test_two_spellings_sum_in_probability(topology):
    """In "ctc" and "hmm2" a class sequence spells one token sequence, so the alignments of two
    different spellings are disjoint and the forward scores add in probability."""
    N = 3
    lex = {"x": [[1, 2], [3]], "y": [2]}
    C = num_classes(N, topology)
    e, em = _emissions(6, C, 1)
    den = denominator_graph(TRAIN, N, topology=topology)
    for d in (None, den):
        got = _score(lexicon_numerator_graph(["x", "y"], lex, N, topology, d), em)
        a = _score(numerator_graph([1, 2, 2], N, topology, d), em)
        b = _score(numerator_graph([3, 2], N, topology, d), em)
        assert got == pytest.approx(np.logaddexp(a, b), abs=1e-4)


def test_optional_separator_is_the_sum_over_using_it_or_not():
    N = 3
    lex = {"a": [1], "b": [2, 1]}
    e, em = _emissions(8, N + 1, 2)
    got = _score(lexicon_numerator_graph(["a", "b", "a"], lex, N, word_separator=3, optional_separator=True), em)
    parts = [
        _score(numerator_graph(y, N), em) for y in ([1, 2, 1, 1], [1, 3, 2, 1, 1], [1, 2, 1, 3, 1], [1, 3, 2, 1, 3, 1])
    ]
    assert got == pytest.approx(np.logaddexp.reduce(parts), abs=1e-4)
    # a separator that is not optional is always there
    fixed = _score(lexicon_numerator_graph(["a", "b", "a"], lex, N, word_separator=3), em)
    assert fixed == pytest.approx(parts[3], abs=1e-4)


def _spelled(words, lex, sep, optional):
    """Every token sequence the words may spell (a set: two ways to one sequence count once)."""
    out = set()
    for choice in itertools.product(*[lex[w] for w in words]):
        gaps = len(words) - 1
        for use in itertools.product(*([[True, False]] if optional else [[sep is not None]]) * max(gaps, 0)):
            y: list[int] = []
            for i, sp in enumerate(choice):
                if i and use[i - 1]:
                    y.append(sep)
                y += sp
            out.add(tuple(y))
    return out


@pytest.mark.parametrize("topology", MMI_TOPOLOGIES)
def test_brute_force_paths(topology):
    """Spellings that overlap ("1" + "2 3" and "1 2" + "3" spell the same tokens) and an optional
    separator: the graph has one path per class sequence, and they are exactly the alignments of
    the spelled token sequences."""
    N = 3
    lex = {"p": [[1], [1, 2]], "q": [[2, 3], [3]]}
    words, sep = ["p", "q"], 2
    g = lexicon_numerator_graph(words, lex, N, topology, word_separator=sep, optional_separator=True)
    ys = _spelled(words, lex, sep, True)
    assert (1, 2, 3) in ys and (1, 2, 2, 3) in ys
    C = num_classes(N, topology)
    for T in (2, 3, 5):
        xs = {x for y in ys for x in alignments(y, T, topology)}
        paths = graph_paths(g, T)
        assert {x for x, _ in paths} == xs, T
        assert set(paths.values()) <= {1}, T  # one path per class sequence
        e, em = _emissions(T, C, T)
        ref = np.logaddexp.reduce([e[np.arange(T), list(x)].sum() for x in xs]) if xs else -np.inf
        assert _score(g, em) == pytest.approx(ref, abs=1e-4)


def test_brute_force_with_denominator_ctc():
    """In "ctc" every alignment of ``y`` weighs ``ln P(y)`` in the denominator."""
    N = 3
    lex = {"p": [[1], [1, 2]], "q": [[2, 3], [3]]}
    lm = token_lm(TRAIN, N, order=2)
    den = denominator_graph(TRAIN, N, order=2)
    g = lexicon_numerator_graph(["p", "q"], lex, N, "ctc", den)
    T = 5
    e, em = _emissions(T, N + 1, 9)
    terms = {}
    for y in _spelled(["p", "q"], lex, None, False):
        lp = lm.sentence_score([str(t) for t in y], eos=False)
        for x in alignments(y, T, "ctc"):
            terms[x] = lp + e[np.arange(T), list(x)].sum()
    assert _score(g, em) == pytest.approx(np.logaddexp.reduce(list(terms.values())), abs=1e-4)


def test_errors_name_the_problem(monkeypatch):
    lex = {"a": [[1, 2]], "b": [3], "empty": [], "hole": [[1], []], "str": [["dh", "ah"]], "big": [[9]]}
    with pytest.raises(ValueError, match="'zebra' is not in the lexicon"):
        lexicon_numerator_graph(["a", "zebra"], lex, 3)
    with pytest.raises(ValueError, match="'empty' has no spellings"):
        lexicon_numerator_graph(["empty"], lex, 3)
    with pytest.raises(ValueError, match="'hole' has an empty spelling"):
        lexicon_numerator_graph(["hole"], lex, 3)
    with pytest.raises(ValueError, match="'str'.*not an integer token id"):
        lexicon_numerator_graph(["str"], lex, 3)
    with pytest.raises(ValueError, match=r"'big'.*9, outside the token ids \[1, 3\]"):
        lexicon_numerator_graph(["big"], lex, 3)
    with pytest.raises(ValueError, match="not a string"):
        lexicon_numerator_graph("a b", lex, 3)
    with pytest.raises(ValueError, match=r"words\[1\]"):
        lexicon_numerator_graph(["a", 3], lex, 3)
    with pytest.raises(ValueError, match="mapping"):
        lexicon_numerator_graph(["a"], [("a", [1])], 3)
    with pytest.raises(ValueError, match="outside the token ids"):
        lexicon_numerator_graph(["a", "b"], lex, 3, word_separator=0)
    with pytest.raises(ValueError, match="needs a word_separator"):
        lexicon_numerator_graph(["a", "b"], lex, 3, optional_separator=True)
    with pytest.raises(ValueError, match="topology"):
        lexicon_numerator_graph(["a"], lex, 3, "hmm3")
    with pytest.raises(ValueError, match="num_tokens"):
        lexicon_numerator_graph(["a"], lex, 0)
    with pytest.raises(ValueError, match="denominator"):
        lexicon_numerator_graph(["a"], lex, 3, denominator="den")
    # sizes: refused before the acceptor is built
    big = mmi_lexicon.MAX_LEXICON_ARCS
    long = {"w": [[1] * (big // 2 + 1)], "huge": [[1] * 10 * big], "x": [1]}
    with pytest.raises(ValueError, match="MAX_LEXICON_ARCS"):
        lexicon_numerator_graph(["w", "w"], long, 3)
    with pytest.raises(ValueError, match="'huge'.*MAX_LEXICON_ARCS"):
        lexicon_numerator_graph(["huge"], long, 3)
    monkeypatch.setattr(mmi_lexicon, "MAX_LEXICON_ARCS", 9)  # the count is exact: 5 tokens + 4 separators
    assert lexicon_numerator_graph(["x"] * 5, long, 3, word_separator=2).num_arcs() > 0
    with pytest.raises(ValueError, match="MAX_LEXICON_ARCS"):
        lexicon_numerator_graph(["x"] * 5, long, 3, word_separator=2, optional_separator=True)
    monkeypatch.setattr(mmi_lexicon, "MAX_LEXICON_ARCS", big)
    monkeypatch.setattr(mmi_lexicon, "MAX_LEXICON_STATES", 3)
    with pytest.raises(ValueError, match="MAX_LEXICON_STATES"):
        lexicon_numerator_graph(["a", "b"], lex, 3)
    monkeypatch.setattr(mmi_lexicon, "MAX_LEXICON_STATES", 1 << 16)
    monkeypatch.setattr(mmi_lexicon, "MAX_TABLE_ENTRIES", 10)
    with pytest.raises(ValueError, match="MAX_TABLE_ENTRIES"):
        lexicon_numerator_graph(["a", "b"], lex, 3)
