"""The decoder with ``lightning_gtn.lm.NGramLM`` (estimated, and read from an ARPA file)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_gtn.decode import BeamSearchDecoder, Lexicon

from ._ref import brute_lexicon, random_emissions

lm_mod = pytest.importorskip("lightning_gtn.lm")

TOK = ["_", "a", "b", " "]
SPELL = {"a": [[1]], "ab": [[1, 2]], "ba": [[2, 1]], "b": [[2]], "bb": [[2, 2]]}
TEXT = ["a b", "ab ba", "ba a b", "b b ab", "a ab ba", "bb a"]


@pytest.mark.parametrize("method", ["kneser_ney", "witten_bell"])
def test_trigram_matches_brute_force(method):
    lm = lm_mod.estimate(TEXT, order=3, method=method, vocab=["a", "ab", "ba", "b"])  # "bb" is <unk>
    rng = np.random.default_rng(7)
    em = random_emissions(rng, 5, 4)
    kw = dict(lm_weight=0.8, word_score=0.5)
    dec = BeamSearchDecoder(
        TOK, blank=0, lexicon=SPELL, lm=lm, unk_score=-2.0, nbest=3, beam_size=100000, beam_threshold=math.inf, **kw
    )
    hyps = dec.decode(em[None])[0]
    ref = brute_lexicon(em, "ctc", 0, None, 3, SPELL, lm=lm, hotwords={"bb": -2.0}, **kw)
    want = sorted(ref.items(), key=lambda kv: -kv[1])[:3]
    assert [tuple(h.words) for h in hyps] == [w for w, _ in want]
    assert [h.score for h in hyps] == pytest.approx([s for _, s in want], abs=1e-4)
    for h in hyps:
        assert h.lm_score == pytest.approx(lm.sentence_score(h.words), abs=1e-4)


ARPA = """
\\data\\
ngram 1=6
ngram 2=4

\\1-grams:
-1.0\t</s>
-99\t<s>\t-0.5
-2.0\t<unk>
-0.6\tab\t-0.3
-0.8\tba\t-0.2
-0.9\ta\t-0.1

\\2-grams:
-0.2\t<s> ab
-0.3\tab ba
-0.1\tba </s>
-0.4\ta ab

\\end\\
"""


def test_arpa_lm_scores_equal_kenlm(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(ARPA.lstrip())
    lm = lm_mod.NGramLM.from_arpa(str(path))
    lex = Lexicon({"a": [[1]], "ab": [[1, 2]], "ba": [[2, 1]]})
    rng = np.random.default_rng(3)
    x = np.stack([random_emissions(rng, 12, 4) for _ in range(4)])
    dec = BeamSearchDecoder(TOK, blank=0, lexicon=lex, lm=lm, lm_weight=1.0, nbest=5, beam_size=64)
    out = dec.decode(x)
    assert all(out)
    for hyps in out:
        for h in hyps:
            assert h.lm_score == pytest.approx(lm.sentence_score(h.words), abs=1e-4)
    kenlm = pytest.importorskip("kenlm")  # an independent ARPA reader (install outside the venv)
    model = kenlm.Model(str(path))
    for hyps in out:
        for h in hyps:
            want = model.score(" ".join(h.words), bos=True, eos=True) * math.log(10)
            assert h.lm_score == pytest.approx(want, abs=1e-4)
