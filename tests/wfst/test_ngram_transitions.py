"""N-gram transition graphs from token sequences: counts, pruning, back-off, weights, files.

The reference for acceptance and scores is an independent walker (below) that follows the
graph's arcs through the public accessors and enumerates every path reading a sequence.
"""

import itertools
import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lightning_gtn.wfst as gtn
from lightning_gtn.wfst.ngram import (
    SENTENCE_END as E,
)
from lightning_gtn.wfst.ngram import (
    SENTENCE_START as S,
)
from lightning_gtn.wfst.ngram import (
    count_ngrams,
    load_transitions,
    prune_ngrams,
    save_transitions,
    transitions_graph,
)

from .brute import arcs_of

EPS = gtn.epsilon


# -- an independent reference -----------------------------------------------------------------


class Paths:
    """The start-to-accept paths reading a sequence, summarised: how many (exactly), the
    log-sum-exp and the maximum of their weights (float64)."""

    def __init__(self, count, lse, best):
        self.count, self.lse, self.best = count, lse, best

    def __len__(self):
        return self.count


def _lse(a, b):
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


def paths_reading(g, seq):
    """Every start-to-accept path whose labels spell ``seq``, by plain recursion over
    (node, position) with memoisation (back-off makes the number of paths exponential, so
    they are counted rather than listed). Reads the graph through public accessors only."""
    arcs = arcs_of(g)
    out = {n: [] for n in range(g.num_nodes())}
    for a in arcs:
        out[a[0]].append(a)
    accept = {n for n in range(g.num_nodes()) if g.is_accept(n)}
    memo, active = {}, set()

    def visit(node, pos):
        key = (node, pos)
        if key in memo:
            return memo[key]
        assert key not in active, "an epsilon cycle"
        active.add(key)
        count, lse, best = 0, -math.inf, -math.inf
        if pos == len(seq) and node in accept:
            count, lse, best = 1, 0.0, 0.0
        for _, dst, il, _, w in out[node]:
            if il == EPS:
                sub = visit(dst, pos)
            elif pos < len(seq) and il == seq[pos]:
                sub = visit(dst, pos + 1)
            else:
                continue
            if sub[0]:
                count += sub[0]
                lse = _lse(lse, sub[1] + w)
                best = max(best, sub[2] + w)
        active.discard(key)
        memo[key] = (count, lse, best)
        return memo[key]

    total = Paths(0, -math.inf, -math.inf)
    for n in range(g.num_nodes()):
        if g.is_start(n):
            c, l, b = visit(n, 0)
            total = Paths(total.count + c, _lse(total.lse, l), max(total.best, b))
    return total


def chain(seq):
    g = gtn.Graph(False)
    g.add_node(True, len(seq) == 0)
    for i, t in enumerate(seq):
        g.add_node(False, i == len(seq) - 1)
        g.add_arc(i, i + 1, t)
    return g


def engine_score(g, seq, viterbi=False):
    inter = gtn.intersect(chain(seq), g)
    return (gtn.viterbi_score if viterbi else gtn.forward_score)(inter).item()


def random_corpus(rng, n, num_tokens, max_len=8, skew=True):
    weights = [1.0 / (k + 1) for k in range(num_tokens)] if skew else None
    return [rng.choices(range(num_tokens), weights=weights, k=rng.randint(0, max_len)) for _ in range(n)]


def state_epsilons_and_labels(g):
    by_src = {}
    for src, _dst, il, ol, _w in arcs_of(g):
        assert il == ol, "transition graphs are acceptors"
        by_src.setdefault(src, []).append(il)
    return by_src


# -- counting ---------------------------------------------------------------------------------


def test_count_ngrams_by_hand():
    c = count_ngrams([[0, 1, 1], [1]], 3)
    assert c[0] == {(0,): 1, (1,): 3, (E,): 2}
    assert c[1] == {(S, 0): 1, (0, 1): 1, (1, 1): 1, (1, E): 2, (S, 1): 1}
    assert c[2] == {(S, 0, 1): 1, (0, 1, 1): 1, (1, 1, E): 1, (S, 1, E): 1}
    c = count_ngrams([[0, 1]], 2, start=False, end=False)
    assert c[0] == {(0,): 1, (1,): 1} and c[1] == {(0, 1): 1}
    c = count_ngrams([np.array([2, 2]), (2,)], 1)
    assert c[0] == {(2,): 3, (E,): 2}


def test_prune_ngrams_thresholds():
    c = count_ngrams([[0, 1]] * 3 + [[1, 0]], 2)
    kept = prune_ngrams(c, 2)  # (0, 2, 2): unigrams all kept, bigrams seen > 2 times
    assert set(kept[0]) == {(0,), (1,), (E,)}
    assert set(kept[1]) == {(S, 0), (0, 1), (1, E)}
    kept = prune_ngrams(c, [1, 3])
    assert set(kept[0]) == {(0,), (1,), (E,)} and kept[1] == {}
    with pytest.raises(ValueError, match="non-decreasing"):
        prune_ngrams(c, [2, 1])
    with pytest.raises(ValueError, match="one threshold per order"):
        prune_ngrams(c, [1])


def test_count_ngrams_errors():
    with pytest.raises(TypeError, match="map tokens to integer ids"):
        count_ngrams(["ab"], 2)
    with pytest.raises(ValueError, match="token id -1"):
        count_ngrams([[0, -1]], 2)
    with pytest.raises(TypeError, match="must hold ints"):
        count_ngrams([[0, 1.5]], 2)
    with pytest.raises(ValueError, match=r"order must be an integer in \[1, "):
        count_ngrams([[0]], 0)
    with pytest.raises(ValueError, match=r"order must be an integer in \[1, "):
        count_ngrams([[0]], 9)
    with pytest.raises(ValueError, match="1-D"):
        count_ngrams([np.zeros((2, 2), dtype=int)], 2)


# -- acceptance -------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("prune", [0, 1, 3])
@pytest.mark.parametrize("start,end", [(True, True), (False, True), (True, False)])
def test_accepts_every_training_sequence(order, prune, start, end):
    rng = random.Random(order * 100 + prune)
    corpus = random_corpus(rng, 40, 5)
    g = transitions_graph(corpus, 5, order=order, prune=prune, start=start, end=end, init="counts")
    for seq in corpus:
        assert paths_reading(g, seq), seq
        assert math.isfinite(engine_score(g, seq))
    # ... and, with back-off, any sequence at all, unseen tokens included.
    g6 = transitions_graph(corpus, 6, order=order, prune=prune, start=start, end=end)
    for seq in ([5, 5, 0], [4, 3, 2, 1, 0], [], [5]):
        assert paths_reading(g6, seq), seq


def test_without_backoff_unseen_ngrams_are_rejected():
    corpus = [[0, 1, 2], [0, 1]]
    g = transitions_graph(corpus, 3, order=2, backoff=False)
    assert paths_reading(g, [0, 1, 2]) and paths_reading(g, [0, 1])
    assert not paths_reading(g, [1, 0])  # (<s>, 1) and (1, 0) were never seen
    assert not paths_reading(g, [0, 1, 2, 2])
    assert math.isinf(engine_score(g, [1, 0]))
    with_backoff = transitions_graph(corpus, 3, order=2, backoff=True)
    assert paths_reading(with_backoff, [1, 0])


def test_brute_force_paths_on_a_tiny_alphabet():
    """Every sequence of length <= 4 over 3 tokens: without back-off (and no pruning) there is
    exactly one path iff every n-gram of the padded sequence was seen, else none; with
    back-off at least one, and the engine's forward (Viterbi) score is the log-sum (maximum)
    over those paths."""
    corpus = [[0, 1], [0, 1, 1], [1, 2], [2], [0, 0, 1, 2]]
    for order in (1, 2, 3):
        seen = set().union(*map(set, count_ngrams(corpus, order)))
        exact = transitions_graph(corpus, 3, order=order, backoff=False)
        rng = np.random.default_rng(order)
        soft = transitions_graph(corpus, 3, order=order, prune=[0] + [1] * (order - 1))
        soft.set_weights(rng.normal(size=soft.num_arcs()).astype(np.float32))
        for n in range(5):
            for seq in itertools.product(range(3), repeat=n):
                line = (S,) + seq + (E,)
                grams = {line[e - k + 1 : e + 1] for e in range(1, len(line)) for k in range(1, min(order, e + 1) + 1)}
                expected = 1 if grams <= seen else 0
                assert len(paths_reading(exact, seq)) == expected, (order, seq)
                ws = paths_reading(soft, seq)
                assert ws, (order, seq)
                assert engine_score(soft, seq) == pytest.approx(ws.lse, abs=1e-4)
                assert engine_score(soft, seq, viterbi=True) == pytest.approx(ws.best, abs=1e-4)


def test_label_determinism_per_state():
    """Each state has at most one arc per token; its epsilon arcs are at most one back-off and
    one sentence end. Back-off is what makes two paths read the same sequence."""
    rng = random.Random(7)
    corpus = random_corpus(rng, 60, 6)
    for order in (1, 2, 3):
        for backoff in (False, True):
            g = transitions_graph(corpus, 6, order=order, prune=1, backoff=backoff)
            for src, labels in state_epsilons_and_labels(g).items():
                tokens = [x for x in labels if x != EPS]
                assert len(tokens) == len(set(tokens)), (order, src)
                assert labels.count(EPS) <= (2 if backoff else 1)
    # Back-off: the seen bigram (0, 1) is read from (0,) directly and through ().
    g = transitions_graph([[0, 1]], 2, order=2)
    assert len(paths_reading(g, [0, 1])) > 1
    assert len(paths_reading(transitions_graph([[0, 1]], 2, order=2, backoff=False), [0, 1])) == 1


# -- size and pruning -------------------------------------------------------------------------


def test_arc_count_shrinks_as_prune_grows():
    rng = random.Random(3)
    corpus = random_corpus(rng, 300, 12, max_len=12)
    for order in (2, 3):
        sizes = [transitions_graph(corpus, 12, order=order, prune=p).num_arcs() for p in (0, 1, 2, 4, 8, 1000)]
        assert all(a >= b for a, b in zip(sizes, sizes[1:])), sizes
        assert sizes[0] > sizes[2] > sizes[-1], sizes
        # Everything pruned: unigram state (12 tokens + end), start state and 12 token states
        # backing off to it.
        assert sizes[-1] == 12 + 1 + 1 + 12


def test_arc_count_formula_and_small_for_many_tokens():
    rng = random.Random(4)
    num_tokens = 2000
    corpus = random_corpus(rng, 200, num_tokens, max_len=10)
    for order, prune in ((2, 0), (3, 1)):
        g = transitions_graph(corpus, num_tokens, order=order, prune=prune)
        kept = prune_ngrams(count_ngrams(corpus, order), prune)
        kept_higher = sum(len(k) for k in kept[1:])
        backoffs = g.num_nodes() - 2  # every state but () and the final state
        assert g.num_arcs() == num_tokens + 1 + kept_higher + backoffs
        assert g.num_arcs() < 3 * num_tokens + 5 * sum(len(s) + 1 for s in corpus)


def test_prune_threshold_is_inclusive():
    corpus = [[0, 1]] * 3 + [[1, 2]] * 2
    by_src = lambda g: state_epsilons_and_labels(g)  # noqa: E731
    # States: () 0, (<s>,) 1, (0,) 2, (1,) 3, (2,) 4. (0, 1) was seen 3 times, (1, 2) twice.
    g = transitions_graph(corpus, 3, order=2, prune=2, backoff=False)
    assert by_src(g)[2] == [1]
    assert by_src(g)[3] == [EPS]  # (1, </s>) was seen 3 times: only the end arc is left
    g = transitions_graph(corpus, 3, order=2, prune=1, backoff=False)
    assert sorted(by_src(g)[3]) == [EPS, 2]
    g = transitions_graph(corpus, 3, order=2, prune=3, backoff=False)
    assert 2 not in by_src(g) and 3 not in by_src(g)  # all bigrams (<= 3 times) dropped


# -- weights ----------------------------------------------------------------------------------


def test_counts_give_maximum_likelihood_bigram_log_probs():
    corpus = [[0, 1], [0, 1, 1], [1]]
    # By hand: c(<s> 0) = 2, c(<s> 1) = 1, c(0 1) = 2, c(1 1) = 1, c(1 </s>) = 3;
    # contexts: <s> 3, 0 2, 1 4.
    expected = {
        (0, 1, 1): math.log(2 / 3) + math.log(2 / 2) + math.log(1 / 4) + math.log(3 / 4),
        (1,): math.log(1 / 3) + math.log(3 / 4),
        (0, 1): math.log(2 / 3) + math.log(2 / 2) + math.log(3 / 4),
        (1, 1, 1): math.log(1 / 3) + 2 * math.log(1 / 4) + math.log(3 / 4),
    }
    exact = transitions_graph(corpus, 2, order=2, backoff=False, init="counts")
    with_backoff = transitions_graph(corpus, 2, order=2, init="counts")
    for seq, lp in expected.items():
        assert engine_score(exact, list(seq)) == pytest.approx(lp, abs=1e-5)
        # With back-off the best path is still the maximum-likelihood one; the sum of all
        # paths adds the (lighter) back-off paths on top.
        assert engine_score(with_backoff, list(seq), viterbi=True) == pytest.approx(lp, abs=1e-5)
        assert engine_score(with_backoff, list(seq)) > lp


def test_counts_give_maximum_likelihood_trigram_and_unigram_log_probs():
    corpus = [[0, 1], [0, 1, 1]]
    g = transitions_graph(corpus, 2, order=3, backoff=False, init="counts")
    # p(0|<s>) = 2/2, p(1|<s> 0) = 2/2, p(1|0 1) = 1/2, p(</s>|1 1) = 1/1
    assert engine_score(g, [0, 1, 1]) == pytest.approx(math.log(1 / 2), abs=1e-5)
    # p(</s>|0 1) = 1/2
    assert engine_score(g, [0, 1]) == pytest.approx(math.log(1 / 2), abs=1e-5)
    u = transitions_graph([[0, 1], [1]], 3, order=1, init="counts")
    # unigrams 0: 1, 1: 2, </s>: 2 of 5; the unseen token 2 gets half a count
    assert engine_score(u, [1, 0]) == pytest.approx(math.log(2 / 5) + math.log(1 / 5) + math.log(2 / 5), abs=1e-5)
    assert engine_score(u, [2]) == pytest.approx(math.log(0.5 / 5) + math.log(2 / 5), abs=1e-5)


def test_backoff_weight_carries_the_pruned_mass():
    corpus = [[0, 1]] * 3 + [[0, 2]]
    g = transitions_graph(corpus, 3, order=2, prune=1, init="counts")
    # State (0,) was followed 4 times: (0, 1) 3 times (kept), (0, 2) once (pruned).
    arcs = arcs_of(g)
    from_0 = [a for a in arcs if a[0] == 2]  # (), (<s>,), (0,), ...
    assert sorted((a[2], round(a[4], 5)) for a in from_0) == [
        (EPS, round(math.log(1 / 4), 5)),
        (1, round(math.log(3 / 4), 5)),
    ]


def test_default_weights_are_zero_and_calc_grad():
    assert gtn.ngram.transitions_graph is transitions_graph  # exported as lightning_gtn.wfst.ngram
    g = transitions_graph([[0, 1]], 2)
    assert set(g.weights_to_list()) == {0.0}
    assert g.calc_grad
    assert not transitions_graph([[0, 1]], 2, calc_grad=False).calc_grad


# -- blank and self-loops ---------------------------------------------------------------------


def test_optional_blank_between_tokens():
    corpus = [[0, 1, 1], [1, 0]]
    g = transitions_graph(corpus, 3, order=2, backoff=False, blank="optional")
    b = 2
    for seq in ([0, 1, 1], [0, b, 1, 1], [b, 0, 1, b, 1, b], [1, b, 0], [b, 1, 0, b], [b]):
        assert paths_reading(g, seq), seq
    assert not paths_reading(g, [0, 0])  # (0, 0) was never seen
    assert not paths_reading(g, [0, b, b, 1])  # one blank between tokens, as in the research code
    # Frames repeat the blank while it lasts: self-loops add the repeats.
    g = transitions_graph(corpus, 3, order=2, backoff=False, blank="optional", self_loops=True)
    assert paths_reading(g, [b, b, 0, 0, b, b, 1, 1])
    with pytest.raises(ValueError, match="token id 2"):
        transitions_graph([[0, 2]], 3, blank="optional")


def _blank_grams_by_spelling(kept, blank_id, mode):
    """The research code's construction, literally: spell every kept n-gram with blanks,
    keep every piece (up to the order) that contains a blank."""
    order = len(kept)
    added = [set() for _ in range(order)]
    added[0].add((blank_id,))
    for grams in kept:
        for g in grams:
            n = len(g)
            masks = itertools.product((0, 1), repeat=n + 1) if mode == "optional" else [(1,) * (n + 1)]
            for mask in masks:
                spelled = []
                for j, tok in enumerate(g):
                    if mask[j] and tok != S:
                        spelled.append(blank_id)
                    spelled.append(tok)
                if mask[n] and g[-1] != E:
                    spelled.append(blank_id)
                for k in range(1, order + 1):
                    for e in range(k, len(spelled) + 1):
                        if blank_id in spelled[e - k : e]:
                            added[k - 1].add(tuple(spelled[e - k : e]))
    return added


@pytest.mark.parametrize("mode", ["optional", "forced"])
@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("prune", [0, 1, [0, 1, 2, 2]])
def test_blank_grams_match_the_research_construction(mode, order, prune):
    from lightning_gtn.wfst.ngram import _blank_grams

    if isinstance(prune, list):
        prune = prune[:order]
    corpus = random_corpus(random.Random(order), 40, 4, max_len=6)
    kept = prune_ngrams(count_ngrams(corpus, order), prune)
    assert _blank_grams(kept, 9, mode, True) == _blank_grams_by_spelling(kept, 9, mode)


def test_forced_blank_between_tokens():
    corpus = [[0, 1], [1, 0]]
    g = transitions_graph(corpus, 3, order=2, backoff=False, blank="forced")
    b = 2
    assert paths_reading(g, [b, 0, b, 1, b]) and paths_reading(g, [b, 1, b, 0, b])
    assert not paths_reading(g, [0, 1])  # tokens must be separated by a blank
    assert paths_reading(transitions_graph(corpus, 3, order=2, blank="forced"), [0, 1])


def test_self_loops_accept_frame_repeats():
    corpus = [[0, 1], [1, 0]]
    frames = [0, 0, 0, 1, 1]
    assert not paths_reading(transitions_graph(corpus, 2, order=2, backoff=False), frames)
    g = transitions_graph(corpus, 2, order=2, backoff=False, self_loops=True)
    assert paths_reading(g, frames)
    g3 = transitions_graph(corpus, 2, order=3, backoff=False, self_loops=True)
    assert paths_reading(g3, [0, 0, 1]) and paths_reading(g3, [0, 1, 1])


# -- argument errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_tokens=0), ValueError, "num_tokens"),
        (dict(num_tokens=2.0), TypeError, "num_tokens must be an int"),
        (dict(num_tokens=1 << 30), ValueError, "num_tokens"),
        (dict(order=0), ValueError, "order"),
        (dict(order=6), ValueError, "order"),
        (dict(prune=-1), ValueError, "prune"),
        (dict(prune="1"), TypeError, "prune"),
        (dict(prune=[0, 2, 1]), ValueError, "prune must have one threshold per order"),
        (dict(blank="yes"), ValueError, "blank must be one of"),
        (dict(init="ones"), ValueError, "init must be one of"),
        (dict(backoff=1), TypeError, "backoff must be a bool"),
        (dict(num_tokens=1, blank="optional"), ValueError, "num_tokens must be >= 2"),
        (dict(sequences=[[0, 3]]), ValueError, r"sequences\[0\] has token id 3, expected ids in \[0, 3\)"),
        (dict(sequences="abc"), TypeError, "sequences must be"),
        (dict(sequences=[["a"]]), TypeError, "must hold ints"),
    ],
)
def test_argument_errors(kwargs, error, message):
    args = dict(sequences=[[0, 1, 2]], num_tokens=3)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        transitions_graph(**args)


# -- files ------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    corpus = random_corpus(random.Random(5), 50, 4)
    g = transitions_graph(corpus, 5, order=3, prune=1, blank="optional", init="counts")
    path = tmp_path / "transitions.bin"
    tokens = ["a", "b", " ", "ab", "<blank>"]
    save_transitions(path, g, 5, tokens=tokens, info={"order": 3, "prune": 1, "blank": "optional"})
    h, meta = load_transitions(path)
    assert gtn.equal(g, h)
    assert h.weights_to_list() == g.weights_to_list()
    assert meta["tokens"] == tokens and meta["num_tokens"] == 5
    assert meta["info"] == {"order": 3, "prune": 1, "blank": "optional"}
    assert json.loads((tmp_path / "transitions.bin.json").read_text())["num_arcs"] == g.num_arcs()


def test_save_checks_labels(tmp_path):
    g = transitions_graph([[0, 1]], 3)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        save_transitions(tmp_path / "t.bin", g, 2)
    with pytest.raises(ValueError, match="tokens must be 3 strings"):
        save_transitions(tmp_path / "t.bin", g, 3, tokens=["a"])


def _saved(tmp_path):
    g = transitions_graph([[0, 1, 1], [1, 0]], 2, order=2)
    path = tmp_path / "t.bin"
    save_transitions(path, g, 2)
    return path


def test_truncated_and_garbage_graph_files_give_errors(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    for bad in (data[:-3], data[:10], b"", data + b"\0\0\0\0", b"\xff" * len(data)):
        path.write_bytes(bad)
        with pytest.raises(ValueError):
            load_transitions(path)
    rng = np.random.default_rng(0)
    for _ in range(30):
        garbage = bytearray(data)
        for i in rng.integers(0, len(garbage), size=4):
            garbage[i] = int(rng.integers(0, 256))
        path.write_bytes(bytes(garbage))
        try:
            g, meta = load_transitions(path)
        except ValueError:
            continue
        # What loads is consistent with its sidecar: labels within the token range.
        labels = g.labels_to_list()
        assert all(-1 <= x < 2 for x in labels)


@pytest.mark.parametrize(
    "sidecar, message",
    [
        ("", "invalid JSON"),
        ("{", "invalid JSON"),
        ("[" * 100000 + "]" * 100000, "invalid JSON|not a transition sidecar"),
        ('{"format": "other"}', "not a transition sidecar"),
        ('{"format": "lightning_gtn.transitions", "version": 9}', "unsupported version"),
        ('{"format": "lightning_gtn.transitions", "version": 1, "num_tokens": "2"}', "num_tokens must be an int"),
        (
            '{"format": "lightning_gtn.transitions", "version": 1, "num_tokens": 1, "num_nodes": 5, "num_arcs": 13}',
            r"outside \[0, 1\)",
        ),
        (
            '{"format": "lightning_gtn.transitions", "version": 1, "num_tokens": 2, "num_nodes": 5, "num_arcs": 12}',
            "its sidecar says",
        ),
        (
            '{"format": "lightning_gtn.transitions", "version": 1, "num_tokens": 2, "num_nodes": 5, "num_arcs": 13,'
            ' "tokens": ["a"]}',
            "tokens must be null or a list of 2 strings",
        ),
    ],
)
def test_bad_sidecars_give_errors(tmp_path, sidecar, message):
    path = _saved(tmp_path)
    meta = json.loads((tmp_path / "t.bin.json").read_text())
    assert (meta["num_nodes"], meta["num_arcs"]) == (5, 13)  # what the cases above assume
    (tmp_path / "t.bin.json").write_text(sidecar)
    with pytest.raises(ValueError, match=message):
        load_transitions(path)


def test_missing_and_oversized_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_transitions(tmp_path / "nothing.bin")
    path = _saved(tmp_path)
    (tmp_path / "t.bin.json").unlink()
    with pytest.raises(FileNotFoundError):
        load_transitions(path)
    path = _saved(tmp_path)
    with pytest.raises(ValueError, match="larger than max_bytes=64"):
        load_transitions(path, max_bytes=64)


# -- as a transition model ----------------------------------------------------------------------


@pytest.mark.parametrize("order,blank", [(1, "none"), (2, "optional"), (3, "forced")])
def test_scores_emissions_and_gives_arc_gradients(order, blank):
    """The research pattern: ``forward_score(intersect(emissions, transitions))`` is the
    normaliser of the transducer loss. Its gradient on the transition arcs is each arc's
    expected count, so the token arcs' gradients add up to the number of frames."""
    T, C = 6, 4
    corpus = random_corpus(random.Random(order), 30, C - 1)
    g = transitions_graph(corpus, C, order=order, prune=1, blank=blank, init="counts")
    g.arc_sort()
    rng = np.random.default_rng(0)
    em = gtn.linear_graph(T, C, gtn.CPU, True)
    em.set_weights(rng.normal(size=T * C).astype(np.float32))
    score = gtn.forward_score(gtn.intersect(em, g))
    assert math.isfinite(score.item())
    gtn.backward(score)
    grads = np.asarray(g.grad().weights_to_list())
    labels = np.asarray(g.labels_to_list())
    assert grads[labels != EPS].sum() == pytest.approx(T, rel=1e-4)
    assert (grads >= -1e-6).all()
    assert np.asarray(em.grad().weights_to_list()).reshape(T, C).sum(axis=1) == pytest.approx(np.ones(T), rel=1e-4)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), max_size=5), max_size=6),
    st.integers(1, 3),
    st.integers(0, 2),
    st.sampled_from(["none", "optional", "forced"]),
    st.booleans(),
    st.lists(st.integers(0, 3), max_size=4),
)
def test_property_random_corpora(corpus, order, prune, blank, self_loops, probe):
    """Random small corpora: training sequences are accepted (with their blank spellings
    when there is a blank), any sequence is accepted with back-off, and the engine's forward
    score is the log-sum of the reference paths."""
    C = 4
    probe = [t for t in probe if t < C]
    g = transitions_graph(corpus, C, order=order, prune=prune, blank=blank, self_loops=self_loops, init="counts")
    for seq in corpus:
        if blank == "forced":
            spelled = [C - 1] + [x for t in seq for x in (t, C - 1)]
        else:
            spelled = list(seq)
        assert paths_reading(g, spelled), (seq, spelled)
    ws = paths_reading(g, probe)
    assert ws
    assert engine_score(g, probe) == pytest.approx(ws.lse, abs=1e-4)
    # Without pruning and back-off, the training sequences are still accepted, spelled with
    # blanks where the blank mode allows them (here: after every other token, or all).
    exact = transitions_graph(corpus, C, order=order, backoff=False, blank=blank, self_loops=self_loops)
    for seq in corpus:
        if blank == "none":
            spelled = list(seq)
        elif blank == "optional":
            spelled = [x for i, t in enumerate(seq) for x in ((t, C - 1) if i % 2 else (t,))]
        else:
            spelled = [C - 1] + [x for t in seq for x in (t, C - 1)]
        assert paths_reading(exact, spelled), (seq, spelled)


def test_docstring_examples():
    import doctest

    import lightning_gtn.wfst.ngram as module

    assert doctest.testmod(module).failed == 0
