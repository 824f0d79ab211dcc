"""``lightning_gtn.k2``: k2's RNN-T functions against independent references.

References: torchaudio's published fixed case, k2's own fixed inputs (its tests compare the
functions with each other and with torchaudio), brute-force enumeration of alignments, an
independent per-(t, u) dynamic programme written here, and float64 gradcheck.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

import lightning_gtn.k2 as k2
from lightning_gtn.kernels.mutual_information import mi_numba, mi_torch
from lightning_gtn.nn import PrunedRNNTLoss, RNNTStructuredLoss
from tests.losses._rnnt_cases import B2_COSTS, B2_GRADS, B2_LOGITS

TYPES = ("regular", "modified", "constrained")


# -- independent references ----------------------------------------------------------------------


def _logsumexp(xs):
    xs = [x for x in xs if x != -math.inf]
    if not xs:
        return -math.inf
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def ref_lattice(sym_lp, blank_lp, kind="regular"):
    """-log P of one sequence from per-frame tables: ``sym_lp[t][u]`` (emit symbol ``u`` in
    context ``u`` at frame ``t``), ``blank_lp[t][u]`` (blank in context ``u``); T, U from them.

    regular: Graves's alpha over (t, u); modified: each frame emits a blank or one symbol;
    constrained: as modified, a symbol also scores the blank of the next context on its frame.
    """
    T = len(blank_lp)
    U = len(blank_lp[0]) - 1 if T else 0
    if kind == "regular":
        if T == 0:
            return math.inf
        a = [[-math.inf] * (U + 1) for _ in range(T)]
        for t in range(T):
            for u in range(U + 1):
                if t == 0 and u == 0:
                    a[0][0] = 0.0
                    continue
                terms = []
                if t > 0:
                    terms.append(a[t - 1][u] + blank_lp[t - 1][u])
                if u > 0:
                    terms.append(a[t][u - 1] + sym_lp[t][u - 1])
                a[t][u] = _logsumexp(terms)
        return -(a[T - 1][U] + blank_lp[T - 1][U])
    a = [[-math.inf] * (U + 1) for _ in range(T + 1)]
    a[0][0] = 0.0
    for t in range(T):
        for u in range(U + 1):
            terms = [a[t][u] + blank_lp[t][u]]
            if u > 0:
                extra = blank_lp[t][u] if kind == "constrained" else 0.0
                terms.append(a[t][u - 1] + sym_lp[t][u - 1] + extra)
            a[t + 1][u] = _logsumexp(terms)
    return -a[T][U]


def brute_regular(logp, target, blank):
    """-log P by enumerating every regular alignment: the U symbols and T blanks interleaved,
    the last step a blank. ``logp`` is ``(T, U + 1, V)`` log-probabilities."""
    T, U = logp.shape[0], len(target)
    scores = []
    for sym_steps in itertools.combinations(range(T + U - 1), U):
        t = u = 0
        tot = 0.0
        for step in range(T + U):
            if step in sym_steps:
                tot += float(logp[t, u, target[u]])
                u += 1
            else:
                tot += float(logp[t, u, blank])
                t += 1
        scores.append(tot)
    return -_logsumexp(scores)


def tables(logp, target, blank, T, U):
    """``sym_lp``, ``blank_lp`` of one sequence from ``(T', U' + 1, V)`` log-probabilities."""
    sym = [[float(logp[t, u, target[u]]) for u in range(U)] for t in range(T)]
    blk = [[float(logp[t, u, blank]) for u in range(U + 1)] for t in range(T)]
    return sym, blk


def mi_loop(px, py, bnd):
    """The recursion of ``mutual_information_recursion`` as a plain O(S * T) loop per row."""
    B, S, T1 = px.shape
    T = py.shape[2]
    modified = T1 == T
    out = []
    for b in range(B):
        s0, t0, s1, t1 = [int(v) for v in bnd[b]]
        p = {}
        for s in range(s0, s1 + 1):
            for t in range(t0, t1 + 1):
                if (s, t) == (s0, t0):
                    p[s, t] = 0.0
                    continue
                terms = []
                if s > s0 and (not modified or t > t0):
                    tt = t - 1 if modified else t
                    terms.append(p[s - 1, tt] + float(px[b, s - 1, tt]))
                if t > t0:
                    terms.append(p[s, t - 1] + float(py[b, s, t - 1]))
                p[s, t] = _logsumexp(terms)
        out.append(p[s1, t1])
    return torch.tensor(out, dtype=torch.float64)


def random_case(B=3, T=5, U=3, V=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype)
    symbols = torch.randint(1, V, (B, U), generator=g)
    frames = torch.tensor([T, T - 1, max(T - 2, 1)][:B])
    lengths = torch.tensor([U, U - 1, 1][:B])
    boundary = torch.stack([torch.zeros(B, dtype=torch.long)] * 2 + [lengths, frames], dim=1)
    return logits, symbols, boundary


def full_ranges(B, T, S):
    return torch.arange(S + 1).expand(B, T, S + 1).contiguous()


# -- published values ----------------------------------------------------------------------------

# torchaudio's B=2, T=4, U=2 (+1), V=3 case with blank 0 (B2_*: tests/losses/_rnnt_cases.py)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torchaudio_published_case(dtype):
    logits = torch.tensor(B2_LOGITS, dtype=dtype).reshape(2, 4, 3, 3).requires_grad_()
    symbols = torch.tensor([[1, 2], [1, 1]])
    boundary = torch.tensor([[0, 0, 2, 4], [0, 0, 2, 4]])
    costs = k2.rnnt_loss(logits, symbols, 0, boundary=boundary, reduction="none")
    torch.testing.assert_close(costs, torch.tensor(B2_COSTS, dtype=dtype), atol=1e-5, rtol=1e-6)
    costs.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor(B2_GRADS, dtype=dtype).reshape(2, 4, 3, 3), atol=2e-6, rtol=0)
    # k2's "mean" is torch.mean over the batch (not per target length)
    mean = k2.rnnt_loss(logits.detach(), symbols, 0, boundary=boundary)
    torch.testing.assert_close(mean, torch.tensor(B2_COSTS, dtype=dtype).mean(), atol=1e-5, rtol=1e-6)
    total = k2.rnnt_loss(logits.detach(), symbols, 0, boundary=boundary, reduction="sum")
    torch.testing.assert_close(total, torch.tensor(B2_COSTS, dtype=dtype).sum(), atol=1e-5, rtol=1e-6)


def test_k2_basic_case_all_forms_agree_with_brute_force():
    # the fixed inputs of k2's test_rnnt_loss_basic (k2/python/tests/rnnt_loss_test.py), which
    # checks that these forms agree with each other and with torchaudio
    lm = torch.tensor([[[0, 0, 1], [0, 1, 1], [1, 0, 1], [2, 2, 0]]], dtype=torch.float64)
    am = torch.tensor([[[0, 1, 2], [0, 0, 0], [0, 2, 4], [0, 3, 3]]], dtype=torch.float64)
    symbols = torch.tensor([[0, 1, 0]])
    logits = am.unsqueeze(2) + lm.unsqueeze(1)
    want = brute_regular(logits[0].log_softmax(-1), [0, 1, 0], blank=2)
    px, py = k2.get_rnnt_logprobs(lm, am, symbols, 2)
    assert px.shape == (1, 3, 5) and py.shape == (1, 4, 4)
    got = [
        -k2.mutual_information_recursion(px, py),
        k2.rnnt_loss_simple(lm, am, symbols, 2, reduction="none"),
        k2.rnnt_loss_smoothed(lm, am, symbols, 2, lm_only_scale=0.0, am_only_scale=0.0, reduction="none"),
        k2.rnnt_loss(logits, symbols, 2, reduction="none"),
    ]
    for g in got:
        assert g.item() == pytest.approx(want, rel=1e-9)
    # invariant to a constant added to each frame of am and each position of lm (k2's test)
    g = torch.Generator().manual_seed(3)
    lm2 = lm + torch.randn(1, 4, 1, generator=g, dtype=torch.float64)
    am2 = am + torch.randn(1, 4, 1, generator=g, dtype=torch.float64)
    assert k2.rnnt_loss_simple(lm2, am2, symbols, 2).item() == pytest.approx(want, rel=1e-9)
    assert k2.rnnt_loss(am2.unsqueeze(2) + lm2.unsqueeze(1), symbols, 2).item() == pytest.approx(want, rel=1e-9)


# -- the full loss against the references ------------------------------------------------------


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_rnnt_loss_matches_reference_with_boundary(rnnt_type):
    logits, symbols, boundary = random_case(T=5, U=3)
    blank = 0
    got = k2.rnnt_loss(logits, symbols, blank, boundary=boundary, rnnt_type=rnnt_type, reduction="none")
    logp = logits.log_softmax(-1)
    for b in range(3):
        U, T = int(boundary[b, 2]), int(boundary[b, 3])
        target = symbols[b, :U].tolist()
        want = ref_lattice(*tables(logp[b], target, blank, T, U), kind=rnnt_type)
        assert got[b].item() == pytest.approx(want, rel=1e-9)
        if rnnt_type == "regular":
            assert want == pytest.approx(brute_regular(logp[b, :T, : U + 1], target, blank), rel=1e-9)


def test_u_greater_than_t_regular_is_finite_and_exact():
    logits, symbols, _ = random_case(B=1, T=2, U=6, V=5, seed=4)
    got = k2.rnnt_loss(logits, symbols, 0, reduction="none")
    want = brute_regular(logits[0].log_softmax(-1), symbols[0].tolist(), 0)
    assert math.isfinite(got.item()) and got.item() == pytest.approx(want, rel=1e-9)


def test_modified_without_enough_frames_is_inf_with_zero_grad():
    # k2 asserts T >= S for modified/constrained; here such a sequence simply has no path
    logits, symbols, _ = random_case(B=2, T=3, U=4, V=5, seed=5)
    boundary = torch.tensor([[0, 0, 4, 3], [0, 0, 2, 3]])
    logits.requires_grad_()
    loss = k2.rnnt_loss(logits, symbols, 0, boundary=boundary, rnnt_type="modified", reduction="none")
    assert math.isinf(loss[0].item()) and math.isfinite(loss[1].item())
    loss[1].backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0].abs().sum() == 0


def test_delay_penalty_is_a_frame_bonus_on_symbols():
    logits, symbols, boundary = random_case(B=2, T=5, U=2, V=4, seed=6)
    dp = 0.3
    got = k2.rnnt_loss(logits, symbols, 0, boundary=boundary, delay_penalty=dp, reduction="none")
    logp = logits.log_softmax(-1)
    for b in range(2):
        U, T = int(boundary[b, 2]), int(boundary[b, 3])
        sym, blk = tables(logp[b], symbols[b, :U].tolist(), 0, T, U)
        sym = [[v + dp * ((T - 1) / 2 - t) for v in row] for t, row in enumerate(sym)]
        assert got[b].item() == pytest.approx(ref_lattice(sym, blk), rel=1e-9)


# -- simple and smoothed, as k2 defines them ----------------------------------------------------


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_simple_loss_is_the_full_loss_of_the_added_joiner(rnnt_type):
    g = torch.Generator().manual_seed(7)
    B, T, S, C = 2, 4, 3, 5
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(0, C, (B, S), generator=g)
    boundary = torch.tensor([[0, 0, 3, 4], [0, 0, 2, 3]])
    simple = k2.rnnt_loss_simple(lm, am, symbols, 1, boundary=boundary, rnnt_type=rnnt_type, reduction="none")
    full = k2.rnnt_loss(
        am[:, :, None] + lm[:, None], symbols, 1, boundary=boundary, rnnt_type=rnnt_type, reduction="none"
    )
    torch.testing.assert_close(simple, full, rtol=1e-10, atol=1e-10)


def test_smoothed_loss_matches_its_definition():
    g = torch.Generator().manual_seed(8)
    B, T, S, C = 2, 4, 3, 5
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    boundary = torch.tensor([[0, 0, 3, 4], [0, 0, 1, 3]])
    lo, ao, blank = 0.25, 0.1, 0
    got = k2.rnnt_loss_smoothed(lm, am, symbols, blank, lo, ao, boundary=boundary, reduction="none")
    # the definition: interpolated log-probs of the joint, the LM alone, and the AM with the
    # batch's average LM distribution (a unigram over every b and s)
    unigram = lm.softmax(-1).mean(dim=(0, 1))
    joint = (am[:, :, None] + lm[:, None]).log_softmax(-1)  # (B, T, S + 1, C)
    lm_only = lm.log_softmax(-1)[:, None].expand(B, T, S + 1, C)
    am_only = (am + unigram.log()).log_softmax(-1)[:, :, None].expand(B, T, S + 1, C)
    mix = (1 - lo - ao) * joint + lo * lm_only + ao * am_only
    for b in range(B):
        U, Tb = int(boundary[b, 2]), int(boundary[b, 3])
        want = ref_lattice(*tables(mix[b], symbols[b, :U].tolist(), blank, Tb, U))
        assert got[b].item() == pytest.approx(want, rel=1e-7)


# -- the recursion ------------------------------------------------------------------------------


@pytest.mark.parametrize("modified", [False, True])
def test_mutual_information_loop_numba_torch(modified):
    g = torch.Generator().manual_seed(9)
    B, S, T = 4, 3, 5
    px = torch.randn(B, S, T if modified else T + 1, generator=g, dtype=torch.float64)
    py = torch.randn(B, S + 1, T, generator=g, dtype=torch.float64)
    bnd = torch.tensor([[0, 0, 3, 5], [1, 1, 3, 4], [0, 2, 0, 5], [2, 0, 3, 3]])
    want = mi_loop(px, py, bnd)
    for impl in ("numba", "torch"):
        got = k2.mutual_information_recursion(px, py, bnd, impl=impl)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    sn, gxn, gyn = mi_numba(px, py, bnd, True)
    st, gxt, gyt = mi_torch(px, py, bnd, True)
    torch.testing.assert_close(sn, st)
    torch.testing.assert_close(gxn, gxt)
    torch.testing.assert_close(gyn, gyt)
    # return_grad gives the gradient of scores.sum(); its arcs' occupancy on each frame sums to 1
    pxr, pyr = px.clone().requires_grad_(), py.clone().requires_grad_()
    scores, (gx, gy) = k2.mutual_information_recursion(pxr, pyr, bnd, return_grad=True)
    scores.sum().backward()
    torch.testing.assert_close(gx, pxr.grad)
    torch.testing.assert_close(gy, pyr.grad)


@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_gradcheck_float64(impl):
    g = torch.Generator().manual_seed(10)
    px = torch.randn(2, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    py = torch.randn(2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bnd = torch.tensor([[0, 0, 2, 3], [0, 1, 1, 3]])
    assert torch.autograd.gradcheck(lambda a, b: k2.mutual_information_recursion(a, b, bnd, impl=impl), (px, py))
    logits, symbols, boundary = random_case(B=2, T=3, U=2, V=4, seed=11)
    logits.requires_grad_()
    for rnnt_type in TYPES:
        assert torch.autograd.gradcheck(
            lambda x, kind=rnnt_type: k2.rnnt_loss(x, symbols, 0, boundary=boundary, rnnt_type=kind, reduction="none"),
            (logits,),
        )


def test_nan_in_one_row_is_nan_in_that_row_only():
    logits, symbols, boundary = random_case(B=3, T=4, U=2, V=4, seed=12)
    logits[1, 0, 0, 0] = float("nan")
    logits[2, -1, -1, -1] = float("nan")  # outside row 2's boundary (T_2 = 2, S_2 = 1): never read
    loss = k2.rnnt_loss(logits, symbols, 0, boundary=boundary, reduction="none")
    assert math.isnan(loss[1].item()) and math.isfinite(loss[0].item()) and math.isfinite(loss[2].item())


# -- pruning ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_pruned_with_full_ranges_equals_full(rnnt_type):
    logits, symbols, boundary = random_case(B=3, T=5, U=3, V=6, seed=13)
    B, T, S1, _ = logits.shape
    full = k2.rnnt_loss(logits, symbols, 0, boundary=boundary, rnnt_type=rnnt_type, reduction="none")
    ranges = full_ranges(B, T, S1 - 1)
    pruned = k2.rnnt_loss_pruned(logits, symbols, ranges, 0, boundary=boundary, rnnt_type=rnnt_type, reduction="none")
    torch.testing.assert_close(pruned, full, rtol=1e-10, atol=1e-10)
    px, py = k2.get_rnnt_logprobs_pruned(logits, symbols, ranges, 0, boundary, rnnt_type=rnnt_type)
    qx, qy = k2.get_rnnt_logprobs_joint(logits, symbols, 0, rnnt_type=rnnt_type, boundary=boundary)
    torch.testing.assert_close(px, qx)
    torch.testing.assert_close(py, qy)


def test_icefall_pipeline_with_wide_range_equals_full_loss():
    g = torch.Generator().manual_seed(14)
    B, T, S, J, C = 2, 6, 3, 4, 5
    enc = torch.randn(B, T, J, generator=g, dtype=torch.float64)
    pred = torch.randn(B, S + 1, J, generator=g, dtype=torch.float64)
    W = torch.randn(J, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    boundary = torch.tensor([[0, 0, 3, 6], [0, 0, 2, 5]])
    simple, (px_grad, py_grad) = k2.rnnt_loss_smoothed(
        pred @ W, enc @ W, symbols, 0, 0.25, 0.0, boundary=boundary, reduction="sum", return_grad=True
    )
    assert px_grad.shape == (B, S, T + 1) and py_grad.shape == (B, S + 1, T)
    ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range=10)
    assert ranges.shape == (B, T, S + 1)
    am_p, lm_p = k2.do_rnnt_pruning(enc, pred, ranges)
    pruned = k2.rnnt_loss_pruned(torch.tanh(am_p + lm_p) @ W, symbols, ranges, 0, boundary, reduction="sum")
    full = k2.rnnt_loss(torch.tanh(enc[:, :, None] + pred[:, None]) @ W, symbols, 0, boundary, reduction="sum")
    assert pruned.item() == pytest.approx(full.item(), rel=1e-10)


def _check_ranges(ranges, boundary, s_range, regular=True):
    B, T, R = ranges.shape
    start = ranges[:, :, 0]
    assert (ranges == start.unsqueeze(2) + torch.arange(R)).all()
    assert (start[:, 0] == 0).all()
    steps = start[:, 1:] - start[:, :-1]
    assert (steps >= 0).all() and (steps <= (R - 1 if regular else 1)).all()
    for b in range(B):
        Tb, Sb = int(boundary[b, 3]), int(boundary[b, 2])
        assert start[b, Tb - 1] <= Sb <= start[b, Tb - 1] + R - 1  # the last frame reaches the end


@pytest.mark.parametrize("s_range", [1, 2, 3])
def test_small_s_range_and_u_greater_than_t_give_finite_losses(s_range):
    g = torch.Generator().manual_seed(15 + s_range)
    B, T, S, C = 2, 3, 7, 6
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    boundary = torch.tensor([[0, 0, 7, 3], [0, 0, 4, 2]])
    _, (px_grad, py_grad) = k2.rnnt_loss_simple(lm, am, symbols, 0, boundary=boundary, return_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range)
    assert ranges.shape[2] >= 4  # 7 symbols in 3 frames need windows of ceil(7 / 3) + 1 = 4
    assert any("s_range" in str(w.message) for w in caught)
    _check_ranges(ranges, boundary, s_range)
    am_p, lm_p = k2.do_rnnt_pruning(am, lm, ranges)
    logits = am_p + lm_p
    pruned = k2.rnnt_loss_pruned(logits, symbols, ranges, 0, boundary, reduction="none")
    full = k2.rnnt_loss(am[:, :, None] + lm[:, None], symbols, 0, boundary, reduction="none")
    assert torch.isfinite(pruned).all()
    assert (pruned >= full - 1e-9).all()  # pruning only removes paths


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_prune_ranges_properties(rnnt_type):
    g = torch.Generator().manual_seed(20)
    B, T, S, C = 3, 9, 5, 6
    lm = torch.randn(B, S + 1, C, generator=g)
    am = torch.randn(B, T, C, generator=g)
    symbols = torch.randint(1, C, (B, S), generator=g)
    boundary = torch.tensor([[0, 0, 5, 9], [0, 0, 3, 7], [0, 0, 0, 4]])
    _, (px_grad, py_grad) = k2.rnnt_loss_simple(
        lm, am, symbols, 0, boundary=boundary, rnnt_type=rnnt_type, return_grad=True
    )
    ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, boundary, 3)
    assert ranges.shape == (B, T, 3) and ranges.dtype == torch.int64
    _check_ranges(ranges, boundary, 3, regular=rnnt_type == "regular")
    pruned = k2.rnnt_loss_pruned(
        (am[:, :, None] + k2.do_rnnt_pruning(am, lm, ranges)[1]),
        symbols,
        ranges,
        0,
        boundary,
        rnnt_type=rnnt_type,
        reduction="none",
    )
    assert torch.isfinite(pruned).all()


def test_hat_loss_with_full_ranges_matches_its_definition():
    logits, symbols, boundary = random_case(B=2, T=4, U=2, V=5, seed=21)
    B, T, S1, V = logits.shape
    got = k2.rnnt_loss_pruned(
        logits, symbols, full_ranges(B, T, S1 - 1), 0, boundary, reduction="none", use_hat_loss=True
    )
    blank_lp = torch.nn.functional.logsigmoid(logits[..., 0])
    not_blank = torch.log1p(-torch.sigmoid(logits[..., 0]))
    sym_lp = logits[..., 1:].log_softmax(-1) + not_blank.unsqueeze(-1)
    logp = torch.cat([blank_lp.unsqueeze(-1), sym_lp], dim=-1)
    for b in range(B):
        U, Tb = int(boundary[b, 2]), int(boundary[b, 3])
        want = ref_lattice(*tables(logp[b], symbols[b, :U].tolist(), 0, Tb, U))
        assert got[b].item() == pytest.approx(want, rel=1e-9)


# -- the prologue -------------------------------------------------------------------------------


def test_every_scoring_function_goes_through_apply_loss_once(apply_loss_calls):
    from lightning_gtn.losses.k2_rnnt import MI_BACKENDS

    logits, symbols, boundary = random_case(B=2, T=5, U=2, V=4, seed=31)
    g = torch.Generator().manual_seed(32)
    lm, am = (
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.randn(2, 5, 4, generator=g, dtype=torch.float64),
    )
    px, py = torch.randn(2, 2, 6, generator=g), torch.randn(2, 3, 5, generator=g)
    ranges = torch.tensor([0, 0, 1, 1, 1]).reshape(1, 5, 1).expand(2, 5, 2) + torch.arange(2)
    fns = {
        "mutual_information_recursion": lambda: k2.mutual_information_recursion(px, py, boundary),
        "rnnt_loss_simple": lambda: k2.rnnt_loss_simple(lm, am, symbols, 0, boundary, reduction="none"),
        "rnnt_loss": lambda: k2.rnnt_loss(logits, symbols, 0, boundary, reduction="sum"),
        "rnnt_loss_pruned": lambda: k2.rnnt_loss_pruned(logits[:, :, :2], symbols, ranges, 0, boundary),
        "rnnt_loss_smoothed": lambda: k2.rnnt_loss_smoothed(lm, am, symbols, 0, boundary=boundary),
    }
    assert set(fns) == {n for n in k2.__all__ if n.startswith(("rnnt_loss", "mutual_information"))}
    want = {name: fn() for name, fn in fns.items()}
    for name, fn in fns.items():
        apply_loss_calls.clear()
        got = fn()
        seen = [c for c, _ in apply_loss_calls]
        assert len(seen) == 1, name
        assert seen[0].picker is MI_BACKENDS, name
        assert torch.isfinite(got).all() and torch.equal(got, want[name]), name
    with pytest.raises(TypeError, match="unexpected options"):
        seen[0].check_call_options((2, 3, 6, 2), {"clamp": 1.0})


# -- bad inputs ---------------------------------------------------------------------------------


def test_bad_inputs_raise_value_errors_naming_the_argument():
    logits, symbols, boundary = random_case(B=2, T=4, U=2, V=4, seed=22)
    lm, am = torch.randn(2, 3, 4), torch.randn(2, 4, 4)
    cases = [
        (lambda: k2.rnnt_loss(logits[0], symbols, 0), "logits"),
        (lambda: k2.rnnt_loss(logits, symbols[:, :1], 0), "symbols"),
        (lambda: k2.rnnt_loss(logits, symbols + 10, 0), "symbols"),
        (lambda: k2.rnnt_loss(logits, symbols.float(), 0), "symbols"),
        (lambda: k2.rnnt_loss(logits, symbols, 4), "termination_symbol"),
        (lambda: k2.rnnt_loss(logits, symbols, -1), "termination_symbol"),
        (lambda: k2.rnnt_loss(logits, symbols, 0, boundary=torch.tensor([[0, 0, 3, 4], [0, 0, 1, 1]])), "boundary"),
        (lambda: k2.rnnt_loss(logits, symbols, 0, boundary=torch.tensor([[0, 0, 2, 5], [0, 0, 1, 1]])), "boundary"),
        (lambda: k2.rnnt_loss(logits, symbols, 0, boundary=torch.tensor([[0, 0, 2, 4]])), "boundary"),
        (lambda: k2.rnnt_loss(logits, symbols, 0, boundary=torch.tensor([[1, 0, 0, 4], [0, 0, 1, 1]])), "boundary"),
        (lambda: k2.rnnt_loss(logits, symbols, 0, rnnt_type="fast"), "rnnt_type"),
        (lambda: k2.rnnt_loss(logits, symbols, 0, reduction="avg"), "reduction"),
        (lambda: k2.rnnt_loss_simple(lm, am[:, :, :3], symbols, 0), "lm"),
        (lambda: k2.rnnt_loss_smoothed(lm, am, symbols, 0, lm_only_scale=float("nan")), "lm_only_scale"),
        (lambda: k2.mutual_information_recursion(torch.zeros(2, 2, 5), torch.zeros(2, 2, 4)), "py"),
        (lambda: k2.mutual_information_recursion(torch.zeros(2, 2, 5), torch.zeros(2, 3, 4), impl="cuda"), "impl"),
        (lambda: k2.do_rnnt_pruning(am, lm, torch.full((2, 4, 2), 2)), "ranges"),
        (lambda: k2.do_rnnt_pruning(am, lm, torch.tensor([0, 2]).expand(2, 4, 2)), "ranges"),
        (lambda: k2.rnnt_loss_pruned(logits[:, :, :2], symbols, torch.zeros(2, 4, 3, dtype=torch.long), 0), "ranges"),
        (lambda: k2.get_rnnt_prune_ranges(torch.zeros(2, 2, 5), torch.zeros(2, 3, 4), boundary, 0), "s_range"),
        (lambda: k2.get_rnnt_prune_ranges(torch.zeros(2, 2, 5), torch.zeros(2, 2, 4), boundary, 2), "py_grad"),
    ]
    for fn, name in cases:
        with pytest.raises(ValueError, match=name):
            fn()


# -- the module ---------------------------------------------------------------------------------


class TinyTransducer(torch.nn.Module):
    """The network protocol of lightning_gtn.nn.rnnt, as small as it gets."""

    def __init__(self, V=5, J=4):
        super().__init__()
        self.embed = torch.nn.Embedding(V, J)
        self.out = torch.nn.Linear(J, V)
        self.am_proj = torch.nn.Linear(J, V)
        self.lm_proj = torch.nn.Linear(J, V)

    def predict(self, tokens, state=None):
        return self.embed(tokens), state

    def join(self, enc, pred):
        return self.out(torch.tanh(enc + pred))

    def simple_am(self, enc):
        return self.am_proj(enc)

    def simple_lm(self, pred):
        return self.lm_proj(pred)


def test_module_warmup_schedules():
    lin = PrunedRNNTLoss(simple_loss_scale=0.5, warm_step=100)
    assert lin.scales(0) == (1.0, pytest.approx(0.1))
    assert lin.scales(50) == (pytest.approx(0.75), pytest.approx(0.55))
    assert lin.scales(100) == (0.5, 1.0)
    step = PrunedRNNTLoss(simple_loss_scale=0.5, warm_step=100, warmup="step")
    assert [step.scales(n) for n in (0, 99, 100, 199, 200)] == [
        (0.5, 0.0),
        (0.5, 0.0),
        (0.5, 0.1),
        (0.5, 0.1),
        (0.5, 1.0),
    ]
    lin.set_step(60)
    assert lin.step == 60 and lin.scales() == lin.scales(60)
    assert isinstance(lin, RNNTStructuredLoss) and lin.topology == "rnnt"
    for kw in ({"s_range": 0}, {"rnnt_type": "x"}, {"warmup": "cosine"}, {"lm_only_scale": 0.8, "am_only_scale": 0.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            PrunedRNNTLoss(**kw)


def test_module_forward_and_joint_loss():
    torch.manual_seed(0)
    net = TinyTransducer().double()
    B, T = 2, 6
    enc = torch.randn(B, T, 4, dtype=torch.float64)
    targets = torch.tensor([[1, 2, 3], [4, 1, -1]])  # padding may hold anything
    tl, el = torch.tensor([3, 2]), torch.tensor([6, 5])
    loss = PrunedRNNTLoss(blank=0, s_range=10, simple_loss_scale=0.0, warmup="none", lm_only_scale=0.0)
    # with every position kept and no simple loss, the pruned loss is the full one
    pred, _ = net.predict(torch.cat([torch.zeros(B, 1, dtype=torch.long), targets.clamp(min=0)], 1))
    full = loss(net.join(enc[:, :, None], pred[:, None]), targets, el, tl)
    got = loss.joint_loss(net, enc, el, targets, tl)
    assert got.item() == pytest.approx(full.item(), rel=1e-9)
    assert set(loss.last_losses) == {"simple", "pruned"}
    # the default schedule at step 0: simple loss at weight 1, pruned at 0.1, gradients everywhere
    m = PrunedRNNTLoss(blank=0)
    out = m.joint_loss(net.float(), enc.float(), el, targets, tl)
    want = m.last_losses["simple"] + 0.1 * m.last_losses["pruned"]
    assert out.item() == pytest.approx(want.item(), rel=1e-5)
    out.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    with pytest.raises(ValueError, match="target_lengths"):
        m.joint_loss(net, enc.float(), el, targets, torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="targets"):
        m.joint_loss(net, enc.float(), el, torch.tensor([[1, 2, 9], [4, 1, -1]]), tl)
    with pytest.raises(ValueError, match="blank"):
        PrunedRNNTLoss(blank=7)(torch.zeros(2, 6, 4, 5), targets, el, tl)
    with pytest.raises(ValueError, match="encoder_lengths"):
        m.joint_loss(net, enc.float(), torch.tensor([7, 1]), targets, tl)


def test_ranges_follow_a_sharp_alignment():
    # one alignment dominates: symbol k at frame 2k, blanks elsewhere; two positions per frame
    # (k, k + 1) hold it, so pruning to s_range=2 loses almost nothing
    B, T, S, C = 1, 8, 4, 6
    symbols = torch.tensor([[1, 2, 3, 4]])
    lm = torch.zeros(B, S + 1, C, dtype=torch.float64)
    am = torch.zeros(B, T, C, dtype=torch.float64)
    am[0, :, 0] = 6.0
    for k in range(S):
        am[0, 2 * k, k + 1] = 12.0
    _, (px_grad, py_grad) = k2.rnnt_loss_simple(lm, am, symbols, 0, return_grad=True)
    ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, None, 2)
    for k in range(S):
        assert ranges[0, 2 * k].tolist() == [k, k + 1]
    am_p, lm_p = k2.do_rnnt_pruning(am, lm, ranges)
    pruned = k2.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0)
    full = k2.rnnt_loss(am[:, :, None] + lm[:, None], symbols, 0)
    assert full.item() < pruned.item() < full.item() + 1e-2


def test_empty_sequences_and_frames():
    g = torch.Generator().manual_seed(23)
    B, T, S, C = 3, 4, 2, 5
    lm, am = torch.randn(B, S + 1, C, generator=g), torch.randn(B, T, C, generator=g)
    symbols = torch.randint(1, C, (B, S), generator=g)
    boundary = torch.tensor([[0, 0, 2, 0], [0, 0, 0, 4], [0, 0, 0, 0]])  # no frame; no symbol; neither
    loss, (px_grad, py_grad) = k2.rnnt_loss_simple(lm, am, symbols, 0, boundary, reduction="none", return_grad=True)
    assert math.isinf(loss[0].item()) and loss[2].item() == 0.0
    # no symbol: four blanks in context 0
    assert loss[1].item() == pytest.approx(-(am[1] + lm[1, 0]).log_softmax(-1)[:, 0].sum().item(), rel=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the frameless row asks for no wider range
        ranges = k2.get_rnnt_prune_ranges(px_grad, py_grad, boundary, 2)
    am_p, lm_p = k2.do_rnnt_pruning(am, lm, ranges)
    pruned = k2.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, boundary, reduction="none")
    torch.testing.assert_close(pruned, loss)
