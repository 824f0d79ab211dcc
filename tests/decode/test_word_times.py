"""Token frames, confidences and word spans of every decoder, and the writers on them.

References are independent of the code under test: the RNN-T Viterbi aligner
(:func:`rnnt_forced_align`), brute-force enumeration of the alignments of a token sequence in
the beam search's topology, the argmax path computed with ``itertools.groupby``, and CTC forced
alignment of emissions built from a known path."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from lightning_gtn.core.words import length_ranges, separator_ranges, start_ranges
from lightning_gtn.decode import BeamSearchDecoder, greedy_hypotheses
from lightning_gtn.decode.timed import greedy_search_hypotheses
from lightning_gtn.decode.times import frame_token_times, lexicon_ranges
from lightning_gtn.decode.transducer import greedy_search
from lightning_gtn.decode.transducer_beam import modified_beam_search_nbest
from lightning_gtn.functional import forced_align, hypotheses_alignment, rnnt_forced_align, to_ctm, to_json, word_spans


class ToyNet:
    """A transducer network with memory (a code of the label history selects a table row); the
    joiner is ``scale * (tanh(enc + pred) @ W + bias)``: ``scale`` sharpens it, ``bias`` (on
    class 0, the blank) makes blanks more likely."""

    def __init__(self, V=4, J=6, K=97, seed=0, scale=1.0, bias=0.0):
        g = torch.Generator().manual_seed(seed)
        self.V, self.K, self.scale = V, K, scale
        self.bias = torch.zeros(V, dtype=torch.float64)
        self.bias[0] = bias
        self.table = torch.randn(K, J, generator=g, dtype=torch.float64)
        self.W = torch.randn(J, V, generator=g, dtype=torch.float64)

    def predict(self, tokens, state=None):
        code = torch.zeros(tokens.shape[0], dtype=torch.long) if state is None else state.clone()
        out = []
        for s in range(tokens.shape[1]):
            code = (code * 31 + tokens[:, s] + 1) % self.K
            out.append(self.table[code])
        return torch.stack(out, 1), code

    def select_state(self, state, index):
        return state[index]

    def join(self, enc, pred):
        return self.scale * (torch.tanh(enc + pred) @ self.W + self.bias)

    def lattice(self, enc, tokens, blank):
        """``(T, U + 1, V)`` logits of the full lattice of ``tokens``."""
        pred, _ = self.predict(torch.tensor([[blank, *tokens]]))
        return self.join(enc[:, None], pred[0][None])


def _enc(B, T, J=6, seed=1, scale=1.0):
    return scale * torch.randn(B, T, J, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ----------------------------------------------------------------------------- transducer greedy
def test_greedy_frames_equal_the_viterbi_alignment_of_a_confident_network():
    """With a sharp joiner the greedy path is the best lattice path of its own tokens: its
    frames are those of the RNN-T Viterbi aligner."""
    net, blank, checked = ToyNet(scale=10.0, bias=1.5), 0, 0
    enc = _enc(12, 9)
    hyps = greedy_search_hypotheses(net, enc, torch.full((12,), 9), blank=blank, max_symbols_per_frame=10)
    for b, h in enumerate(hyps):
        if not h.tokens or max(np.bincount(h.timesteps)) >= 10:
            continue  # the symbols-per-frame cap changes the topology
        logits = net.lattice(enc[b], h.tokens, blank)[None]
        al = rnnt_forced_align(
            logits, torch.tensor([h.tokens]), torch.tensor([9]), torch.tensor([len(h.tokens)]), blank=blank
        )
        assert al.token_start[0].tolist() == h.timesteps
        assert h.token_ends == [t + 1 for t in h.timesteps]
        checked += 1
    assert checked >= 6


def test_greedy_token_scores_rescore_independently():
    net, blank = ToyNet(scale=3.0), 0
    enc = _enc(3, 7)
    hyps = greedy_search_hypotheses(net, enc, torch.tensor([7, 5, 0]), blank=blank, max_symbols_per_frame=2)
    assert [h.tokens for h in hyps] == greedy_search(
        net, enc, torch.tensor([7, 5, 0]), blank=blank, max_symbols_per_frame=2
    )
    assert hyps[2].tokens == [] and hyps[2].word_spans == [] and hyps[2].num_frames == 0
    for b, h in enumerate(hyps[:2]):
        for i, (tok, t) in enumerate(zip(h.tokens, h.timesteps)):
            pred, _ = net.predict(torch.tensor([[blank, *h.tokens[:i]]]))
            lp = torch.log_softmax(net.join(enc[b, t], pred[0, -1]), -1)
            assert h.token_scores[i] == pytest.approx(float(lp[tok]), abs=1e-9)
            assert h.token_confidences[i] == pytest.approx(math.exp(float(lp[tok])))
            assert int(lp.argmax()) == tok  # greedy: the step's most probable class
        assert h.timesteps == sorted(h.timesteps) and all(0 <= t < h.num_frames for t in h.timesteps)
        assert h.score == pytest.approx(sum(h.token_scores))


class Durations:
    """A TDT joiner read from tables: at frame ``t`` after ``u`` labels the best class is
    ``table[t][u]`` (0 the blank) and the best duration index ``dur[t][u]``."""

    def __init__(self, table, dur, V, D):
        self.table, self.dur, self.V, self.D = table, dur, V, D

    def predict(self, tokens, state=None):
        count = torch.zeros(tokens.shape[0]) if state is None else state.clone()
        out = []
        for s in range(tokens.shape[1]):
            count = count + (tokens[:, s] != 0).float()
            out.append(torch.stack([torch.zeros_like(count), count], -1))
        return torch.stack(out, 1), count

    def select_state(self, state, index):
        return state[index]

    def join(self, enc, pred):
        out = torch.full((enc.shape[0], self.V + self.D), -10.0)
        for i in range(enc.shape[0]):
            t, u = int(enc[i, 0]), int(pred[i, 1])
            out[i, self.table[t][u]] = 0.0
            out[i, self.V + self.dur[t][u]] = 0.0
        return out


def test_tdt_durations_advance_the_frames():
    # durations [0, 1, 2]: frame 0 emits 1 and skips 2 frames; frame 2 emits 3 with duration 0
    # and 2 again with duration 1; frame 3 (after 3 labels) emits the blank (duration index 0,
    # which still moves one frame); frame 4 emits 4 with duration 2, past the end
    table = [[1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 3, 2, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 4, 0]]
    dur = [[2, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [0, 0, 0, 2, 1]]
    net = Durations(table, dur, V=5, D=3)
    enc = torch.zeros(1, 5, 2)
    enc[0, :, 0] = torch.arange(5.0)
    (h,) = greedy_search_hypotheses(net, enc, torch.tensor([5]), blank=0, durations=[0, 1, 2], max_symbols_per_frame=3)
    assert h.tokens == [1, 3, 2, 4]
    assert h.timesteps == [0, 2, 2, 4]
    assert h.durations == [2, 0, 1, 2]
    # each token's frame is the previous token's plus its duration, unless blanks moved on
    for i in range(len(h.tokens) - 1):
        assert h.timesteps[i + 1] >= h.timesteps[i] + h.durations[i]
    assert h.timesteps[1] == h.timesteps[0] + h.durations[0] and h.timesteps[2] == h.timesteps[1] + h.durations[1]
    # a plain RNN-T search has no durations
    (plain,) = greedy_search_hypotheses(net, enc, torch.tensor([5]), blank=0, num_classes=5)
    assert plain.durations is None


# ----------------------------------------------------------------------------- transducer beam
def _best_alignments(net, enc, T, blank, M):
    """{tokens: (best single-alignment log-prob, its token frames, its token log-probs)} in the
    modified beam search's topology (each frame: blank, or up to M tokens, the M-th moving on)."""
    out: dict = {}

    def lp(t, hist):
        pred, _ = net.predict(torch.tensor([[blank, *hist]]))
        return torch.log_softmax(net.join(enc[t], pred[0, -1]), -1)

    def rec(t, hist, frames, lps, score, k):
        if t == T:
            if hist not in out or score > out[hist][0]:
                out[hist] = (score, frames, lps)
            return
        row = lp(t, hist)
        rec(t + 1, hist, frames, lps, score + float(row[blank]), 0)
        for v in range(net.V):
            if v != blank:
                s, nxt = score + float(row[v]), (hist + (v,), frames + (t,), lps + (float(row[v]),))
                if k + 1 < M:
                    rec(t, *nxt, s, k + 1)
                else:
                    rec(t + 1, *nxt, s, 0)

    rec(0, (), (), (), 0.0, 0)
    return out


@pytest.mark.parametrize("M", [1, 2])
def test_exhaustive_beam_frames_are_the_viterbi_alignment(M):
    net, blank, T = ToyNet(V=3, scale=2.0, seed=3), 0, 4
    enc = _enc(1, T, seed=4)
    ref = _best_alignments(net, enc[0], T, blank, M)
    hyps = modified_beam_search_nbest(
        net, enc, torch.tensor([T]), blank=blank, beam=400, max_symbols_per_frame=M, nbest=5
    )[0]
    assert len(hyps) == 5
    for h in hyps:
        _, frames, lps = ref[tuple(h.tokens)]
        assert h.timesteps == list(frames)
        assert h.token_scores == pytest.approx(list(lps), abs=1e-9)
        assert h.num_frames == T and len(h.token_confidences) == len(h.tokens)


def test_beam_one_frames_equal_greedy_frames():
    net, blank = ToyNet(scale=4.0, seed=5), 0
    enc = _enc(3, 8, seed=6)
    n = torch.tensor([8, 6, 3])
    beam = modified_beam_search_nbest(net, enc, n, blank=blank, beam=1, word_separator_id=3)
    greedy = greedy_search_hypotheses(net, enc, n, blank=blank, max_symbols_per_frame=1, word_separator_id=3)
    for (bh,), gh in zip(beam, greedy):
        assert (bh.tokens, bh.timesteps) == (gh.tokens, gh.timesteps)
        assert bh.token_scores == pytest.approx(gh.token_scores)
        assert bh.word_spans == gh.word_spans
        for w in gh.word_spans:
            i0, i1 = w["token_range"]
            assert 3 not in gh.tokens[i0:i1]
            assert w["start"] == gh.timesteps[i0] and w["end"] == gh.timesteps[i1 - 1] + 1
            assert w["confidence"] == pytest.approx(np.mean(gh.token_confidences[i0:i1]))


# ----------------------------------------------------------------------------- CTC
def _runs(x, T, blank):
    """(token, first frame, end frame) of each run of the argmax path (blank runs dropped)."""
    best = x[:T].argmax(-1).tolist()
    out, t = [], 0
    for lab, grp in itertools.groupby(best):
        n = len(list(grp))
        if lab != blank:
            out.append((lab, t, t + n))
        t += n
    return out


def test_ctc_greedy_frames_are_the_argmax_path_runs():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 30, 5, generator=g).mul(3).log_softmax(-1)
    lens = [30, 21, 1, 0]
    hyps = greedy_hypotheses(x, torch.tensor(lens), blank=0)
    for b, h in enumerate(hyps):
        runs = _runs(x[b].numpy(), lens[b], 0)
        assert h.tokens == [r[0] for r in runs]
        assert h.timesteps == [r[1] for r in runs]
        assert h.token_ends == [r[2] for r in runs]
        for (tok, s, e), sc, c in zip(runs, h.token_scores, h.token_confidences):
            assert sc == pytest.approx(float(x[b, s:e, tok].double().sum()), abs=1e-5)
            assert c == pytest.approx(float(x[b, s:e, tok].double().exp().mean()), abs=1e-6)
        assert h.num_frames == lens[b]
        assert h.am_score == pytest.approx(float(x[b, : lens[b]].max(-1).values.double().sum()), abs=1e-4)
    assert hyps[3].tokens == [] and hyps[3].word_spans == []


def _emissions_of(path, C, sharp=8.0, seed=0):
    """Log-probabilities peaked on a known frame path (the rest random)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(path), C, generator=g)
    x[torch.arange(len(path)), torch.tensor(path)] += sharp
    return x.log_softmax(-1)[None]


def test_ctc_beam_and_greedy_frames_equal_the_forced_alignment_on_a_known_path():
    # tokens: 0 blank, 1 a, 2 b, 3 space; "ab ba" on a path with blanks and repeats
    tokens = ["_", "a", "b", " "]
    path = [0, 1, 1, 0, 2, 2, 2, 3, 3, 0, 2, 0, 0, 1, 1, 0]
    x = _emissions_of(path, 4)
    target = [1, 2, 3, 2, 1]
    al = forced_align(x, [target], [len(path)], blank=0)
    ref_words = word_spans(al, [target], word_separator_id=3)[0]
    for hyp in (
        BeamSearchDecoder(tokens, blank=0, beam_size=8).decode(x)[0][0],
        BeamSearchDecoder(tokens, blank=0, lexicon={"ab": [[1, 2]], "ba": [[2, 1]]}).decode(x)[0][0],
        greedy_hypotheses(x, blank=0, tokens=tokens)[0],
    ):
        assert hyp.tokens == target and hyp.words == ["ab", "ba"]
        assert hyp.timesteps == al.token_start[0].tolist()
        assert hyp.token_ends == al.token_end[0].tolist()
        assert hyp.token_confidences == pytest.approx(al.token_confidence[0].tolist(), abs=1e-5)
        assert [(w["start"], w["end"], w["token_range"]) for w in hyp.word_spans] == [
            (w["start"], w["end"], w["token_range"]) for w in ref_words
        ]
        assert [w["confidence"] for w in hyp.word_spans] == pytest.approx(
            [w["confidence"] for w in ref_words], abs=1e-5
        )


def test_asg_repeat_token_scores_its_frame_label():
    # ASG without blank: frames a a r b (r = repeat, id 3): tokens a a b
    path = [1, 1, 3, 2]
    x = _emissions_of(path, 4)
    (h,) = greedy_hypotheses(x, topology="asg", repeat=3)
    assert h.tokens == [1, 1, 2] and h.timesteps == [0, 2, 3] and h.token_ends == [2, 3, 4]
    assert h.token_scores[1] == pytest.approx(float(x[0, 2, 3]))


def test_word_grouping_rules():
    assert separator_ranges([1, 4, 4, 2, 3, 4], 4) == [(0, 1), (3, 5)]
    assert separator_ranges([1, 2], None) == [(0, 1), (1, 2)]
    assert length_ranges([2, 1], 3) == [(0, 2), (2, 3)]
    with pytest.raises(ValueError, match="sum to the target length"):
        length_ranges([2, 2], 3)
    starts = [False, True, False, False]  # token 1 is a piece like "_ab": it begins a word
    assert start_ranges([2, 1, 2, 3, 2, 1], 3, starts) == [(0, 1), (1, 3), (4, 5), (5, 6)]
    # lexicon: word ids on the tokens that end words; token 3 is silence
    assert lexicon_ranges([3, 1, 2, 3, 3, 2, 1, 2], [-1, -1, 5, -1, -1, -1, 6, -1], 3) == [(1, 3), (5, 7), (7, 8)]


def test_frame_times_refuse_frames_outside_the_utterance():
    x = np.zeros((4, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="outside"):
        frame_token_times(x, 2, [1], [3])


# ----------------------------------------------------------------------------- writers
def test_writers_take_hypotheses_of_every_decoder():
    tokens = ["_", "a", "b", " "]
    path = [0, 1, 1, 0, 2, 2, 2, 3, 3, 0, 2, 0, 0, 1, 1, 0]
    x = _emissions_of(path, 4)
    net = ToyNet(V=4, scale=3.0)
    enc = _enc(2, 10)
    results = {
        "ctc_beam": BeamSearchDecoder(tokens, blank=0).decode(x),
        "ctc_greedy": greedy_hypotheses(x, blank=0, tokens=tokens),
        "rnnt_greedy": greedy_search_hypotheses(net, enc, torch.tensor([10, 7]), blank=0, word_separator_id=3),
        "rnnt_beam": modified_beam_search_nbest(net, enc, torch.tensor([10, 7]), blank=0, word_separator_id=3),
    }
    fs = 0.04
    for name, hyps in results.items():
        best = [h[0] if isinstance(h, list) else h for h in hyps]
        recs = json.loads(to_json(hyps, tokens=tokens, frame_shift=fs))
        assert len(recs) == len(best), name
        lines = to_ctm(hyps, tokens=tokens, frame_shift=fs, utterance_ids=[f"u{b}" for b in range(len(best))])
        rows = [ln.split() for ln in lines.splitlines()]
        assert len(rows) == sum(len(h.word_spans) for h in best), name
        k = 0
        for b, (h, rec) in enumerate(zip(best, recs)):
            assert rec["num_frames"] == h.num_frames and rec["score"] == pytest.approx(h.score)
            assert [t["start_frame"] for t in rec["tokens"]] == h.timesteps
            assert [t["confidence"] for t in rec["tokens"]] == pytest.approx(h.token_confidences)
            for w, rw in zip(h.word_spans, rec["words"]):
                utt, ch, start, dur, text, conf = rows[k]
                k += 1
                assert (utt, ch) == (f"u{b}", "1")
                assert float(start) == pytest.approx(w["start"] * fs, abs=5e-4)
                assert float(dur) == pytest.approx((w["end"] - w["start"]) * fs, abs=5e-4) and float(dur) > 0
                assert 0.0 <= float(conf) <= 1.0 and float(conf) == pytest.approx(w["confidence"], abs=5e-5)
                i0, i1 = w["token_range"]
                assert text == "".join(tokens[t] for t in h.tokens[i0:i1]) == rw["text"]
                assert rw["start_time"] == pytest.approx(w["start"] * fs)
    al = hypotheses_alignment(results["rnnt_greedy"])
    h0 = results["rnnt_greedy"][0]
    assert al.token_start[0, : len(h0.tokens)].tolist() == h0.timesteps
    assert al.labels.shape == (2, 10)


def test_writers_refuse_bad_hypotheses():
    (h,) = greedy_hypotheses(_emissions_of([0, 1, 1, 2], 3), blank=0)
    with pytest.raises(ValueError, match="targets: must be None"):
        to_ctm([h], [[1, 2]])
    with pytest.raises(ValueError, match="empty list"):
        to_ctm([[h], []])
    h.token_ends = h.token_ends[:-1]
    with pytest.raises(ValueError, match="differ in length"):
        to_ctm([h])
    al = forced_align(_emissions_of([0, 1, 1, 2], 3), [[1, 2]], [4])
    with pytest.raises(ValueError, match="targets: required"):
        to_ctm(al)
    assert to_ctm([]) == ""


@pytest.mark.parametrize(
    "tokens,kwargs",
    [
        (["_", "a", "b", " "], {}),
        (["_", "a", "b", " "], {"lexicon": {"ab": [[1, 2]], "ba": [[2, 1]], "a": [[1]], "bb": [[2, 2]]}}),
        (["_", "\u2581a", "b", "\u2581b", "a"], {"word_separator": "\u2581"}),
    ],
)
def test_beam_word_spans_follow_the_words(tokens, kwargs):
    """On random emissions every n-best hypothesis has one span per word, whose tokens spell it."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 25, len(tokens), generator=g).mul(2).log_softmax(-1)
    dec = BeamSearchDecoder(tokens, blank=0, beam_size=8, nbest=3, **kwargs)
    sep = kwargs.get("word_separator", " ")
    seen = 0
    for hyps in dec.decode(x, torch.tensor([25, 20, 9, 3])):
        for h in hyps:
            assert len(h.word_spans) == len(h.words)
            for w, word in zip(h.word_spans, h.words):
                i0, i1 = w["token_range"]
                assert "".join(tokens[t] for t in h.tokens[i0:i1]).replace(sep, "") == word
                assert w["start"] == h.timesteps[i0] and w["end"] == h.token_ends[i1 - 1]
                seen += 1
            assert all(s < e <= h.num_frames for s, e in zip(h.timesteps, h.token_ends))
            assert all(e <= s for e, s in zip(h.token_ends, h.timesteps[1:]))  # spans do not overlap
    assert seen >= 8
