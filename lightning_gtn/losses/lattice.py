"""Losses over lattices: acyclic graphs whose arcs read any position of a dense tensor.

A lattice is a :class:`lightning_gtn.wfst.Graph` whose arcs' input labels are positions in an
example's flattened scores (see :mod:`lightning_gtn.core.lattice` for the convention). With it,
a regular RNN-T (:func:`rnnt_lattice`), a pruned one (:func:`pruned_rnnt_lattice`), and any
transducer grid a user writes with GTN's API are scored by the same batched kernels:
:func:`lattice_loss` (``-log`` of the sum over paths, or of the best path) and
:func:`lattice_viterbi` (the best path: its arcs, the positions it reads, its output labels).
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..core import checks, criterion, dispatch
from ..core.criterion import Criterion
from ..core.lattice import (
    LATTICE_BACKENDS,
    LatticeBuilder,
    LatticeLossArgs,
    LatticePlan,
    compiled_lattice,
    lattice_loss_op,
    score_plan,
)
from ..core.reduction import reduction_coefficients
from ..wfst import Graph

__all__ = [
    "lattice_loss",
    "lattice_viterbi",
    "LatticePath",
    "rnnt_lattice",
    "pruned_rnnt_lattice",
    "frame_lattice",
    "LatticeCriterion",
    "lattice_criterion_loss",
    "rnnt_lattice_loss",
]

_MAX_POS = 2**31 - 1  # positions are int32 input labels


def _check_scores(scores, name: str = "scores"):
    if not isinstance(scores, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (B, ...) , got {type(scores).__name__}")
    if scores.dim() < 2:
        raise ValueError(f"{name} must have shape (B, N) or (B, ..., V) (batch first), got {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {scores.dtype}")
    B = int(scores.shape[0])
    N = int(np.prod(scores.shape[1:]))
    return B, N


def _plan(lattices, B: int, N: int, name: str = "lattices"):
    """``(plan, distinct graph objects)`` for one lattice per row, positions checked against ``N``."""
    graphs = checks.graph_list(lattices, B, name)
    order: List[Graph] = []
    index: dict = {}
    ids = np.empty(B, dtype=np.int64)
    for b, g in enumerate(graphs):
        j = index.get(id(g))
        if j is None:
            j = index[id(g)] = len(order)
            order.append(g)
        ids[b] = j
    compiled = [compiled_lattice(g, f"{name}[{ids.tolist().index(j)}]") for j, g in enumerate(order)]
    plan = LatticePlan(compiled, ids, np.arange(B), -np.ones(B), B)
    plan.check_positions(N, name)
    return plan, order


class _Lattices(Criterion):
    """The lattice losses as criteria of :func:`~lightning_gtn.core.criterion.apply_loss`: the
    input is the scores ``(B, N)`` or ``(B, ..., V)`` (its shape given as ``(B, N)``, ``N`` the
    positions of one example), scored by the CPU numba kernels whatever their device
    (:data:`~lightning_gtn.core.lattice.LATTICE_BACKENDS`); the call option ``semiring``."""

    picker = LATTICE_BACKENDS

    def check_emissions(self, emissions, name: str) -> Tuple[int, ...]:
        return _check_scores(emissions, name)

    def check_backend(self, impl, device: Optional[torch.device] = None) -> Optional[str]:
        return super().check_backend(impl, torch.device("cpu"))  # tensors elsewhere are scored on the CPU

    def take_options(self, options: Dict[str, object], *names: str) -> Tuple[str, Dict[str, object]]:
        """``(semiring, the options named)``, checked; any other option is a TypeError."""
        rest = dict(options)
        semiring = rest.pop("semiring", "log")
        picked = {n: rest.pop(n, None) for n in names}
        super().check_call_options((), rest)
        return dispatch.check_semiring(semiring), picked

    def own_kernel(self, device: torch.device, impl: Optional[str]) -> Optional[str]:
        return impl or "numba"


class _GraphLattices(_Lattices):
    """:func:`lattice_loss`: the user's :class:`~lightning_gtn.wfst.Graph` lattices (call option
    ``lattices``), scored by an autograd Function over :func:`~lightning_gtn.core.lattice.score_plan`
    that gives the graphs' weights their gradients; no targets or lengths."""

    name = "lattice_loss"

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        semiring, o = self.take_options(options, "lattices")
        plan, order = _plan(o["lattices"], shape[0], shape[1])
        return {"semiring": semiring, "plan": plan, "graphs": order, "positions": shape[1]}

    def index_tensors(self, targets, input_lengths, target_lengths, B: int, device: torch.device):
        return None, None, None

    def call_kernel(
        self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e, options
    ) -> torch.Tensor:
        plan, order = options["plan"], options["graphs"]
        S = x.reshape(plan.B, options["positions"])
        if S.device.type != "cpu":
            S = S.cpu()
        w = torch.from_numpy(plan.batch.weights()).to(x.dtype)
        need_w = bool(torch.is_grad_enabled() and any(g.calc_grad for g in order))
        if need_w:
            w = w.requires_grad_(True)  # a private leaf: autograd calls backward, which fills graph.grad()
        out = _LatticeLossFunction.apply(S, w, plan, reduction, bool(zero_infinity), options["semiring"], need_w, order)
        return out.to(device=x.device)


class _BuiltLattices(_Lattices):
    """:func:`lattice_criterion_loss` and :func:`rnnt_lattice_loss`: lattices that a
    :class:`LatticeCriterion` (call option ``builder``) builds from the targets and input
    lengths inside the custom op ``lightning_gtn::lattice_loss`` (``LatticeLossArgs``)."""

    name = "lattice_criterion_loss"

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        semiring, o = self.take_options(options, "builder")
        builder = o["builder"]
        if not isinstance(builder, LatticeBuilder):
            raise ValueError(f"{self.name}: builder must be a LatticeBuilder, got {type(builder).__name__}")
        return {"semiring": semiring, "handle": builder.handle}

    def call_kernel(
        self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e, options
    ) -> torch.Tensor:
        args = LatticeLossArgs(
            scores=x,
            targets=targets,
            input_lengths=input_lengths,
            target_lengths=target_lengths,
            handle=options["handle"],
            reduction=reduction,
            zero_infinity=bool(zero_infinity),
            semiring=options["semiring"],
            need_s=need_e,
        )
        out, _ = lattice_loss_op(*args)
        return out


_GRAPH_LATTICES = _GraphLattices()
_BUILT_LATTICES = _BuiltLattices()


class _LatticeLossFunction(torch.autograd.Function):
    """``out`` of :func:`lattice_loss`; gradients computed in the forward, scaled in the backward."""

    @staticmethod
    def forward(ctx, S, w, plan, reduction, zero_infinity, semiring, need_w, graphs):
        need_s = bool(ctx.needs_input_grad[0])
        coef = None if reduction == "none" else reduction_coefficients(reduction, plan.B)
        losses, gS, gw, _ = score_plan(
            plan,
            S,
            w,
            semiring,
            coef=coef,
            need_s=need_s,
            need_w=need_w and reduction != "none",
            zero_infinity=zero_infinity,
        )
        ctx.save_for_backward(S, w)
        ctx.gS, ctx.gw = gS, gw
        ctx.args = (plan, reduction, zero_infinity, semiring, need_w, graphs)
        if reduction == "none":
            return losses
        return (losses.to(torch.float64) * coef).sum().to(S.dtype)

    @staticmethod
    def backward(ctx, g_out):
        S, w = ctx.saved_tensors
        plan, reduction, zero_infinity, semiring, need_w, graphs = ctx.args
        gS = gw = None
        if ctx.gS is not None:
            if reduction != "none" and g_out.numel() == 1 and float(g_out) == 1.0:
                gS = ctx.gS  # the usual loss.backward(): no (B, N) copy
            else:
                gS = ctx.gS * (g_out.reshape(-1, 1) if reduction == "none" else g_out)
        if need_w:
            if reduction == "none":
                gw = score_plan(plan, S, w, semiring, coef=g_out, need_w=True, zero_infinity=zero_infinity)[2]
            elif ctx.gw is not None:
                gw = ctx.gw * g_out
        if gw is not None:
            host = gw.detach().to(torch.float32).numpy()
            arc_off = plan.batch.arc_off
            for j, g in enumerate(graphs):
                if g.calc_grad:  # GTN's convention: the graph's own gradient, see Graph.grad()
                    g.add_grad(host[arc_off[j] : arc_off[j + 1]])
        return gS, (gw if ctx.needs_input_grad[1] else None), None, None, None, None, None, None


def lattice_loss(
    scores: torch.Tensor,
    lattices: Union[Graph, Sequence[Graph]],
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
    *,
    semiring: str = "log",
) -> torch.Tensor:
    """Negative log-sum over the paths of each example's lattice, arcs reading ``scores``.

    Arc ``a`` of ``lattices[b]`` contributes ``scores[b].reshape(-1)[ilabel(a)] + weight(a)``
    (``ilabel == -1``: only its weight); a path's score is the sum over its arcs; the loss of
    example ``b`` is ``-logsumexp`` over the start-to-accept paths (``semiring="max"``: ``-max``,
    the Viterbi loss, whose gradient is the best path's indicator). The lattices must be acyclic.

    Args:
        scores: ``(B, N)`` or ``(B, ..., V)`` float scores (e.g. RNN-T log-probabilities
            ``(B, T, U + 1, V)``); float16/bfloat16 are scored in float32. Tensors off the CPU are
            scored on the CPU (the gradient comes back on their device).
        lattices: one :class:`lightning_gtn.wfst.Graph` per example, or one shared by all;
            positions in ``[0, N)`` with ``N = scores[b].numel()``, checked before any kernel
            runs. Compiled lattices are cached per graph object and version.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: the batch mean (no division by
            any length: a lattice has none).
        zero_infinity: examples with no path give 0 (and zero gradients) instead of ``inf``.
        impl: None or ``"numba"`` (the only implementation of the generic lattice).
        semiring: ``"log"`` (default) or ``"max"``.

    Returns:
        The loss in ``scores``' dtype and device. Graphs created with ``calc_grad=True`` (the
        default of ``Graph()``) receive ``d loss / d weights`` in ``graph.grad()`` on backward,
        as ``gtn.backward`` would give them.

    Raises:
        ValueError: naming the argument: a bad shape or dtype, a wrong number of lattices, a
            cyclic lattice, a position out of range, a NaN or +inf score that a lattice reads, a
            NaN or +inf arc weight, a bad ``reduction``/``impl``/``semiring``.

    Example:
        >>> import torch, lightning_gtn.wfst as gtn
        >>> g = gtn.Graph(False)
        >>> _ = g.add_node(True), g.add_node(), g.add_node(False, True)
        >>> _ = g.add_arc(0, 1, 0), g.add_arc(0, 1, 1), g.add_arc(1, 2, 2)  # reads x[0] or x[1], then x[2]
        >>> x = torch.tensor([[0.0, 0.0, 1.0]])
        >>> round(float(lattice_loss(x, g)), 4)  # -log(e^(0+1) + e^(0+1))
        -1.6931
    """
    return criterion.apply_loss(
        _GRAPH_LATTICES,
        scores,
        None,
        None,
        None,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="scores",
        lattices=lattices,
        semiring=semiring,
    )


class LatticePath(NamedTuple):
    """Best paths of :func:`lattice_viterbi` (lists hold one entry per example, None when the
    example's lattice has no path).

    Attributes:
        scores: ``(B,)`` the best path's score (``-inf`` when none), scores' dtype.
        arcs: int64 tensors of the path's arc ids (the graph's own ids), first arc first.
        positions: int64 tensors: the position each of those arcs reads (-1: none).
        olabels: int64 tensors: their output labels (for :func:`rnnt_lattice`: the token or -1).
    """

    scores: torch.Tensor
    arcs: List[Optional[torch.Tensor]]
    positions: List[Optional[torch.Tensor]]
    olabels: List[Optional[torch.Tensor]]


def lattice_viterbi(scores: torch.Tensor, lattices: Union[Graph, Sequence[Graph]]) -> LatticePath:
    """The best path of each example's lattice (max semiring), with the same arguments and
    checks as :func:`lattice_loss`.

    Returns:
        :class:`LatticePath`: its ``scores`` are ``max`` over paths (so ``lattice_loss(...,
        semiring="max", reduction="none") == -scores``); arcs, positions and output labels.
    """
    B, N = _check_scores(scores)
    dtype = checks.compute_dtype(scores)
    plan, order = _plan(lattices, B, N)
    x = scores.detach().to("cpu", dtype).reshape(B, N)
    w = torch.from_numpy(plan.batch.weights()).to(dtype)
    losses, _, _, paths = score_plan(plan, x, w, "max", need_path=True)
    arcs: List[Optional[torch.Tensor]] = []
    positions: List[Optional[torch.Tensor]] = []
    olabels: List[Optional[torch.Tensor]] = []
    ids = [order.index(g) for g in checks.graph_list(lattices, B, "lattices")] if B else []
    for b in range(B):
        p = paths[b] if paths is not None else None
        if p is None:
            arcs.append(None)
            positions.append(None)
            olabels.append(None)
            continue
        c = plan.batch.lattices[ids[b]]
        arcs.append(torch.from_numpy(p.astype(np.int64)))
        positions.append(torch.from_numpy(c.pos[p].astype(np.int64)))
        olabels.append(torch.from_numpy(c.olabel[p].astype(np.int64)))
    best = (-losses).to(device=scores.device, dtype=scores.dtype)
    return LatticePath(best, arcs, positions, olabels)


# ---------------------------------------------------------------------------
# RNN-T lattices
# ---------------------------------------------------------------------------


def _check_transducer_args(targets, V: int, blank: int, where: str):
    V = checks.check_int(V, f"{where}: V", 1)
    blank = checks.check_class_id(blank, f"{where}: blank", V)
    y = np.asarray(targets.detach().cpu() if isinstance(targets, torch.Tensor) else targets)
    if y.size and (y.dtype.kind not in "iu" or y.ndim != 1):
        raise ValueError(f"{where}: targets must be a 1-D sequence of integer token ids, got {y.dtype} {y.shape}")
    y = y.astype(np.int64).reshape(-1)
    checks.check_labels(y, V, blank, f"{where}: targets", "V")
    return V, blank, y


def _grid_graph(Tb: int, Ub: int, y: np.ndarray, blank: int, V: int, cell, calc_grad: bool) -> Graph:
    """The RNN-T grid over frames ``[0, Tb)`` and ``[0, Ub]`` labels; ``cell(t, u)`` gives the
    flattened ``(t, u)`` cell index of the scores (or -1 where the cell is not stored)."""
    if Tb == 0:  # no frame: no path
        return Graph.from_arrays(1, [0], [], [], [], [], calc_grad=calc_grad)
    W = Ub + 1
    t = np.repeat(np.arange(Tb, dtype=np.int64), W)  # the cells row by row: node id t * W + u
    u = np.tile(np.arange(W, dtype=np.int64), Tb)
    node = t * W + u
    final = Tb * W
    c = cell(t, u)
    ok = c >= 0
    # blank: (t, u) -> (t + 1, u); from the last frame only (Tb - 1, Ub) -> final
    nb = ok & ((t < Tb - 1) | (u == Ub))
    b_dst = np.where(t < Tb - 1, node + W, final)
    # emit y[u]: (t, u) -> (t, u + 1)
    ne = ok & (u < Ub)
    lab = y[np.minimum(u, max(Ub - 1, 0))] if Ub else np.zeros_like(u)
    src = np.concatenate([node[nb], node[ne]])
    dst = np.concatenate([b_dst[nb], node[ne] + 1])
    pos = np.concatenate([c[nb] * V + blank, c[ne] * V + lab[ne]])
    olab = np.concatenate([np.full(int(nb.sum()), -1, np.int64), lab[ne]])
    order = np.argsort(src, kind="stable")  # arcs grouped by source node, as a hand-built grid would be
    return Graph.from_arrays(
        final + 1, [0], [final], src[order], dst[order], pos[order], olab[order], calc_grad=calc_grad
    )


@checks.renamed_arguments(V="num_classes")
def rnnt_lattice(
    T: int,
    U: int,
    targets,
    num_classes: int,
    blank: int = 0,
    *,
    frames: Optional[int] = None,
    calc_grad: bool = False,
) -> Graph:
    """The regular RNN-T lattice of one example over a ``(T, U + 1, V)`` tensor.

    Nodes are the grid cells ``(t, u)`` (``t < frames``, ``u <= len(targets)``, node id
    ``t * (len(targets) + 1) + u``) plus one final node. From ``(t, u)``: a blank arc to
    ``(t + 1, u)`` reading ``(t, u, blank)``, an arc emitting ``targets[u]`` to ``(t, u + 1)``
    reading ``(t, u, targets[u])``, and from the last cell ``(frames - 1, len(targets))`` a blank
    arc to the final node. Positions are ``(t * (U + 1) + u) * V + v`` (the flattened
    ``(T, U + 1, V)`` example), output labels the emitted token (-1 for blank), weights 0.
    ``lattice_loss(log_softmax(logits, -1), lattices)`` is then the RNN-T loss.

    Args:
        T, U: the tensor's padded frames and target length (its shape is ``(B, T, U + 1, V)``).
        targets: this example's ``len(targets) <= U`` token ids, in ``[0, V)``, not blank.
        num_classes: ``V``, the classes (``V=`` is its deprecated keyword).
        blank: the blank id in ``[-V, V)`` (negative counts from the end, as torchaudio's -1).
        frames: this example's frames, ``<= T`` (default ``T``); 0 gives a lattice with no path.
        calc_grad: the graph's ``calc_grad`` (its weights receive gradients).

    Returns:
        The lattice, a :class:`lightning_gtn.wfst.Graph` (node 0 the start, the last node accepts).
    """
    T = checks.check_int(T, "rnnt_lattice: T", 0)
    U = checks.check_int(U, "rnnt_lattice: U", 0)
    V, blank, y = _check_transducer_args(targets, num_classes, blank, "rnnt_lattice")
    Tb = T if frames is None else checks.check_int(frames, "rnnt_lattice: frames", 0)
    if Tb > T or len(y) > U:
        raise ValueError(f"rnnt_lattice: frames={Tb} must be <= T={T} and len(targets)={len(y)} <= U={U}")
    if T * (U + 1) * V - 1 > _MAX_POS:
        raise ValueError(f"rnnt_lattice: T * (U + 1) * V = {T * (U + 1) * V} positions exceed int32 labels")
    return _grid_graph(Tb, len(y), y, blank, V, lambda t, u: t * (U + 1) + u, calc_grad)


@checks.renamed_arguments(V="num_classes")
def pruned_rnnt_lattice(
    ranges,
    s_range: int,
    targets,
    num_classes: int,
    blank: int = 0,
    *,
    frames: Optional[int] = None,
    calc_grad: bool = False,
) -> Graph:
    """The RNN-T lattice of one example over a pruned ``(T, s_range, V)`` tensor (k2's layout).

    Frame ``t`` stores the labels ``u`` in ``[ranges[t], ranges[t] + s_range)``; cell ``(t, u)``
    is at ``(t, u - ranges[t])``. The grid is :func:`rnnt_lattice`'s, keeping only the arcs that
    read a stored cell (an arc out of a cell outside the band does not exist, which is what k2's
    pruned loss means by scoring those cells ``-inf``).

    Args:
        ranges: ``(T,)`` non-negative integers, the first label stored at each frame (the ``T``
            of the tensor is ``len(ranges)``), or k2's ``(T, s_range)`` label indices of one
            example (``get_rnnt_prune_ranges(...)[b]``: consecutive per frame).
        s_range: labels stored per frame (``>= 1``).
        targets, num_classes, blank, frames, calc_grad: as :func:`rnnt_lattice`.
    """
    r = np.asarray(ranges.detach().cpu() if isinstance(ranges, torch.Tensor) else ranges)
    s_range = checks.check_int(s_range, "pruned_rnnt_lattice: s_range", 1)
    if r.ndim == 2:  # k2's per-frame label indices (T, s_range): consecutive from the first
        consecutive = (
            r.shape[1] == s_range and r.dtype.kind in "iu" and bool((r == r[:, :1] + np.arange(s_range)).all())
        )
        if not consecutive:
            raise ValueError(
                f"pruned_rnnt_lattice: 2-D ranges must be (T, s_range={s_range}) consecutive label indices per frame "
                f"(k2's get_rnnt_prune_ranges of one example), got {r.dtype} {r.shape}"
            )
        r = r[:, 0]
    if r.ndim != 1 or (r.size and (r.dtype.kind not in "iu" or r.min() < 0)):
        raise ValueError(
            f"pruned_rnnt_lattice: ranges must be a (T,) non-negative integer array, got {r.dtype} {r.shape}"
        )
    r = r.astype(np.int64)
    T = len(r)
    V, blank, y = _check_transducer_args(targets, num_classes, blank, "pruned_rnnt_lattice")
    Tb = T if frames is None else checks.check_int(frames, "pruned_rnnt_lattice: frames", 0)
    if Tb > T:
        raise ValueError(f"pruned_rnnt_lattice: frames={Tb} must be <= len(ranges)={T}")
    if T * s_range * V - 1 > _MAX_POS:
        raise ValueError(f"pruned_rnnt_lattice: T * s_range * V = {T * s_range * V} positions exceed int32 labels")

    def cell(t, u):
        k = u - r[t]
        return np.where((k >= 0) & (k < s_range), t * s_range + k, -1)

    return _grid_graph(Tb, len(y), y, blank, V, cell, calc_grad)


@checks.renamed_arguments(C="num_classes")
def frame_lattice(graph: Graph, frames: int, num_classes: int, *, calc_grad: bool = False) -> Graph:
    """A criterion graph over ``(T, C)`` emissions unrolled into a lattice over ``frames`` frames.

    Node ``(t, n)`` (id ``t * num_nodes + n``, ``t`` in ``[0, frames]``) stands for graph node
    ``n`` after ``t`` frames; an emitting arc ``n -> m`` with label ``l`` becomes ``(t, n) ->
    (t + 1, m)`` reading position ``t * C + l`` for every ``t < frames``; an epsilon arc stays in its
    frame. Start nodes at ``t = 0``, accept nodes at ``t = frames``; output labels and weights are
    kept. ``lattice_loss(emissions, [frame_lattice(g_b, T_b, C)])`` then equals
    ``graph_loss(emissions, graphs=[g_b], input_lengths=[T_b])`` (slower: the frame-synchronous
    kernels are the fast path for graphs that read frames in order). ``num_classes`` is ``C``
    (``C=`` is its deprecated keyword).

    Raises:
        ValueError: a label outside ``[0, C)`` (or -1), bad ``frames``/``num_classes``, an epsilon cycle
            (when scored).
    """
    if not isinstance(graph, Graph):
        raise ValueError(f"frame_lattice: graph must be a lightning_gtn.wfst.Graph, got {type(graph).__name__}")
    frames = checks.check_int(frames, "frame_lattice: frames", 0)
    C = checks.check_int(num_classes, "frame_lattice: num_classes", 1)
    a = graph.arrays()
    S = a.num_nodes
    il = a.ilabel.astype(np.int64)
    if len(il) and il.max() >= C:
        raise ValueError(f"frame_lattice: graph label {int(il.max())} out of range [0, C={C})")
    if (frames + 1) * max(S, 1) - 1 > _MAX_POS or frames * C - 1 > _MAX_POS:
        raise ValueError("frame_lattice: the unrolled lattice exceeds int32 node ids or positions")
    src, dst = a.src.astype(np.int64), a.dst.astype(np.int64)
    em, eps = il >= 0, il < 0
    t_em = np.repeat(np.arange(frames, dtype=np.int64), int(em.sum()))
    t_eps = np.repeat(np.arange(frames + 1, dtype=np.int64), int(eps.sum()))
    k_em, k_eps = np.tile(np.nonzero(em)[0], frames), np.tile(np.nonzero(eps)[0], frames + 1)
    return Graph.from_arrays(
        (frames + 1) * S,
        a.start.astype(np.int64),
        frames * S + a.accept.astype(np.int64),
        np.concatenate([t_em * S + src[k_em], t_eps * S + src[k_eps]]),
        np.concatenate([(t_em + 1) * S + dst[k_em], t_eps * S + dst[k_eps]]),
        np.concatenate([t_em * C + il[k_em], np.full(len(k_eps), -1, np.int64)]),
        np.concatenate([a.olabel[k_em], a.olabel[k_eps]]).astype(np.int64),
        np.concatenate([a.weights[k_em], a.weights[k_eps]]),
        calc_grad=calc_grad,
    )


# ---------------------------------------------------------------------------
# lattices built from the targets inside a custom op
# ---------------------------------------------------------------------------


class LatticeCriterion(LatticeBuilder):
    """A lattice per example from ``builder(target, frames, shape, **builder_kwargs)``, built and
    cached inside the custom op ``lightning_gtn::lattice_loss`` (so the loss compiles with
    ``torch.compile(fullgraph=True)``).

    Args:
        builder: returns the :class:`lightning_gtn.wfst.Graph` lattice of one example from its
            target (a list of token ids), its frames (its input length) and the per-example shape
            of the scores (``scores.shape[1:]``, e.g. ``(T, U + 1, V)``).
        builder_kwargs: extra keyword arguments of ``builder``.
        blank: a label the targets must not contain (checked before building), or None.
        cache_size: compiled lattices kept, per ``(target, frames, shape)``.
    """

    name = "lattice_criterion_loss"

    def __init__(
        self, builder, builder_kwargs: Optional[dict] = None, blank: Optional[int] = None, cache_size: int = 4096
    ):
        if not callable(builder):
            raise ValueError(f"builder must be callable, got {builder!r}")
        super().__init__(checks.check_int(cache_size, "cache_size", 1))
        self.builder = builder
        self.builder_kwargs = dict(builder_kwargs or {})
        self.blank = None if blank is None else checks.check_int(blank, "blank", 0)
        self.cache_size = int(cache_size)

    def __reduce__(self):
        return (LatticeCriterion, (self.builder, self.builder_kwargs, self.blank, self.cache_size))

    def build(self, target, frames, shape):
        """``builder(target, frames, shape, **builder_kwargs)``, checked to be a Graph."""
        g = self.builder(target, frames, shape, **self.builder_kwargs)
        if not isinstance(g, Graph):
            raise ValueError(f"{self.name}: builder must return a lightning_gtn.wfst.Graph, got {type(g).__name__}")
        return g


def lattice_criterion_loss(
    scores: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    criterion: LatticeCriterion,
    reduction: str = "mean",
    zero_infinity: bool = False,
    semiring: str = "log",
) -> torch.Tensor:
    """:func:`lattice_loss` over lattices that ``criterion`` builds from the targets, as a custom
    op (works under ``torch.compile(fullgraph=True)``).

    Args:
        scores: ``(B, T, ...)`` float scores; float16/bfloat16 are scored in float32.
        targets: padded ``(B, S)``, concatenated 1-D, or a list of B sequences.
        input_lengths: ``(B,)`` integers ``<= T`` (passed to the builder as ``frames``).
        target_lengths: ``(B,)``; needed with tensor targets.
        criterion: keyword-only, the builder and its cache.
        reduction, zero_infinity, semiring: as :func:`lattice_loss` (``"mean"``: the batch mean).

    Returns:
        The loss in ``scores``' dtype and device.
    """
    if not isinstance(criterion, LatticeCriterion):
        raise ValueError(f"criterion must be a LatticeCriterion, got {type(criterion).__name__}")
    return _built_loss(criterion, scores, targets, input_lengths, target_lengths, reduction, zero_infinity, semiring)


def _built_loss(builder, scores, targets, input_lengths, target_lengths, reduction, zero_infinity, semiring):
    return criterion.apply_loss(
        _BUILT_LATTICES,
        scores,
        targets,
        input_lengths,
        target_lengths,
        reduction=reduction,
        zero_infinity=zero_infinity,
        name="scores",
        builder=builder,
        semiring=semiring,
    )


def _rnnt_builder(target, frames, shape, blank):
    T, U1, V = shape
    return rnnt_lattice(T, U1 - 1, target, V, blank, frames=frames)


_RNNT_CRITERIA: dict = {}


def rnnt_lattice_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = -1,
    reduction: str = "mean",
    zero_infinity: bool = False,
    fused_log_softmax: bool = True,
) -> torch.Tensor:
    """The RNN-T loss through the generic lattice (:func:`rnnt_lattice` per example, cached, in a
    custom op): torchaudio's ``rnnt_loss`` arguments and meanings. The reference path for the
    specialised RNN-T kernels, and what any user-written transducer grid runs on.

    Args:
        logits: ``(B, T, U + 1, V)`` joiner outputs (``fused_log_softmax=False``: already
            log-probabilities).
        targets: ``(B, U)`` int token ids (padded).
        logit_lengths, target_lengths: ``(B,)`` ints, ``<= T`` and ``<= U``.
        blank: the blank id in ``[-V, V)`` (-1: the last class).
        reduction: ``"none"`` -> ``(B,)``, ``"sum"``, or ``"mean"`` (the batch mean, as torchaudio:
            not divided by target lengths).
        zero_infinity: examples with no path (``logit_lengths == 0``) give 0.
        fused_log_softmax: apply ``log_softmax`` over ``V`` first (torch, differentiable).

    Returns:
        The loss in ``logits``' dtype and device.
    """
    V = checks.check_joiner_logits(logits)[3]
    b = checks.check_class_id(blank, "blank", V)
    crit = _RNNT_CRITERIA.get(b)
    if crit is None:
        crit = _RNNT_CRITERIA[b] = LatticeCriterion(_rnnt_builder, {"blank": b}, blank=b)
    x = logits.log_softmax(-1) if fused_log_softmax else logits
    return _built_loss(crit, x, targets, logit_lengths, target_lengths, reduction, zero_infinity, "log")
