"""Compiles the package's numba kernels once, before the test workers start.

numba compiles a kernel on its first call for the argument types it sees and caches the result
on disk (``cache=True``). From a fresh checkout the cache is empty, so each pytest-xdist worker
would compile the same kernels again; ``tests/conftest.py`` runs this module first, in
processes of its own (one per group below, side by side), so the workers load the kernels from
the cache instead. Each group calls the public API on tiny inputs in float32 and float64 (the
dtypes the tests use), forward and backward. A failure here is a failure of the test run:
``python -m tests._warmup [group ...]`` exits non-zero with the traceback.
"""

from __future__ import annotations

import sys

# the pytest controller reads GROUPS only (tests/conftest.py): torch is imported by the processes
# that run the groups, not at the top of this module
DTYPES = ("float32", "float64")


def _inputs(dt):
    import torch

    x = torch.randn(2, 6, 5, dtype=dt).log_softmax(-1).requires_grad_()
    return x, torch.tensor([[1, 2], [3, 0]]), torch.tensor([6, 4]), torch.tensor([2, 1])


def _frame_losses():
    import torch

    import lightning_gtn.functional as F

    for name in DTYPES:
        dt = getattr(torch, name)
        x, tg, il, tl = _inputs(dt)
        loss = F.ctc_loss(x, tg, il, tl) + F.sequence_loss(x, tg, il, tl) + F.stc_loss(x, tg, il, tl)
        loss = loss + F.asg_loss(x, tg, il, tl, transitions=torch.zeros(6, 5, dtype=dt, requires_grad=True))
        loss.backward()
        F.viterbi(x.detach(), il)


def _align_mmi():
    import torch

    import lightning_gtn.functional as F

    for name in DTYPES:
        dt = getattr(torch, name)
        x, tg, il, tl = _inputs(dt)
        F.forced_align(x.detach(), tg, il, tl)
        F.forced_align(x.detach(), tg, il, tl, star=-1.0)  # the star kernel, both topologies
        F.forced_align(x.detach(), tg, il, tl, blank=None, star=-1.0)
        den = F.denominator_graph([[1, 2], [3]], 4, order=2, topology="ctc")
        F.mmi_loss(x, tg, il, tl, denominator=den).backward()


def _decoders():
    import torch

    from lightning_gtn.decode import BeamSearchDecoder

    x = torch.randn(2, 6, 4).log_softmax(-1)
    spell = {"a": [[1]], "ab": [[1, 2]], "ba": [[2, 1]], "b": [[2]]}
    BeamSearchDecoder(["_", "a", "b", " "], blank=0, lexicon=spell).decode(x, torch.tensor([6, 4]))
    BeamSearchDecoder(["_", "a", "b", " "], blank=0, lexicon_free=True).decode(x)


def _transducers():
    import torch

    import lightning_gtn.functional as F
    import lightning_gtn.k2 as k2

    for name in DTYPES:
        dt = getattr(torch, name)
        tg, tl, ll = torch.tensor([[1, 2], [3, 0]]), torch.tensor([2, 1]), torch.tensor([4, 3])
        logits = torch.randn(2, 4, 3, 5, dtype=dt, requires_grad=True)
        F.rnnt_loss(logits, tg, ll, tl, blank=0).backward()
        wide = torch.randn(2, 4, 3, 5 + 5, dtype=dt, requires_grad=True)
        F.tdt_loss(wide, tg, ll, tl, blank=0).backward()
        mb = torch.randn(2, 4, 3, 5 + 2, dtype=dt, requires_grad=True)
        F.multiblank_rnnt_loss(mb, tg, ll, tl, blank=0, big_blank_durations=[2, 4], big_blank_ids=[5, 6]).backward()
        F.rnnt_forced_align(logits.detach(), tg, ll, tl, blank=0)
        am = torch.randn(2, 4, 5, dtype=dt, requires_grad=True)
        lm = torch.randn(2, 3, 5, dtype=dt, requires_grad=True)
        boundary = torch.tensor([[0, 0, 2, 4], [0, 0, 1, 3]])
        simple, (px_grad, py_grad) = k2.rnnt_loss_smoothed(
            lm, am, tg, termination_symbol=0, boundary=boundary, return_grad=True
        )
        simple.backward()
        ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range=2)
        pruned = torch.randn(2, 4, 2, 5, dtype=dt, requires_grad=True)
        k2.rnnt_loss_pruned(pruned, tg, ranges, termination_symbol=0, boundary=boundary).backward()


def _graphs():
    import lightning_gtn.wfst as gtn

    for weights in ([0.5, -1.0, 2.0], [0.0, 0.25, -0.5]):
        a = gtn.linear_graph(3, 4, True)
        b = gtn.Graph(True)
        b.add_node(True)
        b.add_node(False, True)
        for label, w in zip((0, 1, 2), weights):
            b.add_arc(0, 1, label, label, w)
        c = gtn.compose(a, gtn.closure(b))
        score = gtn.forward_score(gtn.union([c, b]))
        gtn.backward(score)
        gtn.viterbi_path(gtn.intersect(a, b))
        gtn.viterbi_score(c)
        gtn.remove(gtn.project_input(c))


GROUPS = {
    "frame_losses": _frame_losses,
    "align_mmi": _align_mmi,
    "transducers": _transducers,
    "graphs": _graphs,
    "decoders": _decoders,
}


def main(names) -> None:
    """Runs the named groups (all without names)."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    for name in names or GROUPS:
        GROUPS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
