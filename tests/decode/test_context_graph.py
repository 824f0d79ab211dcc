"""The context graph against a brute-force reading of its definition (lightning_gtn.decode.context_graph)."""

import math
import random

import numpy as np
import pytest

from lightning_gtn.decode.context_graph import (
    MAX_CONTEXT_PHRASES,
    ContextGraph,
    read_phrases,
)
from lightning_gtn.decode.lexicon import Lexicon


def _brute(phrases, C, score, cap, stream):
    """The definition, by tuples: the match is the longest suffix (since the last failure) that is
    a phrase prefix; a failure keeps the worth of the longest complete phrase inside the match and
    restarts at the longest suffix of match + symbol that is a prefix; the end is a failure.
    Returns the running totals after each symbol and the final total."""
    phrases = {tuple(p) for p in phrases}
    prefixes = {p[:k] for p in phrases for k in range(len(p) + 1)}

    def acc(m):
        return min(score * sum(1 for a in m if a != C), cap)

    def floor(m):
        return max([acc(m[:k]) for k in range(1, len(m) + 1) if m[:k] in phrases], default=0.0)

    cur, banked, running = (C,) if (C,) in prefixes else (), 0.0, []
    for a in stream:
        ext = cur + (a,)
        if ext in prefixes:
            cur = ext
        else:
            banked += floor(cur)
            cur = next(ext[i:] for i in range(1, len(ext) + 1) if ext[i:] in prefixes)
        running.append(banked + acc(cur))
    return running, banked + floor(cur)


@pytest.mark.parametrize("seed", range(40))
def test_bonus_matches_brute_force(seed):
    rng = random.Random(seed)
    C = rng.choice([2, 3])
    B = C
    phrases = []
    for _ in range(rng.randint(1, 6)):
        p = [rng.randrange(C) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.4:
            p = [B] + p + [B]
        phrases.append(p)
    score = rng.choice([1.0, 0.5, 2.0])
    cap = rng.choice([None, 1.5, math.inf])
    g = ContextGraph(phrases, C, score=score, cap=cap)
    for _ in range(20):
        stream = [rng.randrange(C + 1) for _ in range(rng.randint(0, 14))]
        running, total = _brute(phrases, C, score, g.cap, stream)
        s, tot, got = g.start, 0.0, []
        for a in stream:
            s, r = g.step(s, a)
            tot += r
            got.append(tot)
        assert got == pytest.approx(running, abs=1e-9)
        assert tot + g.final(s) == pytest.approx(total, abs=1e-9)
        assert g.total(stream) == pytest.approx(total, abs=1e-9)


def test_take_back_and_cap():
    g = ContextGraph([[1, 2, 3]], 4, score=1.0, cap=2.5)
    s, r1 = g.step(g.start, 1)
    s, r2 = g.step(s, 2)
    s, r3 = g.step(s, 0)  # the partial match fails: both bonuses back
    assert (r1, r2, r3) == (1.0, 1.0, -2.0)
    assert g.total([1, 2, 3]) == 2.5  # capped
    assert g.total([1, 2]) == 0.0  # pending at the end: given back
    # a complete phrase inside a longer one keeps its bonus when the longer one fails
    g = ContextGraph([[1], [1, 2, 3]], 4, score=1.0)
    assert g.total([1, 2, 0]) == 1.0


def test_rows_equal_steps():
    g = ContextGraph([[0, 1], [1, 1, 2], [3, 0, 3]], 3, score=0.7)
    for s in range(g.num_states):
        nxt, bon = g.row(s)
        for a in range(4):
            assert (int(nxt[a]), float(bon[a])) == g.step(s, a)


def test_words_are_spelled_and_matched_whole():
    tokens = ["_", "a", "b", "c", " "]
    g = ContextGraph.from_phrases(["ab", "b c"], tokens, score=1.0, skip=[0])
    B = g.boundary
    assert sorted(g.phrases) == sorted([(B, 1, 2, B), (B, 2, B, 3, B)])
    assert g.total([B, 1, 2, B]) == 2.0
    assert g.total([B, 3, 1, 2, B]) == 0.0  # "cab" is not the word "ab"
    pieces = ["<b>", "▁ab", "▁a", "b", "c"]
    g = ContextGraph.from_phrases(["abc", [3, 4]], pieces, score=1.0, word_separator="▁", skip=[0])
    assert (g.boundary, 1, 4, g.boundary) in g.phrases and (3, 4) in g.phrases
    lex = Lexicon({"ab": [[1, 2], [2, 2]], "c": [[3]]})
    g = ContextGraph.from_phrases(["ab c"], tokens, lexicon=lex)
    assert len(g.phrases) == 2


def test_empty_and_zero_score_give_nothing():
    for g in (ContextGraph([], 3), ContextGraph([[1, 2]], 3, score=0.0)):
        assert g.empty and g.total([1, 2, 3, 1, 2]) == 0.0


def test_bad_inputs_one_line_errors(tmp_path):
    tokens = ["_", "a", "b", " "]
    cases = [
        (lambda: ContextGraph.from_phrases([""], tokens), "context_phrases[0] is empty"),
        (lambda: ContextGraph([[]], 3), "context_phrases[0] is empty"),
        (lambda: ContextGraph([[5]], 3), "out of range"),
        (lambda: ContextGraph([[1]], 3, score=-1.0), "context_score"),
        (lambda: ContextGraph([[1]], 3, cap=0.0), "context_cap"),
        (lambda: ContextGraph.from_phrases(["abz"], tokens), "cannot be spelled"),
        (lambda: ContextGraph.from_phrases(["ba"], tokens, lexicon=Lexicon({"ab": [[1, 2]]})), "not in the lexicon"),
        (lambda: ContextGraph([[1]] * (MAX_CONTEXT_PHRASES + 1), 3), "more than"),
        (lambda: ContextGraph([[1] * 400] * 6000, 3), "states"),
        (lambda: read_phrases(tmp_path / "missing.txt"), "context_file"),
    ]
    for make, what in cases:
        with pytest.raises(ValueError) as e:
            make()
        assert what in str(e.value) and "\n" not in str(e.value)


def test_read_phrases(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("# boosted\nnew york\n\n  ab \n", encoding="utf-8")
    assert read_phrases(p) == ["new york", "ab"]


def test_dense_tables_equal_the_failure_links(monkeypatch):
    import lightning_gtn.decode.context_graph as cg

    tokens = ["_", "a", "▁b", "b", "▁"]
    g = ContextGraph.from_phrases(["ab b", [1, 1], "bab"], tokens, score=0.6, cap=1.5, word_separator="▁", skip=[0])
    nxt, bon = g.dense
    for s in range(g.num_states):
        for a in range(g.boundary + 1):
            assert (int(nxt[s, a]), float(bon[s, a])) == g.step(s, a)
    tn, tb, to = g.token_tables(blank=0)
    for s in range(g.num_states):
        for o in (False, True):
            rn, rb, ro = g.token_row(s, o, blank=0)
            assert (tn[int(o), s] == rn).all() and np.allclose(tb[int(o), s], rb) and (to[int(o), s] == ro).all()
    monkeypatch.setattr(cg, "MAX_DENSE_ENTRIES", 0)
    sparse = ContextGraph(g.phrases, g.num_tokens, score=0.6, cap=1.5)
    assert sparse.dense is None and sparse.token_tables() is None
    assert sparse.kernel_arrays()[6].shape == (0, 0)


def test_token_codes_are_the_token_tables():
    g = ContextGraph.from_phrases(["ab b", "ba"], ["_", "a", "▁b", "b", "▁"], score=0.5, word_separator="▁", skip=[0])
    tn, tb, to = g.token_tables(blank=0)
    cn, cb = g.token_codes(blank=0)
    for s in range(g.num_states):
        for o in (0, 1):
            assert (cn[2 * s + o] == 2 * tn[o, s] + to[o, s]).all() and (cb[2 * s + o] == tb[o, s]).all()


def test_phrase_totals_earn_in_proportion_and_keep_exactly_their_total():
    C = 4
    B = C
    g = ContextGraph([[B, 1, 2, B], [B, 1, 2, 3, B], [1, 1]], C, score=0.5, cap=0.8, totals=[1.3, -0.6, None])
    assert g.total([B, 1, 2, B]) == pytest.approx(1.3, abs=1e-12)  # complete: its total (to rounding)
    assert g.total([B, 1, 2, 3, B]) == pytest.approx(-0.6, abs=1e-12)
    assert g.total([B, 1, 2]) == pytest.approx(0.0, abs=1e-12)  # partial: given back
    assert g.total([B, 1, 2, 3]) == pytest.approx(0.0, abs=1e-12)
    assert g.total([B, 1, 2, B, 1, 2, B]) == pytest.approx(2.6)  # once per occurrence
    assert g.total([1, 1]) == pytest.approx(0.8)  # the score/cap phrase is unchanged
    s, r = g.step(g.start, 1)  # on both word phrases: the larger worth, 1.3 x 1/2 (not -0.6 x 1/3)
    assert r == pytest.approx(0.65)
    with pytest.raises(ValueError, match="totals"):
        ContextGraph([[1]], C, totals=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"totals\[0\]"):
        ContextGraph([[1]], C, totals=[float("nan")])
    assert ContextGraph([[1]], C, score=0.0, totals=[0.0]).empty
    assert not ContextGraph([[1]], C, score=0.0, totals=[-1.0]).empty
