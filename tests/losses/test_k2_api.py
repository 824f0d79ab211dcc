"""``lightning_gtn.k2`` holds every public function of k2's two RNN-T modules, with k2's
arguments; the functions beyond the losses (``fix_for_boundary``, the deprecated pruning bounds,
the HAT log-probabilities, the joint recursion) against references written here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import lightning_gtn.k2 as k2
from tests.losses.test_k2 import full_ranges, mi_loop, random_case

# The public (non-underscore) functions of k2's k2/python/k2/rnnt_loss.py and
# k2/python/k2/mutual_information.py, each with its positional arguments and defaults in k2's
# order (its autograd class MutualInformationRecursionFunction is not a function and is not mirrored).
K2_RNNT_LOSS = {
    "fix_for_boundary": ["px", "boundary=None"],
    "get_rnnt_logprobs": ["lm", "am", "symbols", "termination_symbol", "rnnt_type='regular'", "boundary=None"],
    "rnnt_loss_simple": [
        "lm",
        "am",
        "symbols",
        "termination_symbol",
        "boundary=None",
        "rnnt_type='regular'",
        "delay_penalty=0.0",
        "reduction='mean'",
        "return_grad=False",
    ],
    "get_rnnt_logprobs_joint": ["logits", "symbols", "termination_symbol", "rnnt_type='regular'", "boundary=None"],
    "rnnt_loss": [
        "logits",
        "symbols",
        "termination_symbol",
        "boundary=None",
        "rnnt_type='regular'",
        "delay_penalty=0.0",
        "reduction='mean'",
    ],
    "get_rnnt_prune_ranges": ["px_grad", "py_grad", "boundary", "s_range"],
    "get_rnnt_prune_ranges_deprecated": ["px_grad", "py_grad", "boundary", "s_range"],
    "do_rnnt_pruning": ["am", "lm", "ranges"],
    "get_hat_logprobs_pruned": [
        "logits",
        "symbols",
        "ranges",
        "termination_symbol",
        "boundary",
        "rnnt_type='regular'",
    ],
    "get_rnnt_logprobs_pruned": [
        "logits",
        "symbols",
        "ranges",
        "termination_symbol",
        "boundary",
        "rnnt_type='regular'",
    ],
    "rnnt_loss_pruned": [
        "logits",
        "symbols",
        "ranges",
        "termination_symbol",
        "boundary=None",
        "rnnt_type='regular'",
        "delay_penalty=0.0",
        "reduction='mean'",
        "use_hat_loss=False",
    ],
    "get_rnnt_logprobs_smoothed": [
        "lm",
        "am",
        "symbols",
        "termination_symbol",
        "lm_only_scale=0.1",
        "am_only_scale=0.1",
        "boundary=None",
        "rnnt_type='regular'",
    ],
    "rnnt_loss_smoothed": [
        "lm",
        "am",
        "symbols",
        "termination_symbol",
        "lm_only_scale=0.1",
        "am_only_scale=0.1",
        "boundary=None",
        "rnnt_type='regular'",
        "delay_penalty=0.0",
        "reduction='mean'",
        "return_grad=False",
    ],
}
K2_MUTUAL_INFORMATION = {
    "mutual_information_recursion": ["px", "py", "boundary=None", "return_grad=False"],
    "joint_mutual_information_recursion": ["px", "py", "boundary=None"],
}


def _k2_form(fn):
    """The positional parameters of ``fn`` written as in the tables above (keyword-only
    parameters, such as ``impl``, are this library's additions)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            continue
        out.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return out


def test_all_covers_every_public_function_of_k2s_modules_with_its_arguments():
    names = {**K2_RNNT_LOSS, **K2_MUTUAL_INFORMATION}
    assert set(names) <= set(k2.__all__)
    assert set(k2.__all__) - set(names) == {"RNNT_TYPES"}
    for name, params in names.items():
        assert _k2_form(getattr(k2, name)) == params, name


def test_docs_name_every_export():
    docs = Path(__file__).resolve().parents[2] / "docs"
    page = set(re.findall(r"`([\w.]+)`", (docs / "k2.md").read_text()))
    lines = (docs / "reference.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| `lightning_gtn.k2`"))
    listed = set(re.findall(r"`([\w.]+)`", row))
    assert not set(k2.__all__) - page, sorted(set(k2.__all__) - page)
    assert not set(k2.__all__) - listed, sorted(set(k2.__all__) - listed)


# -- fix_for_boundary ---------------------------------------------------------------------------


def test_fix_for_boundary_blocks_the_end_column_in_place():
    g = torch.Generator().manual_seed(40)
    px = torch.randn(3, 2, 6, generator=g, dtype=torch.float64)
    bnd = torch.tensor([[0, 0, 2, 5], [0, 0, 1, 3], [0, 1, 0, 1]])
    want = px.clone()
    for b in range(3):
        want[b, :, int(bnd[b, 3])] = float("-inf")
    got = k2.fix_for_boundary(px, bnd)
    assert got is px and torch.equal(got, want)
    other = torch.randn(3, 2, 6, generator=g)
    assert torch.equal(k2.fix_for_boundary(other.clone(), None), other)


def test_fix_for_boundary_is_what_the_logprobs_do_with_a_boundary():
    g = torch.Generator().manual_seed(41)
    lm, am = torch.randn(2, 3, 5, generator=g), torch.randn(2, 4, 5, generator=g)
    symbols = torch.randint(1, 5, (2, 2), generator=g)
    bnd = torch.tensor([[0, 0, 2, 4], [0, 0, 1, 2]])
    px, py = k2.get_rnnt_logprobs(lm, am, symbols, 0, boundary=bnd)
    qx, qy = k2.get_rnnt_logprobs(lm, am, symbols, 0)
    assert torch.equal(k2.fix_for_boundary(qx, bnd), px) and torch.equal(qy, py)


# -- the deprecated pruning bounds --------------------------------------------------------------


def ref_prune_ranges_deprecated(px_grad, py_grad, bnd, s_range):
    """Plain loops: per frame the window with the most occupancy of the arcs out of its rows
    (first best on ties), the last window from a sequence's last frame on, then the largest
    starts below the suffix minima that rise by at most ``step`` per frame from 0."""
    B, S, T1 = px_grad.shape
    T = py_grad.shape[2]
    R = min(s_range, S + 1)
    step = R - 1 if T1 == T + 1 else 1
    out = torch.empty(B, T, R, dtype=torch.long)
    for b in range(B):
        starts = []
        for t in range(T):
            tot = [
                sum(float(py_grad[b, s, t]) + (float(px_grad[b, s, t]) if s < S else 0.0) for s in range(r, r + R))
                for r in range(S + 2 - R)
            ]
            best = tot.index(max(tot))
            if t >= int(bnd[b, 3]) - 1:
                best = max(int(bnd[b, 2]) - R + 1, 0)
            starts.append(best)
        low = [min(starts[u:]) for u in range(T)]
        adj = [min(t * step, max(low[u] - (u - t) * step for u in range(t, T))) for t in range(T)]
        adj = [min(max(a, 0), S + 1 - R) for a in adj]
        out[b] = torch.tensor(adj).unsqueeze(1) + torch.arange(R)
    return out


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
@pytest.mark.parametrize("s_range", [2, 3, 9])
def test_deprecated_prune_ranges_match_the_loops(rnnt_type, s_range):
    g = torch.Generator().manual_seed(42)
    B, T, S = 3, 8, 5
    px_grad = torch.rand(B, S, T + 1 if rnnt_type == "regular" else T, generator=g, dtype=torch.float64)
    py_grad = torch.rand(B, S + 1, T, generator=g, dtype=torch.float64)
    bnd = torch.tensor([[0, 0, 5, 8], [0, 0, 3, 6], [0, 0, 0, 4]])
    got = k2.get_rnnt_prune_ranges_deprecated(px_grad, py_grad, bnd, s_range)
    assert got.dtype == torch.int64
    assert torch.equal(got, ref_prune_ranges_deprecated(px_grad, py_grad, bnd, s_range))


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_deprecated_prune_ranges_keep_a_path(rnnt_type):
    g = torch.Generator().manual_seed(43)
    B, T, S, C = 2, 9, 4, 6
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    bnd = torch.tensor([[0, 0, 4, 9], [0, 0, 2, 6]])
    _, (px_grad, py_grad) = k2.rnnt_loss_simple(lm, am, symbols, 0, bnd, rnnt_type=rnnt_type, return_grad=True)
    ranges = k2.get_rnnt_prune_ranges_deprecated(px_grad, py_grad, bnd, 3)
    start = ranges[:, :, 0]
    steps = start[:, 1:] - start[:, :-1]
    assert (start[:, 0] == 0).all() and (steps >= 0).all() and (steps <= (2 if rnnt_type == "regular" else 1)).all()
    am_p, lm_p = k2.do_rnnt_pruning(am, lm, ranges)
    pruned = k2.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, bnd, rnnt_type=rnnt_type, reduction="none")
    full = k2.rnnt_loss(am[:, :, None] + lm[:, None], symbols, 0, bnd, rnnt_type=rnnt_type, reduction="none")
    assert torch.isfinite(pruned).all() and (pruned >= full - 1e-9).all()
    wide = k2.get_rnnt_prune_ranges_deprecated(px_grad, py_grad, bnd, 10)
    assert torch.equal(wide, full_ranges(B, T, S))


# -- the HAT log-probabilities ------------------------------------------------------------------


def hat_logprobs(logits, blank):
    """``(..., C)`` HAT log-probabilities: a Bernoulli blank, the rest a softmax among themselves."""
    C = logits.shape[-1]
    others = [c for c in range(C) if c != blank]
    not_blank = torch.log1p(-torch.sigmoid(logits[..., blank]))
    out = torch.empty_like(logits)
    out[..., blank] = torch.nn.functional.logsigmoid(logits[..., blank])
    out[..., others] = logits[..., others].log_softmax(-1) + not_blank.unsqueeze(-1)
    return out


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
def test_hat_logprobs_pruned_match_the_definition(rnnt_type):
    g = torch.Generator().manual_seed(44)
    B, T, S, R, C, blank = 2, 5, 3, 2, 5, 2
    logits = torch.randn(B, T, R, C, generator=g, dtype=torch.float64)
    symbols = torch.tensor([[0, 1, 3], [4, 4, 0]])
    start = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, 2, 2]])
    ranges = start.unsqueeze(2) + torch.arange(R)
    bnd = torch.tensor([[0, 0, 3, 5], [0, 0, 2, 4]])
    px, py = k2.get_hat_logprobs_pruned(logits, symbols, ranges, blank, bnd, rnnt_type=rnnt_type)
    lp = hat_logprobs(logits, blank)
    wx = torch.full((B, S, T), float("-inf"), dtype=torch.float64)
    wy = torch.full((B, S + 1, T), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for k in range(R):
                s = int(ranges[b, t, k])
                wy[b, s, t] = lp[b, t, k, blank]
                if s < S:
                    wx[b, s, t] = lp[b, t, k, int(symbols[b, s])]
    if rnnt_type == "regular":
        wx = torch.cat([wx, torch.full((B, S, 1), float("-inf"), dtype=torch.float64)], dim=2)
        for b in range(B):
            wx[b, :, int(bnd[b, 3])] = float("-inf")
    if rnnt_type == "constrained":
        wx = wx + wy[:, 1:]
    torch.testing.assert_close(px, wx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(py, wy, rtol=1e-12, atol=1e-12)
    loss = k2.rnnt_loss_pruned(
        logits, symbols, ranges, blank, bnd, rnnt_type=rnnt_type, reduction="none", use_hat_loss=True
    )
    torch.testing.assert_close(loss, -mi_loop(wx, wy, bnd), rtol=1e-10, atol=1e-10)


def test_hat_loss_gradcheck_float64():
    logits, symbols, bnd = random_case(B=2, T=3, U=2, V=4, seed=45)
    B, T, S1, _ = logits.shape
    ranges = full_ranges(B, T, S1 - 1)
    logits.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: k2.rnnt_loss_pruned(x, symbols, ranges, 0, bnd, reduction="none", use_hat_loss=True), (logits,)
    )


# -- the joint recursion ------------------------------------------------------------------------


def occupancy(px, py, bnd):
    """The recursion as a loop of torch scalars, and the gradients of its sum (the arcs'
    occupation probabilities) by autograd."""
    px = px.detach().requires_grad_()
    py = py.detach().requires_grad_()
    B, S, T1 = px.shape
    T = py.shape[2]
    modified = T1 == T
    ninf = torch.tensor(float("-inf"), dtype=px.dtype)
    scores = []
    for b in range(B):
        s0, t0, s1, t1 = [int(v) for v in bnd[b]]
        p = {}
        for s in range(s0, s1 + 1):
            for t in range(t0, t1 + 1):
                if (s, t) == (s0, t0):
                    p[s, t] = torch.zeros((), dtype=px.dtype)
                    continue
                terms = []
                if s > s0 and (not modified or t > t0) and (s - 1, t - modified) in p:
                    tt = t - 1 if modified else t
                    terms.append(p[s - 1, tt] + px[b, s - 1, tt])
                if t > t0 and (s, t - 1) in p:
                    terms.append(p[s, t - 1] + py[b, s, t - 1])
                if terms:  # nodes no path reaches are left out
                    p[s, t] = torch.logsumexp(torch.stack(terms), 0)
        scores.append(p.get((s1, t1), ninf + px.sum() * 0))
    scores = torch.stack(scores)
    gx, gy = torch.autograd.grad(scores.sum(), [px, py])
    return scores.detach(), gx, gy


def _parts(n, B, S, T1, T, seed):
    g = torch.Generator().manual_seed(seed)
    px = [torch.randn(B, S, T1, generator=g, dtype=torch.float64) for _ in range(n)]
    py = [torch.randn(B, S + 1, T, generator=g, dtype=torch.float64) for _ in range(n)]
    if T1 == T + 1:
        px[0][:, :, T] = float("-inf")  # as a regular px: no symbol after the last frame
    return px, py


@pytest.mark.parametrize("modified", [False, True])
def test_joint_recursion_splits_the_score_by_occupancy(modified):
    B, S, T = 3, 2, 4
    px, py = _parts(3, B, S, T if modified else T + 1, T, seed=46)
    bnd = torch.tensor([[0, 0, 2, 4], [0, 1, 1, 4], [1, 0, 2, 3]])
    got = k2.joint_mutual_information_recursion(px, py, bnd)
    assert got.shape == (3, B) and got.dtype == torch.float64
    scores, gx, gy = occupancy(sum(px), sum(py), bnd)
    lowest = torch.finfo(torch.float64).min
    want = torch.stack(
        [(gx * x.clamp(min=lowest)).sum((1, 2)) + (gy * y.clamp(min=lowest)).sum((1, 2)) for x, y in zip(px, py)]
    )
    want[0] += scores - want.sum(0)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.sum(0), mi_loop(sum(px), sum(py), bnd), rtol=1e-10, atol=1e-10)


def test_joint_recursion_gradients():
    B, S, T = 2, 2, 3
    px, py = _parts(2, B, S, T + 1, T, seed=47)
    px = [x.requires_grad_() for x in px]
    py = [y.requires_grad_() for y in py]
    bnd = torch.tensor([[0, 0, 2, 3], [0, 0, 1, 2]])
    _, gx, gy = occupancy(sum(px), sum(py), bnd)
    out = k2.joint_mutual_information_recursion(px, py, bnd)
    gpx1, gpx0, gpy1 = torch.autograd.grad(out[1].sum(), [px[1], px[0], py[1]])
    torch.testing.assert_close(gpx1, gx)
    torch.testing.assert_close(gpy1, gy)
    assert not gpx0.any()  # part 1 reads px[1] and py[1] only
    g = torch.Generator().manual_seed(48)
    qx = [torch.randn(B, S, T + 1, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    qy = [torch.randn(B, S + 1, T, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: k2.joint_mutual_information_recursion([a, b], [c, d], bnd).sum(0), (*qx, *qy)
    )


def test_joint_recursion_scores_once_through_apply_loss(apply_loss_calls):
    from lightning_gtn.losses.k2_rnnt import MI_BACKENDS

    px, py = _parts(2, 2, 2, 4, 3, seed=49)
    k2.joint_mutual_information_recursion(px, py)
    assert len(apply_loss_calls) == 1 and apply_loss_calls[0][0].picker is MI_BACKENDS


# -- bad inputs ---------------------------------------------------------------------------------


def test_bad_inputs_of_the_new_functions_name_the_argument():
    px, py = _parts(2, 2, 2, 5, 4, seed=50)
    bnd = torch.tensor([[0, 0, 2, 4], [0, 0, 1, 3]])
    logits, symbols, rbnd = random_case(B=2, T=4, U=2, V=4, seed=51)
    ranges = full_ranges(2, 4, 2)
    cases = [
        (lambda: k2.fix_for_boundary(px[0][0], bnd), "px"),
        (lambda: k2.fix_for_boundary(px[0], torch.tensor([[0, 0, 2, 5], [0, 0, 1, 3]])), "boundary"),
        (lambda: k2.fix_for_boundary(px[0], bnd[:1]), "boundary"),
        (lambda: k2.get_rnnt_prune_ranges_deprecated(px[0], py[0], bnd, 1), "s_range"),
        (lambda: k2.get_rnnt_prune_ranges_deprecated(px[0], py[0], bnd, 0), "s_range"),
        (lambda: k2.get_rnnt_prune_ranges_deprecated(px[0], py[0][:, :2], bnd, 2), "py_grad"),
        (lambda: k2.get_rnnt_prune_ranges_deprecated(px[0], py[0], bnd[:, :3], 2), "boundary"),
        (lambda: k2.get_hat_logprobs_pruned(logits, symbols, ranges, 4, rbnd), "termination_symbol"),
        (lambda: k2.get_hat_logprobs_pruned(logits, symbols, ranges[:, :, :2], 0, rbnd), "ranges"),
        (lambda: k2.get_hat_logprobs_pruned(logits, symbols, ranges, 0, rbnd, rnnt_type="fast"), "rnnt_type"),
        (lambda: k2.joint_mutual_information_recursion([], []), "px"),
        (lambda: k2.joint_mutual_information_recursion(px[0], py[0]), "px"),
        (lambda: k2.joint_mutual_information_recursion(px, py[:1]), "py"),
        (lambda: k2.joint_mutual_information_recursion([px[0], px[1][:, :, :4]], py), r"px\[1\]"),
        (lambda: k2.joint_mutual_information_recursion(px, [py[0], py[1].float()]), r"py\[1\]"),
        (lambda: k2.joint_mutual_information_recursion(px, [y[:, :2] for y in py]), "py"),
        (lambda: k2.joint_mutual_information_recursion(px, py, torch.tensor([[0, 0, 3, 4], [0, 0, 1, 3]])), "boundary"),
    ]
    for fn, name in cases:
        with pytest.raises(ValueError, match=name):
            fn()
