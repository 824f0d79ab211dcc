"""The shared numba transducer lattice against brute-force enumeration of every path on tiny
grids (each set of arc kinds the engine uses, both semirings, boundaries), and its posteriors
against autograd through a materialised torch recursion in float64."""

import itertools
import math

import numpy as np
import pytest
import torch

from lightning_gtn.kernels.transducer_lattice_numba import transducer_lattice

# (di, dj) per kind; the axes are (frame, label) for the RNN-T forms and (symbol, frame) for k2's
KINDS = {
    "rnnt": ([1, 0], [0, 1]),  # blank, token
    "k2_modified": ([1, 0], [1, 1]),  # px (1, 1), py (0, 1)
    "multiblank": ([0, 1, 2, 3], [1, 0, 0, 0]),  # token, blank, big blanks 2 and 3
    "tdt": ([0, 1, 2, 1, 2], [1, 1, 1, 0, 0]),  # tokens of durations 0..2, blanks 1..2
}


def _paths(di, dj, i0, j0, i1, j1):
    """Every path from (i0, j0) to (i1, j1) as a list of arcs (i, j, k)."""
    out = []

    def walk(i, j, arcs):
        if (i, j) == (i1, j1):
            out.append(list(arcs))
            return
        for k in range(len(di)):
            i2, j2 = i + di[k], j + dj[k]
            if i2 <= i1 and j2 <= j1:
                arcs.append((i, j, k))
                walk(i2, j2, arcs)
                arcs.pop()

    if i1 >= i0 and j1 >= j0:
        walk(i0, j0, [])
    return out


def _brute(planes, di, dj, bnd, semiring):
    """Totals and posteriors by enumerating every path of every example."""
    B = bnd.shape[0]
    total = np.full(B, -math.inf)
    post = [np.zeros_like(p) for p in planes]
    for b in range(B):
        paths = _paths(di, dj, *bnd[b])
        if not paths:
            continue
        sc = np.array([sum(planes[k][b, i, j] for i, j, k in p) for p in paths])
        if semiring == "max":
            best = int(np.argmax(sc))
            total[b] = sc[best]
            if sc[best] == -math.inf:  # no path with a finite score: no best path
                continue
            for i, j, k in paths[best]:
                post[k][b, i, j] = 1.0
            continue
        m = sc.max()
        if m == -math.inf:
            continue
        total[b] = m + math.log(np.exp(sc - m).sum())
        for p, s in zip(paths, sc):
            for i, j, k in p:
                post[k][b, i, j] += math.exp(s - total[b])
    return total, post


def _case(kind, seed, B=4, I=5, J=4, neg=False):  # noqa: E741
    rng = np.random.default_rng(seed)
    di, dj = KINDS[kind]
    if kind == "k2_modified":  # every symbol takes a frame: more frames than symbols, so paths exist
        I, J = J, I + 1  # noqa: E741
    planes = [rng.normal(size=(B, I, J)) for _ in di]
    if neg:  # some impossible arcs
        for p in planes:
            p[rng.random(p.shape) < 0.2] = -math.inf
    bnd = np.array([[0, 0, I - 1, J - 1], [1, 0, I - 1, J - 2], [0, 1, I - 2, J - 1], [2, 1, 3, 3]])[:B]
    return planes, di, dj, bnd


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("semiring", ["log", "log_checked", "max"])
@pytest.mark.parametrize("neg", [False, True])
def test_equals_brute_force_enumeration(kind, semiring, neg):
    planes, di, dj, bnd = _case(kind, seed=len(kind) + 7 * neg, neg=neg)
    tot, post, path = transducer_lattice(planes, di, dj, bnd, semiring)
    want, want_post = _brute(planes, di, dj, bnd, "max" if semiring == "max" else "log")
    np.testing.assert_allclose(tot, want, rtol=1e-12)
    for k in range(len(di)):
        np.testing.assert_allclose(post[k], want_post[k], rtol=1e-10, atol=1e-14)
    if semiring == "max":  # the path: contiguous arcs from the start to the end that add up to the total
        assert path is not None
        for b in range(bnd.shape[0]):
            arcs = [tuple(r) for r in path[b] if r[0] >= 0]
            if tot[b] == -math.inf:
                assert arcs == []
                continue
            i, j = bnd[b, 0], bnd[b, 1]
            s = 0.0
            for ai, aj, k in arcs:
                assert (ai, aj) == (i, j)
                s += planes[k][b, ai, aj]
                i, j = ai + di[k], aj + dj[k]
            assert (i, j) == (bnd[b, 2], bnd[b, 3])
            assert s == pytest.approx(tot[b], rel=1e-12)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_from_end_and_without_posteriors_give_the_same_total(kind):
    planes, di, dj, bnd = _case(kind, seed=3)
    a, _, _ = transducer_lattice(planes, di, dj, bnd, "log", need_post=False)
    b, post_b, _ = transducer_lattice(planes, di, dj, bnd, "log", need_post=True, from_end=True)
    _, post_a, _ = transducer_lattice(planes, di, dj, bnd, "log", need_post=True)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    for pa, pb in zip(post_a, post_b):
        np.testing.assert_allclose(pa, pb, rtol=1e-10, atol=1e-14)


def _torch_total(planes, di, dj, i0, j0, i1, j1, semiring):
    """The recursion materialised node by node in torch (autograd gives the posteriors)."""
    alpha = {(i0, j0): torch.zeros((), dtype=torch.float64)}
    for i in range(i0, i1 + 1):
        for j in range(j0, j1 + 1):
            if (i, j) == (i0, j0):
                continue
            terms = [
                alpha[(i - di[k], j - dj[k])] + planes[k][i - di[k], j - dj[k]]
                for k in range(len(di))
                if i - di[k] >= i0 and j - dj[k] >= j0 and alpha[(i - di[k], j - dj[k])].item() > -math.inf
            ]  # unreachable predecessors left out (logsumexp of -inf only has a NaN gradient)
            if not terms:
                alpha[(i, j)] = torch.tensor(-math.inf, dtype=torch.float64)
                continue
            st = torch.stack(terms)
            alpha[(i, j)] = st.max() if semiring == "max" else torch.logsumexp(st, 0)
    return alpha[(i1, j1)]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("semiring", ["log", "max"])
def test_posteriors_are_the_gradient_of_the_total(kind, semiring):
    planes, di, dj, bnd = _case(kind, seed=11, I=6, J=5)
    tot, post, _ = transducer_lattice(planes, di, dj, bnd, semiring, from_end=semiring == "log")
    for b in range(bnd.shape[0]):
        leaves = [torch.tensor(p[b], requires_grad=True) for p in planes]
        t = _torch_total(leaves, di, dj, *bnd[b], semiring)
        assert t.item() == pytest.approx(tot[b], rel=1e-12)
        if tot[b] == -math.inf:  # no path (k2's modified form, more symbols than frames): no posteriors
            assert not any(p[b].any() for p in post)
            continue
        grads = torch.autograd.grad(t, leaves, allow_unused=True)
        for k, g in enumerate(grads):
            want = np.zeros_like(planes[k][b]) if g is None else g.numpy()
            np.testing.assert_allclose(post[k][b], want, rtol=1e-10, atol=1e-14)


def test_float32_scores_sum_in_float64():
    planes, di, dj, bnd = _case("tdt", seed=5)
    p32 = [p.astype(np.float32) for p in planes]
    tot, post, _ = transducer_lattice(p32, di, dj, bnd, "log")
    want, want_post = _brute([p.astype(np.float64) for p in p32], di, dj, bnd, "log")
    np.testing.assert_allclose(tot, want, rtol=1e-12)
    assert post is not None and post[0].dtype == np.float32
    for k in range(len(di)):
        np.testing.assert_allclose(post[k], want_post[k], rtol=1e-6, atol=1e-7)


def test_no_path_nan_and_inf():
    di, dj = KINDS["k2_modified"]
    planes = [np.zeros((3, 4, 4)), np.zeros((3, 4, 4))]
    planes[1][2, 1, 1] = math.nan
    # row 0: more symbols than frames in the modified form (no path); row 1: empty rectangle;
    # row 2: a NaN on a path
    bnd = np.array([[0, 0, 3, 2], [2, 2, 1, 3], [0, 0, 2, 3]])
    for semiring in ("log", "log_checked"):
        tot, post, _ = transducer_lattice(planes, di, dj, bnd, semiring)
        assert tot[0] == -math.inf and tot[1] == -math.inf and math.isnan(tot[2])
        assert post is not None
        assert not post[0][:2].any() and not post[1][:2].any()  # no posteriors without a path
        assert np.isnan(post[0][2, :2, :3]).all()
    # two +inf paths: the checked log-add keeps +inf, the plain one gives NaN (inf - inf)
    di, dj = KINDS["rnnt"]
    planes = [np.full((1, 2, 2), math.inf), np.full((1, 2, 2), math.inf)]
    bnd = np.array([[0, 0, 1, 1]])
    assert transducer_lattice(planes, di, dj, bnd, "log_checked", need_post=False)[0][0] == math.inf
    assert math.isnan(transducer_lattice(planes, di, dj, bnd, "log", need_post=False)[0][0])


def test_max_ties_go_to_the_kind_listed_first():
    di, dj = KINDS["rnnt"]
    planes = [np.zeros((1, 3, 3)), np.zeros((1, 3, 3))]  # every path scores 0
    bnd = np.array([[0, 0, 2, 2]])
    _, _, path = transducer_lattice(planes, di, dj, bnd, "max")
    assert path is not None
    kinds = [int(r[2]) for r in path[0] if r[0] >= 0]
    assert kinds == [1, 1, 0, 0]  # backtracking from the end prefers the first kind (blank) at each step


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(semiring="tropical"), "semiring must be one of"),
        (dict(di=[0, 0]), "di and dj must hold 2 advances"),
        (dict(dj=[1]), "di and dj must hold 2 advances"),
        (dict(boundary=np.array([[0, 0, 4, 4]])), r"scores\[0\] must cover"),
        (dict(boundary=np.array([[-1, 0, 1, 1]])), "i0 >= 0"),
        (dict(boundary=np.zeros((1, 3), dtype=np.int64)), "boundary must be an integer array"),
        (dict(scores=[np.zeros((1, 3, 3)), np.zeros((1, 3, 3), dtype=np.float32)]), r"scores\[1\] must be"),
    ],
)
def test_bad_arguments_are_named(kw, msg):
    args = dict(
        scores=[np.zeros((1, 3, 3)), np.zeros((1, 3, 3))], di=[1, 0], dj=[0, 1], boundary=np.array([[0, 0, 2, 2]])
    )
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        transducer_lattice(**args)


def test_enumeration_counts_paths():
    # the brute force itself: lattice paths of a (3, 2) rectangle with unit steps are C(5, 2)
    assert len(_paths([1, 0], [0, 1], 0, 0, 3, 2)) == math.comb(5, 2)
    assert len(list(itertools.islice(_paths([1, 0], [1, 1], 0, 0, 2, 2), 10))) == 1


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_marked_posteriors_rescore_the_best_path(kind):
    # the max semiring marks its best path; the log semiring then gives only those arcs' posteriors
    planes, di, dj, bnd = _case(kind, seed=13)
    _, best, _ = transducer_lattice(planes, di, dj, bnd, "max")
    _, full, _ = transducer_lattice(planes, di, dj, bnd, "log")
    _, part, _ = transducer_lattice(planes, di, dj, bnd, "log", marked=best)
    assert best is not None and full is not None and part is not None
    for k in range(len(di)):
        on = best[k] != 0
        np.testing.assert_array_equal(part[k][on], full[k][on])
        assert not part[k][~on].any()
    assert any(b.any() for b in best)
