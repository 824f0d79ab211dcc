"""Topologies for LF-MMI: how emission classes (frames) spell token sequences.

A *topology* is a transducer whose input labels are emission classes (one per frame) and whose
output labels are token ids ``1..N`` or :data:`~lightning_gtn.wfst.epsilon` where a frame emits no
new token. Every arc consumes exactly one frame (no input epsilons), so composing a topology with
an epsilon-free acceptor over tokens (a target, or the token language model ``P``) gives an
epsilon-free acceptor over classes: what the LF-MMI numerator and denominator are.

The four topologies (``N`` tokens, ids ``1..N``):

``"ctc"``
    The CTC topology (icefall's ``ctc_topo``): blank is class 0, token ``k`` is class ``k``
    (``C = N + 1``). One node per class, all accepting, start at the blank node; reading class
    ``j`` from node ``i`` goes to node ``j`` and emits token ``j`` unless ``j`` is the blank or
    ``j == i`` (a repeat of the class is the same token). Two equal tokens in a row need a blank
    between them. ``(N + 1) ** 2`` arcs.
``"modified_ctc"``
    The modified CTC topology (k2's ``ctc_topo(modified=True)``): the same classes; a hub node
    (start, the only accepting node) loops on the blank and on every token (emitting it), and
    for each token ``k`` a node entered from the hub by ``k`` (emitting it) that loops on ``k``
    and returns to the hub on one more ``k``, both silent. A token covers one or more frames of
    its class, blanks are optional everywhere, also between two equal tokens (a run of ``k``
    frames may hold several tokens ``k``). ``4 N + 1`` arcs: linear in ``N``.
``"hmm1"``
    Kaldi chain's one-state HMM without blank: class ``k - 1`` is token ``k`` (``C = N``); a
    token covers one or more frames of its class. A start node and one node per token.
``"hmm2"``
    Kaldi chain's two-state HMM: token ``k`` owns classes ``2 (k - 1)`` (its first frame,
    entered once) and ``2 (k - 1) + 1`` (the optional frames after it, a self-loop)
    (``C = 2 N``). Every token starts with its own first class, so a class sequence spells at
    most one token sequence.

Topology arcs weigh 0 (as in Kaldi chain, which does not train transition probabilities).

For ``"ctc"`` and ``"hmm2"`` a class sequence spells at most one token sequence, by one path; for
``"modified_ctc"`` and ``"hmm1"`` a run of one class may hold one token or several equal ones, so
a class sequence may have several readings.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple, Optional

import numpy as np

from ..wfst import Graph, epsilon, intersect

__all__ = [
    "MMI_TOPOLOGIES",
    "TopologyArrays",
    "num_classes",
    "topology_arrays",
    "topology_graph",
    "compose_token_acceptor",
    "determinise_acceptor",
    "numerator_graph",
]

MMI_TOPOLOGIES = ("ctc", "modified_ctc", "hmm1", "hmm2")
"""The topology names :func:`topology_graph` knows."""

MAX_TOKENS = 1 << 16
"""The largest number of tokens a topology is built for (the ``"ctc"`` topology has
``(N + 1) ** 2`` arcs)."""


class TopologyArrays(NamedTuple):
    """A topology as arrays (see :func:`topology_arrays`).

    Attributes:
        num_nodes: the number of nodes.
        start: the start node (one).
        accept: ``(num_nodes,)`` bool, which nodes accept.
        src, dst: ``(E,)`` int64 arc ends.
        ilabel: ``(E,)`` int64 emission class of each arc, in ``[0, C)``.
        olabel: ``(E,)`` int64 token id ``1..N`` emitted, or ``epsilon`` (-1).
    """

    num_nodes: int
    start: int
    accept: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    ilabel: np.ndarray
    olabel: np.ndarray


def _check(num_tokens, topology) -> int:
    if isinstance(num_tokens, (bool, np.bool_)) or not isinstance(num_tokens, (int, np.integer)):
        raise ValueError(f"num_tokens must be an integer, got {type(num_tokens).__name__}")
    n = int(num_tokens)
    if not 1 <= n <= MAX_TOKENS:
        raise ValueError(f"num_tokens={n} must lie in [1, {MAX_TOKENS}]")
    if topology not in MMI_TOPOLOGIES:
        raise ValueError(f"topology must be one of {MMI_TOPOLOGIES}, got {topology!r}")
    return n


def num_classes(num_tokens: int, topology: str) -> int:
    """The number of emission classes ``C`` of ``topology`` for ``num_tokens`` tokens.

    ``N + 1`` for ``"ctc"`` and ``"modified_ctc"`` (blank 0), ``N`` for ``"hmm1"``, ``2 N`` for
    ``"hmm2"``.

    Example:
        >>> num_classes(3, "ctc"), num_classes(3, "hmm1"), num_classes(3, "hmm2")
        (4, 3, 6)
    """
    n = _check(num_tokens, topology)
    return {"ctc": n + 1, "modified_ctc": n + 1, "hmm1": n, "hmm2": 2 * n}[topology]


def topology_arrays(num_tokens: int, topology: str = "ctc") -> TopologyArrays:
    """The topology of :func:`topology_graph` as arrays (what the composition reads)."""
    n = _check(num_tokens, topology)
    k = np.arange(1, n + 1, dtype=np.int64)
    eps = np.full(n, epsilon, dtype=np.int64)
    if topology == "ctc":
        i = np.repeat(np.arange(n + 1, dtype=np.int64), n + 1)  # every (i, j) pair
        j = np.tile(np.arange(n + 1, dtype=np.int64), n + 1)
        ol = np.where((j == 0) | (j == i), epsilon, j)
        return TopologyArrays(n + 1, 0, np.ones(n + 1, dtype=bool), i, j, j.copy(), ol)
    if topology == "modified_ctc":
        zero = np.zeros(n, dtype=np.int64)
        src = np.concatenate([[0], zero, zero, k, k])
        dst = np.concatenate([[0], zero, k, k, zero])
        il = np.concatenate([[0], k, k, k, k])
        ol = np.concatenate([[epsilon], k, k, eps, eps])
        accept = np.zeros(n + 1, dtype=bool)
        accept[0] = True
        return TopologyArrays(n + 1, 0, accept, src, dst, il, ol)
    if topology == "hmm1":
        # node 0: start (nothing read yet); node k: inside token k (class k - 1)
        a, b = np.repeat(k, n), np.tile(k, n)  # every (token, next token) pair
        src = np.concatenate([np.zeros(n, dtype=np.int64), k, a])
        dst = np.concatenate([k, k, b])
        il = np.concatenate([k - 1, k - 1, b - 1])
        ol = np.concatenate([k, eps, b])
        return TopologyArrays(n + 1, 0, np.ones(n + 1, dtype=bool), src, dst, il, ol)
    # hmm2: node 0 start; node 2k - 1 = first state of token k (class 2(k-1)), node 2k = second
    first, second = 2 * k - 1, 2 * k
    a, b = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)  # token index pairs, 0..N-1
    src = np.concatenate([np.zeros(n, dtype=np.int64), first, second, first[a], second[a]])
    dst = np.concatenate([first, second, second, first[b], first[b]])
    il = np.concatenate([2 * (k - 1), 2 * k - 1, 2 * k - 1, 2 * b, 2 * b])
    ol = np.concatenate([k, eps, eps, b + 1, b + 1])
    return TopologyArrays(2 * n + 1, 0, np.ones(2 * n + 1, dtype=bool), src, dst, il, ol)


def topology_graph(num_tokens: int, topology: str = "ctc") -> Graph:
    """The topology as a transducer: input label = emission class, output label = token id
    ``1..N`` or ``wfst.epsilon`` where no token is emitted; weights 0 (module docstring).

    Args:
        num_tokens: the number of tokens ``N`` (ids ``1..N``).
        topology: one of :data:`MMI_TOPOLOGIES`.

    Returns:
        The topology graph; start node 0.

    Raises:
        ValueError: a bad ``num_tokens`` or ``topology``.

    Example:
        >>> g = topology_graph(2, "ctc")
        >>> g.num_nodes(), g.num_arcs()
        (3, 9)
        >>> topology_graph(2, "modified_ctc").num_arcs()
        9
    """
    t = topology_arrays(num_tokens, topology)
    accept = np.flatnonzero(t.accept)
    return Graph.from_arrays(t.num_nodes, [t.start], accept, t.src, t.dst, t.ilabel, t.olabel, None, calc_grad=False)


def _reach(num_nodes: int, seeds: np.ndarray, frm: np.ndarray, to: np.ndarray) -> np.ndarray:
    """Nodes reachable from ``seeds`` along arcs ``frm -> to`` (bool mask): a breadth-first
    search over a CSR of the arcs, each arc visited once (linear in nodes + arcs)."""
    order = np.argsort(frm, kind="stable")
    targets = to[order]
    off = np.searchsorted(frm[order], np.arange(num_nodes + 1), side="left")
    seen = np.zeros(num_nodes, dtype=bool)
    seen[seeds] = True
    frontier = np.flatnonzero(seen)
    while len(frontier):
        # the arcs leaving the frontier, gathered without a Python loop over nodes
        counts = off[frontier + 1] - off[frontier]
        firsts = np.repeat(off[frontier] - np.cumsum(counts) + counts, counts)
        nxt = targets[firsts + np.arange(int(counts.sum()))]
        nxt = np.unique(nxt[~seen[nxt]])
        seen[nxt] = True
        frontier = nxt
    return seen


def _trim(num_nodes: int, start: int, accept: np.ndarray, src: np.ndarray, dst: np.ndarray):
    """Which nodes lie on a path from ``start`` to an accepting node (bool mask)."""
    fwd = _reach(num_nodes, np.array([start], dtype=np.int64), src, dst)
    bwd = _reach(num_nodes, np.flatnonzero(accept), dst, src)
    return fwd & bwd


def compose_token_acceptor(
    num_tokens: int,
    topology: str,
    next_state: np.ndarray,
    logp: Optional[np.ndarray],
    start: int,
    accept: np.ndarray,
    final: Optional[np.ndarray] = None,
) -> Graph:
    """Composes a topology with a deterministic epsilon-free acceptor over tokens.

    The acceptor is given as dense tables: from state ``s`` token ``w`` (``1..N``) goes to
    ``next_state[s, w]`` (``-1``: no arc) with weight ``logp[s, w]``; column 0 is unused. The
    result is an epsilon-free acceptor over emission classes whose nodes are the reachable and
    co-reachable pairs (topology node, acceptor state), numbered in breadth-first order from the
    start pair (node 0); its arcs are sorted by source node then class. An arc that emits token
    ``w`` carries the acceptor's weight, the others weigh 0. Built level by level with numpy (no
    Python loop over arcs).

    Graphs have no final weights, so ``final`` (a log weight per acceptor state, e.g.
    ``ln P(</s> | h)``) is folded into the last frame: every arc entering an accepting node ``q``
    gets a copy into one new accepting node (the last node, no arcs out) weighing
    ``final[state of q]`` more, and that node is the only accepting one. Every path of ``T >= 1``
    frames then ends with its final weight; the arcs at most double.

    Args:
        num_tokens: ``N``.
        topology: one of :data:`MMI_TOPOLOGIES`.
        next_state: ``(S, N + 1)`` integer table, entries in ``[-1, S)``.
        logp: ``(S, N + 1)`` float table, or None for weights 0.
        start: the acceptor's start state.
        accept: ``(S,)`` bool, the acceptor's accepting states.
        final: optional ``(S,)`` float log final weights of the accepting states (see above).

    Returns:
        The composed acceptor (``calc_grad=False``).
    """
    t = topology_arrays(num_tokens, topology)
    nxt = np.asarray(next_state, dtype=np.int64)
    S = nxt.shape[0]
    if nxt.ndim != 2 or nxt.shape[1] != num_tokens + 1:
        raise ValueError(f"next_state must have shape (S, {num_tokens + 1}), got {nxt.shape}")
    if S and (nxt.min() < -1 or nxt.max() >= S):
        raise ValueError("next_state holds a state outside [-1, S)")
    if not 0 <= int(start) < S:
        raise ValueError(f"start={start} outside [0, {S})")
    lp = None if logp is None else np.asarray(logp, dtype=np.float64)
    if lp is not None and lp.shape != nxt.shape:
        raise ValueError(f"logp must have shape {nxt.shape}, got {lp.shape}")
    acc = np.asarray(accept, dtype=bool)
    if acc.shape != (S,):
        raise ValueError(f"accept must have shape ({S},), got {acc.shape}")
    fin = None if final is None else np.asarray(final, dtype=np.float64)
    if fin is not None and fin.shape != (S,):
        raise ValueError(f"final must have shape ({S},), got {fin.shape}")

    order = np.argsort(t.src, kind="stable")
    t_src, t_dst, t_il, t_ol = t.src[order], t.dst[order], t.ilabel[order], t.olabel[order]
    t_off = np.zeros(t.num_nodes + 1, dtype=np.int64)
    np.add.at(t_off, t_src + 1, 1)
    t_off = np.cumsum(t_off)

    node_of = np.full(t.num_nodes * S, -1, dtype=np.int64)  # pair id -> node id
    first = t.start * S + int(start)
    node_of[first] = 0
    pairs = [np.array([first], dtype=np.int64)]
    frontier = pairs[0]
    num = 1
    a_src, a_dst, a_il, a_w = [], [], [], []
    while len(frontier):
        tn, pn = frontier // S, frontier % S
        cnt = t_off[tn + 1] - t_off[tn]
        rep = np.repeat(np.arange(len(frontier)), cnt)
        arc = np.repeat(t_off[tn] - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
        p = pn[rep]
        ol = t_ol[arc]
        emits = ol >= 0
        col = np.where(emits, ol, 0)
        p2 = np.where(emits, nxt[p, col], p)
        ok = p2 >= 0
        rep, arc, p, p2, emits, col = rep[ok], arc[ok], p[ok], p2[ok], emits[ok], col[ok]
        w = np.zeros(len(arc)) if lp is None else np.where(emits, lp[p, col], 0.0)
        dpair = t_dst[arc] * S + p2
        new = np.unique(dpair[node_of[dpair] < 0])
        node_of[new] = np.arange(num, num + len(new))
        num += len(new)
        pairs.append(new)
        a_src.append(node_of[frontier[rep]])
        a_dst.append(node_of[dpair])
        a_il.append(t_il[arc])
        a_w.append(w)
        frontier = new
    all_pairs = np.concatenate(pairs)
    src = np.concatenate(a_src)
    dst = np.concatenate(a_dst)
    il = np.concatenate(a_il)
    w = np.concatenate(a_w)
    node_accept = t.accept[all_pairs // S] & acc[all_pairs % S]
    keep = _trim(num, 0, node_accept, src, dst)
    if not keep[0]:
        # nothing accepted: a graph with a start node and no arcs
        return Graph.from_arrays(1, [0], [], [], [], [], calc_grad=False)
    new_id = np.cumsum(keep) - 1
    ka = keep[src] & keep[dst]
    src, dst, il, w = new_id[src[ka]], new_id[dst[ka]], il[ka], w[ka]
    num_nodes = int(keep.sum())
    accept_ids = np.flatnonzero(node_accept[keep])
    if fin is not None:
        node_final = np.full(num_nodes, -np.inf)
        node_final[accept_ids] = fin[all_pairs[keep][accept_ids] % S]
        into = np.isfinite(node_final[dst])  # the arcs that may end a path: copied into the new node
        extra_w = w[into] + node_final[dst[into]]
        src = np.concatenate([src, src[into]])
        dst = np.concatenate([dst, np.full(int(into.sum()), num_nodes, dtype=np.int64)])
        il = np.concatenate([il, il[into]])
        w = np.concatenate([w, extra_w])
        num_nodes += 1
        accept_ids = np.array([num_nodes - 1])
    o = np.lexsort((dst, il, src))
    return Graph.from_arrays(
        num_nodes, [0], accept_ids, src[o], dst[o], il[o], None, w[o].astype(np.float32), calc_grad=False
    )


@functools.lru_cache(maxsize=8)
def _arc_index(num_tokens: int, topology: str):
    """The topology's arcs by source node: ``(start, accept, silent, emitting)`` with
    ``silent[t] = [(class, dst)]`` and ``emitting[t] = {token: [(class, dst)]}``."""
    t = topology_arrays(num_tokens, topology)
    silent: list[list[tuple[int, int]]] = [[] for _ in range(t.num_nodes)]
    emitting: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(t.num_nodes)]
    for s, d, il, ol in zip(t.src.tolist(), t.dst.tolist(), t.ilabel.tolist(), t.olabel.tolist()):
        if ol < 0:
            silent[s].append((il, d))
        else:
            emitting[s].setdefault(ol, []).append((il, d))
    return t.start, t.accept.tolist(), silent, emitting


def _target_nfa(num_tokens: int, topology: str, y: list[int]):
    """The topology composed with the chain of ``y``, trimmed: ``(num_nodes, accept, arcs)``
    with ``arcs`` a list of ``(src, dst, class)``, node 0 the start (``num_nodes == 0``: empty).

    A breadth-first search over (topology node, tokens read) pairs: O(arcs) Python steps, since
    only the silent arcs and those emitting the next target token are followed."""
    start, t_accept, silent, emitting = _arc_index(num_tokens, topology)
    L = len(y)
    ids = {(start, 0): 0}
    order = [(start, 0)]
    arcs = []
    k = 0
    while k < len(order):
        t, i = order[k]
        moves = [(il, d, i) for il, d in silent[t]]
        if i < L:
            moves += [(il, d, i + 1) for il, d in emitting[t].get(y[i], ())]
        for il, d, j in moves:
            did = ids.get((d, j))
            if did is None:
                did = ids[(d, j)] = len(order)
                order.append((d, j))
            arcs.append((k, did, il))
        k += 1
    accept = [q for q, (t, i) in enumerate(order) if i == L and t_accept[t]]
    back: dict[int, list[int]] = {}
    for a_src, a_dst, _ in arcs:
        back.setdefault(a_dst, []).append(a_src)
    alive = set(accept)
    stack = list(accept)
    while stack:
        for q in back.get(stack.pop(), ()):
            if q not in alive:
                alive.add(q)
                stack.append(q)
    if 0 not in alive:
        return 0, [], []
    new = {q: r for r, q in enumerate(sorted(alive))}
    arcs = [(new[a], new[b], c) for a, b, c in arcs if a in alive and b in alive]
    return len(new), [new[q] for q in accept], arcs


def determinise_acceptor(
    num_nodes: int,
    accept: Sequence[int],
    arcs: Sequence[tuple[int, int, int]],
    *,
    eps_label: Optional[int] = None,
    max_states: Optional[int] = None,
    what: str = "",
) -> tuple[int, list[int], list[tuple[int, int, int]]]:
    """Subset construction from node 0 on an unweighted acceptor: one path per accepted label
    sequence.

    Args:
        num_nodes: nodes of the acceptor (ids ``0..num_nodes-1``, start node 0).
        accept: its accepting nodes.
        arcs: ``(src, dst, label)`` triples; arcs labelled ``eps_label`` (when not None) read
            nothing and are followed by epsilon closure.
        max_states: stop with a ValueError naming ``what`` beyond this many subset states
            (None: no bound; numerators of targets are small and left to right).

    Returns:
        ``(num_states, accept, arcs)`` of the deterministic acceptor, arcs as ``(src, dst, label)``.
    """
    out: list[dict[int, list[int]]] = [{} for _ in range(num_nodes)]
    eps: list[list[int]] = [[] for _ in range(num_nodes)]
    for s, d, lab in arcs:
        if eps_label is not None and lab == eps_label:
            eps[s].append(d)
        else:
            out[s].setdefault(lab, []).append(d)

    def closure(nodes) -> frozenset:
        seen = set(nodes)
        stack = list(nodes)
        while stack:
            for d in eps[stack.pop()]:
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return frozenset(seen)

    acc = set(int(x) for x in accept)
    first = closure([0])
    ids = {first: 0}
    todo = [first]
    new_arcs: list[tuple[int, int, int]] = []
    new_accept: list[int] = []
    while todo:
        cur = todo.pop()
        cid = ids[cur]
        if cur & acc:
            new_accept.append(cid)
        moves: dict[int, set] = {}
        for s in cur:
            for lab, ds in out[s].items():
                moves.setdefault(lab, set()).update(ds)
        for lab in sorted(moves):
            nxt = closure(moves[lab])
            if nxt not in ids:
                if max_states is not None and len(ids) >= max_states:
                    raise ValueError(f"the determinised {what} acceptor has more than {max_states} states")
                ids[nxt] = len(ids)
                todo.append(nxt)
            new_arcs.append((cid, ids[nxt], lab))
    return len(ids), sorted(new_accept), new_arcs


def numerator_graph(
    target: Sequence[int],
    num_tokens: int,
    topology: str = "ctc",
    denominator: Optional[Graph] = None,
) -> Graph:
    """The numerator of one target: an epsilon-free acceptor over emission classes whose paths
    are the alignments of ``target`` in ``topology``, one path per class sequence.

    Without ``denominator`` every arc weighs 0 (for ``"ctc"`` it accepts the same class
    sequences as ``wfst.criterion.ctc_graph(target, 0)``). With ``denominator`` (a graph of
    :func:`lightning_gtn.lm.denominator.denominator_graph` for the same topology), the result is
    ``intersect(numerator, denominator)``: each alignment ``x`` then weighs what the denominator
    gives ``x``, so ``log Z_num <= log Z_den`` always. For ``"ctc"`` and ``"hmm2"`` that weight is
    exactly ``log P(target)`` (a class sequence spells one token sequence), as icefall's compiler
    gives; for ``"modified_ctc"`` and ``"hmm1"`` it is the sum of ``P`` over the readings of
    ``x`` (Kaldi chain's numerator composed with its normalisation FST does the same).

    Args:
        target: token ids in ``1..N`` (no blank); may be empty.
        num_tokens: ``N``.
        topology: one of :data:`MMI_TOPOLOGIES`.
        denominator: optional denominator acceptor over the same classes.

    Returns:
        The numerator acceptor (``calc_grad=False``).

    Raises:
        ValueError: a target id outside ``1..N``, a bad topology, or a denominator that is not
            a ``Graph``.

    Example:
        >>> g = numerator_graph([1, 2], 2, "ctc")
        >>> g.num_nodes(), g.num_arcs()
        (5, 10)
    """
    n = _check(num_tokens, topology)
    try:
        y = [int(v) for v in target]
    except (TypeError, ValueError):
        raise ValueError("target must be a sequence of integer token ids") from None
    for v in y:
        if not 1 <= v <= n:
            raise ValueError(f"target holds {v}, outside the token ids [1, {n}]")
    num, accept, arcs = _target_nfa(n, topology, y)
    if num == 0:
        g = Graph.from_arrays(1, [0], [], [], [], [], calc_grad=False)
    else:
        if topology in ("modified_ctc", "hmm1"):
            num, accept, arcs = determinise_acceptor(num, accept, arcs)
        arcs.sort(key=lambda a: (a[0], a[2], a[1]))  # by node, then class
        src, dst, lab = zip(*arcs) if arcs else ((), (), ())
        g = Graph.from_arrays(num, [0], accept, src, dst, lab, calc_grad=False)
    if denominator is None:
        return g
    if not isinstance(denominator, Graph):
        raise ValueError(f"denominator must be a lightning_gtn.wfst.Graph, got {type(denominator).__name__}")
    out = intersect(g, denominator)
    out.calc_grad = False
    return out
