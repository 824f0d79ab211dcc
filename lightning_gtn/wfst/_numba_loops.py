"""Compiled inner loops of the engine's heavy operations (numba).

Everything that touches each node or arc of a graph lives here: adjacency lists, the
composition of two graphs (GTN's algorithm, with its three arc matchers), ``remove``,
and the forward / Viterbi dynamic programmes with their backward passes.

Conventions: node and arc ids are int32; product states of a composition
``(n1, n2, follow)`` are indexed by int64 (``follow`` is 0 for a plain state, 1 while
following epsilon arcs of the first graph, 2 while following those of the second);
scores of the dynamic programmes are float64, weights and gradients float32. All
kernels use ``cache=True`` (compiled once per machine, then loaded from the cache) and
``nogil=True`` (so ``parallel_for`` threads run them concurrently).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.typed import Dict

EPS = -1  # gtn.epsilon

# Matchers (how a composition pairs the arcs of two nodes with equal labels).
UNSORTED = 0  # nested loops
SEARCH_FIRST = 1  # only the first graph's arcs are sorted: binary search in them
SEARCH_SECOND = 2  # only the second graph's arcs are sorted: binary search in them
DOUBLY = 3  # both sorted: search the longer list, the lower bound only moves forward

# A composition indexes its product states densely (an int32 per state, as GTN does)
# while there are at most this many of them (fewer for small graphs, see
# ``_compose._dense_limit``), and with a hash map beyond.
DENSE_STATES = 1 << 25

_UNSEEN = -1  # state store value of a state without a node yet

# How many output arcs a composition reserves room for up front (16 bytes each, address
# space only until used); it grows past this when needed.
ARC_RESERVE = 1 << 24


# -- adjacency -------------------------------------------------------------------


@njit(cache=True, nogil=True)
def csr(num_nodes, src, dst):
    """In and out arc lists per node, each in arc-id order (a counting sort).

    Returns ``(in_offsets, in_arcs, out_offsets, out_arcs)``: int32 arrays of sizes
    ``N + 1``, ``E``, ``N + 1``, ``E``.
    """
    n_arcs = src.shape[0]
    in_off = np.zeros(num_nodes + 1, dtype=np.int32)
    out_off = np.zeros(num_nodes + 1, dtype=np.int32)
    for a in range(n_arcs):
        in_off[dst[a] + 1] += 1
        out_off[src[a] + 1] += 1
    for n in range(num_nodes):
        in_off[n + 1] += in_off[n]
        out_off[n + 1] += out_off[n]
    in_arcs = np.empty(n_arcs, dtype=np.int32)
    out_arcs = np.empty(n_arcs, dtype=np.int32)
    in_fill = in_off[:num_nodes].copy()
    out_fill = out_off[:num_nodes].copy()
    for a in range(n_arcs):
        d = dst[a]
        in_arcs[in_fill[d]] = a
        in_fill[d] += 1
        s = src[a]
        out_arcs[out_fill[s]] = a
        out_fill[s] += 1
    return in_off, in_arcs, out_off, out_arcs


@njit(cache=True, nogil=True)
def csr_grouped(num_nodes, src, dst):
    """:func:`csr` for arcs already grouped by source node in node order (out-lists are
    then consecutive arc ids)."""
    n_arcs = src.shape[0]
    in_off = np.zeros(num_nodes + 1, dtype=np.int32)
    out_off = np.zeros(num_nodes + 1, dtype=np.int32)
    for a in range(n_arcs):
        in_off[dst[a] + 1] += 1
        out_off[src[a] + 1] += 1
    for n in range(num_nodes):
        in_off[n + 1] += in_off[n]
        out_off[n + 1] += out_off[n]
    in_arcs = np.empty(n_arcs, dtype=np.int32)
    in_fill = in_off[:num_nodes].copy()
    for a in range(n_arcs):
        d = dst[a]
        in_arcs[in_fill[d]] = a
        in_fill[d] += 1
    out_arcs = np.arange(n_arcs).astype(np.int32)
    return in_off, in_arcs, out_off, out_arcs


# -- small helpers ------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _grow2(buf):
    """Doubles the capacity (second axis) of a 2-D buffer, keeping its contents."""
    out = np.empty((buf.shape[0], max(16, 2 * buf.shape[1])), dtype=buf.dtype)
    out[:, : buf.shape[1]] = buf
    return out


@njit(cache=True, nogil=True)
def _grow1(buf):
    out = np.empty(max(16, 2 * buf.shape[0]), dtype=buf.dtype)
    out[: buf.shape[0]] = buf
    return out


@njit(cache=True, nogil=True)
def lower_bound_table(num_nodes, off, arcs, lab):
    """Lower bounds by label for each node's arc list, when the lists really are sorted.

    Entry ``node * width + label + 1`` (labels ``-1..max``) is the position of the first
    arc of ``node`` whose label is not below ``label``: what ``std::lower_bound`` finds,
    in one load. Returns ``(table, width)``; ``width`` is 0 (no table: use binary search)
    when a list is out of order or the table would be much larger than the graph.
    """
    lo_all = off[0]
    hi_all = off[num_nodes]
    lmax = -1
    for p in range(lo_all, hi_all):
        if lab[arcs[p]] > lmax:
            lmax = lab[arcs[p]]
    width = lmax + 2
    empty = np.zeros(0, dtype=np.int32)
    if np.int64(num_nodes) * width > 4 * np.int64(hi_all - lo_all) + 4096:
        return empty, 0
    for v in range(num_nodes):
        for p in range(off[v] + 1, off[v + 1]):
            if lab[arcs[p]] < lab[arcs[p - 1]]:
                return empty, 0
    table = np.empty(num_nodes * width, dtype=np.int32)
    for v in range(num_nodes):
        p = off[v]
        hi = off[v + 1]
        base = v * width
        for k in range(width):
            while p < hi and lab[arcs[p]] < k - 1:
                p += 1
            table[base + k] = p
    return table, width


# -- composition --------------------------------------------------------------------
#
# The kernels see both graphs through combined arrays: arc ``i`` of the first graph is
# ``i`` and arc ``j`` of the second is ``E1 + j``; ``dst`` holds both graphs' ends, ``lab``
# the first graph's output labels then the second's input labels (the labels a
# composition matches), and the out-arc lists of the second graph follow the first's,
# with offsets shifted to match.


@njit(cache=True, nogil=True)
def compose(
    n1,
    dst1,
    ol1,
    out_off1,
    out_arcs1,
    start1,
    accept1,
    sorted1,
    tab1,
    w1,
    n2,
    dst2,
    il2,
    out_off2,
    out_arcs2,
    start2,
    accept2,
    sorted2,
    tab2,
    w2,
    kind,
    dense_limit,
):
    """GTN's composition of two graphs, producing the same nodes and arcs in the same order.

    ``sorted1`` says the first graph's arcs are sorted by output label and ``sorted2``
    that the second's are sorted by input label (epsilon arcs then come first, so the
    epsilon scans stop at the first other label). ``tab1``/``tab2`` are the
    :func:`lower_bound_table` of the side(s) the matcher searches (width ``w`` 0: binary
    search), made by the caller so that it can keep them with the graph.

    GTN first marks the product states that can reach a pair of accept nodes, then walks
    breadth-first from the pairs of start nodes creating a node for each such state in
    discovery order. For each state it takes the matched arc pairs in its matcher's order
    (epsilon-epsilon pairs only from plain states), then the first graph's epsilon arcs
    (unless following the second graph's), then the second's (unless following the
    first's): the three-state epsilon filter, which keeps one path per pair of paths.

    Here the breadth-first walk runs first, over every state it reaches (:func:`explore`),
    and :func:`trim` then drops the states that reach no accept pair. A dropped state never
    leads to a kept one, so the kept states keep GTN's discovery order and the kept arcs
    GTN's order: the result is GTN's, without a backward pass that matches arcs again. (This
    holds when the sorted flags are true; with arcs wrongly marked sorted, GTN's binary
    searches over in-arc lists in its first pass can miss other matches than over out-arc
    lists.)

    Product states are indexed densely up to ``dense_limit`` states (``DENSE_STATES``),
    through a hash map beyond.

    Returns ``(num_nodes, num_start, node_accept, src, dst, arc1, arc2)``: output nodes
    ``0..num_start-1`` are its start nodes; ``node_accept`` (uint8) flags accept nodes;
    output arc ``k`` came from arc ``arc1[k]`` of the first graph and ``arc2[k]`` of the
    second (-1 for none: an epsilon arc of the other graph).
    """
    num_nodes, num_start, node_acc, src, dst, arc1, arc2 = explore(
        n1,
        n2,
        dst1,
        ol1,
        out_off1,
        out_arcs1,
        dst2,
        il2,
        out_off2,
        out_arcs2,
        start1,
        start2,
        accept1,
        accept2,
        sorted1,
        sorted2,
        kind,
        tab1,
        w1,
        tab2,
        w2,
        dense_limit,
    )
    return trim(num_nodes, num_start, node_acc, src, dst, arc1, arc2)


@njit(cache=True, nogil=True)
def explore(
    n1,
    n2,
    dst1,
    lab1,
    off1,
    arcs1,
    dst2,
    lab2,
    off2,
    arcs2,
    start1,
    start2,
    accept1,
    accept2,
    sorted1,
    sorted2,
    kind,
    tab1,
    w1,
    tab2,
    w2,
    dense_limit,
):
    """Breadth-first walk of the product from the pairs of start nodes (see :func:`compose`).

    Product states ``(a, b, follow)`` map to node ids through a dense int32 array while
    there are at most ``dense_limit`` states, through a hash map beyond. The smaller
    graph's node varies fastest in the state index, so the states of one breadth-first
    wave sit close together in memory. The walk itself runs in :func:`_explore_batch`,
    which returns whenever a buffer must grow.
    """
    N1 = np.int64(n1)
    N2 = np.int64(n2)
    total = 3 * N1 * N2
    dense = total <= dense_limit
    if n2 <= n1:
        stride_a, stride_b = 3 * N2, np.int64(3)
    else:
        stride_a, stride_b = np.int64(3), 3 * N1
    table = np.full(total if dense else 0, _UNSEEN, dtype=np.int32)
    hashed = Dict.empty(key_type=types.int64, value_type=types.int32)
    acc1 = np.zeros(n1, dtype=np.uint8)
    acc2 = np.zeros(n2, dtype=np.uint8)
    for a in accept1:
        acc1[a] = 1
    for a in accept2:
        acc2[a] = 1
    # Output nodes in creation order (also the queue): product state, accept flag.
    n_start = start1.shape[0] * start2.shape[0]
    # Buffers start large: np.empty only reserves address space, and pages are touched as
    # they fill, so room that stays unused costs nothing, while growing (copying and
    # faulting in fresh pages) cost more than the walk itself. With a dense store there is
    # at most one node per state, so the node buffer never grows.
    e = arcs1.shape[0] + arcs2.shape[0]
    node_cap = max(1024, n_start, e)
    arc_cap = max(1024, e)
    if dense:
        node_cap = max(node_cap, total)
        arc_cap = max(arc_cap, min(4 * node_cap, ARC_RESERVE))
    nodes = np.empty((3, node_cap), dtype=np.int32)
    node_acc = np.empty(nodes.shape[1], dtype=np.uint8)
    num_nodes = 0
    for s1 in start1:
        for s2 in start2:
            if dense:
                table[s1 * stride_a + s2 * stride_b] = num_nodes
            else:
                hashed[s1 * stride_a + s2 * stride_b] = np.int32(num_nodes)
            nodes[0, num_nodes] = s1
            nodes[1, num_nodes] = s2
            nodes[2, num_nodes] = 0
            node_acc[num_nodes] = acc1[s1] & acc2[s2]
            num_nodes += 1
    num_start = num_nodes
    pairs = np.empty((2, 256), dtype=np.int32)
    out = np.empty((4, arc_cap), dtype=np.int32)
    head = 0
    num_arcs = 0
    while True:
        head, num_nodes, num_arcs, need_pairs, need = _explore_batch(
            dst1,
            lab1,
            off1,
            arcs1,
            dst2,
            lab2,
            off2,
            arcs2,
            kind,
            tab1,
            w1,
            tab2,
            w2,
            sorted1,
            sorted2,
            dense,
            table,
            hashed,
            stride_a,
            stride_b,
            acc1,
            acc2,
            pairs,
            nodes,
            node_acc,
            out,
            head,
            num_nodes,
            num_arcs,
        )
        if need_pairs:
            pairs = _grow2(pairs)
        elif need > 0:
            if num_nodes + need > nodes.shape[1]:
                nodes = _grow2(nodes)
                node_acc = _grow1(node_acc)
            if num_arcs + need > out.shape[1]:
                out = _grow2(out)
        else:
            break
    return (
        num_nodes,
        num_start,
        node_acc[:num_nodes],
        out[0, :num_arcs],
        out[1, :num_arcs],
        out[2, :num_arcs],
        out[3, :num_arcs],
    )


@njit(cache=True, nogil=True)
def _explore_batch(
    dst1,
    lab1,
    off1,
    arcs1,
    dst2,
    lab2,
    off2,
    arcs2,
    kind,
    tab1,
    w1,
    tab2,
    w2,
    sorted1,
    sorted2,
    dense,
    table,
    hashed,
    stride_a,
    stride_b,
    acc1,
    acc2,
    pairs,
    nodes,
    node_acc,
    out,
    head,
    num_nodes,
    num_arcs,
):
    """Expands queued nodes from ``head`` until the queue is empty or a buffer is full.

    Returns ``(head, num_nodes, num_arcs, need_pairs, need)``: ``need_pairs`` asks for a
    bigger pair buffer, ``need > 0`` for room for ``need`` more nodes and arcs; the node
    at ``head`` is then expanded again by the next call.

    The arc matcher, the lower bounds and the state store are written out here rather
    than called: a numba function taking arrays costs reference counting on every call,
    which made this loop several times slower than its own work (measured 25 ms against
    5 ms for the CTC benchmark's intersection).

    Each graph comes as ``dst``, ``lab`` (the labels a composition matches: the first
    graph's output labels, the second's input labels), and its out-arc lists ``off``,
    ``arcs``. ``tab1``/``tab2`` are :func:`lower_bound_table` results for sorted sides
    (width 0: binary search). The matcher of each ``kind`` yields the pairs of equal labels
    in the order of GTN's matcher of that kind, into ``pairs[0]`` (first graph's arcs) and
    ``pairs[1]`` (second graph's arcs).
    """
    cap = pairs.shape[1]
    doubly = kind == DOUBLY
    while head < num_nodes:
        cur = head
        a = nodes[0, cur]
        b = nodes[1, cur]
        follow = nodes[2, cur]
        lo1 = off1[a]
        hi1 = off1[a + 1]
        lo2 = off2[b]
        hi2 = off2[b + 1]
        # -- matched pairs ------------------------------------------------------------
        npairs = 0
        full = False
        if kind == UNSORTED:  # nested loops
            for p in range(lo1, hi1):
                i = arcs1[p]
                li = lab1[i]
                for q in range(lo2, hi2):
                    j = arcs2[q]
                    if lab2[j] == li:
                        if npairs == cap:
                            full = True
                            break
                        pairs[0, npairs] = i
                        pairs[1, npairs] = j
                        npairs += 1
                if full:
                    break
        else:
            # Search one list for each label of the other (GTN's SinglySorted matcher;
            # DoublySorted searches the longer list and its lower bound only moves on).
            # (Each array access below names its graph's array in both arms of a scalar
            # select: an array picked into a variable costs reference counting per use.)
            if doubly:
                search_first = (hi1 - lo1) > (hi2 - lo2)
            else:
                search_first = kind == SEARCH_FIRST
            if search_first:
                s_lo, s_hi, q_lo, q_hi, s_node, s_w = lo1, hi1, lo2, hi2, a, w1
            else:
                s_lo, s_hi, q_lo, q_hi, s_node, s_w = lo2, hi2, lo1, hi1, b, w2
            s_it = s_lo
            s_begin = s_lo
            q_it = q_lo
            while q_it != q_hi:
                # hasNext()
                found = False
                if s_it != s_hi and (
                    (lab2[arcs2[q_it]] == lab1[arcs1[s_it]])
                    if search_first
                    else (lab1[arcs1[q_it]] == lab2[arcs2[s_it]])
                ):
                    found = True
                else:
                    if s_it != s_begin:
                        q_it += 1
                    while q_it < q_hi:
                        ql = lab2[arcs2[q_it]] if search_first else lab1[arcs1[q_it]]
                        first = s_begin if doubly else s_lo
                        # lower bound of ql in arcs[first:s_hi]: one table load, or
                        # libstdc++'s binary search (same probes, so arcs wrongly
                        # marked sorted match as in GTN)
                        if s_w > 0:
                            if ql + 1 >= s_w:
                                r = s_hi
                            else:
                                k = s_node * s_w + ql + 1
                                r = tab1[k] if search_first else tab2[k]
                                if r < first:
                                    r = first
                        else:
                            r = first
                            count = s_hi - first
                            while count > 0:
                                half = count >> 1
                                mid = r + half
                                lm = lab1[arcs1[mid]] if search_first else lab2[arcs2[mid]]
                                if lm < ql:
                                    r = mid + 1
                                    count -= half + 1
                                else:
                                    count = half
                        if doubly:
                            s_begin = r
                            if r == s_hi:
                                q_it = q_hi  # no later query can match either
                                break
                        s_it = r
                        if r != s_hi and (lab1[arcs1[r]] if search_first else lab2[arcs2[r]]) == ql:
                            found = True
                            break
                        q_it += 1
                if not found:
                    break
                # next()
                if npairs == cap:
                    full = True
                    break
                if search_first:
                    pairs[0, npairs] = arcs1[s_it]
                    pairs[1, npairs] = arcs2[q_it]
                else:
                    pairs[0, npairs] = arcs1[q_it]
                    pairs[1, npairs] = arcs2[s_it]
                npairs += 1
                s_it += 1
        if full:
            return head, num_nodes, num_arcs, True, 0
        # -- candidates in GTN's order: matched pairs, epsilons of the first graph, then
        # of the second; ``i``/``j`` are the arcs (-1: none). With a sorted flag GTN stops
        # an epsilon scan at the first other label (epsilons sort first), also when the
        # flag is wrong.
        end1 = npairs + (hi1 - lo1 if follow != 2 else 0)
        end = end1 + (hi2 - lo2 if follow != 1 else 0)
        if num_nodes + end > nodes.shape[1] or num_arcs + end > out.shape[1]:
            return head, num_nodes, num_arcs, False, end
        head += 1
        c = -1
        while c + 1 < end:
            c += 1
            if c < npairs:
                i = pairs[0, c]
                if follow != 0 and lab1[i] == EPS:
                    continue
                j = pairs[1, c]
                na = dst1[i]
                nb = dst2[j]
                nf = 0
            elif c < end1:
                i = arcs1[lo1 + c - npairs]
                if lab1[i] != EPS:
                    if sorted1:
                        c = end1 - 1  # no epsilon after this one: go on with the second graph
                    continue
                j = -1
                na = dst1[i]
                nb = b
                nf = 1
            else:
                j = arcs2[lo2 + c - end1]
                if lab2[j] != EPS:
                    if sorted2:
                        break
                    continue
                i = -1
                na = a
                nb = dst2[j]
                nf = 2
            key = na * stride_a + nb * stride_b + nf
            if dense:
                node = table[key]
            else:
                node = hashed.get(key, np.int32(_UNSEEN))
            if node < 0:
                node = num_nodes
                if dense:
                    table[key] = node
                else:
                    hashed[key] = np.int32(node)
                nodes[0, num_nodes] = na
                nodes[1, num_nodes] = nb
                nodes[2, num_nodes] = nf
                node_acc[num_nodes] = acc1[na] & acc2[nb]
                num_nodes += 1
            out[0, num_arcs] = cur
            out[1, num_arcs] = node
            out[2, num_arcs] = i
            out[3, num_arcs] = j
            num_arcs += 1
    return head, num_nodes, num_arcs, False, 0


@njit(cache=True, nogil=True)
def trim(num_nodes, num_start, node_acc, src, dst, arc1, arc2):
    """Keeps the nodes that reach an accept node (and the arcs into them), in order.

    Arcs come grouped by source node in node order (as :func:`explore` makes them). When
    every arc also goes to a later node, one backward sweep over the arcs settles which
    nodes reach an accept node; otherwise a breadth-first walk over in-arcs does.
    """
    keep = node_acc.copy()
    forward_only = True
    for k in range(dst.shape[0]):
        if dst[k] <= src[k]:
            forward_only = False
            break
    if forward_only:
        for k in range(dst.shape[0] - 1, -1, -1):
            if keep[dst[k]]:
                keep[src[k]] = 1
    else:
        _coaccessible(num_nodes, src, dst, keep)
    return _compact(num_nodes, num_start, node_acc, src, dst, arc1, arc2, keep)


@njit(cache=True, nogil=True)
def _coaccessible(num_nodes, src, dst, keep):
    """Marks in ``keep`` every node from which a node already marked can be reached."""
    in_off = np.zeros(num_nodes + 1, dtype=np.int32)
    for k in range(dst.shape[0]):
        in_off[dst[k] + 1] += 1
    for n in range(num_nodes):
        in_off[n + 1] += in_off[n]
    fill = in_off[:num_nodes].copy()
    in_src = np.empty(dst.shape[0], dtype=np.int32)
    for k in range(dst.shape[0]):
        d = dst[k]
        in_src[fill[d]] = src[k]
        fill[d] += 1
    queue = np.empty(num_nodes, dtype=np.int32)
    qt = 0
    for n in range(num_nodes):
        if keep[n]:
            queue[qt] = n
            qt += 1
    qh = 0
    while qh < qt:
        n = queue[qh]
        qh += 1
        for p in range(in_off[n], in_off[n + 1]):
            u = in_src[p]
            if not keep[u]:
                keep[u] = 1
                queue[qt] = u
                qt += 1


@njit(cache=True, nogil=True)
def _compact(num_nodes, num_start, node_acc, src, dst, arc1, arc2, keep):
    new_id = np.empty(num_nodes, dtype=np.int32)
    count = 0
    kept_start = 0
    for n in range(num_nodes):
        if keep[n]:
            new_id[n] = count
            count += 1
            if n < num_start:
                kept_start += 1
        else:
            new_id[n] = -1
    n_arcs = 0
    for k in range(dst.shape[0]):
        if keep[dst[k]]:
            n_arcs += 1
    o_src = np.empty(n_arcs, dtype=np.int32)
    o_dst = np.empty(n_arcs, dtype=np.int32)
    o_a1 = np.empty(n_arcs, dtype=np.int32)
    o_a2 = np.empty(n_arcs, dtype=np.int32)
    m = 0
    for k in range(dst.shape[0]):
        if keep[dst[k]]:
            o_src[m] = new_id[src[k]]
            o_dst[m] = new_id[dst[k]]
            o_a1[m] = arc1[k]
            o_a2[m] = arc2[k]
            m += 1
    o_acc = np.empty(count, dtype=np.uint8)
    for n in range(num_nodes):
        if keep[n]:
            o_acc[new_id[n]] = node_acc[n]
    return count, kept_start, o_acc, o_src, o_dst, o_a1, o_a2


@njit(cache=True, nogil=True)
def compose_arcs(arc1, arc2, il1, w1, ol2, w2):
    """Labels and weights of composed arcs from their arc map.

    An arc from a matched pair reads ``il1[i]``, writes ``ol2[j]`` and weighs
    ``w1[i] + w2[j]``; an epsilon arc of one graph takes that arc's weight alone.
    """
    n = arc1.shape[0]
    il = np.empty(n, dtype=np.int32)
    ol = np.empty(n, dtype=np.int32)
    w = np.empty(n, dtype=np.float32)
    for k in range(n):
        i = arc1[k]
        j = arc2[k]
        if i >= 0 and j >= 0:
            il[k] = il1[i]
            ol[k] = ol2[j]
            w[k] = w1[i] + w2[j]
        elif i >= 0:
            il[k] = il1[i]
            ol[k] = EPS
            w[k] = w1[i]
        else:
            il[k] = EPS
            ol[k] = ol2[j]
            w[k] = w2[j]
    return il, ol, w


@njit(cache=True, nogil=True)
def scatter_add(index, values, size):
    """``out[index[k]] += values[k]`` for ``index[k] >= 0``, in order (float32)."""
    out = np.zeros(size, dtype=np.float32)
    for k in range(index.shape[0]):
        i = index[k]
        if i >= 0:
            out[i] += values[k]
    return out


# -- remove ----------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def remove(num_nodes, src, dst, il, ol, in_off, in_arcs, out_off, out_arcs, start, accept, ilabel, olabel):
    """GTN's ``remove``: drops arcs labelled ``ilabel:olabel``, joining their ends.

    A node survives if it is a start node or has an in-arc with another label. From each
    surviving node, a breadth-first walk over removed arcs reaches nodes whose other
    out-arcs the survivor then gets (and their accept flag).

    Returns ``(new_id, num_out_nodes, accept_order, src, dst, arc)``: ``new_id`` maps
    input nodes to output nodes (-1 when dropped), ``accept_order`` lists output accept
    nodes in the order GTN marks them, ``arc`` is the input arc each output arc copies.
    """
    is_start = np.zeros(num_nodes, dtype=np.uint8)
    is_acc = np.zeros(num_nodes, dtype=np.uint8)
    for n in start:
        is_start[n] = 1
    for n in accept:
        is_acc[n] = 1
    new_id = np.full(num_nodes, -1, dtype=np.int32)
    count = 0
    for n in range(num_nodes):
        keep = is_start[n] == 1
        if not keep:
            for p in range(in_off[n], in_off[n + 1]):
                e = in_arcs[p]
                if not (il[e] == ilabel and ol[e] == olabel):
                    keep = True
                    break
        if keep:
            new_id[n] = count
            count += 1
    seen = np.full(num_nodes, -1, dtype=np.int32)  # stamp: the node whose walk saw it
    queue = np.empty(max(num_nodes, 1), dtype=np.int32)
    accept_order = np.empty(count, dtype=np.int32)
    n_acc = 0
    out = np.empty((3, max(16, src.shape[0])), dtype=np.int32)
    n_out = 0
    for n in range(num_nodes):
        cur = new_id[n]
        if cur < 0:
            continue
        qh = 0
        qt = 1
        queue[0] = n
        seen[n] = n
        marked = False
        while qh < qt:
            nxt = queue[qh]
            qh += 1
            if is_acc[nxt] and not marked:
                marked = True
                accept_order[n_acc] = cur
                n_acc += 1
            for p in range(out_off[nxt], out_off[nxt + 1]):
                e = out_arcs[p]
                d = dst[e]
                if il[e] == ilabel and ol[e] == olabel:
                    if seen[d] != n:
                        seen[d] = n
                        queue[qt] = d
                        qt += 1
                else:
                    if n_out == out.shape[1]:
                        out = _grow2(out)
                    out[0, n_out] = cur
                    out[1, n_out] = new_id[d]
                    out[2, n_out] = e
                    n_out += 1
    return (
        new_id,
        count,
        accept_order[:n_acc].copy(),
        out[0, :n_out].copy(),
        out[1, :n_out].copy(),
        out[2, :n_out].copy(),
    )


# -- shortest distance / path ----------------------------------------------------------


@njit(cache=True, nogil=True)
def topological_order(num_nodes, src, dst, in_off, out_off, out_arcs, accept):
    """Kahn's order of the nodes not on or after a cycle.

    Returns ``(order, count, ok)``: ``order[:count]`` is a topological order of every
    node that no cycle leads to; ``ok`` is False when a cycle (a self-loop included)
    leads to an accept node, which makes the sum over paths infinite. When every arc
    goes to a larger node id (compositions of acyclic graphs usually do), the order is
    the node ids themselves.
    """
    order = np.empty(num_nodes, dtype=np.int32)
    increasing = True
    for a in range(src.shape[0]):
        if src[a] >= dst[a]:
            increasing = False
            break
    if increasing:
        for n in range(num_nodes):
            order[n] = n
        return order, num_nodes, True
    indeg = np.empty(num_nodes, dtype=np.int32)
    count = 0
    for n in range(num_nodes):
        indeg[n] = in_off[n + 1] - in_off[n]
        if indeg[n] == 0:
            order[count] = n
            count += 1
    head = 0
    while head < count:
        n = order[head]
        head += 1
        for p in range(out_off[n], out_off[n + 1]):
            d = dst[out_arcs[p]]
            indeg[d] -= 1
            if indeg[d] == 0:
                order[count] = d
                count += 1
    ok = True
    for n in accept:
        if indeg[n] > 0:
            ok = False
    return order, count, ok


@njit(cache=True, nogil=True)
def forward(num_nodes, src, w, in_off, in_arcs, order, count, start, accept, tropical):
    """Forward scores (log semiring, or max when ``tropical``) of nodes in ``order``.

    Like GTN: a node's score combines its in-arcs' ``score[src] + weight`` and, for a
    start node, 0 (the empty path); a node with neither scores -inf, and so does the
    graph without an accepting path. For the max semiring ``best_arc[n]`` is the first
    in-arc with the strictly best score (-1 when the empty path wins or nothing reaches
    ``n``) and ``best_accept`` the first accept node with the strictly best score.

    For the log semiring the backward pass needs ``exp(score[src] + w - score[dst])`` of
    every arc; the forward pass already computes ``exp(score[src] + w - max)`` and the
    node's sum of those, so it keeps them (``ratio`` per arc, ``node_sum`` per node) and
    the backward pass needs no ``exp`` per arc.

    Returns ``(score, node_scores, best_arc, best_accept, ratio, node_sum)`` (float64).
    """
    ninf = -np.inf
    scores = np.full(num_nodes, ninf)
    best_arc = np.full(num_nodes if tropical else 0, -1, dtype=np.int32)
    ratio = np.zeros(0 if tropical else src.shape[0])
    node_sum = np.ones(0 if tropical else num_nodes)
    is_start = np.zeros(num_nodes, dtype=np.uint8)
    for n in start:
        is_start[n] = 1
    for k in range(count):
        n = order[k]
        lo = in_off[n]
        hi = in_off[n + 1]
        mx = ninf
        arg = -1
        for p in range(lo, hi):
            a = in_arcs[p]
            s = scores[src[a]] + w[a]
            if s > mx:
                mx = s
                arg = a
            elif s != s and mx == mx:  # a NaN weight poisons the node (NaN in, NaN out)
                mx = s
                arg = a
        if is_start[n]:
            if 0.0 > mx:
                mx = 0.0
                arg = -1
        if tropical:
            best_arc[n] = arg
            scores[n] = mx
        elif hi == lo and not is_start[n]:
            scores[n] = ninf
        elif mx == np.inf or mx == ninf:
            scores[n] = mx
            for p in range(lo, hi):  # GTN's exp(score[src] + w - score[dst]) (0 or nan)
                a = in_arcs[p]
                ratio[a] = math.exp(scores[src[a]] + w[a] - mx)
        else:
            acc = 0.0
            for p in range(lo, hi):
                a = in_arcs[p]
                e = math.exp(scores[src[a]] + w[a] - mx)
                ratio[a] = e
                acc += e
            if is_start[n]:
                acc += math.exp(-mx)
            node_sum[n] = acc
            scores[n] = mx + math.log1p(acc - 1.0)
    mx = ninf
    best = -1
    for n in accept:
        if scores[n] > mx:
            mx = scores[n]
            best = n
        elif scores[n] != scores[n] and mx == mx:
            mx = scores[n]
            best = n
    if tropical or mx == np.inf or mx == ninf or accept.shape[0] == 0:
        total = mx
    else:
        acc = -1.0
        for n in accept:
            acc += math.exp(scores[n] - mx)
        total = mx + math.log1p(acc)
    return total, scores, best_arc, best, ratio, node_sum


@njit(cache=True, nogil=True)
def forward_grad(num_nodes, dst, out_off, out_arcs, order, count, accept, scores, ratio, node_sum, total, delta):
    """Gradient of the log-semiring forward score: arc posteriors times ``delta``.

    ``grad[a] = delta * exp(alpha[src] + w[a] + beta[dst] - total)``, accumulated
    backwards through ``order`` as GTN does. Arcs into nodes that score -inf, and every
    arc when there is no accepting path, get 0.
    """
    ninf = -np.inf
    is_acc = np.zeros(num_nodes, dtype=np.uint8)
    for n in accept:
        is_acc[n] = 1
    # per_arc[d] = node_grad[d] / node_sum[d]: what each in-arc of d gets per unit ratio
    per_arc = np.zeros(num_nodes)
    grad = np.zeros(ratio.shape[0], dtype=np.float32)
    for k in range(count - 1, -1, -1):
        n = order[k]
        g = 0.0
        for p in range(out_off[n], out_off[n + 1]):
            a = out_arcs[p]
            d = dst[a]
            if scores[d] == ninf:
                cur = 0.0
            else:
                cur = per_arc[d] * ratio[a]
            g += cur
            grad[a] = cur
        if is_acc[n] and total != ninf:
            g += math.exp(scores[n] - total) * delta
        per_arc[n] = g / node_sum[n]
    return grad


@njit(cache=True, nogil=True)
def viterbi_grad(n_arcs, src, best_arc, best_accept, delta):
    """Gradient of the Viterbi score: ``delta`` on each arc of the best path."""
    grad = np.zeros(n_arcs, dtype=np.float32)
    n = best_accept
    while n >= 0:
        a = best_arc[n]
        if a < 0:
            break
        grad[a] += delta
        n = src[a]
    return grad


@njit(cache=True, nogil=True)
def best_path(num_nodes, src, w, in_off, in_arcs, order, count, start, accept):
    """GTN's ``viterbiPath``: arcs of the best path, first arc first.

    Start nodes begin at 0; an in-arc replaces a node's back-pointer only when strictly
    better (so on ties the empty path at a start node and the earliest in-arc win); the
    first accept node with the strictly best score ends the path. Returns
    ``(found, arcs)``; ``found`` is False when no accepting path exists.
    """
    ninf = -np.inf
    scores = np.full(num_nodes, ninf)
    back = np.full(num_nodes, -1, dtype=np.int32)
    for n in start:
        scores[n] = 0.0
    for k in range(count):
        n = order[k]
        for p in range(in_off[n], in_off[n + 1]):
            a = in_arcs[p]
            s = scores[src[a]] + w[a]
            if s > scores[n]:
                scores[n] = s
                back[n] = a
    mx = ninf
    best = -1
    for n in accept:
        if scores[n] > mx:
            mx = scores[n]
            best = n
    if best < 0:
        return False, np.zeros(0, dtype=np.int32)
    length = 0
    n = best
    while back[n] >= 0:
        length += 1
        n = src[back[n]]
    arcs = np.empty(length, dtype=np.int32)
    n = best
    for k in range(length - 1, -1, -1):
        arcs[k] = back[n]
        n = src[back[n]]
    return True, arcs
