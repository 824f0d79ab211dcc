"""Fingerprints of every public loss, nn loss module, decoder and aligner: values and gradients.

Evidence for a behaviour-preserving refactor: run this script under two trees (only the public
API that both have is used: ``lightning_gtn.functional``, ``lightning_gtn.nn``,
``lightning_gtn.wfst``), then compare the two JSON files. Inputs are built deterministically
(seeded) at the shapes of ``benchmarks/bench_*.py`` (smaller where a case would be slow, and for
Triton, which runs under its interpreter on the CPU). Each case is run for every CPU
implementation it accepts (``impl=None, "numba", "numba_log", "torch"``, and ``"triton"`` in a
child process with ``TRITON_INTERPRET=1``) and for reductions ``none`` and ``mean``; each tensor it
yields (value, emission gradient, learned-weight gradient, decoded paths) is recorded as shape,
dtype, the sha256 of its bytes, float64 sum and abs-max, and 64 values at evenly spaced flat
positions. Reduction ``none`` is back-propagated through ``(loss * linspace(0.5, 1.5)).sum()``.

Usage (from each tree's root, so that its ``lightning_gtn`` is imported)::

    cd /path/to/treeA && PYTHONPATH=$PWD python /path/to/benchmarks/fingerprint.py --out /tmp/fp_a.json
    cd /path/to/treeB && PYTHONPATH=$PWD python /path/to/benchmarks/fingerprint.py --out /tmp/fp_b.json
    python benchmarks/fingerprint.py --compare /tmp/fp_a.json /tmp/fp_b.json [--tol 1e-6]

Options: ``--only SUBSTR`` (cases whose name contains it), ``--no-triton``. ``--compare`` prints one
row per case and exits 1 when a case is missing on one side, changes shape/dtype, or differs
by more than ``tol * max(1, |value|)`` in a stored value or in the abs-max (not bit-equal rows
are listed with their largest stored difference).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch

SAMPLES = 64
CPU_IMPLS = (None, "numba", "numba_log", "torch", "triton")
REDUCTIONS = ("none", "mean")


# ---------------------------------------------------------------------------
# recording
# ---------------------------------------------------------------------------


def _record(t) -> dict:
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    t = t.detach().cpu().contiguous()
    raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
    flat = t.reshape(-1).double()
    n = flat.numel()
    idx = torch.linspace(0, n - 1, min(n, SAMPLES)).round().long() if n else torch.zeros(0, dtype=torch.long)
    finite = flat[torch.isfinite(flat)]
    short = t.dtype in (torch.float32, torch.float16, torch.bfloat16)  # 9 digits round-trip float32
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "sum": _num(finite.sum().item()) if n else 0.0,
        "absmax": _num(finite.abs().max().item()) if finite.numel() else 0.0,
        "nonfinite": int(n - finite.numel()),
        "samples": [_num(float(f"{v:.9g}") if short else v) for v in flat[idx].tolist()],
    }


def _num(v: float):
    return v if math.isfinite(v) else repr(v)  # "inf", "-inf", "nan" as strings (valid JSON)


def _val(v) -> float:
    return float(v) if isinstance(v, str) else v


CASES: list = []  # (name, impls, fn(impl, reduction) -> {tensor name: tensor}), reductions or None


def case(name, impls=CPU_IMPLS, reductions=REDUCTIONS):
    def deco(fn):
        CASES.append((name, impls, fn, reductions))
        return fn

    return deco


def _weights(n, dtype):
    return torch.linspace(0.5, 1.5, n, dtype=dtype)


def _backward(loss, reduction):
    if reduction == "none":
        (loss * _weights(loss.numel(), loss.dtype).view(loss.shape)).sum().backward()
    else:
        loss.backward()


def _run_loss(fn, reduction, leaves: dict) -> dict:
    """``fn()`` -> loss; backward; the loss and the gradients of ``leaves``."""
    for v in leaves.values():
        v.grad = None
    loss = fn()
    _backward(loss, reduction)
    out = {"value": loss}
    for k, v in leaves.items():
        out[f"grad_{k}"] = v.grad if v.grad is not None else torch.zeros(0)
    return out


# ---------------------------------------------------------------------------
# inputs (the benchmark scripts' recipes, rewritten here so both trees run them)
# ---------------------------------------------------------------------------


def dense_inputs(B, T, C, L, seed=0, ragged=False, dtype=torch.float32):
    """bench_losses._inputs; ``ragged``: input lengths in [T/2, T], target lengths in [L/2, L]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64).log_softmax(-1).to(dtype)
    tg = torch.randint(1, C, (B, L), generator=g)
    il = torch.full((B,), T, dtype=torch.long)
    tl = torch.full((B,), L, dtype=torch.long)
    if ragged:
        il = torch.randint(T // 2, T + 1, (B,), generator=g)
        tl = torch.randint(max(1, L // 2), L + 1, (B,), generator=g)
        il[0], tl[0] = T, L
    return x, tg, il, tl


def asg_transitions(C, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (0.1 * torch.randn(C + 1, C, generator=g, dtype=torch.float64)).to(dtype)


def stc_batch(seed=0, B=32, C=29):
    """bench_stc.make_batch."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(100, 151, size=B)
    T = int(lengths.max())
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed)).log_softmax(-1)
    targets = [[int(v) for v in rng.integers(1, C, size=int(rng.integers(20, 41)))] for _ in range(B)]
    return x, targets, torch.from_numpy(lengths)


def _word_list():
    from lightning_gtn.lightning.text import vocabulary_words

    return [w for w in vocabulary_words() if w.isalpha()]


def make_tokens(words, n_pieces):
    """bench_transducer.make_tokens: letters and ``|``, plus the most frequent substrings."""
    from collections import Counter

    letters = sorted({c for w in words for c in w} | {"|"})
    counts = Counter()
    for w in words:
        for n in range(2, 7):
            for i in range(len(w) - n + 1):
                counts[w[i : i + n]] += 1
    pieces = [s for s, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n_pieces]]
    return letters + pieces, {c: i for i, c in enumerate(letters)}


def transducer_batch(words, g2i, C, seed, B=32, tmin=100, tmax=150):
    """bench_transducer.make_batch (``B``, frame range smaller for the slow impls)."""
    rng = np.random.default_rng(seed)
    targets, lengths = [], []
    for _ in range(B):
        n = int(rng.integers(20, 41))
        text = ""
        while len(text) < n:
            text = (text + "|" if text else "") + words[int(rng.integers(len(words)))]
        text = text[:n].strip("|")
        targets.append([g2i[c] for c in text])
        lengths.append(int(rng.integers(tmin, tmax + 1)))
    T = max(lengths)
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))
    return x, targets, torch.tensor(lengths)


def conv_lexicon(n, C=30, seed=0):
    """bench_conv_transduce.lexicon."""
    rng = np.random.default_rng(seed)
    return [[int(v) for v in rng.integers(1, C, size=int(rng.integers(1, 6)))] for _ in range(n)]


def align_inputs(B, T, C, L, seed=0):
    """bench_align._inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).log_softmax(-1)
    lengths = torch.full((B,), T, dtype=torch.int64)
    targets = []
    for _ in range(B):
        n = int(torch.randint(max(1, L - 10), L + 11, (1,), generator=g))
        targets.append(torch.randint(1, C, (n,), generator=g).tolist())
    return x, lengths, targets


def _small(impl):
    """The per-frame torch implementation and Triton's interpreter get smaller inputs."""
    return impl in ("torch", "triton")


# ---------------------------------------------------------------------------
# functional losses
# ---------------------------------------------------------------------------

LOSS_SHAPE = (32, 250, 30, 50)  # bench_losses.SHAPES[0]
TORCH_SHAPE = (8, 80, 30, 16)
TRITON_SHAPE = (4, 40, 12, 8)


def _dense_case(kind, ragged, dtype=torch.float32):
    def fn(impl, reduction):
        from lightning_gtn.functional import asg_loss, ctc_loss, sequence_loss

        shape = {"torch": TORCH_SHAPE, "triton": TRITON_SHAPE}.get(impl, LOSS_SHAPE)
        x, tg, il, tl = dense_inputs(*shape, ragged=ragged, dtype=dtype)
        x.requires_grad_(True)
        leaves = {"x": x}
        if kind == "ctc":
            f = lambda: ctc_loss(x, tg, il, tl, 0, reduction, impl=impl)
        elif kind == "seq":
            f = lambda: sequence_loss(x, tg, il, tl, reduction=reduction, impl=impl)
        else:
            tr = asg_transitions(shape[2], dtype=dtype).requires_grad_(True)
            leaves["transitions"] = tr
            f = lambda: asg_loss(x, tg, il, tl, transitions=tr, reduction=reduction, impl=impl)
        return _run_loss(f, reduction, leaves)

    return fn


for _kind in ("ctc", "seq", "asg"):
    case(f"{_kind}_loss bench")(_dense_case(_kind, False))
    case(f"{_kind}_loss ragged")(_dense_case(_kind, True))
    case(f"{_kind}_loss ragged float64", impls=(None, "torch", "triton"))(_dense_case(_kind, True, torch.float64))


@case("ctc_loss concatenated targets zero_infinity", reductions=("none", "mean", "sum"))
def _ctc_concat(impl, reduction):
    from lightning_gtn.functional import ctc_loss

    x, tg, il, tl = dense_inputs(8, 30, 12, 14, seed=3, ragged=True)
    il[1] = 5  # infeasible: zero_infinity
    flat = torch.cat([tg[b, : tl[b]] for b in range(8)])
    x.requires_grad_(True)
    return _run_loss(lambda: ctc_loss(x, flat, il, tl, 0, reduction, True, impl=impl), reduction, {"x": x})


@case("stc_loss bench p=0.5")
def _stc(impl, reduction):
    from lightning_gtn.functional import stc_loss

    if _small(impl):
        x, targets, lengths = stc_batch(B=3, C=8)
        x, lengths = x[:, :40].contiguous(), lengths.clamp(max=40)
        targets = [t[:6] for t in targets]
    else:
        x, targets, lengths = stc_batch()
    x.requires_grad_(True)
    return _run_loss(lambda: stc_loss(x, targets, lengths, p=0.5, reduction=reduction, impl=impl), reduction, {"x": x})


TRANSDUCER_CONFIGS = [
    ("letters", 0, 0),
    ("letters", 0, 1),
    ("letters", 0, 2),
    ("200 pieces", 200, 0),
    ("200 pieces", 200, 1),
]


def _transducer_setup(n_pieces, ngram, impl):
    from lightning_gtn.functional import transitions_graph

    words = _word_list()
    tokens, g2i = make_tokens(words, n_pieces)
    C = len(tokens) + 1
    small = _small(impl) or (impl == "torch" and n_pieces > 0)
    if small:
        x, targets, lengths = transducer_batch(words, g2i, C, seed=n_pieces + ngram, B=2, tmin=30, tmax=40)
        targets = [t[:8] for t in targets]
    else:
        x, targets, lengths = transducer_batch(words, g2i, C, seed=n_pieces + ngram)
    if ngram == 0:
        x = x.log_softmax(-1)
    params = None
    if ngram:
        g = torch.Generator().manual_seed(7)
        params = (0.1 * torch.randn(transitions_graph(ngram, C).num_arcs(), generator=g)).requires_grad_(True)
    return tokens, g2i, x.requires_grad_(True), targets, lengths, params


def _transducer_case(name, n_pieces, ngram):
    def fn(impl, reduction):
        from lightning_gtn.functional import transducer_loss

        tokens, g2i, x, targets, lengths, params = _transducer_setup(n_pieces, ngram, impl)
        kw = dict(tokens=tokens, graphemes_to_idx=g2i, ngram=ngram, transition_params=params, blank="optional")
        leaves = {"x": x} | ({"transition_params": params} if params is not None else {})
        return _run_loss(
            lambda: transducer_loss(x, targets, lengths, reduction=reduction, impl=impl, **kw), reduction, leaves
        )

    return fn


for _name, _n, _ng in TRANSDUCER_CONFIGS:
    case(f"transducer_loss {_name} ngram={_ng}")(_transducer_case(_name, _n, _ng))


@case("transducer_loss letters blank variants")
def _transducer_blanks(impl, reduction):
    from lightning_gtn.functional import transducer_loss

    tokens, g2i, x, targets, lengths, _ = _transducer_setup(0, 0, "triton")  # small
    out = {}
    for blank, repeats in (("none", True), ("forced", True), ("optional", False)):
        xb = (x[..., :-1] if blank == "none" else x).detach().clone().requires_grad_(True)  # no blank column
        r = _run_loss(
            lambda blank=blank, repeats=repeats, xb=xb: transducer_loss(
                xb,
                targets,
                lengths,
                tokens=tokens,
                graphemes_to_idx=g2i,
                blank=blank,
                allow_repeats=repeats,
                reduction=reduction,
                impl=impl,
                zero_infinity=True,
            ),
            reduction,
            {"x": xb},
        )
        out.update({f"{blank}_repeats{int(repeats)}_{k}": v for k, v in r.items()})
    return out


def _ctc_graphs(tg, tl, calc_grad=False):
    from lightning_gtn.wfst.criterion import ctc_graph

    return [ctc_graph(tg[b, : tl[b]].tolist(), 0, calc_grad) for b in range(tg.shape[0])]


@case("graph_loss ctc graphs (bench_losses graph row)")
def _graph_loss(impl, reduction):
    from lightning_gtn.functional import graph_loss

    shape = {"torch": TORCH_SHAPE, "triton": TRITON_SHAPE}.get(impl, LOSS_SHAPE)
    x, tg, il, tl = dense_inputs(*shape, ragged=True)
    x.requires_grad_(True)
    graphs = _ctc_graphs(tg, tl)
    return _run_loss(
        lambda: graph_loss(x, tg, il, tl, graphs=graphs, reduction=reduction, impl=impl), reduction, {"x": x}
    )


@case("graph_loss learned weights + denominator")
def _graph_loss_weights(impl, reduction):
    import lightning_gtn.wfst as gtn
    from lightning_gtn.functional import graph_loss

    B, T, C, L = (4, 20, 8, 5) if _small(impl) else (16, 60, 20, 12)
    x, tg, il, tl = dense_inputs(B, T, C, L, seed=5, ragged=True)
    x.requires_grad_(True)
    graphs = _ctc_graphs(tg, tl)
    den = gtn.Graph(False)  # a bigram-free normaliser with learned per-class scores
    den.add_node(True, True)
    for c in range(C):
        den.add_arc(0, 0, c)
    g = torch.Generator().manual_seed(11)
    ws = [(0.1 * torch.randn(gr.num_arcs(), generator=g)).requires_grad_(True) for gr in graphs]
    wd = (0.1 * torch.randn(C, generator=g)).requires_grad_(True)
    leaves = {"x": x, "w0": ws[0], "w_last": ws[-1], "w_den": wd}
    return _run_loss(
        lambda: graph_loss(
            x, tg, il, tl, graphs=graphs, denominators=den, weights=ws + [wd], reduction=reduction, impl=impl
        ),
        reduction,
        leaves,
    )


def _conv_case(viterbi, n_lex):
    def fn(impl, reduction):
        from lightning_gtn.nn import ConvTransduce1D

        B, T, C, K, S = (32, 100, 30, 9, 4)  # bench_conv_transduce
        n = n_lex
        if _small(impl):  # Triton's interpreter: minutes per window batch
            B, T, n = (2, 20, 10) if impl == "torch" else (1, 12, 4)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, T, C, generator=g).log_softmax(-1).requires_grad_(True)
        torch.manual_seed(0)
        layer = ConvTransduce1D(conv_lexicon(n), K, S, 0, learn_params=True, viterbi=viterbi, impl=impl)
        with torch.no_grad():
            layer.kernel_params.normal_(0, 0.1)
        return _run_loss(lambda: layer(x), "none", {"x": x, "kernel_params": layer.kernel_params})

    return fn


case("nn.ConvTransduce1D forward lexicon 100", reductions=None)(_conv_case(False, 100))
case("nn.ConvTransduce1D viterbi lexicon 100", reductions=None)(_conv_case(True, 100))


@case("conv_transduce1d functional scale/normalize", reductions=("sqrt/pre", "linear/post"))
def _conv_functional(impl, reduction):
    from lightning_gtn.functional import conv_transduce1d, kernel_graph

    B, T, n = (1, 12, 4) if impl == "triton" else (3, 24, 12)
    lex = conv_lexicon(n, C=10, seed=2)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, 10, generator=g).log_softmax(-1).requires_grad_(True)
    n = sum(kernel_graph(t, 0, True, False).num_arcs() for t in lex)
    kp = (0.1 * torch.randn(n, generator=g)).requires_grad_(True)
    return _run_loss(
        lambda: conv_transduce1d(
            x,
            lex,
            7,
            2,
            0,
            kernel_params=kp,
            scale=reduction.split("/")[0],
            normalize=reduction.split("/")[1],
            impl=impl,
        ),
        "none",
        {"x": x, "kernel_params": kp},
    )


# ---------------------------------------------------------------------------
# nn loss modules
# ---------------------------------------------------------------------------


def _nn_case(kind):
    def fn(impl, reduction):
        import lightning_gtn.nn as lnn
        from lightning_gtn.wfst.criterion import ctc_graph

        B, T, C, L = (4, 20, 8, 5) if _small(impl) else (16, 120, 30, 25)
        x, tg, il, tl = dense_inputs(B, T, C, L, seed=9, ragged=True)
        x.requires_grad_(True)
        torch.manual_seed(0)
        if kind == "CTCLoss":
            m = lnn.CTCLoss(0, reduction, impl=impl)
        elif kind == "ASGLoss":
            m = lnn.ASGLoss(C, reduction, impl=impl)
            with torch.no_grad():
                m.transitions.copy_(asg_transitions(C))
        elif kind == "SequenceLoss":
            m = lnn.SequenceLoss(reduction, impl=impl)
        elif kind == "STCLoss":
            m = lnn.STCLoss(0, 0.3, 0.7, 5, reduction=reduction, impl=impl)
        elif kind == "TargetGraphLoss":
            m = lnn.TargetGraphLoss(ctc_graph, {"blank_idx": 0}, blank=0, reduction=reduction, impl=impl)
        elif kind == "ModuleLoss":
            m = lnn.ModuleLoss(lnn.CTCLoss(0, reduction, impl=impl), blank=0)
        else:  # GraphLoss
            m = lnn.GraphLoss(reduction, impl=impl)
            graphs = _ctc_graphs(tg, tl)
            return _run_loss(lambda: m(x, tg, il, tl, graphs=graphs), reduction, {"x": x})
        leaves = {"x": x} | {n: p for n, p in m.named_parameters()}
        if kind == "STCLoss":  # targets as lists (its research convention)
            targets = [tg[b, : tl[b]].tolist() for b in range(B)]
            out = {}
            for step in range(2):  # p follows the schedule across calls
                r = _run_loss(lambda: m(x, targets, il), reduction, leaves)
                out.update({f"call{step}_{k}": v for k, v in r.items()})
            return out
        return _run_loss(lambda: m(x, tg, il, tl), reduction, leaves)

    return fn


for _kind in ("CTCLoss", "ASGLoss", "SequenceLoss", "STCLoss", "GraphLoss", "TargetGraphLoss", "ModuleLoss"):
    case(f"nn.{_kind}")(_nn_case(_kind))


@case("nn.TransducerLoss letters ngram=1")
def _nn_transducer(impl, reduction):
    import lightning_gtn.nn as lnn

    words = _word_list()
    tokens, g2i = make_tokens(words, 0)
    C = len(tokens) + 1
    x, targets, lengths = transducer_batch(words, g2i, C, seed=3, B=4, tmin=40, tmax=60)
    targets = [t[:12] for t in targets]
    x.requires_grad_(True)
    torch.manual_seed(0)
    m = lnn.TransducerLoss(tokens, g2i, ngram=1, blank="optional", reduction=reduction, impl=impl)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)
    leaves = {"x": x} | {n: p for n, p in m.named_parameters()}
    return _run_loss(lambda: m(x, targets, lengths), reduction, leaves)


@case("nn.Linear", impls=(None,), reductions=None)
def _nn_linear(impl, reduction):
    import lightning_gtn.nn as lnn

    torch.manual_seed(0)
    m = lnn.Linear(64, 30)
    x = torch.randn(4, 50, 64).requires_grad_(True)
    out = m(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape))
    return {"value": out, "grad_x": x.grad, "grad_weight": m.weight.grad, "grad_bias": m.bias.grad}


# ---------------------------------------------------------------------------
# decoders and aligners
# ---------------------------------------------------------------------------


def _paths_tensor(paths):
    n = max((len(p) for p in paths), default=0)
    return torch.tensor([list(p) + [-2] * (n - len(p)) for p in paths], dtype=torch.long)


@case("viterbi / best_paths (bench_decode shape)", impls=(None,), reductions=None)
def _decode(impl, reduction):
    from lightning_gtn.functional import best_paths, collapse, viterbi

    x, tg, il, tl = dense_inputs(32, 200, 28, 40, seed=2, ragged=True)  # bench_decode B, T, C
    tr = asg_transitions(28)
    graphs = _ctc_graphs(tg, tl)
    out = {}
    out["viterbi_blank0"] = _paths_tensor(viterbi(x, il, blank=0))
    labels, paths = viterbi(x, il, blank=None, transitions=tr, return_paths=True)
    out["viterbi_transitions_labels"] = _paths_tensor(labels)
    out["viterbi_transitions_paths"] = _paths_tensor(paths)
    out["viterbi_graphs"] = _paths_tensor(viterbi(x, il, blank=0, graphs=graphs))
    for name, kw in (("argmax", {}), ("transitions", {"transitions": tr}), ("graphs", {"graphs": graphs})):
        p, s = best_paths(x, il, **kw)
        out[f"best_paths_{name}_paths"], out[f"best_paths_{name}_scores"] = p, s
    out["collapse"] = _paths_tensor([collapse(p, 0) for p in out["best_paths_argmax_paths"].tolist()])
    return out


def _align_case(kw):
    def fn(impl, reduction):
        from lightning_gtn.functional import forced_align

        B, T, L = (8, 200, 40) if _small(impl) else (32, 500, 100)  # bench_align defaults (smaller for torch)
        x, lengths, targets = align_inputs(B, T, 30, L)
        lengths = lengths - torch.arange(B) * 5
        if "transitions" in kw:
            kw2 = dict(kw, transitions=asg_transitions(30))
        else:
            kw2 = kw
        al = forced_align(x, targets, lengths, impl=impl, **kw2)
        fields = ["labels", "token_start", "token_end", "token_score", "token_confidence", "score"]
        out = {f: getattr(al, f) for f in fields}
        if getattr(al, "star_frames", None) is not None:
            out["star_frames"] = al.star_frames
        return out

    return fn


case("forced_align ctc (bench_align)", impls=(None, "numba", "torch"), reductions=None)(_align_case({"blank": 0}))
case("forced_align star=-2", impls=(None, "numba", "torch"), reductions=None)(_align_case({"blank": 0, "star": -2.0}))
case("forced_align asg transitions", impls=(None, "numba", "torch"), reductions=None)(
    _align_case({"blank": None, "transitions": True})
)


# ---------------------------------------------------------------------------
# the WFST engine (bench_engine's headline case and a few more operations)
# ---------------------------------------------------------------------------


@case("wfst ctc intersect/forward_score/viterbi/backward (bench_engine)", impls=(None,), reductions=None)
def _wfst(impl, reduction):
    import lightning_gtn.wfst as gtn
    from lightning_gtn.wfst.criterion import ctc_graph

    rng = np.random.default_rng(0)
    T, C, L = 1000, 28, 100
    target = rng.integers(1, C, size=L).tolist()
    em_w = rng.standard_normal((T, C)).astype(np.float32)
    out = {}
    for name, score in (("forward", gtn.forward_score), ("viterbi", gtn.viterbi_score)):
        ctc = ctc_graph(target, 0, True)
        em = gtn.linear_graph(T, C)
        em.set_weights(em_w)
        s = score(gtn.intersect(em, ctc))
        gtn.backward(s)
        out[f"{name}_score"] = torch.tensor([s.item()])
        out[f"{name}_grad_emissions"] = torch.from_numpy(em.grad().weights_to_numpy())
        out[f"{name}_grad_ctc"] = torch.from_numpy(ctc.grad().weights_to_numpy())
    em = gtn.linear_graph(T, C)
    em.set_weights(em_w)
    path = gtn.viterbi_path(gtn.intersect(em, ctc_graph(target, 0)))
    out["viterbi_path_labels"] = torch.tensor(path.labels_to_list())
    out["viterbi_path_weights"] = torch.from_numpy(path.weights_to_numpy())
    # compose with epsilons, closure, union, concat, remove: sizes and scores
    a = ctc_graph(target[:6], 0)
    b = gtn.Graph(False)
    b.add_node(True, True)
    for c in range(C):
        b.add_arc(0, 0, c, c, float(rng.standard_normal()))
    b.add_arc(0, 0, c, gtn.epsilon, 0.5)
    comp = gtn.compose(gtn.closure(gtn.union([a, ctc_graph(target[6:9], 0)])), b)
    e2 = gtn.linear_graph(12, C)
    e2.set_weights(em_w[:12])
    full = gtn.intersect(e2, gtn.project_input(gtn.remove(comp)))
    out["compose_sizes"] = torch.tensor([comp.num_nodes(), comp.num_arcs(), full.num_nodes(), full.num_arcs()])
    out["compose_score"] = torch.tensor([gtn.forward_score(full).item(), gtn.viterbi_score(full).item()])
    return out


# ---------------------------------------------------------------------------
# the RNN-T family, k2's recursion, lattices, MMI, NaN emissions
# ---------------------------------------------------------------------------

RIMPL = (None, "numba", "torch", "triton")


def joiner_inputs(B=3, T=9, U=4, V=6, seed=0, nan=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g)
    tg = torch.randint(1, 4, (B, U), generator=g, dtype=torch.int32)
    il = torch.tensor([T, T - 2, T - 4][:B], dtype=torch.int32)
    tl = torch.tensor([U, U - 1, 2][:B], dtype=torch.int32)
    if nan:
        x[1, 2, 1, 3] = float("nan")
    return x, tg, il, tl


def _rnnt(kind, nan=False, V=6, **kw):
    def fn(impl, red):
        import lightning_gtn.functional as F

        x, tg, il, tl = joiner_inputs(V=V, nan=nan)
        x.requires_grad_(True)
        f = getattr(F, kind)
        return _run_loss(lambda: f(x, tg, il, tl, reduction=red, impl=impl, **kw), red, {"x": x})

    return fn


case("rnnt_loss", RIMPL, ("none", "mean", "sum"))(_rnnt("rnnt_loss"))
case("rnnt_loss fastemit clamp", RIMPL)(_rnnt("rnnt_loss", fastemit_lambda=0.01, clamp=0.5))
case("rnnt_loss nan", RIMPL)(_rnnt("rnnt_loss", nan=True))
case("rnnt_loss unfused", RIMPL)(_rnnt("rnnt_loss", fused_log_softmax=False))
case("multiblank_rnnt_loss", RIMPL, ("none", "mean", "sum"))(
    _rnnt("multiblank_rnnt_loss", big_blank_durations=(2,), blank=-1)
)
case("tdt_loss", RIMPL, ("none", "mean", "sum", "mean_volume"))(_rnnt("tdt_loss", V=9, durations=(0, 1, 2), sigma=0.05))
case("tdt_loss nan", RIMPL)(_rnnt("tdt_loss", V=9, nan=True, durations=(0, 1, 2)))


def _k2(which, nan=False):
    def fn(impl, red):
        import lightning_gtn.k2 as k2

        g = torch.Generator().manual_seed(5)
        B, T, S, C = 3, 8, 3, 7
        am = torch.randn(B, T, C, generator=g)
        lm = torch.randn(B, S + 1, C, generator=g)
        if nan:
            am[1, 3, 2] = float("nan")
        am.requires_grad_(True)
        lm.requires_grad_(True)
        sym = torch.randint(1, C, (B, S), generator=g)
        bnd = torch.tensor([[0, 0, 3, 8], [0, 0, 2, 6], [0, 0, 3, 5]])
        if which == "simple":
            f = lambda: k2.rnnt_loss_simple(lm, am, sym, 0, bnd, reduction=red, impl=impl)
        elif which == "modified":
            f = lambda: k2.rnnt_loss_simple(
                lm, am, sym, 0, bnd, rnnt_type="modified", delay_penalty=0.1, reduction=red, impl=impl
            )
        elif which == "mi":
            px = torch.randn(B, S, T + 1, generator=g, requires_grad=True)
            py = torch.randn(B, S + 1, T, generator=g, requires_grad=True)
            if nan:
                with torch.no_grad():
                    px[2, 1, 1] = float("nan")
            out = k2.mutual_information_recursion(px, py, bnd, impl=impl)
            (out * torch.linspace(0.5, 1.5, B)).sum().backward()
            return {"value": out, "grad_px": px.grad, "grad_py": py.grad}
        else:  # full + pruned
            logits = torch.randn(B, T, S + 1, C, generator=g, requires_grad=True)
            loss = k2.rnnt_loss(logits, sym, 0, bnd, reduction=red, impl=impl)
            s, (px_g, py_g) = k2.rnnt_loss_simple(lm, am, sym, 0, bnd, reduction="sum", return_grad=True, impl=impl)
            ranges = k2.get_rnnt_prune_ranges(px_g, py_g, bnd, 2)
            am_p, lm_p = k2.do_rnnt_pruning(am, lm, ranges)
            pl = k2.rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, bnd, reduction=red, impl=impl)
            _backward(loss + pl if red != "none" else loss + pl, red)
            return {"value": loss, "pruned": pl, "grad_logits": logits.grad, "grad_am": am.grad, "grad_lm": lm.grad}
        return _run_loss(f, red, {"am": am, "lm": lm})

    return fn


for w in ("simple", "modified", "mi", "full_pruned"):
    case(f"k2 {w}", RIMPL, ("none", "mean", "sum") if w != "mi" else None)(_k2(w))
case("k2 simple nan", RIMPL)(_k2("simple", nan=True))
case("k2 mi nan", RIMPL, None)(_k2("mi", nan=True))


def _lattice(kind):
    def fn(impl, red):
        import lightning_gtn.functional as F

        x, tg, il, tl = joiner_inputs(B=2, T=6, U=3, V=5)
        x.requires_grad_(True)
        if kind == "rnnt":
            return _run_loss(
                lambda: F.rnnt_lattice_loss(x, tg.long(), il.long(), tl.long(), blank=0, reduction=red), red, {"x": x}
            )
        lp = x.log_softmax(-1).detach().reshape(2, -1).requires_grad_(True)
        lats = [F.rnnt_lattice(6, 3, tg[b, : tl[b]].tolist(), 5, 0, frames=int(il[b])) for b in range(2)]
        return _run_loss(lambda: F.lattice_loss(lp, lats, red, impl=impl, semiring=kind), red, {"s": lp})

    return fn


case("rnnt_lattice_loss", (None,), ("none", "mean", "sum"))(_lattice("rnnt"))
case("lattice_loss log", (None, "numba", "torch"), ("none", "mean", "sum"))(_lattice("log"))
case("lattice_loss max", (None, "numba", "torch"), ("none", "mean"))(_lattice("max"))


def _mmi(nan=False, leaky=0.0):
    def fn(impl, red):
        import lightning_gtn.functional as F

        g = torch.Generator().manual_seed(3)
        N = 5
        seqs = [torch.randint(1, N + 1, (int(n),), generator=g).tolist() for n in (4, 6, 3, 5, 6, 2)]
        den = F.denominator_graph(seqs, N, order=2)
        B, T = 4, 20
        x = torch.randn(B, T, N + 1, generator=g).log_softmax(-1)
        if nan:
            x[2, 5, 1] = float("nan")
        x.requires_grad_(True)
        tg = [seqs[i] for i in range(B)]
        il = torch.tensor([20, 18, 15, 12])
        return _run_loss(
            lambda: F.mmi_loss(x, tg, il, denominator=den, leaky_hmm=leaky, reduction=red, impl=impl), red, {"x": x}
        )

    return fn


case("mmi_loss", (None, "numba", "torch", "triton"), ("none", "mean", "sum"))(_mmi())
case("mmi_loss leaky", (None, "numba", "torch"))(_mmi(leaky=1e-3))
case("mmi_loss nan", (None, "numba", "torch"))(_mmi(nan=True))


def _nan_dense(kind):
    def fn(impl, red):
        from lightning_gtn.functional import asg_loss, ctc_loss, sequence_loss

        x, tg, il, tl = dense_inputs(4, 30, 8, 6, ragged=True)
        x[1, 4, 2] = float("nan")
        x.requires_grad_(True)
        if kind == "ctc":
            f = lambda: ctc_loss(x, tg, il, tl, 0, red, impl=impl)
        elif kind == "seq":
            f = lambda: sequence_loss(x, tg, il, tl, reduction=red, impl=impl)
        else:
            tr = asg_transitions(8).requires_grad_(True)
            return _run_loss(
                lambda: asg_loss(x, tg, il, tl, transitions=tr, reduction=red, impl=impl), red, {"x": x, "tr": tr}
            )
        return _run_loss(f, red, {"x": x})

    return fn


for k in ("ctc", "seq", "asg"):
    case(f"{k}_loss nan emission")(_nan_dense(k))


def _joiner(kind):
    def fn(impl, red):
        import lightning_gtn.functional as F

        g = torch.Generator().manual_seed(11)
        B, T, U, J = 3, 7, 3, 5
        V = {"rnnt_joiner_loss": 6, "tdt_joiner_loss": 9, "multiblank_rnnt_joiner_loss": 7}[kind]
        enc = torch.randn(B, T, J, generator=g, requires_grad=True)
        pred = torch.randn(B, U + 1, J, generator=g, requires_grad=True)
        w = torch.randn(V, J, generator=g, requires_grad=True)
        b = torch.randn(V, generator=g, requires_grad=True)
        tg = torch.randint(1, 4, (B, U), generator=g)
        il, tl = torch.tensor([T, T - 2, T - 3]), torch.tensor([U, U - 1, 1])
        kw = {
            "rnnt_joiner_loss": {"blank": 0, "fastemit_lambda": 0.01, "clamp": 0.5},
            "tdt_joiner_loss": {"durations": (0, 1, 2), "sigma": 0.05},
            "multiblank_rnnt_joiner_loss": {"big_blank_durations": (2,)},
        }[kind]
        f = getattr(F, kind)
        return _run_loss(
            lambda: f(enc, pred, w, b, tg, il, tl, reduction=red, impl=impl, **kw),
            red,
            {"encoder": enc, "predictor": pred, "weight": w, "bias": b},
        )

    return fn


for _kind in ("rnnt_joiner_loss", "tdt_joiner_loss", "multiblank_rnnt_joiner_loss"):
    case(_kind, (None, "torch"), ("none", "mean", "sum"))(_joiner(_kind))


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------


def _runs(only, triton: bool):
    for name, impls, fn, reductions in CASES:
        if only and not any(o in name for o in only):
            continue
        for impl in impls:
            if (impl == "triton") != triton:
                continue
            for red in reductions or (None,):
                key = f"{name} | impl={impl}" + (f" | reduction={red}" if red else "")
                yield key, fn, impl, red


def collect(only, triton: bool) -> dict:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = {}
    for key, fn, impl, red in _runs(only, triton):
        t0 = time.perf_counter()
        try:
            tensors = fn(impl, red)
            rec = {"tensors": {k: _record(v) for k, v in tensors.items()}}
        except Exception as e:  # recorded, compared like a value
            rec = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        results[key] = rec
        print(f"{rec['seconds']:7.2f} s  {key}" + (f"  ERROR {rec['error']}" if "error" in rec else ""), flush=True)
    return results


def main_collect(args) -> int:
    import lightning_gtn

    if args.triton_child:
        json.dump(collect(args.only, triton=True), sys.stdout if args.out == "-" else open(args.out, "w"))
        return 0
    results = collect(args.only, triton=False)
    if not args.no_triton:
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            tmp = f.name
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
        cmd = [sys.executable, os.path.abspath(__file__), "--triton-child", "--out", tmp]
        cmd += ["--only", *args.only] if args.only else []
        rc = subprocess.run(cmd, env=env).returncode
        if rc == 0:
            with open(tmp) as f:
                results.update(json.load(f))
        else:
            print(f"triton child failed (rc={rc}): triton cases missing", file=sys.stderr)
        os.unlink(tmp)
    doc = {
        "lightning_gtn": os.path.dirname(lightning_gtn.__file__),
        "torch": torch.__version__,
        "triton_interpreted": not args.no_triton,
        "cases": results,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"), sort_keys=True)
    print(f"{len(results)} cases -> {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB)")
    return 0


def _tensor_diff(a, b, tol):
    """(bit_equal, max abs diff of stored values, ok)."""
    if a["shape"] != b["shape"] or a["dtype"] != b["dtype"]:
        return False, float("inf"), False
    if a["sha256"] == b["sha256"]:
        return True, 0.0, True
    worst, ok = 0.0, True
    pairs = list(zip(a["samples"], b["samples"])) + [(a["absmax"], b["absmax"])]
    for u, v in pairs:
        u, v = _val(u), _val(v)
        if math.isnan(u) and math.isnan(v) or u == v:
            continue
        d = abs(u - v)
        worst = max(worst, d) if not math.isnan(d) else float("inf")
        if not d <= tol * max(1.0, abs(u)):
            ok = False
    if a["nonfinite"] != b["nonfinite"]:
        ok = False
    return False, worst, ok


def main_compare(path_a, path_b, tol) -> int:
    with open(path_a) as f:
        A = json.load(f)["cases"]
    with open(path_b) as f:
        B = json.load(f)["cases"]
    rows, failed, n_equal = [], 0, 0
    for key in sorted(set(A) | set(B)):
        a, b = A.get(key), B.get(key)
        if a is None or b is None:
            rows.append((key, "missing in " + ("A" if a is None else "B"), "", "FAIL"))
            failed += 1
            continue
        if "error" in a or "error" in b:
            same = a.get("error") == b.get("error")
            rows.append((key, "both raise" if same else "error differs", "", "ok" if same else "FAIL"))
            failed += not same
            n_equal += same
            continue
        eq_all, worst, ok_all, notes = True, 0.0, True, []
        for t in sorted(set(a["tensors"]) | set(b["tensors"])):
            ta, tb = a["tensors"].get(t), b["tensors"].get(t)
            if ta is None or tb is None:
                eq_all, ok_all = False, False
                notes.append(f"{t} missing")
                continue
            eq, d, ok = _tensor_diff(ta, tb, tol)
            eq_all &= eq
            ok_all &= ok
            worst = max(worst, d)
            if not eq:
                notes.append(t)
        n_equal += eq_all
        failed += not ok_all
        rows.append(
            (key, "yes" if eq_all else "no (" + ", ".join(notes) + ")", f"{worst:.3g}", "ok" if ok_all else "FAIL")
        )
    print("| case | bit-equal | max abs diff (stored values) | within tol |")
    print("|---|---|---:|---|")
    for r in rows:
        print("| " + " | ".join([r[0].replace(" | ", ", "), *r[1:]]) + " |")
    print(f"\n{len(rows)} cases: {n_equal} bit-equal, {len(rows) - n_equal} not, {failed} beyond tol={tol:g}.")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file to write")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two JSON files")
    p.add_argument("--tol", type=float, default=1e-6, help="tolerance, relative to max(1, |value|)")
    p.add_argument("--only", nargs="*", default=None, help="run only cases whose name contains one of these")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton-interpreter child")
    p.add_argument("--triton-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compare:
        return main_compare(*args.compare, args.tol)
    if not args.out:
        p.error("--out or --compare is required")
    return main_collect(args)


if __name__ == "__main__":
    sys.exit(main())
