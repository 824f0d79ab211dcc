"""Modified beam search for RNN-T networks against exhaustive path enumeration on a toy network."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_gtn.decode.transducer_beam import TokenLM, modified_beam_search, modified_beam_search_nbest


class ToyTransducer:
    """A deterministic transducer network with memory: the prediction network's state is a code of
    the whole label history, its output a row of a fixed table; the joiner is linear in
    ``enc + pred``. Implements the protocol of :mod:`lightning_gtn.nn.rnnt`."""

    def __init__(self, V: int = 3, J: int = 5, K: int = 97, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.V, self.K = V, K
        self.table = torch.randn(K, J, generator=g, dtype=torch.float64)
        self.W = 2.0 * torch.randn(J, V, generator=g, dtype=torch.float64)

    def predict(self, tokens, state=None):
        N, S = tokens.shape
        code = torch.zeros(N, dtype=torch.long) if state is None else state.clone()
        out = []
        for s in range(S):
            code = (code * 31 + tokens[:, s] + 1) % self.K
            out.append(self.table[code])
        return torch.stack(out, 1), code

    def select_state(self, state, index):
        return state[index]

    def join(self, enc, pred):
        return (enc + pred) @ self.W

    # the reference: log-probabilities after a label history (blank first) at a frame
    def logp(self, enc_t, history, blank):
        pred, _ = self.predict(torch.tensor([[blank, *history]]))
        return torch.log_softmax(self.join(enc_t, pred[0, -1]), -1)


def _logadd(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def _paths(model, enc, T, blank, M):
    """{tokens: log-sum over the alignments of the M-symbols-per-frame topology}."""
    V = model.V
    out: dict[tuple, float] = {}

    def rec(t, hist, score):
        if t == T:
            out[hist] = _logadd(out.get(hist, -math.inf), score)
            return
        step(t, hist, score, 0)

    def step(t, hist, score, emitted):
        lp = model.logp(enc[t], hist, blank)
        rec(t + 1, hist, score + float(lp[blank]))
        for v in range(V):
            if v == blank:
                continue
            if emitted + 1 < M:
                step(t, hist + (v,), score + float(lp[v]), emitted + 1)
            else:
                rec(t + 1, hist + (v,), score + float(lp[v]))

    rec(0, (), 0.0)
    return out


def _greedy(model, enc, T, blank):
    hist: tuple = ()
    for t in range(T):
        v = int(model.logp(enc[t], hist, blank).argmax())
        if v != blank:
            hist += (v,)
    return list(hist)


@pytest.mark.parametrize("M,blank", [(1, 0), (2, 2)])
def test_exhaustive_beam_equals_enumeration(M, blank):
    model = ToyTransducer(V=3)
    g = torch.Generator().manual_seed(1)
    enc = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 3]) if M == 1 else torch.tensor([3, 2])  # M = 2: 7 choices a frame
    res = modified_beam_search_nbest(model, enc, lengths, blank=blank, beam=10000, nbest=10000, max_symbols_per_frame=M)
    for b in range(2):
        ref = _paths(model, enc[b], int(lengths[b]), blank, M)
        got = {tuple(h.tokens): h.score for h in res[b]}
        assert set(got) == set(ref)
        for k, v in ref.items():
            assert got[k] == pytest.approx(v, abs=1e-9)
        assert res[b][0].tokens == list(max(ref, key=ref.get))
    best = modified_beam_search(model, enc, lengths, blank=blank, beam=10000, max_symbols_per_frame=M)
    assert best == [res[0][0].tokens, res[1][0].tokens]


def test_beam_one_is_greedy_and_wide_beam_finds_the_best():
    model = ToyTransducer(V=4, seed=2)
    g = torch.Generator().manual_seed(5)
    enc = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 0])
    got = modified_beam_search(model, enc, lengths, blank=0, beam=1)
    assert got == [_greedy(model, enc[b], int(lengths[b]), 0) for b in range(3)]
    assert got[2] == []
    # greedy misses the best sequence of example 0 (seed 2 is such a case); a wide beam finds it
    wide = modified_beam_search(model, enc, lengths, blank=0, beam=2000)
    for b in range(3):
        ref = _paths(model, enc[b], int(lengths[b]), 0, 1)
        assert tuple(wide[b]) == max(ref, key=ref.get)
    assert wide[0] != got[0]


def test_small_beam_is_close_to_the_best():
    """Beam 4 on the toy network: its best score never exceeds the exhaustive one (the beam keeps a
    subset of each sequence's alignments) and the tokens are a hypothesis of the enumeration."""
    model = ToyTransducer(V=3, seed=7)
    enc = torch.randn(1, 5, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref = _paths(model, enc[0], 5, 0, 1)
    h = modified_beam_search_nbest(model, enc, [5], blank=0, beam=4)[0]
    assert len(h) <= 4
    for x in h:
        assert x.score <= ref[tuple(x.tokens)] + 1e-9


class TableModel:
    """A memoryless joiner: the encoder frame is the logits (pred is zero)."""

    def predict(self, tokens, state=None):
        return torch.zeros(*tokens.shape, 3, dtype=torch.float64), None

    def select_state(self, state, index):
        return None

    def join(self, enc, pred):
        return enc + pred


def test_lm_fusion_changes_the_result_and_scores_add_up():
    tokens = [None, "a", "b"]
    lm = TokenLM.estimate(["bbb", "bb b", "bbbb"], tokens, order=2)
    # the acoustic model prefers "a" over "b" slightly at each frame, the blank much less
    enc = torch.tensor([[[-3.0, 1.0, 0.8]] * 3], dtype=torch.float64)
    lengths = torch.tensor([3])
    model = TableModel()
    assert modified_beam_search(model, enc, lengths, blank=0, beam=4) == [[1, 1, 1]]
    fused = modified_beam_search(model, enc, lengths, blank=0, beam=4, lm=lm, lm_weight=1.0)
    assert fused == [[2, 2, 2]]
    # exhaustive: every score is log P_am + w * log P_lm (with </s>) + bonus * length
    w, bonus = 0.7, 0.3
    res = modified_beam_search_nbest(
        model, enc, lengths, blank=0, beam=1000, nbest=1000, lm=lm, lm_weight=w, length_bonus=bonus
    )[0]
    lp = torch.log_softmax(enc[0, 0], -1)
    for h in res:
        n = len(h.tokens)
        am = math.log(math.comb(3, n)) + sum(float(lp[v]) for v in h.tokens) + (3 - n) * float(lp[0])
        words = ["a" if v == 1 else "b" for v in h.tokens]
        lm_ref = lm.lm.sentence_score(words)
        assert h.lm_score == pytest.approx(lm_ref, abs=1e-5)
        assert h.score == pytest.approx(am + w * lm_ref + bonus * n, abs=1e-5)


def test_generic_lm_protocol_matches_token_lm():
    tokens = [None, "a", "b"]
    tlm = TokenLM.estimate(["ab ab", "abb"], tokens, order=3)

    class Plain:  # the protocol only: start_state and score over token ids
        def start_state(self):
            return tlm.start_state()

        def score(self, state, token):
            return tlm.score(state, token)

    enc = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    kw = dict(blank=0, beam=3, lm_weight=0.5, nbest=1000)
    a = modified_beam_search_nbest(TableModel(), enc, [4, 3], lm=tlm, **kw)
    b = modified_beam_search_nbest(TableModel(), enc, [4, 3], lm=Plain(), **kw)
    for x, y in zip(a, b):
        # the plain object has no final_score: the same search, only the </s> term is missing
        bx = {tuple(h.tokens): h for h in y}
        assert {tuple(h.tokens) for h in x} == set(bx)
        for h in x:
            words = ["a" if v == 1 else "b" for v in h.tokens]
            assert h.lm_score == pytest.approx(tlm.lm.sentence_score(words), abs=1e-5)
            assert bx[tuple(h.tokens)].lm_score == pytest.approx(tlm.lm.sentence_score(words, eos=False), abs=1e-5)
            diff = h.score - bx[tuple(h.tokens)].score
            assert diff == pytest.approx(0.5 * (h.lm_score - bx[tuple(h.tokens)].lm_score), abs=1e-9)
    # token texts: spaces become the LM's space word, unknown texts <unk>
    assert TokenLM(tlm.lm, [None, " ", "zz"]).word_of(" ") == "|"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(encoder_out=torch.zeros(2, 3)), "encoder_out"),
        (dict(encoder_lengths=torch.tensor([4, 1])), "encoder_lengths"),
        (dict(encoder_lengths=torch.tensor([1.0, 1.0])), "encoder_lengths"),
        (dict(encoder_lengths=torch.tensor([1])), "encoder_lengths"),
        (dict(blank=3), "blank"),
        (dict(blank=-1), "blank"),
        (dict(beam=0), "beam"),
        (dict(max_symbols_per_frame=0), "max_symbols_per_frame"),
        (dict(lm_weight=float("nan")), "lm_weight"),
        (dict(lm=object(), lm_weight=1.0), "lm"),
        (dict(lm=TokenLM.estimate(["ab"], [None, "a", "b"]).lm, lm_weight=1.0), "TokenLM"),
        (dict(lm=TokenLM.estimate(["ab"], [None, "a"]), lm_weight=1.0), "tokens"),
        (dict(model=object()), "model"),
    ],
)
def test_bad_inputs(kwargs, match):
    args = dict(model=TableModel(), encoder_out=torch.zeros(2, 3, 3), encoder_lengths=torch.tensor([3, 1]), blank=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        modified_beam_search_nbest(**args)


def test_nan_logits_are_an_error():
    enc = torch.zeros(1, 2, 3)
    enc[0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        modified_beam_search(TableModel(), enc, [2], blank=0)


@pytest.mark.parametrize("predictor,M", [("stateless", 1), ("lstm", 2)])
def test_beam_one_equals_greedy_search_on_the_transducer_model(predictor, M):
    """The real network (batched states read with select_state): beam 1 is the greedy search."""
    from lightning_gtn.decode.transducer import greedy_search
    from lightning_gtn.lightning import TransducerModel

    torch.manual_seed(0)
    net = TransducerModel(
        feature_dim=4, num_classes=6, conv_channels=8, hidden_size=8, predictor=predictor, predictor_dim=8, joiner_dim=8
    ).eval()
    with torch.no_grad():
        net.joiner.weight.mul_(4)  # confident enough to emit several tokens
        enc, n = net.encode(torch.randn(3, 24, 4), torch.tensor([24, 17, 6]))
    got = modified_beam_search(net, enc, n, blank=0, beam=1, max_symbols_per_frame=M)
    assert got == greedy_search(net, enc, n, blank=0, max_symbols_per_frame=M)
    assert any(len(g) > 1 for g in got)
    wide = modified_beam_search_nbest(net, enc, n, blank=0, beam=6, max_symbols_per_frame=M)
    assert all(len(w) >= 1 for w in wide)


def test_decoder_configs_build_the_search_and_its_token_lm(tmp_path):
    from omegaconf import OmegaConf

    from lightning_gtn.lightning import TransducerModel, Vocabulary
    from lightning_gtn.lightning.decoding import build_decoder, lm_from_data, resolve_decoder
    from lightning_gtn.nn.rnnt import RNNTStructuredLoss
    from lightning_gtn.train import CONF_DIR

    class Declared(RNNTStructuredLoss):  # only the declared convention is read
        blank = 0

    vocab = Vocabulary("0123 ", blank=True)
    cfg = resolve_decoder(
        OmegaConf.load(CONF_DIR / "decoder" / "rnnt_beam_lm.yaml"), lambda: ["12 3", "1 23"], tmp_path
    )
    assert (tmp_path / "lm.arpa").is_file() and cfg["lm"]["format"] == "lightning_gtn.arpa/1"
    assert "|" in lm_from_data(cfg["lm"]).words  # the space of the character LM
    dec = build_decoder(cfg, Declared(), vocab)
    assert isinstance(dec.lm, TokenLM) and dec.lm.tokens == [None, "0", "1", "2", "3", " "]
    torch.manual_seed(1)
    net = TransducerModel(feature_dim=4, num_classes=6, conv_channels=8, hidden_size=8, predictor_dim=8, joiner_dim=8)
    net.eval()
    with torch.no_grad():
        enc, n = net.encode(torch.randn(2, 12, 4), torch.tensor([12, 7]))
        got = dec.decode(net, enc, n, Declared(), vocab.num_classes)
    want = modified_beam_search(net, enc, n, blank=0, beam=cfg["beam_size"], lm=dec.lm, lm_weight=cfg["lm_weight"])
    assert got == want
    plain = build_decoder(OmegaConf.load(CONF_DIR / "decoder" / "rnnt_beam.yaml"), Declared(), vocab)
    assert plain.lm is None and plain.name == "rnnt_beam" and plain.max_symbols_per_frame == 1

    from lightning_gtn.nn import TDTLoss

    # a loss that declares no modified beam search (its decoding().beam says why) is refused
    with pytest.raises(ValueError, match="decoder=greedy"):
        build_decoder(
            OmegaConf.load(CONF_DIR / "decoder" / "rnnt_beam.yaml"), TDTLoss(blank=0, durations=[0, 1, 2]), vocab
        )


class ListStateToy(ToyTransducer):
    """The same network with its state as a Python list (not concatenable: one object per call)."""

    def predict(self, tokens, state=None):
        pred, code = super().predict(tokens, None if state is None else torch.tensor(state))
        return pred, code.tolist()

    def select_state(self, state, index):
        return [state[i] for i in index.tolist()]


def test_states_that_do_not_concatenate_give_the_same_search():
    enc = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    lengths = torch.tensor([6, 4, 5])
    kw = dict(blank=0, beam=3, nbest=3, max_symbols_per_frame=2)
    a = modified_beam_search_nbest(ToyTransducer(V=4, seed=5), enc, lengths, **kw)
    b = modified_beam_search_nbest(ListStateToy(V=4, seed=5), enc, lengths, **kw)
    assert [[(h.tokens, round(h.score, 9)) for h in x] for x in a] == [
        [(h.tokens, round(h.score, 9)) for h in x] for x in b
    ]


_HOSTILE = r"""
import resource, sys, torch
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from lightning_gtn.decode.transducer import greedy_search
from lightning_gtn.decode.transducer_beam import modified_beam_search
from lightning_gtn.lightning import TransducerModel
small = dict(feature_dim=4, num_classes=5, hidden_size=8, conv_channels=8, joiner_dim=8, predictor_dim=8)
model = TransducerModel(**small).eval()
enc, lengths = model.encode(torch.randn(2, 24, 4), torch.full((2,), 24))
cases = {
    "beam": lambda: modified_beam_search(model, enc, lengths, blank=0, beam=10**9),
    "symbols": lambda: greedy_search(model, enc, lengths, blank=0, max_symbols_per_frame=10**9),
    "beam_symbols": lambda: modified_beam_search(model, enc, lengths, blank=0, max_symbols_per_frame=10**9),
    "context": lambda: TransducerModel(**{**small, "context_size": 10**9}),
    "joiner": lambda: TransducerModel(**{**small, "joiner_dim": 10**9}),
}
for name, call in cases.items():
    try:
        call()
        print(name, "accepted")
    except ValueError as e:
        print(name, "refused", str(e).replace("\\n", " "))
"""


def test_sizes_from_a_config_are_bounded_before_anything_is_allocated():
    """A beam, a per-frame symbol count or a model size from a config or checkpoint cannot make the
    process allocate without bound: each is refused with a ValueError naming it (in a child process
    whose address space is capped, so a regression fails instead of exhausting the machine)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", _HOSTILE], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert set(lines) == {"beam", "symbols", "beam_symbols", "context", "joiner"}
    for name, msg in lines.items():
        assert msg.startswith("refused"), (name, msg)
    assert "beam must be an integer in [1, 65536]" in lines["beam"]
    assert "max_symbols_per_frame" in lines["symbols"] and "max_symbols_per_frame" in lines["beam_symbols"]
    assert "model.context_size" in lines["context"] and "model.joiner_dim" in lines["joiner"]
