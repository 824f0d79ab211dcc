"""Lattices (arcs that read any position of a dense tensor): against an independent RNN-T
dynamic programme in plain torch, brute-force path enumeration of graphs built with the wfst API
as a GTN user would, float64 gradcheck, and the errors of bad graphs and inputs."""

import math

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import (
    lattice_loss,
    lattice_viterbi,
    pruned_rnnt_lattice,
    rnnt_lattice,
)

# ---------------------------------------------------------------------------
# independent references
# ---------------------------------------------------------------------------


def rnnt_reference(log_probs, targets, logit_lengths, target_lengths, blank):
    """-log P(y | x) of each example by the textbook alpha recursion over (t, u), in torch
    (autograd gives the gradient); ``log_probs`` is ``(B, T, U + 1, V)``."""
    out = []
    for b in range(log_probs.shape[0]):
        T, U = int(logit_lengths[b]), int(target_lengths[b])
        lp, y = log_probs[b], targets[b]
        alpha = {}
        for t in range(T):
            for u in range(U + 1):
                terms = []
                if t == 0 and u == 0:
                    terms.append(torch.zeros((), dtype=lp.dtype))
                if t > 0:
                    terms.append(alpha[t - 1, u] + lp[t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t, u - 1] + lp[t, u - 1, y[u - 1]])
                alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
        out.append(-(alpha[T - 1, U] + lp[T - 1, U, blank]) if T > 0 else torch.tensor(math.inf, dtype=lp.dtype))
    return torch.stack(out)


def all_paths(g):
    """Every start-to-accept path of an acyclic graph, as lists of arc ids (depth-first)."""
    paths = []

    def walk(n, path):
        if g.is_accept(n):
            paths.append(list(path))
        for a in g.out_arcs(n):
            walk(g.dstnode(a), path + [a])

    for s in g.start():
        walk(s, [])
    return paths


def path_score(g, x, w, path):
    """Score of a path: sum over its arcs of ``x[ilabel]`` (none for -1) plus the arc weight."""
    s = torch.zeros((), dtype=x.dtype)
    for a in path:
        p = g.ilabel(a)
        s = s + w[a] + (x[p] if p >= 0 else 0.0)
    return s


def brute_force(g, x, w, semiring="log"):
    scores = [path_score(g, x, w, p) for p in all_paths(g)]
    if not scores:
        return torch.tensor(-math.inf, dtype=x.dtype)
    s = torch.stack(scores)
    return torch.logsumexp(s, 0) if semiring == "log" else s.max()


# ---------------------------------------------------------------------------
# graphs a GTN user writes
# ---------------------------------------------------------------------------


def user_grid(T, U, V, y, blank, rng, skip=False, one_per_frame=False):
    """An RNN-T-like grid built node by node with GTN's API over a (T, U + 1, V) tensor, with
    random arc weights. ``skip``: also an arc emitting two tokens at once (reading both cells);
    ``one_per_frame``: at most one symbol per frame (an emission moves to the next frame)."""
    g = gtn.Graph()  # calc_grad=True, GTN's default: the weights receive gradients

    def pos(t, u, v):
        return (t * (U + 1) + u) * V + v

    node = {}
    for t in range(T):
        for u in range(U + 1):
            node[t, u] = g.add_node(t == 0 and u == 0)
    final = g.add_node(False, True)
    for t in range(T):
        for u in range(U + 1):
            wt = lambda: float(rng.normal(scale=0.3))  # noqa: E731
            if t + 1 < T:
                g.add_arc(node[t, u], node[t + 1, u], pos(t, u, blank), gtn.epsilon, wt())
            if u < U:
                if one_per_frame:
                    if t + 1 < T:
                        g.add_arc(node[t, u], node[t + 1, u + 1], pos(t, u, y[u]), y[u], wt())
                else:
                    g.add_arc(node[t, u], node[t, u + 1], pos(t, u, y[u]), y[u], wt())
            if skip and u + 2 <= U:  # two tokens in one arc: an epsilon arc then the second cell
                mid = g.add_node()
                g.add_arc(node[t, u], mid, pos(t, u, y[u]), y[u], wt())
                g.add_arc(mid, node[t, u + 2], gtn.epsilon, y[u + 1], wt())
    g.add_arc(node[T - 1, U], final, pos(T - 1, U, blank), gtn.epsilon, 0.0)
    if one_per_frame and U > 0:
        g.add_arc(node[T - 1, U - 1], final, pos(T - 1, U - 1, y[U - 1]), y[U - 1], 0.0)
    return g


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("blank", [0, -1])
def test_rnnt_lattice_equals_plain_torch_rnnt(blank):
    torch.manual_seed(0)
    B, T, U, V = 4, 5, 3, 6
    logits = torch.randn(B, T, U + 1, V, dtype=torch.float64, requires_grad=True)
    bl = blank % V
    targets = torch.randint(0, V - 1, (B, U)) + (1 if bl == 0 else 0)
    ll = torch.tensor([5, 3, 4, 1])
    tl = torch.tensor([3, 2, 0, 1])
    lats = [rnnt_lattice(T, U, targets[b, : tl[b]], V, blank, frames=int(ll[b])) for b in range(B)]
    ref = rnnt_reference(logits.log_softmax(-1), targets, ll, tl, bl)
    got = lattice_loss(logits.log_softmax(-1), lats, reduction="none")
    torch.testing.assert_close(got, ref)
    g_ref = torch.autograd.grad(ref.mean(), logits)[0]
    g_got = torch.autograd.grad(lattice_loss(logits.log_softmax(-1), lats), logits)[0]
    torch.testing.assert_close(g_got, g_ref)
    # float32 in, float32 out, same value
    got32 = lattice_loss(logits.detach().float().log_softmax(-1), lats, reduction="sum")
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), ref.sum().detach(), rtol=1e-5, atol=1e-5)


def test_user_grid_equals_brute_force_values_and_gradients():
    rng = np.random.default_rng(1)
    T, U, V = 3, 2, 4
    y = [1, 3]
    x = torch.randn(2, T * (U + 1) * V, dtype=torch.float64, requires_grad=True)
    graphs = [user_grid(T, U, V, y, 0, rng), user_grid(T, U, V, y, 0, rng, skip=True)]
    for b, g in enumerate(graphs):
        w = torch.tensor(g.weights_to_list(), dtype=torch.float64, requires_grad=True)
        ref = brute_force(g, x[b], w)
        gx_ref, gw_ref = torch.autograd.grad(-ref, (x, w))
        loss = lattice_loss(x, [g, g], reduction="none")[b]
        torch.testing.assert_close(loss, -ref.detach())
        g.zero_grad()
        (gx,) = torch.autograd.grad(loss, x)
        torch.testing.assert_close(gx, gx_ref)
        # the graph's own weights get their gradient as gtn.backward would give it
        np.testing.assert_allclose(g.grad().weights_to_numpy(), gw_ref.numpy(), rtol=1e-5, atol=1e-6)


def test_max_semiring_and_viterbi_equal_the_best_path():
    rng = np.random.default_rng(2)
    T, U, V = 4, 2, 3
    y = [2, 1]
    g = user_grid(T, U, V, y, 0, rng, one_per_frame=True)
    x = torch.randn(3, T, U + 1, V, dtype=torch.float64)
    w = torch.tensor(g.weights_to_list(), dtype=torch.float64)
    best = torch.stack([brute_force(g, x[b].reshape(-1), w, "max") for b in range(3)])
    loss = lattice_loss(x, g, reduction="none", semiring="max")
    torch.testing.assert_close(loss, -best)
    vit = lattice_viterbi(x, g)
    torch.testing.assert_close(vit.scores, best)
    for b in range(3):
        arcs = vit.arcs[b].tolist()
        assert arcs in all_paths(g)
        torch.testing.assert_close(path_score(g, x[b].reshape(-1), w, arcs), best[b])
        assert vit.positions[b].tolist() == [g.ilabel(a) for a in arcs]
        assert [v for v in vit.olabels[b].tolist() if v >= 0] == y  # the tokens the path emits
    # the Viterbi loss's gradient is the best path's indicator
    xg = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad(lattice_loss(xg, g, reduction="sum", semiring="max"), xg)
    ind = torch.zeros_like(x).reshape(3, -1)
    for b in range(3):
        for p in vit.positions[b].tolist():
            if p >= 0:
                ind[b, p] -= 1.0
    torch.testing.assert_close(gx.reshape(3, -1), ind)


def test_one_symbol_per_frame_variant_equals_brute_force():
    rng = np.random.default_rng(3)
    T, U, V = 4, 3, 5
    y = [4, 1, 2]
    g = user_grid(T, U, V, y, 2, rng, one_per_frame=True)
    x = torch.randn(1, T, U + 1, V, dtype=torch.float64)
    w = torch.tensor(g.weights_to_list(), dtype=torch.float64)
    torch.testing.assert_close(lattice_loss(x, g), -brute_force(g, x[0].reshape(-1), w))


def test_gradcheck_float64():
    rng = np.random.default_rng(4)
    T, U, V = 3, 2, 3
    g = user_grid(T, U, V, [1, 2], 0, rng, skip=True)
    g.calc_grad = False
    x = torch.randn(2, T, U + 1, V, dtype=torch.float64, requires_grad=True)
    for reduction in ("none", "mean"):
        assert torch.autograd.gradcheck(lambda t, r=reduction: lattice_loss(t, g, reduction=r), (x,))


def test_pruned_lattice_equals_full_lattice_on_the_band():
    torch.manual_seed(5)
    T, U, V, s_range = 5, 4, 6, 2
    y = [1, 2, 3, 4]
    ranges = np.array([0, 1, 1, 2, 3])
    full = torch.randn(1, T, U + 1, V, dtype=torch.float64)
    pruned = torch.stack([full[0, t, ranges[t] : ranges[t] + s_range] for t in range(T)])[None]
    masked = torch.full_like(full, -math.inf)  # cells outside the band are impossible
    for t in range(T):
        masked[0, t, ranges[t] : ranges[t] + s_range] = full[0, t, ranges[t] : ranges[t] + s_range]
    a = lattice_loss(pruned, pruned_rnnt_lattice(ranges, s_range, y, V, 0))
    k2_ranges = torch.from_numpy(ranges[:, None] + np.arange(s_range))  # k2's (T, s_range) layout
    torch.testing.assert_close(lattice_loss(pruned, pruned_rnnt_lattice(k2_ranges, s_range, y, V, 0)), a)
    with pytest.raises(ValueError, match="ranges"):
        pruned_rnnt_lattice(k2_ranges.flip(1), s_range, y, V, 0)
    b = lattice_loss(masked, rnnt_lattice(T, U, y, V, 0))
    torch.testing.assert_close(a, b)
    assert torch.isfinite(a)
    # a band that covers every label is the full lattice
    wide = pruned_rnnt_lattice(np.zeros(T, dtype=np.int64), U + 1, y, V, 0)
    torch.testing.assert_close(lattice_loss(full, wide), lattice_loss(full, rnnt_lattice(T, U, y, V, 0)))


def test_batched_equals_one_by_one_and_reductions():
    torch.manual_seed(6)
    B, T, U, V = 3, 4, 2, 5
    lp = torch.randn(B, T, U + 1, V, dtype=torch.float64).log_softmax(-1)
    lats = [rnnt_lattice(T, U, [1, 2][:b], V, frames=T - b) for b in range(B)]
    each = torch.stack([lattice_loss(lp[b : b + 1], lats[b]) for b in range(B)])
    torch.testing.assert_close(lattice_loss(lp, lats, reduction="none"), each)
    torch.testing.assert_close(lattice_loss(lp, lats, reduction="sum"), each.sum())
    torch.testing.assert_close(lattice_loss(lp, lats), each.mean())
    # no path: inf, or 0 and zero gradient with zero_infinity
    dead = lats[:2] + [rnnt_lattice(T, U, [1, 2], V, frames=0)]
    assert lattice_loss(lp, dead, reduction="none")[2] == math.inf
    x = lp.clone().requires_grad_()
    out = lattice_loss(x, dead, reduction="none", zero_infinity=True)
    assert out[2] == 0
    (g,) = torch.autograd.grad(out.sum(), x)
    assert bool((g[2] == 0).all()) and bool((g[0] != 0).any())


def test_bad_graphs_and_inputs_raise_value_errors_naming_the_argument():
    x = torch.zeros(2, 3, 4)
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, 12)  # N = 12 positions: 12 is one past the end
    with pytest.raises(ValueError, match="lattices.*position 12.*N=12"):
        lattice_loss(x, g)
    cyc = gtn.Graph(False)
    cyc.add_node(True)
    cyc.add_node(False, True)
    cyc.add_arc(0, 1, 0)
    cyc.add_arc(1, 0, 1)
    with pytest.raises(ValueError, match="cycle"):
        lattice_loss(x, cyc)
    ok = rnnt_lattice(3, 0, [], 4)
    with pytest.raises(ValueError, match="lattices.*B=2"):
        lattice_loss(x, [ok])
    with pytest.raises(ValueError, match="lattices"):
        lattice_loss(x, [ok, "not a graph"])
    bad = x.clone()
    bad[1, 0, 0] = float("nan")  # read by the lattice (t=0, u=0, blank)
    with pytest.raises(ValueError, match="scores contains nan"):
        lattice_loss(bad, ok)
    bad[1, 0, 0] = 0.0
    bad[1, 0, 3] = float("nan")  # never read: fine
    assert torch.isfinite(lattice_loss(bad, ok))
    nanw = gtn.Graph(False)
    nanw.add_node(True)
    nanw.add_node(False, True)
    nanw.add_arc(0, 1, 0, 0, float("nan"))
    with pytest.raises(ValueError, match="lattices.*weight nan"):
        lattice_loss(x, nanw)
    with pytest.raises(ValueError, match="scores"):
        lattice_loss(torch.zeros(3), ok)
    with pytest.raises(ValueError, match="reduction"):
        lattice_loss(x, ok, reduction="avg")
    with pytest.raises(ValueError, match="semiring"):
        lattice_loss(x, ok, semiring="tropical")
    with pytest.raises(ValueError, match=r"^lattice_loss: impl must be None or one of \('numba',\), got 'torch'$"):
        lattice_loss(x, ok, impl="torch")
    with pytest.raises(ValueError, match="targets"):
        rnnt_lattice(3, 2, [0, 1], 4, blank=0)  # the blank is not a target
    with pytest.raises(ValueError, match="blank"):
        rnnt_lattice(3, 2, [1], 4, blank=4)
    with pytest.raises(ValueError, match="frames"):
        rnnt_lattice(3, 2, [1], 4, frames=4)


def test_every_lattice_loss_goes_through_apply_loss_once(apply_loss_calls):
    from lightning_gtn.core.lattice import LATTICE_BACKENDS
    from lightning_gtn.functional import LatticeCriterion, lattice_criterion_loss, rnnt_lattice_loss
    from lightning_gtn.losses import lattice

    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64)
    targets, ll, tl = torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]), torch.tensor([2, 1])
    lats = [rnnt_lattice(4, 2, [1, 2], 5), rnnt_lattice(4, 2, [3], 5, frames=3)]
    crit = LatticeCriterion(lambda t, f, shape: rnnt_lattice(shape[0], shape[1] - 1, t, shape[2], 0, frames=f))
    lp = logits.log_softmax(-1)
    fns = {
        "lattice_loss": lambda: lattice_loss(lp, lats, "none"),
        "lattice_criterion_loss": lambda: lattice_criterion_loss(lp, targets, ll, tl, criterion=crit, reduction="none"),
        "rnnt_lattice_loss": lambda: rnnt_lattice_loss(logits, targets, ll, tl, blank=0, reduction="none"),
    }
    assert set(fns) == {n for n in lattice.__all__ if n.endswith("_loss")}
    want = {name: fn() for name, fn in fns.items()}
    torch.testing.assert_close(want["lattice_criterion_loss"], want["lattice_loss"])
    for name, fn in fns.items():
        apply_loss_calls.clear()
        got = fn()
        seen = [c for c, _ in apply_loss_calls]
        assert len(seen) == 1, name
        assert seen[0].picker is LATTICE_BACKENDS, name
        assert torch.isfinite(got).all() and torch.equal(got, want[name]), name
    assert LATTICE_BACKENDS.offered == ("numba",)
    assert LATTICE_BACKENDS.default("cpu") == "numba"


def test_rnnt_lattice_loss_custom_op_equals_reference_and_compiles_fullgraph():
    from lightning_gtn.functional import rnnt_lattice_loss

    torch.manual_seed(7)
    B, T, U, V = 3, 4, 2, 5
    logits = torch.randn(B, T, U + 1, V, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V - 1, (B, U))  # blank = -1 = V - 1
    ll, tl = torch.tensor([4, 2, 3]), torch.tensor([2, 1, 0])
    ref = rnnt_reference(logits.log_softmax(-1), targets, ll, tl, V - 1)
    got = rnnt_lattice_loss(logits, targets, ll, tl, reduction="none")
    torch.testing.assert_close(got, ref)
    ref0 = ref.detach()
    g_out = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(got, logits, g_out)[0], torch.autograd.grad(ref, logits, g_out)[0])
    # aot_eager: dynamo (fullgraph: no graph break around the op) and AOT autograd, without inductor's build time
    step = torch.compile(lambda x: rnnt_lattice_loss(x, targets, ll, tl) * 2.0, fullgraph=True, backend="aot_eager")
    out = step(logits)
    ref = rnnt_reference(logits.log_softmax(-1), targets, ll, tl, V - 1).mean() * 2.0
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out, logits)[0], torch.autograd.grad(ref, logits)[0])
    # a user's builder through the same op: values, and the op's registration (opcheck)
    from lightning_gtn.core.lattice import lattice_loss_op
    from lightning_gtn.functional import LatticeCriterion, lattice_criterion_loss

    def build(target, frames, shape, blank):
        T_, U1, V_ = shape
        return rnnt_lattice(T_, U1 - 1, target, V_, blank, frames=frames)

    crit = LatticeCriterion(build, {"blank": V - 1}, blank=V - 1)
    lp = logits.log_softmax(-1)
    torch.testing.assert_close(lattice_criterion_loss(lp, targets, ll, tl, criterion=crit, reduction="none"), ref0)
    args = (lp.detach().requires_grad_(), targets, ll, tl, crit.handle, "none", False, "log", True)
    torch.library.opcheck(lattice_loss_op, args)  # schema, fake tensor, autograd registration
    with pytest.raises(ValueError, match="logit_lengths|input_lengths"):
        rnnt_lattice_loss(logits, targets, torch.tensor([5, 2, 3]), tl)
    with pytest.raises(ValueError, match="targets"):
        rnnt_lattice_loss(logits, torch.full((B, U), V - 1), ll, tl)  # the blank is not a target


@pytest.mark.parametrize("blank", [0, -1])
def test_lattice_path_equals_the_specialised_rnnt_loss(blank):
    from lightning_gtn.functional import rnnt_lattice_loss, rnnt_loss

    torch.manual_seed(8)
    B, T, U, V = 3, 6, 3, 7
    logits = torch.randn(B, T, U + 1, V, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V - 1, (B, U)) + (1 if blank == 0 else 0)
    ll, tl = torch.tensor([6, 4, 5]), torch.tensor([3, 3, 1])
    for reduction in ("none", "mean", "sum"):
        a = rnnt_lattice_loss(logits, targets, ll, tl, blank=blank, reduction=reduction)
        b = rnnt_loss(logits, targets, ll, tl, blank=blank, reduction=reduction)
        torch.testing.assert_close(a, b)
    ga = torch.autograd.grad(rnnt_lattice_loss(logits, targets, ll, tl, blank=blank), logits)[0]
    gb = torch.autograd.grad(rnnt_loss(logits, targets, ll, tl, blank=blank), logits)[0]
    torch.testing.assert_close(ga, gb)


def random_dag(rng, num_nodes, num_arcs, N):
    """A random acyclic graph whose node ids are shuffled (not a topological order), with
    epsilon arcs, several start and accept nodes, random weights and positions in [0, N)."""
    rank = rng.permutation(num_nodes)  # node i sits at rank[i] of a hidden order
    g = gtn.Graph()
    for i in range(num_nodes):
        g.add_node(bool(rank[i] < 2), bool(rank[i] >= num_nodes - 2))
    by_rank = np.argsort(rank)
    for _ in range(num_arcs):
        r0, r1 = sorted(rng.choice(num_nodes, 2, replace=False))
        p = int(rng.integers(N)) if rng.random() > 0.2 else gtn.epsilon
        g.add_arc(int(by_rank[r0]), int(by_rank[r1]), p, p, float(rng.normal()))
    return g


def test_random_dags_equal_the_wfst_engine_scores_and_gradients():
    rng = np.random.default_rng(9)
    N = 6
    for _ in range(4):
        g = random_dag(rng, 7, 14, N)
        x = torch.randn(1, N, dtype=torch.float64)
        # the engine's reference: the same graph with each arc's weight = x[position] + weight
        wx = [g.weight(a) + (float(x[0, g.ilabel(a)]) if g.ilabel(a) >= 0 else 0.0) for a in range(g.num_arcs())]
        h = gtn.Graph.from_arrays(
            g.num_nodes(), g.start(), g.accept(), *[g.arrays()[k] for k in (3, 4, 5, 6)], weights=wx
        )
        fs = gtn.forward_score(h)
        gtn.backward(fs)
        occ = np.asarray(h.grad().weights_to_list())
        xg = x.clone().requires_grad_()
        g.zero_grad()
        loss = lattice_loss(xg, g, reduction="sum")
        (gx,) = torch.autograd.grad(loss, xg)
        np.testing.assert_allclose(-loss.item(), fs.item(), rtol=1e-5, atol=1e-5)
        expect = np.zeros(N)
        for a in range(g.num_arcs()):
            if g.ilabel(a) >= 0:
                expect[g.ilabel(a)] -= occ[a]
        np.testing.assert_allclose(gx[0].numpy(), expect, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(g.grad().weights_to_numpy(), -occ, rtol=1e-4, atol=1e-5)
        vs = gtn.viterbi_score(h).item()
        np.testing.assert_allclose(lattice_viterbi(x, g).scores.item(), vs, rtol=1e-5, atol=1e-5)


def test_chunks_on_the_thread_pool_equal_one_thread():
    from lightning_gtn.wfst.parallel import get_num_threads, set_num_threads

    torch.manual_seed(10)
    B, T, U, V = 6, 200, 40, 4  # enough arcs for the kernel to split the batch into chunks
    lp = torch.randn(B, T, U + 1, V, dtype=torch.float64).log_softmax(-1)
    lats = [rnnt_lattice(T, U, torch.randint(1, V, (U - b,)), V, 0, frames=T - b) for b in range(B)]
    before = get_num_threads()
    out = {}
    try:
        for n in (1, 3):
            set_num_threads(n)
            x = lp.clone().requires_grad_()
            loss = lattice_loss(x, lats, reduction="none")
            out[n] = (loss.detach(), torch.autograd.grad(loss.sum(), x)[0])
    finally:
        set_num_threads(before)
    torch.testing.assert_close(out[3][0], out[1][0], rtol=0, atol=0)
    torch.testing.assert_close(out[3][1], out[1][1], rtol=0, atol=0)


def ctc_graph(target, blank):
    """CTC's criterion graph written as in GTN's tutorial: node 2i is a blank, 2i+1 token i."""
    g = gtn.Graph(False)
    L = 2 * len(target) + 1
    for n in range(L):
        g.add_node(n == 0, n >= L - 2)
    for n in range(L):
        lab = target[(n - 1) // 2] if n % 2 else blank
        g.add_arc(n, n, lab)
        if n > 0:
            g.add_arc(n - 1, n, lab)
        if n % 2 and n > 1 and lab != target[(n - 1) // 2 - 1]:
            g.add_arc(n - 2, n, lab)
    return g


def test_criterion_graphs_unrolled_into_lattices_equal_the_frame_synchronous_losses():
    from lightning_gtn.functional import ctc_loss, frame_lattice, graph_loss

    torch.manual_seed(11)
    B, T, C = 3, 6, 4
    lp = torch.randn(B, T, C, dtype=torch.float64).log_softmax(-1).requires_grad_()
    targets = [[1, 1], [2, 3, 1], []]
    il = torch.tensor([6, 5, 3])
    lats = [frame_lattice(ctc_graph(t, 0), int(il[b]), C) for b, t in enumerate(targets)]
    got = lattice_loss(lp, lats, reduction="none")
    ref = ctc_loss(lp, targets, il, torch.tensor([2, 3, 0]), blank=0, reduction="none")
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), lp)[0], torch.autograd.grad(ref.sum(), lp)[0])
    # a graph with an epsilon arc and weights, against graph_loss
    g = gtn.Graph(False)
    g.add_node(True)
    g.add_node()
    g.add_node(False, True)
    g.add_arc(0, 0, 1, 1, 0.3)
    g.add_arc(0, 1, 2, 2, -0.2)
    g.add_arc(1, 2, gtn.epsilon, gtn.epsilon, 0.5)
    g.add_arc(2, 2, 3, 3, 0.1)
    a = lattice_loss(lp, [frame_lattice(g, int(n), C) for n in il], reduction="none")
    torch.testing.assert_close(a, graph_loss(lp, graphs=g, input_lengths=il, reduction="none"))
    with pytest.raises(ValueError, match="label 3 out of range"):
        frame_lattice(g, 2, 3)


def test_class_count_keyword_is_num_classes_and_the_old_one_warns():
    from lightning_gtn.functional import frame_lattice, pruned_rnnt_lattice, rnnt_lattice
    from lightning_gtn.wfst.criterion import ctc_graph

    def same(a, b):
        return a.num_nodes() == b.num_nodes() and a.labels_to_list() == b.labels_to_list()

    g = ctc_graph([1, 2], 0)
    for new, old in (
        (lambda: rnnt_lattice(3, 2, [1, 2], num_classes=4), lambda: rnnt_lattice(3, 2, [1, 2], V=4)),
        (
            lambda: pruned_rnnt_lattice([0, 0, 1], 2, [1, 2], num_classes=4),
            lambda: pruned_rnnt_lattice([0, 0, 1], 2, [1, 2], V=4),
        ),
        (lambda: frame_lattice(g, 3, num_classes=3), lambda: frame_lattice(g, 3, C=3)),
    ):
        with pytest.warns(DeprecationWarning, match="use num_classes="):
            assert same(old(), new())
    with pytest.raises(TypeError, match="give num_classes= only"):
        rnnt_lattice(3, 2, [1, 2], num_classes=4, V=4)
