"""Token n-gram ``P`` graphs and LF-MMI denominators, checked by brute force.

References: :meth:`NGramLM.sentence_score` (the back-off model's own scoring) for ``P``; for the
denominators, every class sequence of ``T`` frames and every token sequence that it spells
(:func:`tests.core.test_topologies.alignments`, written from the topology definitions), summed
in probability with ``P``'s sentence scores; the engine's ``forward_score`` on random emissions.
"""

from __future__ import annotations

import functools
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.core.topologies import MMI_TOPOLOGIES, num_classes, numerator_graph
from lightning_gtn.lm.denominator import (
    MAX_DATA_ARCS,
    MAX_P_ARCS,
    denominator_graph,
    graph_from_data,
    graph_to_data,
    token_lm,
    token_lm_graph,
    token_lm_tables,
)
from tests.core.test_topologies import alignments, readings

TRAIN = [[1, 2, 3], [2, 3], [1, 1, 2], [3, 2, 1, 1], [2, 2], [1], [3, 1, 2, 3]]


def _path_score(g, seq):
    """The weight of the one path of ``g`` reading ``seq`` (a deterministic acceptor), or None."""
    a = g.arrays()
    node = int(a.start[0])
    total = 0.0
    for w in seq:
        hit = np.flatnonzero((a.src == node) & (a.ilabel == w))
        if len(hit) != 1:
            return None
        total += float(a.weights[hit[0]])
        node = int(a.dst[hit[0]])
    return total if node in set(a.accept.tolist()) else None


@pytest.mark.parametrize(
    "order,method,prune", [(1, "kneser_ney", None), (2, "kneser_ney", None), (3, "witten_bell", None), (3, "kn", 1)]
)
def test_lm_graph_scores_are_the_models_sentence_scores(order, method, prune):
    N = 3
    lm = token_lm(TRAIN, N, order=order, method=method, prune=prune)
    g = token_lm_graph(TRAIN, N, order=order, method=method, prune=prune)
    a = g.arrays()
    # deterministic and complete: one arc per (node, token), every node accepts, no epsilon
    assert sorted(zip(a.src.tolist(), a.ilabel.tolist())) == [
        (s, k) for s in range(g.num_nodes()) for k in range(1, N + 1)
    ]
    assert g.num_accept() == g.num_nodes() and list(a.start) == [0]
    for L in range(5):
        for seq in itertools.product(range(1, N + 1), repeat=L):
            want = lm.sentence_score([str(t) for t in seq], eos=False)
            assert _path_score(g, seq) == pytest.approx(want, abs=1e-5), seq


def test_lm_graph_with_eos_scores_whole_sentences():
    N = 3
    lm = token_lm(TRAIN, N, order=3)
    g = token_lm_graph(TRAIN, N, order=3, eos=True)
    assert g.accept() == [g.num_nodes() - 1] and g.num_arcs() == 2 * token_lm_graph(TRAIN, N, order=3).num_arcs()
    for L in (1, 2, 3):
        for seq, s in _class_sequence_scores(g, L, N + 1, first=1).items():
            assert s == pytest.approx(lm.sentence_score([str(t) for t in seq], eos=True), abs=1e-4), seq


def test_lm_graph_folds_backoff_exactly():
    """A bigram seen in training keeps its explicit probability; an unseen one gets
    ``bow(h) P(w)``: the folded arcs are the back-off model's, not a sum of both paths."""
    lm = token_lm(TRAIN, 3, order=2)
    g = token_lm_graph(TRAIN, 3, order=2)
    bigrams = lm.ngrams(2)
    unigrams = lm.ngrams(1)
    # after 3: "3 2" was seen in TRAIN, "3 3" never
    seen = bigrams[("3", "2")][0]
    assert ("3", "3") not in bigrams
    unseen = unigrams[("3",)][1] + unigrams[("3",)][0]  # ln bow(3) + ln P(3)
    s3 = _path_score(g, (3,))
    assert _path_score(g, (3, 2)) - s3 == pytest.approx(seen, abs=1e-6)
    assert _path_score(g, (3, 3)) - s3 == pytest.approx(unseen, abs=1e-6)


def test_prune_removes_histories():
    N = 3
    full = token_lm_graph(TRAIN, N, order=3)
    pruned = token_lm_graph(TRAIN, N, order=3, prune=100)  # every n-gram of order >= 2 dropped
    assert pruned.num_nodes() == N + 1 < full.num_nodes()
    assert token_lm_graph(TRAIN, N, order=3, prune=0).num_arcs() == full.num_arcs()
    # dropping the trigrams only keeps every bigram history (the states) but moves probability
    # to the back-off
    tri = token_lm_graph(TRAIN, N, order=3, prune=[0, 100])
    assert tri.num_nodes() == full.num_nodes()
    assert not np.allclose(tri.weights_to_numpy(), full.weights_to_numpy())


def _class_sequence_scores(den, T, C, first=0):
    """``{x: ln sum over the paths of den reading x}`` for every sequence ``x`` of ``T`` labels
    in ``[first, C)``."""
    a = den.arrays()
    out = {}
    for x in itertools.product(range(first, C), repeat=T):
        alpha = np.full(den.num_nodes(), -np.inf)
        alpha[a.start] = 0.0
        for c in x:
            m = a.ilabel == c
            new = np.full(den.num_nodes(), -np.inf)
            np.logaddexp.at(new, a.dst[m], alpha[a.src[m]] + a.weights[m].astype(np.float64))
            alpha = new
        out[x] = np.logaddexp.reduce(alpha[a.accept]) if len(a.accept) else -np.inf
    return out


def _brute_force(lm, N, T, topology, eos=False):
    """``{x: ln sum over (y, path) spelling x of P(y)}`` from the topology definitions."""
    out: dict = {}
    for (x, y), count in readings(N, T, topology).items():
        s = math.log(count) + lm.sentence_score([str(t) for t in y], eos=eos)
        out[x] = np.logaddexp(out.get(x, -np.inf), s)
    return out


@pytest.mark.parametrize("topology,eos", [(t, False) for t in MMI_TOPOLOGIES] + [("ctc", True), ("hmm1", True)])
def test_denominator_is_topology_composed_with_p(topology, eos):
    N = 2
    train = [[1, 2], [2, 1, 1], [1, 1], [2]]
    lm = token_lm(train, N, order=2)
    den = denominator_graph(train, N, order=2, topology=topology, eos=eos)
    C = num_classes(N, topology)
    labels = den.labels_to_numpy()
    assert labels.min() >= 0 and labels.max() < C
    assert np.array_equal(labels, den.labels_to_numpy(False))  # an acceptor
    for T in (1, 2, 4):
        got = _class_sequence_scores(den, T, C)
        want = _brute_force(lm, N, T, topology, eos)
        for x, s in got.items():
            assert s == pytest.approx(want.get(x, -np.inf), abs=1e-4), (topology, x)
    # the engine's forward score over random emissions: the same sum, weighted by emissions
    rng = np.random.default_rng(1)
    T = 4
    e = rng.standard_normal((T, C))
    em = gtn.linear_graph(T, C)
    em.set_weights(e.astype(np.float32).ravel())
    brute = _brute_force(lm, N, T, topology, eos)
    ref = np.logaddexp.reduce([s + e[np.arange(T), list(x)].sum() for x, s in brute.items()])
    assert gtn.forward_score(gtn.intersect(den, em)).item() == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize("topology,eos", [(t, False) for t in MMI_TOPOLOGIES] + [("ctc", True)])
def test_numerator_with_denominator_carries_p(topology, eos):
    N = 2
    lm = token_lm(TRAIN[:4], N + 1, order=2)
    den = denominator_graph(TRAIN[:4], N + 1, order=2, topology=topology, eos=eos)
    C = num_classes(N + 1, topology)
    T = 4
    rng = np.random.default_rng(2)
    e = rng.standard_normal((T, C))
    em = gtn.linear_graph(T, C)
    em.set_weights(e.astype(np.float32).ravel())
    dscore = _brute_force(lm, N + 1, T, topology, eos)
    for y in ([1, 2], [1, 1], [3]):
        num = numerator_graph(y, N + 1, topology, denominator=den)
        xs = set(alignments(y, T, topology))  # each class sequence once, weighted by the den
        ref = np.logaddexp.reduce([dscore[x] + e[np.arange(T), list(x)].sum() for x in xs])
        assert gtn.forward_score(gtn.intersect(num, em)).item() == pytest.approx(ref, abs=1e-4), y
        if topology in ("ctc", "hmm2"):
            # one reading per class sequence: every alignment weighs exactly ln P(y)
            zero = gtn.linear_graph(T, C)
            zero.set_weights(np.zeros(T * C, dtype=np.float32))
            want = math.log(len(xs)) + lm.sentence_score([str(t) for t in y], eos=eos)
            assert gtn.forward_score(gtn.intersect(num, zero)).item() == pytest.approx(want, abs=1e-4)


def test_denominator_sizes_bigram():
    """A bigram over N tokens has N + 1 states (``<s>`` and each token) and N arcs each; CTC
    doubles the states (blank or token last) and adds the blank and self-loops."""
    rng = np.random.default_rng(3)
    N = 7
    train = [list(rng.integers(1, N + 1, size=6)) for _ in range(30)]
    assert token_lm_graph(train, N).num_arcs() == (N + 1) * N
    ctc = denominator_graph(train, N, topology="ctc")
    assert (ctc.num_nodes(), ctc.num_arcs()) == (2 * N + 1, (N + 1) * (2 * N + 1))
    hmm1 = denominator_graph(train, N, topology="hmm1")
    assert (hmm1.num_nodes(), hmm1.num_arcs()) == (N + 1, N + N * N + N)


def test_bad_arguments():
    with pytest.raises(ValueError, match="outside"):
        token_lm_graph([[1, 4]], 3)
    with pytest.raises(ValueError, match="outside"):
        denominator_graph([[0, 1]], 3)
    with pytest.raises(ValueError, match="integer"):
        token_lm_graph(["ab"], 3)
    with pytest.raises(ValueError, match="integer"):
        token_lm_graph([[1.5]], 3)
    with pytest.raises(ValueError, match="order"):
        token_lm_graph(TRAIN, 3, order=5)
    with pytest.raises(ValueError, match="order"):
        token_lm_graph(TRAIN, 3, order=0)
    with pytest.raises(ValueError, match="prune"):
        token_lm_graph(TRAIN, 3, order=3, prune=[1])
    with pytest.raises(ValueError, match="prune"):
        token_lm_graph(TRAIN, 3, prune=-1)
    with pytest.raises(ValueError, match="method"):
        token_lm_graph(TRAIN, 3, method="good_turing")
    with pytest.raises(ValueError, match="topology"):
        denominator_graph(TRAIN, 3, topology="rnnt")
    with pytest.raises(ValueError, match="num_tokens"):
        denominator_graph(TRAIN, 0)
    with pytest.raises(ValueError, match="prune more"):  # refused before anything is allocated
        token_lm_tables(token_lm(TRAIN, 3), 3 * MAX_P_ARCS)


@functools.lru_cache(maxsize=1)
def _den():
    return denominator_graph(TRAIN, 3, topology="ctc")


@functools.lru_cache(maxsize=1)
def _data_json() -> str:
    return json.dumps(graph_to_data(_den()))


def _same(g, ref):
    """Same nodes, arcs and labels (in order), weights up to text rounding."""
    a, b = g.arrays(), ref.arrays()
    assert a.num_nodes == b.num_nodes and sorted(a.accept) == sorted(b.accept) and list(a.start) == list(b.start)
    for f in ("src", "dst", "ilabel", "olabel"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-5, atol=1e-6)


def test_data_round_trip(tmp_path):
    den = _den()
    data = graph_to_data(den, info={"topology": "ctc", "order": 2})
    back = graph_from_data(json.loads(json.dumps(data)))
    assert gtn.equal(back, den)
    assert back.start() == den.start() and back.accept() == den.accept()
    assert data["num_classes"] == 4 and data["info"] == {"topology": "ctc", "order": 2}
    assert all(isinstance(v, (int, str, dict)) for v in data.values())
    assert len(data["arcs"].splitlines()) == den.num_arcs()
    from omegaconf import OmegaConf

    assert gtn.equal(graph_from_data(OmegaConf.create(data)), den)
    # save / load, GTN text, OpenFST text and DOT of a denominator
    gtn.save(tmp_path / "d.bin", den)
    assert gtn.equal(gtn.load(tmp_path / "d.bin"), den)
    gtn.savetxt(tmp_path / "d.txt", den)  # weights with 6 significant digits
    _same(gtn.loadtxt(tmp_path / "d.txt"), den)
    _same(gtn.read_fst_text(gtn.write_fst_text(den, acceptor=True), acceptor=True)[0], den)
    gtn.write_dot(den, tmp_path / "d.dot")
    assert (tmp_path / "d.dot").read_text().count("->") == den.num_arcs()


def test_data_refuses_what_is_not_a_denominator():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, gtn.epsilon)
    with pytest.raises(ValueError, match="epsilon"):
        graph_to_data(g)
    g = gtn.Graph()
    g.add_node(True, True)
    g.add_arc(0, 0, 1, 2)
    with pytest.raises(ValueError, match="acceptor"):
        graph_to_data(g)
    with pytest.raises(ValueError, match="info"):
        graph_to_data(_den(), info={"x": [1, 2]})


_BAD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.text(alphabet="0123456789 -.e\n", max_size=30),
    st.lists(st.one_of(st.integers(-5, 2**40), st.floats(), st.booleans(), st.text(max_size=2)), max_size=30),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


def _accepted_is_sane(g):
    """A graph that came through: a well-formed epsilon-free acceptor with finite weights."""
    a = g.arrays()
    assert len(a.src) <= MAX_DATA_ARCS
    assert len(a.src) == 0 or (a.src.max() < a.num_nodes and a.dst.max() < a.num_nodes and a.ilabel.min() >= 0)
    assert np.all(np.isfinite(a.weights))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(json.loads(_data_json())) + ["extra"]), value=_BAD_VALUES)
def test_hostile_data_fields_give_value_error(key, value):
    data = json.loads(_data_json())
    data[key] = value
    try:
        g = graph_from_data(data)
    except ValueError:
        return
    _accepted_is_sane(g)


_BAD_TOKENS = st.one_of(
    st.integers(-(2**66), 2**66).map(str),
    st.floats().map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "True", "", " ", "\n", "0x1f", "1_0", "١", "+1", "-0"]),
    st.text(max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    key=st.sampled_from(["start", "accept", "arcs"]),
    index=st.integers(0, 10**6),
    token=_BAD_TOKENS,
    mode=st.sampled_from(["replace", "insert", "drop"]),
)
def test_hostile_data_entries_give_value_error(key, index, token, mode):
    """One token of a start/accept/arcs string replaced, inserted or dropped."""
    data = json.loads(_data_json())
    toks = data[key].split(" ") if key != "arcs" else data[key].replace("\n", " \n ").split(" ")
    j = index % (len(toks) + 1)
    if mode == "replace" and toks:
        toks[j % len(toks)] = token
    elif mode == "insert":
        toks.insert(j, token)
    elif toks:
        toks.pop(j % len(toks))
    text = " ".join(toks)
    data[key] = text.replace(" \n ", "\n") if key == "arcs" else text
    try:
        g = graph_from_data(data)
    except ValueError:
        return
    _accepted_is_sane(g)


def test_hostile_data_sizes_refused_before_allocating():
    data = json.loads(_data_json())
    for key, value in (("num_nodes", 2**40), ("num_classes", 2**40), ("version", 2), ("format", "pickle")):
        with pytest.raises(ValueError):
            graph_from_data(dict(data, **{key: value}))

    class Huge(str):
        def __len__(self):
            return 2**62

    for key in ("arcs", "start", "accept"):
        with pytest.raises(ValueError, match="longer"):
            graph_from_data(dict(data, **{key: Huge("0")}))
    with pytest.raises(ValueError, match="label"):
        graph_from_data(dict(data, num_classes=3))  # the blank..c labels need 4
    with pytest.raises(ValueError, match="line 1"):
        graph_from_data(dict(data, arcs="0 1 2 nan"))
    with pytest.raises(ValueError, match="more than once"):
        graph_from_data(dict(data, start="0 0"))
    for bad in (None, [], "data", 3):
        with pytest.raises(ValueError):
            graph_from_data(bad)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(start=""), "start names no node"),
        (dict(accept=""), "accept names no node"),
        ("weight", r"has weight 3e\+38, beyond \+-MAX_DATA_WEIGHT=10000 \(log Z would overflow\)"),
        ("unreachable", "no accept node can be reached from a start node"),
    ],
)
def test_data_of_a_denominator_without_a_finite_path_sum_is_refused(change, match):
    """accept "", start "" or a weight of 3e38 passed, and zero_infinity then reported val/loss 0.0."""
    data = json.loads(_data_json())
    if change == "weight":
        lines = data["arcs"].split("\n")
        s, d, lab, _ = lines[3].split()
        lines[3] = f"{s} {d} {lab} 3e38"
        data["arcs"] = "\n".join(lines)
    elif change == "unreachable":  # the only accept node: one no arc enters
        n = data["num_nodes"] + 1
        data.update(num_nodes=n, accept=str(n - 1))
    else:
        data.update(change)
    with pytest.raises(ValueError, match=match):
        graph_from_data(data)
