"""transducer_loss against a per-example reference written with lightning_gtn.wfst in the
research code's pattern (gtn_applications' criterions/transducer.py), against brute-force
enumeration of frame label paths, under torch.compile, and its argument errors."""

import itertools
import math

import numpy as np
import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn import nn as lnn
from lightning_gtn.functional import full_ngram_transitions, segment, transducer_best_paths, transducer_loss
from lightning_gtn.losses.transducer import transducer_criterion

# ---------------------------------------------------------------------------
# the reference: the research graphs, built and scored one example at a time
# ---------------------------------------------------------------------------


def ref_chain(seq):
    g = gtn.Graph(False)
    g.add_node(True, len(seq) == 0)
    for i, s in enumerate(seq):
        g.add_node(False, i == len(seq) - 1)
        g.add_arc(i, i + 1, s)
    return g


def ref_transitions(ngram, n):
    g = gtn.Graph(True)
    g.add_node(True, ngram == 1)
    state = {(): 0}
    for k in range(1, ngram):
        for s in itertools.product(range(n), repeat=k):
            node = g.add_node(False, ngram == 1)
            state[s] = node
            g.add_arc(state[s[:-1]], node, s[-1])
    for s in itertools.product(range(n), repeat=ngram):
        g.add_arc(state[s[:-1]], state[s[1:]], s[-1])
    if ngram > 1:
        end = g.add_node(False, True)
        for i in range(end):
            g.add_arc(i, end, gtn.epsilon)
    return g


def ref_lexicon(tokens, g2i):
    g = gtn.Graph(False)
    g.add_node(True, True)
    for i, wp in enumerate(tokens):
        prev = 0
        for ch in wp[:-1]:
            n = g.add_node()
            g.add_arc(prev, n, g2i[ch], gtn.epsilon)
            prev = n
        g.add_arc(prev, 0, g2i[wp[-1]], i)
    g.arc_sort()
    return g


def ref_token_graph(ntoks, blank, allow_repeats):
    g = gtn.Graph(False)
    g.add_node(True, True)
    for _ in range(ntoks):
        g.add_node(False, blank != "forced")
    if blank != "none":
        g.add_node()
        g.add_arc(0, ntoks + 1, ntoks, gtn.epsilon)
        g.add_arc(ntoks + 1, 0, gtn.epsilon)
    for i in range(ntoks):
        g.add_arc((ntoks + 1) if blank == "forced" else 0, i + 1, i)
        g.add_arc(i + 1, i + 1, i, gtn.epsilon)
        if allow_repeats:
            if blank == "forced":
                g.add_arc(i + 1, ntoks + 1, ntoks, gtn.epsilon)
            else:
                g.add_arc(i + 1, 0, gtn.epsilon)
        else:
            g.add_arc(i + 1, ntoks + 1, ntoks, gtn.epsilon)
            for j in range(ntoks):
                if i != j:
                    g.add_arc(i + 1, j + 1, j, j)
    return g


def ref_alignments(target, tokens_g, lexicon):
    tgt = ref_chain(target)
    tgt.arc_sort(True)
    tokens_target = gtn.remove(gtn.project_output(gtn.compose(tgt, lexicon)))
    tokens_target.arc_sort()
    a = gtn.project_input(gtn.remove(gtn.compose(tokens_g, tokens_target)))
    a.arc_sort()
    return a


def reference(
    x, targets, lengths, tokens, g2i, blank="none", allow_repeats=True, trans=None, params=None, decomp_tokens=None
):
    """Per-example losses and gradients (emissions, params), float64. ``decomp_tokens``: a
    per-example token-id sequence replacing the lexicon (the one-segmentation baseline)."""
    B, T, C = x.shape
    tokens_g = ref_token_graph(len(tokens), blank, allow_repeats)
    tokens_g.arc_sort(True)
    lexicon = ref_lexicon(tokens, g2i)
    if trans is not None:
        trans.arc_sort()
        trans.set_weights(params.detach().double().numpy().astype(np.float32).tolist())
        trans.calc_grad = True
        trans.zero_grad()
    losses, grads = [], torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        Tb = int(lengths[b])
        em = gtn.linear_graph(Tb, C, gtn.Device(gtn.CPU), True)
        em.set_weights(x[b, :Tb].detach().reshape(-1).numpy().astype(np.float32).tolist())
        if decomp_tokens is None:
            align = ref_alignments(list(targets[b]), tokens_g, lexicon)
        else:
            tt = ref_chain(decomp_tokens[b])
            align = gtn.project_input(gtn.remove(gtn.compose(tokens_g, tt)))
        if trans is not None:
            align = gtn.intersect(trans, align)
        loss = gtn.forward_score(gtn.intersect(em, align))
        if trans is not None:
            loss = gtn.subtract(loss, gtn.forward_score(gtn.intersect(em, trans)))
        loss = gtn.negate(loss)
        losses.append(loss.item())
        if math.isfinite(loss.item()):
            gtn.backward(loss, retain_graph=False)
            grads[b, :Tb] = torch.tensor(em.grad().weights_to_numpy(), dtype=torch.float64).reshape(Tb, C)
    pgrad = None
    if trans is not None:
        pgrad = torch.tensor(trans.grad().weights_to_numpy(), dtype=torch.float64)
    return torch.tensor(losses, dtype=torch.float64), grads, pgrad


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------

LETTERS = ["a", "b", "c"]
G2I = {"a": 0, "b": 1, "c": 2}
PIECES = ["a", "b", "c", "ab", "ba", "abc", "bc", "aa"]  # several decompositions per target
TARGETS = [[0, 1, 2], [0, 0], [1, 0, 1], [2]]


def _data(C, lengths=(9, 7, 8, 5), seed=0, T=9):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(lengths), T, C, generator=g, dtype=torch.float64)


def _check(
    tokens, blank, reps, ngram=0, trans=None, lengths=(9, 7, 8, 5), T=9, targets=TARGETS, decompositions=True, g2i=G2I
):
    C = len(tokens) + (blank != "none")
    x = _data(C, lengths, T=T)
    if ngram == 0 and trans is None:
        x = x.log_softmax(-1)
    xg = x.clone().requires_grad_()
    params = None
    if ngram or trans is not None:
        ng = full_ngram_transitions(ngram, C) if ngram else trans
        params = (
            0.3 * torch.randn(ng.num_arcs(), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        ).requires_grad_()
    out = transducer_loss(
        xg,
        targets,
        torch.tensor(lengths),
        tokens=tokens,
        graphemes_to_idx=g2i,
        ngram=ngram,
        transitions=trans,
        transition_params=params,
        blank=blank,
        allow_repeats=reps,
        decompositions=decompositions,
        reduction="none",
    )
    out.sum().backward()
    rtrans = ref_transitions(ngram, C) if ngram else (trans_copy(trans) if trans is not None else None)
    dec = None
    if not decompositions:
        i2g = {v: k for k, v in g2i.items()}
        dec = [segment([i2g[t] for t in tg], tokens) for tg in targets]
    ref, gref, pref = reference(x, targets, lengths, tokens, g2i, blank, reps, rtrans, params, dec)
    assert torch.isfinite(ref).any()
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xg.grad, gref, rtol=1e-5, atol=1e-5)
    if params is not None:
        torch.testing.assert_close(params.grad, pref, rtol=1e-5, atol=1e-5)
    return out


def trans_copy(g):
    return gtn.loadtxt_string(gtn.graph_to_text(g)) if hasattr(gtn, "loadtxt_string") else _clone(g)


def _clone(g):
    a = g.arrays()
    return gtn.Graph.from_arrays(a.num_nodes, a.start, a.accept, a.src, a.dst, a.ilabel, calc_grad=True)


MODES = [("none", True), ("optional", True), ("forced", True), ("optional", False)]


@pytest.mark.parametrize("blank,reps", MODES)
@pytest.mark.parametrize("tokens", [LETTERS, PIECES], ids=["letters", "pieces"])
def test_against_reference_no_transitions(tokens, blank, reps):
    _check(tokens, blank, reps)


@pytest.mark.parametrize("blank,reps", MODES)
@pytest.mark.parametrize("ngram", [1, 2])
def test_against_reference_ngram(ngram, blank, reps):
    _check(PIECES if ngram == 1 else ["a", "b", "c", "ab"], blank, reps, ngram=ngram)


def test_trigram():
    _check(
        ["a", "b"],
        "optional",
        True,
        ngram=3,
        targets=[[0, 1], [1, 1, 0], [0], [1]],
        g2i={"a": 0, "b": 1},
        lengths=(6, 5, 4, 6),
        T=6,
    )


@pytest.mark.parametrize("blank,reps", MODES)
def test_empty_targets(blank, reps):
    _check(["a", "b", "ab"], blank, reps, targets=[[], [0, 1], [], [1]], g2i={"a": 0, "b": 1})


def test_full_lengths_and_letters_bigram():
    _check(LETTERS, "optional", True, ngram=2, lengths=(9, 9, 9, 9))


def test_user_transitions_with_epsilon_arcs():
    # a back-off graph over frame labels {a, b, c, ab, blank}: a history node per label
    # class "a-ish" (0, 3) with an epsilon back-off to the unigram node and an epsilon end
    C = 5
    g = gtn.Graph(False)
    g.add_node(True, False)  # 0: unigram
    g.add_node(False, False)  # 1: after a or ab
    g.add_node(False, True)  # 2: end
    for c in range(C):
        g.add_arc(0, 1 if c in (0, 3) else 0, c)
    for c in (1, 4):
        g.add_arc(1, 0, c)
    g.add_arc(1, 0, gtn.epsilon)  # back-off
    g.add_arc(0, 2, gtn.epsilon)
    g.add_arc(1, 2, gtn.epsilon)
    _check(["a", "b", "c", "ab"], "optional", True, trans=g)


def test_one_segmentation_baseline():
    out_all = _check(PIECES, "optional", True)
    out_one = _check(PIECES, "optional", True, decompositions=False)
    # fewer paths: a larger loss where a target has several decompositions
    assert (out_one >= out_all - 1e-9).all() and (out_one > out_all + 1e-6).any()


def test_segment():
    assert segment("hello", ["h", "e", "l", "o", "he", "ll", "hell"]) == [6, 3]
    assert segment("abc", ["a", "bc", "ab", "c"]) == [2, 3]  # two tokens each: longer first token
    assert segment([0, 1], [(0,), (1,), (0, 1)]) == [2]
    assert segment("", ["a"]) == []
    with pytest.raises(ValueError, match="cannot be spelled"):
        segment("abd", ["a", "b", "ab"])


# ---------------------------------------------------------------------------
# brute force: every frame label path, accepted by an independent reading of the rules
# ---------------------------------------------------------------------------


def readings(path, blank, reps, ntok):
    """How many ways (token graph paths, up to final epsilons) ``path`` reads as each token
    sequence. States: "S" (between tokens), "B" (a blank), ("T", k) (inside token k)."""

    def hub(lab, after_blank):
        if lab == ntok:
            return [("B", None)] if blank != "none" else []
        return [(("T", lab), lab)] if (blank != "forced" or after_blank) else []

    def moves(state, lab):
        if state in ("S", "B"):
            return hub(lab, state == "B")
        k = state[1]
        out = [(state, None)] if lab == k else []
        if blank == "forced":
            out += [("B", None)] if lab == ntok else []
        elif reps:
            out += hub(lab, False)
        elif lab == ntok:
            out.append(("B", None))
        elif lab != k:
            out.append((("T", lab), lab))
        return out

    counts = {("S", ()): 1}
    for lab in path:
        nxt = {}
        for (state, toks), n in counts.items():
            for s2, tok in moves(state, lab):
                key = (s2, toks if tok is None else toks + (tok,))
                nxt[key] = nxt.get(key, 0) + n
        counts = nxt
    out = {}
    for (state, toks), n in counts.items():
        if state != "S" and state != "B" and blank == "forced":
            continue
        out[toks] = out.get(toks, 0) + n
    return out


@pytest.mark.parametrize("blank,reps", MODES)
@pytest.mark.parametrize("ngram", [0, 1, 2])
def test_brute_force(blank, reps, ngram):
    tokens = ["a", "b", "ab"]
    tok_ids = [(0,), (1,), (0, 1)]
    C = 3 + (blank != "none")
    T = 5
    g = torch.Generator().manual_seed(5)
    targets = [[0, 1], [0], [1, 0]]
    x = torch.randn(len(targets), T, C, generator=g, dtype=torch.float64)
    if ngram == 0:
        x = x.log_softmax(-1)
    params = None
    if ngram:
        params = 0.5 * torch.randn(full_ngram_transitions(ngram, C).num_arcs(), generator=g, dtype=torch.float64)
    got = transducer_loss(
        x,
        targets,
        tokens=tokens,
        graphemes_to_idx={"a": 0, "b": 1},
        ngram=ngram,
        transition_params=params,
        blank=blank,
        allow_repeats=reps,
        reduction="none",
    )

    def trans_score(path):
        if ngram == 0:
            return 0.0
        if ngram == 1:
            return float(sum(params[lab] for lab in path))
        s = float(params[path[0]]) + sum(float(params[C + a * C + b]) for a, b in zip(path[:-1], path[1:]))
        return s + float(params[C + C * C + 1 + path[-1]])  # the end arc from the last label's node

    for b, tgt in enumerate(targets):
        num, den = [], []
        for path in itertools.product(range(C), repeat=T):
            e = float(sum(x[b, t, lab] for t, lab in enumerate(path))) + trans_score(path)
            den.append(e)
            for toks, n in readings(path, blank, reps, 3).items():
                spelled = [g_ for k in toks for g_ in tok_ids[k]]
                if spelled == tgt:
                    num += [e] * n
        want = -(torch.logsumexp(torch.tensor(num), 0) - (torch.logsumexp(torch.tensor(den), 0) if ngram else 0))
        torch.testing.assert_close(got[b], want.to(got.dtype), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# infeasible targets, reductions, lengths
# ---------------------------------------------------------------------------


def test_infeasible_and_zero_infinity():
    x = _data(4, (6, 2, 6), T=6).log_softmax(-1)
    kw = dict(tokens=["a", "b", "ab"], graphemes_to_idx={"a": 0, "b": 1, "c": 2}, blank="forced")
    tg = [[0, 1], [0, 1], [2]]  # row 1: too few frames for forced blanks; row 2: "c" has no token
    out = transducer_loss(x, tg, [6, 2, 6], **kw, reduction="none")
    assert torch.isfinite(out[0]) and torch.isinf(out[1]) and torch.isinf(out[2])
    xg = x.clone().requires_grad_()
    out = transducer_loss(xg, tg, [6, 2, 6], **kw, reduction="none", zero_infinity=True)
    assert out[1] == 0 and out[2] == 0
    out.sum().backward()
    assert xg.grad[1:].abs().sum() == 0 and xg.grad[0].abs().sum() > 0


@pytest.mark.parametrize("impl", ["numba_log", "torch"])
@pytest.mark.parametrize("ngram", [0, 1, 2])
def test_impls_agree(impl, ngram):
    tokens = ["a", "b", "c", "ab"]
    C = 5
    x = _data(C).requires_grad_()
    params = (
        torch.randn(full_ngram_transitions(ngram, C).num_arcs(), dtype=torch.float64).requires_grad_()
        if ngram
        else None
    )
    kw = dict(tokens=tokens, graphemes_to_idx=G2I, ngram=ngram, transition_params=params, blank="optional")
    il = torch.tensor([9, 7, 8, 5])
    outs = []
    for im in ("numba", impl):
        x.grad = None
        if params is not None:
            params.grad = None
        loss = transducer_loss(x, TARGETS, il, **kw, impl=im)
        loss.backward()
        outs.append((loss.detach(), x.grad.clone(), None if params is None else params.grad.clone()))
    for a, b in zip(*outs):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_reductions_and_tensor_targets():
    x = _data(4, (9, 7, 8, 5)).log_softmax(-1)
    kw = dict(tokens=PIECES[:3] + ["ab"], graphemes_to_idx=G2I, blank="none")
    x = _data(4).log_softmax(-1)
    il = torch.tensor([9, 7, 8, 5])
    none = transducer_loss(x, TARGETS, il, **kw, reduction="none")
    tl = torch.tensor([len(t) for t in TARGETS])
    padded = torch.zeros(4, 3, dtype=torch.int64)
    for b, t in enumerate(TARGETS):
        padded[b, : len(t)] = torch.tensor(t)
    torch.testing.assert_close(transducer_loss(x, padded, il, tl, **kw, reduction="sum"), none.sum())
    flat = torch.tensor([v for t in TARGETS for v in t])
    torch.testing.assert_close(transducer_loss(x, flat, il, tl, **kw, reduction="mean"), (none / tl).mean())


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


def test_compiled_equals_eager(ngram=1):
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(3, 7, 6, generator=g)
    tg = torch.tensor([[0, 1, 2], [1, 0, 0], [2, 2, 0]])
    il, tl = torch.tensor([7, 6, 5]), torch.tensor([3, 2, 2])
    C = len(PIECES) + 1

    def run(compiled):
        torch.manual_seed(1)
        model = lnn.Linear(6, C)
        params = torch.zeros(full_ngram_transitions(1, C).num_arcs(), requires_grad=True) if ngram else None

        def step(feats, tg, il, tl):
            x = model(feats)
            if not ngram:
                x = x.log_softmax(-1)
            return transducer_loss(
                x,
                tg,
                il,
                tl,
                tokens=PIECES,
                graphemes_to_idx=G2I,
                ngram=ngram,
                transition_params=params,
                blank="optional",
            )

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True)
        loss = step(feats, tg, il, tl)
        loss.backward()
        out = [loss.detach(), model.weight.grad.clone(), model.bias.grad.clone()]
        if ngram:
            out.append(params.grad.clone())
        return out

    eager, compiled = run(False), run(True)
    assert torch.isfinite(eager[0])
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_errors():
    x = torch.randn(2, 5, 4)
    kw = dict(tokens=["a", "b", "ab"], graphemes_to_idx={"a": 0, "b": 1})
    with pytest.raises(ValueError, match="blank must be one of"):
        transducer_loss(x, [[0], [1]], **kw, blank="sometimes")
    with pytest.raises(ValueError, match="allow_repeats=False needs blank='optional'"):
        transducer_loss(x, [[0], [1]], **kw, blank="forced", allow_repeats=False)
    with pytest.raises(ValueError, match="allow_repeats=False needs blank='optional'"):
        transducer_loss(torch.randn(2, 5, 3), [[0], [1]], **kw, blank="none", allow_repeats=False)
    with pytest.raises(ValueError, match="ngram > 0 or transitions, not both"):
        transducer_loss(x, [[0], [1]], **kw, blank="optional", ngram=1, transitions=full_ngram_transitions(1, 4))
    with pytest.raises(ValueError, match="emissions must have C .* = 3"):
        transducer_loss(x, [[0], [1]], **kw, blank="none")
    with pytest.raises(ValueError, match=r"out of range \[0, C\) with C=2"):
        transducer_loss(x, [[0], [2]], **kw, blank="optional")
    with pytest.raises(ValueError, match="out of range"):
        transducer_loss(x, [[0], [-1]], **kw, blank="optional")
    with pytest.raises(ValueError, match="grapheme 'c' is not in graphemes_to_idx"):
        transducer_loss(x, [[0], [1]], tokens=["a", "b", "c"], graphemes_to_idx={"a": 0, "b": 1}, blank="optional")
    with pytest.raises(ValueError, match="transition_params must be a tensor of shape"):
        transducer_loss(x, [[0], [1]], **kw, blank="optional", ngram=1)
    with pytest.raises(ValueError, match="transition_params must be a tensor of shape"):
        transducer_loss(x, [[0], [1]], **kw, blank="optional", ngram=1, transition_params=torch.zeros(3))
    with pytest.raises(ValueError, match="ngram must be an integer"):
        transducer_loss(x, [[0], [1]], **kw, blank="optional", ngram=-1)
    bad = gtn.Graph(False)
    bad.add_node(True, True)
    bad.add_arc(0, 0, 7)
    with pytest.raises(ValueError, match="transitions: label 7 out of range"):
        transducer_loss(x, [[0], [1]], **kw, blank="optional", transitions=bad, transition_params=torch.zeros(1))
    with pytest.raises(ValueError, match="input_lengths must be <= T"):
        transducer_loss(x, [[0], [1]], [5, 6], **kw, blank="optional")


def test_criterion_cache_and_build_size():
    # 40 graphemes over many overlapping pieces: the lattice, not the paths, is built
    letters = "abcdefghij"
    g2i = {c: i for i, c in enumerate(letters)}
    pieces = list(letters) + [a + b for a in letters for b in letters] + [a * 3 for a in letters]
    crit, _ = transducer_criterion(pieces, g2i, ngram=1, blank="optional")
    tgt = [g2i[c] for c in ("abcaaabbbcdefghij" * 3)[:40]]
    cg = crit.numerator(tgt)
    assert cg is crit.numerator(list(tgt))  # cached
    assert cg.num_arcs < 20_000
    assert transducer_criterion(pieces, g2i, ngram=1, blank="optional")[0] is crit


def test_transitions_graph_is_a_deprecated_alias():
    # functional.transitions_graph was renamed (wfst.ngram.transitions_graph, an n-gram from data,
    # keeps its name); the old name still gives the same graph, with a warning naming the new one
    import lightning_gtn.functional as F
    import lightning_gtn.wfst.ngram as ngram

    with pytest.warns(DeprecationWarning, match="full_ngram_transitions"):
        old = F.transitions_graph(2, 3)
    assert gtn.equal(old, full_ngram_transitions(2, 3)) and old.num_arcs() == 16
    assert F.full_ngram_transitions is full_ngram_transitions
    assert ngram.transitions_graph is not F.transitions_graph


@pytest.mark.parametrize("ngram", [0, 1, 2])
def test_best_paths_function(ngram):
    # one-hot emissions of a path of the token graph: the best path is that path, through the
    # transitions too; lengths cut it, padding with -1
    tokens = ["a", "b", "c", "ab", "ca"]  # blank = 5
    path = [3, 3, 5, 2, 2, 4, 5, 5, 0, 1, 1]
    x = torch.full((1, len(path), 6), -10.0)
    x[0, torch.arange(len(path)), torch.tensor(path)] = 10.0
    params = torch.zeros(full_ngram_transitions(ngram, 6).num_arcs()) if ngram else None
    kw = dict(tokens=tokens, graphemes_to_idx=G2I, ngram=ngram, transition_params=params, blank="optional")
    paths, scores = transducer_best_paths(x, **kw)
    assert paths.tolist() == [path] and paths.dtype == torch.int64
    assert scores.shape == (1,) and torch.isfinite(scores).all()
    paths, _ = transducer_best_paths(torch.cat([x, x]), torch.tensor([5, 11]), **kw)
    assert paths.tolist() == [path[:5] + [-1] * 6, path]
    if ngram:
        with pytest.raises(ValueError, match="transition_params must be a tensor of shape"):
            transducer_best_paths(x, **dict(kw, transition_params=None))
    with pytest.raises(ValueError, match=r"emissions must have C = .* = 6 classes"):
        transducer_best_paths(x[..., :5], **kw)


@pytest.mark.parametrize("ngram", [1, 2])
def test_infeasible_rows_with_transitions(ngram):
    # the dense unigram normaliser (ngram 1) and the graph one (ngram 2): infeasible rows add
    # nothing to any gradient, feasible rows are unchanged by their presence
    tokens, g2i = ["a", "b", "ab"], {"a": 0, "b": 1, "c": 2}
    C = 4
    x = _data(C, (6, 6, 6), T=6)
    params = 0.3 * torch.randn(
        full_ngram_transitions(ngram, C).num_arcs(), dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    kw = dict(tokens=tokens, graphemes_to_idx=g2i, ngram=ngram, blank="optional", zero_infinity=True, reduction="sum")

    def run(xs, tg):
        xs = xs.clone().requires_grad_()
        p = params.clone().requires_grad_()
        loss = transducer_loss(xs, tg, **kw, transition_params=p)
        loss.backward()
        return loss, xs.grad, p.grad

    full = run(x, [[0, 1], [2], [1, 0]])  # row 1: "c" has no token
    part = run(x[[0, 2]], [[0, 1], [1, 0]])
    torch.testing.assert_close(full[0], part[0])
    torch.testing.assert_close(full[1][[0, 2]], part[1])
    assert full[1][1].abs().sum() == 0
    torch.testing.assert_close(full[2], part[2])


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_dense_bigram_normaliser_equals_the_graph_path(reduction):
    # the research bigram's normaliser is scored as ASG's dense recursion (start row,
    # label-after-label matrix, end weights on the last frame); here with both implementations
    from lightning_gtn.kernels import dense_torch
    from lightning_gtn.losses import transducer as tdm

    letters = [chr(ord("a") + i) for i in range(8)]
    pairs = [a + b for a in letters for b in letters]
    pieces = letters + pairs + [p + c for p in pairs for c in letters][: dense_torch.DENSE_MIN_CLASSES - 72]
    g2i = {c: i for i, c in enumerate(letters)}
    crit, handle = tdm.transducer_criterion(pieces, g2i, ngram=2, blank="optional")
    assert crit.research_bigram and crit.C >= dense_torch.DENSE_MIN_CLASSES
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 9, crit.C, generator=gen, dtype=torch.float64)
    params = 0.3 * torch.randn(crit.num_arcs, generator=gen, dtype=torch.float64)
    targets = [[0, 1, 2, 3], [4, 4, 5], [7]]
    lengths = torch.tensor([9, 7, 4])

    def run():
        xx = x.clone().requires_grad_()
        pp = params.clone().requires_grad_()
        out = transducer_loss(
            xx,
            targets,
            lengths,
            tokens=pieces,
            graphemes_to_idx=g2i,
            ngram=2,
            transition_params=pp,
            blank="optional",
            reduction=reduction,
        )
        out.sum().backward() if reduction == "none" else out.backward()
        return out.detach(), xx.grad, pp.grad

    dense = {}
    for limit in (10**9, -1):  # the numba recursion, then the matrix products
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dense_torch, "NUMBA_MAX_CLASSES", limit)
            dense[limit] = run()
    crit.research_bigram = False
    try:
        graph = run()
    finally:
        crit.research_bigram = True
    for d in dense.values():
        for a, b in zip(d, graph):
            assert torch.allclose(a, b, atol=1e-9, rtol=1e-7)


def _hub_vs_graph(tokens, g2i, targets, x, lengths, blank, ngram=0, monkeypatch=None):
    """Losses and gradients with the hub kernel (impl="numba") and with the log-domain graph
    kernels (impl="numba_log")."""
    crit, _ = transducer_criterion(tokens, g2i, ngram, None, blank)
    out = []
    params = (
        None
        if ngram == 0
        else 0.2 * torch.randn(crit.num_arcs, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    )
    for impl in ("numba", "numba_log"):
        xi = x.clone().requires_grad_()
        pi = None if params is None else params.clone().requires_grad_()
        loss = transducer_loss(
            xi,
            targets,
            lengths,
            tokens=tokens,
            graphemes_to_idx=g2i,
            ngram=ngram,
            transition_params=pi,
            blank=blank,
            reduction="none",
            impl=impl,
        )
        fin = torch.isfinite(loss)
        (loss[fin] * torch.arange(1, int(fin.sum()) + 1, dtype=x.dtype)).sum().backward()
        out.append((loss.detach(), xi.grad, None if pi is None else pi.grad))
    return out


@pytest.mark.parametrize("blank", ["none", "optional", "forced"])
@pytest.mark.parametrize("ngram", [0, 1])
def test_hub_kernel_equals_graph_kernels(blank, ngram):
    # word pieces with several decompositions, an empty target, a target too long for its frames,
    # a target the tokens cannot spell, no frames, a dead frame
    letters = ["a", "b", "c", "d"]
    tokens = letters + ["ab", "bc", "abc", "cd", "da"]
    g2i = {c: i for i, c in enumerate(letters)}
    C = len(tokens) + (blank != "none")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(7, 12, C, generator=g, dtype=torch.float64)
    if ngram == 0:
        x = x.log_softmax(-1)
    x[6, 4] = -float("inf")
    targets = [[0, 1, 2, 3, 0], [], [3] * 13, [3, 3, 3], [0, 1], [2, 3, 0, 1], [1, 2]]
    lengths = [12, 6, 12, 12, 0, 10, 8]
    (a, ga, pa), (b, gb, pb) = _hub_vs_graph(tokens, g2i, targets, x, lengths, blank, ngram)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    if ngram:
        torch.testing.assert_close(pa, pb)
    assert torch.isinf(a[2]) and torch.isinf(a[6])  # too long for 12 frames (forced: 2L + 1); a dead frame


def test_hub_kernel_rows_it_cannot_vouch_for_take_the_graph_kernels(monkeypatch):
    from lightning_gtn.kernels import transducer_hubs

    tokens = ["a", "b", "ab"]
    g2i = {"a": 0, "b": 1}
    x = torch.randn(3, 9, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    targets, lengths = [[0, 1, 1], [1], [0, 1, 0, 1]], [9, 5, 9]
    direct = _hub_vs_graph(tokens, g2i, targets, x, lengths, "optional", ngram=1)[0]
    monkeypatch.setattr(transducer_hubs, "TOL", -1.0)  # no row passes the check
    fallback = _hub_vs_graph(tokens, g2i, targets, x, lengths, "optional", ngram=1)[0]
    for u, v in zip(direct, fallback):
        torch.testing.assert_close(u, v)


def test_hub_kernel_long_peaked_inputs():
    # 3000 frames of peaked scores: underflow must not drop paths (the check sends such rows to the
    # graph kernels, which scale per segment)
    letters = ["a", "b", "c"]
    g2i = {c: i for i, c in enumerate(letters)}
    x = torch.randn(2, 3000, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 30
    x = x.log_softmax(-1)
    targets = [[0, 1, 2] * 60, [1]]
    (a, ga, _), (b, gb, _) = _hub_vs_graph(letters, g2i, targets, x, [3000, 2000], "optional")
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
