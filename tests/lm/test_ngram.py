"""NGramLM (the decoder contract), the KN/WB estimator, perplexity, the CLI and lexicons."""

import io
import json
import math

import numpy as np
import pytest

from lightning_gtn.lm import (
    BOS,
    EOS,
    UNK,
    LMArrays,
    NGramLM,
    check_arrays,
    estimate,
    kn_discounts,
    perplexity,
    read_lexicon,
)
from lightning_gtn.lm.cli import main as cli_main

CORPUS = ["a b c", "a b", "b c a", "c c b a", "a a b c", "b a c c a b"]


def all_histories_sum_to_one(lm: NGramLM, tol=2e-6):
    """Sums P(w | s) over every word but <s>, for every state of the automaton."""
    ids = [i for i in range(len(lm.words)) if i != lm.bos]
    for s in range(lm.num_states):
        total = sum(math.exp(lm.score(s, w)[0]) for w in ids)
        assert total == pytest.approx(1.0, abs=tol), (s, total)


@pytest.mark.parametrize("method", ["kneser_ney", "witten_bell"])
@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_history_sums_to_one(method, order):
    lm = estimate(CORPUS, order=order, method=method)
    assert lm.order == order
    all_histories_sum_to_one(lm)
    # and by the n-gram tables directly (no float32 arrays): every explicit history
    ids = [i for i in range(len(lm.words)) if i != lm.bos]
    for n in range(1, order):
        for h in lm._ngrams[n - 1]:
            if h[-1] == lm.eos:
                continue
            total = sum(math.exp(lm._backoff_logp(h[-(order - 1) :], w)) for w in ids)
            assert total == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("method", ["kn", "wb"])
def test_sums_to_one_with_pruning_vocab_and_chars(method):
    lm = estimate(CORPUS * 2, order=3, method=method, prune=[0, 3, 3])
    full = estimate(CORPUS * 2, order=3, method=method)
    assert sum(lm.counts()[1:]) < sum(full.counts()[1:])
    all_histories_sum_to_one(lm)
    lm = estimate(CORPUS, order=3, method=method, vocab=["a", "b", "zz"])
    assert "zz" in lm.words and "c" not in lm.words
    assert lm.word_id("c") == lm.unk
    all_histories_sum_to_one(lm)
    chars = estimate([list("abracadabra"), list("cadabra")], order=4, method=method)
    assert set(chars.words) == set("abrcd") | {BOS, EOS, UNK}
    all_histories_sum_to_one(chars)


def test_kneser_ney_by_hand():
    # corpus "<s> a b </s>", "<s> a </s>"; bigram model.
    # unigram continuation counts: a <- {<s>} = 1, b <- {a} = 1, </s> <- {b, a} = 2, <unk> 0;
    # count-of-counts t1 = 2, t2 = 1, t3 = 0 -> fallback D = (0.5, 1, 1.5); total 4; |V| = 4.
    # gamma() = (0.5 * 2 + 1 * 1) / 4 = 0.5
    # P(a) = (1 - .5)/4 + .5/4 = .25, P(b) = .25, P(</s>) = (2 - 1)/4 + .125 = .375, P(<unk>) = .125
    # bigrams (raw counts, t1 = 3, t2 = 1, t3 = 0 -> fallback):
    # <s>: c(<s> a) = 2, gamma = 1 * 1 / 2 = .5, P(a|<s>) = (2 - 1)/2 + .5 * .25 = .625
    # a: c(a b) = c(a </s>) = 1, gamma = .5 * 2 / 2 = .5,
    #    P(b|a) = .5/2 + .5 * .25 = .375, P(</s>|a) = .25 + .5 * .375 = .4375
    # b: c(b </s>) = 1, gamma = .5, P(</s>|b) = .5 + .5 * .375 = .6875
    lm = estimate(["a b", "a"], order=2, method="kneser_ney")
    u = lm.ngrams(1)
    for w, p in {"a": 0.25, "b": 0.25, EOS: 0.375, UNK: 0.125}.items():
        assert math.exp(u[(w,)][0]) == pytest.approx(p, rel=1e-12)
    assert math.exp(u[(BOS,)][1]) == pytest.approx(0.5)
    assert math.exp(u[("a",)][1]) == pytest.approx(0.5)
    bi = lm.ngrams(2)
    assert math.exp(bi[(BOS, "a")][0]) == pytest.approx(0.625)
    assert math.exp(bi[("a", "b")][0]) == pytest.approx(0.375)
    assert math.exp(bi[("a", EOS)][0]) == pytest.approx(0.4375)
    assert math.exp(bi[("b", EOS)][0]) == pytest.approx(0.6875)
    assert set(bi) == {(BOS, "a"), ("a", "b"), ("a", EOS), ("b", EOS)}
    # through the decoder interface, with back-off: P(b | <s>) = gamma(<s>) P(b) = .125
    s = lm.start_state()
    assert math.exp(lm.score(s, lm.word_id("b"))[0]) == pytest.approx(0.125, rel=1e-6)
    assert math.exp(lm.sentence_score(["a", "b"])) == pytest.approx(0.625 * 0.375 * 0.6875, rel=1e-6)


def test_witten_bell_by_hand():
    # unigram raw counts a 2, b 1, </s> 2: total 5, T = 3 types, gamma = 3/8, uniform 1/4
    # P(a) = 2/8 + 3/8 * 1/4 = .34375, P(b) = .21875, P(</s>) = .34375, P(<unk>) = .09375
    # <s>: c = 2, T = 1: P(a|<s>) = (2 + 1 * .34375) / 3 = .78125
    # a: c = 2, T = 2: P(b|a) = (1 + 2 * .21875) / 4 = .359375
    # b: c = 1, T = 1: P(</s>|b) = (1 + .34375) / 2 = .671875
    lm = estimate(["a b", "a"], order=2, method="witten_bell")
    u = lm.ngrams(1)
    for w, p in {"a": 0.34375, "b": 0.21875, EOS: 0.34375, UNK: 0.09375}.items():
        assert math.exp(u[(w,)][0]) == pytest.approx(p, rel=1e-12)
    bi = lm.ngrams(2)
    assert math.exp(bi[(BOS, "a")][0]) == pytest.approx(0.78125)
    assert math.exp(bi[("a", "b")][0]) == pytest.approx(0.359375)
    assert math.exp(bi[("b", EOS)][0]) == pytest.approx(0.671875)
    assert math.exp(u[(BOS,)][1]) == pytest.approx(1 / 3)  # gamma(<s>) = T / (c + T)


def test_kn_discounts_formula():
    # Y = 10 / 18; D1 = 1 - 2Y 4/10; D2 = 2 - 3Y 2/4; D3+ = 3 - 4Y 1/2
    y = 10 / 18
    assert kn_discounts([10, 4, 2, 1]) == pytest.approx((1 - 2 * y * 0.4, 2 - 3 * y * 0.5, 3 - 4 * y * 0.5))
    assert kn_discounts([3, 0, 1, 1]) == (0.5, 1.0, 1.5)  # fallback
    # the estimator uses the count-of-counts of each order: with a given discount it differs
    big = [" ".join("abcde"[(i * j) % 5] for j in range(7)) for i in range(40)]
    d = estimate(big, order=2)
    fixed = estimate(big, order=2, discount=0.7)
    assert d.ngrams(2) != fixed.ngrams(2)
    all_histories_sum_to_one(fixed)


def test_contract_and_arrays():
    lm = estimate(CORPUS, order=3)
    assert {BOS, EOS, UNK} <= set(lm.words)
    assert lm.words[lm.word_id("a")] == "a"
    assert lm.word_id("never-seen") == lm.unk
    a = lm.arrays()
    assert isinstance(a, LMArrays)
    assert a.state_offsets.dtype == np.int64 and a.arc_word.dtype == np.int32
    assert a.arc_logp.dtype == np.float32 and a.arc_next.dtype == np.int32
    assert a.backoff_logp.dtype == np.float32 and a.backoff_state.dtype == np.int32
    assert a.backoff_state[0] == -1 and (a.backoff_state[1:] >= 0).all()
    root = a.arc_word[a.state_offsets[0] : a.state_offsets[1]]
    assert sorted(root.tolist()) == [i for i in range(len(lm.words)) if i != lm.bos]
    for s in range(lm.num_states):
        sl = a.arc_word[a.state_offsets[s] : a.state_offsets[s + 1]]
        assert (np.diff(sl) > 0).all()
    assert (a.bos, a.eos, a.unk) == (lm.bos, lm.eos, lm.unk)
    # the start state is the history <s>: P(a | <s>) is the explicit bigram's
    p = lm.score(lm.start_state(), lm.word_id("a"))[0]
    assert p == pytest.approx(lm.ngrams(2)[(BOS, "a")][0], abs=1e-6)
    assert lm.final_score(lm.start_state()) == lm.score(lm.start_state(), lm.eos)[0]
    assert lm.score(lm.start_state(), lm.bos)[0] == -math.inf
    with pytest.raises(ValueError, match="state"):
        lm.score(lm.num_states, 0)
    with pytest.raises(ValueError, match="word"):
        lm.score(0, len(lm.words))
    with pytest.raises(ValueError, match="word"):
        lm.score(0, -1)
    bad = a._replace(arc_next=np.full_like(a.arc_next, lm.num_states))
    with pytest.raises(ValueError, match="arc_next"):
        check_arrays(bad, len(lm.words))
    bad = a._replace(arc_word=a.arc_word[::-1].copy())
    with pytest.raises(ValueError, match="arc_word"):
        check_arrays(bad, len(lm.words))


def test_arrays_in_a_numba_loop_equal_score():
    numba = pytest.importorskip("numba")

    @numba.njit(cache=False)
    def score(off, aw, ap, an, bl, bs, s, w):
        acc = 0.0
        while s != -1:
            lo, hi = off[s], off[s + 1]
            while lo < hi:  # binary search
                mid = (lo + hi) // 2
                if aw[mid] < w:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < off[s + 1] and aw[lo] == w:
                return acc + ap[lo], an[lo]
            acc += bl[s]
            s = bs[s]
        return -np.inf, 0

    lm = estimate(CORPUS, order=3, method="wb")
    a = lm.arrays()
    for s in range(lm.num_states):
        for w in range(len(lm.words)):
            got = score(a.state_offsets, a.arc_word, a.arc_logp, a.arc_next, a.backoff_logp, a.backoff_state, s, w)
            want = lm.score(s, w)
            assert got[1] == want[1]
            assert got[0] == pytest.approx(want[0], abs=1e-5) or got[0] == want[0] == -math.inf


def test_perplexity():
    lm = estimate(CORPUS, order=2)
    sents = ["a b", "c x"]
    total = lm.sentence_score(["a", "b"]) + lm.sentence_score(["c", "x"])
    assert perplexity(lm, sents) == pytest.approx(math.exp(-total / 6))
    assert perplexity(lm, [["a", "b"], ["c", "x"]]) == perplexity(lm, sents)
    # more context gives lower perplexity on the training text
    assert perplexity(estimate(CORPUS, order=3), CORPUS) < perplexity(estimate(CORPUS, order=1), CORPUS)
    assert math.isnan(perplexity(lm, []))


def test_estimate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="order"):
        estimate(CORPUS, order=0)
    with pytest.raises(ValueError, match="order"):
        estimate(CORPUS, order=17)
    with pytest.raises(ValueError, match="method"):
        estimate(CORPUS, method="good_turing")
    with pytest.raises(ValueError, match="discount"):
        estimate(CORPUS, order=2, discount=[0.5])
    with pytest.raises(ValueError, match="discount"):
        estimate(CORPUS, order=2, discount=1.5)
    with pytest.raises(ValueError, match="discount"):
        estimate(CORPUS, order=2, method="wb", discount=0.5)
    with pytest.raises(ValueError, match="prune"):
        estimate(CORPUS, order=2, prune=[2, 2])
    with pytest.raises(ValueError, match="prune"):
        estimate(CORPUS, order=2, prune=[0])
    with pytest.raises(TypeError, match="sentences"):
        estimate("a b c", order=2)
    with pytest.raises(TypeError, match="sentences"):
        estimate([["a", 3]], order=2)
    with pytest.raises(ValueError, match="<s>"):
        estimate(["a <s> b"], order=2)


def test_cli(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat\r\n\nthe dog sat\na cat ran\n", encoding="utf-8")
    out = tmp_path / "lm.arpa"
    assert cli_main(["--text", str(text), "--order", "3", "--method", "kn", "--out", str(out), "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lm = NGramLM.from_arpa(out)
    assert res["ngrams"] == lm.counts() and lm.order == 3
    ref = estimate(["the cat sat", "the dog sat", "a cat ran"], order=3)
    assert lm.sentence_score("the cat ran".split()) == pytest.approx(
        ref.sentence_score("the cat ran".split()), abs=1e-6
    )
    out2 = tmp_path / "chars.arpa"
    assert cli_main(["--text", str(text), "--order", "4", "--chars", "--method", "wb", "--out", str(out2)]) == 0
    chars = NGramLM.from_arpa(out2)
    assert "|" in chars.words and "t" in chars.words and "the" not in chars.words
    assert cli_main(["--text", str(tmp_path / "missing.txt"), "--out", str(out2)]) == 2
    assert "error" in capsys.readouterr().err


def test_read_lexicon(tmp_path):
    lex = read_lexicon(io.StringIO("the dh ah\r\nthe\tdh iy\n\na ah\nthe dh ah\n"))
    assert lex == {"the": [["dh", "ah"], ["dh", "iy"]], "a": [["ah"]]}
    p = tmp_path / "lexiconp.txt"
    p.write_text("the 1.0 dh ah\nthe 0.5 dh iy\na 1 ah\n", encoding="utf-8")
    assert read_lexicon(p) == {"the": [["dh", "ah"], ["dh", "iy"]], "a": [["ah"]]}
    assert read_lexicon(p, probabilities=False)["a"] == [["1", "ah"]]
    # a numeric token in a plain lexicon is not taken for a probability
    assert read_lexicon(io.StringIO("one 1\ntwo 2 x\n")) == {"one": [["1"]], "two": [["2", "x"]]}
    with pytest.raises(ValueError, match="line 2"):
        read_lexicon(io.StringIO("a b\nlonely\n"))
    with pytest.raises(ValueError, match="line 1"):
        read_lexicon(io.StringIO("a x b\n"), probabilities=True)
    with pytest.raises(ValueError, match="max_bytes"):
        read_lexicon(io.StringIO("a b\n" * 100), max_bytes=50)


def test_pickle_and_from_ngrams():
    import pickle

    lm = estimate(CORPUS, order=3)
    lm.arrays()
    back = pickle.loads(pickle.dumps(lm))
    assert back.words == lm.words
    for s in CORPUS:
        assert back.sentence_score(s.split()) == lm.sentence_score(s.split())
    # from_ngrams checks its input
    with pytest.raises(ValueError, match="not finite"):
        NGramLM.from_ngrams([{("a",): (math.nan, 0.0)}])
    with pytest.raises(ValueError, match="above 0"):
        NGramLM.from_ngrams([{("a",): (0.5, 0.0)}])
    with pytest.raises(ValueError, match="order"):
        NGramLM.from_ngrams([])
    one = NGramLM.from_ngrams([{("a",): (math.log(0.5), 0.0), (EOS,): (math.log(0.5), 0.0)}])
    assert one.order == 1 and one.start_state() == 0
    assert one.sentence_score(["a"]) == pytest.approx(2 * math.log(0.5), abs=1e-6)


def test_cli_bounds_what_it_reads_and_fails_early(tmp_path, capsys):
    # Second probe: --text /dev/zero and --vocab /dev/zero read without limit (getsize is 0 for
    # devices); empty text exited 0 with perplexity NaN; a bad --out failed only after estimating.
    text = tmp_path / "t.txt"
    text.write_text("a b c\nb c a\n")
    out = tmp_path / "lm.arpa"
    assert cli_main(["--text", "/dev/zero", "--out", str(out), "--no-progress"]) == 2
    assert "--text '/dev/zero': not a regular file" in capsys.readouterr().err
    assert cli_main(["--text", str(text), "--vocab", "/dev/zero", "--out", str(out), "--no-progress"]) == 2
    assert "--vocab '/dev/zero': not a regular file" in capsys.readouterr().err
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    assert cli_main(["--text", str(blank), "--out", str(out), "--no-progress"]) == 2
    assert "holds no sentence" in capsys.readouterr().err and not out.exists()
    assert cli_main(["--text", str(text), "--out", str(tmp_path / "no" / "dir" / "lm.arpa"), "--no-progress"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert cli_main(["--text", str(text), "--out", str(tmp_path), "--no-progress"]) == 2
    assert "is a directory" in capsys.readouterr().err
    from lightning_gtn.lm.cli import read_sentences

    big = tmp_path / "big.txt"
    big.write_text("a b\n" * 100)
    with pytest.raises(ValueError, match="over max_bytes=50"):
        read_sentences(str(big), max_bytes=50)
    assert cli_main(["--text", str(text), "--out", str(out), "--no-progress"]) == 0
