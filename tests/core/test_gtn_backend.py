"""impl="gtn": the GTN pattern, checked against the native implementation.

The real ``gtn`` package does not install from PyPI (its sdist has no C++ sources), so CI does
not have it; the engine speaks its API, so it stands in for it through ``sys.modules["gtn"]``.
Where the real ``gtn`` is importable (a build of it on ``PYTHONPATH``), the second test runs
the same comparison against it.
"""

import importlib.util
import sys

import pytest
import torch

import lightning_gtn.wfst
from lightning_gtn.functional import asg_loss, ctc_loss, sequence_loss


def _compare(monkeypatch=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 4, generator=g, requires_grad=True)
    tr = torch.randn(5, 4, generator=g, requires_grad=True)
    targets = [[1, 2], [3], [1, 1]]
    lens = [7, 5, 6]
    flat, tl = torch.tensor([1, 2, 3, 1, 1]), [2, 1, 2]
    for name in ["ctc", "seq", "asg"]:
        out = {}
        for impl in [None, "gtn"]:
            if name == "ctc":
                loss = ctc_loss(x.log_softmax(-1), flat, lens, tl, reduction="mean", impl=impl)
            elif name == "seq":
                loss = sequence_loss(x, targets, lens, reduction="sum", impl=impl)
            else:
                loss = asg_loss(x, targets, lens, transitions=tr, reduction="none", impl=impl)
            grads = torch.autograd.grad(loss.sum(), (x, tr), allow_unused=True)
            out[impl] = (loss.detach(), grads)
        torch.testing.assert_close(out[None][0], out["gtn"][0], rtol=1e-4, atol=1e-4)
        for a, b in zip(out[None][1], out["gtn"][1]):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_gtn_pattern_with_engine_standing_in(monkeypatch):
    monkeypatch.setitem(sys.modules, "gtn", lightning_gtn.wfst)
    _compare()


@pytest.mark.skipif(importlib.util.find_spec("gtn") is None, reason="the real gtn package is not installed")
def test_against_real_gtn():
    _compare()


def test_clear_error_without_gtn(monkeypatch):
    monkeypatch.setitem(sys.modules, "gtn", None)  # makes `import gtn` raise ImportError
    with pytest.raises(ImportError, match="impl=None"):
        ctc_loss(torch.randn(1, 3, 3).log_softmax(-1), torch.tensor([[1]]), [3], [1], impl="gtn")
