"""The loss modules are thin: same numbers as the functional losses, transitions learnable."""

import pickle

import torch
import torch.nn.functional as TF

from lightning_gtn import functional as F
from lightning_gtn.nn import ASGLoss, CTCLoss, GraphLoss, SequenceLoss
import lightning_gtn.wfst as gtn


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
    torch.testing.assert_close(loss, F.asg_loss(x, m.transitions, tg, il, tl))
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
    tokens = m.viterbi(x.detach(), il)
    assert len(tokens) == 3


def test_sequence_and_graph_modules():
    x, tg, il, tl = _batch()
    torch.testing.assert_close(SequenceLoss(reduction="sum")(x, tg, il, tl),
                               F.sequence_loss(x, tg, il, tl, reduction="sum"))
    g = gtn.Graph(False)
    g.add_node(True, True)
    g.add_arc(0, 0, 1)
    g.add_arc(0, 0, 2)
    expected = -torch.logsumexp(x[:, :, 1:3], -1)
    expected = torch.stack([expected[b, : il[b]].sum() for b in range(3)])
    torch.testing.assert_close(GraphLoss(reduction="none")(x, g, il), expected)
