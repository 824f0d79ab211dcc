"""Comparisons, input and output of graphs: GTN's ``equal``, ``isomorphic``, text and
binary files, and Graphviz drawings.

Text format (GTN's ``savetxt``/``loadtxt``)::

    0 1            <- line 1: the start node ids
    3 4            <- line 2: the accept node ids
    0 1 0 0 2.5    <- then one arc a line: src dst ilabel [olabel [weight]]

``olabel`` defaults to ``ilabel`` and ``weight`` to 0. The graph gets as many nodes as
the largest node id named anywhere (plus one); at most ``MAX_UNREFERENCED_NODES`` (2**20)
of them may be named nowhere, so a short text naming node 2**31 - 2 is refused rather
than allocated. Node ids and labels must fit int32. Fields may be separated by any
whitespace and blank arc lines are skipped (GTN needs single spaces). As in GTN, the
first two lines must name at least one node each, so a graph without start or accept
nodes can be written but not read back: use ``save``/``load`` or pickle for those. ``savetxt`` writes weights with six
significant digits, as GTN does, so a text round trip is exact only for such weights;
``save``/``load`` (binary) round-trip exactly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

from ..files import open_regular
from ._text import fmt_weight, format_graph
from .graph import _FLOAT, _INT, MAX_NODES, MAX_UNREFERENCED_NODES, Graph, _validate_arrays, epsilon

#: The most bytes ``load`` and ``loadtxt`` read from one file (or stream); larger input is
#: refused. Counted on what is really read, so devices such as ``/dev/zero`` stop there too.
MAX_FILE_BYTES = 1 << 30

# The text format's own number grammar: ASCII digits only (no ``1_0``, no other scripts' digits).
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)", re.ASCII | re.IGNORECASE
)


def _int_field(text: str) -> int:
    if not _INT_RE.fullmatch(text):
        raise ValueError(text)
    return int(text)


def _float_field(text: str) -> float:
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError(text)
    return float(text)


def _check_limit(max_bytes, where: str) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes < 1:
        raise ValueError(f"{where}: max_bytes must be a positive integer, got {max_bytes!r}")
    return int(max_bytes)


def _bounded_lines(f, source: str, max_bytes: int):
    """The lines of text file ``f``, refusing more than ``max_bytes`` characters in all (a line
    is read with a length limit too, so a file without newlines stops there)."""
    left = max_bytes
    while True:
        line = f.readline(left + 1)
        if not line:
            return
        left -= len(line)
        if left < 0:
            raise ValueError(f"{source}: longer than max_bytes={max_bytes} characters (refused)")
        yield line


def _read_bounded(f, source: str, max_bytes: int):
    """At most ``max_bytes`` of ``f``'s content; ValueError if there is more."""
    data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{source}: longer than max_bytes={max_bytes} bytes (refused)")
    return data


__all__ = [
    "equal",
    "isomorphic",
    "graph_to_text",
    "graph_from_text",
    "savetxt",
    "loadtxt",
    "save",
    "load",
    "write_dot",
    "dot_text",
    "draw",
]

_EPSILON_SYMBOL = "\u03b5"  # what GTN's drawings show for epsilon


class GraphFileNotFoundError(FileNotFoundError, ValueError):
    """A graph file that does not exist. GTN raises ``ValueError`` here; Python code
    expects ``FileNotFoundError``: this error is both."""


class SymbolNotFoundError(KeyError, IndexError):
    """A label missing from a symbol map of ``write_dot`` (GTN raises ``IndexError``)."""


def _check(g, name: str) -> Graph:
    if not isinstance(g, Graph):
        raise TypeError(f"{name} must be a gtn.Graph, got {type(g).__name__}")
    return g


# -- comparisons --------------------------------------------------------------------------


def equal(g1: Graph, g2: Graph) -> bool:
    """Whether two graphs are identical arc for arc (not merely isomorphic).

    As GTN's C++ ``equal``: the numbers of nodes, start nodes, accept nodes and arcs
    must agree, and the arcs (source, destination, input label, output label, weight)
    must be equal in the same order, weights exactly (a NaN weight never equals).
    Like GTN, which nodes are start or accept nodes is compared only through their
    counts.
    """
    _check(g1, "g1")
    _check(g2, "g2")
    s1, s2 = g1._s, g2._s
    if (
        s1.num_nodes != s2.num_nodes
        or len(s1.start_ids) != len(s2.start_ids)
        or len(s1.accept_ids) != len(s2.accept_ids)
        or s1.num_arcs() != s2.num_arcs()
    ):
        return False
    if s1 is not s2:
        for a, b in zip(s1.arrays(), s2.arrays()):
            if not np.array_equal(a, b):
                return False
    return bool(np.array_equal(g1._weights(), g2._weights()))


def isomorphic(g1: Graph, g2: Graph) -> bool:
    """Whether the graphs are the same up to a renumbering of nodes and arcs.

    GTN's search, run without recursion (so long chains are fine): each start node of
    ``g1`` is matched with a distinct start node of ``g2``, and from a matched pair of
    nodes every out-arc of ``g1`` is matched with a distinct out-arc of ``g2`` having
    the same labels and exactly the same weight, whose destinations match in turn.
    Pairs already under examination are assumed to match (which makes loops work).
    Matching is greedy, as in GTN: it can report ``False`` for some exotic isomorphic
    graphs with many identical arcs, and it is slow on large graphs.
    """
    _check(g1, "g1")
    _check(g2, "g2")
    s1, s2 = g1._s, g2._s
    if (
        s1.num_nodes != s2.num_nodes
        or len(s1.start_ids) != len(s2.start_ids)
        or len(s1.accept_ids) != len(s2.accept_ids)
        or s1.num_arcs() != s2.num_arcs()
    ):
        return False
    _, dst1, il1, ol1 = (a.tolist() for a in s1.arrays())
    _, dst2, il2, ol2 = (a.tolist() for a in s2.arrays())
    w1, w2 = g1._weights().tolist(), g2._weights().tolist()
    in1, out1 = _degrees_and_out(s1)
    in2, out2 = _degrees_and_out(s2)
    visited: Dict[Tuple[int, int], bool] = {}

    def match(n1: int, n2: int):
        # A generator: it yields (node1, node2) pairs to match and receives the answer.
        state = (n1, n2)
        if state in visited:
            return visited[state]
        visited[state] = True  # assumed to match unless shown otherwise
        if (
            in1[n1] != in2[n2]
            or len(out1[n1]) != len(out2[n2])
            or s1.start[n1] != s2.start[n2]
            or s1.accept[n1] != s2.accept[n2]
        ):
            visited[state] = False
            return False
        candidates = list(out2[n2])
        for a in out1[n1]:
            found = -1
            for k, b in enumerate(candidates):
                if il1[a] != il2[b] or ol1[a] != ol2[b] or w1[a] != w2[b]:
                    continue
                ok = yield (dst1[a], dst2[b])
                if ok:
                    found = k
                    break
            if found < 0:
                visited[state] = False
                return False
            del candidates[found]
        return True

    def run(n1: int, n2: int) -> bool:
        stack = [match(n1, n2)]
        value = None
        while stack:
            try:
                pair = stack[-1].send(value)
            except StopIteration as stop:
                stack.pop()
                value = stop.value
                continue
            stack.append(match(*pair))
            value = None
        return bool(value)

    remaining = list(s2.start_ids)
    for a in s1.start_ids:
        for k, b in enumerate(remaining):
            if run(a, b):
                del remaining[k]
                break
        else:
            return False
    return True


def _degrees_and_out(s) -> Tuple[List[int], List[List[int]]]:
    in_off, _, out_off, out_arcs = s.csr()
    in_deg = np.diff(in_off).tolist()
    out_arcs = out_arcs.tolist()
    out_off = out_off.tolist()
    return in_deg, [out_arcs[out_off[i] : out_off[i + 1]] for i in range(s.num_nodes)]


# -- text format ----------------------------------------------------------------------------


_fmt_weight = fmt_weight


def graph_to_text(g: Graph, summary: Optional[bool] = None) -> str:
    """The graph in GTN's text format (what ``print(g)`` and ``savetxt`` show).

    Args:
        g: the graph.
        summary: shorten the text to the first 10 start nodes, accept nodes and arcs
            (followed by ``...``). By default, as GTN's ``repr``, only graphs with more
            than 20 nodes or arcs are shortened.
    """
    return format_graph(_check(g, "g"), summary)


def _parse_ids(line: str, what: str, lineno: int, source: str) -> List[int]:
    fields = line.split()
    if not fields:
        raise ValueError(
            f"{source}: line {lineno}: must specify {what} node(s) (GTN's text format: line 1 "
            f"lists the start node ids, line 2 the accept node ids), got an empty line"
        )
    try:
        ids = [_int_field(f) for f in fields]
    except ValueError:
        raise ValueError(f"{source}: line {lineno}: {what} node ids must be integers, got {line!r}") from None
    if any(not 0 <= i < MAX_NODES for i in ids):
        raise ValueError(f"{source}: line {lineno}: {what} node ids must lie in [0, {MAX_NODES - 1}], got {line!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: line {lineno}: repeat {what} node detected in {line!r}")
    return ids


def _parse_lines(lines: Iterable[str], source: str) -> Graph:
    it = iter(lines)
    header = []
    for what in ("start", "accept"):
        try:
            header.append(next(it).rstrip("\r\n"))
        except StopIteration:
            raise ValueError(f"{source}: must specify {what} node(s): the text has no line {len(header) + 1}") from None
    start = _parse_ids(header[0], "start", 1, source)
    accept = _parse_ids(header[1], "accept", 2, source)
    max_node = max(start + accept)
    src: List[int] = []
    dst: List[int] = []
    il: List[int] = []
    ol: List[int] = []
    w: List[float] = []
    for lineno, raw in enumerate(it, start=3):
        line = raw.strip()
        if not line:
            continue  # blank lines (a trailing newline, say) carry no arc
        fields = line.split()
        if not 3 <= len(fields) <= 5:
            raise ValueError(
                f"{source}: line {lineno}: bad line for loading arc (expected 'src dst ilabel "
                f"[olabel [weight]]'), got {line!r}"
            )
        try:
            a, b, c = _int_field(fields[0]), _int_field(fields[1]), _int_field(fields[2])
            d = _int_field(fields[3]) if len(fields) > 3 else c
            e = _float_field(fields[4]) if len(fields) > 4 else 0.0
        except ValueError:
            raise ValueError(
                f"{source}: line {lineno}: bad line for loading arc (node ids and labels must be "
                f"integers, the weight a number), got {line!r}"
            ) from None
        if not (0 <= a < MAX_NODES and 0 <= b < MAX_NODES):
            raise ValueError(f"{source}: line {lineno}: node ids must lie in [0, {MAX_NODES - 1}], got {line!r}")
        if not (epsilon <= c <= MAX_NODES and epsilon <= d <= MAX_NODES):
            raise ValueError(
                f"{source}: line {lineno}: labels must be -1 (epsilon) or in [0, {MAX_NODES}], got {line!r}"
            )
        src.append(a)
        dst.append(b)
        il.append(c)
        ol.append(d)
        w.append(e)
        max_node = max(max_node, a, b)
    # Nodes are dense (ids 0..max): refuse to allocate many nodes that nothing names.
    if max_node + 1 > MAX_UNREFERENCED_NODES:
        named = len(set(start) | set(accept) | set(src) | set(dst))
        if max_node + 1 - named > MAX_UNREFERENCED_NODES:
            raise ValueError(
                f"{source}: node id {max_node} makes {max_node + 1} nodes of which only {named} are "
                f"named; at most {MAX_UNREFERENCED_NODES} nodes may be unused"
            )
    args = _validate_arrays(
        max_node + 1,
        start,
        accept,
        np.array(src, dtype=_INT),
        np.array(dst, dtype=_INT),
        np.array(il, dtype=_INT),
        np.array(ol, dtype=_INT),
        np.array(w, dtype=_FLOAT),
        source,
    )
    return Graph._from_arrays(*args)


def graph_from_text(text: str) -> Graph:
    """A graph from a string in GTN's text format (see the module docstring).

    Raises:
        ValueError: on malformed text; the message names the line and its content.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _parse_lines(text.splitlines(), "graph text")


def loadtxt(file_name, max_bytes: int = MAX_FILE_BYTES) -> Graph:
    """Loads a graph written in GTN's text format.

    Args:
        file_name: a path, or an open text file.
        max_bytes: the most characters read (:data:`MAX_FILE_BYTES` by default); longer input
            is refused without reading on.

    Raises:
        ValueError: on malformed text (the message names the line number and its
            content), and, as in GTN, when the file does not exist (then the error is
            also a ``FileNotFoundError``).
    """
    max_bytes = _check_limit(max_bytes, "loadtxt")
    if hasattr(file_name, "read"):
        source = getattr(file_name, "name", "graph file")
        return _parse_lines(_bounded_lines(file_name, source, max_bytes), source)
    path = os.fspath(file_name)
    try:
        with open_regular(path, "graph file", "r", encoding="utf-8") as f:
            return _parse_lines(_bounded_lines(f, repr(path), max_bytes), repr(path))
    except FileNotFoundError:
        raise GraphFileNotFoundError(f"Couldn't find graph file to load. {path!r}") from None


def savetxt(file_name, graph: Graph) -> None:
    """Saves a graph in GTN's text format (weights with six significant digits).

    Args:
        file_name: a path, or an open text file.
        graph: the graph.
    """
    text = graph_to_text(_check(graph, "graph"), summary=False)
    if hasattr(file_name, "write"):
        file_name.write(text)
        return
    with open(os.fspath(file_name), "w", encoding="utf-8") as f:
        f.write(text)


# -- binary format ------------------------------------------------------------------------------


def save(file_name, graph: Graph) -> None:
    """Saves a graph in GTN's binary format (exact: weights are stored as float32).

    The layout is GTN's, little-endian: four int32 (number of nodes, arcs, start and
    accept nodes), the start node ids, the accept node ids, four int32 per arc (source,
    destination, input label, output label), then the float32 weights. Files written by
    GTN's ``gtn.save`` load here and the other way round.

    Args:
        file_name: a path, or a file opened in binary mode.
        graph: the graph.
    """
    s = _check(graph, "graph")._s
    src, dst, il, ol = s.arrays()
    head = np.array([s.num_nodes, len(src), len(s.start_ids), len(s.accept_ids)], dtype="<i4")
    parts = [
        head,
        np.asarray(s.start_ids, dtype="<i4"),
        np.asarray(s.accept_ids, dtype="<i4"),
        np.stack([src, dst, il, ol], axis=1).astype("<i4").reshape(-1),
        graph._weights().astype("<f4"),
    ]
    data = b"".join(p.tobytes() for p in parts)
    if hasattr(file_name, "write"):
        file_name.write(data)
        return
    with open(os.fspath(file_name), "wb") as f:
        f.write(data)


def load(file_name, max_bytes: int = MAX_FILE_BYTES) -> Graph:
    """Loads a graph saved by :func:`save` (or by GTN's ``gtn.save``).

    Args:
        file_name: a path, or a file opened in binary mode.
        max_bytes: the most bytes read (:data:`MAX_FILE_BYTES` by default); a longer file is
            refused without reading on.

    Raises:
        ValueError: if the file is truncated or inconsistent (a node id out of range, a
            label below -1, more than ``MAX_UNREFERENCED_NODES`` nodes that nothing names),
            and, as in GTN, when it does not exist (then the error is also a
            ``FileNotFoundError``).
        TypeError: if ``file_name`` is a file opened in text mode.
    """
    max_bytes = _check_limit(max_bytes, "load")
    if hasattr(file_name, "read"):
        name = getattr(file_name, "name", "graph file")
        data = _read_bounded(file_name, repr(name), max_bytes)
    else:
        name = os.fspath(file_name)
        try:
            with open_regular(name, "graph file") as f:
                data = _read_bounded(f, repr(name), max_bytes)
        except FileNotFoundError:
            raise GraphFileNotFoundError(f"Couldn't find graph file to load. {name!r}") from None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name!r}: expected a file opened in binary mode, read {type(data).__name__}")
    ints = np.frombuffer(data, dtype="<i4", count=min(4, len(data) // 4))
    if len(ints) < 4:
        raise ValueError(f"{name!r}: not a graph file (shorter than its 16-byte header)")
    n_nodes, n_arcs, n_start, n_accept = (int(x) for x in ints)
    if min(n_nodes, n_arcs, n_start, n_accept) < 0:
        raise ValueError(f"{name!r}: not a graph file (negative counts in its header)")
    expected = 4 * (4 + n_start + n_accept + 4 * n_arcs) + 4 * n_arcs
    if len(data) != expected:
        raise ValueError(
            f"{name!r}: a graph file of {n_nodes} nodes and {n_arcs} arcs has {expected} bytes, got {len(data)}"
        )
    body = np.frombuffer(data, dtype="<i4", count=4 + n_start + n_accept + 4 * n_arcs)
    start = body[4 : 4 + n_start]
    accept = body[4 + n_start : 4 + n_start + n_accept]
    arcs = body[4 + n_start + n_accept :].reshape(n_arcs, 4)
    weights = np.frombuffer(data, dtype="<f4", offset=4 * len(body), count=n_arcs)
    ids = np.concatenate([start, accept, arcs[:, :2].reshape(-1)])
    if len(ids) and (ids.min() < 0 or ids.max() >= n_nodes):
        raise ValueError(f"{name!r}: a node id is outside 0..{n_nodes - 1}")
    if n_arcs and arcs[:, 2:].min() < epsilon:
        raise ValueError(f"{name!r}: a label is below -1 (epsilon)")
    if len(set(start.tolist())) != n_start or len(set(accept.tolist())) != n_accept:
        raise ValueError(f"{name!r}: repeated start or accept node ids")
    src, dst, ilabel, olabel = (arcs[:, k].astype(_INT) for k in range(4))
    args = _validate_arrays(
        n_nodes,
        start,
        accept,
        src,
        dst,
        ilabel,
        olabel,
        weights.astype(_FLOAT),
        repr(name),
        node_budget=True,
    )
    return Graph._from_arrays(*args)


# -- drawing ------------------------------------------------------------------------------------


def _symbol(symbols: Mapping[int, str], label: int, which: str) -> str:
    if label == epsilon:
        return _EPSILON_SYMBOL
    if not symbols:
        return str(label)
    try:
        return str(symbols[label])
    except KeyError:
        raise SymbolNotFoundError(f"{which} has no symbol for label {label}") from None


def dot_text(
    g: Graph, isymbols: Optional[Mapping[int, str]] = None, osymbols: Optional[Mapping[int, str]] = None
) -> str:
    """The graph in Graphviz DOT, as GTN's ``write_dot`` writes it.

    Start nodes are drawn bold (pen width 2), accept nodes as double circles; an arc
    reads ``ilabel/weight``, or ``ilabel:olabel/weight`` when ``osymbols`` is given;
    labels come from the symbol maps when given, epsilon shows as ``ε``.
    """
    _check(g, "g")
    isymbols = isymbols or {}
    osymbols = osymbols or {}
    s = g._s
    _, dst, il, ol = (a.tolist() for a in s.arrays())
    w = g._weights().tolist()
    out_off, out_arcs = (a.tolist() for a in s.csr()[2:])
    lines = [
        "digraph FST {",
        "  margin = 0;",
        "  rankdir = LR;",
        '  label = "";',
        "  center = 1;",
        '  ranksep = "0.4";',
        '  nodesep = "0.25";',
    ]

    def node(n: int) -> None:
        pen = "2.0" if s.start[n] else "1.0"
        shape = "doublecircle" if s.accept[n] else "circle"
        lines.append(f'  {n} [label = "{n}", shape = {shape}, penwidth = {pen}, fontsize = 14];')
        for a in out_arcs[out_off[n] : out_off[n + 1]]:
            text = _symbol(isymbols, il[a], "isymbols")
            if osymbols:
                text += ":" + _symbol(osymbols, ol[a], "osymbols")
            lines.append(f'  {n} -> {dst[a]} [label = "{text}/{_fmt_weight(w[a])}", fontsize = 14];')

    # Start nodes first and accept nodes last, which helps the layout (as in GTN).
    for n in s.start_ids:
        node(n)
    for n in range(s.num_nodes):
        if not s.start[n] and not s.accept[n]:
            node(n)
    for n in s.accept_ids:
        if not s.start[n]:
            node(n)
    return "\n".join(lines) + "\n}"


def write_dot(
    g: Graph, file_name, isymbols: Optional[Mapping[int, str]] = None, osymbols: Optional[Mapping[int, str]] = None
) -> None:
    """Writes the graph in Graphviz DOT format (see :func:`dot_text`).

    Args:
        g: the graph.
        file_name: where to write (``graph.dot``, say); render it with
            ``dot -Tpdf graph.dot -o graph.pdf`` or use :func:`draw`.
        isymbols: input label -> text. Without it labels are written as numbers.
        osymbols: output label -> text. Without it output labels are left out.

    Raises:
        RuntimeError: if the file cannot be opened (as GTN).
        KeyError: (also an ``IndexError``, as GTN's) a label missing from a symbol map.
    """
    text = dot_text(g, isymbols, osymbols)
    try:
        with open(os.fspath(file_name), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise RuntimeError(f"Could not open file [{os.fspath(file_name)}]: {err}") from err


def draw(
    g: Graph, file_name, isymbols: Optional[Mapping[int, str]] = None, osymbols: Optional[Mapping[int, str]] = None
) -> None:
    """Renders the graph with Graphviz; the format follows the extension of ``file_name``.

    ``draw(g, "graph.pdf")`` runs ``dot -Tpdf``, ``"graph.png"`` ``dot -Tpng`` and so on.

    Raises:
        RuntimeError: if Graphviz's ``dot`` program is not installed.
        ValueError: if ``file_name`` has no extension to choose the format from.
        subprocess.CalledProcessError: if ``dot`` fails.
    """
    path = os.fspath(file_name)
    ext = os.path.splitext(path)[1][1:]
    if not ext:
        raise ValueError(f"file_name={path!r} needs an extension naming the output format (.pdf, .png, .svg, ...)")
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(
            "gtn.draw needs Graphviz's 'dot' program, which was not found on PATH; install "
            "Graphviz (e.g. 'apt-get install graphviz', 'brew install graphviz' or "
            "'conda install graphviz'), or write DOT text with gtn.write_dot instead"
        )
    with tempfile.TemporaryDirectory() as tmp:
        dot_file = os.path.join(tmp, "graph.dot")
        write_dot(g, dot_file, isymbols, osymbols)
        subprocess.run([dot, "-T" + ext, dot_file, "-o", path], check=True)
