"""OpenFST text format, symbol tables and pywrapfst conversion (lightning_gtn.wfst.openfst)."""

import io
import math

import numpy as np
import pytest

import lightning_gtn.wfst as gtn

# The example of OpenFST's quick tour, written by hand following the format's documentation
# (``fstcompile --isymbols=isyms.txt --osymbols=osyms.txt``): arcs "src dst in out weight",
# a final line "state weight"; weights are tropical costs.
TOUR = "0 1 a x .5\n0 1 b y 1.5\n1 2 c z 2.5\n2 3.5\n"
ISYMS = "<eps> 0\na 1\nb 2\nc 3\n"
OSYMS = "<eps> 0\nx 1\ny 2\nz 3\n"


def arcs(g):
    a = g.arrays()
    return list(zip(a.src.tolist(), a.dst.tolist(), a.ilabel.tolist(), a.olabel.tolist(), a.weights.tolist()))


def test_quick_tour_example_with_symbols(tmp_path):
    (tmp_path / "isyms.txt").write_text(ISYMS)
    g, isyms, osyms = gtn.read_fst_text(TOUR, str(tmp_path / "isyms.txt"), gtn.read_symbols(OSYMS))
    assert isyms == {"<eps>": 0, "a": 1, "b": 2, "c": 3} and osyms["z"] == 3
    # labels are OpenFST ids - 1, weights negated costs; the final cost 3.5 becomes an epsilon
    # arc (score -3.5) to an extra accept node 3
    assert g.num_nodes() == 4 and g.start() == [0] and g.accept() == [3]
    assert arcs(g) == [
        (0, 1, 0, 0, -0.5),
        (0, 1, 1, 1, -1.5),
        (1, 2, 2, 2, -2.5),
        (2, 3, gtn.epsilon, gtn.epsilon, -3.5),
    ]
    # best path a:x c:z costs .5 + 2.5 + 3.5
    assert gtn.viterbi_score(g).item() == pytest.approx(-6.5)
    assert gtn.forward_score(g).item() == pytest.approx(math.log(math.exp(-0.5) + math.exp(-1.5)) - 6.0, rel=1e-6)
    # written back with the symbols: the arcs as they were, the final as an epsilon arc
    text = gtn.write_fst_text(g, isymbols=isyms, osymbols=osyms)
    assert text.splitlines()[:3] == ["0\t1\ta\tx\t0.5", "0\t1\tb\ty\t1.5", "1\t2\tc\tz\t2.5"]
    assert text.splitlines()[3:] == ["2\t3\t<eps>\t<eps>\t3.5", "3"]
    again, _, _ = gtn.read_fst_text(text, isyms, osyms)
    assert gtn.equal(again, g)


@pytest.mark.parametrize("seed", range(6))
def test_random_graph_round_trip(seed, tmp_path):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    e = int(rng.integers(0, 20))
    src = np.sort(rng.integers(0, n, e))
    dst = rng.integers(0, n, e)
    il = rng.integers(-1, 6, e)
    ol = rng.integers(-1, 6, e)
    w = rng.normal(size=e).astype(np.float32)
    accept = sorted(set(rng.integers(0, n, int(rng.integers(0, n + 1))).tolist()))
    g = gtn.Graph.from_arrays(n, [0], accept, src, dst, il, ol, w)
    path = tmp_path / "g.fst.txt"
    text = gtn.write_fst_text(g, path)
    assert path.read_text() == text
    if 0 not in src.tolist() and 0 not in accept:
        assert text == ""  # OpenFST's empty FST: the same (empty) language
        return
    back, _, _ = gtn.read_fst_text(path)
    # float32 weights survive 9 significant digits exactly; nodes past the last one named
    # in the text are dropped (they have no arcs and are not accepting)
    assert arcs(back) == arcs(g)
    assert back.accept() == accept and back.start() == [0]
    assert gtn.write_fst_text(back) == text


def test_text_round_trip_is_exact_for_canonical_text():
    text = "0\t1\t3\t4\t-1.25\n0\t2\t1\t0\n1\t1\t2\t2\t0.5\n1\n2\t0\t1\t1\n2\n"
    g, _, _ = gtn.read_fst_text(text)
    assert gtn.write_fst_text(g) == text


def test_start_not_zero_and_several_starts():
    g, _, _ = gtn.read_fst_text("2 0 1 1 1.0\n0 1 2 2\n1\n")
    assert g.start() == [2] and g.accept() == [1]
    text = gtn.write_fst_text(g)
    assert text.splitlines()[0].startswith("2\t")
    assert gtn.equal(gtn.read_fst_text(text)[0], g)
    # several start nodes: a new start state with epsilon arcs of score 0
    h = gtn.Graph()
    for i in range(3):
        h.add_node(start=i < 2, accept=i == 2)
    h.add_arc(0, 2, 0, 0, -1.0)
    h.add_arc(1, 2, 1, 1, -2.0)
    back, _, _ = gtn.read_fst_text(gtn.write_fst_text(h))
    assert back.start() == [3] and back.num_nodes() == 4
    assert gtn.forward_score(back).item() == pytest.approx(gtn.forward_score(h).item())


def test_acceptors():
    text = "0 1 1 0.5\n0 1 2\n1 2 3\n2\n"
    g, _, _ = gtn.read_fst_text(text)  # 3-field lines: detected as an acceptor
    assert g.labels_to_list() == g.labels_to_list(False) == [0, 1, 2]
    assert g.weights_to_list() == [-0.5, 0.0, 0.0]
    out = gtn.write_fst_text(g, acceptor=True)
    assert out == "0\t1\t1\t0.5\n0\t1\t2\n1\t2\t3\n2\n"
    assert gtn.equal(gtn.read_fst_text(out, acceptor=True)[0], g)
    # 4 fields are "src dst label weight" for an acceptor, "src dst in out" for a transducer
    a, _, _ = gtn.read_fst_text("0 1 2 3\n1\n", acceptor=True)
    t, _, _ = gtn.read_fst_text("0 1 2 3\n1\n")
    assert a.labels_to_list(False) == [1] and a.weights_to_list() == [-3.0]
    assert t.labels_to_list(False) == [2] and t.weights_to_list() == [0.0]
    with pytest.raises(ValueError, match="differ"):
        gtn.write_fst_text(t, acceptor=True)
    t.set_weights([float("nan")])
    with pytest.raises(ValueError, match="NaN"):
        gtn.write_fst_text(t)
    # acceptor with symbols: the one table serves both sides
    s, isyms, osyms = gtn.read_fst_text("0 1 b\n1\n", ["<eps>", "a", "b"])
    assert s.labels_to_list() == [1] and osyms == isyms


def test_final_and_infinite_weights():
    g, _, _ = gtn.read_fst_text("0 1 1 1 Infinity\n0 2 1 1\n1 0\n2 Infinity\n")
    assert g.weights_to_list()[0] == -math.inf
    assert g.accept() == [1]  # final cost 0 -> accept; Infinity -> not final
    assert gtn.write_fst_text(g) == "0\t1\t1\t1\tInfinity\n0\t2\t1\t1\n1\n"
    g2, _, _ = gtn.read_fst_text("0\n")  # a single final start state: accepts the empty string
    assert g2.num_nodes() == 1 and g2.start() == [0] and g2.accept() == [0]
    assert gtn.write_fst_text(g2) == "0\n"
    empty, _, _ = gtn.read_fst_text("\n\n")
    assert empty.num_nodes() == 0
    assert gtn.write_fst_text(empty) == ""


def test_symbol_tables(tmp_path):
    table = gtn.read_symbols(io.StringIO("<eps>\t0\r\nhello 1\n\nworld 2\n"))
    assert table == {"<eps>": 0, "hello": 1, "world": 2}
    p = tmp_path / "syms.txt"
    text = gtn.write_symbols(table, p)
    assert text == "<eps>\t0\nhello\t1\nworld\t2\n" and p.read_text() == text
    assert gtn.read_symbols(str(p)) == table
    assert gtn.write_symbols(["<eps>", "a"]) == "<eps>\t0\na\t1\n"
    for bad, match in [("a\n", "line 1"), ("a 1\nb x\n", "line 2"), ("a -1\n", "outside"), ("a 1\na 2\n", "twice")]:
        with pytest.raises(ValueError, match=match):
            gtn.read_symbols(bad)
    with pytest.raises(ValueError, match="white space"):
        gtn.write_symbols({"a b": 1})
    g, _, _ = gtn.read_fst_text("0 1 2 2\n1\n")
    with pytest.raises(ValueError, match="no symbol"):
        gtn.write_fst_text(g, isymbols={"<eps>": 0, "a": 1})


@pytest.mark.parametrize(
    "text, kwargs, match",
    [
        ("0 1 x 1\n", {}, "line 1: input label 'x'"),
        ("0 1 1 1\n1 2 3\n1 2 3 4 5\n", {}, "mixed"),
        ("0 1 1\n", {"acceptor": False}, "line 1: an arc of a transducer"),
        ("0 1 1 1 1\n", {"acceptor": True}, "line 1: an arc of an acceptor"),
        ("0 1 1 1 1 1\n", {}, "line 1: at most 5 fields"),
        ("0 1 1 1\n-1\n", {}, "line 2: state -1 outside"),
        ("0 1 1 1 abc\n", {}, "line 1: weight 'abc'"),
        ("0 1 1 1 nan\n", {}, "line 1: weight 'nan'"),
        ("0 1 1 1 -inf\n", {}, "line 1: weight '-inf'"),
        ("0 1 1 1\n1 x\n", {}, "line 2: weight 'x'"),
        ("0 1 1 1\n1\n1\n", {}, "line 3: state 1 is made final twice"),
        ("0 99999999999 1 1\n", {}, "line 1: state 99999999999 outside"),
        ("0 5000 1 1\n", {"max_states": 100}, "line 1: state 5000 outside"),
        ("0 1 1 -2\n", {}, "line 1: output label -2 outside"),
        ("0 1 1 4294967296\n", {}, "line 1: output label 4294967296 outside"),
        ("0 1 a b\n", {"isymbols": {"a": 1}}, "line 1: output label 'b'"),
        ("x" * 70000 + "\n", {}, "line 1: longer than"),
        ("0 1 1 1\n" * 10, {"max_bytes": 20}, "over max_bytes"),
    ],
)
def test_malformed_text_raises_value_error(text, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gtn.read_fst_text(text, **kwargs)


def test_far_state_ids_do_not_allocate():
    # a two-line text naming state 60 million: within max_states, but the graph's budget for
    # nodes that nothing names refuses it before allocating
    with pytest.raises(ValueError, match="unused"):
        gtn.read_fst_text("0 60000000 1 1\n0\n")


def test_truncated_and_garbage_text_never_crash():
    rng = np.random.default_rng(0)
    ok = 0
    base = (
        TOUR.replace("a", "1").replace("b", "2").replace("c", "3").replace("x", "1").replace("y", "2").replace("z", "3")
    )
    for k in range(300):
        if k % 2:
            t = base[: int(rng.integers(0, len(base)))]
        else:
            chars = list(base)
            for _ in range(3):
                chars[int(rng.integers(0, len(chars)))] = str(rng.choice(list("0123 \n.-xI\t")))
            t = "".join(chars)
        try:
            g, _, _ = gtn.read_fst_text(t)
        except ValueError:
            continue
        ok += 1
        gtn.write_fst_text(g)
    assert 0 < ok < 300


# -- pywrapfst (pip install pynini; the tests skip without it) -------------------------------------


def test_pywrapfst_round_trip():
    fst = pytest.importorskip("pywrapfst")
    g, _, _ = gtn.read_fst_text("0\t1\t1\t2\t0.5\n0\t2\t3\t0\n1\t2\t2\t2\t-1.25\n1\t3.5\n2\n")
    f = gtn.to_pywrapfst(g, isymbols=["<eps>", "a", "b", "c"])
    assert isinstance(f, fst.VectorFst) and f.num_states() == 4 and f.start() == 0
    assert f.input_symbols().find("b") == 2
    back = gtn.from_pywrapfst(f)
    assert gtn.equal(back, g)
    # an FST that OpenFST itself compiled from the text, with its weighted final state
    c = fst.Compiler()
    c.write("0 1 1 2 0.5\n0 2 3 0\n1 2 2 2 -1.25\n1 3.5\n2\n")
    compiled = c.compile()
    assert gtn.equal(gtn.from_pywrapfst(compiled), g)
    # OpenFST's shortest distance equals the engine's viterbi score (costs = -scores)
    best = fst.shortestdistance(compiled, reverse=True)[compiled.start()]
    assert float(best.to_string()) == pytest.approx(-gtn.viterbi_score(g).item())
    # OpenFST's own printing reads back to the same graph
    printed = compiled.print()
    assert gtn.equal(gtn.read_fst_text(printed)[0], g)


# -- second probe: findings 8 and 18, and a missing symbol file read as text ----------------------


def test_costs_beyond_float32_are_the_infinities_they_round_to():
    from lightning_gtn.wfst.openfst import read_fst_text

    with pytest.raises(ValueError, match="line 1: weight '-1e39' is below float32's range"):
        read_fst_text("0 1 1 1 -1e39\n1\n")
    with pytest.raises(ValueError, match="line 1: weight '-Infinity' must be a number or Infinity"):
        read_fst_text("0 1 1 1 -Infinity\n1\n")
    g, _, _ = read_fst_text("0 1 1 1 1e39\n0 1 2 2 0.5\n1\n")  # +1e39 is the semiring zero, as Infinity
    assert g.weights_to_list() == [float("-inf"), -0.5]


@pytest.mark.parametrize(
    "text, what",
    [
        ("1_0 1 1\n1\n", "state '1_0'"),
        ("0 1 \u0661\n1\n", "is not an integer"),
        ("0 1 1 1 0_5\n1\n", "weight '0_5' is not a number"),
        ("0 1 1 1 0x1p3\n1\n", "is not a number"),
    ],
)
def test_fst_text_reads_only_ascii_numbers(text, what):
    from lightning_gtn.wfst.openfst import read_fst_text

    with pytest.raises(ValueError, match=what):
        read_fst_text(text)


def test_a_missing_symbol_file_is_an_error_not_text(tmp_path):
    from lightning_gtn.wfst.openfst import read_fst_text, read_symbols

    with pytest.raises(FileNotFoundError, match="no such file"):
        read_fst_text("0 1 1\n1\n", isymbols=str(tmp_path / "missing.syms"))
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        read_symbols("/dev/zero")
    with pytest.raises(ValueError, match="id '1_0' is not an integer"):
        read_symbols("a 1_0\n")
    (tmp_path / "s.syms").write_text("<eps> 0\na 1\n")
    assert read_symbols(str(tmp_path / "s.syms")) == {"<eps>": 0, "a": 1}
    assert read_symbols("a 1") == {"a": 1}  # one line of text without a newline
