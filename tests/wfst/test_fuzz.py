"""Fuzzing the engine with malformed input: it may raise, never crash.

The Hypothesis loop runs in a child process (this file run as a script), so a segmentation
fault or an abort fails the test instead of killing pytest. The child exits 0 only when
every input either worked or raised one of the expected Python exceptions.
"""

import io
import math
import os
import pickle
import struct

from tests._child import run_as_child

EXPECTED = (ValueError, TypeError, IndexError, RuntimeError, KeyError)
EXAMPLES = int(os.environ.get("LGTN_FUZZ_EXAMPLES", "100"))


def test_engine_survives_malformed_input():
    run_as_child(__file__)


# ---------------------------------------------------------------------------------------------
# The child process
# ---------------------------------------------------------------------------------------------


def _attempt(fn, *args):
    """``fn(*args)``, or None when it raised an expected exception."""
    try:
        return fn(*args)
    except EXPECTED:
        return None


def _valid_graphs(gtn):
    a = gtn.Graph()
    a.add_node(True)
    a.add_node()
    a.add_node(False, True)
    a.add_arc(0, 1, 0, 1, 0.5)
    a.add_arc(1, 2, 1, gtn.epsilon, -0.25)
    a.add_arc(0, 2, gtn.epsilon, 2, 1.0)
    b = gtn.linear_graph(2, 3)
    b.set_weights([0.1, -0.2, 0.3, 0.0, 1.0, -1.0])
    c = gtn.scalar_graph(2.0)
    return [a, b, c]


def exercise(gtn, g, others):
    """Every public operation on ``g`` (alone and with ``others``); expected errors are fine."""
    unary = [
        gtn.negate,
        gtn.clone,
        gtn.project_input,
        gtn.project_output,
        gtn.closure,
        gtn.forward_score,
        gtn.viterbi_score,
        gtn.viterbi_path,
        gtn.remove,
        lambda x: gtn.remove(x, 0, 1),
        lambda x: gtn.concat([x]),
        lambda x: gtn.union([x]),
        lambda x: gtn.sample(x, 5),
        gtn.rand_equivalent if hasattr(gtn, "rand_equivalent") else gtn.clone,
    ]
    results = [g]
    for fn in unary:
        out = _attempt(fn, g)
        if isinstance(out, gtn.Graph):
            results.append(out)
    for h in others:
        for fn in (gtn.add, gtn.subtract, gtn.concat, gtn.intersect, gtn.compose, gtn.equal, gtn.isomorphic):
            for pair in ((g, h), (h, g)):
                out = _attempt(fn, *pair)
                if isinstance(out, gtn.Graph):
                    results.append(out)
        _attempt(gtn.union, [g, h])
    for sort_out in (False, True):
        _attempt(g.arc_sort, sort_out)
        _attempt(gtn.compose, g, g)
        _attempt(gtn.intersect, g, others[0])
    for r in results:
        score = _attempt(gtn.forward_score, r)
        if score is not None:
            _attempt(gtn.backward, score)
            _attempt(lambda r: r.grad().weights_to_list(), r)
        _attempt(gtn.viterbi_score, r)
        _attempt(lambda r: (repr(r), r.weights_to_list(), r.labels_to_list(False), r.arrays(), r.version), r)
        _attempt(lambda r: [(r.in_arcs(i), r.out_arcs(i)) for i in range(r.num_nodes())], r)
    # text and binary round trips
    buf = io.StringIO()
    if _attempt(gtn.savetxt, buf, g) is None or True:
        back = _attempt(gtn.loadtxt, io.StringIO(buf.getvalue()))
        if back is not None:
            _attempt(gtn.forward_score, back)
    bbuf = io.BytesIO()
    _attempt(gtn.save, bbuf, g)
    back = _attempt(gtn.load, io.BytesIO(bbuf.getvalue()))
    if back is not None:
        assert gtn.equal(back, g) or any(math.isnan(w) for w in g.weights_to_list())
    back = pickle.loads(pickle.dumps(g))
    assert back.num_arcs() == g.num_arcs() and back.num_nodes() == g.num_nodes()
    _attempt(gtn.write_dot, g, os.devnull)


def main():
    import numpy as np
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import lightning_gtn.wfst as gtn

    others = _valid_graphs(gtn)
    cfg = settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    small = st.integers(-3, 7)
    odd = st.sampled_from([2**31 - 1, 2**31, -(2**31), 2**40, 2**63 - 1, -(2**64), 10**30])
    ints = st.one_of(small, small, small, odd)
    weird = st.one_of(
        st.none(),
        st.text(max_size=3),
        st.floats(allow_nan=True),
        st.just(True),
        st.just(object()),
        st.lists(st.lists(small, max_size=2), max_size=2),
    )

    def id_list(n):
        return st.one_of(
            st.lists(ints, min_size=n, max_size=n),
            st.lists(ints, max_size=4),
            weird,
            st.lists(st.floats(-2, 8), max_size=3),
        )

    weights = st.one_of(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=7),
        weird,
        st.lists(st.text(max_size=2), max_size=3),
    )

    @st.composite
    def states(draw):
        n_arcs = draw(st.integers(0, 6))
        arcs = tuple(draw(id_list(n_arcs)) for _ in range(4))
        if draw(st.booleans()):
            arcs = tuple(
                np.asarray(a, dtype=draw(st.sampled_from(["int32", "int64", "float64"])))
                if isinstance(a, list) and all(isinstance(v, int) and abs(v) < 2**31 for v in a)
                else a
                for a in arcs
            )
        state = {
            "num_nodes": draw(st.one_of(st.integers(0, 8), ints, weird)),
            "start_ids": draw(id_list(1)),
            "accept_ids": draw(id_list(1)),
            "arcs": draw(st.one_of(st.just(arcs), st.just(arcs[:2]), weird)),
            "weights": draw(st.one_of(st.lists(st.floats(-3, 3), min_size=n_arcs, max_size=n_arcs), weights)),
            "calc_grad": draw(st.one_of(st.booleans(), weird)),
            "sorted": draw(st.one_of(st.tuples(st.booleans(), st.booleans()), weird)),
            "order": draw(st.one_of(st.none(), st.tuples(id_list(n_arcs), id_list(n_arcs)), weird)),
        }
        for key in draw(st.lists(st.sampled_from(sorted(state)), max_size=1)):
            del state[key]
        return state

    @cfg
    @given(states())
    def fuzz_state(state):
        g = gtn.Graph()
        try:
            g.__setstate__(state)
        except EXPECTED:
            return
        exercise(gtn, g, others)

    @cfg
    @given(
        st.integers(0, 8),
        id_list(1),
        id_list(1),
        st.integers(0, 6).flatmap(lambda n: st.tuples(*(id_list(n) for _ in range(4)), weights)),
    )
    def fuzz_from_arrays(n, start, accept, arcs):
        try:
            g = gtn.Graph.from_arrays(n, start, accept, *arcs)
        except EXPECTED:
            return
        exercise(gtn, g, others)

    token = st.one_of(
        st.integers(-3, 9).map(str), odd.map(str), st.sampled_from(["x", "1.5", "nan", "-inf", "", "1e9"])
    )
    line = st.lists(token, max_size=6).map(" ".join)

    @cfg
    @given(st.lists(line, max_size=8).map("\n".join))
    def fuzz_text(text):
        try:
            g = gtn.loadtxt(io.StringIO(text))
        except EXPECTED:
            return
        exercise(gtn, g, others)

    @st.composite
    def binaries(draw):
        if draw(st.booleans()):
            return draw(st.binary(max_size=80))
        counts = [draw(st.one_of(st.integers(-1, 4), odd.filter(lambda v: -(2**31) <= v < 2**31))) for _ in range(4)]
        body = draw(st.lists(st.one_of(st.integers(-3, 6), st.integers(-(2**31), 2**31 - 1)), max_size=24))
        tail = draw(st.binary(max_size=8))
        return struct.pack(f"<{4 + len(body)}i", *counts, *body) + tail

    @cfg
    @given(binaries())
    def fuzz_binary(data):
        try:
            g = gtn.load(io.BytesIO(data))
        except EXPECTED:
            return
        exercise(gtn, g, others)

    # Addresses that cannot be valid (an address inside user space is trusted, as in GTN:
    # the fuzzer must not hand one over). The graph has 3 arcs: 12 bytes from the address.
    addresses = st.one_of(
        st.integers(-(2**70), 2**16 - 1),
        st.integers(2**47 - 11, 2**70),
        st.sampled_from([np.uint64(2**64 - 1), np.uint64(2**63), np.int64(-(2**63)), np.int64(-1)]),
        st.just(0),
        st.booleans(),
    )

    @cfg
    @given(st.one_of(addresses, weights, st.lists(st.floats(), min_size=3, max_size=3)))
    def fuzz_set_weights(arg):
        g = _valid_graphs(gtn)[0]
        try:
            g.set_weights(arg)
        except EXPECTED:
            return
        exercise(gtn, g, others)

    @cfg
    @given(
        st.lists(st.tuples(ints, ints, ints, st.one_of(st.none(), ints), st.floats()), max_size=6),
        st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=5),
    )
    def fuzz_add_arc(arcs, nodes):
        g = gtn.Graph()
        for s, a in nodes:
            g.add_node(s, a)
        for src, dst, il, ol, w in arcs:
            _attempt(g.add_arc, src, dst, il, ol, w)
        for i in (-1, 0, 3, 2**31):
            _attempt(g.make_accept, i)
            _attempt(g.set_weight, i, 1.0)
            _attempt(g.srcnode, i)
        exercise(gtn, g, others)

    for fuzz in (fuzz_state, fuzz_from_arrays, fuzz_text, fuzz_binary, fuzz_set_weights, fuzz_add_arc):
        fuzz()
        print("fuzzed", fuzz.__name__, flush=True)


if __name__ == "__main__":
    main()
