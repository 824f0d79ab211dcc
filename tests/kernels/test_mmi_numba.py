"""The shared-graph kernels (numba and torch) against a brute-force enumeration of all paths.

The reference enumerates every sequence of ``L`` arcs of a small graph (start to accept, one arc
per frame) in torch, so autograd gives the reference gradients for the emissions and the arc
weights. The leaky HMM is enumerated from its definition: between two frames the path either
follows the graph (the next arc leaves the state the last one entered) or leaks, with weight
``leaky * init[state the next arc leaves]``, both counted.
"""

import itertools
import math

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.core.shared_graph import compile_shared, shared_graph
from lightning_gtn.kernels import mmi_numba, mmi_torch


def random_graph(rng, S, A, C, calc_grad=False):
    g = gtn.Graph(calc_grad)
    for i in range(S):
        g.add_node(i == 0 or (S > 3 and i == 1), i >= S - 2)
    for _ in range(A):
        lab = int(rng.integers(C))
        g.add_arc(int(rng.integers(S)), int(rng.integers(S)), lab, lab, float(rng.normal()))
    return g


def brute_logz(g, E, L, leaky=0.0, init=None, w=None):
    """log of the sum over all arc sequences of length ``L`` (torch, differentiable in ``E``
    ``(L, C)`` and the weights ``w``)."""
    a = g.arrays()
    w = torch.as_tensor(a.weights, dtype=E.dtype) if w is None else w
    start, accept = set(a.start.tolist()), set(a.accept.tolist())
    if L == 0:
        n = len(start & accept)
        return torch.tensor(math.log(n) if n else -math.inf, dtype=E.dtype)
    terms = []
    for seq in itertools.product(range(len(a.src)), repeat=L):
        if a.src[seq[0]] not in start or a.dst[seq[-1]] not in accept:
            continue
        coef = 1.0
        for p, q in zip(seq, seq[1:]):
            coef *= (1.0 if a.dst[p] == a.src[q] else 0.0) + (leaky * init[a.src[q]] if leaky else 0.0)
        if coef == 0.0:
            continue
        terms.append(sum(w[k] + E[t, a.ilabel[k]] for t, k in enumerate(seq)) + math.log(coef))
    if not terms:
        return torch.tensor(-math.inf, dtype=E.dtype)
    return torch.logsumexp(torch.stack(terms), 0)


@pytest.mark.parametrize("leaky", [0.0, 0.25])
@pytest.mark.parametrize("checkpoint", [None, 2])
def test_values_and_gradients_equal_brute_force(leaky, checkpoint):
    rng = np.random.default_rng(0)
    C = 3
    g = random_graph(rng, 4, 7, C)
    sg = shared_graph(g)
    lens = np.array([4, 0, 3, 1, 4])
    E = torch.randn(5, 4, C, dtype=torch.float64)
    logz, gE, gW = mmi_numba.shared_scores(sg, E.numpy(), lens, leaky, need_e=True, need_w=True, checkpoint=checkpoint)
    init = sg.leak_distribution()
    for b in range(5):
        e = E[b].clone().requires_grad_()
        w = torch.as_tensor(g.weights_to_numpy(), dtype=torch.float64).requires_grad_()
        ref = brute_logz(g, e, int(lens[b]), leaky, init, w)
        if not torch.isfinite(ref):
            assert logz[b] == -np.inf and not gE[b].any() and not gW[b].any()
            continue
        assert abs(logz[b] - ref.item()) < 1e-10
        re, rw = torch.autograd.grad(ref, (e, w), allow_unused=True)
        np.testing.assert_allclose(gE[b], re.numpy() if re is not None else 0.0, atol=1e-10)
        np.testing.assert_allclose(gW[b], rw.numpy(), atol=1e-10)
        assert not gE[b, lens[b] :].any()  # frames past the row's length get nothing


@pytest.mark.parametrize("leaky", [0.0, 0.25])
def test_frames_whose_sums_leave_the_scale_range_are_renormalised(leaky):
    # class 0 dominates every frame by e^40 but no arc reads it: each frame's sum is about e^-40
    # (below SCALE_RANGE's 2^-30), so the kernel's explicit renormalisation of alpha and beta runs
    # at every frame instead of folding 1 / sum into the next frame's emissions
    rng = np.random.default_rng(5)
    g = gtn.Graph(True)
    for i in range(4):
        g.add_node(i == 0, i >= 2)
    for src, dst, lab in ((0, 1, 1), (1, 2, 2), (2, 3, 1), (1, 1, 1), (2, 2, 2), (3, 2, 1), (1, 3, 2)):
        g.add_arc(src, dst, lab, lab, float(rng.normal()))
    sg = shared_graph(g)
    E = torch.randn(3, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    E[:, :, 0] += 40.0
    lens = np.array([4, 3, 2])
    logz, gE, gW = mmi_numba.shared_scores(sg, E.numpy(), lens, leaky, need_e=True, need_w=True)
    init = sg.leak_distribution()
    for b in range(3):
        e = E[b].clone().requires_grad_()
        w = torch.as_tensor(g.weights_to_numpy(), dtype=torch.float64).requires_grad_()
        ref = brute_logz(g, e, int(lens[b]), leaky, init, w)
        assert torch.isfinite(ref) and abs(logz[b] - ref.item()) < 1e-9
        re, rw = torch.autograd.grad(ref, (e, w))
        np.testing.assert_allclose(gE[b], re.numpy(), atol=1e-10)
        np.testing.assert_allclose(gW[b], rw.numpy(), atol=1e-10)
    f32 = mmi_numba.shared_scores(sg, E.numpy().astype(np.float32), lens, leaky, need_e=True)
    # log Z is a difference of terms of about 40 per frame here: float32 keeps it to ~40 * 2^-24 per frame
    np.testing.assert_allclose(f32[0], logz, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(f32[1], gE, atol=1e-5)


def test_float32_matches_float64_and_chunking_does_not_matter():
    rng = np.random.default_rng(1)
    g = random_graph(rng, 6, 30, 5)
    sg = shared_graph(g)
    E = np.random.default_rng(2).normal(size=(9, 12, 5))
    lens = np.array([12, 5, 7, 12, 0, 1, 11, 12, 3])
    ref = mmi_numba.shared_scores(sg, E, lens, 0.1, need_e=True)
    for threads, rows in ((1, 32), (3, 1)):
        got = mmi_numba.shared_scores(sg, E.astype(np.float32), lens, 0.1, threads=threads, min_rows=rows)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
        np.testing.assert_allclose(got[1], ref[1], atol=1e-5)


@pytest.mark.parametrize("leaky", [0.0, 0.3])
def test_torch_path_equals_numba(leaky):
    rng = np.random.default_rng(3)
    g = random_graph(rng, 5, 20, 4)
    sg = compile_shared(g)
    E = torch.randn(4, 6, 4, dtype=torch.float64)
    lens = np.array([6, 2, 0, 5])
    a = mmi_numba.shared_scores(sg, E.numpy(), lens, leaky, need_e=True, need_w=True)
    b = mmi_torch.shared_scores(sg, E, lens, leaky, need_e=True, need_w=True)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y.numpy(), atol=1e-12)


def test_nan_and_dead_rows():
    g = gtn.Graph(False)
    g.add_node(True, False)
    g.add_node(False, True)
    g.add_arc(0, 1, 0, 0, 0.0)
    g.add_arc(1, 1, 1, 1, 0.0)
    sg = shared_graph(g)
    E = np.zeros((4, 3, 2))
    E[0, 1, 0] = np.nan  # read: NaN out
    E[1, 2, :] = np.nan  # past the row's length: ignored
    E[2, 1, :] = -np.inf  # a frame without any class: no path
    lens = np.array([3, 2, 3, 3])
    logz, gE, _ = mmi_numba.shared_scores(sg, E, lens)
    assert np.isnan(logz[0]) and logz[1] == 0.0 and logz[2] == -np.inf and logz[3] == 0.0
    assert not gE[2].any() and not gE[0].any()
    np.testing.assert_allclose(gE[3], [[1, 0], [0, 1], [0, 1]])
    t = mmi_torch.shared_scores(sg, torch.from_numpy(E), lens)
    np.testing.assert_array_equal(np.isnan(t[0].numpy()), np.isnan(logz))
    np.testing.assert_allclose(t[0].numpy()[1:], logz[1:])


def test_leak_distribution_is_the_averaged_walk():
    g = gtn.Graph(False)  # 0 -> 1 -> 0 ...: the walk alternates, its average is uniform
    g.add_node(True, True)
    g.add_node(False, True)
    g.add_arc(0, 1, 0)
    g.add_arc(1, 0, 0)
    np.testing.assert_allclose(compile_shared(g).leak_distribution(), [0.5, 0.5])


def test_compiled_graph_cache_and_checks():
    g = random_graph(np.random.default_rng(4), 3, 5, 3)
    a = shared_graph(g)
    assert shared_graph(g) is a
    g.set_weight(0, 5.0)  # a changed graph compiles again
    b = shared_graph(g)
    assert b is not a and b.shift == 5.0
    with pytest.raises(ValueError, match=r"label 2 out of range.*C=2"):
        b.check_classes(2)
    eps = gtn.Graph(False)
    eps.add_node(True, True)
    eps.add_arc(0, 0, gtn.epsilon)
    with pytest.raises(ValueError, match="epsilon"):
        shared_graph(eps)
    bad = gtn.Graph(False)
    bad.add_node(True, True)
    bad.add_arc(0, 0, 0, 0, float("nan"))
    with pytest.raises(ValueError, match="finite"):
        shared_graph(bad)
    with pytest.raises(TypeError):
        shared_graph("not a graph")


def test_float32_exp_is_accurate_and_zero_below_the_normal_range():
    x = np.concatenate([-np.linspace(0.0, 86.0, 2001), [-1e-7, -87.5, -200.0, -np.inf]]).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    out = _exp_all(x)  # inside a compiled loop, as the kernel calls it
    ok = x > -87.0
    np.testing.assert_allclose(out[ok], ref[ok], rtol=5e-7, atol=0)  # numpy float32 exp: 2e-7
    assert (out[~ok] == 0.0).all()


def _exp_all(x):
    from numba import njit

    @njit
    def run(x, out):
        for i in range(x.shape[0]):
            out[i] = mmi_numba.exp_f32(x[i])

    out = np.empty_like(x)
    run(x, out)
    return out
