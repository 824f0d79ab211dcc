"""The RNN-T loss of a ``Linear(tanh(enc + pred))`` joiner that never holds the joiner output.

:func:`rnnt_joiner_loss` is exactly :func:`lightning_gtn.functional.rnnt_loss` of the logits
``tanh(encoder[:, :, None] + predictor[:, None]) @ weight.T + bias`` (fused log-softmax), with the
gradients of all four tensors, but it never holds the ``(B, T, U + 1, V)`` logits (nor the
``(B, T, U + 1, J)`` hidden): the nodes ``(t, u)`` of each example's grid are taken by chunks of
at most :data:`JOINER_CHUNK_BYTES` of work space.

1. Forward (custom op ``lightning_gtn::rnnt_joiner_loss``, :class:`RNNTJoinerArgs`): per chunk
   the logits of its nodes, their log-normaliser over ``V``, the blank and the target logits,
   which give the two log-probabilities each node's arcs carry, ``(B, T, U + 1)`` each. The RNN-T
   lattice scores those (the two-class lattice: the kernels of :mod:`lightning_gtn.kernels.rnnt_numba`
   on the CPU, :mod:`lightning_gtn.kernels.rnnt_torch` elsewhere, ``fused=False``), which also gives
   each arc's posterior, FastEmit's ``1 + lambda`` on the emit arcs included.
2. Backward (custom op ``lightning_gtn::rnnt_joiner_loss_backward``,
   :class:`RNNTJoinerBackwardArgs`): per chunk the logits again, and
   ``dz = (p_blank + p_emit) softmax(z) - p_blank [v = blank] - p_emit [v = y_u]`` (``p`` the
   weighted arc posteriors), clipped to ``[-clamp, clamp]`` when ``clamp > 0``, times the example's
   coefficient (the reduction's and the incoming gradient's); then ``dW += dz^T h``,
   ``db += sum dz``, ``dpre = (dz W) (1 - h^2)``, summed over ``u`` into the encoder's gradient and
   over ``t`` into the predictor's.

What is held between the two: the normalisers and the weighted arc posteriors, ``3 B T (U + 1)``
values. Each pass computes the logits once, so a training step costs one joiner forward more than
the materialised path.

:func:`tdt_joiner_loss` and :func:`multiblank_rnnt_joiner_loss` do the same for the duration
lattices of :mod:`.rnnt_variants` (custom ops ``lightning_gtn::duration_joiner_loss`` and its
backward, :class:`DurationJoinerArgs`): per node the label (and TDT's duration) normaliser and
the log-probabilities its arcs read (the target's, the blank's and big blanks', the durations'),
scored by :func:`.rnnt_variants.duration_lattice_op` in its unfused mode, whose gradient w.r.t.
those log-probabilities the backward turns into the logits' per chunk (see the section below).

On a CUDA device (``impl="triton"``, or None once they pass their self-check there) the per-node
passes are the Triton kernels of :mod:`lightning_gtn.kernels.rnnt_joiner_triton` instead of the
chunks (tiles of ``V`` and ``J`` inside each kernel); the lattices between them are the same.
"""

from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..core import checks
from ..core.criterion import Criterion, apply_loss
from ..core.impl import Backends
from ..core.reduction import reduction_coefficients
from ..kernels import rnnt_joiner_triton
from ..kernels.rnnt_numba import rnnt_cost_grad
from ..kernels.rnnt_torch import rnnt_cost_grad_torch
from ..opargs import grads, op_schema
from .rnnt_variants import BACKENDS as DURATION_BACKENDS
from .rnnt_variants import IMPLS as DURATION_IMPLS
from .rnnt_variants import MULTIBLANK, TDT, DurationLatticeArgs, DurationLatticeCriterion, duration_lattice_op
from .rnnt_variants import REDUCTIONS as DURATION_REDUCTIONS

__all__ = [
    "rnnt_joiner_loss",
    "tdt_joiner_loss",
    "multiblank_rnnt_joiner_loss",
    "JOINER_BACKENDS",
    "JOINER_CHUNK_BYTES",
    "MAX_JOINER_NODES",
    "RNNTJoinerArgs",
    "RNNTJoinerBackwardArgs",
    "DurationJoinerArgs",
    "DurationJoinerBackwardArgs",
]

#: work space of one chunk of nodes, in bytes (read at each call; a chunk holds at least one node):
#: ``2 (V + J)`` values a node in the compute dtype, a bound of both passes (the logits and a
#: temporary of theirs with the hidden; the logits' gradient, the hidden and its gradient). Large
#: chunks also mean few torch calls, which matters on a loaded machine (each parallel region
#: waits for its slowest thread)
JOINER_CHUNK_BYTES = 64 << 20
#: the most lattice nodes ``B * T * (U + 1)`` one call holds (its normalisers, arc posteriors and
#: the lattice's own recursions, about 100 bytes a node: 2^26 nodes are about 6 GiB)
MAX_JOINER_NODES = 1 << 26

#: how ``impl`` resolves: the joiner runs as chunked torch matmuls on any device (``"torch"``, the
#: default on the CPU) or as the Triton kernels of :mod:`lightning_gtn.kernels.rnnt_joiner_triton`
#: (``"triton"``, the default on a CUDA device once they pass their self-check there); the lattice
#: on those is numba's on the CPU, torch's elsewhere
JOINER_BACKENDS = Backends(
    "rnnt_joiner_loss",
    ("torch", "triton"),
    triton_available=rnnt_joiner_triton.available,
    self_check=rnnt_joiner_triton.self_check,
    kernels="Triton joiner",
    fallback="the chunked torch joiner",
)

_SHAPES = "encoder (B, T, J), predictor (B, U + 1, J), weight (V, J), bias (V,)"


def _node_bytes(J: int, V: int, itemsize: int) -> int:
    return itemsize * 2 * (V + J)


def chunk_nodes(J: int, V: int, itemsize: int, budget: Optional[int] = None) -> int:
    """Nodes per chunk: as many as :data:`JOINER_CHUNK_BYTES` (or ``budget``) holds, at least 1."""
    b = JOINER_CHUNK_BYTES if budget is None else budget
    return max(1, int(b) // _node_bytes(J, V, itemsize))


def _check_sizes(B: int, T: int, U1: int) -> None:
    n = B * T * U1
    if n > MAX_JOINER_NODES:
        raise ValueError(
            f"rnnt_joiner_loss: the lattice of B * T * (U + 1) = {B} * {T} * {U1} = {n:,} nodes is over the limit of "
            f"{MAX_JOINER_NODES:,} (lightning_gtn.losses.rnnt_joiner.MAX_JOINER_NODES); use a smaller batch or "
            "shorter inputs"
        )


def _host(targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor):
    """Host int64 copies ``(targets, logit_lengths, target_lengths)``."""
    return tuple(
        x.detach().cpu().numpy().astype(np.int64, copy=False) for x in (targets, logit_lengths, target_lengths)
    )


def _check_values(
    targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor, T: int, U: int, K: int, blanks, classes: str
):
    """Host int64 copies ``(targets, logit_lengths, target_lengths)``, range-checked: labels in
    ``[0, K)`` (``classes`` names ``K``) and none of ``blanks``."""
    tg, il, tl = _host(targets, logit_lengths, target_lengths)
    checks.check_in_range(il, "logit_lengths", "T", T, inclusive=True, of="encoder of shape (B, T, J)")
    checks.check_in_range(tl, "target_lengths", "U", U, inclusive=True, of="predictor of shape (B, U + 1, J)")
    checks.check_padded_labels(tg, tl, K, blanks, classes=classes)
    return tg, il, tl


class _Nodes:
    """The nodes ``(t, u)``, ``t < T_b``, ``u <= U_b`` of example ``b`` in row-major order, and the
    label each node's emit arc reads (the blank, never read, at ``u = U_b``), cut into chunks of
    at most ``per`` nodes: whole frames where one fits (the hidden is a broadcast sum, its
    gradient sums over axes), else runs of nodes (gathered and scattered by index)."""

    def __init__(self, Tb: int, Ub: int, labels: np.ndarray, blank: int, per: int, device: torch.device) -> None:
        U1 = Ub + 1
        self.T, self.U1, self.n, self.per = Tb, U1, Tb * U1, per
        y = np.full(U1, blank, dtype=np.int64)
        y[:Ub] = labels[:Ub]
        yu = torch.from_numpy(y).to(device)
        self.frames = per >= U1
        if self.frames:
            self.y = yu.repeat(min(Tb, per // U1))  # the labels of a chunk of whole frames
        else:
            n = torch.arange(self.n, device=device)
            self.t = n // U1
            self.u = n - self.t * U1
            self.y = yu[self.u]

    def chunks(self):
        """``(n0, n1, key)``: the chunk's nodes ``[n0, n1)``; ``key`` its frames ``(t0, t1)`` or None."""
        if self.frames:
            nt = min(self.T, self.per // self.U1)
            nt = -(-self.T // -(-self.T // nt))  # as many chunks, their frames evened out
            for t0 in range(0, self.T, nt):
                t1 = min(self.T, t0 + nt)
                yield t0 * self.U1, t1 * self.U1, (t0, t1)
        else:
            for n0 in range(0, self.n, self.per):
                yield n0, min(self.n, n0 + self.per), None

    def labels(self, n0: int, n1: int) -> Tensor:
        """``(n, 1)``: the emit label of each node of the chunk."""
        return (self.y[: n1 - n0] if self.frames else self.y[n0:n1])[:, None]

    def hidden(self, enc: Tensor, pred: Tensor, n0: int, n1: int, key) -> Tensor:
        """``(n, J)``: ``tanh(enc[t] + pred[u])`` of the chunk's nodes (``enc (T, J)``, ``pred (U + 1, J)``)."""
        if key is not None:
            t0, t1 = key
            pre = enc[t0:t1, None, :] + pred[None, : self.U1, :]
            return torch.tanh_(pre).reshape(-1, enc.shape[1])
        return torch.tanh_(enc.index_select(0, self.t[n0:n1]) + pred.index_select(0, self.u[n0:n1]))

    def logits(self, enc: Tensor, pred: Tensor, weight: Tensor, bias: Tensor, hidden: bool = False):
        """Per chunk ``(n0, n1, key, z)`` (``(n0, n1, key, z, h)`` with ``hidden``): the chunk's
        logits ``z (n, V)`` of its hidden ``h (n, J)``."""
        for n0, n1, key in self.chunks():
            h = self.hidden(enc, pred, n0, n1, key)
            z = _logits(h, weight, bias)
            yield (n0, n1, key, z, h) if hidden else (n0, n1, key, z)

    def add_grads(self, g_enc: Optional[Tensor], g_pred: Optional[Tensor], dpre: Tensor, n0: int, n1: int, key) -> None:
        """The chunk's ``dpre (n, J)`` summed over ``u`` into ``g_enc (T, J)``, over ``t`` into ``g_pred``."""
        if key is not None:
            t0, t1 = key
            d = dpre.view(t1 - t0, self.U1, -1)
            if g_enc is not None:
                g_enc[t0:t1].add_(d.sum(1))
            if g_pred is not None:
                g_pred[: self.U1].add_(d.sum(0))
            return
        if g_enc is not None:
            g_enc.index_add_(0, self.t[n0:n1], dpre)
        if g_pred is not None:
            g_pred.index_add_(0, self.u[n0:n1], dpre)


def _examples(encoder: Tensor, weight: Tensor, tg: np.ndarray, il: np.ndarray, tl: np.ndarray, pad: int):
    """``(b, nodes)``: each example with frames and its :class:`_Nodes` (emit label ``pad`` at
    ``u = U_b``), chunked by :func:`chunk_nodes` of the encoder's dtype."""
    per = chunk_nodes(encoder.shape[2], weight.shape[0], encoder.element_size())
    for b in range(encoder.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        if Tb == 0:
            continue
        yield b, _Nodes(Tb, Ub, tg[b], pad, per, encoder.device)


def _logits(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``(n, V)``: ``h @ weight.T + bias``."""
    return torch.addmm(bias, h, weight.t())


def _accumulate(dz: Tensor, h: Tensor, weight: Tensor, b: int, nodes: "_Nodes", chunk, g_enc, g_pred, g_w, g_b) -> None:
    """A chunk's logit gradient ``dz (n, V)`` (of the hidden ``h (n, J)``) into the gradients:
    ``dW += dz^T h``, ``db += sum dz``, ``dpre = (dz W) (1 - h^2)`` summed into example ``b``'s
    rows of the encoder's and the predictor's (those that are None are not asked for)."""
    if g_w is not None:
        g_w.addmm_(dz.t(), h)
    if g_b is not None:
        g_b.add_(dz.sum(0))
    if g_enc is not None or g_pred is not None:
        dpre = torch.mm(dz, weight)
        torch.ops.aten.tanh_backward.grad_input(dpre, h, grad_input=dpre)  # dh (1 - h^2), in place
        ge = None if g_enc is None else g_enc[b]
        gp = None if g_pred is None else g_pred[b]
        nodes.add_grads(ge, gp, dpre, *chunk)


def lattice_on_numba(device: torch.device) -> bool:
    """Whether the lattice of tensors on ``device`` runs on the numba kernel (the CPU) or on the
    torch one (every other device)."""
    return device.type == "cpu"


def _lattice(lp2: Tensor, il: np.ndarray, tl: np.ndarray, lam: float, need_grad: bool):
    """Costs ``(B,)`` float64 (``-log P``, not scaled by FastEmit) and the gradient of the
    two-class lattice ``lp2 (B, T, U + 1, 2)`` (``[blank, emit]`` log-probabilities, blank 0,
    every label 1): ``-p_blank`` and ``-(1 + lam) p_emit`` per node, or None."""
    B, T, U1, _ = lp2.shape
    ones = np.ones((B, max(U1 - 1, 1)), dtype=np.int64)
    if lattice_on_numba(lp2.device):
        x = lp2.contiguous()
        g = torch.zeros_like(x) if need_grad else None
        costs = rnnt_cost_grad(x.numpy(), ones, il, tl, 0, False, lam, -1.0, None, None if g is None else g.numpy())
        return torch.from_numpy(costs), g
    dev = lp2.device
    scale = torch.ones(B, dtype=torch.float64) if need_grad else None
    c, g = rnnt_cost_grad_torch(
        lp2,
        torch.from_numpy(ones).to(dev),
        torch.from_numpy(il).to(dev),
        torch.from_numpy(tl).to(dev),
        0,
        False,
        lam,
        -1.0,
        scale,
    )
    return c.to(torch.float64).cpu(), g


def _forward(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    reduction: str,
    zero_infinity: bool,
    lam: float,
    need_grad: bool,
    triton: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse (B, T, U + 1), arcs (B, T, U + 1, 2))``; ``arcs`` are the weighted posteriors
    ``[p_blank, (1 + lam) p_emit]`` of each node's two arcs (empty tensors without ``need_grad``);
    ``triton``: the nodes' log-probabilities by :func:`.rnnt_joiner_triton.joiner_rows`."""
    B, T, J = encoder.shape
    U1 = predictor.shape[1]
    V = weight.shape[0]
    _check_sizes(B, T, U1)
    tg, il, tl = _check_values(targets, logit_lengths, target_lengths, T, U1 - 1, V, blank, "V")
    dev, dt = encoder.device, encoder.dtype
    lp2 = torch.zeros((B, T, U1, 2), dtype=torch.float64, device=dev)
    lse = torch.zeros((B, T, U1), dtype=dt, device=dev) if need_grad else None
    if triton:
        args = (encoder, predictor, weight, bias, targets, logit_lengths, target_lengths, blank, lp2, lse)
        rnnt_joiner_triton.joiner_rows(*args)
    examples = () if triton else _examples(encoder, weight, tg, il, tl, blank)
    with torch.no_grad():
        for b, nodes in examples:
            Tb, U1b = nodes.T, nodes.U1
            lb = torch.empty(nodes.n, 2, dtype=torch.float64, device=dev)
            ls = torch.empty(nodes.n, dtype=dt, device=dev)
            for n0, n1, _, z in nodes.logits(encoder[b], predictor[b], weight, bias):
                d = torch.logsumexp(z, dim=1)
                ls[n0:n1] = d
                lb[n0:n1, 0] = z[:, blank] - d
                lb[n0:n1, 1] = z.gather(1, nodes.labels(n0, n1))[:, 0] - d
            lp2[b, :Tb, :U1b] = lb.view(Tb, U1b, 2)
            if lse is not None:
                lse[b, :Tb, :U1b] = ls.view(Tb, U1b)
    costs, g2 = _lattice(lp2, il, tl, lam, need_grad)
    costs = costs * (1.0 + lam)  # FastEmit's reported cost, as rnnt_loss reports it
    if zero_infinity:
        costs = torch.where(costs == math.inf, torch.zeros_like(costs), costs)
    if reduction == "none":
        out = costs
    else:
        out = (costs * reduction_coefficients(reduction, B)).sum()
    out = out.to(device=dev, dtype=dt)
    if g2 is None or lse is None:
        return out, encoder.new_empty(0), encoder.new_empty(0)
    return out, lse, g2.neg_().to(dt)


class RNNTJoinerArgs(NamedTuple):
    """The arguments of ``lightning_gtn::rnnt_joiner_loss``."""

    encoder: Tensor
    predictor: Tensor
    weight: Tensor
    bias: Tensor
    targets: Tensor
    logit_lengths: Tensor
    target_lengths: Tensor
    blank: int
    clamp: float
    reduction: str
    zero_infinity: bool
    fastemit_lambda: float
    impl: str
    need_grad: bool


class RNNTJoinerBackwardArgs(NamedTuple):
    """The arguments of ``lightning_gtn::rnnt_joiner_loss_backward``."""

    encoder: Tensor
    predictor: Tensor
    weight: Tensor
    bias: Tensor
    targets: Tensor
    logit_lengths: Tensor
    target_lengths: Tensor
    lse: Tensor
    arcs: Tensor
    coef: Tensor
    blank: int
    clamp: float
    impl: str
    need_encoder: bool
    need_predictor: bool
    need_weight: bool
    need_bias: bool


@torch.library.custom_op("lightning_gtn::rnnt_joiner_loss", mutates_args=())
@op_schema(RNNTJoinerArgs)
def rnnt_joiner_loss_op(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    clamp: float,
    reduction: str,
    zero_infinity: bool,
    fastemit_lambda: float,
    impl: str,
    need_grad: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse (B, T, U + 1), arcs (B, T, U + 1, 2))``: ``out`` is ``(B,)`` for
    ``reduction="none"``, else a scalar; ``lse`` and ``arcs`` (what the backward reads: the
    normalisers and the weighted arc posteriors) are empty tensors without ``need_grad``."""
    use = JOINER_BACKENDS.pick(encoder.device, impl or None)
    return _forward(
        encoder,
        predictor,
        weight,
        bias,
        targets,
        logit_lengths,
        target_lengths,
        blank,
        reduction,
        zero_infinity,
        fastemit_lambda,
        need_grad,
        use == "triton",
    )


@rnnt_joiner_loss_op.register_fake
def _fake(*inputs):
    a = RNNTJoinerArgs(*inputs)
    enc = a.encoder
    B, T = enc.shape[0], enc.shape[1]
    U1 = a.predictor.shape[1]
    out = enc.new_empty((B,) if a.reduction == "none" else ())
    if not a.need_grad:
        return out, enc.new_empty(0), enc.new_empty(0)
    return out, enc.new_empty((B, T, U1)), enc.new_empty((B, T, U1, 2))


@torch.library.custom_op("lightning_gtn::rnnt_joiner_loss_backward", mutates_args=())
@op_schema(RNNTJoinerBackwardArgs)
def rnnt_joiner_loss_backward_op(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    lse: Tensor,
    arcs: Tensor,
    coef: Tensor,
    blank: int,
    clamp: float,
    impl: str,
    need_encoder: bool,
    need_predictor: bool,
    need_weight: bool,
    need_bias: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``sum_b coef[b] * d cost[b] / d (encoder, predictor, weight, bias)`` (``cost[b]`` with
    FastEmit's emit-arc weighting and ``clamp`` applied to each example's logit gradient before
    ``coef``); the gradients not asked for are empty tensors."""
    a = RNNTJoinerBackwardArgs(
        encoder,
        predictor,
        weight,
        bias,
        targets,
        logit_lengths,
        target_lengths,
        lse,
        arcs,
        coef,
        blank,
        clamp,
        impl,
        need_encoder,
        need_predictor,
        need_weight,
        need_bias,
    )
    if JOINER_BACKENDS.pick(encoder.device, impl or None) == "triton":
        need = (need_encoder, need_predictor, need_weight, need_bias)
        got = rnnt_joiner_triton.joiner_grads(*a[:10], blank, clamp, need)
        return tuple(encoder.new_empty(0) if g is None else g for g in got)  # type: ignore[return-value]

    def example(b: int, nodes: _Nodes, cb: float):
        ls = lse[b, : nodes.T, : nodes.U1].reshape(-1)
        pa = arcs[b, : nodes.T, : nodes.U1].reshape(-1, 2)
        # the coefficient goes into the arcs' weights unless the clamp must see the unscaled gradient
        fold = clamp <= 0.0 and cb > 0.0

        def dz_of(z: Tensor, n0: int, n1: int) -> Tensor:
            pb, pe = pa[n0:n1, 0], pa[n0:n1, 1]
            if fold:
                pb, pe = pb * cb, pe * cb
            # (p_blank + p_emit) softmax(z) = exp(z - (lse - log(p_blank + p_emit))): two passes over z
            dz = z.sub_((ls[n0:n1] - torch.log(pb + pe))[:, None]).exp_()
            dz[:, blank] -= pb
            dz.scatter_add_(1, nodes.labels(n0, n1), -pe[:, None])
            if clamp > 0.0:
                dz.clamp_(-clamp, clamp)
            if not fold:
                dz.mul_(cb)
            return dz

        return dz_of

    return _backward_grads(a, blank, example)


def _backward_grads(a, pad: int, example) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four gradients of a backward op's arguments ``a`` (a schema with the four tensors, the
    index tensors, ``coef`` and the ``need_*`` flags): per example with frames ``dz_of =
    example(b, nodes, coef[b])``, per chunk ``dz_of(z, n0, n1)`` the chunk's logit gradient (it
    may overwrite the logits ``z``), accumulated by :func:`_accumulate`; those not asked for
    are empty tensors."""
    encoder, predictor, weight, bias = a.encoder, a.predictor, a.weight, a.bias
    tg, il, tl = _host(a.targets, a.logit_lengths, a.target_lengths)
    c = a.coef.detach().to(device=encoder.device, dtype=encoder.dtype).reshape(-1)
    g_enc = torch.zeros_like(encoder) if a.need_encoder else None
    g_pred = torch.zeros_like(predictor) if a.need_predictor else None
    g_w = torch.zeros_like(weight) if a.need_weight else None
    g_b = torch.zeros_like(bias) if a.need_bias else None
    with torch.no_grad():
        for b, nodes in _examples(encoder, weight, tg, il, tl, pad):
            dz_of = example(b, nodes, float(c[b]))
            for n0, n1, key, z, h in nodes.logits(encoder[b], predictor[b], weight, bias, hidden=True):
                _accumulate(dz_of(z, n0, n1), h, weight, b, nodes, (n0, n1, key), g_enc, g_pred, g_w, g_b)
    return tuple(encoder.new_empty(0) if g is None else g for g in (g_enc, g_pred, g_w, g_b))  # type: ignore[return-value]


def _grads_fake(a):
    """The fake outputs of a backward op whose arguments ``a`` start with the four tensors."""
    need = (a.need_encoder, a.need_predictor, a.need_weight, a.need_bias)
    return tuple(torch.empty_like(x) if n else a.encoder.new_empty(0) for x, n in zip(a[:4], need))


@rnnt_joiner_loss_backward_op.register_fake
def _backward_fake(*inputs):
    return _grads_fake(RNNTJoinerBackwardArgs(*inputs))


def _save(ctx, a, output) -> None:
    """What a joiner op's backward reads: its tensors, index tensors, normalisers and arcs."""
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(
        a.encoder, a.predictor, a.weight, a.bias, a.targets, a.logit_lengths, a.target_lengths, output[1], output[2]
    )


def _coefficients(reduction: str, B: int, tl: Tensor, dtype: torch.dtype, device) -> Tensor:
    """The ``(B,)`` reduction coefficients, ``"mean_volume"`` (NeMo's: over the summed target lengths) too."""
    if reduction == "mean_volume":
        count = int(tl.detach().cpu().to(torch.int64).sum())
        return reduction_coefficients("mean", B, count=count, dtype=dtype, device=device)
    return reduction_coefficients(reduction, B, dtype=dtype, device=device)


def _joiner_backward(ctx, g_out, need, schema, back_schema, back_op):
    """The gradients of a joiner op (``schema``, ``need`` its ``needs_input_grad``) by its
    backward op: the saved tensors, the coefficients of ``ctx.reduction`` times ``g_out``, then
    ``ctx.extra`` (the backward's own options) and the four ``need_*`` flags."""
    if g_out is None:
        return grads(schema)
    saved = ctx.saved_tensors
    enc, tl, arcs = saved[0], saved[6], saved[8]
    if arcs.dim() == 1:
        raise RuntimeError(f"lightning_gtn::{ctx.op}: a backward through a call with need_grad=False")
    B = enc.shape[0]
    if ctx.reduction == "none":
        coef = g_out.reshape(B).to(enc.dtype)
    else:
        coef = _coefficients(ctx.reduction, B, tl, enc.dtype, enc.device) * g_out.to(enc.dtype)
    flags = (bool(need.encoder), bool(need.predictor), bool(need.weight), bool(need.bias))
    ge, gp, gw, gb = back_op(*back_schema(*saved, coef, *ctx.extra, *flags, *getattr(ctx, "tail", ())))
    return grads(
        schema,
        encoder=ge if need.encoder else None,
        predictor=gp if need.predictor else None,
        weight=gw if need.weight else None,
        bias=gb if need.bias else None,
    )


def _setup(ctx, inputs, output):
    a = RNNTJoinerArgs(*inputs)
    ctx.reduction, ctx.extra, ctx.op = a.reduction, (a.blank, a.clamp, a.impl), "rnnt_joiner_loss"
    _save(ctx, a, output)


def _backward(ctx, g_out, _g_lse, _g_arcs):
    need = RNNTJoinerArgs(*ctx.needs_input_grad)
    return _joiner_backward(ctx, g_out, need, RNNTJoinerArgs, RNNTJoinerBackwardArgs, rnnt_joiner_loss_backward_op)


rnnt_joiner_loss_op.register_autograd(_backward, setup_context=_setup)


def _check_tensor(x, name: str, ndim: int, shape: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a tensor of shape {shape}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating point tensor of shape {shape}, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    return x


class RNNTJoinerCriterion(Criterion):
    """The joiner RNN-T loss through :func:`lightning_gtn.core.criterion.apply_loss`: its input is
    the tuple ``(encoder, predictor, weight, bias)``, its own op ``lightning_gtn::rnnt_joiner_loss``."""

    kind = "rnnt_joiner"
    name = "rnnt_joiner_loss"
    backends = JOINER_BACKENDS.offered
    picker = JOINER_BACKENDS

    def check_emissions(self, emissions, name: str) -> Tuple[int, ...]:
        """``(B, T, U + 1, J, V)`` of ``(encoder, predictor, weight, bias)``: float tensors of one
        dtype and device, ``U + 1 >= 1``, ``J >= 1``, ``V >= 1``; ValueError naming the tensor."""
        if not isinstance(emissions, tuple) or len(emissions) != 4:
            raise ValueError(f"rnnt_joiner_loss takes {_SHAPES}")
        enc = _check_tensor(emissions[0], "encoder", 3, "(B, T, J)")
        pred = _check_tensor(emissions[1], "predictor", 3, "(B, U + 1, J)")
        w = _check_tensor(emissions[2], "weight", 2, "(V, J)")
        bias = _check_tensor(emissions[3], "bias", 1, "(V,)")
        B, T, J = enc.shape
        U1 = pred.shape[1]
        V = w.shape[0]
        if pred.shape[0] != B or pred.shape[2] != J or U1 < 1:
            raise ValueError(
                f"predictor must have shape (B, U + 1, J) with B={B}, J={J} (encoder of shape (B, T, J)) and "
                f"U + 1 >= 1, got {tuple(pred.shape)}"
            )
        if w.shape[1] != J or V < 1 or J < 1:
            raise ValueError(f"weight must have shape (V, J) with J={J} (encoder's) and V >= 1, got {tuple(w.shape)}")
        if bias.shape[0] != V:
            raise ValueError(f"bias must have shape (V,) with V={V} (weight of shape (V, J)), got {tuple(bias.shape)}")
        for n, x in (("predictor", pred), ("weight", w), ("bias", bias)):
            if x.dtype != enc.dtype:
                raise ValueError(f"{n} must have the encoder's dtype {enc.dtype}, got {x.dtype}")
            if x.device != enc.device:
                raise ValueError(f"{n} must be on the encoder's device {enc.device}, got {x.device}")
        _check_sizes(B, T, U1)
        return B, T, U1, J, V

    def check_options(self, C: int, blank, weights, device: torch.device):
        """The blank as a class id in ``[0, V)`` (negative values count from the end)."""
        return checks.check_class_id(blank, "blank", C, "V", "weight of shape (V, J)"), weights

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """``clamp`` (a real number) and ``fastemit_lambda`` (finite, ``>= 0``)."""
        unknown = set(options) - {"clamp", "fastemit_lambda"}
        if unknown:
            raise TypeError(f"{self.name}: unexpected options {sorted(unknown)}")
        clamp = checks.check_real(options.get("clamp", -1.0), "clamp")
        lam = checks.check_real(options.get("fastemit_lambda", 0.0), "fastemit_lambda")
        if lam < 0:
            raise ValueError(f"fastemit_lambda must be >= 0, got {lam}")
        return {"clamp": clamp, "fastemit_lambda": lam}

    def own_kernel(self, device: torch.device, impl: Optional[str]) -> Optional[str]:
        """Always its own op; ``impl=None`` (passed on as ``""``) is resolved there by
        :data:`JOINER_BACKENDS`: ``"torch"`` on the CPU, ``"triton"`` on a CUDA device where the
        kernels pass their self-check."""
        return impl or ""

    def index_tensors(self, targets, input_lengths, target_lengths, B: int, device: torch.device):
        """Padded ``(B, S)`` targets and ``(B,)`` lengths as int64 tensors (torchaudio's forms)."""
        tg = checks.check_index_tensor(targets, "targets", (B, None), "(B, U)", device)
        il = checks.check_index_tensor(input_lengths, "logit_lengths", (B,), "(B,)", device)
        tl = checks.check_index_tensor(target_lengths, "target_lengths", (B,), "(B,)", device)
        return tg, il, tl

    def call_kernel(
        self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e, options
    ):
        """``lightning_gtn::rnnt_joiner_loss`` on the four tensors ``x`` in their compute dtype."""
        enc, pred, w, bias = x
        args = RNNTJoinerArgs(
            encoder=enc,
            predictor=pred,
            weight=w,
            bias=bias,
            targets=targets,
            logit_lengths=input_lengths,
            target_lengths=target_lengths,
            blank=int(blank),
            clamp=float(options["clamp"]),
            reduction=reduction,
            zero_infinity=bool(zero_infinity),
            fastemit_lambda=float(options["fastemit_lambda"]),
            impl=impl,
            need_grad=bool(need_e),
        )
        return rnnt_joiner_loss_op(*args)[0]


RNNT_JOINER = RNNTJoinerCriterion()


def rnnt_joiner_loss(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets,
    logit_lengths,
    target_lengths,
    *,
    blank: int = -1,
    clamp: float = -1.0,
    reduction: str = "mean",
    fastemit_lambda: float = 0.0,
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> Tensor:
    """The RNN-T loss of the joiner ``Linear(tanh(enc + pred))``, never holding its output.

    Exactly ``rnnt_loss(tanh(encoder[:, :, None] + predictor[:, None]) @ weight.T + bias, targets,
    logit_lengths, target_lengths, blank=blank, clamp=clamp, reduction=reduction,
    fastemit_lambda=fastemit_lambda, zero_infinity=zero_infinity)`` (the fused log-softmax), values
    and gradients of all four tensors, computed by chunks of nodes of at most
    :data:`JOINER_CHUNK_BYTES` work space: neither the ``(B, T, U + 1, V)`` logits nor the
    ``(B, T, U + 1, J)`` hidden are ever held. A ``torch.library`` custom op: works under
    ``torch.compile(fullgraph=True)``.

    Args:
        encoder: ``(B, T, J)`` encoder frames projected to the joiner's dimension.
        predictor: ``(B, U + 1, J)`` prediction-network outputs (the blank-started targets).
        weight: ``(V, J)`` the output layer's weight; ``bias``: ``(V,)`` its bias. The four share
            one float dtype and device (float16/bfloat16 are computed in float32; float64 exact).
        targets: ``(B, S)`` int32/int64 padded label ids, ``S >= max(target_lengths)``; ids in
            ``[0, V)`` and never the blank.
        logit_lengths: ``(B,)`` frames of each example, ``0 <= logit_lengths <= T``.
        target_lengths: ``(B,)`` labels of each example, ``0 <= target_lengths <= U``.
        blank: the blank's class id in ``[-V, V)`` (``-1`` is ``V - 1``, torchaudio's default).
        clamp: ``> 0`` clips each example's gradient w.r.t. its logits to ``[-clamp, clamp]``
            (before the reduction's scaling), as :func:`~lightning_gtn.functional.rnnt_loss`.
        reduction: ``"none"`` (the ``(B,)`` costs), ``"sum"``, ``"mean"`` (over the batch, not
            divided by target lengths).
        fastemit_lambda: FastEmit's weight (``>= 0``): emit arcs' gradient scaled by
            ``1 + fastemit_lambda``, the reported cost too.
        zero_infinity: infeasible examples cost 0 instead of ``inf`` (their gradient is 0).
        impl: None (the device's default: ``"torch"`` on the CPU, ``"triton"`` on a CUDA device
            where its kernels pass their self-check, else ``"torch"``), ``"torch"`` (chunked torch
            matmuls, any device) or ``"triton"`` (the Triton kernels of
            :mod:`lightning_gtn.kernels.rnnt_joiner_triton`: CUDA tensors, or CPU tensors under
            ``TRITON_INTERPRET=1``).

    Returns:
        A scalar (``(B,)`` for ``reduction="none"``) in the inputs' dtype and device.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import rnnt_joiner_loss
        >>> enc = torch.randn(2, 6, 8, requires_grad=True)  # (B, T, J)
        >>> pred = torch.randn(2, 4, 8, requires_grad=True)  # (B, U + 1, J)
        >>> w, b = torch.randn(5, 8, requires_grad=True), torch.zeros(5, requires_grad=True)
        >>> targets = torch.tensor([[1, 2, 3], [3, 1, 0]])
        >>> loss = rnnt_joiner_loss(enc, pred, w, b, targets, torch.tensor([6, 5]), torch.tensor([3, 2]), blank=0)
        >>> loss.backward()
    """
    return apply_loss(
        RNNT_JOINER,
        (encoder, predictor, weight, bias),
        targets,
        logit_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="encoder",
        clamp=clamp,
        fastemit_lambda=fastemit_lambda,
    )


# -- the duration lattices: TDT and multi-blank RNN-T -----------------------------------------------
#
# Each node's arcs read a few log-probabilities of its logits: the next target's and a few fixed
# label classes' (the blank, the big blanks), normalised over the label group ``[0, K)``, and, for
# TDT, the ``D`` duration logits normalised over ``[K, V)``. Those ``1 + F + D`` log-probabilities a
# node (``F`` fixed classes) are the columns of a small ``(B, T, U + 1, 1 + F + D)`` tensor the
# duration lattice scores in its unfused mode (:func:`.rnnt_variants.duration_lattice_op` with
# ``normalise=False``), which gives ``d cost / d`` each column exactly. The backward turns those
# into the logits' gradient chunk by chunk: with ``p`` the negated column gradients,
# ``dz[:K] = (sum p_label) softmax(z[:K]) - p_target [v = y_u] - sum_f p_f [v = c_f]`` and
# ``dz[K:] = (sum p_duration) softmax(z[K:]) - p_duration``.


class DurationJoinerArgs(NamedTuple):
    """The arguments of ``lightning_gtn::duration_joiner_loss``."""

    encoder: Tensor
    predictor: Tensor
    weight: Tensor
    bias: Tensor
    targets: Tensor
    logit_lengths: Tensor
    target_lengths: Tensor
    K: int
    D: int
    fixed: List[int]
    tok_dur: List[int]
    tok_didx: List[int]
    blank_cols: List[int]
    blank_dur: List[int]
    blank_didx: List[int]
    sigma: float
    omega: float
    reduction: str
    zero_infinity: bool
    impl: str
    need_grad: bool


class DurationJoinerBackwardArgs(NamedTuple):
    """The arguments of ``lightning_gtn::duration_joiner_loss_backward``."""

    encoder: Tensor
    predictor: Tensor
    weight: Tensor
    bias: Tensor
    targets: Tensor
    logit_lengths: Tensor
    target_lengths: Tensor
    lse: Tensor
    arcs: Tensor
    coef: Tensor
    K: int
    fixed: List[int]
    need_encoder: bool
    need_predictor: bool
    need_weight: bool
    need_bias: bool
    impl: str = ""


def _duration_triton(device: torch.device, impl: str) -> bool:
    """Whether a duration joiner call with the lattice's ``impl`` computes its joiner by the
    Triton kernels: ``impl="triton"``, or None (``""``) where :data:`JOINER_BACKENDS` picks them
    for ``device``; the chunked torch joiner otherwise."""
    return impl == "triton" or (not impl and JOINER_BACKENDS.default(device) == "triton")


def _lse_narrow(x: Tensor) -> Tensor:
    """``logsumexp(x, 1)`` of a few strided columns (``torch.logsumexp`` on such a view is many times
    slower on the CPU); finite rows only (a NaN stays NaN)."""
    m = x.amax(1, keepdim=True)
    return (x - m).exp_().sum(1).log_().add_(m[:, 0])


def _duration_forward(a: DurationJoinerArgs) -> Tuple[Tensor, Tensor, Tensor]:
    enc, pred, weight, bias = a.encoder, a.predictor, a.weight, a.bias
    B, T, J = enc.shape
    U1 = pred.shape[1]
    V = weight.shape[0]
    K, D, fixed = a.K, a.D, list(a.fixed)
    F = len(fixed)
    _check_sizes(B, T, U1)
    tg, il, tl = _check_values(a.targets, a.logit_lengths, a.target_lengths, T, U1 - 1, K, fixed, "K")
    dev, dt = enc.device, enc.dtype
    # the lattice on the CPU is numba's (float64 costs whatever the input); elsewhere in the compute dtype
    sdt = torch.float64 if lattice_on_numba(dev) else dt
    G = 2 if D > 0 else 1
    small = torch.zeros((B, T, U1, 1 + F + D), dtype=sdt, device=dev)
    lse = torch.zeros((B, T, U1, G), dtype=dt, device=dev) if a.need_grad else None
    cols = torch.tensor(fixed, dtype=torch.int64, device=dev)
    triton = _duration_triton(dev, a.impl)
    if triton:
        rnnt_joiner_triton.duration_rows(enc, pred, weight, bias, *a[4:7], K, fixed, small, lse)
    examples = () if triton else _examples(enc, weight, tg, il, tl, fixed[0])
    with torch.no_grad():
        for b, nodes in examples:
            Tb, U1b = nodes.T, nodes.U1
            sb = torch.empty(nodes.n, 1 + F + D, dtype=sdt, device=dev)
            lb = torch.empty(nodes.n, G, dtype=dt, device=dev)
            for n0, n1, _, z in nodes.logits(enc[b], pred[b], weight, bias):
                zl = z if K == V else z[:, :K]
                dl = torch.logsumexp(zl, dim=1)
                lb[n0:n1, 0] = dl
                sb[n0:n1, 0] = z.gather(1, nodes.labels(n0, n1))[:, 0] - dl
                sb[n0:n1, 1 : 1 + F] = z.index_select(1, cols) - dl[:, None]
                if D > 0:
                    dd = _lse_narrow(z[:, K:])
                    lb[n0:n1, 1] = dd
                    sb[n0:n1, 1 + F :] = z[:, K:] - dd[:, None]
            small[b, :Tb, :U1b] = sb.view(Tb, U1b, -1)
            if lse is not None:
                lse[b, :Tb, :U1b] = lb.view(Tb, U1b, G)
    losses, g = duration_lattice_op(
        *DurationLatticeArgs(
            logits=small,
            targets=torch.zeros((B, U1 - 1), dtype=torch.int64, device=dev),  # column 0: the target's
            logit_lengths=a.logit_lengths,
            target_lengths=a.target_lengths,
            K=1 + F,
            D=D,
            tok_dur=list(a.tok_dur),
            tok_didx=list(a.tok_didx),
            blank_ids=list(a.blank_cols),
            blank_dur=list(a.blank_dur),
            blank_didx=list(a.blank_didx),
            sigma=a.sigma,
            omega=a.omega,
            normalise=False,
            reduction="none",
            zero_infinity=False,
            impl=a.impl,
            need_grad=a.need_grad,
        )
    )
    costs = losses.to(torch.float64)
    if a.zero_infinity:
        costs = torch.where(costs == math.inf, torch.zeros_like(costs), costs)
    if a.reduction == "none":
        out = costs
    else:
        out = (costs * _coefficients(a.reduction, B, a.target_lengths, torch.float64, costs.device)).sum()
    out = out.to(device=dev, dtype=dt)
    if not a.need_grad or lse is None:
        return out, enc.new_empty(0), enc.new_empty(0)
    return out, lse, g.neg_().to(dt)


@torch.library.custom_op("lightning_gtn::duration_joiner_loss", mutates_args=())
@op_schema(DurationJoinerArgs)
def duration_joiner_loss_op(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    K: int,
    D: int,
    fixed: List[int],
    tok_dur: List[int],
    tok_didx: List[int],
    blank_cols: List[int],
    blank_dur: List[int],
    blank_didx: List[int],
    sigma: float,
    omega: float,
    reduction: str,
    zero_infinity: bool,
    impl: str,
    need_grad: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse (B, T, U + 1, G), arcs (B, T, U + 1, 1 + F + D))`` of the duration lattice on the
    joiner ``Linear(tanh(enc + pred))``: label classes ``[0, K)``, duration classes ``[K, K + D)``
    (``K + D = V``); the nodes' small log-probability tensor has the columns ``[target, fixed...,
    durations...]``, which the arcs (:func:`.rnnt_variants.duration_lattice_op`'s, their blank
    ids ``blank_cols`` being columns) read. ``lse`` holds the label and (``D > 0``) duration
    normalisers, ``arcs`` the negated column gradients; both empty without ``need_grad``."""
    return _duration_forward(
        DurationJoinerArgs(
            encoder,
            predictor,
            weight,
            bias,
            targets,
            logit_lengths,
            target_lengths,
            K,
            D,
            fixed,
            tok_dur,
            tok_didx,
            blank_cols,
            blank_dur,
            blank_didx,
            sigma,
            omega,
            reduction,
            zero_infinity,
            impl,
            need_grad,
        )
    )


@duration_joiner_loss_op.register_fake
def _duration_fake(*inputs):
    a = DurationJoinerArgs(*inputs)
    enc = a.encoder
    B, T = enc.shape[0], enc.shape[1]
    U1 = a.predictor.shape[1]
    out = enc.new_empty((B,) if a.reduction == "none" else ())
    if not a.need_grad:
        return out, enc.new_empty(0), enc.new_empty(0)
    G = 2 if a.D > 0 else 1
    return out, enc.new_empty((B, T, U1, G)), enc.new_empty((B, T, U1, 1 + len(a.fixed) + a.D))


@torch.library.custom_op("lightning_gtn::duration_joiner_loss_backward", mutates_args=())
@op_schema(DurationJoinerBackwardArgs)
def duration_joiner_loss_backward_op(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    lse: Tensor,
    arcs: Tensor,
    coef: Tensor,
    K: int,
    fixed: List[int],
    need_encoder: bool,
    need_predictor: bool,
    need_weight: bool,
    need_bias: bool,
    impl: str = "",
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``sum_b coef[b] * d cost[b] / d (encoder, predictor, weight, bias)`` from the forward's
    normalisers and column gradients (the joiner by :func:`_duration_triton`'s choice for the
    forward's ``impl``); the gradients not asked for are empty tensors."""
    a = DurationJoinerBackwardArgs(
        encoder,
        predictor,
        weight,
        bias,
        targets,
        logit_lengths,
        target_lengths,
        lse,
        arcs,
        coef,
        K,
        fixed,
        need_encoder,
        need_predictor,
        need_weight,
        need_bias,
        impl,
    )
    if _duration_triton(encoder.device, impl):
        need = (need_encoder, need_predictor, need_weight, need_bias)
        got = rnnt_joiner_triton.duration_grads(*a[:10], K, fixed, need)
        return tuple(encoder.new_empty(0) if g is None else g for g in got)  # type: ignore[return-value]
    F = len(fixed)
    D = weight.shape[0] - K
    cols = torch.tensor(fixed, dtype=torch.int64, device=encoder.device)

    def example(b: int, nodes: _Nodes, cb: float):
        ls = lse[b, : nodes.T, : nodes.U1].reshape(nodes.n, -1)
        pa = arcs[b, : nodes.T, : nodes.U1].reshape(nodes.n, -1)
        fold = cb > 0.0  # the coefficient goes into the columns' weights (their logs need them > 0)
        if fold:
            pa = pa * cb

        def dz_of(z: Tensor, n0: int, n1: int) -> Tensor:
            p = pa[n0:n1]
            pl = p[:, : 1 + F]
            zl = z if D == 0 else z[:, :K]
            # (sum p) softmax(z) = exp(z - (lse - log(sum p))), in place, each group
            zl.sub_((ls[n0:n1, 0] - torch.log(pl.sum(1)))[:, None]).exp_()
            zl.index_add_(1, cols, -pl[:, 1:])
            zl.scatter_add_(1, nodes.labels(n0, n1), -pl[:, :1])
            if D > 0:
                pd = p[:, 1 + F :]
                zd = z[:, K:]
                zd.sub_((ls[n0:n1, 1] - torch.log(pd.sum(1)))[:, None]).exp_().sub_(pd)
            if not fold:
                z.mul_(cb)
            return z

        return dz_of

    return _backward_grads(a, fixed[0], example)


@duration_joiner_loss_backward_op.register_fake
def _duration_backward_fake(*inputs):
    return _grads_fake(DurationJoinerBackwardArgs(*inputs))


def _duration_setup(ctx, inputs, output):
    a = DurationJoinerArgs(*inputs)
    ctx.reduction, ctx.extra, ctx.op = a.reduction, (a.K, list(a.fixed)), "duration_joiner_loss"
    ctx.tail = (a.impl,)  # the backward's arguments after the need_* flags
    _save(ctx, a, output)


def _duration_backward(ctx, g_out, _g_lse, _g_arcs):
    need = DurationJoinerArgs(*ctx.needs_input_grad)
    return _joiner_backward(
        ctx, g_out, need, DurationJoinerArgs, DurationJoinerBackwardArgs, duration_joiner_loss_backward_op
    )


duration_joiner_loss_op.register_autograd(_duration_backward, setup_context=_duration_setup)


class DurationJoinerCriterion(RNNTJoinerCriterion):
    """A duration lattice on the joiner ``Linear(tanh(enc + pred))`` through
    :func:`~lightning_gtn.core.criterion.apply_loss`: the joiner's tensors and chunks as
    :class:`RNNTJoinerCriterion`, the blank, the lattice's options and its arcs as the
    materialised loss's criterion ``lattice`` (its reductions and backends too), its own op
    ``lightning_gtn::duration_joiner_loss``."""

    reductions = DURATION_REDUCTIONS
    backends = DURATION_IMPLS
    picker = DURATION_BACKENDS
    lattice: DurationLatticeCriterion

    def check_options(self, C: int, blank, weights, device: torch.device):
        """The blank as the materialised loss checks it."""
        return self.lattice.check_options(C, blank, weights, device)

    def check_call_options(self, shape: Tuple[int, ...], options: Dict[str, object]) -> Dict[str, object]:
        """The lattice's options (:meth:`DurationLatticeCriterion.lattice_options`); TypeError for any other."""
        rest = dict(options)
        out = self.lattice.lattice_options(shape, rest)
        if rest:
            raise TypeError(f"{self.name}: unexpected options {sorted(rest)}")
        return out

    def own_kernel(self, device: torch.device, impl: Optional[str]) -> Optional[str]:
        """Always its own op; ``impl`` picks the lattice's kernel (None: the device's default)."""
        return impl or ""

    def call_kernel(
        self, x, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, impl, need_e, options
    ):
        """``lightning_gtn::duration_joiner_loss`` on the arcs of the lattice's criterion, their
        blank classes turned into columns of the small tensor."""
        enc, pred, w, bias = x
        K, D, arcs, sigma, omega = self.lattice.arcs(w.shape[0], blank, options)
        tok_dur, tok_didx, blank_ids, blank_dur, blank_didx = (list(a) for a in arcs)
        fixed = list(dict.fromkeys(int(c) for c in blank_ids))
        args = DurationJoinerArgs(
            encoder=enc,
            predictor=pred,
            weight=w,
            bias=bias,
            targets=targets,
            logit_lengths=input_lengths,
            target_lengths=target_lengths,
            K=int(K),
            D=int(D),
            fixed=fixed,
            tok_dur=[int(d) for d in tok_dur],
            tok_didx=[int(i) for i in tok_didx],
            blank_cols=[1 + fixed.index(int(c)) for c in blank_ids],
            blank_dur=[int(d) for d in blank_dur],
            blank_didx=[int(i) for i in blank_didx],
            sigma=float(sigma),
            omega=float(omega),
            reduction=reduction,
            zero_infinity=bool(zero_infinity),
            impl=impl,
            need_grad=bool(need_e),
        )
        return duration_joiner_loss_op(*args)[0]


class TDTJoinerCriterion(DurationJoinerCriterion):
    """:func:`tdt_joiner_loss`: :data:`~.rnnt_variants.TDT`'s blank, options and arcs."""

    kind = "tdt_joiner"
    name = "tdt_joiner_loss"
    lattice = TDT


class MultiblankJoinerCriterion(DurationJoinerCriterion):
    """:func:`multiblank_rnnt_joiner_loss`: :data:`~.rnnt_variants.MULTIBLANK`'s blank, options and arcs."""

    kind = "multiblank_rnnt_joiner"
    name = "multiblank_rnnt_joiner_loss"
    lattice = MULTIBLANK


TDT_JOINER = TDTJoinerCriterion()
MULTIBLANK_JOINER = MultiblankJoinerCriterion()


def tdt_joiner_loss(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets,
    logit_lengths,
    target_lengths,
    *,
    blank: int = -1,
    durations: Sequence[int] = (0, 1, 2, 3, 4),
    sigma: float = 0.0,
    omega: float = 0.0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> Tensor:
    """The TDT loss of the joiner ``Linear(tanh(enc + pred))``, never holding its output.

    Exactly ``tdt_loss(tanh(encoder[:, :, None] + predictor[:, None]) @ weight.T + bias, targets,
    logit_lengths, target_lengths, blank=blank, durations=durations, sigma=sigma, omega=omega,
    reduction=reduction, zero_infinity=zero_infinity)``: the last ``len(durations)`` rows of
    ``weight`` (and entries of ``bias``) give the duration logits, the first ``K = V -
    len(durations)`` the label logits, each group log-softmaxed on its own. Values and gradients
    of all four tensors, by chunks of nodes of at most :data:`JOINER_CHUNK_BYTES` work space; the
    lattice scores a ``(B, T, U + 1, 2 + len(durations))`` tensor of each node's target, blank
    and duration log-probabilities. A ``torch.library`` custom op.

    Args:
        encoder, predictor, weight, bias: as :func:`rnnt_joiner_loss` (``V = K + len(durations)``).
        targets: ``(B, S)`` padded label ids in ``[0, K)``, never the blank.
        logit_lengths, target_lengths: ``(B,)`` frames and labels of each example.
        blank, durations, sigma, omega, reduction, zero_infinity, impl: as
            :func:`~lightning_gtn.functional.tdt_loss` (``"mean_volume"`` too); ``impl`` picks the
            lattice's kernel, and the joiner runs in the Triton kernels of
            :mod:`lightning_gtn.kernels.rnnt_joiner_triton` for ``impl="triton"`` and for None
            on a CUDA device where they pass their self-check, else as chunked torch matmuls.

    Returns:
        A scalar (``(B,)`` for ``reduction="none"``) in the inputs' dtype and device.
    """
    return apply_loss(
        TDT_JOINER,
        (encoder, predictor, weight, bias),
        targets,
        logit_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="encoder",
        durations=durations,
        sigma=sigma,
        omega=omega,
    )


def multiblank_rnnt_joiner_loss(
    encoder: Tensor,
    predictor: Tensor,
    weight: Tensor,
    bias: Tensor,
    targets,
    logit_lengths,
    target_lengths,
    *,
    blank: int = -1,
    big_blank_durations: Sequence[int] = (),
    sigma: float = 0.0,
    big_blank_ids: Optional[Sequence[int]] = None,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> Tensor:
    """The multi-blank RNN-T loss of the joiner ``Linear(tanh(enc + pred))``, never holding its output.

    Exactly ``multiblank_rnnt_loss(tanh(encoder[:, :, None] + predictor[:, None]) @ weight.T + bias,
    targets, logit_lengths, target_lengths, blank=blank, big_blank_durations=big_blank_durations,
    sigma=sigma, big_blank_ids=big_blank_ids, reduction=reduction, zero_infinity=zero_infinity)``:
    one log-softmax over all ``V`` classes, the big blank of ``big_blank_durations[i]`` the class
    ``blank - 1 - i`` unless ``big_blank_ids``. Values and gradients of all four tensors, by
    chunks of nodes of at most :data:`JOINER_CHUNK_BYTES` work space; the lattice scores a
    ``(B, T, U + 1, 2 + len(big_blank_durations))`` tensor of each node's target, blank and big
    blank log-probabilities. A ``torch.library`` custom op.

    Args:
        encoder, predictor, weight, bias: as :func:`rnnt_joiner_loss`.
        targets: ``(B, S)`` padded label ids in ``[0, V)``, never a blank class.
        logit_lengths, target_lengths: ``(B,)`` frames and labels of each example.
        blank, big_blank_durations, sigma, big_blank_ids, reduction, zero_infinity, impl: as
            :func:`~lightning_gtn.functional.multiblank_rnnt_loss` (``"mean_volume"`` too); ``impl`` picks the
            lattice's kernel, and the joiner runs in the Triton kernels of
            :mod:`lightning_gtn.kernels.rnnt_joiner_triton` for ``impl="triton"`` and for None
            on a CUDA device where they pass their self-check, else as chunked torch matmuls.

    Returns:
        A scalar (``(B,)`` for ``reduction="none"``) in the inputs' dtype and device.
    """
    return apply_loss(
        MULTIBLANK_JOINER,
        (encoder, predictor, weight, bias),
        targets,
        logit_lengths,
        target_lengths,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
        name="encoder",
        big_blank_durations=big_blank_durations,
        sigma=sigma,
        big_blank_ids=big_blank_ids,
    )
