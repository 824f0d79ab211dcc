"""GTN's text form of a graph, shared by ``Graph.__repr__`` and :mod:`.utils`.

This module imports nothing from the rest of the engine, so :mod:`.graph` and
:mod:`.utils` can both use it without importing each other.
"""

from __future__ import annotations

from typing import List, Optional

SUMMARY_THRESHOLD = 20  # repr of a graph with more nodes or arcs is shortened ...
SUMMARY_ITEMS = 10  # ... to this many start ids, accept ids and arcs


def fmt_weight(w: float) -> str:
    """A weight as C++ streams print it (six significant digits, like printf's ``%g``)."""
    return "%g" % w


def format_graph(g, summary: Optional[bool] = None) -> str:
    """The text of a :class:`~lightning_gtn.wfst.Graph` (see ``utils.graph_to_text``).

    Args:
        g: the graph (not type-checked here).
        summary: shorten to the first 10 start nodes, accept nodes and arcs; by default
            only graphs with more than 20 nodes or arcs are shortened.
    """
    s = g._s
    n_arcs = s.num_arcs()
    if summary is None:
        summary = max(n_arcs, s.num_nodes) > SUMMARY_THRESHOLD
    limit = SUMMARY_ITEMS if summary else None

    def id_line(ids: List[int]) -> str:
        if limit is not None and len(ids) > limit:
            return " ".join(map(str, ids[:limit])) + " ..."
        return " ".join(map(str, ids))

    lines = [id_line(s.start_ids), id_line(s.accept_ids)]
    k = n_arcs if limit is None else min(n_arcs, limit)
    src, dst, il, ol = (a[:k].tolist() for a in s.arrays())
    w = g._weights()[:k].tolist() if g._w is not None else [0.0] * k
    lines.extend(f"{a} {b} {c} {d} {fmt_weight(e)}" for a, b, c, d, e in zip(src, dst, il, ol, w))
    if k < n_arcs:
        lines.append("...")
    return "\n".join(lines) + "\n"
