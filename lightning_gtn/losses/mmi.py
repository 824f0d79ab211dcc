"""LF-MMI: numerators per target through the batched graph scoring, one shared denominator
through the shared-graph kernel.

``mmi_loss`` of example ``b`` is ``-(log Z_num[b] - den_scale * log Z_den[b])``: the numerator is
the graph of the target's alignments in the topology, intersected with the denominator (so it
carries the denominator's ``P`` weights, as icefall's MMI compiler does), scored with the
library's per-target machinery (:func:`lightning_gtn.core.criterion.apply_loss`); the
denominator is ONE graph for the whole batch, a criterion through the same prologue
(:class:`_SharedDenominator`, its own kernel always), scored by
:func:`lightning_gtn.kernels.mmi_numba.shared_scores` (CPU),
:func:`lightning_gtn.kernels.mmi_triton.shared_scores` (CUDA, when Triton is importable, the
graph fits its tables and no arc-weight gradient is asked for; checked once per device
against the torch path on a small problem, which takes over with a warning if they disagree) or
:func:`lightning_gtn.kernels.mmi_torch.shared_scores` (other devices and graphs).

Both are ``torch.library`` custom ops with fake implementations; graphs reach them through
integer handles, so a model step with ``mmi_loss`` compiles with ``torch.compile(fullgraph=True)``
once the denominator has been seen eagerly (the first call registers it). Outside
``torch.compile`` the denominator op's body and autograd formula run as a plain autograd
Function (:class:`_EagerDenominator`), without the custom op's dispatch.
"""

from __future__ import annotations

import math
import threading
from typing import List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..core import checks, criterion
from ..core.cache import LRU, HandleRegistry
from ..core.impl import Backends
from ..core.reduction import reduce_losses
from ..core.scoring import Plan, unique_graphs
from ..core.shared_graph import SharedGraph, shared_graph
from ..core.topologies import MMI_TOPOLOGIES as TOPOLOGIES
from ..core.topologies import compose_token_acceptor, numerator_graph
from ..kernels import buffers, mmi_numba, mmi_torch, mmi_triton
from ..kernels.compiled_graphs import compile_graph
from ..opargs import grads, op_schema
from ..wfst import Graph
from .graph import check_labels

__all__ = [
    "mmi_loss",
    "mmi_denominator_score",
    "denominator_handle",
    "MMI_IMPLS",
    "num_tokens_of",
    "MAX_DENOMINATOR_ARC_FRAMES",
]

#: ``impl=`` values: None (numba on the CPU, Triton or torch on CUDA), ``"numba"`` (CPU),
#: ``"torch"``, ``"triton"`` (CUDA tensors, or any under ``TRITON_INTERPRET=1``)
MMI_IMPLS = (None, "numba", "torch", "triton")


def num_tokens_of(C: int, topology: str) -> int:
    """The number of tokens ``N`` whose ``topology`` has ``C`` emission classes (ValueError when
    no ``N >= 1`` fits)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
    n = {"ctc": C - 1, "modified_ctc": C - 1, "hmm1": C, "hmm2": C // 2}[topology]
    if n < 1 or (topology == "hmm2" and C % 2):
        raise ValueError(f"log_probs has C={C} classes, which no token set of topology {topology!r} has")
    return n


class _Denominator:
    """A denominator graph and what is cached for it: its numerators per (target, version)."""

    def __init__(self, graph: Graph, topology: str) -> None:
        self.graph = graph
        self.topology = topology
        self.numerators: LRU[tuple] = LRU(100_000)
        self.handle = _DENOMINATORS.register(self)
        self.crit = _Numerators(self)

    def compiled(self) -> SharedGraph:
        return shared_graph(self.graph, "denominator")

    def numerator(self, target: tuple, C: int):
        version = self.graph.version
        key = (target, version)
        return self.numerators.get(key, lambda: self._build(target, C))

    def _build(self, target: tuple, C: int):
        N = num_tokens_of(C, self.topology)
        g = numerator_graph(list(target), N, self.topology, denominator=self.graph)
        return check_labels(compile_graph(g), C, f"the numerator of target {list(target)}")


class _Numerators(criterion.Criterion):
    """``-log Z_num`` per row: the target's numerator graph (cached per target)."""

    name = "mmi_loss"
    backends = checks.NATIVE_BACKENDS

    def __init__(self, den: _Denominator) -> None:
        self.den = den
        criterion.register_criterion(self)

    def check_options(self, C, blank, weights, device):
        return -1, None

    def forbidden_label(self, blank: int) -> Optional[int]:
        return 0  # token ids are 1..N

    def target_classes(self, C: int) -> int:
        return num_tokens_of(C, self.den.topology) + 1

    def plan(self, seqs, lengths, C, blank):
        per = [self.den.numerator(tuple(s), C) for s in seqs]
        graphs, ids = unique_graphs(per)
        B = len(seqs)
        return Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B), None


_DENOMINATORS: HandleRegistry[_Denominator] = HandleRegistry("MMI denominator")
_BY_GRAPH: LRU[_Denominator] = LRU(64)
_LOCK = threading.Lock()


def _denominator(graph: Graph, topology: str) -> _Denominator:
    """The cached :class:`_Denominator` of ``graph`` (by identity) and ``topology``."""
    key = (id(graph), topology)
    hit = _BY_GRAPH.peek(key)
    if hit is not None and hit.graph is graph:
        return hit
    if torch.compiler.is_compiling():
        raise ValueError(
            "this denominator graph has not been seen yet: call mmi_loss (or mmi_denominator_score) once "
            "eagerly, or lightning_gtn.losses.mmi.denominator_handle(denominator, topology), before torch.compile"
        )
    with _LOCK:
        d = _Denominator(graph, topology)
        _BY_GRAPH.put(key, d)
    return d


def _denominator_of(graph, topology: str) -> _Denominator:
    """:func:`_denominator` of ``graph`` after checking it is a :class:`~lightning_gtn.wfst.Graph`
    and ``topology`` one of :data:`~lightning_gtn.core.topologies.MMI_TOPOLOGIES`."""
    if not isinstance(graph, Graph):
        raise ValueError(f"denominator must be a lightning_gtn.wfst.Graph, got {type(graph).__name__}")
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
    return _denominator(graph, topology)


def denominator_handle(graph: Graph, topology: str = "ctc") -> int:
    """The integer handle under which the custom op ``lightning_gtn::mmi_denominator`` finds
    ``graph`` (registered on first use; the same graph object keeps its handle)."""
    return int(_denominator_of(graph, topology).handle)


#: arc-frames ``B * T * A`` one call may score against a denominator of ``A`` arcs (its numerators
#: are built from the denominator's arcs, and the graph kernel keeps per-frame scores of them:
#: measured up to about 2 bytes per arc-frame, 2.8 GB for a random 1,400-node, 1.96M-arc
#: denominator at B=8, T=100)
MAX_DENOMINATOR_ARC_FRAMES = 1 << 30


def _check_arc_frames(B: int, T: int, den: "_Denominator") -> None:
    """ValueError naming the sizes when ``B * T * A`` exceeds :data:`MAX_DENOMINATOR_ARC_FRAMES`."""
    A = den.graph.num_arcs()
    if B * T * A > MAX_DENOMINATOR_ARC_FRAMES:
        raise ValueError(
            f"denominator: B * T * arcs = {B} * {T} * {A} = {B * T * A:,} arc-frames, over the limit of "
            f"{MAX_DENOMINATOR_ARC_FRAMES:,} (lightning_gtn.losses.mmi.MAX_DENOMINATOR_ARC_FRAMES); "
            "use a smaller denominator (a lower order or more pruning), a smaller batch or shorter inputs"
        )


def _self_check_problem(device: torch.device):
    """A small denominator (a 3-token bigram in the CTC topology, leaky) and emissions on ``device``."""
    rng = np.random.default_rng(0)
    N = 3
    nxt = np.concatenate([np.full((N + 1, 1), -1), np.tile(np.arange(1, N + 1), (N + 1, 1))], axis=1)
    g = compose_token_acceptor(N, "ctc", nxt.astype(np.int64), np.log(rng.dirichlet(np.ones(N + 1), N + 1)), 0,
                               np.ones(N + 1, dtype=bool))  # fmt: skip
    x = torch.from_numpy(rng.standard_normal((3, 11, N + 1))).float().log_softmax(-1).to(device)
    return shared_graph(g), x, np.array([11, 7, 0])


def _triton_self_check(device: torch.device) -> Optional[str]:
    """None when the Triton kernels agree with the torch path on ``device``, else what differed."""
    sg, x, lens = _self_check_problem(device)
    z1, g1 = mmi_triton.shared_scores(sg, x, lens, 0.1, need_e=True)
    z2, g2, _ = mmi_torch.shared_scores(sg, x, lens, 0.1, need_e=True)
    if g1 is None or g2 is None:
        return "no emission gradient"
    if not (torch.allclose(z1, z2, rtol=1e-4, atol=1e-4) and torch.allclose(g1, g2, rtol=1e-3, atol=1e-4)):
        return f"values differ from the torch path by {(z1 - z2).abs().max().item():.3g}"
    return None


#: how ``impl`` resolves for the shared denominator: numba on the CPU, Triton on CUDA once its
#: self-check passes there (and for the denominators it supports), torch elsewhere
DEN_BACKENDS = Backends(
    "mmi_loss", ("numba", "torch", "triton"), triton_available=mmi_triton.available,
    self_check=_triton_self_check, kernels="Triton MMI",
)  # fmt: skip


# ---------------------------------------------------------------------------
# The denominator op
# ---------------------------------------------------------------------------


class DenominatorArgs(NamedTuple):
    """The arguments of ``lightning_gtn::mmi_denominator``."""

    log_probs: Tensor
    input_lengths: Tensor
    handle: int
    leaky_hmm: float
    impl: str
    need_e: bool
    need_w: bool


@torch.library.custom_op("lightning_gtn::mmi_denominator", mutates_args=())
@op_schema(DenominatorArgs)
def denominator_op(
    log_probs: Tensor, input_lengths: Tensor, handle: int, leaky_hmm: float, impl: str, need_e: bool, need_w: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(log Z (B,), d log Z[b] / d log_probs[b] (B, T, C), d log Z[b] / d w (B, A))`` of the
    denominator registered under ``handle``; unrequested gradients are empty tensors."""
    return _denominator_scores(log_probs, input_lengths, handle, leaky_hmm, impl, need_e, need_w)


def _denominator_scores(
    log_probs: Tensor, input_lengths: Tensor, handle: int, leaky_hmm: float, impl: str, need_e: bool, need_w: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    """The body of :func:`denominator_op` (also run outside ``torch.compile`` by
    :class:`_EagerDenominator`, without the custom op's dispatch)."""
    B, T, C = log_probs.shape
    den = _DENOMINATORS.get(handle)
    sg = den.compiled()
    sg.check_classes(C, "denominator")
    lengths = checks.as_lengths(input_lengths, B, "input_lengths", log_probs.device, max_value=T)
    chosen = DEN_BACKENDS.pick(log_probs.device, impl or None)
    if not impl and chosen == "triton" and not mmi_triton.supports(sg, need_w):
        chosen = "torch"  # the default: denominators the Triton kernels cannot score go to torch
    impl = chosen
    x = log_probs.detach()
    if impl == "numba":
        xn = x.contiguous().numpy()
        logz, gE, gW = mmi_numba.shared_scores(sg, xn, lengths, float(leaky_hmm), need_e=need_e, need_w=need_w)
        out = torch.from_numpy(logz.astype(xn.dtype, copy=False))  # numpy's cast: no torch dispatch
        gEt = torch.from_numpy(gE) if gE is not None else log_probs.new_empty(0)
        gWt = torch.from_numpy(gW).to(log_probs.dtype) if gW is not None else log_probs.new_empty(0)
        return out, gEt, gWt
    if impl == "triton":
        if not mmi_triton.supports(sg, need_w):
            raise ValueError(
                f"impl='triton' scores denominators of at most {mmi_triton.MAX_NODES} nodes (states, or "
                "groups + states where a state is entered under two labels) and no arc-weight gradient; "
                "use impl='torch'"
            )
        xt = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        logz_t, gE_t = mmi_triton.shared_scores(sg, xt, lengths, float(leaky_hmm), need_e=need_e)
        return (
            logz_t.to(log_probs.dtype),
            gE_t.to(log_probs.dtype) if gE_t is not None else log_probs.new_empty(0),
            log_probs.new_empty(0),
        )
    logz_t, gE_t, gW_t = mmi_torch.shared_scores(sg, x, lengths, float(leaky_hmm), need_e=need_e, need_w=need_w)
    return (
        logz_t.to(log_probs.dtype),
        gE_t if gE_t is not None else log_probs.new_empty(0),
        gW_t.to(log_probs.dtype) if gW_t is not None else log_probs.new_empty(0),
    )


@denominator_op.register_fake
def _denominator_fake(*inputs):
    a = DenominatorArgs(*inputs)
    log_probs = a.log_probs
    B = log_probs.shape[0]
    gE = torch.empty_like(log_probs) if a.need_e else log_probs.new_empty(0)
    if a.need_w:
        n = torch.library.get_ctx().new_dynamic_size()
        gW = log_probs.new_empty((B, n))
    else:
        gW = log_probs.new_empty(0)
    return log_probs.new_empty((B,)), gE, gW


def _den_setup(ctx, inputs, output):
    a = DenominatorArgs(*inputs)
    ctx.handle, ctx.need_e, ctx.need_w = a.handle, a.need_e, a.need_w
    ctx.den = _DENOMINATORS.get(a.handle) if a.need_w else None  # alive until the backward
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[0], output[1], output[2])


def _den_backward(ctx, g_out, _g1, _g2):
    if g_out is None:
        return grads(DenominatorArgs)
    logz, gE, gW = ctx.saved_tensors
    return grads(DenominatorArgs, log_probs=_den_grads(logz, gE, gW, g_out, ctx.need_e, ctx.need_w, ctx.den))


def _den_grads(
    logz: Tensor,
    gE: Tensor,
    gW: Tensor,
    g_out: Tensor,
    need_e: bool,
    need_w: bool,
    den: Optional[_Denominator],
    in_place: bool = False,
) -> Optional[Tensor]:
    """The gradient w.r.t. ``log_probs`` (``gE`` times the upstream gradient ``g_out`` of each
    row; rows with no path get none), and (``need_w``) the arc weights' gradient added into the
    denominator graph's ``grad()``. ``in_place``: the product is written into ``gE`` itself, which
    is returned (the caller owns ``gE`` and reads it no more)."""
    out_e = None
    if (
        need_e
        and type(gE) is torch.Tensor
        and type(g_out) is torch.Tensor
        and gE.device.type == "cpu"
        and not torch.is_grad_enabled()
    ):
        # numpy: one thread, no dispatch; torch's pool costs more than this memory-bound product
        # on a busy CPU; into gE itself or a pooled array (kernels.buffers): no fresh pages to fault
        # in at every step
        ge = gE.detach().numpy()
        lz = logz.detach().numpy()
        c = np.where(np.isfinite(lz), g_out.detach().numpy(), 0).astype(ge.dtype, copy=False)
        out = ge if in_place else buffers.OUTPUTS.empty(ge.shape, ge.dtype)
        out_e = gE if in_place else torch.from_numpy(out)
        np.multiply(ge, c[:, None, None], out=out)
        if not need_w:
            return out_e
    coef = torch.where(torch.isfinite(logz), g_out, torch.zeros_like(g_out))
    if need_e and out_e is None:
        ct = coef.reshape(-1, 1, 1).to(gE.dtype)
        out_e = gE.mul_(ct) if in_place else gE * ct
    if need_w and den is not None and gW.numel():
        gw = (coef.reshape(-1, 1).to(torch.float64) * gW.to(torch.float64)).sum(0)
        den.graph.add_grad(gw.detach().cpu().to(torch.float32).numpy())  # GTN's convention: graph.grad()
    return out_e


denominator_op.register_autograd(_den_backward, setup_context=_den_setup)


class _EagerDenominator(torch.autograd.Function):
    """:func:`denominator_op` with its autograd formula, outside ``torch.compile``: the same
    computation without the custom op's dispatch. With the backward's upstream factor taken in
    numpy (no torch operations), the forward and backward of ``benchmarks/bench_mmi.py``'s
    denominators took 0.3-0.5 ms less (character graph, about 5%) and 3 ms less (word pieces,
    about 7%) on a 2-core CPU.

    The backward multiplies the kernel's gradient by the upstream factor in place and hands that
    array on as the gradient (the op's backward writes a second array: under ``torch.compile`` its
    saved tensors must stay as they are): one ``(B, T, C)`` array less to write, and it read
    0.25-0.35 ms less of the character graph's backward. The node then no longer holds the
    kernel's gradient; a second backward through a retained graph computes it again from the
    saved inputs."""

    @staticmethod
    def forward(ctx, x: Tensor, il: Tensor, handle: int, leaky_hmm: float, impl: str, need_e: bool, need_w: bool):
        logz, gE, gW = _denominator_scores(x, il, handle, leaky_hmm, impl, need_e, need_w)
        ctx.args = (handle, leaky_hmm, impl)
        ctx.need_e, ctx.need_w = need_e, need_w
        ctx.den = _DENOMINATORS.get(handle) if need_w else None  # alive until the backward
        # the output saved, not kept as an attribute (its node would then hold itself: a reference
        # cycle, freed late by the garbage collector, and the pooled gradient with it); the inputs
        # saved for a second backward, which computes the gradient again (the first scales it in
        # place); the gradients kept as attributes (not outputs: no cycle), dropped by the first backward
        ctx.save_for_backward(logz, x, il)
        ctx.gE, ctx.gW = gE, gW
        return logz

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out: Tensor):
        logz, x, il = ctx.saved_tensors
        gE, gW = ctx.gE, ctx.gW
        if ctx.need_e:  # scaled in place below: not for a second backward
            ctx.gE = None
            if gE is None:  # a second backward through a retained graph: computed again
                handle, leaky_hmm, impl = ctx.args
                _, gE, _ = _denominator_scores(x, il, handle, leaky_hmm, impl, True, False)
        return (_den_grads(logz, gE, gW, g_out, ctx.need_e, ctx.need_w, ctx.den, in_place=True),) + (None,) * 6


def _denominator_call(
    x: Tensor, il: Tensor, den: _Denominator, leaky_hmm: float, impl: str, need_e: bool, graph_grad: bool
) -> Tensor:
    """``log Z`` of emissions ``x`` (in their compute dtype) by :func:`denominator_op` under
    ``torch.compile`` (and for tensor subclasses), else by :class:`_EagerDenominator`."""
    compiling = torch.compiler.is_compiling()
    need_w = bool(graph_grad and torch.is_grad_enabled() and den.graph.calc_grad and not compiling)
    if need_w and not x.requires_grad:  # only the graph wants a gradient: a private leaf makes autograd call back
        x = x.detach().requires_grad_(True)
    args = DenominatorArgs(
        log_probs=x,
        input_lengths=il,
        handle=int(den.handle),
        leaky_hmm=float(leaky_hmm),
        impl=impl or "",
        need_e=bool(need_e),
        need_w=need_w,
    )
    if compiling or type(x) is not torch.Tensor:  # torch.compile (and tensor subclasses) see the custom op
        logz, _, _ = denominator_op(*args)
        return logz
    return _EagerDenominator.apply(*args)


class _SharedDenominator(criterion.Criterion):
    """``log Z_den`` per row of one shared denominator graph, through
    :func:`~lightning_gtn.core.criterion.apply_loss`: always its own kernel
    (:data:`DEN_BACKENDS`), called as ``lightning_gtn::mmi_denominator`` (:class:`DenominatorArgs`).

    Its call options: ``denominator`` (a :class:`~lightning_gtn.wfst.Graph`), ``topology`` (the
    numerators', which keys the cached graph), ``leaky_hmm`` in ``[0, 1)`` and ``graph_grad``
    (whether ``denominator.grad()`` receives the arc weights' gradient). No targets, no reduction:
    the result is ``(B,)``."""

    picker = DEN_BACKENDS
    reductions = ("none",)

    def __init__(self, name: str) -> None:
        self.name = name

    def check_options(self, C, blank, weights, device):
        return -1, None

    def check_call_options(self, shape, options):
        opts = dict(options)
        graph = opts.pop("denominator", None)
        topology = opts.pop("topology", "ctc")
        leaky_hmm = opts.pop("leaky_hmm", 0.0)
        graph_grad = checks.check_bool(opts.pop("graph_grad", True), "graph_grad")
        super().check_call_options(shape, opts)  # no other option
        den = _denominator_of(graph, topology)
        leaky = checks.check_real(leaky_hmm, "leaky_hmm", 0.0, 1.0, hi_open=True)
        _check_arc_frames(shape[0], shape[1], den)
        return {"den": den, "leaky_hmm": leaky, "graph_grad": graph_grad}

    def own_kernel(self, device, impl):
        return impl or ""  # the op picks the device's default

    def index_tensors(self, targets, input_lengths, target_lengths, B, device):
        return None, checks.int_tensor(input_lengths, "input_lengths"), None

    def call_kernel(self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e,
                    options):  # fmt: skip
        return _denominator_call(
            x, input_lengths, options["den"], options["leaky_hmm"], impl, need_e, options["graph_grad"]
        )


_SCORE = _SharedDenominator("mmi_denominator_score")
_MMI_DEN = _SharedDenominator("mmi_loss")


def mmi_denominator_score(
    log_probs: Tensor,
    input_lengths,
    denominator: Graph,
    *,
    leaky_hmm: float = 0.0,
    impl: Optional[str] = None,
) -> Tensor:
    """``log Z_den`` of every row: the forward score of one shared denominator graph against each
    example's emissions, by the shared-graph kernel (differentiable).

    Row ``b`` scores ``log_probs[b, :input_lengths[b]]``: the log of the sum over the graph's
    paths of ``input_lengths[b]`` arcs (start to accept) of ``exp(sum of arc weights + sum of the
    emissions the arcs read)``; with ``leaky_hmm > 0``, between two frames every state may also
    jump to any state ``j`` with probability ``leaky_hmm * init[j]`` (Kaldi's leaky HMM; ``init``
    the graph's averaged walk, see :meth:`~lightning_gtn.core.shared_graph.SharedGraph.leak_distribution`).

    Gradients: w.r.t. ``log_probs`` through autograd (the per-frame class posteriors); when the
    graph has ``calc_grad`` set, d(loss)/d(arc weights) is accumulated into ``denominator.grad()``
    on backward (eager mode; not under ``torch.compile``).

    Args:
        log_probs: ``(B, T, C)`` float scores (float16/bfloat16 scored in float32).
        input_lengths: ``(B,)`` integer frames, ``<= T``.
        denominator: an epsilon-free acceptor over ``[0, C)`` with finite weights (compiled once,
            cached by identity and version).
        leaky_hmm: the leaky-HMM coefficient in ``[0, 1)``.
        impl: None (numba on CPU, Triton or torch on CUDA), ``"numba"``, ``"torch"`` or ``"triton"``.

    Returns:
        ``(B,)`` log Z in ``log_probs``' dtype; ``-inf`` for rows with no path.
    """
    return criterion.apply_loss(
        _SCORE, log_probs, None, input_lengths, None, reduction="none", impl=impl, name="log_probs",
        denominator=denominator, leaky_hmm=leaky_hmm, graph_grad=True,
    )  # fmt: skip


def mmi_loss(
    log_probs: Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    denominator: Graph,
    topology: str = "ctc",
    den_scale: float = 1.0,
    leaky_hmm: float = 0.0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> Tensor:
    """The (LF-)MMI loss: ``-(log Z_num[b] - den_scale * log Z_den[b])`` per example.

    The numerator of example ``b`` is :func:`lightning_gtn.core.topologies.numerator_graph` of its
    target in ``topology`` intersected with ``denominator`` (cached per target), scored by the
    library's batched per-target programme; the denominator is one graph shared by the batch,
    scored by the shared-graph kernel (see :func:`mmi_denominator_score`). With the default
    ``den_scale=1`` and ``leaky_hmm=0`` this equals
    ``graph_loss(log_probs, graphs=numerators, denominators=[denominator] * B)``.

    Args:
        log_probs: ``(B, T, C)`` scores (any: MMI normalises through the denominator), float32 or
            float64 (float16/bfloat16 in float32). ``C`` fixes the number of tokens ``N``: ``C - 1``
            for ``"ctc"``/``"modified_ctc"`` (blank 0), ``C`` for ``"hmm1"``, ``C / 2`` for ``"hmm2"``.
        targets: token ids ``1..N``: padded ``(B, S)``, concatenated 1-D, or a list of B sequences.
        input_lengths: ``(B,)`` frames, ``<= T``.
        target_lengths: ``(B,)``, needed with tensor targets.
        denominator: the shared denominator acceptor over ``[0, C)`` (e.g.
            ``lightning_gtn.functional.denominator_graph``); compiled once and cached by identity
            and version. Under ``torch.compile`` it must have been seen once eagerly (or passed
            to :func:`denominator_handle`) before the compiled call.
        topology: ``"ctc"``, ``"modified_ctc"``, ``"hmm1"`` or ``"hmm2"`` (as the denominator's).
        den_scale: the denominator's weight, finite and ``>= 0``.
        leaky_hmm: the leaky-HMM coefficient of the denominator, in ``[0, 1)``.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its target
            length (at least 1), then averaged over the batch (as ``ctc_loss``).
        zero_infinity: examples with no numerator path (infeasible targets) give 0 and no
            gradient; never an example whose denominator is infinite or that reads an infinite
            emission (its loss stays non-finite).
        impl: None, ``"numba"``, ``"torch"`` or ``"triton"`` (the denominator; the numerators
            take the default scorer of their device with ``"triton"``).

    Returns:
        The loss in ``log_probs``' dtype.

    Gradients flow to ``log_probs`` only: the numerators are copies of the denominator's arcs, so
    a gradient for its weights would need both terms; ``denominator.grad()`` is filled by
    :func:`mmi_denominator_score` alone.
    """
    checks.check_reduction(reduction)
    den_scale = checks.check_real(den_scale, "den_scale", 0.0)
    # the input cast once: both terms read the same tensor (one gradient accumulated in the compute dtype)
    floating = isinstance(log_probs, Tensor) and log_probs.is_floating_point()
    x = log_probs.to(checks.compute_dtype(log_probs)) if floating else log_probs
    # the denominator first: its prologue checks the input, impl, denominator and leaky_hmm
    logz_den = criterion.apply_loss(
        _MMI_DEN, x, None, input_lengths, None, reduction="none", impl=impl, name="log_probs",
        denominator=denominator, topology=topology, leaky_hmm=leaky_hmm, graph_grad=False,
    )  # fmt: skip
    B, T, C = x.shape
    N = num_tokens_of(C, topology)
    den = _denominator(denominator, topology)  # registered by the call above
    dev = x.device
    if not torch.compiler.is_compiling():  # eager: token ids named before the numerator op (which checks again)
        _check_token_ids(checks.split_targets(targets, target_lengths, B, dev, 2**62), N)
    tg, tl = checks.targets_tensors(targets, target_lengths, B, dev)  # once: the reduction reads tl too
    num_impl = {None: None, "triton": None, "numba": "numba"}.get(impl, "torch")
    neg_num = criterion.apply_loss(
        den.crit, x, tg, input_lengths, tl, blank=-1, reduction="none", zero_infinity=False, impl=num_impl,
        name="log_probs",
    )  # fmt: skip
    # infeasible: the target has no numerator path (-log Z_num = +inf) while nothing read is
    # infinite; that alone is +inf, and zero_infinity zeroes it. A denominator of +inf (an infinite
    # emission or weight) or a numerator of -inf (an infinite emission on its path) is not
    # infeasible: its loss stays +inf, -inf or NaN whatever zero_infinity says.
    infinite_in = torch.isnan(logz_den) | (logz_den == math.inf)  # the denominator read an infinity
    infeasible = (neg_num == math.inf) & ~infinite_in
    safe = torch.where(infeasible, torch.zeros_like(logz_den), logz_den)
    den_term = float(den_scale) * safe if den_scale else torch.zeros_like(safe)
    losses = torch.where(infeasible, torch.full_like(neg_num, math.inf), neg_num + den_term)
    if zero_infinity:
        losses = torch.where(infeasible, torch.zeros_like(losses), losses)
    return reduce_losses(losses, reduction, tl).to(log_probs.dtype)


def _check_token_ids(seqs: List[List[int]], N: int) -> None:
    flat = [v for s in seqs for v in s]
    if flat and (min(flat) < 1 or max(flat) > N):
        bad = min(flat) if min(flat) < 1 else max(flat)
        raise ValueError(f"targets: token id {bad} out of range; token ids must lie in 1..N with N={N}")
