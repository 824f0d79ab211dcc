"""``mmi_loss`` and ``mmi_denominator_score``: equal to the generic ``graph_loss`` with the same
numerators and denominators, to a brute-force enumeration of the denominator's paths, float64
gradcheck, the custom op under ``torch.compile(fullgraph=True)``, and clear errors (fuzzed).

No public MMI test has numeric references (k2, icefall, pychain test against their own code), so
brute force is the reference: every path of the denominator with ``T`` arcs is enumerated, its
class sequence read off; the numerator is the paths whose class sequence collapses (CTC: merge
repeats, drop blanks) to the target.
"""

import gc
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.core.topologies import compose_token_acceptor, num_classes, numerator_graph
from lightning_gtn.functional import graph_loss, mmi_denominator_score, mmi_loss
from lightning_gtn.kernels import buffers, mmi_numba
from lightning_gtn.kernels.buffers import BufferPool
from lightning_gtn.losses.mmi import denominator_handle, denominator_op


def bigram_den(N, topology="ctc", seed=0, keep=1.0):
    """A token bigram over ``N`` tokens (random log-probabilities) composed with ``topology``."""
    rng = np.random.default_rng(seed)
    allowed = rng.random((N + 1, N)) < keep
    allowed[:, 0] = True
    nxt = np.concatenate([np.full((N + 1, 1), -1), np.where(allowed, np.arange(1, N + 1)[None, :], -1)], axis=1)
    logp = np.log(rng.dirichlet(np.ones(N + 1), size=N + 1))
    return compose_token_acceptor(N, topology, nxt.astype(np.int64), logp, 0, np.ones(N + 1, dtype=bool))


def collapse(x):
    out, prev = [], None
    for c in x:
        if c != prev and c != 0:
            out.append(c)
        prev = c
    return out


def brute_mmi(den, E, target):
    """``(log Z_num, log Z_den)`` by enumerating every path of ``len(E)`` arcs of ``den``."""
    a = den.arrays()
    T = E.shape[0]
    start, accept = set(a.start.tolist()), set(a.accept.tolist())
    num, tot = [], []
    out = {s: [] for s in range(a.num_nodes)}
    for k in range(len(a.src)):
        out[a.src[k]].append(k)

    def walk(node, t, score, labels):
        if t == T:
            if node in accept:
                tot.append(score)
                if collapse(labels) == list(target):
                    num.append(score)
            return
        for k in out[node]:
            walk(a.dst[k], t + 1, score + float(a.weights[k]) + E[t, a.ilabel[k]].item(), labels + [a.ilabel[k]])

    for s in start:
        walk(s, 0, 0.0, [])
    lse = lambda v: -math.inf if not v else float(np.logaddexp.reduce(np.array(v)))  # noqa: E731
    return lse(num), lse(tot)


def test_equals_brute_force_enumeration():
    N = 2
    den = bigram_den(N, seed=1)
    E = torch.randn(3, 4, N + 1, dtype=torch.float64).log_softmax(-1)
    targets = [[1, 2], [2], [1, 1]]
    il = torch.tensor([4, 3, 4])
    got = mmi_loss(E, targets, il, denominator=den, reduction="none")
    z = mmi_denominator_score(E, il, den)
    for b, y in enumerate(targets):
        num, tot = brute_mmi(den, E[b, : il[b]], y)
        assert abs(z[b].item() - tot) < 1e-10
        assert abs(got[b].item() - (tot - num)) < 1e-10


@pytest.mark.parametrize("topology", ["ctc", "modified_ctc", "hmm1", "hmm2"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_equals_graph_loss_with_the_same_numerators_and_denominators(topology, reduction):
    N = 3
    den = bigram_den(N, topology, seed=2, keep=0.7)
    C = num_classes(N, topology)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, C, generator=g, dtype=torch.float64)
    tg = torch.tensor([[1, 2, 3], [3, 3, 0], [2, 0, 0], [1, 3, 2]])
    tl = torch.tensor([3, 2, 1, 3])
    il = torch.tensor([7, 6, 4, 7])
    x1 = x.clone().requires_grad_()
    ours = mmi_loss(x1, tg, il, tl, denominator=den, topology=topology, reduction=reduction)
    nums = [numerator_graph(tg[b, : tl[b]].tolist(), N, topology, denominator=den) for b in range(4)]
    x2 = x.clone().requires_grad_()
    # graph_loss: -log Z(graphs[b]) + log Z(denominators[b]), the same sign as the MMI loss
    ref = graph_loss(x2, input_lengths=il, target_lengths=tl, graphs=nums, denominators=[den] * 4, reduction=reduction)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    (ours.sum() if ours.dim() else ours).backward()
    (ref.sum() if ref.dim() else ref).backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-10)


def test_gradcheck_float64_with_den_scale_and_leaky_hmm():
    den = bigram_den(2, seed=3)
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    tg, tl, il = torch.tensor([[1, 2], [2, 0]]), torch.tensor([2, 1]), torch.tensor([4, 3])

    def f(y):
        return mmi_loss(y, tg, il, tl, denominator=den, den_scale=0.6, leaky_hmm=0.2, reduction="sum")

    assert torch.autograd.gradcheck(f, (x,), fast_mode=True)
    assert torch.autograd.gradcheck(
        lambda y: mmi_denominator_score(y, il, den, leaky_hmm=0.1, impl="torch"), (x,), fast_mode=True
    )


def test_den_scale_and_leaky_hmm_enter_as_defined():
    den = bigram_den(2, seed=4)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    tg, tl, il = torch.tensor([[1, 2], [2, 0]]), torch.tensor([2, 1]), torch.tensor([5, 4])
    base = mmi_loss(x, tg, il, tl, denominator=den, den_scale=0.0, reduction="none")  # -log Z_num alone
    z = mmi_denominator_score(x, il, den, leaky_hmm=0.3)
    got = mmi_loss(x, tg, il, tl, denominator=den, den_scale=0.5, leaky_hmm=0.3, reduction="none")
    torch.testing.assert_close(got, base + 0.5 * z)
    assert (z > mmi_denominator_score(x, il, den)).all()  # leaking adds paths


def test_zero_infinity_reductions_and_impls():
    den = bigram_den(2, seed=5)
    x = torch.randn(3, 4, 3, dtype=torch.float64, requires_grad=True)
    tg, tl, il = torch.tensor([[1, 2, 1], [1, 1, 1], [2, 0, 0]]), torch.tensor([3, 3, 1]), torch.tensor([4, 4, 2])
    # row 1 needs 5 frames (1 blank 1 blank 1): no numerator path
    none = mmi_loss(x, tg, il, tl, denominator=den, reduction="none")
    assert torch.isinf(none[1]) and torch.isfinite(none[[0, 2]]).all()
    zi = mmi_loss(x, tg, il, tl, denominator=den, reduction="none", zero_infinity=True)
    assert zi[1] == 0 and torch.equal(zi[[0, 2]], none[[0, 2]])
    mean = mmi_loss(x, tg, il, tl, denominator=den, zero_infinity=True)
    torch.testing.assert_close(mean, (zi / tl.clamp(min=1)).mean())
    torch.testing.assert_close(mmi_loss(x, tg, il, tl, denominator=den, reduction="sum", zero_infinity=True), zi.sum())
    mean.backward()
    assert not x.grad[1].any() and x.grad[0].abs().sum() > 0
    tz = mmi_loss(x, tg, il, tl, denominator=den, reduction="none", zero_infinity=True, impl="torch")
    torch.testing.assert_close(tz, zi)
    f32 = mmi_loss(x.detach().float(), tg, il, tl, denominator=den, reduction="none", zero_infinity=True)
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.double(), zi, rtol=1e-5, atol=1e-5)


def test_arc_weight_gradient_into_graph_grad_equals_graph_loss():
    den = bigram_den(2, seed=6)
    den.calc_grad = True
    x = torch.randn(3, 5, 3, dtype=torch.float64)
    il = torch.tensor([5, 2, 4])
    den.zero_grad()
    mmi_denominator_score(x, il, den).sum().backward()
    ours = np.array(den.grad().weights_to_list())
    den.zero_grad()
    graph_loss(x.requires_grad_(), input_lengths=il, graphs=[den] * 3, reduction="sum").backward()
    np.testing.assert_allclose(ours, -np.array(den.grad().weights_to_list()), atol=1e-5)
    assert np.abs(ours).sum() > 0


def test_compiles_fullgraph_and_opcheck():
    den = bigram_den(3, seed=7)
    x = torch.randn(2, 6, 4)
    tg, tl, il = torch.tensor([[1, 2], [3, 0]]), torch.tensor([2, 1]), torch.tensor([6, 4])
    lin = torch.nn.Linear(4, 4)

    def step(inp):
        return mmi_loss(lin(inp), tg, il, tl, denominator=den, den_scale=0.9)

    with pytest.raises(Exception, match="not been seen yet"):  # registering needs one eager call
        torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    eager = step(x)
    (ge,) = torch.autograd.grad(eager, lin.weight)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    (gc,) = torch.autograd.grad(compiled, lin.weight)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(gc, ge)
    h = denominator_handle(den)
    torch.library.opcheck(denominator_op, (x.double().requires_grad_(), il, h, 0.1, "", True, False))


@pytest.mark.parametrize("calc_grad", [False, True])
def test_eager_path_equals_the_custom_op(calc_grad):
    """Outside ``torch.compile`` the denominator runs as a plain autograd Function (no custom op
    dispatch), with its backward in numpy on the CPU: the same values and gradients as the op,
    for every upstream gradient (zero, negative, a row with no path), and backward twice."""
    den = gtn.Graph(calc_grad)  # accepts only even lengths: odd rows have no path
    den.add_node(True, True)
    den.add_node()
    den.add_arc(0, 1, 1, 1, 0.3)
    den.add_arc(0, 1, 2, 2, -0.2)
    den.add_arc(1, 0, 0, 0, 0.1)
    den.add_arc(1, 0, 2, 2, 0.0)
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    il = torch.tensor([6, 3, 0, 4])
    g = torch.tensor([0.5, -2.0, 1.0, 0.0], dtype=torch.float64)
    xa = x.clone().requires_grad_()
    a = mmi_denominator_score(xa, il, den, leaky_hmm=0.0)
    assert torch.isinf(a[1]) and a[2] == 0.0
    assert type(a.grad_fn).__name__ == "_EagerDenominatorBackward"
    (a * g).sum().backward(retain_graph=True)
    ga, wa = xa.grad.clone(), den.grad().weights_to_numpy().copy() if calc_grad else None
    (a * g).sum().backward()  # a second backward through the same graph gives the same gradient again
    torch.testing.assert_close(xa.grad, 2 * ga)
    den.zero_grad()
    xb = x.clone().requires_grad_()
    b = denominator_op(xb, il, denominator_handle(den), 0.0, "", True, calc_grad)[0]
    (b * g).sum().backward()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, xb.grad)
    assert ga[1].abs().sum() == 0 and ga[0].abs().sum() > 0
    if calc_grad:
        np.testing.assert_allclose(wa, den.grad().weights_to_numpy(), rtol=1e-6)
        assert np.abs(wa).sum() > 0


def test_eager_backward_scales_in_place_and_a_retained_graph_computes_again():
    """The eager backward hands the kernel's gradient on, scaled in place: the leaf's ``grad`` is
    that array. Through a retained graph every further backward computes the gradient again from
    the saved inputs, whatever was done to the first one (zeroed here in place); an input changed
    in place after the forward makes the backward fail as autograd's own do."""
    den = bigram_den(3)
    il = torch.tensor([9, 5])
    x = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    ref = torch.autograd.grad(denominator_op(x, il, denominator_handle(den), 0.0, "", True, False)[0].sum(), x)[0]
    out = mmi_denominator_score(x, il, den)
    g = torch.tensor([1.5, -0.5], dtype=torch.float64)
    (out * g).sum().backward(retain_graph=True)
    first = x.grad
    torch.testing.assert_close(first, ref * g.reshape(-1, 1, 1))
    first.zero_()  # the leaf's gradient is the kernel's array: changing it must not reach the node
    for k in range(1, 3):
        (out * g).sum().backward(retain_graph=True)
        torch.testing.assert_close(x.grad, k * ref * g.reshape(-1, 1, 1))
    y = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    z = y * 1.0
    out = mmi_denominator_score(z, il, den)
    with torch.no_grad():
        z.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_eager_backward_computes_again_only_for_a_second_emission_gradient(monkeypatch):
    """Only the arc weights' gradient asked for (the emissions need none): the backward scales
    nothing in place, so neither its first nor a second backward runs the kernel again, and each
    adds the same gradient into the graph's ``grad()``."""
    den = bigram_den(3)
    den.calc_grad = True
    x = torch.randn(2, 7, 4, dtype=torch.float64)
    il = torch.tensor([7, 4])
    calls = []
    real = mmi_numba.shared_scores
    monkeypatch.setattr(mmi_numba, "shared_scores", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = mmi_denominator_score(x, il, den)
    out.sum().backward(retain_graph=True)
    once = den.grad().weights_to_numpy().copy()
    out.sum().backward()
    assert len(calls) == 1
    assert np.abs(once).sum() > 0
    np.testing.assert_allclose(den.grad().weights_to_numpy(), 2 * once, rtol=1e-6)


def test_eager_path_hands_its_buffers_back_without_the_garbage_collector(monkeypatch):
    """The kernel's ``(B, T, C)`` gradient comes from a pool that reuses an array once nobody
    holds it, and the backward scales it in place into the gradient it returns: after the
    backward, the autograd node must not keep it alive (an output kept as an attribute of ``ctx``
    made a reference cycle, which held it until the garbage collector ran, and every call faulted
    in fresh pages), and no second array is needed."""
    pool = BufferPool(64 << 20)
    monkeypatch.setattr(mmi_numba, "OUTPUTS", pool)
    monkeypatch.setattr(buffers, "OUTPUTS", pool)
    den = bigram_den(3)
    il = torch.tensor([9, 7])
    gc.collect()
    gc.disable()
    try:
        for _ in range(4):
            x = torch.randn(2, 9, 4, requires_grad=True)
            mmi_denominator_score(x, il, den).sum().backward()
            assert x.grad.abs().sum() > 0
            del x
    finally:
        gc.enable()
    assert pool.kept_bytes == 2 * 9 * 4 * 4  # the kernel's gradient, scaled in place, reused


def test_errors_are_clear():
    den = bigram_den(2)
    x = torch.randn(2, 4, 3)
    tg, tl, il = torch.tensor([[1, 2], [2, 0]]), torch.tensor([2, 1]), torch.tensor([4, 3])
    cases = [
        (dict(targets=torch.tensor([[1, 3], [2, 0]])), "token id 3"),
        (dict(targets=torch.tensor([[0, 1], [2, 0]])), "token id 0"),
        (dict(input_lengths=torch.tensor([5, 3])), "input_lengths must be <= T=4"),
        (dict(den_scale=-1.0), "den_scale"),
        (dict(den_scale=float("nan")), "den_scale"),
        (dict(leaky_hmm=1.0), "leaky_hmm"),
        (dict(topology="hmm3"), "topology"),
        (dict(log_probs=torch.randn(2, 4)), "log_probs"),
        (dict(log_probs=torch.randn(2, 4, 2), targets=torch.tensor([[1, 1], [1, 0]])), r"label 2 out of range.*C=2"),
        (dict(denominator="P"), "denominator"),
        (dict(reduction="avg"), "reduction"),
        (dict(impl="gtn"), "impl"),
    ]
    for change, msg in cases:
        kw = dict(log_probs=x, targets=tg, input_lengths=il, target_lengths=tl, denominator=den)
        kw.update(change)
        args = [kw.pop(k) for k in ("log_probs", "targets", "input_lengths", "target_lengths")]
        with pytest.raises(ValueError, match=msg):
            mmi_loss(*args, **kw)
    eps = gtn.Graph(False)
    eps.add_node(True, True)
    eps.add_arc(0, 0, gtn.epsilon)
    with pytest.raises(ValueError, match="epsilon"):
        mmi_denominator_score(x, il, eps)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arcs=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.integers(0, 2),
            st.integers(-1, 4),
            st.sampled_from([0.0, -1.5, 2.0, float("nan"), float("inf"), -float("inf")]),
        ),
        max_size=8,
    ),
    lengths=st.lists(st.integers(-1, 5), min_size=2, max_size=2),
    target=st.lists(st.integers(-1, 4), max_size=3),
    special=st.sampled_from([None, float("nan"), float("inf"), -float("inf")]),
    leaky=st.sampled_from([0.0, 0.5]),
)
def test_fuzz_bad_graphs_and_inputs_never_crash(arcs, lengths, target, special, leaky):
    g = gtn.Graph(False)
    for i in range(3):
        g.add_node(i == 0, i == 2)
    for s, d, lab, w in arcs:
        g.add_arc(s, d, lab, lab, w)
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    if special is not None:
        x[0, 1, 2] = special
    tl = torch.tensor([len(target), 0])
    tg = torch.tensor([target + [1] * (3 - len(target)), [1, 1, 1]])
    try:
        out = mmi_loss(x, tg, torch.tensor(lengths), tl, denominator=g, leaky_hmm=leaky, reduction="none")
    except ValueError:
        return
    assert out.shape == (2,)
    # the numerator's paths are a subset of the denominator's, with the same weights: loss >= 0
    assert not (torch.isfinite(out) & (out < -1e-9)).any()
    z = mmi_denominator_score(x, torch.tensor(lengths), g, leaky_hmm=leaky)
    t = mmi_denominator_score(x, torch.tensor(lengths), g, leaky_hmm=leaky, impl="torch")
    torch.testing.assert_close(z, t, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_tensors_equal_the_cpu_kernel(dtype):
    """On CUDA tensors the torch path runs on the device: the same losses, gradients and graph gradient."""
    den = bigram_den(4, seed=11, keep=0.7)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 9, 5, dtype=dtype, generator=g)
    tg = torch.tensor([[1, 2, 3], [4, 4, 0], [2, 0, 0], [1, 3, 1], [3, 2, 0]])
    tl, il = torch.tensor([3, 2, 1, 3, 2]), torch.tensor([9, 7, 3, 9, 6])
    xc, xg = x.clone().requires_grad_(), x.cuda().requires_grad_()
    kw = dict(denominator=den, den_scale=0.8, leaky_hmm=0.05, reduction="none")
    cpu = mmi_loss(xc, tg, il, tl, **kw)
    gpu = mmi_loss(xg, tg.cuda(), il.cuda(), tl.cuda(), **kw)
    assert gpu.device.type == "cuda" and gpu.dtype == dtype
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(gpu.cpu(), cpu, **tol)
    cpu.sum().backward()
    gpu.sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, **tol)
    den.calc_grad = True
    den.zero_grad()
    mmi_denominator_score(x, il, den).sum().backward()
    ref = np.array(den.grad().weights_to_list())
    den.zero_grad()
    mmi_denominator_score(x.cuda(), il.cuda(), den).sum().backward()
    np.testing.assert_allclose(np.array(den.grad().weights_to_list()), ref, rtol=1e-3, atol=1e-4)


def test_torch_path_under_autocast_and_half_inputs_scores_in_float32():
    """``precision="bf16-mixed"`` runs the loss under autocast: the torch path (CUDA's) must not
    let autocast turn its sparse products into bfloat16, and bfloat16 emissions are scored in float32."""
    den = bigram_den(3, seed=12)
    x = torch.randn(3, 7, 4).log_softmax(-1)
    il = torch.tensor([7, 5, 2])
    ref = mmi_denominator_score(x, il, den, impl="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = mmi_denominator_score(x, il, den, impl="torch")
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    xb = x.bfloat16().requires_grad_()
    zb = mmi_denominator_score(xb, il, den, impl="torch")
    torch.testing.assert_close(zb.float(), mmi_denominator_score(xb.detach().float(), il, den), rtol=1e-2, atol=1e-2)
    zb.sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and torch.isfinite(xb.grad.float()).all()


def test_zero_infinity_zeroes_infeasible_targets_only():
    """An infinite denominator (a weight of 3e38) or a +inf emission was zeroed like an infeasible
    target, so evaluation reported val/loss 0.0; only the infeasible row is zeroed now."""
    den = bigram_den(2, seed=5)
    tg, tl, il = torch.tensor([[1, 2, 1], [1, 1, 1], [2, 0, 0]]), torch.tensor([3, 3, 1]), torch.tensor([4, 4, 2])
    x = torch.randn(3, 4, 3, dtype=torch.float64)
    x[2, 0, 2] = math.inf  # on row 2's only numerator paths' reach
    zi = mmi_loss(x, tg, il, tl, denominator=den, reduction="none", zero_infinity=True)
    assert zi[1] == 0 and torch.isfinite(zi[0]) and not torch.isfinite(zi[2])
    big = gtn.Graph(False)
    big.add_node(True, True)
    for c in range(3):
        big.add_arc(0, 0, c, c, 3e38 if c == 1 else 0.0)
    x = torch.randn(3, 4, 3)  # float32: two arcs of 3e38 overflow
    zi = mmi_loss(x, tg, il, tl, denominator=big, reduction="none", zero_infinity=True)
    assert (zi == math.inf).all()  # row 1 is infeasible too, but its denominator is infinite


def test_denominator_arc_frames_are_bounded(monkeypatch):
    import lightning_gtn.losses.mmi as mmi

    den = bigram_den(2, seed=5)
    A = den.num_arcs()
    x = torch.randn(3, 4, 3)
    tg, tl, il = torch.tensor([[1], [1], [2]]), torch.tensor([1, 1, 1]), torch.tensor([4, 4, 2])
    monkeypatch.setattr(mmi, "MAX_DENOMINATOR_ARC_FRAMES", 3 * 4 * A - 1)
    msg = rf"B \* T \* arcs = 3 \* 4 \* {A} = {3 * 4 * A} arc-frames, over the limit"
    with pytest.raises(ValueError, match=msg):
        mmi_loss(x, tg, il, tl, denominator=den)
    with pytest.raises(ValueError, match=msg):
        mmi_denominator_score(x, il, den)
    monkeypatch.setattr(mmi, "MAX_DENOMINATOR_ARC_FRAMES", 3 * 4 * A)
    assert torch.isfinite(mmi_loss(x, tg, il, tl, denominator=den))


def _names(calls: list) -> list:
    """``(class name, name)`` of the criteria of ``calls`` (the ``apply_loss_calls`` fixture)."""
    return [(type(c).__name__, getattr(c, "name", None)) for c, _ in calls]


def test_the_denominator_and_the_numerators_go_through_the_one_prologue(apply_loss_calls):
    den = bigram_den(2)
    x = torch.randn(2, 4, 3, requires_grad=True)
    tg, tl, il = torch.tensor([[1, 2], [2, 0]]), torch.tensor([2, 1]), torch.tensor([4, 3])
    mmi_denominator_score(x, il, den, leaky_hmm=0.1).sum().backward()
    assert _names(apply_loss_calls) == [("_SharedDenominator", "mmi_denominator_score")]
    apply_loss_calls.clear()
    mmi_loss(x, tg, il, tl, denominator=den).backward()
    assert _names(apply_loss_calls) == [("_SharedDenominator", "mmi_loss"), ("_Numerators", "mmi_loss")]
    # the prologue's checks: the picker names the function, the options are checked there
    with pytest.raises(ValueError, match=r"^mmi_denominator_score: impl must be None or one of"):
        mmi_denominator_score(x, il, den, impl="gtn")
    with pytest.raises(ValueError, match=r"^leaky_hmm must lie in \[0.0, 1.0\), got 1.0"):
        mmi_denominator_score(x, il, den, leaky_hmm=1.0)
