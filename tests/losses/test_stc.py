"""stc_loss and nn.STCLoss against a per-example GTN-style reference, brute-force path
enumeration, themselves batched, torch.compile, and the research code's penalty schedule."""

import itertools
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn import nn as lnn
from lightning_gtn.functional import stc_loss

IMPLS = ["numba", "numba_log", "torch"]


# ---------------------------------------------------------------------------
# references, written here from the paper's construction (blank 0)
# ---------------------------------------------------------------------------


def ref_augment(lp):
    """(T, C) -> (T, 2C): tokens, <star>, <star>\\token for tokens 1..C-1 (blank 0)."""
    lse = torch.logsumexp(lp[:, 1:], 1, keepdim=True)
    neg = lse + torch.log1p(1e-7 - torch.exp(lp[:, 1:] - lse))
    return torch.cat([lp, lse, neg], 1)


def ref_graph(target, C, p):
    """The STC graph built arc by arc: CTC nodes without token self-loops, one star node per gap."""
    L = len(target)
    S = 2 * L + 1
    g = gtn.Graph(False)
    for n in range(S):
        g.add_node(n == 0, n in (S - 1, S - 2))
    for n in range(S):
        lab = 0 if n % 2 == 0 else target[n // 2]
        if lab == 0:
            g.add_arc(n, n, 0)
        if n > 0:
            g.add_arc(n - 1, n, lab)
        if n % 2 == 1 and n > 1:
            g.add_arc(n - 2, n, lab)
    for l in range(L + 1):
        s = g.add_node(False, l == L)
        star = C if l == L else C + target[l]
        if l > 0:
            g.add_arc(2 * l - 1, s, star, star, math.log(p))
        g.add_arc(2 * l, s, star, star, math.log(p))
        g.add_arc(s, s, star, star, math.log(p))
        if l < L:
            g.add_arc(s, 2 * l + 1, target[l])
        g.add_arc(s, 2 * l, 0)
    return g


def gtn_reference(x, targets, lengths, p):
    """Per-example losses and d sum(losses) / d x, the GTN way (intersect, forward_score,
    backward on graphs; the star columns' gradient goes back through torch)."""
    B, T, C = x.shape
    losses, grad = [], torch.zeros_like(x)
    for b in range(B):
        xb = x[b, : lengths[b]].detach().clone().requires_grad_(True)
        aug = ref_augment(xb)
        em = gtn.linear_graph(int(lengths[b]), 2 * C, gtn.Device(gtn.CPU), True)
        em.set_weights(aug.detach().double().flatten().tolist())
        loss = gtn.negate(gtn.forward_score(gtn.intersect(ref_graph(targets[b], C, p), em)))
        gtn.backward(loss)
        g_aug = torch.tensor(em.grad().weights_to_list(), dtype=x.dtype).reshape(aug.shape)
        aug.backward(g_aug)
        losses.append(loss.item())
        grad[b, : lengths[b]] = xb.grad
    return torch.tensor(losses, dtype=x.dtype), grad


def brute_force(x, target, p):
    """-log of the sum over every path of T arcs through the STC states (enumerated)."""
    T, C = x.shape
    aug = ref_augment(x)
    L = len(target)
    logp = math.log(p)

    def star(l):
        return C if l == L else C + target[l]

    def moves(state):  # (next state, column, extra weight)
        kind, l = state
        out = []
        if kind == "b":
            out.append((("b", l), 0, 0.0))
            if l < L:
                out.append((("t", l), target[l], 0.0))
            out.append((("s", l), star(l), logp))
        elif kind == "t":
            out.append((("b", l + 1), 0, 0.0))
            if l + 1 < L:
                out.append((("t", l + 1), target[l + 1], 0.0))
            out.append((("s", l + 1), star(l + 1), logp))
        else:
            out.append((("s", l), star(l), logp))
            if l < L:
                out.append((("t", l), target[l], 0.0))
            out.append((("b", l), 0, 0.0))
        return out

    accept = {("b", L), ("s", L)} | ({("t", L - 1)} if L else set())
    scores = []

    def walk(state, t, score):
        if t == T:
            if state in accept:
                scores.append(score)
            return
        for nxt, col, w in moves(state):
            walk(nxt, t + 1, score + aug[t, col] + w)

    walk(("b", 0), 0, torch.zeros((), dtype=x.dtype))
    if not scores:
        return torch.tensor(float("inf"), dtype=x.dtype)
    return -torch.logsumexp(torch.stack(scores), 0)


def _batch(seed, B, T, C, S, ragged):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64).log_softmax(-1)
    il = torch.randint(S + 1, T + 1, (B,), generator=g) if ragged else torch.full((B,), T)
    il[0] = T
    tl = torch.randint(0, S + 1, (B,), generator=g)
    tg = torch.randint(1, C, (B, S), generator=g)
    return x, tg, il, tl


# ---------------------------------------------------------------------------
# values and gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("ragged", [False, True])
def test_equals_gtn_reference(impl, ragged):
    x, tg, il, tl = _batch(1 + ragged, 5, 12, 5, 4, ragged)
    x.requires_grad_(True)
    p = 0.3
    ours = stc_loss(x, tg, il, tl, p=p, reduction="none", impl=impl)
    (g,) = torch.autograd.grad(ours.sum(), x)
    targets = [tg[b, : tl[b]].tolist() for b in range(5)]
    ref, ref_g = gtn_reference(x, targets, il.tolist(), p)
    torch.testing.assert_close(ours.detach(), ref)
    torch.testing.assert_close(g, ref_g)
    assert torch.isfinite(ours).all()


@pytest.mark.parametrize("p", [1.0, 0.25, 3.0])
def test_brute_force_enumeration(p):
    g = torch.Generator().manual_seed(7)
    for T, C in [(1, 2), (2, 3), (3, 2), (4, 3)]:
        for L in range(0, 3):
            for target in itertools.product(range(1, C), repeat=L):
                x = torch.randn(1, T, C, generator=g, dtype=torch.float64).log_softmax(-1).requires_grad_(True)
                ours = stc_loss(x, [list(target)], [T], p=p, reduction="none")
                ref = brute_force(x[0], list(target), p)
                torch.testing.assert_close(ours[0], ref)
                if torch.isfinite(ref):
                    (g1,) = torch.autograd.grad(ours.sum(), x)
                    (g2,) = torch.autograd.grad(ref, x)
                    torch.testing.assert_close(g1, g2)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_tiny_cases_equal_brute_force(data):
    T = data.draw(st.integers(0, 4))
    C = data.draw(st.integers(2, 3))
    target = data.draw(st.lists(st.integers(1, C - 1), max_size=3))
    p = data.draw(st.sampled_from([0.1, 0.5, 1.0, 2.0]))
    seed = data.draw(st.integers(0, 2**16))
    x = torch.randn(1, T, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ours = stc_loss(x, [target], [T], p=p, reduction="none", zero_infinity=False)
    torch.testing.assert_close(ours[0], brute_force(x[0], target, p))


def test_known_values():
    # the two worked cases of the research code's tests, recomputed by hand:
    # one path (1, blank, 1) of probability 1
    x = torch.log(torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])).requires_grad_(True)
    loss = stc_loss(x, [[1, 1]], [3], reduction="none")
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert torch.isfinite(g).all()
    # uniform over 4 labels, target (1, 2) in 3 frames: "x 1 2" with x a blank (1/4) or a star
    # except 1 (1/2); "1 x 2" with x a blank or a star except 2; "1 2 x" with x a blank or the
    # plain star of the last gap (3/4): 1/16 * (3/4 + 3/4 + 1)
    x = torch.full((1, 3, 4), 0.25, dtype=torch.float64).log()
    loss = stc_loss(x, [[1, 2]], [3], reduction="none")
    want = -math.log(0.25 * 0.25 * (0.75 + 0.75 + 1.0))
    assert loss.item() == pytest.approx(want, rel=1e-6)


def test_star_penalty_shifts_the_loss_of_star_only_paths():
    # An empty target with T frames of stars alone (no blank mass): every path reads T stars.
    x = torch.full((1, 3, 3), -1e9, dtype=torch.float64)
    x[:, :, 1:] = math.log(0.5)
    base = stc_loss(x, [[]], [3], p=1.0, reduction="none")
    half = stc_loss(x, [[]], [3], p=0.5, reduction="none")
    torch.testing.assert_close(half - base, torch.tensor([3 * math.log(2)], dtype=torch.float64))


def test_non_zero_blank_equals_permuted_columns():
    x, tg, il, tl = _batch(3, 4, 9, 4, 3, True)
    perm = [2, 1, 0, 3]  # blank 0 moves to column 2, token 2 to column 0
    tg2 = torch.tensor(perm)[tg]
    a = stc_loss(x, tg, il, tl, p=0.4, reduction="none")
    b = stc_loss(x[..., perm], tg2, il, tl, blank=2, p=0.4, reduction="none")
    torch.testing.assert_close(a, b)


def test_batched_equals_one_by_one_and_p_as_tensor():
    x, tg, il, tl = _batch(4, 6, 10, 5, 4, True)
    x.requires_grad_(True)
    full = stc_loss(x, tg, il, tl, p=torch.tensor(0.6, dtype=torch.float64), reduction="none")
    (g,) = torch.autograd.grad(full.sum(), x)
    for b in range(6):
        xb = x[b : b + 1, : il[b]].detach().requires_grad_(True)
        one = stc_loss(xb, tg[b : b + 1], il[b : b + 1], tl[b : b + 1], p=0.6, reduction="none")
        (gb,) = torch.autograd.grad(one.sum(), xb)
        torch.testing.assert_close(one[0], full[b].detach())
        torch.testing.assert_close(gb[0], g[b, : il[b]])
        assert (g[b, il[b] :] == 0).all()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_reductions(reduction):
    x, tg, il, tl = _batch(5, 4, 8, 4, 3, True)
    tl[1] = 0
    losses = stc_loss(x, tg, il, tl, p=0.5, reduction="none")
    out = stc_loss(x, tg, il, tl, p=0.5, reduction=reduction)
    want = {"none": losses, "sum": losses.sum(), "mean": (losses / tl.clamp(min=1)).mean()}[reduction]
    torch.testing.assert_close(out, want)


def test_zero_infinity():
    x = torch.randn(2, 3, 4, dtype=torch.float64).log_softmax(-1).requires_grad_(True)
    tg = torch.tensor([[1, 2, 3], [1, 1, 2]])
    il, tl = torch.tensor([3, 2]), torch.tensor([1, 3])  # 3 tokens cannot fit in 2 frames
    inf = stc_loss(x, tg, il, tl, reduction="none")
    assert torch.isfinite(inf[0]) and torch.isinf(inf[1])
    zero = stc_loss(x, tg, il, tl, reduction="none", zero_infinity=True)
    assert zero[1] == 0 and zero[0] == inf[0]
    (g,) = torch.autograd.grad(zero.sum(), x)
    assert torch.isfinite(g).all() and (g[1] == 0).all() and g[0].abs().sum() > 0


def test_float32_and_bfloat16_follow_float64():
    x, tg, il, tl = _batch(6, 3, 7, 4, 2, False)
    ref = stc_loss(x, tg, il, tl, p=0.5)
    torch.testing.assert_close(stc_loss(x.float(), tg, il, tl, p=0.5), ref.float(), rtol=1e-5, atol=1e-5)
    bf = stc_loss(x.bfloat16(), tg, il, tl, p=0.5)
    assert bf.dtype == torch.bfloat16 and abs(bf.double() - ref) < 0.1


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(p=0.0), "p"),
        (dict(p=-1.0), "p"),
        (dict(p=float("nan")), "p"),
        (dict(p=True), "p"),
        (dict(p=torch.ones(2)), "p"),
        (dict(blank=4), "blank"),
        (dict(blank=1.5), "blank"),
        (dict(reduction="avg"), "reduction"),
        (dict(impl="gtn"), "impl"),
    ],
)
def test_bad_options(kwargs, name):
    x = torch.randn(2, 5, 4).log_softmax(-1)
    with pytest.raises(ValueError, match=name):
        stc_loss(x, torch.tensor([[1, 2], [3, 0]]), [5, 5], [2, 1], **kwargs)


def test_bad_tensors():
    x = torch.randn(2, 5, 4).log_softmax(-1)
    tg, il, tl = torch.tensor([[1, 2], [3, 0]]), [5, 5], [2, 1]
    with pytest.raises(ValueError, match="emissions"):
        stc_loss(x[0], tg, il, tl)
    with pytest.raises(ValueError, match="emissions"):
        stc_loss(x[..., :1], tg, il, tl)
    with pytest.raises(ValueError, match="input_lengths"):
        stc_loss(x, tg, [5, 6], tl)
    with pytest.raises(ValueError, match="input_lengths"):
        stc_loss(x, tg, [5, 4.5], tl)
    with pytest.raises(ValueError, match="targets"):
        stc_loss(x, torch.tensor([[1, 4], [3, 0]]), il, tl)  # 4 is a star column, not a label
    with pytest.raises(ValueError, match="targets"):
        stc_loss(x, torch.tensor([[1, 0], [3, 0]]), il, tl)  # the blank
    with pytest.raises(ValueError, match="target_lengths"):
        stc_loss(x, tg, il, None)


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_training_step_equals_eager(reduction):
    g = torch.Generator().manual_seed(9)
    feats = torch.randn(3, 8, 5, generator=g)
    tg = torch.tensor([[1, 2, 3], [2, 2, 0], [3, 0, 0]])
    il, tl = torch.tensor([8, 7, 5]), torch.tensor([3, 2, 1])

    def run(compiled):
        torch.manual_seed(1)
        model = lnn.Linear(5, 4)
        p = torch.tensor(0.5)

        def step(feats, tg, il, tl, p):
            loss = stc_loss(model(feats).log_softmax(-1), tg, il, tl, p=p, reduction=reduction)
            return loss.sum() if reduction == "none" else loss

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True)
        out = []
        for pv in (0.5, 0.8):  # a new p is a new input, not a recompile
            p.fill_(pv)
            model.zero_grad()
            loss = step(feats, tg, il, tl, p)
            loss.backward()
            out += [loss.detach(), model.weight.grad.clone(), model.bias.grad.clone()]
        return out

    eager, compiled = run(False), run(True)
    assert torch.isfinite(eager[0]) and eager[0] != eager[3]
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# nn.STCLoss: the penalty schedule
# ---------------------------------------------------------------------------


def research_p(p0, plast, thalf, nstep):
    return plast + (p0 - plast) * math.exp(-nstep * math.log(2) / thalf)


def _module_inputs():
    x = torch.randn(2, 6, 4, dtype=torch.float64).log_softmax(-1)
    return x, torch.tensor([[1, 2], [3, 0]]), torch.tensor([6, 5]), torch.tensor([2, 1])


def test_schedule_advances_per_training_step_and_matches_research_formula():
    m = lnn.STCLoss(blank_idx=0, p0=5.0, plast=0.2, thalf=3, reduction="none")
    assert m.blank == 0 and m.repeat_label is False
    x, tg, il, tl = _module_inputs()
    for k in range(1, 8):
        out = m(x, tg, il, tl)
        assert out.shape == (2,)
        assert int(m.nstep) == k
        assert float(m.penalty()) == pytest.approx(research_p(5.0, 0.2, 3, k), rel=1e-12)
        torch.testing.assert_close(out, stc_loss(x, tg, il, tl, p=research_p(5.0, 0.2, 3, k), reduction="none"))
    assert float(m.penalty()) != pytest.approx(research_p(5.0, 0.2, 3, 1))


def test_reduction_defaults_to_mean_like_every_loss_module():
    x, tg, il, tl = _module_inputs()
    m = lnn.STCLoss(0, p0=2.0, plast=0.5, thalf=2)
    assert m.reduction == "mean"
    out = m(x, tg, il, tl)
    assert out.shape == ()
    p = research_p(2.0, 0.5, 2, 1)
    torch.testing.assert_close(out, stc_loss(x, tg, il, tl, p=p, reduction="mean"))
    per_row = stc_loss(x, tg, il, tl, p=p, reduction="none")
    torch.testing.assert_close(out, (per_row / tl).mean())


def test_eval_does_not_advance_and_state_dict_round_trip_keeps_the_schedule():
    x, tg, il, tl = _module_inputs()
    m = lnn.STCLoss(0, p0=2.0, plast=0.5, thalf=2, reduction="mean")
    for _ in range(3):
        m(x, tg, il, tl)
    m.eval()
    before = m(x, tg, il, tl)
    m(x, tg, il, tl)
    assert int(m.nstep) == 3
    torch.testing.assert_close(before, stc_loss(x, tg, il, tl, p=research_p(2.0, 0.5, 2, 3)))
    state = m.state_dict()
    assert int(state["nstep"]) == 3
    resumed = lnn.STCLoss(0, p0=2.0, plast=0.5, thalf=2, reduction="mean")
    resumed.load_state_dict(state)
    assert int(resumed.nstep) == 3
    resumed.train()
    resumed(x, tg, il, tl)
    assert float(resumed.penalty()) == pytest.approx(research_p(2.0, 0.5, 2, 4))


def test_module_options_and_decode():
    with pytest.raises(ValueError, match="p0"):
        lnn.STCLoss(0, p0=0)
    with pytest.raises(ValueError, match="thalf"):
        lnn.STCLoss(0, thalf=-1)
    with pytest.raises(ValueError, match="reduction"):
        lnn.STCLoss(0, reduction="avg")
    m = lnn.STCLoss(0)
    x = torch.full((1, 5, 4), -10.0)
    for t, lab in enumerate([1, 1, 0, 2, 2]):
        x[0, t, lab] = 0.0
    assert m.decode(x, [5]) == [[1, 2]]


def test_config_builds_the_module():
    from lightning_gtn.lightning.loss_builder import build_loss

    for spec in ("stc", {"_target_": "lightning_gtn.nn.STCLoss", "blank_idx": 0}):
        loss, vocab = build_loss(spec, "0123456789 ")
        assert isinstance(loss, lnn.STCLoss) and loss.blank == 0 and vocab.num_classes == 12


def test_module_compiled_step_advances_the_schedule_like_eager():
    g = torch.Generator().manual_seed(11)
    feats = torch.randn(2, 6, 5, generator=g)
    tg, il, tl = torch.tensor([[1, 2], [3, 0]]), torch.tensor([6, 5]), torch.tensor([2, 1])

    def run(compiled):
        torch.manual_seed(2)
        model = lnn.Linear(5, 4)
        crit = lnn.STCLoss(0, p0=4.0, plast=0.5, thalf=1, reduction="mean")

        def step(feats, tg, il, tl):
            return crit(model(feats).log_softmax(-1), tg, il, tl)

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True)
        out = []
        for _ in range(3):
            model.zero_grad()
            loss = step(feats, tg, il, tl)
            loss.backward()
            out += [loss.detach(), model.weight.grad.clone()]
        return out, int(crit.nstep)

    (eager, n_eager), (compiled, n_compiled) = run(False), run(True)
    assert n_eager == n_compiled == 3
    assert eager[0] != eager[2]  # the penalty changed between steps
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


_TRITON_SCRIPT = textwrap.dedent("""
    import torch
    from lightning_gtn.functional import stc_loss
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, 5, generator=g, dtype=torch.float64).log_softmax(-1)
    tg = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 0, 0]])
    il, tl = torch.tensor([9, 7, 5]), torch.tensor([3, 2, 0])
    out = []
    for impl in ("numba", "triton"):
        xi = x.clone().requires_grad_(True)
        loss = stc_loss(xi, tg, il, tl, p=0.4, reduction="none", impl=impl)
        gi, = torch.autograd.grad((loss * torch.tensor([0.5, 1.0, 1.5], dtype=loss.dtype)).sum(), xi)
        out.append((loss.detach(), gi))
    assert torch.isfinite(out[0][0]).all()
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-9, atol=1e-9)
    print("STC-TRITON-OK")
""")


def test_triton_kernels_under_the_interpreter_equal_numba():
    from lightning_gtn.kernels import graph_triton

    if not graph_triton.available():
        pytest.skip("triton is not installed")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "STC-TRITON-OK" in res.stdout, res.stdout + res.stderr


def _chain_vs_graph(x, tg, il, p=0.5):
    """Losses and gradients of the chain path (impl="numba") and of the graph path ("numba_log")."""
    out = []
    for impl in ("numba", "numba_log"):
        xi = x.clone().requires_grad_()
        loss = stc_loss(xi, tg, il, None, p=p, reduction="none", impl=impl)
        fin = torch.isfinite(loss)
        (loss[fin].sum() if fin.any() else loss.sum() * 0).backward()
        out.append((loss.detach(), xi.grad))
    return out


def test_chain_path_equals_graph_path_on_edge_cases():
    # the CPU path scores STC graphs as (L + 1)-state chains; the graph kernels are the reference
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 12, 6, generator=g, dtype=torch.float64).log_softmax(-1)
    x[3, 5] = -float("inf")  # a dead frame inside the length: no path
    x[4, 2, 1] = -float("inf")  # one dead label: fine
    tg = [[1, 2, 3], [], [5, 5, 5, 5], [1], [2, 1], [1, 2, 3, 4, 5], [3]]
    il = [12, 7, 4, 12, 12, 3, 0]  # row 5: fewer frames than tokens; row 6: no frames
    (a, ga), (b, gb) = _chain_vs_graph(x, tg, il)
    assert torch.isinf(a[3]) and torch.isinf(a[5]) and torch.isinf(a[6])
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    assert ga[3].abs().sum() == 0 and ga[5].abs().sum() == 0


def test_chain_path_long_inputs_and_extreme_scores():
    # long inputs with peaked emissions: underflow must not drop paths (the chain's own check
    # sends such rows to the graph path)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 3000, 5, generator=g, dtype=torch.float64) * 30).log_softmax(-1)
    tg = [[1, 2, 3, 4] * 50, [2]]
    (a, ga), (b, gb) = _chain_vs_graph(x, tg, [3000, 2500], p=0.01)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)


def test_chain_path_nan_gives_nan():
    x = torch.randn(2, 5, 4).log_softmax(-1)
    x[0, 1, 2] = float("nan")
    loss = stc_loss(x, [[1], [2]], [5, 5], None, reduction="none", impl="numba")
    assert torch.isnan(loss[0]) and torch.isfinite(loss[1])


def test_chain_rows_it_cannot_vouch_for_take_the_graph_path(monkeypatch):
    # a tolerance no row meets sends every row through the graph path and the star columns'
    # gradient by hand (_star_grad): same values and gradients, including d/d p
    from lightning_gtn.kernels import stc_chain

    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 10, 5, generator=g, dtype=torch.float64).log_softmax(-1)
    tg, il = [[1, 2, 2], [3], [4, 1]], [10, 8, 6]

    def run():
        xi = x.clone().requires_grad_()
        p = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        loss = stc_loss(xi, tg, il, None, p=p, reduction="mean")
        loss.backward()
        return loss.detach(), xi.grad, p.grad

    direct = run()
    monkeypatch.setattr(stc_chain, "TOL", -1.0)
    fallback = run()
    for a, b in zip(direct, fallback):
        torch.testing.assert_close(a, b)
    xi = x.clone().requires_grad_()
    p = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    loss = stc_loss(xi, tg, il, None, p=p, reduction="mean", impl="numba_log")
    loss.backward()
    for a, b in zip(direct, (loss.detach(), xi.grad, p.grad)):
        torch.testing.assert_close(a, b)
