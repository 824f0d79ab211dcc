"""ARPA reading (untrusted input) and writing; KenLM as the reference when importable."""

import io
import math
import random

import pytest

from lightning_gtn.lm import BOS, EOS, UNK, NGramLM, estimate, read_arpa

LN10 = math.log(10)
CORPUS = ["a b c", "a b", "b c a", "c c b a", "a a b c", "b a c c a b"]

# a hand-written trigram model, in the layout SRILM/KenLM write (tabs, -99 for <s>)
ARPA = """This text before \\data\\ is ignored.

\\data\\
ngram 1=6
ngram 2=4
ngram 3=2

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.5
-0.5\t</s>
-0.6\ta\t-0.25
-0.7\tb\t-0.2
-0.8\tc

\\2-grams:
-0.3\t<s> a\t-0.1
-0.4\ta b\t-0.15
-0.2\tb </s>
-0.35\tb c

\\3-grams:
-0.1\t<s> a b
-0.05\ta b c

\\end\\
"""


def lp(x):
    return x * LN10


def test_reads_values_in_natural_log():
    lm = read_arpa(io.StringIO(ARPA))
    assert lm.order == 3 and lm.counts() == [6, 4, 2]
    assert lm.ngrams(1)[("a",)] == pytest.approx((lp(-0.6), lp(-0.25)))
    assert lm.ngrams(3)[("a", "b", "c")][0] == pytest.approx(lp(-0.05))
    s = lm.start_state()
    # explicit trigram after "<s> a"
    p1, s = lm.score(s, lm.word_id("a"))
    assert p1 == pytest.approx(lp(-0.3), abs=1e-6)
    p2, s = lm.score(s, lm.word_id("b"))
    assert p2 == pytest.approx(lp(-0.1), abs=1e-6)
    # history "a b": "a b a" missing -> bow(a b) + P(a | b) = bow(a b) + bow(b) + P(a)
    p3, _ = lm.score(s, lm.word_id("a"))
    assert p3 == pytest.approx(lp(-0.15 - 0.2 - 0.6), abs=1e-6)
    # "a b </s>" missing -> bow(a b) + P(</s> | b)
    assert lm.final_score(s) == pytest.approx(lp(-0.15 - 0.2), abs=1e-6)
    # unknown word
    p, _ = lm.score(lm.start_state(), lm.word_id("zzz"))
    assert p == pytest.approx(lp(-0.5 - 1.0), abs=1e-6)


def test_blank_lines_crlf_and_spaces():
    text = ARPA.replace("\n", "\r\n").replace("\t", "  ").replace("\\1-grams:", "\r\n\r\n\\1-grams:")
    a, b = read_arpa(io.StringIO(text, newline="")), read_arpa(io.StringIO(ARPA))
    assert a.ngrams(2) == b.ngrams(2) and a.ngrams(3) == b.ngrams(3)


@pytest.mark.parametrize("method", ["kn", "wb"])
def test_round_trip(tmp_path, method):
    lm = estimate(CORPUS, order=3, method=method, prune=[0, 1, 2])
    path = tmp_path / "lm.arpa"
    text = lm.to_arpa(path)
    back = NGramLM.from_arpa(path)
    assert back.words == lm.words and back.counts() == lm.counts()
    for n in range(1, 4):
        x, y = lm.ngrams(n), back.ngrams(n)
        assert x.keys() == y.keys()
        for g in x:
            assert y[g] == pytest.approx(x[g], rel=1e-8, abs=1e-12)
    assert back.to_arpa() == text  # the text is a fixed point
    for s in CORPUS:
        assert back.sentence_score(s.split()) == pytest.approx(lm.sentence_score(s.split()), abs=1e-5)


def test_missing_histories_are_added_like_kenlm():
    # "b c" is missing, the trigram "a b c" needs it as... no: "a b c"'s history is "a b";
    # here the history "x a" of "x a b" is absent, and "x" has no bigram at all
    text = """\\data\\
ngram 1=6
ngram 2=2
ngram 3=1

\\1-grams:
-1\t<unk>
-99\t<s>\t-0.3
-0.5\t</s>
-0.6\ta\t-0.2
-0.7\tb
-0.8\tx\t-0.4

\\2-grams:
-0.3\t<s> a
-0.4\ta b

\\3-grams:
-0.1\tx a b

\\end\\
"""
    lm = read_arpa(io.StringIO(text))
    added = lm.ngrams(2)[("x", "a")]
    # added with the probability back-off gives it (bow(x) + P(a)) and bow 0
    assert added == pytest.approx((lp(-0.4 - 0.6), 0.0))
    s = lm.score(lm.score(0, lm.word_id("x"))[1], lm.word_id("a"))[1]
    assert lm.score(s, lm.word_id("b"))[0] == pytest.approx(lp(-0.1), abs=1e-6)
    with pytest.raises(ValueError, match="history of 'x a b'"):
        read_arpa(io.StringIO(text), add_missing=False)


def test_missing_special_words_are_added():
    text = "\\data\\\nngram 1=2\n\n\\1-grams:\n-0.3\t</s>\n-0.3\ta\n\\end\\\n"
    lm = read_arpa(io.StringIO(text))
    assert {BOS, UNK} <= set(lm.words)
    assert lm.score(0, lm.unk)[0] == pytest.approx(-99 * LN10, rel=1e-6)
    with pytest.raises(ValueError, match="the unigram .* is missing"):
        read_arpa(io.StringIO(text), add_missing=False)


def _bad(body: str, header: str = "ngram 1=3\nngram 2=1\n") -> str:
    return "\\data\\\n" + header + "\n" + body


GOOD_BODY = "\\1-grams:\n-1 <unk>\n-99 <s> 0\n-0.5 </s>\n\\2-grams:\n-0.2 <s> </s>\n\\end\\\n"


def test_good_body_loads():
    lm = read_arpa(io.StringIO(_bad(GOOD_BODY)))
    assert lm.final_score(lm.start_state()) == pytest.approx(lp(-0.2), abs=1e-6)


@pytest.mark.parametrize(
    "body, header, match",
    [
        (GOOD_BODY.replace("-0.5 </s>\n", ""), None, r"line \d+: section \\1-grams: has 2"),
        (GOOD_BODY.replace("-0.5 </s>\n", "-0.5 </s>\n-0.5 a\n"), None, "line 9: more 1-grams"),
        (GOOD_BODY.replace("-1 <unk>", "-1 <unk> 0 0"), None, "line 6: a 1-gram line"),
        (GOOD_BODY.replace("-1 <unk>", "minus <unk>"), None, "line 6: probability 'minus'"),
        (GOOD_BODY.replace("-1 <unk>", "nan <unk>"), None, "line 6: probability 'nan' is not a number"),
        (GOOD_BODY.replace("-1 <unk>", "-inf <unk>"), None, "line 6: log10 probability"),
        (GOOD_BODY.replace("-1 <unk>", "0.5 <unk>"), None, "line 6: log10 probability"),
        (GOOD_BODY.replace("-99 <s> 0", "-99 <s> inf"), None, "line 7: back-off weight 'inf' is not a number"),
        (GOOD_BODY.replace("-0.5 </s>", "-0.5 <unk>"), None, "line 8: the 1-gram '<unk>' repeats"),
        (GOOD_BODY.replace("<s> </s>", "<s> q"), None, "word 'q' has no unigram"),
        (GOOD_BODY.replace("<s> </s>", "</s> <s>"), None, "<s> may only begin"),
        (GOOD_BODY.replace("\\2-grams:", "\\3-grams:"), None, "line 9: section .*3-grams:. out of order"),
        (GOOD_BODY.replace("\\end\\\n", ""), None, "without"),
        (GOOD_BODY.replace("\\2-grams:\n-0.2 <s> </s>\n", ""), None, "before the"),
        ("\\1-grams:\n", "ngram 1=1000000000000\n", "over max_bytes"),
        ("", "ngram 17=1\n", "order 17"),
        ("\\1-grams:\n", "ngram 1=1\nngram 3=1\n", "orders 1..3"),
        ("", "ngram 1=1\nngram 1=2\n", "given twice"),
        ("junk\n", "", "no 'ngram N=count'"),
    ],
)
def test_malformed_files_raise_value_error(body, header, match):
    with pytest.raises(ValueError, match=match):
        read_arpa(io.StringIO(_bad(body, header if header is not None else "ngram 1=3\nngram 2=1\n")))


def test_other_malformed_inputs(tmp_path):
    with pytest.raises(ValueError, match="no \\\\data"):
        read_arpa(io.StringIO("hello\n"))
    with pytest.raises(ValueError, match="ends inside"):
        read_arpa(io.StringIO("\\data\\\nngram 1=2\n"))
    with pytest.raises(ValueError, match="longer than"):
        read_arpa(io.StringIO("\\data\\\n" + "x" * 70000))
    p = tmp_path / "bin.arpa"
    p.write_bytes(b"\\data\\\nngram 1=1\n\n\\1-grams:\n-1 \xff\xfe\n\\end\\\n")
    with pytest.raises(ValueError, match="UTF-8"):
        read_arpa(p)
    # max_bytes is checked on the header's counts, before any n-gram is read
    with pytest.raises(ValueError, match="max_bytes"):
        read_arpa(io.StringIO(ARPA), max_bytes=100)


def test_mutated_files_never_crash():
    lines = ARPA.splitlines()
    rng = random.Random(0)
    loaded = 0
    for _ in range(300):
        ls = list(lines)
        op = rng.randrange(5)
        i = rng.randrange(len(ls))
        if op == 0:
            ls = ls[:i]  # truncated
        elif op == 1:
            del ls[i]
        elif op == 2:
            ls.insert(i, ls[rng.randrange(len(ls))])
        elif op == 3:
            f = ls[i].split("\t")
            f[rng.randrange(len(f))] = rng.choice(["", "1e999", "-nan", "x", "-3", "<s>", "\\end\\"])
            ls[i] = "\t".join(f)
        else:
            ls[i] = ls[i][: rng.randrange(len(ls[i]) + 1)]
        try:
            lm = read_arpa(io.StringIO("\n".join(ls)))
        except ValueError:
            continue
        loaded += 1
        lm.arrays()  # whatever loads also builds checked arrays
        assert lm.sentence_score(["a", "b"]) <= 0
    assert 0 < loaded < 300


# -- KenLM as the reference ----------------------------------------------------------------------


def _kenlm(path):
    kenlm = pytest.importorskip("kenlm")
    return kenlm.Model(str(path))


@pytest.mark.parametrize("method, prune", [("kn", None), ("kn", [0, 2, 2]), ("wb", None)])
def test_scores_equal_kenlm_on_our_arpa(tmp_path, method, prune):
    lm = estimate(CORPUS, order=3, method=method, prune=prune)
    path = tmp_path / "lm.arpa"
    lm.to_arpa(path)
    k = _kenlm(path)
    for s in CORPUS + ["c a x b", "b b b", "a"]:
        words = s.split()
        want = [x[0] for x in k.full_scores(s, bos=True, eos=True)]
        st = lm.start_state()
        got = []
        for w in words + [EOS]:
            p, st = lm.score(st, lm.word_id(w))
            got.append(p / LN10)
        assert got == pytest.approx(want, abs=1e-5)
    assert k.perplexity("a b c") == pytest.approx(10 ** (-lm.sentence_score("a b c".split()) / LN10 / 4), rel=1e-5)


def test_hand_written_arpa_equals_kenlm(tmp_path):
    path = tmp_path / "h.arpa"
    body = ARPA.split("\n", 2)[2]  # KenLM wants \data\ on the first non-empty line
    path.write_text(body, encoding="utf-8")
    k = _kenlm(path)
    lm = read_arpa(path)
    for s in ["a b c", "a b a", "c b a b c", "x a b", "b"]:
        assert lm.sentence_score(s.split()) / LN10 == pytest.approx(k.score(s, bos=True, eos=True), abs=1e-5)


# -- second probe: findings 3, 11 and 18 ------------------------------------------------------------


def _deep_arpa(n_grams: int, order: int, vocab: int = 50, seed: int = 0) -> str:
    """Unigrams for ``vocab`` words, no n-grams of orders 2 .. order-1, ``n_grams`` of ``order``:
    every one needs ``order - 2`` histories the reader adds."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    grams = set()
    while len(grams) < n_grams:
        grams.add(tuple(rng.choice(words) for _ in range(order)))
    lines = (
        ["\\data\\", f"ngram 1={vocab + 3}"]
        + [f"ngram {n}=0" for n in range(2, order)]
        + [f"ngram {order}={n_grams}", "", "\\1-grams:", "-1 <unk> 0", "-99 <s> 0", "-1 </s> 0"]
    )
    lines += [f"-1.5 {w} -0.1" for w in words]
    for n in range(2, order):
        lines += ["", f"\\{n}-grams:"]
    lines += ["", f"\\{order}-grams:"] + [f"-0.3 {' '.join(g)}" for g in sorted(grams)] + ["", "\\end\\", ""]
    return "\n".join(lines)


def test_the_memory_estimate_bounds_what_reading_allocates():
    # Finding 3: an order-16 file of 16-grams with empty lower orders stored 11-15x more n-grams
    # (the added histories) than the estimate counted. The estimate must bound the real peak.
    import tracemalloc

    from lightning_gtn.lm.arpa import estimate_bytes

    text = _deep_arpa(3000, 8)
    tracemalloc.start()
    lm = read_arpa(io.StringIO(text))
    lm.arrays()  # the decoder's tables count too
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    bound = estimate_bytes([53] + [0] * 6 + [3000])
    assert lm.order == 8
    assert peak <= bound, (peak, bound)
    # refused from the header alone, before the n-grams are read
    stream = io.StringIO(text)
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"ARPA: the header declares 3053 n-grams .* over max_bytes=1000000"):
        read_arpa(stream, max_bytes=1_000_000)
    assert tracemalloc.get_traced_memory()[1] < 100_000  # a few lines read, nothing allocated for the n-grams
    tracemalloc.stop()


@pytest.mark.parametrize(
    "line, match",
    [
        ("-0.5 </s> 1e38", r"line 8: log10 back-off weight '1e38' must be in \[-99, 10\]"),
        ("-0.5 </s> 30", r"back-off weight '30' must be in"),
        ("-1e5 </s>", r"log10 probability '-1e5' must be in \[-99, 0\]"),
    ],
)
def test_insane_log10_values_are_refused_naming_the_line(line, match):
    # Finding 11: a back-off of 1e38 (or 30) was accepted and decoded garbage (CER 528%)
    with pytest.raises(ValueError, match=match):
        read_arpa(io.StringIO(_bad(GOOD_BODY.replace("-0.5 </s>", line))))


@pytest.mark.parametrize(
    "body, header, match",
    [
        (GOOD_BODY.replace("-0.5 </s>", "-0_5 </s>"), "ngram 1=3\nngram 2=1\n", "probability '-0_5' is not a number"),
        (GOOD_BODY, "ngram 1=\u0663\nngram 2=1\n", "header"),
        (GOOD_BODY.replace("-99 <s> 0", "-99 <s> \u0660"), "ngram 1=3\nngram 2=1\n", "is not a number"),
    ],
)
def test_numbers_follow_the_arpa_grammar(body, header, match):
    # Finding 18: '-0_7' read as -7 and 'ngram 1=٥' was accepted
    with pytest.raises(ValueError, match=match):
        read_arpa(io.StringIO(_bad(body, header)))
