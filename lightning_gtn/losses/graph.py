"""Losses from any criterion graphs a user builds with :mod:`lightning_gtn.wfst`."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Union

import numpy as np
import torch

from ..core import checks, criterion
from ..core.cache import LRU
from ..core.criterion_graphs import compiled_all_paths, compiled_user_graph
from ..core.scoring import Plan, pick_impl, score, unique_graphs
from ..kernels.compiled_graphs import compile_graph
from ..wfst import Graph

__all__ = ["graph_loss", "compile_criteria", "check_labels", "TargetGraphCriterion", "target_graph_loss"]


class _FixedPlan(criterion.Criterion):
    """A plan made before the call (the user's graph objects); arc weights are given as is."""

    name = "graph_loss"

    def __init__(self, plan: Optional[Plan]) -> None:
        self._plan = plan

    def score(self, E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef):
        if self._plan is None:
            raise RuntimeError("graph_loss: this criterion was made without a plan")
        return score(self._plan, E, weights, impl, zero_infinity, need_e, w_coef)


class TargetGraphCriterion(criterion.Criterion):
    """A criterion graph per target from ``builder(target_ids, **builder_kwargs)`` (a
    :class:`lightning_gtn.wfst.Graph` acceptor over the emission classes); compiled graphs are
    cached per target (the ``cache_size`` most recently used). With ``normalize`` each row also
    adds the forward score of all label paths.

    The criterion registers itself (:func:`~lightning_gtn.core.criterion.register_criterion`):
    the loss op names it by its ``handle``. It pickles and deep-copies by its arguments (the
    copy has its own cache and handle).
    """

    name = "target_graph_loss"

    def __init__(
        self,
        builder: Callable,
        builder_kwargs: Optional[dict] = None,
        normalize: bool = False,
        cache_size: int = 100_000,
    ) -> None:
        if not callable(builder):
            raise ValueError(f"loss.builder must be callable, got {builder!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, (int, np.integer)) or cache_size < 1:
            raise ValueError(f"loss.cache_size must be an integer >= 1, got {cache_size!r}")
        self.builder = builder
        self.builder_kwargs = dict(builder_kwargs or {})
        self.normalize = bool(normalize)
        self.cache_size = int(cache_size)
        self.cache: LRU = LRU(self.cache_size)
        criterion.register_criterion(self)

    def __reduce__(self):
        return (TargetGraphCriterion, (self.builder, self.builder_kwargs, self.normalize, self.cache_size))

    def compiled(self, target: tuple, C: int):
        """The compiled graph of ``target`` (labels checked against ``C``), cached."""
        return self.cache.get(target, lambda: self._compile(target, C))

    def _compile(self, target: tuple, C: int):
        g = self.builder(list(target), **self.builder_kwargs)
        if not isinstance(g, Graph):
            raise ValueError(f"loss.builder must return a lightning_gtn.wfst.Graph, got {type(g).__name__}")
        return check_labels(compile_graph(g), C, f"loss.builder: the graph of target {list(target)}")

    def check_options(self, C, blank, weights, device):
        """``blank`` as the op takes it (-1 for none); the graphs carry their own weights."""
        return (-1 if blank is None else int(blank)), None

    def forbidden_label(self, blank: int) -> Optional[int]:
        """The blank (targets must not contain it), when the graphs have one."""
        return blank if blank >= 0 else None

    def plan(self, seqs, lengths, C, blank):
        """One built graph per row (negated), plus the all-paths graph with ``normalize``."""
        B = len(seqs)
        per = [self.compiled(tuple(s), C) for s in seqs]
        rows, sign, ex_len = np.arange(B), -np.ones(B), lengths
        if self.normalize:
            per = per + [compiled_all_paths(C)] * B
            rows, sign, ex_len = np.tile(rows, 2), np.concatenate([sign, np.ones(B)]), np.tile(lengths, 2)
        graphs, ids = unique_graphs(per)
        return Plan(graphs, ids, rows, ex_len, sign, B), None


def target_graph_loss(
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    criterion: TargetGraphCriterion,
    blank: Optional[int] = None,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """The loss of criterion graphs built from the targets by a :class:`TargetGraphCriterion`.

    Loss of example ``b``: ``-forward_score(graph(targets[b]) o E_b)`` (plus the all-paths
    forward score when the criterion normalises). The graphs are built and cached inside a
    custom op, so this works under ``torch.compile(fullgraph=True)``.

    Args:
        emissions: ``(B, T, C)`` scores, float32/float64 (float16/bfloat16 in float32).
        targets: padded ``(B, S)``, concatenated 1-D, or a list of B sequences.
        input_lengths: ``(B,)`` integer frames per example, ``<= T``.
        target_lengths: ``(B,)``; needed with tensor targets.
        criterion: keyword-only, the builder and its cache.
        blank: the graphs' blank id (targets must not contain it), or None.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its
            target length (at least 1), then averaged.
        zero_infinity: targets with no path give 0.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.

    Returns:
        Loss in the emissions' dtype and device.
    """
    if not isinstance(criterion, TargetGraphCriterion):
        raise ValueError(f"criterion must be a TargetGraphCriterion, got {type(criterion).__name__}")
    return _apply_loss(
        criterion,
        emissions,
        targets,
        input_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
    )


_apply_loss = criterion.apply_loss  # the keyword ``criterion`` of target_graph_loss hides the module


class _GraphLossFunction(torch.autograd.Function):
    """``out`` of :func:`graph_loss` (reduced inside, see :func:`lightning_gtn.core.criterion.run_loss`)."""

    @staticmethod
    def forward(
        ctx, emissions, arc_weights, crit, lengths, divisors, reduction, zero_infinity, impl, need_w, graphs, arc_off
    ):
        need_e = bool(ctx.needs_input_grad[0])
        out, gE, gw = criterion.run_loss(
            crit, emissions, arc_weights, None, lengths, divisors, 0, reduction, zero_infinity, impl, need_e, need_w
        )
        ctx.save_for_backward(emissions, arc_weights)
        ctx.gE, ctx.gw = gE, gw
        ctx.args = (crit, lengths, reduction, zero_infinity, impl, need_w, graphs, arc_off)
        return out

    @staticmethod
    def backward(ctx, g_out):
        emissions, arc_weights = ctx.saved_tensors
        crit, lengths, reduction, zero_infinity, impl, need_w, graphs, arc_off = ctx.args
        gE = gw = None
        if reduction == "none":
            if ctx.gE is not None:
                gE = ctx.gE * g_out.reshape(-1, 1, 1)
            if need_w:
                gw = crit.score(emissions, arc_weights, None, lengths, 0, impl, zero_infinity, False, g_out)[2]
        else:
            if ctx.gE is not None:
                gE = ctx.gE * g_out
            if need_w and ctx.gw is not None:
                gw = ctx.gw * g_out
        if gw is not None:
            host = gw.detach().to("cpu", torch.float32).numpy()
            for j, g in enumerate(graphs):
                if g.calc_grad:  # GTN's convention: the graph's own gradient, see Graph.grad()
                    g.add_grad(host[arc_off[j] : arc_off[j + 1]])
        return (gE, gw if ctx.needs_input_grad[1] else None) + (None,) * 9


def compile_criteria(graphs: Sequence[Graph], C: int, name: str = "graphs"):
    """The distinct graph objects of ``graphs`` (first-appearance order), their compiled
    forms (labels checked against ``C``), and the index of each input graph among them."""
    order: List[Graph] = []
    index = {}
    ids = []
    for g in graphs:
        if id(g) not in index:
            index[id(g)] = len(order)
            order.append(g)
        ids.append(index[id(g)])
    compiled = [check_labels(compiled_user_graph(g), C, name) for g in order]
    return order, compiled, np.asarray(ids, dtype=np.int64)


def check_labels(cg, C: int, name: str):
    """``cg`` (a compiled graph) when its labels lie in ``[0, C)`` or are -1 (epsilon); else
    ValueError naming ``name``. The kernels index emissions with these labels."""
    if cg.max_label >= C or (cg.num_arcs and cg.label.min() < -1):
        bad = cg.max_label if cg.max_label >= C else int(cg.label.min())
        raise ValueError(
            f"{name}: arc label {bad} out of range; labels must lie in [0, C) with C={C} " "(or be -1 for epsilon)"
        )
    return cg


def graph_loss(
    emissions: torch.Tensor,
    targets=None,
    input_lengths=None,
    target_lengths=None,
    *,
    graphs: Union[Graph, Sequence[Graph]],
    denominators: Union[None, Graph, Sequence[Graph]] = None,
    weights: Optional[Sequence[torch.Tensor]] = None,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """Negative log-score of criterion graphs against dense emissions, batched.

    For example ``b`` the loss is ``-forward_score(intersect(graphs[b], E_b))`` where ``E_b`` is
    the linear graph of ``emissions[b, :input_lengths[b]]`` (GTN's ``linear_graph``), plus
    ``forward_score(intersect(denominators[b], E_b))`` when denominators are given. The
    graphs' input labels are matched against the ``C`` emission classes; epsilon arcs
    (label -1) are followed without reading a frame (they must not form a cycle); several
    start and accept nodes are fine. Compiled graphs are cached per graph object and version,
    so passing the same graphs again compiles nothing.

    Gradients: the emissions get theirs through autograd. Arc weights get theirs in one of two
    ways: pass ``weights`` (one ``(num_arcs,)`` tensor per distinct graph object, in the order
    the graphs first appear in ``graphs`` then ``denominators``) and autograd delivers
    ``d loss / d weights``; and every graph created with ``calc_grad=True`` also receives its
    gradient in ``graph.grad()`` (accumulated, as ``gtn.backward`` does) when the loss is
    back-propagated.

    This function takes graph objects, so it runs eagerly; under ``torch.compile`` use
    :class:`lightning_gtn.nn.TargetGraphLoss`, whose graphs are built from the targets inside
    a custom op.

    Args:
        emissions: ``(B, T, C)`` scores, float32/float64 (float16/bfloat16 in float32).
        targets: optional; only their lengths are used (for ``"mean"``), when
            ``target_lengths`` is not given: a list of B sequences.
        input_lengths: ``(B,)`` integer frames per example, ``<= T`` (default: all ``T``).
        target_lengths: optional ``(B,)``: ``"mean"`` divides each loss by it (clamped to 1).
        graphs: keyword-only; one acceptor per example (or a single graph used by all),
            labels in ``[0, C)`` or -1.
        denominators: optional graphs whose forward score is added (e.g. a normaliser).
        weights: optional tensors replacing the graphs' own weights (see above).
        reduction: ``"none"`` -> ``(B,)``, ``"sum"``, or ``"mean"`` (divided by the target
            lengths when known, then averaged over the batch).
        zero_infinity: examples with no path give 0 instead of ``inf``.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.

    Returns:
        Loss in the emissions' dtype and device.
    """
    B, T, C = checks.check_emissions(emissions, "emissions")
    checks.check_reduction(reduction)
    _FixedPlan(None).check_backend(impl)
    dev = emissions.device
    lengths = (
        np.full(B, T, dtype=np.int64)
        if input_lengths is None
        else checks.as_lengths(input_lengths, B, "input_lengths", dev, max_value=T)
    )
    divisors = None
    if target_lengths is not None:
        divisors = checks.as_lengths(target_lengths, B, "target_lengths", dev)
    elif targets is not None:
        divisors = np.asarray([len(t) for t in checks.split_targets(targets, None, B, dev, 2**62)], dtype=np.int64)
    nums = checks.graph_list(graphs, B, "graphs")
    dens = None if denominators is None else checks.graph_list(denominators, B, "denominators")
    impl = pick_impl(emissions, impl)
    dtype = checks.compute_dtype(emissions)
    x = emissions.to(dtype)
    order, compiled, ids = compile_criteria(nums + (dens or []), C)
    rows = np.concatenate([np.arange(B)] * (2 if dens is not None else 1))
    sign = np.concatenate([-np.ones(B)] + ([np.ones(B)] if dens is not None else []))
    ex_len = np.concatenate([lengths] * (2 if dens is not None else 1))
    plan = Plan(compiled, ids, rows, ex_len, sign, B)
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(order):
            raise ValueError(f"weights must hold one tensor per distinct graph ({len(order)}), got {len(weights)}")
        parts = []
        for g, wt in zip(order, weights):
            if not isinstance(wt, torch.Tensor) or tuple(wt.shape) != (g.num_arcs(),):
                raise ValueError(f"weights: expected a tensor of shape (num_arcs,) = ({g.num_arcs()},) per graph")
            if wt.device != x.device:
                raise ValueError(f"weights are on {wt.device} but emissions on {x.device}")
            parts.append(wt.to(dtype))
        w = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=x.device)
    else:
        w = torch.from_numpy(plan.batch.weights()).to(device=x.device, dtype=dtype)
    need_w = bool(torch.is_grad_enabled() and (w.requires_grad or any(g.calc_grad for g in order)))
    if need_w and not w.requires_grad:
        # only graphs with calc_grad want the gradient: a private leaf makes autograd call backward
        w = w.detach().requires_grad_(True)
    out = _GraphLossFunction.apply(
        x,
        w,
        _FixedPlan(plan),
        lengths,
        divisors,
        reduction,
        bool(zero_infinity),
        impl,
        need_w,
        order,
        plan.batch.arc_off,
    )
    return out.to(emissions.dtype)
