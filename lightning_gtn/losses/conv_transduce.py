"""The WFST convolution (``ConvTransduce1D`` of the differentiable-WFST research code), batched.

Each output class ``k`` owns a *kernel graph*, an acceptor over input classes built from a
lexicon entry (a sequence of input-class ids, :func:`kernel_graph`). The inputs ``(B, T, C_in)``
are padded with ``kernel_size // 2`` zero frames on both sides and cut into windows of
``kernel_size`` frames every ``stride`` frames; output ``[b, t, k]`` is the forward score (log
semiring) or the Viterbi score (max) of window ``t`` of example ``b`` against kernel ``k``.

The research layer intersects a linear graph per window with every kernel on the host, one
graph operation at a time. Here every ``(window, kernel)`` pair is one example of the library's
batched dynamic programme (:mod:`lightning_gtn.core.dispatch`): the windows are an ``unfold`` view of the inputs
(``(B * T', K, C_in)``, so the emission gradient flows back through it), the compiled kernels are
concatenated once, and all ``B * T' * C_out`` pairs are scored in one call, on the inputs'
device. Learned kernel weights are one vector over all arcs in the research graphs' arc order
(kernel by kernel, each in ``add_arc`` order), which is exactly the global arc order of the
concatenated graphs, so the weight gradient needs no index map. The Viterbi mode runs a batched
max-plus recursion with back pointers in torch ops; its gradient is the indicator of the best
path (one path per pair, as GTN's ``viterbi_score``).

The scoring and its backward are ``torch.library`` custom ops (``lightning_gtn::conv_transduce``
and ``lightning_gtn::conv_transduce_backward``): the forward returns what the backward needs (the
alphas, or the best paths) as extra outputs, so a model using the layer compiles with
``torch.compile(..., fullgraph=True)``. A :class:`KernelBank` is named in the ops by an integer
handle (held weakly; the autograd context keeps the bank alive until the backward).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .. import wfst as _wfst
from ..core import checks, criterion, dispatch
from ..core.cache import LRU, HandleRegistry
from ..core.scoring import pick_impl
from ..kernels import graph_torch, graph_triton
from ..kernels.compiled_graphs import GraphBatch, compile_graph
from ..opargs import grads, op_schema

__all__ = [
    "kernel_graph",
    "min_kernel_size",
    "conv_transduce1d",
    "KernelBank",
    "kernel_bank",
    "conv_transduce_op",
    "SCALES",
    "NORMALIZATIONS",
]

SCALES = ("none", "sqrt", "linear")
NORMALIZATIONS = ("none", "pre", "post")


def kernel_graph(
    tokens: Sequence[int],
    blank_idx: int,
    blank_optional: bool = True,
    spike: bool = False,
    calc_grad: bool = False,
    gtn=None,
):
    """The kernel acceptor of one lexicon entry (the research code's ``make_kernel_graph``).

    Node 0 starts and loops on the blank. Token ``i`` of ``tokens`` owns nodes ``2i + 1`` (the
    token was read; it loops on the token unless ``spike``) and ``2i + 2`` (a blank followed it;
    it loops on the blank). Node ``2i + 2`` accepts after the last token, node ``2i + 1`` too
    when ``blank_optional``; then a token may also follow the previous one without a blank,
    unless both are equal. An empty entry gives one start-and-accept node that reads only blanks.
    Arcs are added in the research code's order, so learned weights line up with its
    ``kernel_params``.

    Args:
        tokens: the input-class ids of the entry.
        blank_idx: the blank's input class.
        blank_optional: trailing blank and blanks between distinct tokens optional.
        spike: each token reads exactly one frame.
        calc_grad: the graph's ``calc_grad``.
        gtn: the graph module to build with (default :mod:`lightning_gtn.wfst`).

    Example:
        >>> g = kernel_graph([1, 2], blank_idx=0)
        >>> g.num_nodes(), g.num_arcs()
        (5, 10)
    """
    gtn = _wfst if gtn is None else gtn
    x = [int(t) for t in tokens]
    n = len(x)
    g = gtn.Graph(calc_grad)
    g.add_node(True, n == 0)
    g.add_arc(0, 0, blank_idx)
    for i, tok in enumerate(x):
        read, after = 2 * i + 1, 2 * i + 2
        last = i == n - 1
        g.add_node(False, bool(blank_optional) and last)
        g.add_node(False, last)
        g.add_arc(read - 1, read, tok)
        if not spike:
            g.add_arc(read, read, tok)
        g.add_arc(read, after, blank_idx)
        g.add_arc(after, after, blank_idx)
        if i > 0 and blank_optional and x[i - 1] != tok:
            g.add_arc(read - 2, read, tok)  # straight from the previous token, no blank
    g.arc_sort(True)
    g.arc_sort()
    return g


#: the most bytes one :func:`conv_transduce1d` call may need (padded inputs, the windows and the
#: kernels' scores per window frame, see :func:`conv_bytes`); raise it to allow more
MAX_CONV_BYTES = 4 << 30


def conv_bytes(B: int, T: int, C: int, kernel_size: int, stride: int, num_arcs: int, itemsize: int = 4) -> int:
    """An upper estimate of the bytes :func:`conv_transduce1d` allocates: the padded inputs,
    the ``(B * T', kernel_size, C)`` windows (twice: the copy and its gradient) and the kernels'
    scores of every window frame and arc (forward and backward)."""
    Tp = (T - 1) // stride + 1 if T > 0 else 0
    return itemsize * (B * (T + kernel_size) * C + B * Tp * kernel_size * (2 * C + 2 * num_arcs))


def min_kernel_size(tokens: Sequence[int]) -> int:
    """Frames an entry needs at least: its length plus one per repeated neighbour (a blank
    must separate equal tokens). The research code's lower bound for ``kernel_size``."""
    x = [int(t) for t in tokens]
    return len(x) + sum(a == b for a, b in zip(x[:-1], x[1:]))


def _check_lexicon(lexicon) -> tuple:
    if isinstance(lexicon, (str, bytes)) or not isinstance(lexicon, Sequence) and not hasattr(lexicon, "__iter__"):
        raise ValueError(f"lexicon must be a list of sequences of input-class ids, got {type(lexicon).__name__}")
    out = []
    for i, entry in enumerate(lexicon):
        if isinstance(entry, torch.Tensor):
            entry = entry.tolist()
        if isinstance(entry, (str, bytes)) or not hasattr(entry, "__iter__"):
            raise ValueError(f"lexicon[{i}] must be a sequence of input-class ids, got {entry!r}")
        ids = []
        for v in entry:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or int(v) < 0:
                raise ValueError(f"lexicon[{i}] must hold non-negative integer input-class ids, got {v!r}")
            ids.append(int(v))
        out.append(tuple(ids))
    if not out:
        raise ValueError("lexicon must have at least one entry (one per output class)")
    return tuple(out)


class KernelBank:
    """The compiled kernel graphs of a lexicon, concatenated, and their padded tables.

    Args:
        lexicon: ``C_out`` sequences of input-class ids.
        blank_idx: the blank's input class.
        blank_optional, spike: as :func:`kernel_graph`.

    Attributes:
        batch: the :class:`GraphBatch` of the ``C_out`` kernels.
        num_arcs: arcs of all kernels (the length of ``kernel_params``).
        arc_off: ``(C_out + 1,)`` where each kernel's arcs (and parameters) start.
        max_label: the largest input class any kernel reads (the blank included).
        min_size: the smallest kernel size the lexicon allows (:func:`min_kernel_size`).
        handle: the integer the custom ops name the bank by.
    """

    def __init__(self, lexicon, blank_idx: int, blank_optional: bool = True, spike: bool = False) -> None:
        self.lexicon = _check_lexicon(lexicon)
        self.blank_idx = checks.check_int(blank_idx, "blank_idx", 0)
        self.blank_optional = bool(blank_optional)
        self.spike = bool(spike)
        graphs = [compile_graph(kernel_graph(x, self.blank_idx, self.blank_optional, self.spike)) for x in self.lexicon]
        self.graphs: list = graphs
        self.batch = GraphBatch(graphs)
        self.num_arcs = self.batch.num_arcs
        self.arc_off = self.batch.arc_off
        self.max_label = int(self.batch.max_label)
        self.min_size = max(min_kernel_size(x) for x in self.lexicon)
        self._tables: LRU[tuple] = LRU(16)  # per device
        self._problems: LRU[dispatch.Problem] = LRU(2)  # 16 MB each for 800 windows x 500 kernels
        self.handle = _BANK_HANDLES.register(self)

    def __reduce__(self):
        # pickled and deep-copied by its arguments: the copy compiles its own graphs, gets its
        # own handle, lock and device tables
        return (KernelBank, (self.lexicon, self.blank_idx, self.blank_optional, self.spike))

    @staticmethod
    def check_window(kernel_size, stride, scale: str, normalize: str) -> Tuple[int, int]:
        """``(kernel_size, stride)`` checked (integers >= 1, ``kernel_size`` odd) with ``scale`` in
        :data:`SCALES` and ``normalize`` in :data:`NORMALIZATIONS`; ValueError naming the first
        one that is not."""
        kernel_size = checks.check_int(kernel_size, "kernel_size", 1)
        stride = checks.check_int(stride, "stride", 1)
        if kernel_size % 2 != 1:
            raise ValueError(
                f"kernel_size must be odd (the inputs are padded by kernel_size // 2 on both sides), got {kernel_size}"
            )
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        return kernel_size, stride

    def check_kernel_size(self, kernel_size: int) -> int:
        """``kernel_size`` when every entry of the lexicon fits in it (:attr:`min_size`), else
        ValueError."""
        if kernel_size < self.min_size:
            raise ValueError(
                f"kernel_size must be at least {self.min_size} for this lexicon (an entry's length plus one "
                f"frame per repeated neighbour), got {kernel_size}"
            )
        return kernel_size

    @property
    def num_kernels(self) -> int:
        """``C_out``, the number of kernels."""
        return len(self.graphs)

    def tables(self, device: torch.device):
        """Padded incoming-arc tables ``(C_out, S, M)`` on ``device`` for the Viterbi recursion:
        ``(src, label, arc, mask, start (C_out, S), accept (C_out, S))``; padding entries point at
        node 0, label 0 and the kernel's first arc (valid indices) and are masked."""
        return self._tables.get(str(device), lambda: self._build_tables(device))

    def _build_tables(self, device: torch.device):
        G = len(self.graphs)
        S = max(g.num_nodes for g in self.graphs)
        M = max(max(int(g.in_cnt.max(initial=0)) for g in self.graphs), 1)
        src = np.zeros((G, S, M), np.int64)
        lab = np.zeros((G, S, M), np.int64)
        arc = np.zeros((G, S, M), np.int64)
        mask = np.zeros((G, S, M), bool)
        start = np.zeros((G, S), bool)
        accept = np.zeros((G, S), bool)
        for k, g in enumerate(self.graphs):
            a0 = int(self.arc_off[k])
            arc[k] = a0
            pos = 0
            for n in range(g.num_nodes):
                c = int(g.in_cnt[n])
                ids = g.in_arc[pos : pos + c]
                src[k, n, :c] = g.src[ids]
                lab[k, n, :c] = g.label[ids]
                arc[k, n, :c] = a0 + ids
                mask[k, n, :c] = True
                pos += c
            start[k, g.start] = True
            accept[k, g.accept] = True
        return tuple(torch.from_numpy(a).to(device) for a in (src, lab, arc, mask, start, accept))

    def problem(self, windows: int, K: int) -> dispatch.Problem:
        """Examples ``(window i, kernel k)`` in window-major order: example ``i * C_out + k``
        (the last two ``(windows, K)`` are kept: a forward and its backward share one)."""
        return self._problems.get((int(windows), int(K)), lambda: self._problem(int(windows), int(K)))

    def _problem(self, windows: int, K: int) -> dispatch.Problem:
        G = len(self.graphs)
        ex_graph = np.tile(np.arange(G, dtype=np.int64), windows)
        ex_row = np.repeat(np.arange(windows, dtype=np.int64), G)
        return dispatch.Problem(self.batch, ex_graph, ex_row, np.full(windows * G, K, dtype=np.int64))


_BANK_HANDLES: HandleRegistry[KernelBank] = HandleRegistry("kernel bank")


def _bank(handle: int) -> KernelBank:
    return _BANK_HANDLES.get(handle)


BANK_CACHE_SIZE = 16
_BANKS: LRU[KernelBank] = LRU(BANK_CACHE_SIZE)


def kernel_bank(lexicon, blank_idx: int, blank_optional: bool = True, spike: bool = False) -> KernelBank:
    """A cached :class:`KernelBank` (LRU of ``BANK_CACHE_SIZE`` lexicons)."""
    key = (_check_lexicon(lexicon), checks.check_int(blank_idx, "blank_idx", 0), bool(blank_optional), bool(spike))
    if _BANKS.maxsize != BANK_CACHE_SIZE:
        _BANKS.resize(BANK_CACHE_SIZE)
    return _BANKS.get(key, lambda: KernelBank(*key))


# ---------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------


def _viterbi_forward(bank: KernelBank, E: torch.Tensor, w: torch.Tensor):
    """Max-plus scores ``(W, G)`` of every window of ``E`` ``(W, K, C)`` against every kernel,
    and the best path's arcs and labels ``(K, W, G)`` (found by back pointers)."""
    src, lab, arc, mask, start, accept = bank.tables(E.device)
    W, K, C = E.shape
    G, S, M = src.shape
    dev, dtype = E.device, E.dtype
    ninf = torch.tensor(-math.inf, dtype=dtype, device=dev)
    zero = torch.zeros((), dtype=dtype, device=dev)
    w_in = torch.where(mask, w[arc], ninf)  # (G, S, M)
    alpha = torch.where(start, zero, ninf).unsqueeze(0).expand(W, G, S)
    src_flat = src.reshape(1, G, S * M).expand(W, G, S * M)
    lab_flat = lab.reshape(1, G * S * M).expand(W, G * S * M)
    bps = torch.empty((K, W, G, S), dtype=torch.uint8 if M <= 255 else torch.int64, device=dev)
    for t in range(K):
        prev = alpha.gather(2, src_flat).reshape(W, G, S, M)
        em = E[:, t].gather(1, lab_flat).reshape(W, G, S, M)
        cand = prev + w_in + em
        alpha, bp = cand.max(-1)
        bps[t] = bp.to(bps.dtype)
    final = torch.where(accept, alpha, ninf)
    score, node = final.max(-1)  # (W, G)
    arcs = torch.empty((K, W, G), dtype=torch.int64, device=dev)
    labels = torch.empty((K, W, G), dtype=torch.int64, device=dev)
    gidx = torch.arange(G, device=dev).unsqueeze(0).expand(W, G)
    for t in range(K - 1, -1, -1):
        m = bps[t].gather(2, node.unsqueeze(-1)).squeeze(-1).long()
        arcs[t] = arc[gidx, node, m]
        labels[t] = lab[gidx, node, m]
        node = src[gidx, node, m]
    return score, arcs, labels


def _state(
    bank: KernelBank, E: torch.Tensor, w: torch.Tensor, impl: str, alpha: torch.Tensor, logz: torch.Tensor
) -> dispatch.State:
    """The :class:`lightning_gtn.kernels.compiled_graphs.State` of a forward of the op, rebuilt from its
    saved tensors."""
    W, K, _ = E.shape
    p = bank.problem(W, K)
    if impl == "triton" and not graph_triton.supports(p.batch):
        impl = "torch"  # what dispatch.forward fell back to
    st = dispatch.State()
    st.problem, st.E, st.w, st.impl, st.logz, st.extra = p, E, w, impl, logz.reshape(-1), None
    N = p.num_examples
    if impl == "numba":
        st.alpha = alpha
    elif impl == "torch":
        st.extra = graph_torch.build_tables(st)
        st.alpha = alpha.reshape(N, K + 1, st.extra.Smax)
    else:
        st.extra = graph_triton.build_tables(p, E.device)
        st.alpha = alpha.reshape(N, K + 1, st.extra.S)
    return st


class ConvTransduceArgs(NamedTuple):
    """The arguments of ``lightning_gtn::conv_transduce``."""

    windows: Tensor
    weights: Tensor
    handle: int
    semiring: str
    impl: str


class ConvTransduceBackwardArgs(NamedTuple):
    """The arguments of ``lightning_gtn::conv_transduce_backward``: the incoming gradient, the
    forward's inputs and outputs, its options and which gradients to form."""

    grad: Tensor
    windows: Tensor
    weights: Tensor
    scores: Tensor
    saved1: Tensor
    saved2: Tensor
    handle: int
    semiring: str
    impl: str
    need_e: bool
    need_w: bool


@torch.library.custom_op("lightning_gtn::conv_transduce", mutates_args=())
@op_schema(ConvTransduceArgs)
def conv_transduce_op(
    windows: Tensor, weights: Tensor, handle: int, semiring: str, impl: str
) -> Tuple[Tensor, Tensor, Tensor]:
    """Scores ``(W, G)`` of windows ``(W, K, C)`` against the kernels of bank ``handle``, and what
    the backward needs: the forward's alphas (flat) and an empty tensor, or in the ``"max"``
    semiring the best paths' arcs and labels ``(K, W, G)`` int64."""
    bank = _bank(handle)
    E = windows.contiguous()
    w = weights.contiguous()
    W, K, _ = E.shape
    if dispatch.check_semiring(semiring) == "max":
        return _viterbi_forward(bank, E, w)
    st = dispatch.forward(bank.problem(W, K), E, w, impl)
    logz = st.logz.to(device=E.device, dtype=E.dtype).reshape(W, bank.num_kernels)
    return logz, st.alpha.reshape(-1), E.new_empty(0, dtype=torch.int64)


@conv_transduce_op.register_fake
def _conv_transduce_fake(*inputs):
    a = ConvTransduceArgs(*inputs)
    windows = a.windows
    W, K, _ = windows.shape
    G = _bank(a.handle).num_kernels
    out = windows.new_empty((W, G))
    if a.semiring == "max":
        return out, windows.new_empty((K, W, G), dtype=torch.int64), windows.new_empty((K, W, G), dtype=torch.int64)
    n = torch.library.get_ctx().new_dynamic_size()  # the alphas' layout depends on the implementation
    return out, windows.new_empty((n,)), windows.new_empty((0,), dtype=torch.int64)


@torch.library.custom_op("lightning_gtn::conv_transduce_backward", mutates_args=())
@op_schema(ConvTransduceBackwardArgs)
def conv_transduce_backward_op(
    grad: Tensor,
    windows: Tensor,
    weights: Tensor,
    scores: Tensor,
    saved1: Tensor,
    saved2: Tensor,
    handle: int,
    semiring: str,
    impl: str,
    need_e: bool,
    need_w: bool,
) -> Tuple[Tensor, Tensor]:
    """``(d<scores, grad>/d windows, d<scores, grad>/d weights)``; an unrequested one is empty.
    Pairs without a path (``-inf``) pass no gradient."""
    bank = _bank(handle)
    W, K, C = windows.shape
    coef = torch.where(torch.isinf(scores), torch.zeros_like(scores), grad.to(scores.dtype))
    gE = gw = None
    if dispatch.check_semiring(semiring) == "max":
        arcs, labels = saved1, saved2
        if need_e:
            gE = torch.zeros((W, K, C), dtype=scores.dtype, device=scores.device)
            for t in range(K):
                gE[:, t].scatter_add_(1, labels[t], coef)
        if need_w:
            gw = torch.zeros(bank.num_arcs, dtype=scores.dtype, device=scores.device)
            gw.index_add_(0, arcs.reshape(-1), coef.unsqueeze(0).expand(K, W, -1).reshape(-1))
    elif need_e or need_w:
        st = _state(bank, windows.contiguous(), weights.contiguous(), impl, saved1, scores)
        gE, gw = dispatch.backward(st, coef.reshape(-1).to(windows.device), need_e, need_w)
    gE = gE.to(windows.dtype) if gE is not None else windows.new_empty(0)
    gw = gw.to(weights.dtype) if gw is not None else weights.new_empty(0)
    return gE, gw


@conv_transduce_backward_op.register_fake
def _conv_transduce_backward_fake(*inputs):
    a = ConvTransduceBackwardArgs(*inputs)
    return (
        torch.empty_like(a.windows) if a.need_e else a.windows.new_empty(0),
        torch.empty_like(a.weights) if a.need_w else a.weights.new_empty(0),
    )


def _setup(ctx, inputs, output):
    a = ConvTransduceArgs(*inputs)
    ctx.handle, ctx.semiring, ctx.impl = a.handle, a.semiring, a.impl  # the options; the tensors are saved
    ctx.bank = _bank(a.handle)  # a strong reference: the bank lives until the backward
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(a.windows, a.weights, output[0], output[1], output[2])


def _backward(ctx, grad, _g1, _g2):
    need = ConvTransduceArgs(*ctx.needs_input_grad)
    if grad is None or not (need.windows or need.weights):
        return grads(ConvTransduceArgs)
    windows, weights, scores, s1, s2 = ctx.saved_tensors
    args = ConvTransduceBackwardArgs(
        grad=grad,
        windows=windows,
        weights=weights,
        scores=scores,
        saved1=s1,
        saved2=s2,
        handle=ctx.handle,
        semiring=ctx.semiring,
        impl=ctx.impl,
        need_e=bool(need.windows),
        need_w=bool(need.weights),
    )
    gE, gw = conv_transduce_backward_op(*args)
    return grads(ConvTransduceArgs, windows=gE if need.windows else None, weights=gw if need.weights else None)


conv_transduce_op.register_autograd(_backward, setup_context=_setup)


def _weights_for(bank: KernelBank, kernel_params: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if kernel_params is None:
        return torch.zeros(bank.num_arcs, dtype=like.dtype, device=like.device)
    return kernel_params.to(device=like.device, dtype=like.dtype)


def _check_kernel_params(bank: KernelBank, kernel_params) -> Optional[torch.Tensor]:
    """``kernel_params`` when it is None or a float ``(num_arcs,)`` tensor, else ValueError."""
    if kernel_params is None:
        return None
    if (
        not isinstance(kernel_params, torch.Tensor)
        or kernel_params.dim() != 1
        or kernel_params.shape[0] != bank.num_arcs
        or not kernel_params.is_floating_point()
    ):
        shape = tuple(kernel_params.shape) if isinstance(kernel_params, torch.Tensor) else type(kernel_params).__name__
        raise ValueError(
            f"kernel_params must be a float tensor of shape (num_arcs,) = ({bank.num_arcs},) "
            f"(one weight per kernel arc), got {shape}"
        )
    return kernel_params


class _ConvTransduce(criterion.Criterion):
    """The WFST convolution through :func:`~lightning_gtn.core.criterion.apply_loss`: a layer,
    not a loss (no targets, no lengths, no reduction: ``reductions=("none",)``); always its own
    op, ``lightning_gtn::conv_transduce`` (:class:`ConvTransduceArgs`) with its backward
    ``lightning_gtn::conv_transduce_backward`` (:class:`ConvTransduceBackwardArgs`), on the graph
    kernels (:data:`~lightning_gtn.core.scoring.GRAPH_BACKENDS`).

    Its call options (:meth:`check_call_options`) are :func:`conv_transduce1d`'s keywords:
    ``lexicon`` (or a :class:`KernelBank`), ``blank_idx``, ``blank_optional``, ``spike``,
    ``kernel_size``, ``stride``, ``kernel_params``, ``scale``, ``normalize`` and ``viterbi``."""

    name = "conv_transduce1d"
    reductions = ("none",)

    def check_options(self, C, blank, weights, device):
        return -1, None

    def check_call_options(self, shape, options):
        opts = dict(options)
        kernel_size, stride = KernelBank.check_window(
            opts.pop("kernel_size"), opts.pop("stride"), opts.get("scale", "none"), opts.get("normalize", "none")
        )
        scale, normalize = opts.pop("scale", "none"), opts.pop("normalize", "none")
        lexicon, blank_idx = opts.pop("lexicon"), opts.pop("blank_idx")
        blank_optional, spike = opts.pop("blank_optional", True), opts.pop("spike", False)
        kernel_params, viterbi = opts.pop("kernel_params", None), opts.pop("viterbi", False)
        super().check_call_options(shape, opts)  # no other option
        bank = lexicon if isinstance(lexicon, KernelBank) else kernel_bank(lexicon, blank_idx, blank_optional, spike)
        bank.check_kernel_size(kernel_size)
        B, T, C = shape
        if bank.max_label >= C:
            raise ValueError(
                f"inputs must have C_in greater than every lexicon id and blank_idx: the kernels read "
                f"input class {bank.max_label}, but inputs has C_in={C} (shape {(B, T, C)})"
            )
        return {
            "bank": bank,
            "kernel_size": kernel_size,
            "stride": stride,
            "scale": scale,
            "normalize": normalize,
            "semiring": "max" if viterbi else "log",  # the research API's flag, named once here
            "kernel_params": _check_kernel_params(bank, kernel_params),
        }

    def own_kernel(self, device, impl):
        return impl or ""  # the op's scorer is picked for the inputs' device (call_kernel)

    def index_tensors(self, targets, input_lengths, target_lengths, B, device):
        return None, None, None  # a layer: no targets, every frame read

    def call_kernel(self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e,
                    options):  # fmt: skip
        bank, kernel_size, stride = options["bank"], options["kernel_size"], options["stride"]
        B, T, C = x.shape
        need_bytes = conv_bytes(B, T, C, kernel_size, stride, bank.num_arcs, x.element_size())
        if need_bytes > MAX_CONV_BYTES:
            raise ValueError(
                f"kernel_size={kernel_size} and stride={stride} over inputs of shape {(B, T, C)} would need about "
                f"{need_bytes / 2**30:.1f} GiB, more than MAX_CONV_BYTES={MAX_CONV_BYTES} "
                f"({MAX_CONV_BYTES / 2**30:.1f} GiB); use a smaller kernel_size or a larger stride, or raise "
                "lightning_gtn.losses.conv_transduce.MAX_CONV_BYTES"
            )
        pad = kernel_size // 2
        x = F.pad(x, (0, 0, pad, pad))
        normalize = options["normalize"]
        if normalize == "pre":
            x = x.log_softmax(-1)
        Tp = (T - 1) // stride + 1 if T > 0 else 0
        G = bank.num_kernels
        if Tp == 0 or B == 0:
            out = x.new_zeros((B, Tp, G))
        else:
            windows = x.unfold(1, kernel_size, stride)[:, :Tp]  # (B, T', C, K)
            windows = windows.transpose(2, 3).reshape(B * Tp, kernel_size, C)
            w = _weights_for(bank, options["kernel_params"], x)
            semiring = options["semiring"]
            impl_ = "torch" if semiring == "max" else pick_impl(x, "numba" if impl == "numba_log" else (impl or None))
            args = ConvTransduceArgs(windows=windows, weights=w, handle=bank.handle, semiring=semiring, impl=impl_)
            out = conv_transduce_op(*args)[0].reshape(B, Tp, G)
        if options["scale"] == "sqrt":
            out = out / math.sqrt(kernel_size)
        elif options["scale"] == "linear":
            out = out / kernel_size
        if normalize == "post":
            out = out.softmax(-1)
        elif normalize == "pre":
            out = out.exp()
        return out


_CONV = _ConvTransduce()


def conv_transduce1d(
    inputs: torch.Tensor,
    lexicon,
    kernel_size: int,
    stride: int,
    blank_idx: int,
    *,
    blank_optional: bool = True,
    spike: bool = False,
    kernel_params: Optional[torch.Tensor] = None,
    scale: str = "none",
    normalize: str = "none",
    viterbi: bool = False,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """The WFST convolution of a batch: every window scored against every lexicon kernel.

    The inputs are padded with ``kernel_size // 2`` zero frames on both sides (``"pre"``
    normalisation then takes their ``log_softmax``); window ``t`` covers padded frames
    ``[t * stride, t * stride + kernel_size)``, so ``T' = ceil(T / stride)``. Output ``[b, t, k]``
    is the forward score (``viterbi=False``) or the best path's score of window ``t`` of example
    ``b`` against the kernel graph of ``lexicon[k]`` (:func:`kernel_graph`, arc weights from
    ``kernel_params``), divided by the scale (1, ``sqrt(kernel_size)`` or ``kernel_size``); then
    ``"post"`` applies ``softmax`` over ``k`` and ``"pre"`` takes ``exp``. A pair without a path
    scores ``-inf`` (gradient zero). All ``B * T' * C_out`` pairs are scored in one batched call
    on the inputs' device (a custom op: works under ``torch.compile(fullgraph=True)``).

    Args:
        inputs: ``(B, T, C_in)`` float scores; float16/bfloat16 are computed in float32.
        lexicon: ``C_out`` sequences of input-class ids in ``[0, C_in)`` (a :class:`KernelBank`
            is accepted too; then ``blank_idx``, ``blank_optional`` and ``spike`` are its own).
        kernel_size: odd window length, at least :func:`min_kernel_size` of every entry.
        stride: frames between windows (>= 1).
        blank_idx: the blank's input class in ``[0, C_in)``.
        blank_optional, spike: kernel topology, see :func:`kernel_graph`.
        kernel_params: ``(num_arcs,)`` arc weights of all kernels (research arc order), or None
            for zeros.
        scale: ``"none"``, ``"sqrt"`` or ``"linear"``.
        normalize: ``"none"``, ``"pre"`` or ``"post"``.
        viterbi: max instead of log-sum-exp over paths.
        impl: None (the default for the device), ``"numba"``, ``"torch"`` or ``"triton"`` for the
            forward scores; the Viterbi mode always runs on torch ops.

    Returns:
        ``(B, T', C_out)`` in the inputs' dtype and device.

    Example:
        >>> import torch
        >>> x = torch.randn(2, 10, 4).log_softmax(-1)
        >>> conv_transduce1d(x, [[1], [2, 3], []], kernel_size=3, stride=2, blank_idx=0).shape
        torch.Size([2, 5, 3])
    """
    return criterion.apply_loss(
        _CONV, inputs, None, None, None, reduction="none", impl=impl, name="inputs", lexicon=lexicon,
        blank_idx=blank_idx, blank_optional=blank_optional, spike=spike, kernel_size=kernel_size, stride=stride,
        kernel_params=kernel_params, scale=scale, normalize=normalize, viterbi=viterbi,
    )  # fmt: skip
