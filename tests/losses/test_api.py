"""The public calling convention of ``lightning_gtn.functional``: integer checks, ``impl=``,
keyword-only options, graph_loss's reductions, best_paths, the shared scoring core, and the
losses as custom ops under ``torch.compile(fullgraph=True)``."""

import itertools

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.core import criterion, scoring
from lightning_gtn.functional import asg_loss, best_paths, ctc_loss, graph_loss, sequence_loss, viterbi

from ._brute import asg_path_score

B, T, C = 2, 10, 4
X = torch.randn(B, T, C, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
TR = torch.zeros(C + 1, C)
TG = torch.tensor([[1, 2], [3, 0]])
IL, TL = [10, 8], [2, 1]
GRAPH = gtn.criterion.ctc_graph([1], 0)

# ---------------------------------------------------------------------------
# integers: float / bool lengths, labels and blanks are errors, never truncated
# ---------------------------------------------------------------------------

BAD_LENGTHS = {
    "float list": [10, 8.5],
    "whole floats": [10.0, 8.0],
    "numpy float": np.array([10.0, 8.0]),
    "float tensor": torch.tensor([10.0, 8.0]),
    "bool tensor": torch.tensor([True, True]),
    "numpy bool": np.array([True, True]),
}


def _call(loss, **kw):
    """``loss`` with good arguments, ``kw`` replacing some."""
    a = dict(targets=TG, input_lengths=IL, target_lengths=TL)
    a.update(kw)
    if loss == "ctc":
        return ctc_loss(X, a["targets"], a["input_lengths"], a["target_lengths"], blank=a.get("blank", 0))
    if loss == "asg":
        return asg_loss(X, a["targets"], a["input_lengths"], a["target_lengths"], transitions=TR)
    if loss == "seq":
        return sequence_loss(X, a["targets"], a["input_lengths"], a["target_lengths"])
    if loss == "graph":
        return graph_loss(X, input_lengths=a["input_lengths"], target_lengths=a["target_lengths"], graphs=GRAPH)
    raise AssertionError(loss)


@pytest.mark.parametrize("loss", ["ctc", "asg", "seq", "graph"])
@pytest.mark.parametrize("arg", ["input_lengths", "target_lengths"])
@pytest.mark.parametrize("bad", list(BAD_LENGTHS), ids=str)
def test_non_integer_lengths_are_errors(loss, arg, bad):
    with pytest.raises(ValueError, match=f"{arg} must hold integers"):
        _call(loss, **{arg: BAD_LENGTHS[bad]})


@pytest.mark.parametrize("bad", list(BAD_LENGTHS), ids=str)
def test_non_integer_lengths_in_decoders(bad):
    with pytest.raises(ValueError, match="input_lengths must hold integers"):
        best_paths(X, BAD_LENGTHS[bad])
    with pytest.raises(ValueError, match="input_lengths must hold integers"):
        best_paths(X, BAD_LENGTHS[bad], transitions=TR)
    with pytest.raises(ValueError, match="input_lengths must hold integers"):
        viterbi(X, BAD_LENGTHS[bad])


BAD_TARGETS = {
    "float in a list": ([[1, 2.5], [3]], TL),
    "float tensor": (torch.tensor([[1.0, 2.0], [3.0, 0.0]]), TL),
    "numpy float": (np.array([[1.0, 2.0], [3.0, 0.0]]), TL),
    "concatenated float": (torch.tensor([1.0, 2.0, 3.0]), TL),
    "bools in lists": ([[True], [False]], [1, 1]),
}


@pytest.mark.parametrize("loss", ["ctc", "asg", "seq"])
@pytest.mark.parametrize("bad", list(BAD_TARGETS), ids=str)
def test_non_integer_labels_are_errors(loss, bad):
    targets, lengths = BAD_TARGETS[bad]
    with pytest.raises(ValueError, match="targets must hold integers"):
        _call(loss, targets=targets, target_lengths=lengths)


def test_graph_loss_non_integer_targets_are_errors():
    with pytest.raises(ValueError, match="targets must hold integers"):
        graph_loss(X, [[1, 2.5], [3]], graphs=GRAPH)


@pytest.mark.parametrize(
    "blank", [True, 1.5, 1.0, np.float64(1.0), np.bool_(True), torch.tensor(1.0), torch.tensor(True), "1"], ids=repr
)
def test_non_integer_blank_is_an_error(blank):
    with pytest.raises(ValueError, match=r"blank must be an integer label in \[0, C\)"):
        ctc_loss(X, TG, IL, TL, blank=blank)
    with pytest.raises(ValueError, match=r"blank must be an integer label in \[0, C\)"):
        viterbi(X, IL, blank=blank)


def test_integer_types_are_accepted():
    ref = ctc_loss(X, TG, IL, TL)
    for il, tl, blank in [
        (np.array(IL, dtype=np.int32), np.array(TL, dtype=np.uint8), np.int64(0)),
        (torch.tensor(IL, dtype=torch.int32), torch.tensor(TL, dtype=torch.int16), torch.tensor(0)),
    ]:
        torch.testing.assert_close(ctc_loss(X, TG.int(), il, tl, blank=blank), ref)


# ---------------------------------------------------------------------------
# impl= and keyword-only options
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["k2", "native", "", "NUMBA", 0])
def test_unknown_impl_is_an_error(impl):
    for f in (
        lambda: ctc_loss(X, TG, IL, TL, impl=impl),
        lambda: asg_loss(X, TG, IL, TL, transitions=TR, impl=impl),
        lambda: sequence_loss(X, TG, IL, TL, impl=impl),
        lambda: graph_loss(X, input_lengths=IL, graphs=GRAPH, impl=impl),
    ):
        with pytest.raises(ValueError, match="impl must be one of"):
            f()


def test_graph_loss_has_no_gtn_impl():
    with pytest.raises(ValueError, match="impl='gtn' is not available"):
        graph_loss(X, input_lengths=IL, graphs=GRAPH, impl="gtn")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU default")
def test_every_cpu_impl_gives_the_default_result():
    ref = ctc_loss(X.double(), TG, IL, TL, reduction="none")
    for impl in ["numba", "numba_log", "torch"]:
        torch.testing.assert_close(ctc_loss(X.double(), TG, IL, TL, reduction="none", impl=impl), ref)


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        ctc_loss(X, TG, IL, TL, 0, "mean", False, "numba")
    with pytest.raises(TypeError):
        asg_loss(X, TR, TG, IL, TL)  # the old order: transitions second
    with pytest.raises(TypeError):
        sequence_loss(X, TG, IL, TL, "sum")
    with pytest.raises(TypeError):
        graph_loss(X, None, IL, None, GRAPH)
    with pytest.raises(TypeError):
        viterbi(X, IL, 0)
    # ctc_loss keeps torch's positional blank, reduction, zero_infinity
    torch.testing.assert_close(
        ctc_loss(X, TG, IL, TL, 0, "sum", True), ctc_loss(X, TG, IL, TL, blank=0, reduction="sum", zero_infinity=True)
    )


# ---------------------------------------------------------------------------
# graph_loss reductions (default "mean")
# ---------------------------------------------------------------------------


def _graph_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets = [[1, 2], [3, 3, 1], []]
    graphs = [gtn.criterion.ctc_graph(t, 0) for t in targets]
    w = [torch.tensor(gr.weights_to_list(), dtype=torch.float64, requires_grad=True) for gr in graphs]
    return x, targets, graphs, w, [7, 6, 4]


def _grads(out, x, w):
    return torch.autograd.grad(out, [x] + w, retain_graph=True)


def test_graph_loss_mean_without_target_lengths_is_the_batch_mean():
    x, _, graphs, w, il = _graph_inputs()
    none = graph_loss(x, input_lengths=il, graphs=graphs, weights=w, reduction="none")
    assert none.shape == (3,)
    for out in (
        graph_loss(x, input_lengths=il, graphs=graphs, weights=w, reduction="mean"),
        graph_loss(x, input_lengths=il, graphs=graphs, weights=w),
    ):  # the default
        assert out.shape == ()
        torch.testing.assert_close(out, none.mean())
        for a, b in zip(_grads(out, x, w), _grads(none.mean(), x, w)):
            torch.testing.assert_close(a, b)
    total = graph_loss(x, input_lengths=il, graphs=graphs, weights=w, reduction="sum")
    torch.testing.assert_close(total, none.sum())


def test_graph_loss_mean_with_target_lengths_divides_by_them():
    x, targets, graphs, w, il = _graph_inputs()
    none = graph_loss(x, input_lengths=il, graphs=graphs, weights=w, reduction="none")
    lens = torch.tensor([2, 3, 0], dtype=torch.float64)
    expected = (none / lens.clamp(min=1)).mean()
    by_lengths = graph_loss(x, None, il, [2, 3, 0], graphs=graphs, weights=w)
    by_targets = graph_loss(x, targets, il, graphs=graphs, weights=w)
    for out in (by_lengths, by_targets):
        torch.testing.assert_close(out, expected)
        for a, b in zip(_grads(out, x, w), _grads(expected, x, w)):
            torch.testing.assert_close(a, b)
    # the same as ctc_loss's "mean" on these CTC graphs
    ctc = ctc_loss(x, targets, il, [2, 3, 0])
    torch.testing.assert_close(by_lengths, ctc)


def test_graph_loss_calc_grad_graphs_get_reduced_gradients():
    x, _, _, _, il = _graph_inputs()
    g1 = gtn.criterion.ctc_graph([1, 2], 0)
    g1.calc_grad = True
    graph_loss(x, input_lengths=il, target_lengths=[2, 2, 2], graphs=g1).backward()
    g2 = gtn.criterion.ctc_graph([1, 2], 0)  # calc_grad False: receives nothing
    w = torch.tensor(g2.weights_to_list(), dtype=torch.float64, requires_grad=True)
    ref = graph_loss(x.detach(), input_lengths=il, target_lengths=[2, 2, 2], graphs=g2, weights=[w])
    ref.backward()
    np.testing.assert_allclose(g1.grad().weights_to_numpy(), w.grad.numpy(), atol=1e-6)


# ---------------------------------------------------------------------------
# best_paths
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_best_paths_is_the_argmax_padded_with_minus_one(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 5, generator=g).to(dtype)
    lens = [6, 3, 0, 1]
    paths, scores = best_paths(x, torch.tensor(lens))
    assert paths.dtype == torch.int64 and paths.shape == (4, 6)
    assert scores.dtype == dtype and scores.shape == (4,)
    for b, n in enumerate(lens):
        best = [int(x[b, t].argmax()) for t in range(n)]  # brute force: one frame at a time
        assert paths[b].tolist() == best + [-1] * (6 - n)
        torch.testing.assert_close(scores[b], sum((x[b, t, best[t]] for t in range(n)), torch.zeros((), dtype=dtype)))
    # default lengths: every frame
    full, _ = best_paths(x)
    assert (full >= 0).all() and torch.equal(full, x.argmax(-1))


def test_best_paths_with_transitions_is_the_brute_force_best_path():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 3, generator=g, dtype=torch.float64)
    tr = torch.randn(4, 3, generator=g, dtype=torch.float64)
    lens = [5, 2, 0]
    paths, scores = best_paths(x, lens, transitions=tr)
    assert paths.dtype == torch.int64 and paths.shape == (3, 5)
    for b, n in enumerate(lens[:2]):
        cands = list(itertools.product(range(3), repeat=n))
        sc = [asg_path_score(x[b], tr, list(p)) for p in cands]
        i = int(torch.stack(sc).argmax())
        assert paths[b].tolist() == list(cands[i]) + [-1] * (5 - n)
        torch.testing.assert_close(scores[b], sc[i])
    # zero frames: ASG's full graph has no path of length 0
    assert paths[2].tolist() == [-1] * 5 and scores[2].item() == float("-inf")
    # viterbi collapses the same paths
    tokens, vpaths = viterbi(x, lens, blank=None, transitions=tr, return_paths=True)
    assert vpaths == [[v for v in row if v >= 0] for row in paths.tolist()]


def test_best_paths_with_graphs_marks_examples_without_a_path():
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    g = gtn.criterion.ctc_graph([1, 1, 1], 0)  # needs 5 frames
    paths, scores = best_paths(x, [4, 4], graphs=g)
    assert (paths == -1).all() and torch.isinf(scores).all()


def test_best_paths_takes_transitions_or_graphs():
    with pytest.raises(ValueError, match="not both"):
        best_paths(X, transitions=TR, graphs=GRAPH)


# ---------------------------------------------------------------------------
# the shared core: scoring.score gives the losses and their gradients
# ---------------------------------------------------------------------------


def test_score_core_matches_autograd_of_the_public_loss():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    tr = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets, lens = [[1, 2], [3, 3, 1], [0]], np.array([6, 5, 4])
    coef = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    ref = asg_loss(x, targets, lens, transitions=tr, reduction="none")
    gx, gtr = torch.autograd.grad((ref * coef).sum(), (x, tr))
    crit = criterion.CRITERIA["asg"]
    plan, widx = crit.plan(targets, lens, 4, 0)
    w = tr.detach().reshape(-1)[torch.from_numpy(widx)]
    for impl in ["numba", "numba_log", "torch"]:
        losses, gE, gw = scoring.score(plan, x.detach(), w, impl, False, True, coef)
        torch.testing.assert_close(losses, ref.detach())
        torch.testing.assert_close(gE * coef.reshape(-1, 1, 1), gx)
        gW = torch.zeros(tr.numel(), dtype=torch.float64).index_add_(0, torch.from_numpy(widx), gw)
        torch.testing.assert_close(gW.reshape(tr.shape), gtr)
        # nothing requested, nothing returned
        _, gE0, gw0 = scoring.score(plan, x.detach(), w, impl, False, False)
        assert gE0 is None and gw0 is None


def test_reduce_losses():
    from lightning_gtn.core.reduction import reduce_losses, reduction_coefficients

    losses = torch.tensor([2.0, 6.0, 3.0])
    assert reduce_losses(losses, "none") is losses
    assert reduce_losses(losses, "sum").item() == 11.0
    assert reduce_losses(losses, "mean").item() == pytest.approx(11.0 / 3)
    assert reduce_losses(losses, "mean", np.array([2, 3, 0])).item() == pytest.approx((1 + 2 + 3) / 3)
    # the coefficients are the same rule: reduce(losses) = sum_b r[b] * losses[b]
    for red, div in (("sum", None), ("mean", None), ("mean", np.array([2, 3, 0])), ("mean", torch.tensor([4, 1, 2]))):
        r = reduction_coefficients(red, 3, div)
        assert r.dtype == torch.float64 and r.shape == (3,)
        assert (r * losses.double()).sum().item() == pytest.approx(reduce_losses(losses.double(), red, div).item())
    assert torch.equal(reduction_coefficients("none", 2), torch.ones(2, dtype=torch.float64))  # per-row gradients
    r = reduction_coefficients("mean", 3, count=8, dtype=torch.float32)  # the TDT loss's "mean_volume"
    assert r.dtype == torch.float32 and torch.equal(r, torch.full((3,), 1 / 8))
    assert torch.equal(reduction_coefficients("mean", 0), torch.zeros(0, dtype=torch.float64))


# ---------------------------------------------------------------------------
# custom ops: torch.compile(fullgraph=True) and opcheck
# ---------------------------------------------------------------------------


def _step_inputs():
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(3, 8, 5, generator=g)
    tg = torch.tensor([[1, 2, 3], [2, 2, 0], [3, 0, 0]])
    return feats, tg, torch.tensor([8, 7, 5]), torch.tensor([3, 2, 1])


def _train_step(kind, reduction, compiled):
    """Loss and gradients of a linear model + log_softmax + ``kind`` loss, eager or compiled."""
    torch.manual_seed(1)
    model = torch.nn.Linear(5, 4)
    tr = torch.nn.Parameter(0.1 * torch.randn(5, 4))

    def step(feats, tg, il, tl):
        lp = model(feats).log_softmax(-1)
        if kind == "ctc":
            loss = ctc_loss(lp, tg, il, tl, reduction=reduction)
        elif kind == "asg":
            loss = asg_loss(lp, tg, il, tl, transitions=tr, reduction=reduction)
        else:
            loss = sequence_loss(lp, tg, il, tl, reduction=reduction)
        return loss.sum() if reduction == "none" else loss

    if compiled:
        torch._dynamo.reset()  # a fresh compile per case (the recompile limit is per code object)
        step = torch.compile(step, fullgraph=True)
    loss = step(*_step_inputs())
    loss.backward()
    return loss.detach(), model.weight.grad, model.bias.grad, tr.grad


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("kind", ["ctc", "asg", "seq"])
def test_compiled_training_step_equals_eager(kind, reduction):
    eager = _train_step(kind, reduction, False)
    compiled = _train_step(kind, reduction, True)
    assert torch.isfinite(eager[0])
    for a, b in zip(eager, compiled):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert (eager[3] is not None) == (kind == "asg")  # the transitions got their gradient
    if kind == "asg":
        assert eager[3].abs().sum() > 0


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_opcheck_structured_loss(reduction):
    x = torch.randn(2, 6, 4).log_softmax(-1).requires_grad_(True)
    tg, il, tl = torch.tensor([[1, 2], [3, 0]]), torch.tensor([6, 5]), torch.tensor([2, 1])
    op = torch.ops.lightning_gtn.structured_loss.default
    torch.library.opcheck(op, (x, None, tg, il, tl, "ctc", 0, 0, reduction, False, "", True, False))
    tr = (0.1 * torch.randn(5, 4)).requires_grad_(True)
    torch.library.opcheck(op, (x, tr, tg, il, tl, "asg", 0, 0, reduction, False, "", True, True))


def test_opcheck_best_paths():
    x = torch.randn(2, 6, 4)
    op = torch.ops.lightning_gtn.best_paths.default
    torch.library.opcheck(op, (x, None, torch.tensor([6, 3])))
    torch.library.opcheck(op, (x, torch.randn(5, 4), torch.tensor([6, 3])))


def test_a_bool_inside_a_list_is_not_an_integer():
    x = torch.randn(2, 10, 4).log_softmax(-1)
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss(x, torch.tensor([[1, 2], [3, 0]]), [True, 8], [2, 1])
    with pytest.raises(ValueError, match="targets"):
        sequence_loss(x, [[1, False], [2]], [10, 8])
