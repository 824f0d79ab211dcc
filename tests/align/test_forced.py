"""forced_align against brute force and the engine, spans, stars, words and outputs."""

import itertools
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.align.forced import align_graph
from lightning_gtn.functional import collapse, forced_align, plot_alignment, to_ctm, to_json, to_records, word_spans
from tests.losses._brute import asg_path_score, ctc_paths, segmentations

IMPLS = ["numba", "torch"]
STAR = -1  # the brute force's symbol for a star frame


def _lp(B, T, C, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, C, generator=g, dtype=dtype).mul(2).log_softmax(-1)


def _path_score(x, path, star=None, blank=None, tr=None):
    """Score of a frame path; STAR frames score the best non-blank label plus ``star``."""
    s = 0.0
    for t, lab in enumerate(path):
        if lab == STAR:
            row = x[t].clone()
            if blank is not None:
                row[blank] = -math.inf
            s += float(row.max()) + star
        else:
            s += float(x[t, lab])
    if tr is not None:
        s += float(asg_path_score(torch.zeros_like(x), tr, list(path)))
    return s


def _engine_viterbi(x, graph, path=False):
    """viterbi_score (and the viterbi_path labels) of intersect(linear_graph(T, C), graph),
    written the GTN way."""
    T, C = x.shape
    em = gtn.linear_graph(T, C)
    em.set_weights(x.reshape(-1).tolist())
    ali = gtn.intersect(em, graph)
    score = gtn.viterbi_score(ali).item()
    return (score, gtn.viterbi_path(ali).labels_to_list()) if path else score


def _frame_sum(x, al, b, star=None, tr=None):
    n = int(al.input_lengths[b])
    lab = al.labels[b, :n].tolist()
    s = sum(float(x[b, t, lab[t]]) for t in range(n))
    if star is not None:
        s += star * int(al.star_frames[b].sum())
    if tr is not None:
        s += float(asg_path_score(torch.zeros(n, x.shape[2], dtype=x.dtype), tr, lab))
    return s


def _check_spans(al, b, target):
    """Token spans are ordered, non-empty, disjoint, and the frames inside carry the token."""
    n = int(al.input_lengths[b])
    st, en = al.token_start[b].tolist(), al.token_end[b].tolist()
    lab = al.labels[b].tolist()
    prev_end = 0
    for i, y in enumerate(target):
        assert prev_end <= st[i] < en[i] <= n
        assert all(lab[t] == y for t in range(st[i], en[i]))
        prev_end = en[i]
    assert all(v == -1 for v in st[len(target) :]) and all(v == -1 for v in en[len(target) :])
    assert all(v == -1 for v in lab[n:])


@pytest.mark.parametrize("impl", IMPLS)
def test_ctc_alignment_is_the_brute_force_best_path(impl):
    C, blank = 4, 0
    cases = [([1, 2], 5), ([1, 1], 5), ([3], 4), ([2, 3, 2], 6), ([], 3), ([1, 2, 1], 4)]
    B, T = len(cases), max(t for _, t in cases)
    x = _lp(B, T, C, seed=1)
    targets = [c[0] for c in cases]
    lengths = torch.tensor([c[1] for c in cases])
    al = forced_align(x, targets, lengths, blank=blank, impl=impl)
    for b, (y, n) in enumerate(cases):
        best = max(_path_score(x[b], p) for p in ctc_paths(y, n, blank))
        assert float(al.score[b]) == pytest.approx(best, abs=1e-9)
        ref_score, ref_path = _engine_viterbi(x[b, :n], gtn.criterion.ctc_graph(y, blank), path=True)
        assert float(al.score[b]) == pytest.approx(ref_score, abs=1e-5)
        path = al.labels[b, :n].tolist()
        assert path == ref_path
        assert collapse(path, blank) == y
        assert _frame_sum(x, al, b) == pytest.approx(float(al.score[b]), abs=1e-9)
        _check_spans(al, b, y)
        # token scores and confidences are the frames' log-probs summed and probs averaged
        for i in range(len(y)):
            fr = x[b, int(al.token_start[b, i]) : int(al.token_end[b, i]), y[i]]
            assert float(al.token_score[b, i]) == pytest.approx(float(fr.sum()), abs=1e-9)
            assert float(al.token_confidence[b, i]) == pytest.approx(float(fr.exp().mean()), abs=1e-9)
            assert 0 < float(al.token_confidence[b, i]) <= 1


@pytest.mark.parametrize("impl", IMPLS)
def test_no_blank_alignment_is_the_best_segmentation(impl):
    C = 3
    cases = [([0, 1], 5), ([2, 2], 4), ([1, 0, 2], 6), ([1], 1), ([0, 1, 0, 1], 5)]
    B, T = len(cases), 6
    x = _lp(B, T, C, seed=2)
    al = forced_align(x, [c[0] for c in cases], [c[1] for c in cases], blank=None, impl=impl)
    for b, (y, n) in enumerate(cases):
        best = max(_path_score(x[b], p) for p in segmentations(y, n))
        assert float(al.score[b]) == pytest.approx(best, abs=1e-9)
        from lightning_gtn.functional import force_align_graph

        assert float(al.score[b]) == pytest.approx(_engine_viterbi(x[b, :n], force_align_graph(y)), abs=1e-5)
        assert _frame_sum(x, al, b) == pytest.approx(best, abs=1e-9)
        _check_spans(al, b, y)


@pytest.mark.parametrize("impl", IMPLS)
def test_no_blank_with_transitions_includes_them(impl):
    C = 3
    g = torch.Generator().manual_seed(3)
    tr = torch.randn(C + 1, C, generator=g, dtype=torch.float64)
    cases = [([0, 1], 5), ([2, 2, 1], 5), ([1, 0, 2], 6)]
    x = _lp(3, 6, C, seed=4)
    al = forced_align(x, [c[0] for c in cases], [c[1] for c in cases], blank=None, transitions=tr, impl=impl)
    plain = forced_align(x, [c[0] for c in cases], [c[1] for c in cases], blank=None, impl=impl)
    for b, (y, n) in enumerate(cases):
        best = max(_path_score(x[b], p, tr=tr) for p in segmentations(y, n))
        assert float(al.score[b]) == pytest.approx(best, abs=1e-9)
        assert _frame_sum(x, al, b, tr=tr) == pytest.approx(best, abs=1e-9)
        _check_spans(al, b, y)
        assert float(al.score[b]) != pytest.approx(float(plain.score[b]))


def _star_paths(y, T, blank):
    """Frame paths over the target's labels, the blank and STAR that the star graph accepts:
    collapse (STAR a label of its own), then drop the stars; targets without equal neighbours
    when blank is None."""
    symbols = sorted(set(y) | ({blank} if blank is not None else set())) + [STAR]
    for p in itertools.product(symbols, repeat=T):
        out, prev = [], None
        for lab in p:
            if lab != prev and lab != blank:
                out.append(lab)
            prev = lab
        if [v for v in out if v != STAR] == list(y):
            yield p


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("blank", [0, None])
def test_star_alignment_is_the_brute_force_best_path(impl, blank):
    C, star = 4, -0.7
    cases = [([1, 2], 5), ([3], 4), ([], 3), ([2, 1, 3], 5)] + ([([1, 1], 5)] if blank == 0 else [])
    x = _lp(len(cases), 5, C, seed=5)
    al = forced_align(x, [c[0] for c in cases], [c[1] for c in cases], blank=blank, star=star, impl=impl)
    for b, (y, n) in enumerate(cases):
        best = max(_path_score(x[b], p, star=star, blank=blank) for p in _star_paths(y, n, blank))
        assert float(al.score[b]) == pytest.approx(best, abs=1e-9)
        assert _frame_sum(x, al, b, star=star) == pytest.approx(best, abs=1e-9)
        # the engine, on the emissions with the star column appended
        row = x[b, :n].clone()
        if blank is not None:
            row[:, blank] = -math.inf
        aug = torch.cat([x[b, :n], row.max(-1).values.unsqueeze(-1) + star], -1)
        assert float(al.score[b]) == pytest.approx(_engine_viterbi(aug, align_graph(y, blank, C)), abs=1e-5)
        sf = al.star_frames[b].tolist()
        lab = al.labels[b].tolist()
        assert collapse([v for v, s in zip(lab[:n], sf) if not s], blank) == y
        assert not any(sf[n:])


@pytest.mark.parametrize("impl", IMPLS)
def test_star_absorbs_a_missing_token(impl):
    # the audio says 1 2 3 (8 frames each, blanks between); the transcript misses the 2
    C, T = 5, 30
    x = torch.full((1, T, C), -6.0)
    for t in range(T):
        x[0, t, 0] = -0.05
    for lab, (s, e) in ((1, (2, 10)), (2, (11, 19)), (3, (20, 28))):
        x[0, s:e, :] = -6.0
        x[0, s:e, lab] = -0.05
    x = x.log_softmax(-1)
    plain = forced_align(x, [[1, 3]], [T], impl=impl)
    al = forced_align(x, [[1, 3]], [T], star=math.log(0.5), impl=impl)
    assert float(al.score[0]) > float(plain.score[0])
    sf = al.star_frames[0]
    assert bool(sf[11:19].all()) and int(sf.sum()) == 8
    assert al.labels[0, 11:19].tolist() == [2] * 8  # the star took the missing token's label
    assert al.token_start[0].tolist() == [2, 20] and al.token_end[0].tolist() == [10, 28]
    # a harsh penalty makes the star not worth it
    harsh = forced_align(x, [[1, 3]], [T], star=-50.0, impl=impl)
    assert not bool(harsh.star_frames.any()) and torch.equal(harsh.labels, plain.labels)


@pytest.mark.parametrize("impl", IMPLS)
def test_infeasible_targets_give_minus_inf_and_no_spans(impl):
    x = _lp(3, 6, 4, seed=6)
    targets = [[1, 2, 3], [1, 1, 1], [1, 2, 3, 1, 2, 3, 1]]  # 3 fit in 2 frames? no; 1 1 1 needs 5
    al = forced_align(x, targets, [2, 4, 6], impl=impl)
    assert torch.isinf(al.score).all() and (al.score < 0).all()
    assert (al.labels == -1).all() and (al.token_start == -1).all() and (al.token_end == -1).all()
    assert (al.token_score == 0).all() and (al.token_confidence == 0).all()
    assert word_spans(al, targets) == [[], [], []]
    # a feasible neighbour in the same batch is unaffected
    al2 = forced_align(x[:2], [[1, 2, 3], [1, 2]], [2, 6], impl=impl)
    assert math.isinf(float(al2.score[0])) and math.isfinite(float(al2.score[1]))
    # -inf emissions that leave no path: -inf, no crash
    y = x.clone()
    y[0, :, 1] = -math.inf
    al3 = forced_align(y[:2], [[1], [2]], [6, 6], impl=impl)
    assert math.isinf(float(al3.score[0])) and (al3.labels[0] == -1).all()


@pytest.mark.parametrize("blank,star", [(0, None), (None, None), (0, -1.0), (None, -2.0)])
def test_batched_equals_one_by_one_and_impls_agree(blank, star):
    g = torch.Generator().manual_seed(7)
    B, T, C = 6, 40, 7
    x = torch.randn(B, T, C, generator=g).log_softmax(-1)
    lengths = torch.randint(10, T + 1, (B,), generator=g)
    lo = 0 if blank is None else 1
    targets = [
        torch.randint(lo, C, (int(torch.randint(0, 8, (1,), generator=g)),), generator=g).tolist() for _ in range(B)
    ]
    al = forced_align(x, targets, lengths, blank=blank, star=star)
    al_t = forced_align(x, targets, lengths, blank=blank, star=star, impl="torch")
    assert torch.equal(al.labels, al_t.labels) and torch.allclose(al.score, al_t.score)
    for b in range(B):
        one = forced_align(x[b : b + 1, : int(lengths[b])], [targets[b]], lengths[b : b + 1], blank=blank, star=star)
        n, L = int(lengths[b]), len(targets[b])
        assert torch.equal(one.labels[0], al.labels[b, :n])
        assert torch.equal(one.token_start[0], al.token_start[b, :L])
        assert torch.equal(one.token_end[0], al.token_end[b, :L])
        assert torch.allclose(one.token_score[0], al.token_score[b, :L])
        assert float(one.score[0]) == pytest.approx(float(al.score[b]), rel=1e-5)
    # padded tensor targets and concatenated 1-D targets give the same result
    S = max(len(t) for t in targets)
    padded = torch.zeros(B, S, dtype=torch.long)
    for b, t in enumerate(targets):
        padded[b, : len(t)] = torch.tensor(t, dtype=torch.long)
    tl = torch.tensor([len(t) for t in targets])
    for tg in (padded, torch.cat([torch.tensor(t, dtype=torch.long) for t in targets])):
        al_p = forced_align(x, tg, lengths, tl, blank=blank, star=star)
        assert torch.equal(al_p.labels, al.labels) and torch.equal(al_p.token_end, al.token_end)


def test_dtypes_and_half_precision():
    x = _lp(2, 12, 5, seed=8, dtype=torch.float32)
    al32 = forced_align(x, [[1, 2], [3]], [12, 9])
    assert al32.score.dtype == torch.float32 and al32.labels.dtype == torch.int64
    alh = forced_align(x.half(), [[1, 2], [3]], [12, 9])
    assert alh.score.dtype == torch.float32
    assert torch.allclose(alh.score, forced_align(x.half().float(), [[1, 2], [3]], [12, 9]).score)


def test_errors_name_the_argument():
    x = _lp(2, 6, 4, seed=9)
    with pytest.raises(ValueError, match="emissions"):
        forced_align(x[0], [[1]], [6])
    with pytest.raises(ValueError, match="input_lengths"):
        forced_align(x, [[1], [2]], [7, 6])
    with pytest.raises(ValueError, match="input_lengths"):
        forced_align(x, [[1], [2]], [6.5, 6])
    with pytest.raises(ValueError, match="targets"):
        forced_align(x, [[1], [4]], [6, 6])
    with pytest.raises(ValueError, match="blank"):
        forced_align(x, [[1], [0]], [6, 6])
    with pytest.raises(ValueError, match="blank"):
        forced_align(x, [[1], [2]], [6, 6], blank=4)
    with pytest.raises(ValueError, match="star"):
        forced_align(x, [[1], [2]], [6, 6], star=float("nan"))
    with pytest.raises(ValueError, match="star"):
        forced_align(x, [[1], [2]], [6, 6], star=True)
    with pytest.raises(ValueError, match="transitions"):
        forced_align(x, [[1], [2]], [6, 6], transitions=torch.zeros(5, 4))
    with pytest.raises(ValueError, match="transitions"):
        forced_align(x, [[1], [2]], [6, 6], blank=None, transitions=torch.zeros(4, 4))
    with pytest.raises(ValueError, match="impl"):
        forced_align(x, [[1], [2]], [6, 6], impl="gtn")
    with pytest.raises(ValueError, match="NaN"):
        forced_align(x.clone().fill_(float("nan")), [[1], [2]], [6, 6])
    with pytest.raises(ValueError, match="target_lengths"):
        forced_align(x, torch.tensor([[1], [2]]), [6, 6])


def test_word_spans_by_separator_and_lexicon():
    x = _lp(1, 30, 6, seed=10)
    y = [1, 2, 5, 3, 5, 5, 4]
    al = forced_align(x, [y], [30])
    words = word_spans(al, [y], word_separator_id=5)[0]
    assert [w["token_range"] for w in words] == [(0, 2), (3, 4), (6, 7)]
    st, en = al.token_start[0].tolist(), al.token_end[0].tolist()
    for i, w in enumerate(words):
        i0, i1 = w["token_range"]
        assert w["word_index"] == i and w["start"] == st[i0] and w["end"] == en[i1 - 1]
        assert w["score"] == pytest.approx(float(al.token_score[0, i0:i1].sum()))
        frames = [en[k] - st[k] for k in range(i0, i1)]
        conf = sum(float(al.token_confidence[0, k]) * f for k, f in zip(range(i0, i1), frames)) / sum(frames)
        assert w["confidence"] == pytest.approx(conf)
    lex = word_spans(al, [y], word_lengths=[[3, 4]])[0]
    assert [w["token_range"] for w in lex] == [(0, 3), (3, 7)]
    assert [w["token_range"] for w in word_spans(al, [y])[0]] == [(i, i + 1) for i in range(7)]
    with pytest.raises(ValueError, match="word_lengths"):
        word_spans(al, [y], word_lengths=[[3, 3]])
    with pytest.raises(ValueError, match="not both"):
        word_spans(al, [y], word_separator_id=5, word_lengths=[[7]])


def test_json_and_ctm_formats(tmp_path):
    x = _lp(2, 20, 5, seed=11)
    targets = [[1, 2, 3, 4], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]]
    al = forced_align(x, targets, [20, 8])  # the second is infeasible
    chars = "_ab c"
    recs = json.loads(
        to_json(al, targets, frame_shift=0.04, tokens=chars, utterance_ids=["u1", "u2"], word_separator_id=3)
    )
    assert recs == to_records(
        al, targets, frame_shift=0.04, tokens=chars, utterance_ids=["u1", "u2"], word_separator_id=3
    )
    r = recs[0]
    assert r["utterance"] == "u1" and r["num_frames"] == 20
    assert r["score"] == pytest.approx(float(al.score[0]), rel=1e-6)
    assert [t["text"] for t in r["tokens"]] == ["a", "b", " ", "c"]
    for i, t in enumerate(r["tokens"]):
        assert t["start_frame"] == int(al.token_start[0, i]) and t["end_frame"] == int(al.token_end[0, i])
        assert t["start"] == pytest.approx(0.04 * t["start_frame"]) and t["end"] == pytest.approx(0.04 * t["end_frame"])
    assert [w["text"] for w in r["words"]] == ["ab", "c"]
    assert recs[1]["score"] is None and recs[1]["tokens"] == [] and recs[1]["words"] == []
    ctm = to_ctm(al, targets, frame_shift=0.04, tokens=chars, utterance_ids=["u1", "u2"], word_separator_id=3)
    lines = ctm.splitlines()
    assert len(lines) == 2 and ctm.endswith("\n")
    for line, w in zip(lines, r["words"]):
        utt, ch, start, dur, word, conf = line.split(" ")
        assert (utt, ch, word) == ("u1", "1", w["text"])
        assert float(start) == pytest.approx(0.04 * w["start"], abs=1e-3)
        assert float(dur) == pytest.approx(0.04 * (w["end"] - w["start"]), abs=1e-3)
        assert 0 <= float(conf) <= 1 and float(conf) == pytest.approx(w["confidence"], abs=1e-4)
    with pytest.raises(ValueError, match="frame_shift"):
        to_ctm(al, targets, frame_shift=0)
    with pytest.raises(ValueError, match="utterance_ids"):
        to_json(al, targets, utterance_ids=["a b", "c"])
    with pytest.raises(ValueError, match="tokens"):
        to_json(al, targets, tokens="ab")


def test_plot_alignment_writes_a_png(tmp_path):
    x = _lp(2, 25, 5, seed=12)
    al = forced_align(x, [[1, 2, 3], [4]], [25, 10], star=-1.0)
    out = tmp_path / "a.png"
    fig = plot_alignment(x, al, 0, tokens="_abcd", path=out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
    assert fig.axes
    with pytest.raises(ValueError, match="b must be"):
        plot_alignment(x, al, 2)


def test_file_writers_are_refused_in_checkpoint_configs():
    from lightning_gtn import trust

    # checkpoints are data: only registered types may be named, and functions such as the aligner
    # and the file writers are none
    trust.check_target("lightning_gtn.nn.CTCLoss", "loss._target_")
    for path in (
        "lightning_gtn.functional.forced_align",
        "lightning_gtn.functional.plot_alignment",
        "lightning_gtn.align.plot.plot_alignment",
        "lightning_gtn.align_cli.main",
    ):
        with pytest.raises(trust.UntrustedTargetError):
            trust.check_target(path, "decoder._target_")


@pytest.mark.parametrize("impl", IMPLS)
def test_small_backpointer_budget_runs_in_groups_with_the_same_result(impl, monkeypatch):
    from lightning_gtn.kernels import viterbi_paths

    g = torch.Generator().manual_seed(13)
    x = torch.randn(5, 30, 6, generator=g).log_softmax(-1)
    targets = [[1, 2], [3, 4, 5], [], [2, 2, 2], [1]]
    lengths = [30, 20, 5, 30, 11]
    full = forced_align(x, targets, lengths, impl=impl)
    monkeypatch.setattr(viterbi_paths, "BP_BUDGET", 100)  # smaller than any example: one per group
    assert len(viterbi_paths._groups(_problem_of(targets, lengths), impl == "torch")) == 5
    small = forced_align(x, targets, lengths, impl=impl)
    assert torch.equal(full.labels, small.labels) and torch.equal(full.score, small.score)


def _problem_of(targets, lengths):
    import numpy as np

    from lightning_gtn.core.criterion_graphs import compiled_ctc
    from lightning_gtn.kernels.compiled_graphs import GraphBatch, Problem

    graphs = [compiled_ctc(tuple(t), 0) for t in targets]
    return Problem(GraphBatch(graphs), np.arange(len(graphs)), np.arange(len(graphs)), np.array(lengths))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), blank=st.sampled_from([0, None]), star=st.sampled_from([None, -1.5]))
def test_property_best_path_matches_brute_force_and_impls_agree(data, blank, star):
    C = 3
    B = data.draw(st.integers(1, 3))
    T = data.draw(st.integers(0, 5))
    seed = data.draw(st.integers(0, 2**16))
    lo = 1 if blank == 0 else 0
    targets = [data.draw(st.lists(st.integers(lo, C - 1), max_size=3)) for _ in range(B)]
    if blank is None and star is not None:  # the brute force's collapse rule needs distinct neighbours
        targets = [[v for i, v in enumerate(t) if i == 0 or v != t[i - 1]] for t in targets]
    lengths = [data.draw(st.integers(0, T)) for _ in range(B)]
    x = _lp(B, T, C, seed=seed)
    al = forced_align(x, targets, lengths, blank=blank, star=star)
    al_t = forced_align(x, targets, lengths, blank=blank, star=star, impl="torch")
    assert torch.equal(al.labels, al_t.labels) and torch.allclose(al.score, al_t.score)
    for b in range(B):
        n = lengths[b]
        if star is not None:
            paths = list(_star_paths(targets[b], n, blank))
        elif blank is None:  # (_brute.segmentations yields an empty path for 0 frames and 1 token)
            paths = list(segmentations(targets[b], n)) if n >= len(targets[b]) else []
        else:
            paths = list(ctc_paths(targets[b], n, blank))
        if not paths:
            assert float(al.score[b]) == -math.inf and (al.labels[b] == -1).all()
            continue
        best = max(_path_score(x[b], p, star=star, blank=blank) for p in paths)
        assert float(al.score[b]) == pytest.approx(best, abs=1e-9)
        assert _frame_sum(x, al, b, star=star) == pytest.approx(best, abs=1e-9)


def test_custom_op_compiles_fullgraph_and_passes_opcheck():
    x = _lp(3, 10, 5, seed=14, dtype=torch.float32)
    tg, il, tl = torch.tensor([[1, 2, 3], [4, 4, 0], [2, 0, 0]]), torch.tensor([10, 9, 4]), torch.tensor([3, 2, 1])

    def step(x, tg, il, tl):
        al = forced_align(x * 1.0, tg, il, tl, star=-1.0)
        return al.labels, al.token_end, al.score

    eager = step(x, tg, il, tl)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(x, tg, il, tl)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a)
    op = torch.ops.lightning_gtn.forced_align.default
    torch.library.opcheck(op, (x, tg, il, tl, None, 0, None, ""))
    torch.library.opcheck(op, (x, tg, il, tl, None, 0, -1.0, ""))
    torch.library.opcheck(op, (x, tg, il, tl, torch.randn(6, 5), -1, None, "torch"))


# issue 16, finding 4: zeros(1, 100000, 2) against 20k tokens held T * S = 4 GB of backpointers.
# Each example now holds one chunk of backpointers and checkpointed scores (a child process
# measures its peak memory, a smaller instance of the same input with a smaller budget).
_MEMORY_CHILD = r"""
import resource, sys, torch
from lightning_gtn.functional import forced_align
from lightning_gtn.kernels import viterbi_paths as K

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

K.BP_BUDGET = 1 << 20
T, L = 12000, 3000
x = torch.zeros(1, T, 2).log_softmax(-1)
for blank, tokens, star in ((0, [1] * L, None), (None, [1, 0] * (L // 2), None), (0, [1] * L, -1.0),
                           (None, [1, 0] * (L // 2), -1.0)):
    forced_align(x[:, :50], [tokens[:10]], [50], blank=blank, star=star)  # compiled before measuring
    before = peak_mb()
    al = forced_align(x, [tokens], [T], blank=blank, star=star)
    grew = peak_mb() - before
    assert al.labels[0].tolist().count(-1) == 0 and torch.isfinite(al.score).all(), al.score
    # full backpointers: T * (2L + 1) = 72 MB (CTC) and T * (L + 1) = 36 MB (the chain), with a
    # star T * (L + 2) = 36 MB (one byte per gap)
    print(blank, star, "grew", grew, "MB", flush=True)
    assert grew < 16, f"blank={blank}, star={star}: peak memory grew by {grew:.0f} MB"
print("fuzzed")
"""


def test_long_inputs_hold_bounded_memory(tmp_path):
    from tests._child import run_as_child

    f = tmp_path / "align_memory.py"
    f.write_text(_MEMORY_CHILD)
    run_as_child(str(f), timeout=300)


@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointed_chunks_give_the_same_paths(impl, monkeypatch):
    from lightning_gtn.kernels import viterbi_paths

    g = torch.Generator().manual_seed(21)
    x = torch.randn(4, 40, 5, generator=g).log_softmax(-1)
    x[3] = 0.0  # ties everywhere
    targets = [[1, 2, 2, 3], [4], [1, 3, 1, 3, 1, 3, 2], [2, 2, 1]]
    lengths = [40, 17, 33, 40]
    for kw in (dict(blank=0), dict(blank=None), dict(blank=0, star=-1.0)):
        full = forced_align(x, targets, lengths, impl=impl, **kw)
        monkeypatch.setattr(viterbi_paths, "BP_BUDGET", 30)  # chunks of a few frames, checkpoints
        small = forced_align(x, targets, lengths, impl=impl, **kw)
        monkeypatch.undo()
        assert torch.equal(full.labels, small.labels) and torch.equal(full.score, small.score)


def test_byte_limit_error_names_the_sizes(monkeypatch):
    from lightning_gtn.kernels import viterbi_paths

    x = _lp(2, 50, 4, seed=22, dtype=torch.float32)
    monkeypatch.setattr(viterbi_paths, "MAX_ALIGN_BYTES", 200)
    for impl, blank in (("numba", 0), ("numba", None), ("torch", 0)):
        with pytest.raises(
            ValueError,
            match=r"T=50 frames against a graph of S=(7|4) nodes needs \d+ bytes, more " r"than the limit of 200",
        ):
            forced_align(x, [[1, 2, 3], [1]], [50, 50], blank=blank, impl=impl)


def test_plot_token_labels_do_not_overlap():
    # issue 16: the token labels under the image overlapped each other and the frame ticks
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 120, 28, generator=g).log_softmax(-1)
    tokens = list("_abcdefghijklmnopqrstuvwxyz ")
    target = [tokens.index(c) for c in "the quick brown fox jumps over the lazy dog"]
    al = forced_align(x, [target], [120])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot_alignment(x, al, 0, tokens=tokens)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    boxes = [t.get_window_extent(r) for a in fig.axes for t in a.texts]
    assert len(boxes) >= 30  # most tokens are labelled
    ticks = [t.get_window_extent(r) for t in fig.axes[0].get_xticklabels() if t.get_text()]
    for i, p in enumerate(boxes):
        assert not any(p.overlaps(q) for q in boxes[i + 1 :] + ticks)
