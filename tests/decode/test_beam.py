"""BeamSearchDecoder against brute-force path enumeration, greedy decoding, and its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_gtn.decode import BeamSearchDecoder, Lexicon, greedy_decode

from ._ref import TinyLM, brute_free, brute_lexicon, random_emissions

WIDE = dict(beam_size=100000, beam_threshold=math.inf)


def _best(ref, n=1):
    return sorted(ref.items(), key=lambda kv: -kv[1])[:n]


def _check_nbest(hyps, ref, n):
    want = _best(ref, n)
    assert len(hyps) == len(want)
    for h, (words, score) in zip(hyps, want):
        assert tuple(h.words) == words
        assert h.score == pytest.approx(score, abs=1e-4)


# tokens: blank, a, b, space
TOK = ["_", "a", "b", " "]
SPELL = {"a": [[1]], "ab": [[1, 2]], "ba": [[2, 1], [2, 2, 1]], "b": [[2]]}


@pytest.mark.parametrize("seed", range(4))
def test_ctc_lexicon_lm_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    em = random_emissions(rng, 5, len(TOK))
    lm = TinyLM.random(list(SPELL), rng)
    kw = dict(lm_weight=0.7, word_score=-0.3)
    dec = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, lm=lm, nbest=4, **kw, **WIDE)
    ref = brute_lexicon(em, "ctc", 0, None, 3, SPELL, lm=lm, **kw)
    hyps = dec.decode(em[None])[0]
    _check_nbest(hyps, ref, 4)
    h = hyps[0]
    assert h.lm_score == pytest.approx(lm.sentence(h.words), abs=1e-5)
    assert h.score == pytest.approx(h.am_score + 0.7 * h.lm_score - 0.3 * len(h.words), abs=1e-5)
    assert len(h.timesteps) == len(h.tokens) and h.timesteps == sorted(set(h.timesteps))


@pytest.mark.parametrize("seed", range(3))
def test_asg_repeat_token_lexicon_matches_brute_force(seed):
    rng = np.random.default_rng(10 + seed)
    tokens = ["a", "b", "<rep>"]
    spell = {"aa": [[0, 0]], "ab": [[0, 1]], "b": [[1]], "bab": [[1, 0, 1]]}
    em = random_emissions(rng, 6, 3)
    dec = BeamSearchDecoder(tokens, topology="asg", repeat=2, lexicon=spell, word_score=0.4, nbest=3, **WIDE)
    ref = brute_lexicon(em, "asg", None, 2, None, spell, word_score=0.4)
    hyps = dec.decode(torch.from_numpy(em)[None])[0]
    _check_nbest(hyps, ref, 3)
    for h in hyps:  # the repeat token is expanded in the output tokens
        assert 2 not in h.tokens


def test_asg_transitions_match_brute_force():
    rng = np.random.default_rng(15)
    tokens = ["a", "b", " ", "<rep>"]
    spell = {"aa": [[0, 0]], "ab": [[0, 1]], "b": [[1]]}
    em = random_emissions(rng, 6, 4)
    trans = rng.normal(size=(5, 4))
    dec = BeamSearchDecoder(
        tokens, topology="asg", repeat=3, lexicon=spell, transitions=torch.from_numpy(trans), nbest=3, **WIDE
    )
    ref = brute_lexicon(em, "asg", None, 3, 2, spell, trans=trans)
    _check_nbest(dec.decode(em[None])[0], ref, 3)
    with pytest.raises(ValueError, match=r"\(C \+ 1, C\)"):
        BeamSearchDecoder(tokens, topology="asg", transitions=trans[:4])
    with pytest.raises(ValueError, match="ASG's"):
        BeamSearchDecoder(tokens, blank=0, transitions=trans)


@pytest.mark.parametrize("seed", range(3))
def test_transducer_word_pieces_matches_brute_force(seed):
    rng = np.random.default_rng(20 + seed)
    tokens = ["a", "b", "ab", "ba", "<b>"]  # blank last
    spell = {"ab": [[2], [0, 1]], "aba": [[2, 0], [0, 3]], "b": [[1]]}
    em = random_emissions(rng, 5, 5)
    lm = TinyLM.random(list(spell), rng)
    dec = BeamSearchDecoder(tokens, topology="transducer", lexicon=spell, lm=lm, lm_weight=1.0, nbest=3, **WIDE)
    assert dec.blank == 4
    ref = brute_lexicon(em, "ctc", 4, None, None, spell, lm=lm, lm_weight=1.0)
    _check_nbest(dec.decode(em[None])[0], ref, 3)


@pytest.mark.parametrize("seed", range(3))
def test_lexicon_free_char_lm_matches_brute_force(seed):
    rng = np.random.default_rng(30 + seed)
    em = random_emissions(rng, 6, 4)
    lm = TinyLM.random(["a", "b", " "], rng)
    dec = BeamSearchDecoder(TOK, blank=0, lm=lm, lexicon_free=True, lm_weight=0.5, word_score=0.2, nbest=3, **WIDE)
    ref = brute_free(em, TOK, "ctc", 0, None, 3, lm=lm, lm_weight=0.5, word_score=0.2)
    _check_nbest(dec.decode(em[None])[0], ref, 3)


def test_lexicon_free_no_lm_is_ctc_prefix_search():
    rng = np.random.default_rng(40)
    em = random_emissions(rng, 6, 4)
    dec = BeamSearchDecoder(TOK, blank=0, nbest=5, **WIDE)
    ref = brute_free(em, TOK, "ctc", 0, None, 3)
    _check_nbest(dec.decode(em[None])[0], ref, 5)
    # no LM: every score is a log-probability of its text, so they sum to at most 1
    total = sum(math.exp(v) for v in ref.values())
    assert total == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("topology,blank,repeat", [("ctc", 0, None), ("asg", None, None), ("transducer", None, None)])
def test_beam_one_equals_greedy(topology, blank, repeat):
    rng = np.random.default_rng(50)
    tokens = ["_", "a", "b", "c", "d", "e"]  # no separator: the lexicon-free text keeps every token
    x = torch.from_numpy(np.stack([random_emissions(rng, 40, 6, peak=1.0) for _ in range(4)]))
    dec = BeamSearchDecoder(tokens, topology=topology, blank=blank, repeat=repeat, beam_size=1)
    got = [h[0].tokens for h in dec.decode(x)]
    assert got == greedy_decode(x, topology=topology, blank=blank, repeat=repeat)


def test_greedy_asg_repeat_and_ragged():
    x = torch.full((2, 4, 3), -5.0)
    for t, c in enumerate([0, 2, 1, 1]):
        x[0, t, c] = 0.0
        x[1, t, c] = 0.0
    assert greedy_decode(x, [4, 2], topology="asg", repeat=2) == [[0, 0, 1], [0, 0]]
    assert greedy_decode(x, [4, 2], topology="ctc", blank=2) == [[0, 1], [0]]


def test_nbest_sorted_distinct():
    rng = np.random.default_rng(60)
    em = random_emissions(rng, 8, 4)
    lm = TinyLM.random(list(SPELL), rng)
    dec = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, lm=lm, nbest=10, beam_size=20)
    hyps = dec.decode(em[None])[0]
    assert 3 <= len(hyps) <= 10  # complete hypotheses of the last beam, merged by word history
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(h.words) for h in hyps}) == len(hyps)


def test_hotword_bonus_changes_result():
    rng = np.random.default_rng(70)
    em = random_emissions(rng, 5, 4)
    ref = brute_lexicon(em, "ctc", 0, None, 3, SPELL)
    ranked = _best(ref, len(ref))
    top, s1 = ranked[0]
    # the best-ranked other hypothesis with a word that the best one lacks
    second, s2, target = next((ws, s, w) for ws, s in ranked[1:] for w in ws if w not in top)
    bonus = (s1 - s2) / second.count(target) + 1.0
    dec = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, hotwords={target: bonus}, **WIDE)
    assert tuple(BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, **WIDE).decode(em[None])[0][0].words) == top
    h = dec.decode(em[None])[0][0]
    ref2 = brute_lexicon(em, "ctc", 0, None, 3, SPELL, hotwords={target: bonus})
    assert tuple(h.words) == _best(ref2)[0][0] and target in h.words
    assert h.score == pytest.approx(_best(ref2)[0][1], abs=1e-4)


@pytest.mark.parametrize("seed", range(2))
def test_lexicon_free_hotwords_match_brute_force(seed):
    rng = np.random.default_rng(110 + seed)
    em = random_emissions(rng, 6, 4)
    plain = brute_free(em, TOK, "ctc", 0, None, 3)
    ranked = _best(plain, len(plain))
    ws, s2, target = next((ws, s, x) for ws, s in ranked[1:] for x in ws if x not in ranked[0][0])
    hot = {target: (ranked[0][1] - s2) / ws.count(target) + 1.0, "ba": -1.0}
    dec = BeamSearchDecoder(TOK, blank=0, hotwords=hot, lexicon_free=True, nbest=3, **WIDE)
    ref = brute_free(em, TOK, "ctc", 0, None, 3, hotwords=hot)
    hyps = dec.decode(em[None])[0]
    _check_nbest(hyps, ref, 3)
    assert target in hyps[0].words


def test_ragged_batch_equals_one_by_one():
    rng = np.random.default_rng(80)
    tokens = ["_"] + list("abcdefg") + [" "]
    words = ["bad", "cab", "face", "fed", "dead", "bead", "ace", "add", "gab"]
    lex = Lexicon.from_words(words, {ch: i for i, ch in enumerate(tokens)})
    lm = TinyLM.random(words, rng, n_bigrams=20)
    dec = BeamSearchDecoder(tokens, blank=0, lexicon=lex, lm=lm, nbest=3, beam_size=16, beam_threshold=20.0)
    x = np.stack([random_emissions(rng, 30, len(tokens), peak=2.0) for _ in range(5)])
    lengths = [30, 12, 0, 25, 7]
    batch = dec.decode(torch.from_numpy(x), torch.tensor(lengths))
    for b, n in enumerate(lengths):
        one = dec.decode(x[b : b + 1, :n])[0]
        assert [(h.words, h.tokens, h.timesteps) for h in batch[b]] == [(h.words, h.tokens, h.timesteps) for h in one]
        assert [h.score for h in batch[b]] == pytest.approx([h.score for h in one])
        assert all(t < n for h in one for t in h.timesteps)
    # zero frames: the empty sentence, scored by the LM alone
    assert batch[2][0].words == [] and batch[2][0].score == pytest.approx(0.5 * lm.sentence([]), abs=1e-5)


def test_unknown_words_need_unk_score():
    rng = np.random.default_rng(90)
    em = random_emissions(rng, 5, 4)
    lm = TinyLM.random(["a", "ab"], rng)  # "b" and "ba" are <unk> to the LM
    strict = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, lm=lm, nbest=50, **WIDE).decode(em[None])[0]
    assert all(set(h.words) <= {"a", "ab"} for h in strict)
    loose = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, lm=lm, unk_score=-1.0, nbest=50, **WIDE).decode(em[None])[0]
    assert any(set(h.words) - {"a", "ab"} for h in loose)


def test_token_beam_and_threshold_prune():
    rng = np.random.default_rng(100)
    x = np.stack([random_emissions(rng, 30, 4, peak=3.0)])
    wide = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, beam_size=50).decode(x)[0][0]
    narrow = BeamSearchDecoder(TOK, blank=0, lexicon=SPELL, beam_size=50, token_beam=2, beam_threshold=10.0).decode(x)[
        0
    ][0]
    assert narrow.score <= wide.score + 1e-6


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(blank=4), "blank=4 out of range"),
        (dict(blank=-1), "blank=-1 out of range"),
        (dict(topology="rnnt"), "topology must be one of"),
        (dict(topology="asg", blank=0), "no blank"),
        (dict(lexicon={"x": [[1, 7]]}), "token id 7 out of range"),
        (dict(lexicon={"x": [[0, 1]]}), "blank token"),
        (dict(lexicon={}), "empty"),
        (dict(lexicon={"x": [[]]}), "empty spelling"),
        (dict(lexicon={"x": [[1.5]]}), "integers"),
        (dict(lexicon={"x": [[-1]]}), "out of range"),
        (dict(lexicon={"x": [[1]]}, hotwords={"y": 1.0}), "not in the lexicon"),
        (dict(beam_size=0), "beam_size"),
        (dict(nbest=True), "nbest"),
        (dict(beam_threshold=-1.0), "beam_threshold"),
        (dict(lm_weight=float("nan")), "lm_weight"),
        (dict(lm=TinyLM(["a"], {"</s>": -1.0, "<unk>": -1.0, "a": -1.0}, {}, {})), "lexicon_free=True"),
        (dict(hotwords={"a c": 1.0}), "without the separator"),
        (dict(hotwords={"ac": 1.0}), "characters"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BeamSearchDecoder(TOK, **kwargs)


def test_decode_errors():
    dec = BeamSearchDecoder(TOK, blank=0)
    with pytest.raises(ValueError, match=r"shape \(B, T, C\)"):
        dec.decode(torch.zeros(5, 4))
    with pytest.raises(ValueError, match="C=5 classes"):
        dec.decode(torch.zeros(1, 5, 5))
    with pytest.raises(ValueError, match="floating point"):
        dec.decode(torch.zeros(1, 5, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="NaN"):
        dec.decode(torch.full((1, 5, 4), float("nan")))
    with pytest.raises(ValueError, match="lengths must be in"):
        dec.decode(torch.zeros(2, 5, 4), [5, 6])
    with pytest.raises(ValueError, match=r"lengths must have shape \(B,\)"):
        dec.decode(torch.zeros(2, 5, 4), [5])
    with pytest.raises(ValueError, match="integers"):
        dec.decode(torch.zeros(2, 5, 4), torch.tensor([1.0, 2.0]))
    big = BeamSearchDecoder(TOK, blank=0, beam_size=1_000_000, max_work_bytes=1 << 28)
    with pytest.raises(ValueError, match="beam_size=1000000 .* max_work_bytes"):
        big.decode(torch.zeros(1, 100, 4))
    # -inf log-probabilities are fine; a frame where everything is -inf ends the beam: the
    # utterance still gets one (empty, flagged) hypothesis
    x = torch.full((1, 3, 4), -math.inf)
    (only,) = dec.decode(x)[0]
    assert only.fallback and only.words == [] and only.tokens == [] and only.score == -math.inf


def test_bad_lm_arrays_are_rejected():
    lm = TinyLM(["a", "b"], {"</s>": -1.0, "<unk>": -1.0, "a": -1.0, "b": -1.0}, {("a", "b"): -0.1}, {"a": -0.5})
    good = lm.arrays()
    bad = [
        good._replace(arc_next=np.full_like(good.arc_next, 99)),
        good._replace(backoff_state=np.full_like(good.backoff_state, 7)),
        good._replace(state_offsets=good.state_offsets[:-1]),
        good._replace(state_offsets=good.state_offsets[::-1].copy()),
        good._replace(backoff_state=np.zeros_like(good.backoff_state)),  # a cycle at the root
        good._replace(start_state=50),
        good._replace(arc_word=np.full_like(good.arc_word, 1000)),
    ]
    for arr in bad:
        lm.arrays = lambda arr=arr: arr
        with pytest.raises(ValueError, match="LM arrays"):
            BeamSearchDecoder(["_", "a", "b", " "], blank=0, lexicon={"a": [[1]], "b": [[2]]}, lm=lm)


def test_lexicon_from_words_and_trie():
    lex = Lexicon.from_words(["ab", "a", "ab", "b"], {"a": 1, "b": 2})
    assert lex.words == ["ab", "a", "b"] and lex.num_nodes == 4
    # the root's children are sorted tokens; "a" ends at the child of token 1
    assert lex.child_token[lex.child_offsets[0] : lex.child_offsets[1]].tolist() == [1, 2]
    node_a = lex.child_node[0]
    assert lex.node_word[lex.word_offsets[node_a] : lex.word_offsets[node_a + 1]].tolist() == [1]
    with pytest.raises(ValueError, match="characters"):
        Lexicon.from_words(["abc"], {"a": 1, "b": 2})


def test_docstring_examples_run():
    import doctest

    import lightning_gtn.decode.beam as beam
    import lightning_gtn.decode.greedy as greedy
    import lightning_gtn.decode.lexicon as lexicon

    for module in (beam, greedy, lexicon):
        assert doctest.testmod(module).failed == 0


def test_lexicon_from_pieces_enumerates_decompositions():
    pieces = ["a", "b", "ab", "ba", "<b>"]
    lex = Lexicon.from_pieces(["aba", "b"], pieces, skip=[4])
    want = {"aba": {(0, 1, 0), (2, 0), (0, 3)}, "b": {(1,)}}
    # walk the trie: every root-to-word path is a spelling
    got = {w: set() for w in want}

    def walk(node, path):
        for q in range(lex.word_offsets[node], lex.word_offsets[node + 1]):
            got[lex.words[lex.node_word[q]]].add(tuple(path))
        for k in range(lex.child_offsets[node], lex.child_offsets[node + 1]):
            walk(int(lex.child_node[k]), path + [int(lex.child_token[k])])

    walk(0, [])
    assert got == want
    lex = Lexicon.from_pieces(["abab"], pieces, max_spellings=2, skip=[4])
    got = {"abab": set()}
    walk(0, [])
    assert len(got["abab"]) == 2 and (2, 2) in got["abab"]  # the fewest pieces first
    assert all(len(sp) == 3 for sp in got["abab"] - {(2, 2)})
    with pytest.raises(ValueError, match="cannot be spelled"):
        Lexicon.from_pieces(["abc"], pieces)


def test_lexicon_size_is_bounded_before_the_trie_grows(monkeypatch):
    from lightning_gtn.decode import lexicon as lexicon_module

    monkeypatch.setattr(lexicon_module, "MAX_SPELLING_TOKENS", 100)
    # 16 spellings of a long word: refused while the spellings are collected, before any trie
    with pytest.raises(ValueError, match="more than MAX_SPELLING_TOKENS=100 tokens"):
        Lexicon.from_pieces(["b" + "a" * 40], ["a", "aa", "b"])
    with pytest.raises(ValueError, match="more than MAX_SPELLING_TOKENS=100 tokens"):
        Lexicon({f"w{i}": [[1, 2, 3]] for i in range(40)})
    monkeypatch.setattr(lexicon_module, "MAX_SPELLING_TOKENS", 1 << 24)
    monkeypatch.setattr(lexicon_module, "MAX_TRIE_NODES", 50)
    with pytest.raises(ValueError, match="exceed MAX_TRIE_NODES=50 nodes"):
        Lexicon({f"w{i}": [[i, 1, 2]] for i in range(40)})
    assert Lexicon({f"w{i}": [[1, 2, i]] for i in range(40)}).num_nodes == 43  # shared prefixes


def test_kth_best_score_is_numpys_partition():
    """The beam's cut (the ``beam_size``-th best candidate score) is the value ``np.partition``
    gives (which it replaced), on random, tied, sorted and infinite scores, and leaves the
    scores as they were."""
    from lightning_gtn.kernels.beam_search_numba import _kth_smallest

    rng = np.random.default_rng(3)
    for trial in range(2000):
        n = int(rng.integers(1, 50))
        a = [
            rng.normal(size=n),
            rng.integers(0, 3, n).astype(np.float64),  # ties
            np.sort(rng.normal(size=n))[::-1].copy(),
            np.where(rng.random(n) < 0.3, np.inf, rng.normal(size=n)),
        ][trial % 4]
        k = int(rng.integers(0, n))
        kept = a.copy()
        assert _kth_smallest(a, n, k, np.empty(k + 1)) == np.partition(kept, k)[k]
        np.testing.assert_array_equal(a, kept)


def test_every_utterance_gets_a_hypothesis():
    """Lexicon mode: a beam full of hypotheses inside words at the last frame returned no
    hypothesis (found with random lexicons and emissions). Hypotheses that can no longer end a
    word in the frames left are dropped before the beam cut (that is exact: they could never be
    returned); an utterance without any complete hypothesis gets the best survivor, flagged."""
    tokens = ["_", "a", "b", "c", "d", "e"]
    lex = {"d0": [[4]], "ace1": [[1, 3, 5]], "beec2": [[2, 5, 5, 3]], "b3": [[2]]}
    rng = np.random.default_rng(0)
    for _ in range(23):  # the 23rd draw of the search that found it
        C = int(rng.integers(3, 7))
        nw = int(rng.integers(1, 6))
        for _ in range(nw):
            rng.integers(1, C, size=int(rng.integers(1, 5)))
        T = int(rng.integers(1, 12))
        x = torch.log_softmax(torch.tensor(rng.normal(size=(1, T, C)) * 3), -1).float()
    assert x.shape == (1, 8, 6)
    for beam in (16, 64):
        dec = BeamSearchDecoder(tokens, blank=0, lexicon=lex, beam_size=beam, beam_threshold=1e9, lm_weight=0.0)
        (best,) = dec.decode(x)[0]
        assert not best.fallback and best.words and all(w in lex for w in best.words)
    # no blank (the empty sentence is out) and no word fits in two frames: the best survivor, its
    # open word spelled from its tokens
    dec = BeamSearchDecoder(tokens, blank=0, lexicon={"abc": [[1, 2, 3]]}, beam_size=4)
    x = torch.tensor([[[-math.inf, -0.1, -3.0, -3.0, -3.0, -3.0], [-math.inf, -3.0, -0.1, -3.0, -3.0, -3.0]]])
    (only,) = dec.decode(x)[0]
    assert only.fallback and only.tokens == [1, 2] and only.words == ["ab"] and only.text == "ab"
    assert math.isfinite(only.score)
