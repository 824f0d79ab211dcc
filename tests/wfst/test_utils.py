"""equal, isomorphic, the text and binary formats, DOT output and drawing."""

import io
import os
import stat
import struct
import sys

import numpy as np
import pytest

import lightning_gtn.wfst as gtn

# A small transducer in GTN's text format: two start nodes, two accept nodes,
# an epsilon output label, a loop and a default weight.
TRANSDUCER = """0 1
3 4
0 1 0 0 2
0 2 1 1 1
1 2 0 0 2
2 3 0 2 1
2 3 1 -1 1.5
1 4 0 0 2
2 4 1 1 3
3 4 0 0
3 3 2
"""


def chain(labels, weights=None, calc_grad=True):
    g = gtn.Graph(calc_grad)
    g.add_node(True)
    for i, lab in enumerate(labels):
        g.add_node(False, i == len(labels) - 1)
        g.add_arc(i, i + 1, lab, lab, 0.0 if weights is None else weights[i])
    return g


# -- text format ---------------------------------------------------------------------------


def test_loadtxt_reads_every_field_and_default(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text(TRANSDUCER)
    g = gtn.loadtxt(str(path))
    assert g.num_nodes() == 5
    assert g.start() == [0, 1] and g.accept() == [3, 4]
    assert g.num_arcs() == 9
    assert g.labels_to_list() == [0, 1, 0, 0, 1, 0, 1, 0, 2]
    assert g.labels_to_list(False) == [0, 1, 0, 2, -1, 0, 1, 0, 2]  # olabel defaults to ilabel
    np.testing.assert_allclose(g.weights_to_list(), [2, 1, 2, 1, 1.5, 2, 3, 0, 0])
    assert [g.srcnode(a) for a in range(9)] == [0, 0, 1, 2, 2, 1, 2, 3, 3]
    assert [g.dstnode(a) for a in range(9)] == [1, 2, 2, 3, 3, 4, 4, 4, 3]
    assert g.calc_grad


def test_loadtxt_node_count_comes_from_the_largest_id():
    g = gtn.graph_from_text("0\n7\n")
    assert g.num_nodes() == 8 and g.num_arcs() == 0
    g = gtn.graph_from_text("0\n1\n0 9 3\n")
    assert g.num_nodes() == 10
    assert g.is_start(0) and g.is_accept(1) and not g.is_accept(9)


def test_savetxt_writes_gtn_lines(tmp_path):
    g = gtn.graph_from_text(TRANSDUCER)
    path = tmp_path / "out.txt"
    gtn.savetxt(str(path), g)
    lines = path.read_text().splitlines()
    assert lines[:2] == ["0 1", "3 4"]
    assert lines[2] == "0 1 0 0 2"
    assert lines[6] == "2 3 1 -1 1.5"
    assert lines[-1] == "3 3 2 2 0"
    assert len(lines) == 2 + g.num_arcs()
    again = gtn.loadtxt(path)  # path-like objects work too
    assert gtn.equal(g, again)


def test_text_round_trip_through_file_objects():
    g = gtn.graph_from_text(TRANSDUCER)
    buf = io.StringIO()
    gtn.savetxt(buf, g)
    buf.seek(0)
    assert gtn.equal(gtn.loadtxt(buf), g)


def test_savetxt_uses_six_significant_digits():
    g = chain([0], [1.23456789])
    assert gtn.graph_to_text(g).splitlines()[2] == "0 1 0 0 1.23457"


def test_repr_is_gtn_text_and_summarises_big_graphs():
    g = chain([1, 2], [0.5, -1.0])
    assert repr(g) == "0\n2\n0 1 1 1 0.5\n1 2 2 2 -1\n"
    assert str(g) == repr(g)
    big = gtn.linear_graph(3, 10)  # 30 arcs > 20: shortened like GTN's operator<<
    lines = repr(big).splitlines()
    assert lines[:2] == ["0", "3"]
    assert len(lines) == 2 + 10 + 1 and lines[-1] == "..."
    many = gtn.Graph()
    for _ in range(25):
        many.add_node(True, True)
    lines = repr(many).splitlines()
    assert lines[0] == "0 1 2 3 4 5 6 7 8 9 ..."
    assert lines[1] == lines[0]
    full = gtn.graph_to_text(big, summary=False).splitlines()
    assert len(full) == 32


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("", None, "start"),  # no line at all
        ("0\n", None, "accept"),
        ("\n1\n", 1, "start"),
        ("0\n\n", 2, "accept"),
        ("0 0\n1\n", 1, "repeat start"),
        ("0\n1 2 1\n", 2, "repeat accept"),
        ("x\n1\n", 1, "'x'"),
        ("-1\n1\n", 1, "'-1'"),
        ("0\n1\n0 2\n", 3, "'0 2'"),
        ("0\n1\n0 1 2 3 4 5\n", 3, "'0 1 2 3 4 5'"),
        ("0\n1\n0 1 1\n0 1 a\n", 4, "'0 1 a'"),
        ("0\n1\n0 1 1 1 w\n", 3, "'0 1 1 1 w'"),
        ("0\n1\n0 1 1.5\n", 3, "'0 1 1.5'"),
        ("0\n1\n-3 1 1\n", 3, "'-3 1 1'"),
        ("0\n1\n0 1 -2\n", 3, "'0 1 -2'"),
    ],
)
def test_malformed_text_names_line_and_content(text, line, fragment):
    with pytest.raises(ValueError) as err:
        gtn.graph_from_text(text)
    msg = str(err.value)
    assert fragment in msg
    if line is not None:
        assert f"line {line}" in msg


def test_malformed_file_message_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("0\n1\n0 1 1\n0 1\n")
    with pytest.raises(ValueError, match=r"bad\.txt.*line 4.*'0 1'"):
        gtn.loadtxt(str(path))


def test_blank_arc_lines_are_skipped():
    g = gtn.graph_from_text("0\n1\n\n0 1 1\n\n")
    assert g.num_arcs() == 1


def test_missing_files_raise_value_error_and_file_not_found(tmp_path):
    missing = str(tmp_path / "nope.txt")
    for fn in (gtn.loadtxt, gtn.load):
        with pytest.raises(ValueError, match="Couldn't find graph file"):
            fn(missing)
        with pytest.raises(FileNotFoundError):
            fn(missing)


# -- binary format -------------------------------------------------------------------------


def test_binary_round_trip_is_exact(tmp_path, rng):
    g = gtn.Graph()
    for i in range(6):
        g.add_node(i in (0, 3), i in (5, 2))
    g.make_accept(1)  # accept ids out of node order: [2, 5, 1]
    for _ in range(20):
        a, b = rng.integers(0, 6, size=2)
        g.add_arc(int(a), int(b), int(rng.integers(-1, 5)), int(rng.integers(-1, 5)), 0.0)
    w = rng.standard_normal(20).astype(np.float32)
    w[3], w[7] = np.inf, -np.inf
    g.set_weights(w)
    path = tmp_path / "g.bin"
    gtn.save(str(path), g)
    h = gtn.load(str(path))
    assert gtn.equal(g, h)
    assert h.start() == [0, 3] and h.accept() == [2, 5, 1]
    assert h.weights_to_numpy().tobytes() == w.tobytes()  # bit for bit
    assert h.labels_to_list(False) == g.labels_to_list(False)


def test_binary_layout_is_gtn_s(tmp_path):
    g = gtn.Graph()
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, 3, -1, 1.5)
    buf = io.BytesIO()
    gtn.save(buf, g)
    expected = struct.pack("<4i", 2, 1, 1, 1) + struct.pack("<2i", 0, 1)
    expected += struct.pack("<4i", 0, 1, 3, -1) + struct.pack("<f", 1.5)
    assert buf.getvalue() == expected
    assert gtn.equal(gtn.load(io.BytesIO(expected)), g)


def test_binary_round_trip_of_empty_graph(tmp_path):
    path = tmp_path / "empty.bin"
    gtn.save(path, gtn.Graph())
    h = gtn.load(path)
    assert h.num_nodes() == 0 and h.num_arcs() == 0 and gtn.equal(h, gtn.Graph())


def test_truncated_binary_file_is_rejected(tmp_path):
    buf = io.BytesIO()
    gtn.save(buf, chain([1, 2, 3], [1, 2, 3]))
    data = buf.getvalue()
    for cut in (3, 20, len(data) - 1):
        with pytest.raises(ValueError):
            gtn.load(io.BytesIO(data[:cut]))
    bad = bytearray(data)
    bad[0:4] = struct.pack("<i", 2)  # arcs now point at node 3 of a 2-node graph
    with pytest.raises(ValueError, match="node id"):
        gtn.load(io.BytesIO(bytes(bad)))


# -- equal and isomorphic -------------------------------------------------------------------


def test_equal_compares_arcs_in_order_and_weights_exactly():
    assert gtn.equal(gtn.Graph(), gtn.Graph())
    g = gtn.graph_from_text(TRANSDUCER)
    assert gtn.equal(g, gtn.graph_from_text(TRANSDUCER))
    assert gtn.equal(g, g)
    swapped = TRANSDUCER.splitlines()
    swapped[2], swapped[3] = swapped[3], swapped[2]
    assert not gtn.equal(g, gtn.graph_from_text("\n".join(swapped)))
    h = gtn.graph_from_text(TRANSDUCER)
    w = h.weights_to_numpy()
    w[0] = np.nextafter(w[0], np.float32(10))
    h.set_weights(w)
    assert not gtn.equal(g, h)
    out = gtn.graph_from_text(TRANSDUCER.replace("2 3 0 2 1", "2 3 0 3 1"))
    assert not gtn.equal(g, out)  # output labels count
    nan = chain([0], [float("nan")])
    assert not gtn.equal(nan, nan)


def test_equal_counts_start_and_accept_nodes_like_gtn():
    a = gtn.Graph()
    a.add_node(True)
    a.add_node()
    b = gtn.Graph()
    b.add_node()
    b.add_node()
    assert not gtn.equal(a, b)
    # GTN's equal compares how many start/accept nodes there are, not which ones.
    c = gtn.Graph()
    c.add_node()
    c.add_node(True)
    assert gtn.equal(a, c)


def test_isomorphic_ignores_numbering():
    g1 = gtn.graph_from_text("0\n2\n0 2 0\n0 1 0\n1 1 3\n2 1 3\n")
    g2 = gtn.graph_from_text("0\n1\n0 1 0\n1 2 3\n0 2 0\n2 2 3\n")
    assert gtn.isomorphic(g1, g2) and not gtn.equal(g1, g2)
    # The same picture with node 1 accepting instead of node 2 is a different graph.
    g3 = gtn.graph_from_text("0\n2\n0 2 0\n0 1 0\n1 1 3\n2 1 3\n".replace("0\n2\n", "0\n1\n", 1))
    assert not gtn.isomorphic(g1, g3)


def test_isomorphic_needs_matching_multisets_of_arcs():
    g1 = gtn.graph_from_text("0\n1\n0 1 1 1 3.5\n0 1 1 1 3.5\n0 1 1 1 4.5\n")
    g2 = gtn.graph_from_text("0\n1\n0 1 1 1 3.5\n0 1 1 1 4.5\n0 1 1 1 4.5\n")
    g3 = gtn.graph_from_text("0\n1\n0 1 1 1 4.5\n0 1 1 1 3.5\n0 1 1 1 3.5\n")
    assert not gtn.isomorphic(g1, g2)
    assert gtn.isomorphic(g1, g3)
    t1 = gtn.graph_from_text("0\n1\n0 1 0 1\n")
    t2 = gtn.graph_from_text("0\n1\n0 1 0 2\n")
    assert not gtn.isomorphic(t1, t2)
    a = gtn.Graph()
    a.add_node(True)
    b = gtn.Graph()
    b.add_node(True, True)
    assert not gtn.isomorphic(a, b)


def test_isomorphic_handles_long_chains_without_recursion():
    n = 5 * sys.getrecursionlimit()
    g = gtn.linear_graph(n, 1)
    h = gtn.linear_graph(n, 1)
    assert gtn.isomorphic(g, h)
    w = h.weights_to_numpy()
    w[-1] = 1.0
    h.set_weights(w)
    assert not gtn.isomorphic(g, h)


def test_comparisons_reject_non_graphs():
    with pytest.raises(TypeError, match="g2"):
        gtn.equal(gtn.Graph(), "0\n1\n")
    with pytest.raises(TypeError, match="g1"):
        gtn.isomorphic(None, gtn.Graph())


# -- DOT and drawing ------------------------------------------------------------------------


def dot_graph():
    g = gtn.Graph()
    g.add_node(False, True)  # 0: accept
    g.add_node(True)  # 1: start
    g.add_node()  # 2
    g.add_arc(1, 2, 0, 1, 1.5)
    g.add_arc(2, 0, gtn.epsilon, 0, -2.0)
    g.add_arc(1, 0, 1, gtn.epsilon)
    return g


def test_write_dot_follows_gtn_layout(tmp_path):
    path = tmp_path / "g.dot"
    gtn.write_dot(dot_graph(), str(path))
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "digraph FST {" and lines[-1] == "}"
    node_lines = [l for l in lines if "shape" in l]
    # start nodes first (bold), then the others, accept nodes last (double circle)
    assert node_lines == [
        '  1 [label = "1", shape = circle, penwidth = 2.0, fontsize = 14];',
        '  2 [label = "2", shape = circle, penwidth = 1.0, fontsize = 14];',
        '  0 [label = "0", shape = doublecircle, penwidth = 1.0, fontsize = 14];',
    ]
    assert '  1 -> 2 [label = "0/1.5", fontsize = 14];' in lines
    assert '  2 -> 0 [label = "\u03b5/-2", fontsize = 14];' in lines
    assert '  1 -> 0 [label = "1/0", fontsize = 14];' in lines


def test_write_dot_uses_symbol_maps(tmp_path):
    path = tmp_path / "g.dot"
    gtn.write_dot(dot_graph(), path, {0: "a", 1: "b"}, {0: "x", 1: "y"})
    text = path.read_text(encoding="utf-8")
    assert '1 -> 2 [label = "a:y/1.5"' in text
    assert '2 -> 0 [label = "\u03b5:x/-2"' in text
    assert '1 -> 0 [label = "b:\u03b5/0"' in text
    with pytest.raises(KeyError, match="isymbols"):
        gtn.write_dot(dot_graph(), path, {0: "a"})
    with pytest.raises(IndexError):  # GTN's error type
        gtn.write_dot(dot_graph(), path, {0: "a", 1: "b"}, {1: "y"})


def test_write_dot_to_unwritable_place_raises_runtime_error(tmp_path):
    with pytest.raises(RuntimeError, match="Could not open file"):
        gtn.write_dot(dot_graph(), str(tmp_path / "no_such_dir" / "g.dot"))


def test_draw_without_graphviz_asks_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no `dot` on it
    with pytest.raises(RuntimeError, match="[Gg]raphviz"):
        gtn.draw(dot_graph(), str(tmp_path / "g.pdf"))


def test_draw_runs_dot_with_the_extension_as_format(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "args.txt"
    fake = bindir / "dot"
    # A stand-in for Graphviz: records its arguments and copies the DOT input.
    fake.write_text(f'#!/bin/sh\necho "$@" > {log}\ncp "$2" "$4"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ.get("PATH", ""))
    out = tmp_path / "graph.svg"
    gtn.draw(dot_graph(), str(out), {0: "a", 1: "b"})
    args = log.read_text().split()
    assert args[0] == "-Tsvg" and args[2] == "-o" and args[3] == str(out)
    assert out.read_text(encoding="utf-8") == gtn.dot_text(dot_graph(), {0: "a", 1: "b"})
    with pytest.raises(ValueError, match="extension"):
        gtn.draw(dot_graph(), str(tmp_path / "graph"))
