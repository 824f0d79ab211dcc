"""OpenFST interop: the AT&T text format (``fstcompile``/``fstprint``), symbol tables, and
``pywrapfst`` objects when that package is importable.

The text format, one item per line, fields separated by spaces or tabs::

    src dst ilabel olabel [weight]     an arc of a transducer
    src dst label [weight]             an arc of an acceptor
    state [weight]                     a final state

The source of the first line is the start state. Labels are integers, or symbols when a symbol
table is given (``symbol id`` lines; id 0 is epsilon, ``<eps>`` by convention).

Conventions of the conversion (both directions, so they round-trip):

* **Labels**: OpenFST reserves 0 for epsilon, the engine uses -1 and numbers real labels from
  0. An OpenFST label ``k`` is the engine label ``k - 1`` (0 -> ``epsilon``); so a CTC graph with
  blank 0 is written with blank as OpenFST label 1. Symbol tables keep OpenFST's ids: the engine
  label of symbol ``s`` is ``table[s] - 1``.
* **Weights**: OpenFST's tropical and log weights are costs (``-log``), the engine's are scores
  (``+log``): every weight is negated. A missing weight is cost 0. Cost ``Infinity`` (OpenFST's
  semiring zero) is score ``-inf`` on an arc and "not final" on a final line; NaN and
  ``-Infinity`` are errors.
* **Final weights**: the engine's accept nodes have no weight. A final state with cost 0
  becomes an accept node; one with any other cost gets an epsilon arc (score = -cost) to one
  extra accept node added after the others.
* **Start**: OpenFST has one start state; writing a graph with several start nodes adds a new
  start state with epsilon arcs of score 0 to them. A graph without start node is written as
  empty text (OpenFST's empty FST), which reads back as a graph without nodes.

Untrusted input: the text size is bounded (``max_bytes``), state ids are bounded
(``max_states``, and at most ``MAX_UNREFERENCED_NODES`` ids below the largest may go unnamed) and
every error is a ``ValueError`` naming the line number.
"""

from __future__ import annotations

import array
import io
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Optional, Union

import numpy as np

from .graph import MAX_UNREFERENCED_NODES, Graph, epsilon

__all__ = [
    "read_fst_text",
    "write_fst_text",
    "read_symbols",
    "write_symbols",
    "to_pywrapfst",
    "from_pywrapfst",
]

MAX_LINE = 1 << 16
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_STATES = 1 << 26
MAX_LABEL = 2**31 - 2  # engine labels are int32: OpenFST label k -> k - 1

Symbols = Union[Mapping[str, int], Sequence[str]]


# -- helpers --------------------------------------------------------------------------------------


class FstFileNotFoundError(FileNotFoundError, ValueError):
    """A path given to an OpenFST reader names no regular file."""


_PATHLIKE = re.compile(r"[\\/]|\.[A-Za-z_]")


def _looks_like_path(s: str) -> bool:
    return "\n" not in s and not any(c.isspace() for c in s) and bool(_PATHLIKE.search(s))


def _read_text(path_or_text, max_bytes: int, what: str) -> str:
    """The text of a path, an open file, or the text itself. A str names a file when it is one,
    or when it looks like a path (one line without white space, with a ``/`` or a file
    extension: ``missing.syms``), and then a missing file is an error, never parsed as text; any
    other str is the text itself."""
    if hasattr(path_or_text, "read"):
        text = path_or_text.read(max_bytes + 1)
    elif isinstance(path_or_text, (str, os.PathLike)):
        s = path_or_text
        if isinstance(s, str) and not os.path.isfile(s) and not _looks_like_path(s):
            text = s
        else:
            p = os.fspath(s)
            if not os.path.isfile(p):
                what_is = "not a regular file" if os.path.exists(p) else "no such file"
                raise FstFileNotFoundError(f"{what} {p!r}: {what_is}")
            size = os.path.getsize(p)
            if size > max_bytes:
                raise ValueError(f"{what} {p!r}: {size} bytes, over max_bytes={max_bytes}")
            with open(p, "r", encoding="utf-8") as f:
                text = f.read(max_bytes + 1)
    else:
        raise TypeError(f"{what} must be a path, an open text file or the text, got {type(path_or_text).__name__}")
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if len(text) > max_bytes:
        raise ValueError(f"{what}: over max_bytes={max_bytes}")
    return text


def _write(text: str, path) -> None:
    if path is None:
        return
    if hasattr(path, "write"):
        path.write(text)
    else:
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(text)


# the formats' own numbers, ASCII only (Python's int() and float() also read '1_0', '٥')
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _int(s: str, no: int, what: str, low: int, high: int) -> int:
    if not _INT_RE.fullmatch(s):
        raise ValueError(f"FST text line {no}: {what} {s[:40]!r} is not an integer")
    x = int(s)
    if not low <= x <= high:
        raise ValueError(f"FST text line {no}: {what} {x} outside [{low}, {high}]")
    return x


def _cost(s: str, no: int) -> float:
    t = s.lower()
    if t in ("infinity", "inf", "+inf", "+infinity"):
        return math.inf
    if t in ("-infinity", "-inf"):
        raise ValueError(f"FST text line {no}: weight {s[:40]!r} must be a number or Infinity")
    if not _FLOAT_RE.fullmatch(s):
        raise ValueError(f"FST text line {no}: weight {s[:40]!r} is not a number")
    x = float(s)
    # weights are float32: a cost beyond its range is the literal infinity it rounds to
    if x > _FLOAT32_MAX:
        return math.inf
    if x < -_FLOAT32_MAX:
        raise ValueError(
            f"FST text line {no}: weight {s[:40]!r} is below float32's range (a cost of "
            "-Infinity, which OpenFST's semirings do not have)"
        )
    return x


def _symbol_map(symbols: Optional[Symbols], name: str) -> Optional[dict[str, int]]:
    if symbols is None:
        return None
    if isinstance(symbols, Mapping):
        out = {}
        for k, v in symbols.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name}: a symbol table maps str to int, got {k!r}: {v!r}")
            if not 0 <= int(v) <= MAX_LABEL + 1:
                raise ValueError(f"{name}: id {v} of {k!r} outside [0, {MAX_LABEL + 1}]")
            out[k] = int(v)
        return out
    if isinstance(symbols, Sequence) and not isinstance(symbols, str):
        if not all(isinstance(s, str) for s in symbols):
            raise ValueError(f"{name}: a symbol list must hold str")
        return {s: i for i, s in enumerate(symbols)}
    raise ValueError(f"{name} must be a dict symbol -> id, a list of symbols, or None")


def _inverse(table: dict[str, int], name: str) -> dict[int, str]:
    inv: dict[int, str] = {}
    for s, i in table.items():
        if any(c.isspace() for c in s) or not s:
            raise ValueError(f"{name}: symbol {s!r} is empty or holds white space")
        inv.setdefault(i, s)
    return inv


# -- symbol tables --------------------------------------------------------------------------------


def read_symbols(path_or_text, *, max_bytes: int = 1 << 28) -> dict[str, int]:
    """Reads an OpenFST symbol table (``symbol id`` per line).

    Args:
        path_or_text: a path, an open text file, or the text itself.
        max_bytes: refuse larger input.

    Returns:
        ``{symbol: id}`` in file order; several symbols may share an id.

    Raises:
        ValueError: a line without exactly two fields, a bad or negative id, a symbol given
            twice; the message names the line number.

    Example:
        >>> read_symbols("<eps> 0\\na 1\\nb 2\\n")
        {'<eps>': 0, 'a': 1, 'b': 2}
    """
    text = _read_text(path_or_text, max_bytes, "symbol table")
    out: dict[str, int] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        if len(line) > MAX_LINE:
            raise ValueError(f"symbol table line {no}: longer than {MAX_LINE} characters")
        f = line.split()
        if not f:
            continue
        if len(f) != 2:
            raise ValueError(f"symbol table line {no}: expected 'symbol id', got {line[:60]!r}")
        if not _INT_RE.fullmatch(f[1]):
            raise ValueError(f"symbol table line {no}: id {f[1][:40]!r} is not an integer")
        i = int(f[1])
        if not 0 <= i <= MAX_LABEL + 1:
            raise ValueError(f"symbol table line {no}: id {i} outside [0, {MAX_LABEL + 1}]")
        if f[0] in out:
            raise ValueError(f"symbol table line {no}: symbol {f[0][:40]!r} given twice")
        out[f[0]] = i
    return out


def write_symbols(symbols: Symbols, path=None) -> str:
    """Writes a symbol table (``symbol<TAB>id`` lines, ids ascending) and returns the text.

    Args:
        symbols: ``{symbol: id}``, or a list whose index is the id (``["<eps>", "a", ...]``).
        path: a file path, an open text file, or None.

    Example:
        >>> write_symbols(["<eps>", "a"])
        '<eps>\\t0\\na\\t1\\n'
    """
    table = _symbol_map(symbols, "symbols")
    if table is None:
        raise ValueError("symbols: a symbol table (mapping or list) is required, got None")
    _inverse(table, "symbols")
    text = "".join(f"{s}\t{i}\n" for s, i in sorted(table.items(), key=lambda kv: (kv[1], kv[0])))
    _write(text, path)
    return text


# -- FST text -------------------------------------------------------------------------------------


def read_fst_text(
    path_or_text,
    isymbols: Optional[Symbols] = None,
    osymbols: Optional[Symbols] = None,
    acceptor: Optional[bool] = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_states: int = DEFAULT_MAX_STATES,
    calc_grad: bool = True,
):
    """Reads an FST in OpenFST's text format (conventions in the module docstring).

    Args:
        path_or_text: a path, an open text file, or the text itself (a str with a newline, or
            one that names no file).
        isymbols: input symbol table (``{symbol: id}``, a list of symbols, or a path / text
            read with :func:`read_symbols`); then input labels are symbols. None: integers.
        osymbols: the same for output labels; for an acceptor it defaults to ``isymbols``.
        acceptor: True: arcs have 3 or 4 fields (``src dst label [weight]``); False: 4 or 5
            (``src dst ilabel olabel [weight]``); None: acceptor if some arc line has 3 fields,
            transducer otherwise (a file mixing 3- and 5-field lines is an error).
        max_bytes: refuse larger input.
        max_states: refuse state ids at or above this.
        calc_grad: passed to the graph.

    Returns:
        ``(graph, isymbols, osymbols)``: the :class:`Graph` (labels = OpenFST ids - 1, weights
        = -costs) and the symbol tables used (``{symbol: id}`` or None).

    Raises:
        ValueError: malformed text (wrong field counts, bad numbers, unknown symbols, ids out
            of range, too large input); the message names the line number.

    Example:
        >>> g, _, _ = read_fst_text("0 1 1 2 0.5\\n1\\n")
        >>> g.labels_to_list(), g.labels_to_list(False), g.weights_to_list(), g.accept()
        ([0], [1], [-0.5], [1])
    """
    if isinstance(max_states, bool) or not isinstance(max_states, int) or not 1 <= max_states < 2**31:
        raise ValueError("max_states must be an int in [1, 2**31)")
    isym = isymbols if isymbols is None or isinstance(isymbols, (Mapping, list, tuple)) else read_symbols(isymbols)
    osym = osymbols if osymbols is None or isinstance(osymbols, (Mapping, list, tuple)) else read_symbols(osymbols)
    imap = _symbol_map(isym, "isymbols")
    omap = _symbol_map(osym, "osymbols")
    text = _read_text(path_or_text, max_bytes, "FST text")

    def rows():
        # one line at a time (no list of all lines: the text may be large)
        for no, line in enumerate(io.StringIO(text), start=1):
            if len(line) > MAX_LINE:
                raise ValueError(f"FST text line {no}: longer than {MAX_LINE} characters")
            f = line.split()
            if not f:
                continue
            if len(f) > 5:
                raise ValueError(f"FST text line {no}: at most 5 fields, got {len(f)}")
            yield no, f

    n3 = n5 = 0
    if acceptor is None:  # a first pass decides
        for _, f in rows():
            n3 += len(f) == 3
            n5 += len(f) == 5
    if acceptor is None:
        if n3 and n5:
            raise ValueError("FST text: lines with 3 fields (acceptor arcs) and 5 fields (transducer arcs) mixed")
        acceptor = n3 > 0
    if acceptor and omap is None:
        omap = imap
    arc_fields = (3, 4) if acceptor else (4, 5)

    def label(s: str, no: int, table: Optional[dict], what: str) -> int:
        if table is None:
            return _int(s, no, what, 0, MAX_LABEL + 1) - 1
        if s not in table:
            raise ValueError(f"FST text line {no}: {what} {s[:40]!r} is not in the symbol table")
        return table[s] - 1

    # compact int32/float32 buffers rather than lists of Python objects
    src, dst, il, ol = (array.array("i") for _ in range(4))
    w = array.array("f")
    finals: dict[int, float] = {}
    start = -1
    max_id = -1
    for no, f in rows():
        s = _int(f[0], no, "state", 0, max_states - 1)
        if start < 0:
            start = s
        max_id = max(max_id, s)
        if len(f) <= 2:
            cost = _cost(f[1], no) if len(f) == 2 else 0.0
            if s in finals:
                raise ValueError(f"FST text line {no}: state {s} is made final twice")
            finals[s] = cost
            continue
        if len(f) not in arc_fields:
            kind = "an acceptor" if acceptor else "a transducer"
            raise ValueError(
                f"FST text line {no}: an arc of {kind} has {arc_fields[0]} or {arc_fields[1]} fields, got {len(f)}"
            )
        d = _int(f[1], no, "state", 0, max_states - 1)
        max_id = max(max_id, d)
        a = label(f[2], no, imap, "input label")
        if acceptor:
            b = label(f[2], no, omap, "output label") if omap is not imap else a
            wi = 3
        else:
            b = label(f[3], no, omap, "output label")
            wi = 4
        cost = _cost(f[wi], no) if len(f) > wi else 0.0
        src.append(s)
        dst.append(d)
        il.append(a)
        ol.append(b)
        w.append(0.0 - cost)  # 0.0 - 0.0 is +0.0
    if start < 0:
        g = Graph.from_arrays(0, [], [], [], [], [], [], [], calc_grad=calc_grad)
        return g, imap, omap
    num_nodes = max_id + 1
    named = len(
        np.union1d(
            np.union1d(np.frombuffer(src, np.int32), np.frombuffer(dst, np.int32)),
            np.fromiter(finals, np.int64, len(finals)),
        )
    )
    if num_nodes - named > MAX_UNREFERENCED_NODES:
        # each node costs memory named or not: a few bytes must not allocate gigabytes
        raise ValueError(
            f"FST text: state ids up to {max_id} but only {named} states are named; at most "
            f"{MAX_UNREFERENCED_NODES} ids may be left unused"
        )
    accept = sorted(s for s, c in finals.items() if c == 0.0)
    weighted = sorted(s for s, c in finals.items() if c != 0.0 and c != math.inf)
    if weighted:
        sink = num_nodes
        if sink >= max_states:
            raise ValueError(f"FST text: the extra accept state would exceed max_states={max_states}")
        num_nodes += 1
        for s in weighted:
            src.append(s)
            dst.append(sink)
            il.append(epsilon)
            ol.append(epsilon)
            w.append(-finals[s])
        accept.append(sink)
    g = Graph.from_arrays(
        num_nodes,
        [start],
        accept,
        np.frombuffer(src, dtype=np.int32),
        np.frombuffer(dst, dtype=np.int32),
        np.frombuffer(il, dtype=np.int32),
        np.frombuffer(ol, dtype=np.int32),
        np.frombuffer(w, dtype=np.float32).copy(),
        calc_grad=calc_grad,
    )
    return g, imap, omap


def _fmt_cost(score: float) -> str:
    if score == -math.inf:
        return "Infinity"
    c = -float(score)
    s = "%.9g" % c
    return "0" if s == "-0" else s


def write_fst_text(
    graph: Graph,
    path=None,
    isymbols: Optional[Symbols] = None,
    osymbols: Optional[Symbols] = None,
    *,
    acceptor: bool = False,
) -> str:
    """Writes a graph in OpenFST's text format (``fstprint``'s layout) and returns the text.

    States keep the graph's node ids, the start state's lines come first, then the other
    states in id order; per state its arcs, then its final line. Weights are written as costs
    (``-score``, 9 significant digits, omitted when 0), labels as OpenFST ids (engine label
    + 1) or, with symbol tables, as symbols.

    Args:
        graph: the graph (several start nodes: a new start state is added, see the module
            docstring; none: the text is empty).
        path: a file path, an open text file, or None.
        isymbols: input symbol table (``{symbol: id}`` or a list of symbols), or None.
        osymbols: output symbol table, or None (for an acceptor, ``isymbols``).
        acceptor: write 3/4-field arc lines; every arc must then have equal labels.

    Returns:
        The text.

    Raises:
        ValueError: a label without a symbol, a NaN or ``+inf`` weight, or ``acceptor=True``
            with an arc whose input and output labels differ.

    Example:
        >>> import lightning_gtn.wfst as gtn
        >>> g = gtn.Graph()
        >>> g.add_node(True), g.add_node(False, True), g.add_arc(0, 1, 0, 1, 0.5)
        (0, 1, 0)
        >>> write_fst_text(g)
        '0\\t1\\t1\\t2\\t-0.5\\n1\\n'
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a Graph, got {type(graph).__name__}")
    a = graph.arrays()
    imap = _symbol_map(isymbols, "isymbols")
    omap = _symbol_map(osymbols, "osymbols")
    if acceptor and omap is None:
        omap = imap
    iinv = None if imap is None else _inverse(imap, "isymbols")
    oinv = None if omap is None else _inverse(omap, "osymbols")
    if np.isnan(a.weights).any() or (a.weights == np.inf).any():
        raise ValueError("write_fst_text: a weight is NaN or +inf (a cost of -inf), which OpenFST cannot read")
    if acceptor and np.any(a.ilabel != a.olabel):
        raise ValueError("write_fst_text: acceptor=True but an arc's input and output labels differ")
    starts = a.start.tolist()
    if not starts:
        _write("", path)
        return ""
    n = a.num_nodes
    src, dst, il, ol, w = (x.tolist() for x in (a.src, a.dst, a.ilabel, a.olabel, a.weights))
    out_arcs: list[list[int]] = [[] for _ in range(n + 1)]
    for k, s in enumerate(src):
        out_arcs[s].append(k)
    accept = set(a.accept.tolist())

    def lab(x: int, inv: Optional[dict], what: str) -> str:
        k = x + 1
        if inv is None:
            return str(k)
        if k not in inv:
            raise ValueError(f"write_fst_text: {what} {x} (OpenFST id {k}) has no symbol")
        return inv[k]

    lines: list[str] = []

    def arc_line(s: int, d: int, i: int, o: int, score: float) -> str:
        fields = [str(s), str(d), lab(i, iinv, "input label")]
        if not acceptor:
            fields.append(lab(o, oinv, "output label"))
        if score != 0.0:
            fields.append(_fmt_cost(score))
        return "\t".join(fields)

    if len(starts) == 1 and not out_arcs[starts[0]] and starts[0] not in accept:
        # a lone start state without arcs accepts nothing; any line written would make its
        # source the start state, so write OpenFST's empty FST (same language)
        _write("", path)
        return ""
    if len(starts) == 1:
        order = [starts[0]] + [s for s in range(n) if s != starts[0]]
    else:
        new = n
        for s in starts:
            lines.append(arc_line(new, s, epsilon, epsilon, 0.0))
        order = list(range(n))
    for s in order:
        for k in out_arcs[s]:
            lines.append(arc_line(s, dst[k], il[k], ol[k], w[k]))
        if s in accept:
            lines.append(str(s))
    text = "".join(line + "\n" for line in lines)
    _write(text, path)
    return text


# -- pywrapfst --------------------------------------------------------------------------------------


def _pywrapfst():
    try:
        import pywrapfst
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("to_pywrapfst/from_pywrapfst need pywrapfst (pip install pynini)") from e
    return pywrapfst


def to_pywrapfst(graph: Graph, isymbols: Optional[Symbols] = None, osymbols: Optional[Symbols] = None):
    """The graph as a ``pywrapfst.VectorFst`` (tropical weights), same conventions as
    :func:`write_fst_text` (labels + 1, costs = -scores, several starts -> a new start).

    Args:
        graph: the graph.
        isymbols: optional input symbol table attached to the FST.
        osymbols: optional output symbol table attached to the FST.

    Returns:
        A ``pywrapfst.VectorFst``; state ``i`` is node ``i``.
    """
    fst = _pywrapfst()
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a Graph, got {type(graph).__name__}")
    a = graph.arrays()
    f = fst.VectorFst()
    n = a.num_nodes
    for _ in range(n):
        f.add_state()
    one = fst.Weight.one(f.weight_type())
    starts = a.start.tolist()
    if len(starts) == 1:
        f.set_start(starts[0])
    elif starts:
        s0 = f.add_state()
        f.set_start(s0)
        for s in starts:
            f.add_arc(s0, fst.Arc(0, 0, one, s))
    for s, d, i, o, w in zip(a.src.tolist(), a.dst.tolist(), a.ilabel.tolist(), a.olabel.tolist(), a.weights.tolist()):
        weight = fst.Weight(f.weight_type(), "Infinity" if w == -math.inf else repr(-float(w)))
        f.add_arc(s, fst.Arc(i + 1, o + 1, weight, d))
    for s in a.accept.tolist():
        f.set_final(s, one)
    for table, setter in ((isymbols, f.set_input_symbols), (osymbols, f.set_output_symbols)):
        t = _symbol_map(table, "symbols")
        if t is not None:
            st = fst.SymbolTable()
            for sym, i in sorted(t.items(), key=lambda kv: kv[1]):
                st.add_symbol(sym, i)
            setter(st)
    return f


def from_pywrapfst(f, *, calc_grad: bool = True) -> Graph:
    """A graph from a ``pywrapfst`` FST (tropical or log weights), same conventions as
    :func:`read_fst_text` (labels - 1, scores = -costs, weighted finals -> epsilon arcs to an
    extra accept node).

    Args:
        f: a ``pywrapfst.Fst`` (``pynini.Fst`` too).
        calc_grad: passed to the graph.
    """
    fst = _pywrapfst()
    if not isinstance(f, fst.Fst):
        raise TypeError(f"f must be a pywrapfst.Fst, got {type(f).__name__}")
    src: list[int] = []
    dst: list[int] = []
    il: list[int] = []
    ol: list[int] = []
    w: list[float] = []
    n = f.num_states()
    accept: list[int] = []
    weighted: list[tuple[int, float]] = []
    for s in f.states():
        for arc in f.arcs(s):
            src.append(s)
            dst.append(arc.nextstate)
            il.append(arc.ilabel - 1)
            ol.append(arc.olabel - 1)
            w.append(-_weight_value(arc.weight))
        c = _weight_value(f.final(s))
        if c == 0.0:
            accept.append(s)
        elif c != math.inf:
            weighted.append((s, c))
    start = f.start()
    if start < 0:
        return Graph.from_arrays(0, [], [], [], [], [], [], [], calc_grad=calc_grad)
    if weighted:
        sink = n
        n += 1
        for s, c in weighted:
            src.append(s)
            dst.append(sink)
            il.append(epsilon)
            ol.append(epsilon)
            w.append(-c)
        accept.append(sink)
    return Graph.from_arrays(n, [start], accept, src, dst, il, ol, np.asarray(w, dtype=np.float32), calc_grad=calc_grad)


def _weight_value(weight) -> float:
    s = weight.to_string()
    s = s.decode() if isinstance(s, bytes) else s
    if s.lower() in ("infinity", "inf"):
        return math.inf
    x = float(s)
    if math.isnan(x):
        raise ValueError("from_pywrapfst: a NaN weight")
    return x
