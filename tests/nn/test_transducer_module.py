"""nn.TransducerLoss: the research module's behaviour (log_softmax without transitions, its
parameters, reductions), pickling and state dicts, decoding, torch.compile, errors."""

import copy
import io
import pickle

import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn import nn as lnn
from lightning_gtn.functional import full_ngram_transitions, transducer_criterion
from tests.losses.test_transducer import G2I, PIECES, TARGETS, ref_transitions, reference

LENGTHS = (9, 7, 8, 5)


def _x(C, seed=0):
    return torch.randn(4, 9, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_attributes():
    m = lnn.TransducerLoss(PIECES, G2I, blank="optional")
    assert m.num_classes == len(PIECES) + 1 and m.blank == len(PIECES)
    assert m.repeat_label is False and m.target_classes == 3 and m.transition_params is None
    m = lnn.TransducerLoss(PIECES, {"a": 0, "b": 1, "c": 5}, ngram=2)
    assert m.num_classes == len(PIECES) and m.blank is None and m.target_classes == 6
    assert isinstance(m.transition_params, torch.nn.Parameter)
    # the research graph's arc count and order: zeros, one per arc
    assert m.transition_params.shape == (ref_transitions(2, len(PIECES)).num_arcs(),)
    assert torch.count_nonzero(m.transition_params) == 0
    assert isinstance(m, lnn.StructuredLoss)


@pytest.mark.parametrize("blank", ["none", "optional", "forced"])
def test_module_applies_log_softmax_without_transitions(blank):
    m = lnn.TransducerLoss(PIECES, G2I, blank=blank, reduction="none").double()
    x = _x(m.num_classes).requires_grad_()
    out = m(x, TARGETS, torch.tensor(LENGTHS))
    out.sum().backward()
    lp = x.detach().log_softmax(-1)
    ref, gref, _ = reference(lp, TARGETS, LENGTHS, PIECES, G2I, blank)
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-5)
    # research gradient is with respect to the log-probabilities; chain through log_softmax
    want = gref - lp.exp() * gref.sum(-1, keepdim=True)
    torch.testing.assert_close(x.grad, want, rtol=1e-5, atol=1e-5)


def test_module_with_ngram_uses_raw_scores_and_learns_transitions():
    m = lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional", reduction="none").double()
    with torch.no_grad():
        m.transition_params.copy_(torch.linspace(-0.5, 0.5, m.transition_params.numel()))
    x = _x(m.num_classes).requires_grad_()
    out = m(x, TARGETS, torch.tensor(LENGTHS))
    out.sum().backward()
    ref, gref, pref = reference(
        x.detach(),
        TARGETS,
        LENGTHS,
        PIECES,
        G2I,
        "optional",
        trans=ref_transitions(1, m.num_classes),
        params=m.transition_params,
    )
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, gref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.transition_params.grad, pref, rtol=1e-5, atol=1e-5)


def test_user_transitions_start_at_zero():
    g = gtn.Graph(False)
    g.add_node(True, False)
    g.add_node(False, True)
    for c in range(len(PIECES) + 1):
        g.add_arc(0, 0, c)
        g.add_arc(0, 1, c)
    m = lnn.TransducerLoss(PIECES, G2I, transitions=g, blank="optional")
    assert m.transition_params.shape == (g.num_arcs(),) and torch.count_nonzero(m.transition_params) == 0
    x = _x(m.num_classes).float()
    loss = m(x, TARGETS, torch.tensor(LENGTHS))
    loss.backward()
    assert torch.isfinite(loss) and m.transition_params.grad.abs().sum() > 0


def test_research_reductions():
    kw = dict(tokens=PIECES, graphemes_to_idx=G2I, blank="optional")
    x = _x(len(PIECES) + 1)
    il = torch.tensor(LENGTHS)
    none = lnn.TransducerLoss(**kw, reduction="none").double()(x, TARGETS, il)
    assert none.shape == (4,)
    lens = torch.tensor([len(t) for t in TARGETS], dtype=torch.float64)
    # the research "mean": per target length, then the batch mean
    torch.testing.assert_close(
        lnn.TransducerLoss(**kw, reduction="mean").double()(x, TARGETS, il), (none / lens).mean()
    )
    torch.testing.assert_close(lnn.TransducerLoss(**kw, reduction="sum").double()(x, TARGETS, il), none.sum())


def test_pickle_deepcopy_state_dict():
    m = lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional")
    with torch.no_grad():
        m.transition_params.normal_()
    x = _x(m.num_classes).float()
    want = m(x, TARGETS, torch.tensor(LENGTHS))
    for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        torch.testing.assert_close(other(x, TARGETS, torch.tensor(LENGTHS)), want)
        assert other._handle != m._handle
    fresh = lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    torch.testing.assert_close(fresh.transition_params, m.transition_params)
    torch.testing.assert_close(fresh(x, TARGETS, torch.tensor(LENGTHS)), want)


def _one_hot(path, C, T):
    x = torch.full((1, T, C), -10.0)
    for t, lab in enumerate(path):
        x[0, t, lab] = 10.0
    return x


@pytest.mark.parametrize("ngram", [0, 1, 2])
def test_decode_one_hot_path(ngram):
    tokens = ["a", "b", "c", "ab", "ca"]  # blank = 5
    m = lnn.TransducerLoss(tokens, G2I, ngram=ngram, blank="optional")
    path = [3, 3, 5, 2, 2, 4, 5, 5, 0, 1, 1]  # ab ab _ c c ca _ _ a b b -> ab c ca a b
    x = _one_hot(path, 6, len(path))
    paths, scores = m.best_paths(x)
    assert paths[0].tolist() == path and torch.isfinite(scores).all()
    assert [v.tolist() for v in m.viterbi(x)] == [[3, 2, 4, 0, 1]]
    assert m.decode(x) == [[0, 1, 2, 2, 0, 0, 1]]  # a b c c a a b
    # lengths: only the first 5 frames
    assert m.decode(torch.cat([x, x]), torch.tensor([5, 11])) == [[0, 1, 2], [0, 1, 2, 2, 0, 0, 1]]


def test_decode_without_blank_merges_repeats():
    m = lnn.TransducerLoss(["a", "b", "ab"], {"a": 0, "b": 1}, blank="none")
    x = _one_hot([2, 2, 0, 0, 1], 3, 5)
    assert m.decode(x) == [[0, 1, 0, 1]]


def test_compiled_module_step_equals_eager():
    feats = torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(4))
    tg = torch.tensor([[0, 1, 2], [1, 0, 0], [2, 2, 0]])
    il, tl = torch.tensor([7, 6, 5]), torch.tensor([3, 2, 2])

    def run(compiled):
        torch.manual_seed(0)
        model = lnn.Linear(6, len(PIECES) + 1)
        crit = lnn.TransducerLoss(PIECES, G2I, blank="optional")

        def step(feats, tg, il, tl):
            return crit(model(feats), tg, il, tl)

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True)
        loss = step(feats, tg, il, tl)
        loss.backward()
        return [loss.detach(), model.weight.grad.clone(), model.bias.grad.clone()]

    eager, compiled = run(False), run(True)
    assert torch.isfinite(eager[0])
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_module_builds_its_criterion_through_the_functional_cache():
    # without transitions the module shares the function's criterion; with them it passes its
    # own graph, so copies of a module have their own criteria
    m = lnn.TransducerLoss(PIECES, G2I, blank="optional")
    assert m._criterion is transducer_criterion(PIECES, G2I, blank="optional")[0]
    m = lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional")
    kw = dict(transitions=m.transitions, blank="optional")
    assert transducer_criterion(PIECES, G2I, **kw) == (m._criterion, m._handle)
    # the cache of recent configurations drops it; the module still holds it and finds it
    from lightning_gtn.losses import transducer as tdm

    for _ in range(tdm.CRITERIA_CACHE_SIZE + 1):
        lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional")
    assert transducer_criterion(PIECES, G2I, **kw) == (m._criterion, m._handle)


def test_compiled_module_with_transitions_after_the_cache_dropped_its_criterion():
    feats = torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(4))
    tg = torch.tensor([[0, 1, 2], [1, 0, 0], [2, 2, 0]])
    il, tl = torch.tensor([7, 6, 5]), torch.tensor([3, 2, 2])
    torch.manual_seed(0)
    model = lnn.Linear(6, len(PIECES) + 1)
    crit = lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional")
    with torch.no_grad():
        crit.transition_params.copy_(torch.linspace(-0.5, 0.5, crit.transition_params.numel()))
    from lightning_gtn.losses import transducer as tdm

    for _ in range(tdm.CRITERIA_CACHE_SIZE + 1):  # other modules: the cache drops crit's criterion
        lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional")

    def step(feats, tg, il, tl):
        return crit(model(feats), tg, il, tl)

    def run(fn):
        model.zero_grad()
        crit.zero_grad()
        loss = fn(feats, tg, il, tl)
        loss.backward()
        return [loss.detach(), model.weight.grad.clone(), crit.transition_params.grad.clone()]

    eager = run(step)
    torch._dynamo.reset()
    compiled = run(torch.compile(step, fullgraph=True))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_constructor_errors():
    with pytest.raises(ValueError, match="blank must be one of"):
        lnn.TransducerLoss(PIECES, G2I, blank="yes")
    with pytest.raises(ValueError, match="allow_repeats=False needs blank='optional'"):
        lnn.TransducerLoss(PIECES, G2I, blank="none", allow_repeats=False)
    with pytest.raises(ValueError, match="ngram > 0 or transitions, not both"):
        lnn.TransducerLoss(PIECES, G2I, ngram=1, transitions=full_ngram_transitions(1, len(PIECES)))
    with pytest.raises(ValueError, match="grapheme 'd' is not in graphemes_to_idx"):
        lnn.TransducerLoss(["a", "d"], G2I)
    with pytest.raises(ValueError, match="reduction"):
        lnn.TransducerLoss(PIECES, G2I, reduction="avg")
    m = lnn.TransducerLoss(PIECES, G2I, blank="optional")
    with pytest.raises(ValueError, match=r"emissions must have C = .* = 9 classes"):
        m(torch.randn(4, 9, 8), TARGETS)
    with pytest.raises(ValueError, match=r"out of range \[0, C\) with C=3"):
        m(torch.randn(1, 9, 9), [[0, 3]])
