"""ctc_loss against torch's ctc_loss, brute force, the engine, and itself batched."""

import math

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import ctc_loss

from ._brute import ctc_ref

IMPLS = ["numba_ctc", "numba", "numba_log", "torch"]


def _batch(seed, B, T, C, S, dtype=torch.float64, min_len=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=dtype)
    il = torch.randint(max(min_len, 0), T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.randint(0, S + 1, (B,), generator=g)
    tg = torch.randint(1, C, (B, S), generator=g)
    return x, tg, il, tl


def _torch_ctc(x, tg, il, tl, reduction="none", zero_infinity=False):
    return TF.ctc_loss(x.log_softmax(-1).transpose(0, 1), tg, il, tl, reduction=reduction, zero_infinity=zero_infinity)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_values_and_grads_match_torch(impl, reduction):
    x, tg, il, tl = _batch(0, 6, 30, 7, 10)
    x.requires_grad_(True)
    ours = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction=reduction, zero_infinity=True, impl=impl)
    ref = _torch_ctc(x, tg, il, tl, reduction, zero_infinity=True)
    torch.testing.assert_close(ours, ref)
    (g1,) = torch.autograd.grad(ours.sum(), x)
    (g2,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("impl", IMPLS)
def test_random_shapes_repeats_empty_and_concatenated_targets(impl):
    for seed in range(4):
        g = torch.Generator().manual_seed(100 + seed)
        B, T, C = 1 + seed * 2, 5 + 7 * seed, 2 + seed
        x = torch.randn(B, T, C, generator=g, dtype=torch.float64, requires_grad=True)
        il = torch.randint(0, T + 1, (B,), generator=g)
        tl = torch.minimum(torch.randint(0, 6, (B,), generator=g), il // 2)
        tg = torch.randint(1, C, (B, 6), generator=g)  # C=2: every token repeats
        tl[0] = 0  # an empty target
        flat = torch.cat([tg[b, : tl[b]] for b in range(B)])
        ours = ctc_loss(x.log_softmax(-1), flat, il, tl, reduction="none", impl=impl)
        ref = _torch_ctc(x, tg, il, tl)
        torch.testing.assert_close(ours, ref)
        (g1,) = torch.autograd.grad(ours.sum(), x)
        (g2,) = torch.autograd.grad(ref.sum(), x)
        torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("impl", IMPLS)
def test_infeasible_targets(impl):
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor([[1, 1, 1], [1, 2, 3], [2, 2, 0]])  # 1,1,1 needs 5 frames; 1,2,3 fits in 3
    il = torch.tensor([4, 3, 2])
    tl = torch.tensor([3, 3, 2])  # 2,2 needs 3 frames, has 2
    loss = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", impl=impl)
    assert math.isinf(loss[0].item()) and math.isinf(loss[2].item()) and math.isfinite(loss[1].item())
    torch.testing.assert_close(loss[1], _torch_ctc(x, tg, il, tl)[1])
    z = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", zero_infinity=True, impl=impl)
    assert z[0].item() == 0.0 and z[2].item() == 0.0
    (g,) = torch.autograd.grad(z.sum(), x)
    assert torch.all(g[0] == 0) and torch.all(g[2] == 0) and torch.any(g[1] != 0)
    # mean over a batch with an infinite member is infinite, as torch's
    assert math.isinf(ctc_loss(x.log_softmax(-1), tg, il, tl, impl=impl).item())


@pytest.mark.parametrize("impl", IMPLS)
def test_brute_force_on_raw_scores(impl):
    # not log-probabilities: the loss is -logsumexp over alignments of any scores
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    targets = [[1, 2], [2, 2], []]
    il = [5, 5, 3]
    ours = ctc_loss(x, torch.tensor([1, 2, 2, 2]), il, [2, 2, 0], reduction="none", impl=impl)
    ref = torch.stack([ctc_ref(x[b, : il[b]], targets[b]) for b in range(3)])
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_blank_not_zero():
    x = torch.randn(2, 8, 4, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor([[0, 1], [2, 2]])
    ours = ctc_loss(x.log_softmax(-1), tg, [8, 7], [2, 2], blank=3, reduction="none")
    ref = TF.ctc_loss(
        x.log_softmax(-1).transpose(0, 1), tg, torch.tensor([8, 7]), torch.tensor([2, 2]), blank=3, reduction="none"
    )
    torch.testing.assert_close(ours, ref)


def test_matches_engine_intersect_forward_score():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 9, 4, generator=g).log_softmax(-1)
    target = [1, 3, 3]
    ours = ctc_loss(x, torch.tensor([target]), [9], [3], reduction="none")
    em = gtn.linear_graph(9, 4, calc_grad=False)
    em.set_weights(x[0].contiguous().numpy())
    ref = -gtn.forward_score(gtn.intersect(gtn.criterion.ctc_graph(target, 0), em)).item()
    assert abs(ours.item() - ref) < 1e-4


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 12), st.integers(2, 5), st.integers(0, 10_000))
def test_batched_equals_one_by_one(B, T, C, seed):
    x, tg, il, tl = _batch(seed, B, T, C, 4)
    tl = torch.minimum(tl, il)
    full = ctc_loss(x, tg, il, tl, reduction="none")
    for b in range(B):
        one = ctc_loss(
            x[b : b + 1, : max(int(il[b]), 0)], tg[b : b + 1], il[b : b + 1], tl[b : b + 1], reduction="none"
        )
        torch.testing.assert_close(full[b : b + 1], one)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_float64(impl):
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor([[1, 2], [3, 3]])

    def f(inp):
        return ctc_loss(inp, tg, [6, 5], [2, 2], reduction="none", impl=impl)

    assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_scored_in_float32(dtype):
    x = torch.randn(3, 20, 6)
    tg = torch.randint(1, 6, (3, 5))
    lp = x.log_softmax(-1).to(dtype).requires_grad_(True)
    loss = ctc_loss(lp, tg, [20, 18, 15], [5, 4, 3])
    assert loss.dtype == dtype
    loss.backward()
    assert lp.grad.dtype == dtype
    ref = ctc_loss(lp.detach().float(), tg, [20, 18, 15], [5, 4, 3])
    assert abs(loss.float().item() - ref.item()) < 2e-2 * abs(ref.item())


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_emissions_give_nan(impl):
    x = torch.randn(2, 6, 4, requires_grad=True)
    lp = x.log_softmax(-1)
    lp = torch.where(torch.arange(2).reshape(2, 1, 1) == 0, lp, torch.full_like(lp, float("nan")))
    loss = ctc_loss(lp, torch.tensor([[1, 2], [1, 2]]), [6, 6], [2, 2], reduction="none", impl=impl)
    assert math.isfinite(loss[0].item()) and math.isnan(loss[1].item())
    loss.sum().backward()  # no crash
    assert torch.isfinite(x.grad[0]).all()


def test_peaky_emissions_fall_back_correctly(monkeypatch):
    # a confident "all blank" model: the scaled graph kernel underflows and must hand over to
    # the log-domain kernel; values must still match torch's
    T, C, L = 120, 6, 40
    x = torch.full((2, T, C), -300.0, dtype=torch.float64)
    x[:, :, 0] = 0.0
    x = (x + 0.1 * torch.randn(2, T, C, dtype=torch.float64)).requires_grad_(True)
    tg = torch.randint(1, C, (2, L))
    il, tl = torch.tensor([T, T]), torch.tensor([L, L])
    from lightning_gtn.core import dispatch

    calls = []
    original = dispatch.forward
    monkeypatch.setattr(dispatch, "forward", lambda *a, **k: (calls.append(a[0].num_examples), original(*a, **k))[1])
    ours = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", impl="numba")
    assert calls == [2]  # both examples were redone in the log domain
    ref = _torch_ctc(x, tg, il, tl)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_cache_reuses_graphs():
    from lightning_gtn.core import criterion_graphs

    a = criterion_graphs.compiled_ctc((1, 2, 3), 0)
    b = criterion_graphs.compiled_ctc([1, 2, 3], 0)
    assert a is b


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x, tg, il, tl = _batch(1, 4, 40, 8, 10, dtype=torch.float32)
    xc = x.cuda().requires_grad_(True)
    x.requires_grad_(True)
    a = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none")
    b = ctc_loss(xc.log_softmax(-1), tg.cuda(), il.cuda(), tl.cuda(), reduction="none")
    assert b.device.type == "cuda"
    torch.testing.assert_close(a, b.cpu(), rtol=1e-4, atol=1e-4)
    (ga,) = torch.autograd.grad(a.sum(), x)
    (gb,) = torch.autograd.grad(b.sum(), xc)
    torch.testing.assert_close(ga, gb.cpu(), rtol=1e-4, atol=1e-4)


def test_torch_path_in_small_frame_blocks(monkeypatch):
    from lightning_gtn.kernels import graph_torch

    monkeypatch.setattr(graph_torch, "OCC_BLOCK_ELEMENTS", 50)  # forces many blocks of frames
    x, tg, il, tl = _batch(9, 3, 17, 5, 4)
    x.requires_grad_(True)
    ours = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="sum", zero_infinity=True, impl="torch")
    ref = _torch_ctc(x, tg, il, tl, "sum", zero_infinity=True)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(ref, x)[0])


def test_list_targets_and_cache_size():
    from lightning_gtn.core import criterion_graphs
    from lightning_gtn.functional import set_cache_size

    x = torch.randn(2, 6, 4).log_softmax(-1)
    a = ctc_loss(x, [[1, 2], [3]], [6, 5], [2, 1], reduction="none")
    b = ctc_loss(x, torch.tensor([[1, 2], [3, 0]]), [6, 5], [2, 1], reduction="none")
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="lengths equal target_lengths"):
        ctc_loss(x, [[1, 2], [3]], [6, 5], [2, 2])
    old = criterion_graphs.CACHE_SIZE
    try:
        set_cache_size(1)
        ctc_loss(x, [[1, 2], [3]], [6, 5], [2, 1])
        assert len(criterion_graphs._CACHES["ctc"]) == 1
    finally:
        set_cache_size(old)


def test_no_grad_mode_gives_same_values():
    x, tg, il, tl = _batch(4, 3, 10, 5, 3, dtype=torch.float32)
    x.requires_grad_(True)
    with torch.no_grad():
        a = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", zero_infinity=True)
    b = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", zero_infinity=True)
    assert a.grad_fn is None and b.grad_fn is not None
    torch.testing.assert_close(a, b.detach())


@pytest.mark.parametrize("one_scale_first", [False, True])
def test_long_inputs_stay_on_the_scaled_kernel_and_accurate_in_float32(monkeypatch, one_scale_first):
    # with one scale per frame, alpha's peak runs ahead of the states the posterior occupies and
    # those underflow at T in the thousands; the per-segment scales keep them, so no example
    # falls back to the log-domain kernels, and the float32 gradient stays within 1e-4 of the
    # float64 one (the float32 log-domain kernels, the old fallback, are off by 7e-3 here).
    # one_scale_first: the examples first fail with one scale per frame and are retried.
    from lightning_gtn.core import dispatch
    from lightning_gtn.kernels import graph_numba

    if one_scale_first:
        monkeypatch.setattr(graph_numba, "SEG_MIN_FRAMES", 10**9)

    calls = []
    original = dispatch.forward
    monkeypatch.setattr(dispatch, "forward", lambda *a, **k: (calls.append(a[0].num_examples), original(*a, **k))[1])
    T, C, L = 3000, 30, 300
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, T, C, generator=g)
    tg = torch.randint(1, C, (2, L), generator=g)
    il, tl = torch.tensor([T, T - 500]), torch.tensor([L, L - 40])
    grads = []
    for dtype in (torch.float32, torch.float64):
        x = logits.to(dtype).clone().requires_grad_(True)
        loss = ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="sum")
        grads.append((loss, torch.autograd.grad(loss, x)[0]))
    assert calls == []
    (l32, g32), (l64, g64) = grads
    assert abs(l32.double() - l64).item() < 1e-2 * L
    assert (g32.double() - g64).abs().max().item() < 1e-4
    ref = _torch_ctc(logits.double().requires_grad_(True), tg, il, tl, "sum")
    torch.testing.assert_close(l64, ref)


def test_triton_ctc_needs_cuda_or_the_interpreter():
    from lightning_gtn.core.impl import interpreted

    x, tg, il, tl = _batch(2, 2, 6, 5, 2)
    assert not interpreted()
    with pytest.raises(ValueError, match=r"impl='triton_ctc' runs on CUDA tensors .* got emissions on cpu"):
        ctc_loss(x.log_softmax(-1), tg, il, tl, impl="triton_ctc")
    from lightning_gtn.functional import asg_loss

    with pytest.raises(ValueError, match="not offered"):  # CTC's own kernel, no other loss's
        asg_loss(x.log_softmax(-1), tg, il, tl, transitions=torch.zeros(6, 5), impl="triton_ctc")


@pytest.mark.parametrize("verdict", [None, "wrong gradient"])
def test_cuda_default_is_triton_ctc_once_its_self_check_passes(monkeypatch, verdict):
    from lightning_gtn.core.impl import Backends
    from lightning_gtn.losses import ctc as ctc_mod

    runs = []

    def self_check(device):
        runs.append(str(device))
        return verdict

    picker = Backends("ctc_loss", ("triton",), triton_available=lambda: True, self_check=self_check)
    monkeypatch.setattr(ctc_mod, "_TRITON_CTC", picker)
    monkeypatch.setattr(ctc_mod.ctc_triton, "available", lambda: True)
    crit = ctc_mod.criterion.CRITERIA["ctc"]
    dev = torch.device("cuda", 3)
    if verdict is None:
        assert crit.own_kernel(dev, None) == "triton_ctc"
    else:
        with pytest.warns(RuntimeWarning, match="self-check on cuda:3 \\(wrong gradient\\)"):
            assert crit.own_kernel(dev, None) is None  # the graph path, as without triton
    assert crit.own_kernel(dev, None) == ("triton_ctc" if verdict is None else None)
    assert runs == ["cuda:3"]  # once per device
    assert crit.own_kernel(torch.device("cpu"), None) == "numba_ctc"
    monkeypatch.setattr(ctc_mod.ctc_triton, "available", lambda: False)
    assert crit.own_kernel(torch.device("cuda", 4), None) is None
    assert runs == ["cuda:3"]


def test_the_first_cuda_call_may_come_under_torch_compile(monkeypatch):
    """The self-check runs eagerly when dynamo meets the device's first call (its result is a
    constant to the compiler), so a model step with ctc_loss still compiles with fullgraph."""
    from lightning_gtn.core.impl import Backends
    from lightning_gtn.losses import ctc as ctc_mod

    runs = []

    def self_check(device):  # untraceable: a backward and a host read
        x = torch.ones(2, requires_grad=True)
        with torch.enable_grad():
            (2 * x).sum().backward()
        runs.append((str(device), x.grad.tolist()))

    picker = Backends("ctc_loss", ("triton",), triton_available=lambda: True, self_check=self_check)
    monkeypatch.setattr(ctc_mod, "_TRITON_CTC", picker)
    monkeypatch.setattr(ctc_mod.ctc_triton, "available", lambda: True)
    crit = ctc_mod.criterion.CRITERIA["ctc"]

    def f(x):
        return x + (1.0 if crit.own_kernel(torch.device("cuda", 5), None) == "triton_ctc" else 2.0)

    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.compile(f, fullgraph=True)(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert runs == [("cuda:5", [2.0, 2.0])]
