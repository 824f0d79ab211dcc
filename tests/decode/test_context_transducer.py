"""Context biasing in the transducer's modified beam search, against exhaustive enumeration."""

from __future__ import annotations

import pytest
import torch

from lightning_gtn.decode.context_graph import ContextGraph
from lightning_gtn.decode.transducer_beam import TokenLM, modified_beam_search, modified_beam_search_nbest

from .test_transducer_beam import TableModel, ToyTransducer, _paths

TOKENS = [None, "a", "b", " "]


def _symbols(g, tokens):
    """The text's words as the graph reads them: boundary, each word's tokens, a boundary."""
    text = "".join(TOKENS[v] for v in tokens)
    out = []
    for w in text.split():
        out += [TOKENS.index(ch) for ch in w] + [g.boundary]
    return out


@pytest.mark.parametrize("seed", range(3))
def test_exhaustive_biased_scores(seed):
    """Every sequence's score is its log-sum over alignments plus the graph's bonus of its text."""
    model = ToyTransducer(V=4, seed=seed)
    enc = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(seed + 10), dtype=torch.float64)
    lengths = torch.tensor([4, 3])
    g = ContextGraph.from_phrases(["ab", "b a", [2, 2]], TOKENS, score=0.8, cap=2.0, skip=[0])
    res = modified_beam_search_nbest(model, enc, lengths, blank=0, beam=10000, nbest=10000, context=g)
    for b in range(2):
        ref = _paths(model, enc[b], int(lengths[b]), 0, 1)
        got = {tuple(h.tokens): h.score for h in res[b]}
        assert set(got) == set(ref)
        for k, v in ref.items():
            assert got[k] == pytest.approx(v + g.total(_symbols(g, k)), abs=1e-9)


def test_boosted_phrase_wins_with_and_without_lm():
    # the acoustic model prefers "a" a little over "b" at each of 3 frames
    enc = torch.tensor([[[-3.0, 1.0, 0.8, -3.0]] * 3], dtype=torch.float64)
    model = TableModel4()
    lengths = torch.tensor([3])
    assert modified_beam_search(model, enc, lengths, blank=0, beam=4) == [[1, 1, 1]]
    g = ContextGraph.from_phrases(["bbb"], TOKENS, score=0.5, skip=[0])
    assert modified_beam_search(model, enc, lengths, blank=0, beam=4, context=g) == [[2, 2, 2]]
    lm = TokenLM.estimate(["aaa", "bbb", "aaa"], TOKENS, order=2)
    fused = modified_beam_search(model, enc, lengths, blank=0, beam=4, lm=lm, lm_weight=0.5)
    assert fused == [[1, 1, 1]]
    both = modified_beam_search(model, enc, lengths, blank=0, beam=4, lm=lm, lm_weight=0.5, context=g)
    assert both == [[2, 2, 2]]


class TableModel4(TableModel):
    def predict(self, tokens, state=None):
        return torch.zeros(*tokens.shape, 4, dtype=torch.float64), None


def test_no_phrases_is_exactly_no_biasing():
    model = ToyTransducer(V=4, seed=3)
    enc = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    lengths = torch.tensor([5, 4])
    base = modified_beam_search_nbest(model, enc, lengths, blank=0, beam=3)
    for g in (ContextGraph([], 4), ContextGraph([[1, 2]], 4, score=0.0)):
        got = modified_beam_search_nbest(model, enc, lengths, blank=0, beam=3, context=g)
        assert [[(h.tokens, h.score) for h in u] for u in got] == [[(h.tokens, h.score) for h in u] for u in base]


def test_bad_context():
    model = ToyTransducer(V=4)
    enc = torch.zeros(1, 2, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="V=4"):
        modified_beam_search(model, enc, [2], blank=0, context=ContextGraph([[1]], 3))
    with pytest.raises(ValueError, match="ContextGraph"):
        modified_beam_search(model, enc, [2], blank=0, context=["ab"])


def test_sparse_graph_searches_as_the_dense_one(monkeypatch):
    import lightning_gtn.decode.context_graph as cg

    model = ToyTransducer(V=4, seed=5)
    enc = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    lengths = torch.tensor([5, 4])
    g = ContextGraph.from_phrases(["ab", "b a"], TOKENS, score=0.8, skip=[0])
    dense = modified_beam_search_nbest(model, enc, lengths, blank=0, beam=3, context=g)
    monkeypatch.setattr(cg, "MAX_DENSE_ENTRIES", 0)
    s = ContextGraph.from_phrases(["ab", "b a"], TOKENS, score=0.8, skip=[0])
    assert s.token_tables(0) is None
    sparse = modified_beam_search_nbest(model, enc, lengths, blank=0, beam=3, context=s)
    assert [[(h.tokens, h.score) for h in u] for u in sparse] == [[(h.tokens, h.score) for h in u] for u in dense]
