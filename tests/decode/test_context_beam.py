"""Context biasing in the CTC beam search (BeamSearchDecoder, lexicon and lexicon-free)."""

import numpy as np
import pytest

from lightning_gtn.decode import BeamSearchDecoder
from lightning_gtn.decode.context_graph import ContextGraph

TOKENS = ["_", "a", "b", "c", " "]


def _emissions(paths, seed=0, T=None):
    """(1, T, C) log-probs that prefer the frame labels of ``paths[0]`` (one char per frame)."""
    rng = np.random.default_rng(seed)
    T = T or len(paths[0])
    x = rng.normal(0, 0.3, (1, T, len(TOKENS))) - 4.0
    for t, ch in enumerate(paths[0]):
        x[0, t, TOKENS.index(ch)] = -0.1
    return (x - np.logaddexp.reduce(x, axis=-1, keepdims=True)).astype(np.float32)


def _symbols(g, text):
    """What the lexicon-free search feeds the graph for ``text``: boundary, each word's tokens, a boundary."""
    out = []
    for w in text.split():
        out += [TOKENS.index(ch) for ch in w] + [g.boundary]
    return out


def _decoder(**kw):
    return BeamSearchDecoder(TOKENS, blank=0, beam_size=8, lexicon_free=True, **kw)


def test_no_phrases_is_exactly_no_biasing():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 12, len(TOKENS))).astype(np.float32)
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    lex = {"ab": [[1, 2]], "ba": [[2, 1]], "c": [[3]], "abc": [[1, 2, 3]]}
    for kw in ({}, {"lexicon": lex}):
        kw0 = dict(kw, lexicon_free=not kw)
        base = BeamSearchDecoder(TOKENS, blank=0, beam_size=6, nbest=3, **kw0).decode(x)
        for ctx in ([], ContextGraph([[1, 2]], len(TOKENS), score=0.0)):
            got = BeamSearchDecoder(TOKENS, blank=0, beam_size=6, nbest=3, context=ctx, **kw0).decode(x)
            assert [[(h.tokens, h.timesteps, h.score) for h in u] for u in got] == [
                [(h.tokens, h.timesteps, h.score) for h in u] for u in base
            ]


def test_boosted_phrase_wins_lexicon_free():
    x = _emissions(["ca_b"])
    x[0, 3, 3] = x[0, 3, 2] - 0.5  # "cac" a little behind "cab"
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    assert _decoder().decode(x)[0][0].text == "cab"
    h = _decoder(context=["cac"], context_score=1.0).decode(x)[0][0]
    assert h.text == "cac"
    g = ContextGraph.from_phrases(["cac"], TOKENS, score=1.0, skip=[0])
    assert h.score - h.am_score == pytest.approx(g.total(_symbols(g, "cac")))  # = 3.0


def test_boosted_word_wins_lexicon():
    lex = {"cab": [[3, 1, 2]], "cac": [[3, 1, 3]], "ab": [[1, 2]]}
    x = _emissions(["ca_b"])
    x[0, 3, 3] = x[0, 3, 2] - 0.5
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    dec = BeamSearchDecoder(TOKENS, blank=0, beam_size=8, lexicon=lex)
    assert dec.decode(x)[0][0].words == ["cab"]
    dec = BeamSearchDecoder(TOKENS, blank=0, beam_size=8, lexicon=lex, context=["cac"], context_score=1.0)
    h = dec.decode(x)[0][0]
    assert h.words == ["cac"] and h.score - h.am_score == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(6))
def test_scores_carry_the_graph_bonus(seed):
    """Every returned hypothesis' score is its acoustic score plus the graph's bonus of its text."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 10, len(TOKENS))).astype(np.float32) * 2
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    phrases = ["ab", "b a", "cab", [1, 1], [2, 3, 1]]
    g = ContextGraph.from_phrases(phrases, TOKENS, score=0.7, cap=1.8, skip=[0])
    for u in _decoder(context=g, nbest=5).decode(x):
        for h in u:
            assert h.score - h.am_score == pytest.approx(g.total(_symbols(g, h.text)), abs=1e-4)


def test_bad_context():
    with pytest.raises(ValueError, match="cannot be spelled"):
        _decoder(context=["abz"])
    with pytest.raises(ValueError, match="not in the lexicon"):
        BeamSearchDecoder(TOKENS, blank=0, lexicon={"ab": [[1, 2]]}, context=["ba"])
    with pytest.raises(ValueError, match="C=5"):
        _decoder(context=ContextGraph([[1]], 3))


def test_sparse_graph_searches_as_the_dense_one(monkeypatch):
    import lightning_gtn.decode.context_graph as cg

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 10, len(TOKENS))).astype(np.float32) * 2
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    phrases = ["ab", "b a", "cab", [2, 3, 1]]
    dense = _decoder(context=phrases, context_score=0.7, nbest=4).decode(x)
    monkeypatch.setattr(cg, "MAX_DENSE_ENTRIES", 0)
    dec = _decoder(context=phrases, context_score=0.7, nbest=4)
    assert dec.context.dense is None
    sparse = dec.decode(x)
    assert [[(h.tokens, h.score) for h in u] for u in sparse] == [[(h.tokens, h.score) for h in u] for u in dense]


def _by_words(hyps):
    return {tuple(h.words): h for h in hyps}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", ["lexicon", "lexicon_free"])
def test_hotword_adds_exactly_its_bonus_per_word(seed, mode):
    """A hotword (now context phrases with a total) adds its bonus once per emitted word to the
    final score, as the separate hotword code did: same hypotheses, same acoustic scores."""
    rng = np.random.default_rng(40 + seed)
    x = rng.normal(size=(1, 9, len(TOKENS))).astype(np.float32) * 2
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    lex = {"ab": [[1, 2]], "ba": [[2, 1], [2, 2, 1]], "c": [[3]], "abc": [[1, 2, 3]], "b": [[2]], "a": [[1]]}
    kw = dict(lexicon=lex) if mode == "lexicon" else dict(lexicon_free=True)
    hot = {"ab": 1.25, "c": -0.75, "abc": 0.4, "a": 0.3, "b": 0.2}
    wide = dict(beam_size=100000, beam_threshold=float("inf"), nbest=40)
    plain = _by_words(BeamSearchDecoder(TOKENS, blank=0, **kw, **wide).decode(x)[0])
    got = BeamSearchDecoder(TOKENS, blank=0, hotwords=hot, **kw, **wide).decode(x)[0]
    common = [h for h in got if tuple(h.words) in plain]
    assert len(common) >= 10
    assert any(w in hot for h in common for w in h.words)
    for h in common:
        p = plain[tuple(h.words)]
        assert h.am_score == pytest.approx(p.am_score, abs=1e-9)
        assert h.score - p.score == pytest.approx(sum(hot.get(w, 0.0) for w in h.words), abs=1e-9)


def test_hotwords_and_context_share_one_graph():
    """Both given: one graph; a hypothesis' bonus is its hotwords' bonuses plus the phrases' bonus."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(1, 10, len(TOKENS))).astype(np.float32) * 2
    x -= np.logaddexp.reduce(x, axis=-1, keepdims=True)
    hot = {"ab": 0.9, "ca": -0.5}
    phrases = ["b a", "cab"]
    dec = _decoder(hotwords=hot, context=phrases, context_score=0.6, nbest=8)
    assert dec.context is not None and len(dec.context) == len(phrases) + len(hot)
    g = ContextGraph.from_phrases(phrases, TOKENS, score=0.6, skip=[0])
    seen_hot = False
    for h in dec.decode(x)[0]:
        want = sum(hot.get(w, 0.0) for w in h.words) + g.total(_symbols(g, h.text))
        seen_hot |= any(w in hot for w in h.words)
        assert h.score - h.am_score == pytest.approx(want, abs=1e-9)
    assert seen_hot
