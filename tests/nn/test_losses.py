"""The loss modules are thin: same numbers as the functional losses, transitions learnable."""

import pickle

import torch
import torch.nn.functional as TF

import lightning_gtn.wfst as gtn
from lightning_gtn import functional as F
from lightning_gtn.nn import ASGLoss, CTCLoss, GraphLoss, ModuleLoss, SequenceLoss, TargetGraphLoss
from lightning_gtn.wfst.criterion import ctc_graph


def _batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 12, 5, generator=g, requires_grad=True)
    tg = torch.randint(1, 5, (3, 4), generator=g)
    return x, tg, torch.tensor([12, 10, 8]), torch.tensor([4, 3, 2])


def test_ctc_module_matches_torch():
    x, tg, il, tl = _batch()
    for reduction in ["none", "mean", "sum"]:
        ours = CTCLoss(reduction=reduction)(x.log_softmax(-1), tg, il, tl)
        ref = TF.ctc_loss(x.log_softmax(-1).transpose(0, 1), tg, il, tl, reduction=reduction)
        torch.testing.assert_close(ours, ref)


def test_asg_module_owns_transitions_and_learns_them():
    x, tg, il, tl = _batch()
    m = ASGLoss(5)
    assert isinstance(m.transitions, torch.nn.Parameter) and m.transitions.shape == (6, 5)
    assert [n for n, _ in m.named_parameters()] == ["transitions"]
    loss = m(x, tg, il, tl)
    torch.testing.assert_close(loss, F.asg_loss(x, tg, il, tl, transitions=m.transitions))
    loss.backward()
    assert m.transitions.grad is not None and m.transitions.grad.abs().sum() > 0
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    before = m(x, tg, il, tl).item()
    for _ in range(5):
        opt.zero_grad()
        m(x.detach(), tg, il, tl).backward()
        opt.step()
    assert m(x, tg, il, tl).item() < before
    pickle.loads(pickle.dumps(m))  # DDP spawn pickles modules
    tokens = m.decode(x.detach(), il)
    paths, scores = m.best_paths(x.detach(), il)
    assert tokens == [F.collapse(p) for p in paths.tolist()]
    assert tokens == F.viterbi(x.detach(), il, blank=None, transitions=m.transitions)


def test_sequence_and_graph_modules():
    x, tg, il, tl = _batch()
    torch.testing.assert_close(
        SequenceLoss(reduction="sum")(x, tg, il, tl), F.sequence_loss(x, tg, il, tl, reduction="sum")
    )
    g = gtn.Graph(False)
    g.add_node(True, True)
    g.add_arc(0, 0, 1)
    g.add_arc(0, 0, 2)
    expected = -torch.logsumexp(x[:, :, 1:3], -1)
    expected = torch.stack([expected[b, : il[b]].sum() for b in range(3)])
    torch.testing.assert_close(GraphLoss(reduction="none")(x, None, il, graphs=g), expected)


def test_every_loss_declares_its_convention_and_decodes():
    x, tg, il, tl = _batch()
    lp = x.detach().log_softmax(-1)
    ctc = CTCLoss(blank=0)
    assert (ctc.blank, ctc.repeat_label) == (0, False)
    assert ctc.decode(lp, il) == F.viterbi(lp, il, blank=0)
    for m in (ASGLoss(5), SequenceLoss()):
        assert m.blank is None and m.repeat_label
    assert SequenceLoss().decode(lp, il) == F.viterbi(lp, il, blank=None)
    tgl = TargetGraphLoss(ctc_graph, {"blank_idx": 0}, blank=0)
    assert (tgl.blank, tgl.repeat_label) == (0, False)
    torch.testing.assert_close(tgl(lp, tg, il, tl), ctc(lp, tg, il, tl))
    wrapped = ModuleLoss(ctc, blank=0)
    torch.testing.assert_close(wrapped(lp, tg, il, tl), ctc(lp, tg, il, tl))


def test_bad_options_are_errors_naming_them():
    import pytest

    for bad in (True, 1.5, "0"):
        with pytest.raises(ValueError, match="blank"):
            CTCLoss(blank=bad)
    with pytest.raises(ValueError, match="reduction"):
        SequenceLoss(reduction="avg")
    with pytest.raises(ValueError, match="impl"):
        CTCLoss(impl="cuda")
    with pytest.raises(ValueError, match="num_classes"):
        ASGLoss(2.5)
    with pytest.raises(ValueError, match="builder"):
        TargetGraphLoss("os.system")
    with pytest.raises(ValueError, match="label"):  # a builder whose graphs read labels >= C
        x, tg, il, tl = _batch()
        TargetGraphLoss(lambda t: ctc_graph([9], 0))(x, tg, il, tl)


def test_target_graph_loss_compiles_fullgraph_and_pickles():
    x, tg, il, tl = _batch()
    m = TargetGraphLoss(ctc_graph, {"blank_idx": 0}, blank=0)
    lin = torch.nn.Linear(5, 5)

    def step(inp):
        return m(lin(inp).log_softmax(-1), tg, il, tl)

    eager = step(x.detach())
    (ge,) = torch.autograd.grad(eager, lin.weight)
    compiled = torch.compile(step, fullgraph=True)(x.detach())
    (gc,) = torch.autograd.grad(compiled, lin.weight)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(gc, ge)
    clone = pickle.loads(pickle.dumps(m))
    assert clone._handle != m._handle
    torch.testing.assert_close(clone(x.log_softmax(-1), tg, il, tl), m(x.log_softmax(-1), tg, il, tl))
