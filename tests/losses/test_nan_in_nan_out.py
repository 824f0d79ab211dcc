"""NaN in, NaN out (second probe, finding 9): a loss that reads a NaN is NaN, never a finite or
infinite value that ``zero_infinity=True`` would then turn into 0 with a NaN gradient."""

import math

import pytest
import torch

import lightning_gtn.functional as F

B, T, C = 3, 8, 5
TARGETS = [[1, 2], [3], [2, 4, 1]]
LENGTHS = [8, 6, 8]


def _run(name, x, trans=None, **kw):
    tl = [len(t) for t in TARGETS]
    if name == "ctc":
        return F.ctc_loss(x.log_softmax(-1), TARGETS, LENGTHS, tl, **kw)
    if name == "asg":
        return F.asg_loss(x, TARGETS, LENGTHS, tl, transitions=trans, **kw)
    if name == "seq":
        return F.sequence_loss(x, TARGETS, LENGTHS, tl, **kw)
    if name == "stc":
        return F.stc_loss(x.log_softmax(-1), TARGETS, LENGTHS, tl, p=0.7, **kw)
    if name == "transducer":
        tokens = [["a"], ["b"], ["c"], ["d"], ["a", "b"]]
        g2i = {"a": 0, "b": 1, "c": 2, "d": 3}
        return F.transducer_loss(
            x,
            [[0, 1], [2], [1, 3, 0]],
            LENGTHS,
            tokens=tokens,
            graphemes_to_idx=g2i,
            ngram=1,
            transition_params=trans,
            **kw,
        )
    raise AssertionError(name)


def _inputs(name, nan_at):
    torch.manual_seed(0)
    x = torch.randn(B, T, C)
    trans = None
    if name == "asg":
        trans = torch.randn(C + 1, C)
    if name == "transducer":
        trans = torch.randn(C)
    if nan_at == "emission":
        x[1, 3, 2] = float("nan")
    elif nan_at == "padding":
        x[1, 7, 2] = float("nan")  # beyond input_lengths[1] = 6: never read
    elif nan_at == "weight":
        trans[1] = float("nan")
    return x.requires_grad_(), (trans.requires_grad_() if trans is not None else None)


@pytest.mark.parametrize("name", ["ctc", "asg", "seq", "stc", "transducer"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_nan_emission_gives_nan_in_its_row_only(name, zero_infinity):
    x, trans = _inputs(name, "emission")
    out = _run(name, x, trans, reduction="none", zero_infinity=zero_infinity)
    assert math.isnan(out[1].item())
    assert torch.isfinite(out[[0, 2]]).all()
    out.sum().backward()
    assert torch.isnan(x.grad[1]).any()
    assert torch.isfinite(x.grad[[0, 2]]).all()
    mean = _run(name, x.detach(), trans.detach() if trans is not None else None, zero_infinity=zero_infinity)
    assert math.isnan(mean.item())


@pytest.mark.parametrize("name", ["ctc", "asg", "seq", "stc", "transducer"])
def test_nan_in_padding_is_not_read(name):
    x, trans = _inputs(name, "padding")
    out = _run(name, x, trans, reduction="none")
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["asg", "transducer"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_nan_weight_gives_nan(name, zero_infinity):
    x, trans = _inputs(name, "weight")
    out = _run(name, x, trans, reduction="none", zero_infinity=zero_infinity)
    assert torch.isnan(out).all()
    out.sum().backward()
    assert torch.isnan(trans.grad).all()
    loss = _run(name, x.detach(), trans.detach().requires_grad_(), zero_infinity=zero_infinity)
    assert math.isnan(loss.item())


def test_asg_module_nan_transition_is_not_hidden():
    from lightning_gtn.nn import ASGLoss

    crit = ASGLoss(C, zero_infinity=True)
    with torch.no_grad():
        crit.transitions[2, 3] = float("nan")
    x = torch.randn(B, T, C, requires_grad=True)
    loss = crit(x, TARGETS, LENGTHS, [len(t) for t in TARGETS])
    assert math.isnan(loss.item())


def test_decoders_refuse_nan_emissions():
    # Finding 13 of the second probe: transducer decode/viterbi on NaN emissions silently returned
    # label 0, while the beam decoder refused NaN.
    from lightning_gtn.nn import TransducerLoss

    x = torch.randn(2, 6, 4)
    x[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="emissions contains NaN"):
        F.viterbi(x, [6, 6])
    with pytest.raises(ValueError, match="emissions contains NaN"):
        F.best_paths(x, [6, 6], transitions=torch.zeros(5, 4))
    with pytest.raises(ValueError, match="transitions contains NaN"):
        F.best_paths(x.nan_to_num(), [6, 6], transitions=torch.full((5, 4), float("nan")))
    assert F.viterbi(x, [6, 2])[1] is not None  # the NaN lies beyond example 1's length: decoded
    tokens = [["a"], ["b"], ["c"], ["a", "b"]]
    for ngram in (0, 1):
        crit = TransducerLoss(tokens, {"a": 0, "b": 1, "c": 2}, ngram=ngram, blank="optional")
        y = torch.randn(2, 6, crit.num_classes)
        assert len(crit.decode(y)) == 2
        y[0, 3, 1] = float("nan")
        with pytest.raises(ValueError, match="emissions contains NaN"):
            crit.decode(y)
        with pytest.raises(ValueError, match="emissions contains NaN"):
            crit.viterbi(y)


def test_zero_infinity_never_hides_an_infinite_emission():
    """A +inf emission made a row's loss -inf (impl="torch") or +inf (ASG's normaliser), which
    zero_infinity then zeroed like an infeasible target; only infeasible rows are zeroed now."""
    import lightning_gtn.wfst as gtn

    x = torch.randn(3, 6, 4, dtype=torch.float64).log_softmax(-1)
    x[1, 2, 1] = math.inf
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node(False, True)
    for c in range(4):
        g.add_arc(0, 0, c)
        g.add_arc(0, 1, c)
        g.add_arc(1, 1, c)
    out = F.graph_loss(x, None, [6, 6, 0], graphs=g, reduction="none", zero_infinity=True, impl="torch")
    assert torch.isfinite(out[0]) and not torch.isfinite(out[1]) and out[2] == 0  # row 2: no path in 0 frames
    tg, tl = torch.tensor([[1, 2], [1, 2], [1, 2]]), torch.tensor([2, 2, 2])
    x[1, 2, 1], x[1, 2, 3] = 0.0, math.inf  # class 3 is on no target path, only in the normaliser
    asg = F.asg_loss(x, tg, [6, 6, 1], tl, transitions=torch.zeros(5, 4, dtype=torch.float64), reduction="none",
                     zero_infinity=True)  # fmt: skip
    assert torch.isfinite(asg[0]) and asg[1] == math.inf and asg[2] == 0  # row 2: 2 tokens in 1 frame


def test_zero_infinity_of_stc_and_the_word_piece_transducer_keeps_an_infinite_emission():
    """Their fast paths zeroed every infinite loss, so a +inf emission gave a loss of 0."""
    x = torch.randn(2, 6, 4).log_softmax(-1)
    x[1, 2, 1] = math.inf
    tg, tl = torch.tensor([[1, 2], [1, 2]]), torch.tensor([2, 2])
    stc = F.stc_loss(x, tg, [6, 6], tl, reduction="none", zero_infinity=True)
    tr = F.transducer_loss(x, [[0, 1], [0, 1]], [6, 6], tokens=["a", "b", "c", "d"],
                           graphemes_to_idx={"a": 0, "b": 1, "c": 2, "d": 3}, reduction="none",
                           zero_infinity=True)  # fmt: skip
    for out in (stc, tr):
        assert torch.isfinite(out[0]) and not torch.isfinite(out[1]), out
    short = F.stc_loss(x, tg, [6, 1], tl, reduction="none", zero_infinity=True)  # row 1: no path in 1 frame
    assert short[1] == 0
