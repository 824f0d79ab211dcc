"""The :class:`Graph` class: a weighted finite-state transducer with autograd.

A ``Graph`` is a light handle on three shared parts, like GTN's C++ object:

* the *structure* (nodes, start/accept flags, arcs with input and output labels),
* the *weights* (one float32 per arc),
* the *autograd state* (``calc_grad``, the function that back-propagates into the
  inputs, the inputs themselves, and the accumulated gradient).

Copying a handle (``Graph._alias``) shares all three, as copying a ``gtn::Graph`` does.
The gradient of a graph is itself a graph sharing the structure with its own weights.

Arcs are kept in Python lists while a user adds them one by one and in int32 numpy
arrays once something reads them; operations that build graphs in bulk hand arrays
over directly (``Graph._from_arrays``, unchecked, for the engine's own results).

Everything that builds a graph from outside data (``Graph.from_arrays``, unpickling,
``load``/``loadtxt``) goes through :func:`_validate_arrays` first: the compiled kernels
index arrays by node id and label without bounds checks, so a node id out of range or a
label below -1 must never reach them.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import platform
import threading
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ._text import format_graph

epsilon = -1
"""The label of an arc that consumes (or emits) nothing."""

_INT = np.int32
_FLOAT = np.float32
_MERGE_LOCK = threading.Lock()  # guards merging arcs added one by one into the arrays

MAX_NODES = 2**31 - 1
"""Node ids and labels are int32: a graph has at most this many nodes."""

MAX_UNREFERENCED_NODES = 1 << 20
"""How many nodes that no arc, start id or accept id names a graph read from outside data
(pickle state, ``load``, ``loadtxt``) may have. Each node costs memory whether used or not,
so a few bytes declaring two billion nodes must not make the engine allocate tens of GB."""

# Every change of a graph's structure or weights stamps the changed part with the next
# value of one process-wide counter, so ``Graph.version`` grows on every change, also
# when a part is replaced by a fresh one (``__setstate__``).
_next_version = itertools.count(1).__next__


def _new_merge_lock_in_child() -> None:
    # A forked child (a DataLoader worker, say) must not inherit a lock held by a parent thread.
    global _MERGE_LOCK
    _MERGE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_merge_lock_in_child)


class _Structure:
    """Nodes and arcs of a graph; shared between a graph and its gradient graph."""

    __slots__ = (
        "num_nodes",
        "start",
        "accept",
        "start_ids",
        "accept_ids",
        "_arrays",
        "_pending",
        "ilabel_sorted",
        "olabel_sorted",
        "_csr",
        "_order",
        "_lbt",
        "version",
    )

    def __init__(self) -> None:
        self.version = _next_version()
        self.num_nodes = 0
        self.start: List[bool] = []
        self.accept: List[bool] = []
        self.start_ids: List[int] = []
        self.accept_ids: List[int] = []
        empty = np.zeros(0, dtype=_INT)
        self._arrays: Tuple[np.ndarray, ...] = (empty, empty, empty, empty)  # src, dst, ilabel, olabel
        self._pending: Optional[tuple] = None  # four lists while arcs are added one by one
        self.ilabel_sorted = False
        self.olabel_sorted = False
        self._csr: Optional[Tuple[np.ndarray, ...]] = None  # (in_offsets, in_arcs, out_offsets, out_arcs)
        # arc order inside each node after arc_sort: (in_arcs, out_arcs)
        self._order: Optional[Tuple[np.ndarray, ...]] = None
        # compose's lower-bound tables, checked against _csr and the labels
        self._lbt: Optional[Dict[str, Any]] = None

    # -- arcs ---------------------------------------------------------------
    def num_arcs(self) -> int:
        """The number of arcs."""
        if self._pending is None:
            return len(self._arrays[0])
        with _MERGE_LOCK:  # another thread may be merging the pending arcs right now
            p = self._pending
            return len(self._arrays[0]) + (len(p[0]) if p is not None else 0)

    def arrays(self):
        """``(src, dst, ilabel, olabel)`` as int32 arrays of length ``num_arcs``."""
        if self._pending is not None:
            # Several threads may read a freshly built graph at once (parallel_for over
            # a batch sharing one criterion graph): merge the pending arcs only once.
            with _MERGE_LOCK:
                if self._pending is not None:
                    self._arrays = tuple(
                        np.concatenate([a, np.asarray(p, dtype=_INT)]) for a, p in zip(self._arrays, self._pending)
                    )
                    self._pending = None
        return self._arrays

    def add_arc(self, src: int, dst: int, ilabel: int, olabel: int) -> int:
        if self._pending is None:
            self._pending = ([], [], [], [])
        p = self._pending
        p[0].append(src)
        p[1].append(dst)
        p[2].append(ilabel)
        p[3].append(olabel)
        self._changed()
        return self.num_arcs() - 1

    def add_node(self, start: bool, accept: bool) -> int:
        idx = self.num_nodes
        self.start.append(bool(start))
        self.accept.append(bool(accept))
        if start:
            self.start_ids.append(idx)
        if accept:
            self.accept_ids.append(idx)
        self.num_nodes += 1
        self._changed()
        return idx

    def _changed(self) -> None:
        self.version = _next_version()
        self.ilabel_sorted = False
        self.olabel_sorted = False
        self._csr = None
        self._order = None

    # -- adjacency ----------------------------------------------------------
    def csr(self):
        """In and out adjacency: ``(in_offsets, in_arcs, out_offsets, out_arcs)``.

        Arcs of one node keep their insertion order (a stable counting sort), unless
        :meth:`Graph.arc_sort` reordered them by label.
        """
        if self._csr is None:
            src, dst, _, _ = self.arrays()
            n = self.num_nodes
            in_arcs = np.argsort(dst, kind="stable").astype(_INT)
            out_arcs = np.argsort(src, kind="stable").astype(_INT)
            in_off = np.zeros(n + 1, dtype=_INT)
            out_off = np.zeros(n + 1, dtype=_INT)
            if len(src):
                np.cumsum(np.bincount(dst, minlength=n)[:n], out=in_off[1:])
                np.cumsum(np.bincount(src, minlength=n)[:n], out=out_off[1:])
            if self._order is not None:
                in_arcs, out_arcs = self._order
            self._csr = (in_off, in_arcs, out_off, out_arcs)
        return self._csr

    def copy(self) -> "_Structure":
        out = _Structure()
        out.num_nodes = self.num_nodes
        out.start = list(self.start)
        out.accept = list(self.accept)
        out.start_ids = list(self.start_ids)
        out.accept_ids = list(self.accept_ids)
        out._arrays = tuple(a.copy() for a in self.arrays())
        out.ilabel_sorted = self.ilabel_sorted
        out.olabel_sorted = self.olabel_sorted
        out._order = self._order
        out._csr = self._csr
        return out


class _Weights:
    """The float32 weights of a graph (one per arc)."""

    __slots__ = ("_array", "_pending", "version")

    def __init__(self, array: Optional[np.ndarray] = None) -> None:
        self._array = np.zeros(0, dtype=_FLOAT) if array is None else array
        self._pending: Optional[list] = None
        self.version = _next_version()

    def append(self, w: float) -> None:
        self.version = _next_version()
        if self._pending is None:
            self._pending = []
        self._pending.append(w)

    def array(self) -> np.ndarray:
        if self._pending is not None:
            with _MERGE_LOCK:
                if self._pending is not None:
                    self._array = np.concatenate([self._array, np.asarray(self._pending, dtype=_FLOAT)])
                    self._pending = None
        return self._array

    def set(self, array: np.ndarray) -> None:
        self._array = array
        self._pending = None
        self.version = _next_version()


class _GradState:
    """Autograd state shared by all handles of one graph (GTN's ``SharedGrad``)."""

    __slots__ = ("calc_grad", "grad_func", "inputs", "grad", "lock", "__weakref__")

    def __init__(self, calc_grad: bool) -> None:
        self.calc_grad = bool(calc_grad)
        self.grad_func: Optional[Callable] = None
        self.inputs: List["Graph"] = []
        self.grad: Optional["Graph"] = None
        self.lock = threading.Lock()


class GraphIndexError(IndexError, ValueError):
    """A node or arc id that the graph does not have (an ``IndexError`` and a ``ValueError``)."""


def _check_node(g: "Graph", node, name: str) -> int:
    n = g._s.num_nodes
    try:
        idx = int(node)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an integer node id, got {node!r}") from None
    if idx != node or not 0 <= idx < n:
        nodes = f"0..{n - 1}" if n else "none yet"
        raise GraphIndexError(f"{name}={node!r} is not a node of this graph (it has {n} nodes: {nodes})")
    return idx


def _check_label(label, name: str) -> int:
    try:
        lab = int(label)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an integer label, got {label!r}") from None
    if lab != label or not epsilon <= lab <= MAX_NODES:
        raise ValueError(f"{name}={label!r} must be a label in [0, {MAX_NODES}] or gtn.epsilon (-1)")
    return lab


class GraphArrays(NamedTuple):
    """A graph as arrays (see :meth:`Graph.arrays` and :meth:`Graph.from_arrays`).

    Attributes:
        num_nodes: the number of nodes ``N``.
        start: ``(num_start,)`` int32 ids of the start nodes, in the order they became so.
        accept: ``(num_accept,)`` int32 ids of the accept nodes, in the order they became so.
        src: ``(E,)`` int32 source node of each arc, in ``[0, N)``.
        dst: ``(E,)`` int32 destination node of each arc, in ``[0, N)``.
        ilabel: ``(E,)`` int32 input label of each arc, ``>= 0`` or ``epsilon`` (-1).
        olabel: ``(E,)`` int32 output label of each arc, ``>= 0`` or ``epsilon`` (-1).
        weights: ``(E,)`` float32 weight of each arc.
    """

    num_nodes: int
    start: np.ndarray
    accept: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    ilabel: np.ndarray
    olabel: np.ndarray
    weights: np.ndarray


def _read_only(a: np.ndarray) -> np.ndarray:
    # A copy, not a view: numpy lets anyone set ``writeable`` back on a view of writeable memory,
    # and a write into the graph's own arrays would reach the kernels unchecked.
    v = a.copy()
    v.flags.writeable = False
    return v


def _labels_sorted(ends: np.ndarray, arcs: Optional[np.ndarray], labels: np.ndarray) -> bool:
    """Whether the arcs of each node, listed in the order ``arcs`` (``None``: arc id order, as
    the stable adjacency lists them), have non-decreasing ``labels``; ``ends`` is the node of
    each arc (``src`` for out-arcs, ``dst`` for in-arcs)."""
    if len(ends) < 2:
        return True
    if arcs is None:
        arcs = np.argsort(ends, kind="stable")
    node, lab = ends[arcs], labels[arcs]
    return not bool(np.any((node[1:] == node[:-1]) & (lab[1:] < lab[:-1])))


def _as_count(value, field: str, where: str, upper: int = MAX_NODES) -> int:
    """A non-negative integer (a node count); ``ValueError`` naming ``field`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where}: {field} must be an integer, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= upper:
        raise ValueError(f"{where}: {field}={value} must lie in [0, {upper}]")
    return value


def _as_int_array(values, field: str, where: str, low: int, high: int, copy: bool) -> np.ndarray:
    """A 1-D int32 array of integers in ``[low, high)`` (no copy if it already is one)."""
    if values is None or isinstance(values, (str, bytes, dict, set)):
        raise ValueError(f"{where}: {field} must be a 1-D sequence of integers, got {type(values).__name__}")
    try:
        arr = np.asarray(values)
    except Exception as err:  # ragged lists, objects numpy cannot convert
        raise ValueError(f"{where}: {field} must be a 1-D sequence of integers ({err})") from None
    if arr.ndim != 1:
        raise ValueError(f"{where}: {field} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=_INT)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{where}: {field} must hold integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise ValueError(f"{where}: {field} holds {bad}, outside [{low}, {high - 1}]")
    if arr.dtype == _INT and arr.flags.c_contiguous:
        return arr.copy() if copy else arr
    return arr.astype(_INT)


def _check_node_budget(num_nodes: int, ids: Sequence[np.ndarray], where: str) -> None:
    """``ValueError`` when more than ``MAX_UNREFERENCED_NODES`` nodes are named by no id."""
    if num_nodes <= MAX_UNREFERENCED_NODES:
        return
    used = np.unique(np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in ids]))
    if num_nodes - len(used) > MAX_UNREFERENCED_NODES:
        raise ValueError(
            f"{where}: num_nodes={num_nodes} but only {len(used)} nodes are named by an arc, start "
            f"or accept id; at most {MAX_UNREFERENCED_NODES} nodes may be unused"
        )


def _validate_arrays(
    num_nodes,
    start,
    accept,
    src,
    dst,
    ilabel,
    olabel,
    weights,
    where: str,
    copy: bool = False,
    node_budget: bool = False,
):
    """Checks a graph given as arrays; returns them as the engine stores them.

    Returns ``(num_nodes, start_ids, accept_ids, src, dst, ilabel, olabel, weights)`` with
    int32/float32 arrays (the given ones when they already are contiguous int32 and
    writeable float32, unless ``copy``). ``olabel`` None means ``ilabel``; ``weights`` None
    means zeros.

    Raises:
        ValueError: naming the field that is wrong: a count that is not a non-negative
            integer, a node id outside ``[0, num_nodes)``, a label below -1, a repeated start
            or accept id, arrays of different lengths, weights that are not ``E`` numbers,
            or (with ``node_budget``) too many nodes that nothing names.
    """
    n = _as_count(num_nodes, "num_nodes", where)
    start = _as_int_array(start, "start", where, 0, n, False)
    accept = _as_int_array(accept, "accept", where, 0, n, False)
    for name, ids in (("start", start), ("accept", accept)):
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"{where}: {name} names a node more than once")
    src = _as_int_array(src, "src", where, 0, n, copy)
    dst = _as_int_array(dst, "dst", where, 0, n, copy)
    il = _as_int_array(ilabel, "ilabel", where, epsilon, MAX_NODES + 1, copy)
    ol = il if olabel is None else _as_int_array(olabel, "olabel", where, epsilon, MAX_NODES + 1, copy)
    e = len(src)
    for name, a in (("dst", dst), ("ilabel", il), ("olabel", ol)):
        if len(a) != e:
            raise ValueError(f"{where}: {name} has {len(a)} entries but src has {e} (one per arc)")
    if weights is None:
        w = np.zeros(e, dtype=_FLOAT)
    else:
        if isinstance(weights, (str, bytes, dict, set)):
            raise ValueError(f"{where}: weights must be a 1-D sequence of numbers, got {type(weights).__name__}")
        try:
            w = np.asarray(weights)
        except Exception as err:
            raise ValueError(f"{where}: weights must be a 1-D sequence of numbers ({err})") from None
        if w.ndim != 1 or len(w) != e:
            raise ValueError(f"{where}: weights must have shape ({e},) (one per arc), got {w.shape}")
        if e and w.dtype.kind not in "fiu":
            raise ValueError(f"{where}: weights must hold real numbers, got dtype {w.dtype}")
        if not (w.dtype == _FLOAT and w.flags.c_contiguous and w.flags.writeable) or copy:
            w = w.astype(_FLOAT)  # a copy
    if node_budget:
        _check_node_budget(n, (start, accept, src, dst), where)
    return n, start.tolist(), accept.tolist(), src, dst, il, ol, w


def _address_limit() -> int:
    """One past the highest user-space address of this machine (47-bit on x86-64/aarch64)."""
    if platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64"):
        return 1 << 47
    return 1 << (8 * ctypes.sizeof(ctypes.c_void_p))


_ADDRESS_LIMIT = _address_limit()
_LOWEST_ADDRESS = 1 << 16  # Linux never maps the first 64 KiB (vm.mmap_min_addr)


class Graph:
    """A weighted finite-state transducer (an acceptor when input and output labels agree).

    Args:
        calc_grad: whether gradients should be computed for this graph's weights.

    Example:
        >>> import lightning_gtn.wfst as gtn
        >>> g = gtn.Graph()
        >>> g.add_node(start=True)
        0
        >>> g.add_node(accept=True)
        1
        >>> g.add_arc(0, 1, 0, 0, 1.5)
        0
        >>> round(gtn.forward_score(g).item(), 4)
        1.5
    """

    __slots__ = ("_s", "_w", "_g", "__weakref__")

    def __init__(self, calc_grad: bool = True) -> None:
        self._s = _Structure()
        self._w = _Weights()
        self._g = _GradState(calc_grad)

    # -- construction helpers used by the operations ---------------------------
    @classmethod
    def _from_arrays(
        cls,
        num_nodes: int,
        start_ids: Iterable[int],
        accept_ids: Iterable[int],
        src: np.ndarray,
        dst: np.ndarray,
        ilabel: np.ndarray,
        olabel: np.ndarray,
        weights: np.ndarray,
        calc_grad: bool = True,
    ) -> "Graph":
        """Builds a graph from arrays without checking them (no copy when they already are
        int32/float32): only for the engine's own results, see :meth:`from_arrays`."""
        g = cls(calc_grad)
        s = g._s
        s.num_nodes = int(num_nodes)
        s.start = [False] * s.num_nodes
        s.accept = [False] * s.num_nodes
        s.start_ids = [int(i) for i in start_ids]
        s.accept_ids = [int(i) for i in accept_ids]
        for i in s.start_ids:
            s.start[i] = True
        for i in s.accept_ids:
            s.accept[i] = True
        s._arrays = tuple(np.ascontiguousarray(a, dtype=_INT) for a in (src, dst, ilabel, olabel))
        g._w.set(np.ascontiguousarray(weights, dtype=_FLOAT))
        return g

    @classmethod
    def from_arrays(
        cls,
        num_nodes: int,
        start,
        accept,
        src,
        dst,
        ilabel,
        olabel=None,
        weights=None,
        calc_grad: bool = True,
    ) -> "Graph":
        """Builds a graph from arrays, checked (the inverse of :meth:`arrays`).

        Arc ``a`` goes from node ``src[a]`` to ``dst[a]`` reading ``ilabel[a]``, writing
        ``olabel[a]``, with weight ``weights[a]``; start and accept ids keep the given order.
        The arrays are copied after they are checked, so changing them afterwards never
        reaches the graph (nor the kernels that trust its node ids once checked).

        Args:
            num_nodes: the number of nodes ``N`` (nodes are ``0 .. N-1``).
            start: ``(num_start,)`` integer ids of the start nodes, distinct.
            accept: ``(num_accept,)`` integer ids of the accept nodes, distinct.
            src: ``(E,)`` integer source node of each arc, in ``[0, N)``.
            dst: ``(E,)`` integer destination node of each arc, in ``[0, N)``.
            ilabel: ``(E,)`` integer input labels, ``>= 0`` or ``epsilon`` (-1).
            olabel: ``(E,)`` integer output labels; ``None`` makes an acceptor
                (``olabel = ilabel``).
            weights: ``(E,)`` real arc weights (NaN and infinities are kept); ``None``
                gives zeros.
            calc_grad: whether gradients are computed for the graph's weights.

        Returns:
            The graph; ``g.arrays()`` gives the same arrays back.

        Raises:
            ValueError: naming the field, when a count is not a non-negative integer, a
                node id is outside ``[0, N)``, a label is below -1 or beyond int32, a start
                or accept id repeats, or the arrays do not all have ``E`` entries.

        Example:
            >>> import lightning_gtn.wfst as gtn
            >>> g = gtn.Graph.from_arrays(2, [0], [1], [0], [1], [3], weights=[0.5])
            >>> g.labels_to_list(), g.weights_to_list()
            ([3], [0.5])
        """
        n, start, accept, src, dst, il, ol, w = _validate_arrays(
            num_nodes, start, accept, src, dst, ilabel, olabel, weights, "Graph.from_arrays", copy=True
        )
        return cls._from_arrays(n, start, accept, src, dst, il, ol, w, calc_grad=bool(calc_grad))

    def arrays(self) -> GraphArrays:
        """The graph as read-only numpy copies; see :class:`GraphArrays`.

        They are a snapshot: later changes of the graph do not show in them, and writing to
        them (after setting ``flags.writeable``) never reaches the graph.

        Returns:
            ``GraphArrays(num_nodes, start, accept, src, dst, ilabel, olabel, weights)``:
            start/accept ``(num_start,)``/``(num_accept,)`` int32, the arc arrays ``(E,)``
            int32 and the weights ``(E,)`` float32, all with ``flags.writeable == False``.
        """
        s = self._s
        src, dst, il, ol = s.arrays()
        return GraphArrays(
            s.num_nodes,
            _read_only(np.asarray(s.start_ids, dtype=_INT)),
            _read_only(np.asarray(s.accept_ids, dtype=_INT)),
            _read_only(src),
            _read_only(dst),
            _read_only(il),
            _read_only(ol),
            _read_only(self._weights()),
        )

    @property
    def version(self) -> int:
        """A number that grows on every change of the graph's structure or weights.

        ``add_node``, ``add_arc``, ``make_accept``, ``arc_sort``, ``mark_arc_sorted``,
        ``set_weights``, ``set_weight`` and ``__setstate__`` all increase it (writes through
        a tensor from ``weights_to_tensor()`` or an address from ``weights()`` cannot be
        seen). ``(id(graph), graph.version)`` therefore tells a cache whether something it
        computed from the graph is still valid while the graph is alive.
        """
        w = self._w
        return max(self._s.version, w.version if w is not None else 0)

    def _set_grad_func(self, inputs: Sequence["Graph"], grad_func: Callable) -> None:
        """Records how to back-propagate into ``inputs`` (only when this graph needs it)."""
        if self._g.calc_grad:
            self._g.grad_func = grad_func
            self._g.inputs = list(inputs)

    def _alias(self, weights: bool = True) -> "Graph":
        """A handle sharing structure, weights (unless ``weights=False``) and grad state."""
        other = Graph.__new__(Graph)
        other._s = self._s
        other._w = self._w if weights else None  # type: ignore[assignment]  # a grad-only alias: weights never read
        other._g = self._g
        return other

    # -- nodes and arcs ---------------------------------------------------------
    def add_node(self, start: bool = False, accept: bool = False) -> int:
        """Adds a node and returns its id."""
        return self._s.add_node(start, accept)

    def add_arc(
        self,
        src_node: int,
        dst_node: int,
        ilabel: Optional[int] = None,
        olabel: Optional[int] = None,
        weight: float = 0.0,
        *,
        label: Optional[int] = None,
    ) -> int:
        """Adds an arc and returns its id.

        ``add_arc(src, dst, label)`` adds an acceptor arc (``olabel = ilabel``, weight 0),
        as GTN does; ``add_arc(src, dst, ilabel, olabel, weight=0.0)`` a transducer arc.
        """
        s = self._s
        n = s.num_nodes
        # Plain ints in range (the common case) skip the checks' conversions.
        if (
            type(src_node) is int
            and type(dst_node) is int
            and type(ilabel) is int
            and 0 <= src_node < n
            and 0 <= dst_node < n
            and epsilon <= ilabel <= MAX_NODES
            and (olabel is None or (type(olabel) is int and epsilon <= olabel <= MAX_NODES))
        ):
            self._w.append(float(weight))
            return s.add_arc(src_node, dst_node, ilabel, ilabel if olabel is None else olabel)
        if ilabel is None:
            if label is None:
                raise TypeError("add_arc() needs a label: add_arc(src_node, dst_node, label)")
            ilabel = label
        src = _check_node(self, src_node, "src_node")
        dst = _check_node(self, dst_node, "dst_node")
        il = _check_label(ilabel, "ilabel")
        ol = il if olabel is None else _check_label(olabel, "olabel")
        self._w.append(float(weight))
        return self._s.add_arc(src, dst, il, ol)

    def num_nodes(self) -> int:
        """The number of nodes."""
        return self._s.num_nodes

    def num_arcs(self) -> int:
        """The number of arcs."""
        return self._s.num_arcs()

    def num_start(self) -> int:
        """The number of start nodes."""
        return len(self._s.start_ids)

    def num_accept(self) -> int:
        """The number of accept nodes."""
        return len(self._s.accept_ids)

    # Accessors of GTN's C++ Graph, handy in Python too.
    def start(self) -> List[int]:
        """The ids of the start nodes, in the order they became start nodes."""
        return list(self._s.start_ids)

    def accept(self) -> List[int]:
        """The ids of the accept nodes, in the order they became accept nodes."""
        return list(self._s.accept_ids)

    def is_start(self, i: int) -> bool:
        """Whether node ``i`` is a start node."""
        return self._s.start[_check_node(self, i, "node")]

    def is_accept(self, i: int) -> bool:
        """Whether node ``i`` is an accept node."""
        return self._s.accept[_check_node(self, i, "node")]

    def make_accept(self, i: int) -> None:
        """Makes node ``i`` an accept node (no-op if it already is)."""
        i = _check_node(self, i, "node")
        if not self._s.accept[i]:
            self._s.accept[i] = True
            self._s.accept_ids.append(i)
            self._s.version = _next_version()

    def _arc(self, i: int) -> int:
        n = self.num_arcs()
        try:
            idx = int(i)
        except (TypeError, ValueError):
            raise TypeError(f"arc must be an integer arc id, got {i!r}") from None
        if idx != i or not 0 <= idx < n:
            raise GraphIndexError(f"arc={i!r} is not an arc of this graph (it has {n} arcs)")
        return idx

    def srcnode(self, i: int) -> int:
        """The source node of arc ``i``."""
        return int(self._s.arrays()[0][self._arc(i)])

    def dstnode(self, i: int) -> int:
        """The destination node of arc ``i``."""
        return int(self._s.arrays()[1][self._arc(i)])

    def ilabel(self, i: int) -> int:
        """The input label of arc ``i`` (``label`` is the same, for acceptors)."""
        return int(self._s.arrays()[2][self._arc(i)])

    def olabel(self, i: int) -> int:
        """The output label of arc ``i``."""
        return int(self._s.arrays()[3][self._arc(i)])

    label = ilabel

    def weight(self, i: int) -> float:
        """The weight of arc ``i``."""
        return float(self._weights()[self._arc(i)])

    def set_weight(self, i: int, weight: float) -> None:
        """Sets the weight of arc ``i``."""
        self._weights()[self._arc(i)] = weight
        self._w.version = _next_version()

    def in_arcs(self, i: int) -> List[int]:
        """The ids of the arcs into node ``i`` (insertion order, or label order after ``arc_sort``)."""
        off, arcs, _, _ = self._s.csr()
        i = _check_node(self, i, "node")
        return arcs[off[i] : off[i + 1]].tolist()

    def out_arcs(self, i: int) -> List[int]:
        """The ids of the arcs out of node ``i`` (insertion order, or label order after ``arc_sort``)."""
        _, _, off, arcs = self._s.csr()
        i = _check_node(self, i, "node")
        return arcs[off[i] : off[i + 1]].tolist()

    def num_in(self, i: int) -> int:
        """The number of arcs into node ``i``."""
        off = self._s.csr()[0]
        i = _check_node(self, i, "node")
        return int(off[i + 1] - off[i])

    def num_out(self, i: int) -> int:
        """The number of arcs out of node ``i``."""
        off = self._s.csr()[2]
        i = _check_node(self, i, "node")
        return int(off[i + 1] - off[i])

    # -- sorting ------------------------------------------------------------------
    def arc_sort(self, olabel: bool = False) -> None:
        """Sorts each node's in and out arcs by input (or output) label.

        Arc ids do not change; only the order in which a node lists its arcs does,
        which lets compose and intersect match labels by binary search.
        """
        s = self._s
        if (olabel and s.olabel_sorted) or (not olabel and s.ilabel_sorted):
            return
        src, dst, il, ol = s.arrays()
        labels = ol if olabel else il
        # Sort by (node, label), stable in arc id: the order inside a node follows labels.
        in_arcs = np.lexsort((np.arange(len(dst)), labels, dst)).astype(_INT)
        out_arcs = np.lexsort((np.arange(len(src)), labels, src)).astype(_INT)
        s._csr = None
        s._order = (in_arcs, out_arcs)
        s.olabel_sorted = bool(olabel)
        s.ilabel_sorted = not olabel
        s.version = _next_version()

    def mark_arc_sorted(self, olabel: bool = False) -> None:
        """Declares the arcs sorted by input (or output) label without checking.

        A wrong declaration makes compose and intersect miss matches (as in GTN), never
        read out of range.
        """
        self._s.version = _next_version()
        if olabel:
            self._s.olabel_sorted = True
        else:
            self._s.ilabel_sorted = True

    @property
    def ilabel_sorted(self) -> bool:
        """Whether each node's arcs are ordered by input label."""
        return self._s.ilabel_sorted

    @property
    def olabel_sorted(self) -> bool:
        """Whether each node's arcs are ordered by output label."""
        return self._s.olabel_sorted

    # -- weights ------------------------------------------------------------------
    def _weights(self) -> np.ndarray:
        if self._w is None:
            raise RuntimeError("this graph handle carries no weights")
        return self._w.array()

    def weights(self) -> int:
        """The address of the float32 weights (valid while the graph lives, as in GTN)."""
        return int(self._weights().ctypes.data)

    def weights_to_list(self) -> List[float]:
        """The weights as a list of ``num_arcs()`` floats."""
        return self._weights().tolist()

    def weights_to_numpy(self) -> np.ndarray:
        """A float32 copy of the weights, shape ``(num_arcs,)``."""
        return self._weights().copy()

    def weights_to_tensor(self, copy: bool = False):
        """The weights as a float32 torch tensor of shape ``(num_arcs,)``.

        Without ``copy`` the tensor shares memory with the graph (no copy).
        """
        import torch

        w = self._weights()
        return torch.from_numpy(w.copy() if copy else w)

    def set_weights(self, weights) -> None:
        """Sets all arc weights.

        Args:
            weights: a list of floats, a numpy array or a CPU torch tensor of
                ``num_arcs()`` values (NaN and infinities are kept), or the integer
                address of ``num_arcs()`` contiguous float32 values
                (``tensor.data_ptr()``; the caller keeps that memory alive during the
                call). As in GTN, an address is trusted: one that points into user space
                but not at ``num_arcs()`` readable floats crashes the process. Addresses
                that cannot be valid are refused: negative ones, the first 64 KiB, and
                ranges reaching past the user address space (``2**47`` on x86-64 and
                aarch64).

        Raises:
            ValueError: on a wrong number of values or an impossible address.
            TypeError: on a bool (not an address).
        """
        n = self.num_arcs()
        if isinstance(weights, (bool, np.bool_)):
            raise TypeError("weights: got a bool; pass a list of floats, an array, a tensor or an address")
        if isinstance(weights, (int, np.integer)):
            addr = int(weights)
            if n == 0:
                arr = np.zeros(0, dtype=_FLOAT)
            else:
                if addr == 0:
                    raise ValueError("weights: got a null address")
                if addr < _LOWEST_ADDRESS or addr + 4 * n > _ADDRESS_LIMIT:
                    raise ValueError(
                        f"weights: address {addr:#x} cannot hold {n} float32 values (valid user "
                        f"addresses lie in [{_LOWEST_ADDRESS:#x}, {_ADDRESS_LIMIT:#x}))"
                    )
                buf = (ctypes.c_float * n).from_address(addr)
                # a ctypes array is a buffer; numpy's stubs want the Buffer protocol of Python 3.12
                arr = np.frombuffer(buf, dtype=_FLOAT, count=n).copy()  # type: ignore[call-overload]
        else:
            if hasattr(weights, "detach") and hasattr(weights, "device"):  # torch tensor
                if weights.device.type != "cpu":
                    raise ValueError(f"weights: expected a CPU tensor, got one on {weights.device}")
                weights = weights.detach().reshape(-1).float().numpy()
            try:
                arr = np.array(weights, dtype=_FLOAT).reshape(-1)
            except TypeError as err:
                raise TypeError(f"weights: expected {n} numbers, got {type(weights).__name__} ({err})") from None
            except ValueError as err:
                raise ValueError(f"weights: expected {n} numbers ({err})") from None
            if arr.shape[0] != n:
                raise ValueError(f"weights: expected {n} values (one per arc, shape ({n},)), got {arr.shape[0]}")
        if self._w is None:
            raise RuntimeError("this graph handle carries no weights")
        self._w.set(arr)

    def labels_to_list(self, ilabel: bool = True) -> List[int]:
        """The input (or, with ``ilabel=False``, output) label of every arc, in arc order."""
        return self._s.arrays()[2 if ilabel else 3].tolist()

    def labels_to_numpy(self, ilabel: bool = True) -> np.ndarray:
        """Like ``labels_to_list``, as an int32 array of shape ``(num_arcs,)`` (a copy)."""
        return self._s.arrays()[2 if ilabel else 3].copy()

    def item(self) -> float:
        """The weight of a graph with exactly one arc (a scalar graph)."""
        n = self.num_arcs()
        if n > 1:
            raise ValueError("[Graph::item] Cannot convert Graph with more than 1 arc to a scalar.")
        if n == 0:
            raise ValueError("[Graph::item] Cannot convert Graph with no arcs to a scalar.")
        return float(self._weights()[0])

    # -- autograd -----------------------------------------------------------------
    @property
    def calc_grad(self) -> bool:
        """Whether gradients are computed for this graph. Turning it off drops the
        gradient and the record of the operation that made the graph (as GTN)."""
        return self._g.calc_grad

    @calc_grad.setter
    def calc_grad(self, value: bool) -> None:
        self._g.calc_grad = bool(value)
        if not value:
            self._g.grad_func = None
            self._g.inputs = []
            self._g.grad = None

    def grad(self) -> "Graph":
        """The gradient: a graph with this graph's arcs whose weights are d(output)/d(weight)."""
        if not self._g.calc_grad:
            raise RuntimeError("[Graph::grad] Gradient calculation disabled.")
        if self._g.grad is None:
            raise RuntimeError("[Graph::grad] Gradient not calculated yet.")
        return self._g.grad

    def is_grad_available(self) -> bool:
        """Whether a gradient has been computed (and not cleared)."""
        return self._g.grad is not None

    def zero_grad(self) -> None:
        """Clears the gradient (the next ``backward`` starts from zero)."""
        self._g.grad = None

    def add_grad(self, grad) -> None:
        """Accumulates ``grad`` into the gradient (GTN's ``Graph::addGrad``).

        Does nothing when ``calc_grad`` is off. The first call makes the gradient graph
        (``grad()``), later calls add to its weights.

        Args:
            grad: ``(num_arcs,)`` values (list, numpy array, CPU tensor) or a Graph whose
                weights are used.

        Raises:
            RuntimeError: when ``grad`` does not hold ``num_arcs()`` values (as GTN).
        """
        if not self._g.calc_grad:
            return
        if isinstance(grad, Graph):
            grad = grad._weights()
        try:
            grad = np.asarray(grad, dtype=_FLOAT)
        except (TypeError, ValueError):
            raise RuntimeError("[Graph::addGrad] Invalid grad size.") from None
        if grad.shape != (self.num_arcs(),):
            raise RuntimeError("[Graph::addGrad] Invalid grad size.")
        with self._g.lock:
            if self._g.grad is None:
                gg = Graph(False)
                gg._s = self._s
                gg._w = _Weights(grad.copy())
                self._g.grad = gg
            else:
                gw = self._g.grad._w
                w = gw.array()
                np.add(w, grad, out=w)
                gw.version = _next_version()

    _add_grad = add_grad  # the engine's own name for it

    def id(self) -> int:
        """An identifier shared by all handles of this graph (GTN's ``Graph::id``)."""
        return id(self._g)

    # -- devices (the engine computes on the CPU; dense scoring runs on GPUs) --------
    @property
    def device(self):
        """The graph's device: always the CPU (``gtn.Device(gtn.CPU)``)."""
        from .device import CPU, Device

        return Device(CPU)

    def is_cuda(self) -> bool:
        """Always ``False``: the engine's graphs live on the CPU."""
        return False

    def cpu(self) -> "Graph":
        """The graph itself (it already lives on the CPU)."""
        return self

    def cuda(self, device=None) -> "Graph":
        """Raises ``RuntimeError``: there are no CUDA graphs (score dense emissions on a
        GPU with ``lightning_gtn.functional``)."""
        raise RuntimeError(
            "lightning_gtn.wfst graphs live on the CPU (gtn.cuda.is_available() is False); "
            "score dense emissions on a GPU with lightning_gtn.functional instead"
        )

    def to(self, device) -> "Graph":
        """The graph itself for a CPU device; ``RuntimeError`` for a CUDA one."""
        from .device import _as_device

        if _as_device(device).is_cuda:
            return self.cuda(device)
        return self

    # -- python protocols -------------------------------------------------------------
    def __getstate__(self):
        s = self._s
        src, dst, il, ol = s.arrays()
        order = s._order
        return {
            "num_nodes": s.num_nodes,
            "start_ids": list(s.start_ids),
            "accept_ids": list(s.accept_ids),
            "arcs": (src, dst, il, ol),
            "weights": self._weights() if self._w is not None else None,
            "calc_grad": self._g.calc_grad,
            "sorted": (s.ilabel_sorted, s.olabel_sorted),
            "order": order,
        }

    def __setstate__(self, state) -> None:
        """Restores a graph from :meth:`__getstate__`'s dict, checking every field.

        Raises:
            ValueError: naming the field that is missing or wrong (see
                :meth:`from_arrays`; also the sorted flags and the arc order).
        """
        where = "Graph.__setstate__"
        if not isinstance(state, dict):
            raise ValueError(f"{where}: state must be a dict, got {type(state).__name__}")
        for key in ("num_nodes", "start_ids", "accept_ids", "arcs", "weights"):
            if key not in state:
                raise ValueError(f"{where}: state has no {key!r}")
        arcs = state["arcs"]
        if not isinstance(arcs, (tuple, list)) or len(arcs) != 4:
            raise ValueError(f"{where}: arcs must be (src, dst, ilabel, olabel)")
        if state["weights"] is None:
            raise ValueError(f"{where}: weights must be a 1-D sequence of numbers, got None")
        a_src, a_dst, a_il, a_ol = arcs
        n, start, accept, src, dst, il, ol, w = _validate_arrays(
            state["num_nodes"],
            state["start_ids"],
            state["accept_ids"],
            a_src,
            a_dst,
            a_il,
            a_ol,
            state["weights"],
            where,
            copy=True,
            node_budget=True,
        )
        calc_grad = state.get("calc_grad", True)
        if not isinstance(calc_grad, (bool, np.bool_, int, np.integer)):
            raise ValueError(f"{where}: calc_grad must be a bool, got {type(calc_grad).__name__}")
        flags = state.get("sorted", (False, False))
        if (
            not isinstance(flags, (tuple, list))
            or len(flags) != 2
            or not all(isinstance(f, (bool, np.bool_)) for f in flags)
        ):
            raise ValueError(f"{where}: sorted must be a pair of bools")
        order = state.get("order")
        if order is not None:
            if not isinstance(order, (tuple, list)) or len(order) != 2:
                raise ValueError(f"{where}: order must be None or (in_arcs, out_arcs)")
            e = len(src)
            checked = []
            for name, arcs_of, ends in (("order[0] (in_arcs)", order[0], dst), ("order[1] (out_arcs)", order[1], src)):
                a = _as_int_array(arcs_of, name, where, 0, max(e, 1), True)
                if len(a) != e or (e and np.bincount(a, minlength=e).max() != 1):
                    raise ValueError(f"{where}: {name} must list each of the {e} arcs once")
                if e and np.any(np.diff(ends[a]) < 0):
                    raise ValueError(f"{where}: {name} must group arcs by node in node order")
                checked.append(a)
            order = tuple(checked)
        # A sorted flag is kept only where it holds: compose and intersect trust it (a graph
        # flagged sorted that is not would match labels wrongly, silently).
        in_order, out_order = order if order is not None else (None, None)
        flags = tuple(
            bool(f) and _labels_sorted(src, out_order, labels) and _labels_sorted(dst, in_order, labels)
            for f, labels in zip(flags, (il, ol))
        )
        g = Graph._from_arrays(n, start, accept, src, dst, il, ol, w, calc_grad=bool(calc_grad))
        g._s.ilabel_sorted, g._s.olabel_sorted = flags
        g._s._order = order
        self._s, self._w, self._g = g._s, g._w, g._g

    def __reduce_ex__(self, protocol):
        return (Graph, (), self.__getstate__())

    def __copy__(self) -> "Graph":
        return self._alias()

    def __deepcopy__(self, memo) -> "Graph":
        out = Graph.__new__(Graph)
        out.__setstate__(self.__getstate__())
        memo[id(self)] = out
        return out

    def __repr__(self) -> str:
        return format_graph(self)

    def __str__(self) -> str:
        return self.__repr__()


def _deep_copy(g: Graph, calc_grad: Optional[bool] = None) -> Graph:
    """A copy with its own structure and weights (GTN's ``Graph::deepCopy``)."""
    out = Graph(g.calc_grad if calc_grad is None else calc_grad)
    out._s = g._s.copy()
    out._w = _Weights(g._weights().copy())
    return out
