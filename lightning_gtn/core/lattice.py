"""Lattices: acyclic graphs whose arcs read any position of a dense per-example tensor.

This generalises :class:`~lightning_gtn.core.scoring.Plan`, whose criterion graphs read frames in
time order from one ``(T, C)`` emission row: an arc of a lattice names the position it reads in
its example's flattened scores ``scores[b].reshape(-1)`` (its input label), so one scorer serves a
joiner output ``(B, T, U + 1, V)`` (RNN-T), a pruned one ``(B, T, s_range, V)``, or any
``(B, ..., V)`` tensor, and any graph a user writes over it.

The lattice convention (a :class:`lightning_gtn.wfst.Graph`):

* every arc's ``ilabel`` is a position ``p`` in ``[0, N)`` of the flattened per-example scores
  (``N = scores[b].numel()``): the arc scores ``scores[b].reshape(-1)[p] + weight``; ``ilabel ==
  -1`` (``gtn.epsilon``) is an arc with only its weight;
* ``olabel`` is free for the user (the RNN-T lattices put the emitted token there, -1 for blank),
  and comes back with the best path;
* the graph must be acyclic (all arcs, not only the epsilon ones); several start and accept nodes
  are fine; ``log Z`` is the log-sum-exp (or max) over all start-to-accept paths.

:func:`compile_lattice` renumbers the nodes in a topological order and groups the arcs by
destination and by source; :func:`compiled_lattice` caches it per graph object and version;
:class:`LatticeBatch` concatenates compiled lattices; :class:`LatticePlan` pairs each example with
a lattice, a row of the scores and a sign (as ``Plan`` does); :func:`score_plan` runs the numba
kernels of :mod:`lightning_gtn.kernels.lattice_numba`. Every index a kernel reads is checked here
first: node ids by the graph, positions against ``N`` by :meth:`LatticePlan.check_positions`, arc
weights (no NaN or +inf) when compiled; a NaN or +inf score a lattice reads is reported by the
forward kernel and raised by :func:`score_plan`.

:class:`LatticeBuilder` and the custom op :func:`lattice_loss_op` (``lightning_gtn::lattice_loss``)
build and cache each example's lattice from its target, length and the scores' shape inside the
op, so losses over lattices compile with ``torch.compile(fullgraph=True)``; the gradient is
computed in the op's forward and scaled by its registered backward, as in
:mod:`lightning_gtn.core.criterion`.
"""

from __future__ import annotations

import weakref
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ..kernels import lattice_numba
from ..kernels.compiled_graphs import INDEX_DTYPE
from ..opargs import grads, op_schema
from ..wfst import Graph
from . import checks, dispatch
from .cache import LRU, HandleRegistry
from .impl import Backends
from .reduction import reduction_coefficients

__all__ = [
    "CompiledLattice",
    "compile_lattice",
    "compiled_lattice",
    "LatticeBatch",
    "LatticePlan",
    "score_plan",
    "LATTICE_CACHE_SIZE",
    "LATTICE_BACKENDS",
    "LatticeBuilder",
    "register_builder",
    "lattice_loss_op",
]

#: compiled lattices kept per graph object (the most recently used)
LATTICE_CACHE_SIZE = 4096

_INT = INDEX_DTYPE


def _no_triton() -> bool:
    return False


def _nothing_to_check(device: torch.device) -> Optional[str]:
    return None


#: the implementations of the lattice scorer (``impl=`` besides None): the CPU numba kernels only;
#: tensors on another device are scored on the CPU and the results moved back
LATTICE_BACKENDS = Backends("lattices", ("numba",), triton_available=_no_triton, self_check=_nothing_to_check)


class CompiledLattice:
    """One lattice as arrays, nodes renumbered in a topological order.

    Attributes:
        num_nodes, num_arcs: sizes (an empty graph is one isolated node: no path).
        src, dst: ``(num_arcs,)`` int32 renumbered nodes of each arc (graph arc order), ``src < dst``.
        pos: ``(num_arcs,)`` int32 position each arc reads, -1 for none.
        olabel: ``(num_arcs,)`` int32 output labels (returned with best paths).
        weights: ``(num_arcs,)`` float32 arc weights when compiled.
        start, accept: ``(num_nodes,)`` uint8 flags (renumbered).
        in_off, in_arc: arcs grouped by destination (CSR, ``in_off`` ``(num_nodes + 1,)`` int64).
        out_off, out_arc: arcs grouped by source.
        node_id: ``(num_nodes,)`` the graph's own id of each renumbered node.
        max_pos: the largest position read (-1 when none).
        max_deg: the most arcs into or out of one node.
    """

    __slots__ = (
        "num_nodes",
        "num_arcs",
        "src",
        "dst",
        "pos",
        "olabel",
        "weights",
        "start",
        "accept",
        "in_off",
        "in_arc",
        "out_off",
        "out_arc",
        "node_id",
        "max_pos",
        "max_deg",
    )
    num_nodes: int
    num_arcs: int
    src: np.ndarray
    dst: np.ndarray
    pos: np.ndarray
    olabel: np.ndarray
    weights: np.ndarray
    start: np.ndarray
    accept: np.ndarray
    in_off: np.ndarray
    in_arc: np.ndarray
    out_off: np.ndarray
    out_arc: np.ndarray
    node_id: np.ndarray
    max_pos: int
    max_deg: int


def compile_lattice(g: Graph, name: str = "lattice") -> CompiledLattice:
    """Compiles a lattice (see the module docstring); ValueError naming ``name`` on a cycle."""
    if not isinstance(g, Graph):
        raise ValueError(f"{name} must be a lightning_gtn.wfst.Graph, got {type(g).__name__}")
    a = g.arrays()
    n = max(a.num_nodes, 1)
    src = a.src.astype(np.int64)
    dst = a.dst.astype(np.int64)
    if bool((src < dst).all()):  # the ids are a topological order already (grids built row by row): keep them,
        order = np.arange(n, dtype=np.int64)  # so the kernels walk the scores in the order they are stored
    else:
        order = lattice_numba.topological_order(n, src, dst)
    if len(order) != n:
        raise ValueError(
            f"{name}: the graph has a cycle; a lattice must be acyclic (every arc reads a position once, "
            "so a path cannot loop). Build it as a grid (e.g. nodes (t, u)) whose arcs go forward."
        )
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    cl = CompiledLattice()
    cl.num_nodes = n
    cl.num_arcs = len(src)
    cl.src = rank[src].astype(_INT)
    cl.dst = rank[dst].astype(_INT)
    cl.pos = np.ascontiguousarray(a.ilabel, dtype=_INT)
    cl.olabel = np.ascontiguousarray(a.olabel, dtype=_INT)
    cl.weights = np.array(a.weights, dtype=np.float32)
    bad = np.nonzero(np.isnan(cl.weights) | (cl.weights == np.inf))[0]
    if len(bad):
        raise ValueError(
            f"{name}: arc {int(bad[0])} has weight {float(cl.weights[bad[0]])}; arc weights must be finite (or -inf)"
        )
    cl.start = np.zeros(n, dtype=np.uint8)
    cl.accept = np.zeros(n, dtype=np.uint8)
    cl.start[rank[a.start.astype(np.int64)]] = 1
    cl.accept[rank[a.accept.astype(np.int64)]] = 1
    cl.in_arc = np.argsort(cl.dst, kind="stable").astype(_INT)
    cl.out_arc = np.argsort(cl.src, kind="stable").astype(_INT)
    cin = np.bincount(cl.dst, minlength=n)
    cout = np.bincount(cl.src, minlength=n)
    cl.in_off = np.concatenate([[0], np.cumsum(cin)]).astype(np.int64)
    cl.out_off = np.concatenate([[0], np.cumsum(cout)]).astype(np.int64)
    cl.node_id = order.astype(_INT)
    cl.max_pos = int(cl.pos.max()) if cl.num_arcs else -1
    cl.max_deg = int(max(cin.max(initial=0), cout.max(initial=0)))
    return cl


_LATTICES: LRU = LRU(LATTICE_CACHE_SIZE)


def compiled_lattice(g: Graph, name: str = "lattice") -> CompiledLattice:
    """The compiled form of lattice ``g``, compiled again only when the graph changed (keyed by
    ``id(g)`` with a weak reference and the graph's :attr:`~lightning_gtn.wfst.Graph.version`)."""
    if not isinstance(g, Graph):
        raise ValueError(f"{name} must be a lightning_gtn.wfst.Graph, got {type(g).__name__}")
    key, version = id(g), g.version
    hit = _LATTICES.get(key)
    if hit is not None and hit[0]() is g and hit[1] == version:
        return hit[2]
    cl = compile_lattice(g, name)
    entry: list = []

    def forget(ref: weakref.ref, key: int = key) -> None:
        if entry:
            _LATTICES.discard(key, entry[0])

    entry.append((weakref.ref(g, forget), version, cl))
    _LATTICES.put(key, entry[0])
    return cl


class LatticeBatch:
    """Compiled lattices concatenated (what the kernels read): node ids stay local to their
    lattice, arc ids are global (local id + ``arc_off``)."""

    def __init__(self, lattices: Sequence[CompiledLattice]) -> None:
        self.lattices = list(lattices)
        ls = self.lattices

        def offsets(sizes) -> np.ndarray:
            off = np.zeros(len(sizes) + 1, dtype=np.int64)
            if len(sizes):
                np.cumsum(sizes, out=off[1:])
            return off

        def cat(arrays, dtype) -> np.ndarray:
            if not arrays:
                return np.zeros(0, dtype=dtype)
            return np.ascontiguousarray(np.concatenate(arrays), dtype=dtype)

        self.node_off = offsets([c.num_nodes for c in ls])
        self.arc_off = offsets([c.num_arcs for c in ls])
        ao = self.arc_off
        self.src = cat([c.src for c in ls], _INT)
        self.dst = cat([c.dst for c in ls], _INT)
        self.pos = cat([c.pos for c in ls], _INT)
        self.start = cat([c.start for c in ls], np.uint8)
        self.accept = cat([c.accept for c in ls], np.uint8)
        self.in_arc = cat([c.in_arc.astype(np.int64) + ao[i] for i, c in enumerate(ls)], np.int64)
        self.out_arc = cat([c.out_arc.astype(np.int64) + ao[i] for i, c in enumerate(ls)], np.int64)
        self.in_off = offsets(cat([np.diff(c.in_off) for c in ls], np.int64))
        self.out_off = offsets(cat([np.diff(c.out_off) for c in ls], np.int64))
        self.max_nodes = max((c.num_nodes for c in ls), default=0)
        self.max_deg = max((c.max_deg for c in ls), default=0)
        self.max_pos = max((c.max_pos for c in ls), default=-1)
        self._weights: Optional[np.ndarray] = None

    @property
    def num_arcs(self) -> int:
        """All arcs of the batch."""
        return int(self.arc_off[-1])

    def weights(self) -> np.ndarray:
        """The compiled arc weights of all lattices, concatenated (float32, global arc order)."""
        if self._weights is None:
            self._weights = np.ascontiguousarray(
                np.concatenate([c.weights for c in self.lattices]) if self.lattices else np.zeros(0), dtype=np.float32
            )
        return self._weights


class LatticePlan:
    """Examples of a lattice loss: which lattice scores which row of the scores, with which sign
    (``loss[b] = sum over the examples e of row b of sign[e] * log Z[e]``).

    Args:
        lattices: the distinct compiled lattices.
        ex_graph, ex_row, ex_sign: ``(E,)`` per example: lattice index, row, sign.
        B: the number of rows.
    """

    def __init__(self, lattices: Sequence[CompiledLattice], ex_graph, ex_row, ex_sign, B: int) -> None:
        self.batch = LatticeBatch(lattices)
        order = np.argsort(np.asarray(ex_row, dtype=np.int64), kind="stable")
        self.order = order  # example e of the plan is input example order[e]
        self.ex_graph = np.ascontiguousarray(np.asarray(ex_graph, dtype=np.int64)[order])
        self.ex_row = np.ascontiguousarray(np.asarray(ex_row, dtype=np.int64)[order])
        self.sign = np.ascontiguousarray(np.asarray(ex_sign, dtype=np.float64)[order])
        self.B = int(B)
        if len(self.ex_row) and (self.ex_row.min() < 0 or self.ex_row.max() >= self.B):
            raise ValueError(f"LatticePlan: example rows must lie in [0, {self.B})")
        if len(self.ex_graph) and (self.ex_graph.min() < 0 or self.ex_graph.max() >= len(self.batch.lattices)):
            raise ValueError("LatticePlan: example lattice ids out of range")

    def check_positions(self, N: int, name: str = "lattices") -> None:
        """ValueError naming ``name`` when an arc reads a position outside ``[0, N)``."""
        for i, c in enumerate(self.batch.lattices):
            if c.max_pos >= N:
                a = int(np.argmax(c.pos))
                raise ValueError(
                    f"{name}: an arc (arc {a} of lattice {i}) reads position {c.max_pos}, but each example's "
                    f"scores have N={N} positions; arcs must read positions in [0, N) or -1 (epsilon)"
                )


def score_plan(
    plan: LatticePlan,
    S: torch.Tensor,
    w: torch.Tensor,
    semiring: str = "log",
    coef: Optional[torch.Tensor] = None,
    need_s: bool = False,
    need_w: bool = False,
    need_path: bool = False,
    zero_infinity: bool = False,
    name: str = "scores",
):
    """Losses of a plan and, on request, their gradients and best paths (CPU, numba).

    Args:
        plan: the examples (positions already checked with :meth:`LatticePlan.check_positions`).
        S: ``(B, N)`` float32/float64 scores on the CPU.
        w: ``(num_arcs,)`` arc weights of ``plan.batch``, S's dtype.
        semiring: ``"log"`` (log-sum-exp over paths) or ``"max"`` (the best path).
        coef: ``(B,)`` the coefficient of each row's loss in the gradients (default all ones:
            the gradient of every row's own loss).
        need_s, need_w: return ``sum_b coef[b] * d loss[b] / d S`` ``(B, N)`` and ``... / d w``
            ``(num_arcs,)``.
        need_path: (max) return each example's best path as local arc ids.
        zero_infinity: rows whose loss is infinite (no path) get loss 0.
        name: how a ValueError names ``S`` when an example reads a NaN or +inf score in it
            (-inf is fine: an impossible arc).

    Returns:
        ``(losses (B,), grad_S or None, grad_w or None, paths or None)``: ``losses`` in S's
        dtype; rows without a path have zero gradients; ``paths`` is a list over the plan's input
        examples of int64 arrays (None when the example has no path).
    """
    use_max = dispatch.check_semiring(semiring) == "max"
    S = S.detach().contiguous()
    w = w.detach().to(S.dtype).contiguous()
    Sn, wn = S.numpy(), w.numpy()
    B = plan.B
    c = np.ones(B) if coef is None else coef.detach().to("cpu", torch.float64).numpy()
    ex_coef = np.ascontiguousarray(plan.sign * c[plan.ex_row]) if len(plan.ex_row) else np.zeros(0)
    logz, gS, gw_ex, gw_off, paths, path_len, badpos = lattice_numba.lattice_pass(
        Sn, wn, ex_coef, plan.batch, plan.ex_graph, plan.ex_row, use_max, need_s, need_w, need_path
    )
    bad_e = np.nonzero(badpos >= 0)[0]
    if len(bad_e):
        e = int(bad_e[0])
        b, p = int(plan.ex_row[e]), int(badpos[e])
        raise ValueError(
            f"{name} contains {float(Sn[b, p])} at position {p} of example {b}, which its lattice reads; scores must "
            "be finite (or -inf for an impossible arc)"
        )
    contrib = plan.sign * logz.astype(np.float64)
    contrib = np.where((logz == -np.inf) & (plan.sign != 0), np.inf, contrib)  # no path: an infinite loss
    losses = np.zeros(B, dtype=np.float64)
    np.add.at(losses, plan.ex_row, contrib)
    bad = ~np.isfinite(losses)
    if zero_infinity:
        losses[bad] = 0.0
    out = torch.from_numpy(losses).to(S.dtype)
    gradS = gradw = None
    if need_s and gS is not None:
        if bad.any():
            gS[bad] = 0.0
        gradS = torch.from_numpy(gS)
    if need_w and gw_ex is not None:
        E = len(plan.ex_graph)
        arcs = np.diff(gw_off)
        ex = np.repeat(np.arange(E), arcs)
        keep = ~bad[plan.ex_row][ex]
        ids = plan.batch.arc_off[plan.ex_graph][ex] + (np.arange(int(gw_off[-1])) - np.repeat(gw_off[:-1], arcs))
        g = np.zeros(plan.batch.num_arcs, dtype=np.float64)
        np.add.at(g, ids[keep], gw_ex[keep])
        gradw = torch.from_numpy(g).to(S.dtype)
    path_list: Optional[List[Optional[np.ndarray]]] = None
    if need_path and paths is not None:
        buf, off = paths
        path_list = [None] * len(plan.ex_graph)
        for e in range(len(plan.ex_graph)):
            if path_len[e] >= 0:
                path_list[int(plan.order[e])] = buf[off[e] : off[e] + path_len[e]].copy()
    return out, gradS, gradw, path_list


# ---------------------------------------------------------------------------
# lattices built from targets inside a custom op (what torch.compile sees)
# ---------------------------------------------------------------------------


class LatticeBuilder:
    """Builds (and caches) the lattice of each example from its target and length, so that a loss
    over lattices can run inside the custom op :func:`lattice_loss_op` (``torch.compile`` sees
    only the op). Subclasses implement :meth:`build`; see
    :class:`lightning_gtn.losses.lattice.LatticeCriterion`.

    Attributes:
        name: how messages name the loss.
        blank: a label the targets must not contain, or None.
        handle: the integer the op names this builder by (set by :func:`register_builder`).
        cache: the compiled lattices, per ``(target, frames, shape)``.
    """

    name: str = "lattice_loss"
    blank: Optional[int] = None
    handle: int = 0

    def __init__(self, cache_size: int = LATTICE_CACHE_SIZE) -> None:
        self.cache: LRU = LRU(cache_size)
        register_builder(self)

    def build(self, target: List[int], frames: int, shape: Tuple[int, ...]) -> Graph:
        """The lattice of one example: ``target`` token ids, ``frames`` its input length, over
        per-example scores of shape ``shape`` (the scores without their batch dimension)."""
        raise NotImplementedError

    def target_classes(self, shape: Tuple[int, ...]) -> int:
        """Targets must lie in ``[0, target_classes(shape))``: the last dimension by default."""
        return int(shape[-1]) if shape else 0

    def compiled(self, target: List[int], frames: int, shape: Tuple[int, ...]) -> CompiledLattice:
        """The compiled lattice of one example, cached."""
        key = (tuple(target), int(frames), tuple(shape))
        return self.cache.get(
            key, lambda: compile_lattice(self.build(list(target), int(frames), tuple(shape)), self.name)
        )

    def plan(self, seqs: List[List[int]], lengths: np.ndarray, shape: Tuple[int, ...]) -> LatticePlan:
        """One lattice per example (``-log Z`` each), positions checked against ``shape``."""
        B = len(seqs)
        index: dict = {}
        lats: List[CompiledLattice] = []
        ids = np.empty(B, dtype=np.int64)
        for b in range(B):
            c = self.compiled(seqs[b], int(lengths[b]), shape)
            j = index.get(id(c))
            if j is None:
                j = index[id(c)] = len(lats)
                lats.append(c)
            ids[b] = j
        plan = LatticePlan(lats, ids, np.arange(B), -np.ones(B), B)
        plan.check_positions(int(np.prod(shape)) if shape else 1, f"{self.name}: the built lattices")
        return plan


_BUILDERS: HandleRegistry[LatticeBuilder] = HandleRegistry("lattice builder")


def register_builder(obj: LatticeBuilder) -> int:
    """An integer handle for ``obj`` (held weakly), also stored as ``obj.handle``."""
    h = _BUILDERS.register(obj)
    obj.handle = h
    return h


class LatticeLossArgs(NamedTuple):
    """The arguments of ``lightning_gtn::lattice_loss``."""

    scores: torch.Tensor
    targets: torch.Tensor
    input_lengths: torch.Tensor
    target_lengths: torch.Tensor
    handle: int
    reduction: str
    zero_infinity: bool
    semiring: str
    need_s: bool


@torch.library.custom_op("lightning_gtn::lattice_loss", mutates_args=())
@op_schema(LatticeLossArgs)
def lattice_loss_op(
    scores: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    handle: int,
    reduction: str,
    zero_infinity: bool,
    semiring: str,
    need_s: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out, d out / d scores)`` of the lattices that builder ``handle`` makes from the targets:
    ``out`` is ``(B,)`` for ``reduction="none"`` (the gradient then per row), else a scalar
    (``"mean"``: the batch mean). ``scores`` is ``(B, T, ...)``; ``input_lengths <= T``. The
    gradient is an empty tensor unless ``need_s``."""
    B = int(scores.shape[0])
    shape = tuple(int(s) for s in scores.shape[1:])
    dev = scores.device
    crit = _BUILDERS.get(handle)
    lengths = checks.as_lengths(input_lengths, B, "input_lengths", dev, max_value=shape[0] if shape else 0)
    seqs = checks.split_targets(targets, target_lengths, B, dev, crit.target_classes(shape), blank=crit.blank)
    plan = crit.plan(seqs, lengths, shape)
    x = scores.detach().to("cpu").reshape(B, int(np.prod(shape)))
    w = torch.from_numpy(plan.batch.weights()).to(x.dtype)
    coef = None if reduction == "none" else reduction_coefficients(reduction, B)
    losses, gS, _, _ = score_plan(plan, x, w, semiring, coef=coef, need_s=need_s, zero_infinity=zero_infinity)
    out = losses if coef is None else (losses.to(torch.float64) * coef).sum().to(x.dtype)
    g = gS.reshape(scores.shape).to(dev) if gS is not None else scores.new_empty(0)
    return out.to(dev), g


@lattice_loss_op.register_fake
def _lattice_loss_fake(*inputs):
    a = LatticeLossArgs(*inputs)
    scores = a.scores
    out = scores.new_empty((scores.shape[0],) if a.reduction == "none" else ())
    return out, (torch.empty_like(scores) if a.need_s else scores.new_empty(0))


def _lattice_setup(ctx, inputs, output):
    ctx.reduction = LatticeLossArgs(*inputs).reduction
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1])


def _lattice_backward(ctx, g_out, _g_grad):
    (g,) = ctx.saved_tensors
    gS = None
    if g_out is not None and g.numel():
        if (
            ctx.reduction != "none"
            and g_out.device.type == "cpu"
            and not torch.compiler.is_compiling()
            and float(g_out) == 1.0
        ):
            return grads(LatticeLossArgs, scores=g)  # loss.backward(): no second (B, ...) buffer
        gS = g * (g_out.reshape((-1,) + (1,) * (g.dim() - 1)) if ctx.reduction == "none" else g_out).to(g.dtype)
    return grads(LatticeLossArgs, scores=gS)


lattice_loss_op.register_autograd(_lattice_backward, setup_context=_lattice_setup)
