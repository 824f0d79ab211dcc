"""ConvTransduce1D against the research pattern on the engine, brute force, and its errors."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lightning_gtn.wfst as gtn
from lightning_gtn.functional import conv_transduce1d, kernel_graph
from lightning_gtn.nn import ConvTransduce1D

# ---------------------------------------------------------------------------
# The reference: the research layer's pattern, one window and kernel at a time on the engine
# ---------------------------------------------------------------------------


def reference(layer: ConvTransduce1D, inputs: torch.Tensor, grad_out: torch.Tensor):
    """``(outputs, d<outputs, grad_out>/d inputs, .../d kernel_params or None)`` the research
    way: pad (and log_softmax) with torch, then per window a linear graph, per kernel an
    intersection and a forward/viterbi score, gtn.backward per output with its incoming grad."""
    x = inputs.detach().clone().requires_grad_(True)
    K, stride = layer.kernel_size, layer.stride
    pad = K // 2
    xp = F.pad(x, (0, 0, pad, pad))
    if layer.normalize == "pre":
        xp = xp.log_softmax(-1)
    B, Tpad, C = xp.shape
    kernels = [kernel_graph(lex, layer.blank_idx, layer.blank_optional, layer.spike) for lex in layer.lexicon]
    params = layer.kernel_params
    if params is not None:
        s = 0
        for k in kernels:
            n = k.num_arcs()
            k.set_weights(params.detach().float().numpy()[s : s + n])
            k.calc_grad = True
            k.zero_grad()
            s += n
    data = xp.detach().float().numpy()
    starts = list(range(0, Tpad - K + 1, stride))
    raw = np.zeros((B, len(starts), len(kernels)))
    wins = []
    for b in range(B):
        for i, t in enumerate(starts):
            g_in = gtn.linear_graph(K, C, gtn.Device(gtn.CPU), True)
            g_in.set_weights(np.ascontiguousarray(data[b, t : t + K]).reshape(-1))
            outs = []
            for k, kern in enumerate(kernels):
                score = gtn.viterbi_score if layer.viterbi else gtn.forward_score
                o = score(gtn.intersect(g_in, kern))
                raw[b, i, k] = o.item()
                outs.append(o)
            wins.append((b, i, t, g_in, outs))
    # backward through scale / normalisation with torch, then the graph gradients
    r = torch.tensor(raw, dtype=torch.float64, requires_grad=True)
    out = r / {"none": 1.0, "sqrt": math.sqrt(K), "linear": float(K)}[layer.scale]
    if layer.normalize == "post":
        out = out.softmax(-1)
    elif layer.normalize == "pre":
        out = out.exp()
    (out * grad_out).sum().backward()
    delta = r.grad.numpy()
    gpad = torch.zeros(B, Tpad, C, dtype=torch.float64)
    for b, i, t, g_in, outs in wins:
        for k, o in enumerate(outs):
            if math.isfinite(raw[b, i, k]):
                gtn.backward(o, gtn.scalar_graph(float(delta[b, i, k]), calc_grad=False), retain_graph=False)
        if any(math.isfinite(raw[b, i, k]) for k in range(len(outs))):
            gpad[b, t : t + K] += torch.from_numpy(g_in.grad().weights_to_numpy().reshape(K, C).astype(np.float64))
    xp.backward(gpad)
    gk = None
    if params is not None:
        gk = torch.from_numpy(np.concatenate([kernel_grad(k) for k in kernels]).astype(np.float64))
    return out.detach(), x.grad, gk


def kernel_grad(k):
    try:
        return k.grad().weights_to_numpy()
    except RuntimeError:  # no window had a path through this kernel: no gradient reached it
        return np.zeros(k.num_arcs())


def ours(layer, inputs, grad_out):
    x = inputs.detach().clone().requires_grad_(True)
    if layer.kernel_params is not None:
        layer.kernel_params.grad = None
    out = layer(x)
    (out * grad_out).sum().backward()
    gk = None if layer.kernel_params is None else layer.kernel_params.grad.detach().clone()
    return out.detach(), x.grad, gk


def make_layer(lexicon, K, stride, blank=0, seed=0, **kw):
    layer = ConvTransduce1D(lexicon, K, stride, blank, **kw).double()
    if layer.kernel_params is not None:  # random weights: no ties between Viterbi paths
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            layer.kernel_params.copy_(torch.randn(layer.kernel_params.shape, generator=g).float().double())
    return layer


def data(B, T, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    # float32 values: the engine stores float32 weights, so the reference sees the same inputs
    return torch.randn(B, T, C, generator=g).double()


def close(a, b, what, tol=2e-5):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb), f"{what}: infinite entries differ"
    assert torch.allclose(a[fa], b[fb], rtol=tol, atol=tol), f"{what}: max diff {(a[fa] - b[fb]).abs().max()}"


LEX = [[1], [2], [1, 2], [2, 2], [3, 1, 3], []]


@pytest.mark.parametrize("blank_optional", [True, False])
@pytest.mark.parametrize("spike", [False, True])
@pytest.mark.parametrize("viterbi", [False, True])
def test_topologies_match_reference(blank_optional, spike, viterbi):
    layer = make_layer(LEX, 5, 2, blank_optional=blank_optional, spike=spike, viterbi=viterbi, learn_params=True)
    x = data(2, 9, 4)
    go = data(2, 5, len(LEX), seed=1)
    ref = reference(layer, x, go)
    got = ours(layer, x, go)
    for name, a, b in zip(("outputs", "input grad", "kernel grad"), got, ref):
        close(a, b, name)
    assert got[0].shape == (2, 5, len(LEX))


@pytest.mark.parametrize("scale", ["none", "sqrt", "linear"])
@pytest.mark.parametrize("normalize", ["none", "pre", "post"])
def test_scale_and_normalize_match_reference(scale, normalize):
    layer = make_layer([[1, 1], [2], [1, 3], []], 5, 1, scale=scale, normalize=normalize)
    assert layer.kernel_params is None
    x = data(2, 6, 4, seed=scale.__len__() + 3 * normalize.__len__())
    go = data(2, 6, 4, seed=5)
    for name, a, b in zip(("outputs", "input grad"), ours(layer, x, go)[:2], reference(layer, x, go)[:2]):
        close(a, b, name)


@pytest.mark.parametrize("stride", [1, 3, 4])
@pytest.mark.parametrize("learn_params", [False, True])
@pytest.mark.parametrize("viterbi", [False, True])
def test_strides_and_params_match_reference(stride, learn_params, viterbi):
    lex = [[0], [2, 2, 1], [1, 2], [3], []]  # blank 4, a repeated token, the blank kernel
    layer = make_layer(lex, 7, stride, blank=4, learn_params=learn_params, viterbi=viterbi, seed=stride)
    x = data(3, 10, 5, seed=stride)
    Tp = -(-10 // stride)
    go = data(3, Tp, len(lex), seed=7)
    got, ref = ours(layer, x, go), reference(layer, x, go)
    assert got[0].shape == (3, Tp, len(lex))
    for name, a, b in zip(("outputs", "input grad"), got[:2], ref[:2]):
        close(a, b, name)
    if learn_params:
        close(got[2], ref[2], "kernel grad")


def test_float32_and_torch_impl_match_numba():
    layer = make_layer(LEX, 5, 2, learn_params=True)
    x = data(2, 9, 4)
    go = data(2, 5, len(LEX), seed=1)
    a = ours(layer, x, go)
    layer.impl = "torch"
    b = ours(layer, x, go)
    for name, u, v in zip(("outputs", "input grad", "kernel grad"), a, b):
        close(u, v, name, 1e-9)
    layer32 = make_layer(LEX, 5, 2, learn_params=True).float()
    c = ours(layer32, x.float(), go.float())
    assert c[0].dtype == torch.float32
    for name, u, v in zip(("outputs", "input grad", "kernel grad"), a, c):
        close(u, v.double(), name, 1e-4)


# ---------------------------------------------------------------------------
# Brute force: the kernel's language as a regular expression over the window's labels
# ---------------------------------------------------------------------------


def kernel_regex(tokens, blank, blank_optional, spike):
    b = re.escape(chr(65 + blank))
    parts = [f"{b}*"]
    for i, tok in enumerate(tokens):
        c = re.escape(chr(65 + tok))
        if i > 0:
            parts.append(f"{b}+" if (tokens[i - 1] == tok or not blank_optional) else f"{b}*")
        parts.append(c if spike else f"{c}+")
    if tokens:
        parts.append(f"{b}*" if blank_optional else f"{b}+")
    return re.compile("".join(parts))


@pytest.mark.parametrize("blank_optional", [True, False])
@pytest.mark.parametrize("spike", [False, True])
def test_brute_force_enumeration_of_paths(blank_optional, spike):
    lex = [[1], [1, 2], [2, 2], [1, 2, 1], []]
    K, C = 5, 3
    x = data(2, 4, C, seed=11)
    for viterbi in (False, True):
        out = ConvTransduce1D(lex, K, 1, 0, blank_optional=blank_optional, spike=spike, viterbi=viterbi)(x)
        xp = F.pad(x, (0, 0, K // 2, K // 2))
        for k, tokens in enumerate(lex):
            rx = kernel_regex(tokens, 0, blank_optional, spike)
            accepted = [
                seq for seq in itertools.product(range(C), repeat=K) if rx.fullmatch("".join(chr(65 + s) for s in seq))
            ]
            for b in range(2):
                for t in range(out.shape[1]):
                    win = xp[b, t : t + K]
                    scores = (
                        torch.stack([win[torch.arange(K), list(seq)].sum() for seq in accepted])
                        if accepted
                        else torch.full((1,), -math.inf, dtype=x.dtype)
                    )
                    want = scores.max() if viterbi else torch.logsumexp(scores, 0)
                    if math.isinf(want):
                        assert out[b, t, k] == want
                    else:
                        assert abs(out[b, t, k] - want) < 1e-9, (tokens, b, t, viterbi)


def test_counting_paths_with_zero_inputs():
    # zero scores and weights: exp(forward score) counts the accepted label sequences
    lex = [[1], [1, 1], [1, 2]]
    K, C = 5, 3
    out = ConvTransduce1D(lex, K, 1, 0)(torch.zeros(1, 1, C, dtype=torch.float64))
    for k, tokens in enumerate(lex):
        rx = kernel_regex(tokens, 0, True, False)
        n = sum(bool(rx.fullmatch("".join(chr(65 + s) for s in seq))) for seq in itertools.product(range(C), repeat=K))
        assert round(math.exp(out[0, 0, k].item())) == n


def test_batched_equals_one_by_one_and_infeasible_pairs():
    # blank_optional=False forces a blank after each token: [1, 2, 1] needs 6 frames, K = 5 has no path
    layer = ConvTransduce1D([[1, 2, 1], [1], []], 5, 2, 0, blank_optional=False, learn_params=True).double()
    x = data(3, 8, 3, seed=4).requires_grad_(True)
    out = layer(x)
    assert torch.isinf(out[..., 0]).all() and torch.isfinite(out[..., 1:]).all()
    out[..., 1:].sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.kernel_params.grad).all()
    assert (layer.kernel_params.grad[: layer.bank.arc_off[1]] == 0).all()
    for b in range(3):
        close(layer(x[b : b + 1]).detach(), out[b : b + 1].detach(), "one by one", 1e-12)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kernel_size=4), "kernel_size must be odd"),
        (dict(kernel_size=3, lexicon=[[1, 1, 2]]), "kernel_size must be at least 4"),
        (dict(kernel_size=1, lexicon=[[1, 2]]), "kernel_size must be at least 2"),
        (dict(scale="log"), "scale must be one of"),
        (dict(normalize="softmax"), "normalize must be one of"),
        (dict(stride=0), "stride must be an integer >= 1"),
        (dict(lexicon=[[1, -2]]), r"lexicon\[0\] must hold non-negative"),
        (dict(lexicon=[]), "at least one entry"),
        (dict(lexicon=["ab"]), r"lexicon\[0\] must be a sequence"),
        (dict(blank_idx=-1), "blank_idx must be an integer >= 0"),
    ],
)
def test_constructor_errors(kwargs, match):
    args = dict(lexicon=[[1], [2]], kernel_size=3, stride=1, blank_idx=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ConvTransduce1D(**args)


def test_forward_errors():
    layer = ConvTransduce1D([[1], [5]], 3, 1, 0)
    with pytest.raises(ValueError, match=r"inputs must have C_in .*input class 5.*C_in=4"):
        layer(torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match=r"inputs must have shape \(B, T, C\)"):
        layer(torch.randn(6, 6))
    with pytest.raises(ValueError, match="floating point"):
        layer(torch.zeros(2, 6, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"inputs must have C_in .*input class 7"):
        ConvTransduce1D([[1]], 3, 1, 7)(torch.randn(1, 4, 6))
    with pytest.raises(ValueError, match=r"kernel_params must be a float tensor of shape \(num_arcs,\) = \(10,\)"):
        conv_transduce1d(torch.randn(1, 4, 6), [[1], [5]], 3, 1, 0, kernel_params=torch.zeros(3))
    assert layer(torch.randn(2, 0, 6)).shape == (2, 0, 2)


# ---------------------------------------------------------------------------
# Custom op: torch.compile(fullgraph=True) and opcheck
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("viterbi", [False, True])
def test_compiles_fullgraph_and_matches_eager(viterbi):
    layer = make_layer(LEX, 5, 2, learn_params=True, viterbi=viterbi)
    x = data(2, 9, 4)

    def step(a):
        return (layer(a).tanh() * 0.5).sum()

    xe = x.clone().requires_grad_(True)
    step(xe).backward()
    ge, gk = xe.grad, layer.kernel_params.grad.clone()
    layer.kernel_params.grad = None
    xc = x.clone().requires_grad_(True)
    torch.compile(step, fullgraph=True, backend="aot_eager")(xc).backward()
    close(xc.grad, ge, "input grad", 1e-12)
    close(layer.kernel_params.grad, gk, "kernel grad", 1e-12)


@pytest.mark.parametrize("viterbi", [False, True])
def test_opcheck(viterbi):
    from lightning_gtn.losses.conv_transduce import conv_transduce_op, kernel_bank

    bank = kernel_bank([[1], [1, 2], []], 0)
    windows = data(4, 3, 3).requires_grad_(True)
    w = torch.randn(bank.num_arcs, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(
        conv_transduce_op,
        (windows, w, bank.handle, "max" if viterbi else "log", "numba"),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_pickle_deepcopy_and_half_precision():
    import copy
    import pickle

    layer = make_layer(LEX, 5, 2, learn_params=True)
    x = data(2, 9, 4)
    want = layer(x)
    for other in (pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)):
        assert other.bank.handle != layer.bank.handle
        close(other(x).detach(), want.detach(), "copy", 1e-12)
    half = layer.float()(x.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == want.shape


ATTACK_CONV = r"""
import resource
import torch
from lightning_gtn.nn import ConvTransduce1D
from lightning_gtn.nn import TransducerLoss
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a MemoryError instead of a swap storm
layer = ConvTransduce1D([[1], [2], [1, 2], []], kernel_size=10**9 + 1, stride=2, blank_idx=0)
try:
    layer(torch.randn(2, 50, 3))
    raise SystemExit("no error")
except ValueError as e:
    assert "kernel_size=1000000001" in str(e) and "MAX_CONV_BYTES" in str(e), e
tokens = [[c] for c in "abcdefg"]
g2i = {c: i for i, c in enumerate("abcdefg")}
try:
    TransducerLoss(tokens, g2i, ngram=8, blank="optional")
    raise SystemExit("no error")
except ValueError as e:
    assert "ngram=8" in str(e) and "MAX_TRANSITION_BYTES" in str(e), e
print("fuzzed")
"""


def test_settings_that_would_allocate_gigabytes_are_refused_first(tmp_path):
    # Finding 16 of the second probe: ConvTransduce1D(kernel_size=10**9+1) allocated 12 GB and
    # TransducerLoss(ngram=8) over 8 classes 3.4 GB (the arc cap allowed ~8 GB). Both are now
    # estimated in bytes and refused before allocating (under a 3 GiB address-space limit here).
    from tests._child import run_as_child

    script = tmp_path / "attack.py"
    script.write_text(ATTACK_CONV)
    run_as_child(str(script), timeout=300)
