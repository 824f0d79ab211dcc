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


@pytest.mark.parametrize("leaky", [0.0, 0.2])
def test_every_column_block_width_gives_the_same_scores(leaky):
    """A chunk of 56 rows runs its columns as blocks of 32, 16 and 8 (each width its own code,
    with its sums kept in registers); eight chunks of 7 rows run blocks of 8 only. Both against
    float64."""
    rng = np.random.default_rng(11)
    sg = shared_graph(random_graph(rng, 7, 40, 6))
    E = rng.normal(size=(56, 9, 6))
    lens = rng.integers(0, 10, size=56)
    ref = mmi_numba.shared_scores(sg, E, lens, leaky, need_e=True)
    for threads, rows in ((1, 64), (8, 1)):
        x = E.astype(np.float32)
        got = mmi_numba.shared_scores(sg, x, lens, leaky, need_e=True, threads=threads, min_rows=rows)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=2e-5)
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
    out = _exp_all(x)  # simd.vexp inside a compiled loop, as the kernel calls it
    ok = x > -87.0
    np.testing.assert_allclose(out[ok], ref[ok], rtol=5e-7, atol=0)  # numpy float32 exp: 2e-7
    assert (out[~ok] == 0.0).all()


def _exp_all(x):
    from numba import njit

    from lightning_gtn.kernels.simd import LANES, vexp, vload, vstore

    @njit
    def run(x, out):
        for k in range(0, x.shape[0], LANES):
            vstore(out, k, vexp(vload(x, k)))

    n = -(-len(x) // 8) * 8
    xp = np.zeros(n, dtype=x.dtype)
    xp[: len(x)] = x
    out = np.empty_like(xp)
    run(xp, out)
    return out[: len(x)]


def _bigram(topology, N, seed):
    """A token bigram (each history keeps about half of the N tokens) in ``topology``."""
    from lightning_gtn.core.topologies import compose_token_acceptor

    rng = np.random.default_rng(seed)
    allowed = rng.random((N + 1, N)) < 0.5
    allowed[np.arange(N + 1), rng.integers(0, N, N + 1)] = True
    nxt = np.where(allowed, np.arange(1, N + 1)[None, :], -1)
    nxt = np.concatenate([np.full((N + 1, 1), -1), nxt], axis=1).astype(np.int64)
    logp = np.log(rng.dirichlet(np.ones(N + 1), size=N + 1))
    return compose_token_acceptor(N, topology, nxt, logp, 0, np.ones(N + 1, dtype=bool))


def test_shared_sources_are_summed_once_in_the_factored_graph():
    sg = compile_shared(_bigram("ctc", 6, 0))
    f = sg.factored()
    assert f is not sg and f.factored() is f and f.num_real == sg.num_states
    H = f.num_states - f.num_real
    assert H > 0 and f.num_arcs < 0.75 * sg.num_arcs
    assert np.diff(f.virt_off).min() >= 2  # every sum node has two or more members
    assert f.virt_member.max() < f.num_real and f.real_virt.min() >= f.num_real
    # the two CSR views agree: member m of sum node h <=> h listed for m
    pairs = {(int(m), f.num_real + h) for h in range(H) for m in f.virt_member[f.virt_off[h] : f.virt_off[h + 1]]}
    listed = {(s, int(v)) for s in range(f.num_real) for v in f.real_virt[f.real_virt_off[s] : f.real_virt_off[s + 1]]}
    assert pairs == listed
    assert (np.diff(f.state_off)[f.num_real :] == 0).all()  # no arc enters a sum node
    # arcs of the original graph = arcs kept + each sum node's arcs times its members
    per_node = np.diff(f.src_off)
    assert sg.num_arcs == per_node[: f.num_real].sum() + (per_node[f.num_real :] * np.diff(f.virt_off)).sum()
    leak = f.leak_distribution()
    np.testing.assert_array_equal(leak[: f.num_real], sg.leak_distribution())
    assert (leak[f.num_real :] == 0).all()
    # random weights share no sources: nothing to factor
    g = random_graph(np.random.default_rng(3), 6, 30, 5)
    assert compile_shared(g).factored().num_states == 6


@pytest.mark.parametrize("topology", ["ctc", "modified_ctc", "hmm1", "hmm2"])
@pytest.mark.parametrize("leaky,checkpoint", [(0.0, None), (0.2, 3)])
def test_factored_graph_scores_equal_the_graph_as_it_is(topology, leaky, checkpoint):
    sg = compile_shared(_bigram(topology, 5, 1))
    C = 6 if topology != "hmm2" else 11
    C = max(C, sg.max_label + 1)
    E = np.random.default_rng(2).normal(size=(11, 9, C))
    lens = np.array([9, 1, 4, 9, 0, 7, 2, 9, 5, 3, 8])
    # need_w scores the graph as it is; without it, the factored graph
    ref = mmi_numba.shared_scores(sg, E, lens, leaky, need_e=True, need_w=True, checkpoint=checkpoint)
    got = mmi_numba.shared_scores(sg, E, lens, leaky, need_e=True, checkpoint=checkpoint, threads=2, min_rows=4)
    # CTC and the two-state HMM enter a token's state from two states of each history (a token and
    # the blank or second state after it): those factor; modified CTC and the one-state HMM do not
    assert (sg.factored().num_arcs < sg.num_arcs) == (topology in ("ctc", "hmm2"))
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], ref[1], atol=1e-12)
    got32 = mmi_numba.shared_scores(sg, E.astype(np.float32), lens, leaky, need_e=True, checkpoint=checkpoint)
    np.testing.assert_allclose(got32[0], ref[0], rtol=2e-5)
    np.testing.assert_allclose(got32[1], ref[1], atol=2e-5)


def test_a_sum_node_of_three_states_and_a_state_in_two_sum_nodes():
    # states 1, 2, 3 each go to 4 (label 1, weight -0.5) and to 5 (label 2, weight -1); 1 and 2 also
    # to 6 and 7 (labels 1 and 2, weight -2): sum nodes {1, 2, 3} and {1, 2}
    g = gtn.Graph(True)
    for i in range(8):
        g.add_node(i == 0, i >= 4)
    for s in (1, 2, 3):
        g.add_arc(0, s, s, s, 0.1 * s)
        g.add_arc(s, 4, 1, 1, -0.5)
        g.add_arc(s, 5, 2, 2, -1.0)
    for s in (1, 2):
        g.add_arc(s, 6, 1, 1, -2.0)
        g.add_arc(s, 7, 2, 2, -2.0)
    for s in (4, 5, 6, 7):
        g.add_arc(s, s, 3, 3, -0.3)
        g.add_arc(s, 1, 1, 1, -0.7)
    sg = compile_shared(g)
    f = sg.factored()
    members = sorted(
        tuple(sorted(f.virt_member[f.virt_off[h] : f.virt_off[h + 1]])) for h in range(len(f.virt_off) - 1)
    )
    assert members == [(1, 2), (1, 2, 3)]
    E = torch.randn(3, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    lens = np.array([3, 2, 2])  # brute force walks 21^L arc sequences
    logz, gE, _ = mmi_numba.shared_scores(sg, E.numpy(), lens, 0.1, need_e=True)
    init = sg.leak_distribution()
    for b in range(3):
        e = E[b].clone().requires_grad_()
        ref = brute_logz(g, e, int(lens[b]), 0.1, init)
        assert abs(logz[b] - ref.item()) < 1e-10
        np.testing.assert_allclose(gE[b], torch.autograd.grad(ref, e)[0].numpy(), atol=1e-10)


def test_graphs_above_the_factoring_bound_run_as_they_are(monkeypatch):
    import lightning_gtn.core.shared_graph as shared

    monkeypatch.setattr(shared, "FACTOR_MAX_ARCS", 40)  # the search is a Python loop over the arcs: bounded
    sg = compile_shared(_bigram("ctc", 6, 0))
    assert sg.num_arcs > 40 and sg.factored() is sg
    monkeypatch.setattr(shared, "FACTOR_MAX_ARCS", 1 << 20)
    assert compile_shared(_bigram("ctc", 6, 0)).factored().num_arcs < sg.num_arcs
