"""Star Temporal Classification (STC): CTC for partially labelled targets, batch first.

STC (Pratap et al., "Star Temporal Classification: sequence modelling with partially labeled
data", the differentiable-WFST work of facebookresearch/gtn_applications) lets a transcript
miss tokens: between and around the target tokens a *star* token may stand for any run of
untranscribed labels. The construction follows the research code's ``STC`` criterion:

* The emissions get ``C`` extra columns, computed with torch ops before the loss op (so they
  are differentiable and compile like any other ops): the *star* score
  ``logsumexp`` of the non-blank labels, and for each non-blank token ``t`` the *star except
  t* score ``log(exp(star) - exp(x_t))``, computed as ``star + log1p(1e-7 - exp(x_t - star))``
  exactly as the research code does (the ``1e-7`` keeps a token holding all the mass finite).
  Column ``C + blank`` is the star, column ``C + t`` (``t != blank``) is star-except-t; with
  ``blank = 0`` this is the research code's layout ``(tokens, <star>, <star>\\tokens)``.
* The criterion graph of a target ``y_0 .. y_{L-1}`` is CTC's graph *without* self-loops on the
  token nodes (each token reads one frame; blanks loop), accepting at its last blank and
  last token, plus one star node ``s_l`` per gap ``l = 0 .. L``: it is entered from the blank
  before token ``l`` and from token ``l - 1``, loops, returns to that blank by reading a
  blank, and leaves to token ``l`` by reading ``y_l``; every arc *into or around* ``s_l``
  that reads a star label reads star-except-``y_l`` (the plain star for the last gap, whose
  star node also accepts) and carries the token insertion penalty ``log p``.
* The loss of an example is ``-log`` of the total score of its STC graph against the
  augmented emissions; the research code subtracts no denominator (the emissions are
  expected to be ``log_softmax`` outputs, which makes the star a log-probability too).

The penalty ``p`` changes at every training step (:class:`lightning_gtn.nn.STCLoss` follows
a schedule), so it is not baked into the cached graphs: every arc that reads a star column
carries exactly ``log p`` and no other arc carries a weight, so adding ``log p`` to the star
columns of the augmented emissions gives the same path scores. The graphs are then cached per
``(target, blank, C)`` with zero weights, a change of ``p`` compiles nothing, and ``p`` may be a
0-dim tensor (a module buffer), so ``torch.compile`` does not recompile when it changes.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .. import wfst as _wfst
from ..core import checks, criterion
from ..core.criterion_graphs import cached, target_key
from ..core.scoring import Plan, unique_graphs
from ..kernels import stc_chain
from ..kernels.compiled_graphs import compile_graph

__all__ = ["stc_loss", "stc_graph", "stc_emissions"]

#: added inside ``log1p`` of the star-except-token score, as the research code does
STC_EPS = 1e-7


def stc_graph(target: Sequence[int], blank: int, num_classes: int, log_p: float = 0.0, gtn=None):
    """The STC criterion graph of ``target`` over the augmented labels ``[0, 2 * num_classes)``.

    Nodes ``0 .. 2L`` are CTC's (even: blanks, odd: tokens; blanks loop, tokens do not), node
    ``2L + 1 + l`` is the star node of gap ``l``. Accepting: the last blank, the last token and
    the last star node. Star arcs read column ``num_classes + y_l`` (star except ``y_l``), or
    ``num_classes + blank`` (the star) in the last gap, with weight ``log_p``.

    Args:
        target: the token ids (never ``blank``).
        blank: the blank's id in ``[0, num_classes)``.
        num_classes: ``C``, the emissions' width before augmentation.
        log_p: weight of the star arcs (the losses keep it 0 and add ``log p`` to the
            emissions instead).
        gtn: the graph module to build with (default :mod:`lightning_gtn.wfst`).
    """
    gtn = _wfst if gtn is None else gtn
    y = [int(t) for t in target]
    L, C = len(y), int(num_classes)
    S = 2 * L + 1
    g = gtn.Graph(False)
    for n in range(S):
        g.add_node(n == 0, n >= S - 2)
    for n in range(S):
        if n % 2 == 0:  # blank node
            g.add_arc(n, n, blank)
            if n > 0:
                g.add_arc(n - 1, n, blank)
        else:  # token node n reads y[(n - 1) // 2] on entry only
            lab = y[(n - 1) // 2]
            g.add_arc(n - 1, n, lab)
            if n > 1:
                g.add_arc(n - 2, n, lab)
    for l in range(L + 1):
        star = C + (blank if l == L else y[l])
        s = g.add_node(False, l == L)
        if l > 0:
            g.add_arc(2 * l - 1, s, star, star, log_p)
        g.add_arc(2 * l, s, star, star, log_p)
        g.add_arc(s, s, star, star, log_p)
        if l < L:
            g.add_arc(s, 2 * l + 1, y[l])
        g.add_arc(s, 2 * l, blank)
    return g


def compiled_stc(target: Sequence[int], blank: int, num_classes: int):
    key = (target_key(target), int(blank), int(num_classes))
    return cached("stc", key, lambda: compile_graph(stc_graph(key[0], key[1], key[2])))


def stc_emissions(emissions: torch.Tensor, blank: int, log_p: Union[float, torch.Tensor] = 0.0) -> torch.Tensor:
    """The augmented emissions ``(B, T, 2C)``: the ``C`` inputs, then the star columns.

    Column ``C + blank`` is ``star = logsumexp`` of the non-blank labels, column ``C + t``
    (``t != blank``) is ``star + log1p(1e-7 - exp(x_t - star))``; ``log_p`` (a float or a 0-dim
    tensor) is added to all star columns. Differentiable torch ops.
    """
    C = emissions.shape[-1]
    tokens = torch.cat([emissions[..., :blank], emissions[..., blank + 1 :]], dim=-1)  # (B, T, C - 1)
    # A frame whose tokens are all -inf (log 0) has star = -inf and star - star = NaN: such
    # frames are computed on zeros and masked to -inf, so neither values nor gradients see a NaN.
    dead = (tokens == float("-inf")).all(dim=-1, keepdim=True)
    safe = torch.where(dead, torch.zeros_like(tokens), tokens)
    star = torch.logsumexp(safe, dim=-1, keepdim=True)
    not_tok = star + torch.log1p(STC_EPS - torch.exp(safe - star))
    star = star.masked_fill(dead, float("-inf"))
    not_tok = not_tok.masked_fill(dead, float("-inf"))
    cols = torch.cat([not_tok[..., :blank], star, not_tok[..., blank:]], dim=-1)
    if isinstance(log_p, torch.Tensor):
        cols = cols + log_p.to(dtype=cols.dtype, device=cols.device)
    elif log_p != 0.0:
        cols = cols + log_p
    assert cols.shape[-1] == C
    return torch.cat([emissions, cols], dim=-1)


class _STC(criterion.Criterion):
    """One STC graph per distinct target, scored against the augmented ``(B, T, 2C)``
    emissions; the loss of a row is ``-log Z`` of its graph.

    :func:`stc_loss` names this criterion: it checks ``C >= 2`` and ``blank`` and hands the op
    either the chains on the CPU (:class:`_STCChain`, ``log p`` as the weight) or the
    augmented emissions (:meth:`prepare`). ``weights`` is ``p``, checked and turned into
    ``log p`` (a float or a 0-dim tensor).
    """

    kind = "stc"
    name = "stc_loss"

    def check_options(self, C, blank, weights, device):
        if C < 2:
            raise ValueError(f"emissions must have C >= 2 classes (a blank and a token), got C={C}")
        return checks.check_label(blank, "blank", C), _check_p(weights)

    def prepare(self, x, weights, blank, impl):
        log_p = weights
        if x.device.type == "cpu" and impl in (None, "numba"):  # the chains, star columns inside
            lp = log_p.reshape(1) if isinstance(log_p, torch.Tensor) else torch.tensor([log_p], dtype=torch.float64)
            return criterion.CRITERIA["stc_chain"], x, lp.to(x.dtype)
        return self, stc_emissions(x, blank, log_p), None

    def forbidden_label(self, blank: int) -> Optional[int]:
        return blank

    def target_classes(self, C: int) -> int:
        return C // 2  # the op sees the augmented width

    def plan(self, seqs, lengths, C, blank):
        C0 = C // 2  # the op sees the augmented width
        for s in seqs:
            if s and max(s) >= C0:
                raise ValueError(f"targets: labels must lie in [0, {C0}) (C of the emissions), got {max(s)}")
        graphs, ids = unique_graphs([compiled_stc(t, blank, C0) for t in seqs])
        B = len(seqs)
        return Plan(graphs, ids, np.arange(B), lengths, -np.ones(B), B), None


criterion.CRITERIA["stc"] = _STC()


def _star_grad(x: torch.Tensor, g_aug: torch.Tensor, blank: int):
    """``(d / d x (B, T, C), d / d log_p (B,))`` of a function of :func:`stc_emissions` ``(x)``
    given its gradient ``g_aug`` with respect to the augmented emissions: for the tokens
    ``j != blank``, ``g_j + p_j (g_star + sum_k g_k' (1 + r_k)) - g_j' r_j`` with ``p`` the
    softmax of the tokens, ``r = p / (1 + eps - p)``, ``g_k'`` the gradient of column ``C + k``;
    the blank gets its own column's gradient, ``log_p`` the sum over the star columns."""
    C = x.shape[-1]
    g_in, g_cols = g_aug[..., :C], g_aug[..., C:]
    tok = torch.ones(C, dtype=torch.bool, device=x.device)
    tok[blank] = False
    xm = x.masked_fill(~tok, float("-inf"))
    dead = (xm == float("-inf")).all(dim=-1, keepdim=True)
    star = torch.logsumexp(xm.masked_fill(dead, 0.0), dim=-1, keepdim=True)
    p = torch.exp(xm - star)  # 0 at the blank and in dead frames
    r = p / (1.0 + STC_EPS - p)
    g_tok = g_cols.masked_fill(~tok, 0.0)
    coef = g_cols[..., blank : blank + 1] + (g_tok * (1.0 + r)).sum(-1, keepdim=True)
    return g_in + p * coef - g_tok * r, g_cols.sum(dim=(1, 2))


class _STCChain(criterion.Criterion):
    """STC on the CPU: the emissions ``(B, T, C)`` as given and ``log p`` as the single weight;
    each graph is scored as the chain it reduces to, the star columns computed inside
    (:mod:`lightning_gtn.kernels.stc_chain`). Rows the chain cannot vouch for take the graph path."""

    kind = "stc_chain"
    name = "stc_loss"

    def forbidden_label(self, blank: int) -> Optional[int]:
        return blank

    def score(self, E, weights, seqs, lengths, blank, impl, zero_infinity, need_e, w_coef):
        log_p = float(weights.reshape(-1)[0])
        need_w = w_coef is not None
        need = need_e or need_w
        logz, flag, gX, gp = stc_chain.stc_chain(E, log_p, STC_EPS, seqs, lengths, blank, need)
        losses = torch.from_numpy(-logz).to(E.dtype)
        gp = torch.from_numpy(gp)
        redo = np.nonzero(flag)[0]
        if len(redo):
            sub = torch.from_numpy(redo)
            x = E[sub].contiguous()
            aug = stc_emissions(x, blank, log_p)
            l2, g_aug, _ = criterion.Criterion.score(
                criterion.CRITERIA["stc"],
                aug,
                None,
                [seqs[i] for i in redo],
                lengths[redo],
                blank,
                "numba",
                False,
                need,
                None,
            )
            losses[sub] = l2
            if need:
                g_x, g_lp = _star_grad(x, g_aug, blank)
                gX[sub] = g_x
                gp[sub] = g_lp.to(gp.dtype)
        ok = torch.isfinite(losses)
        if zero_infinity:  # infeasible only (torch's rule): -inf from a +inf emission stays
            losses = torch.where(losses == math.inf, torch.zeros_like(losses), losses)
        if need and not bool(ok.all()):
            gX[~ok] = 0
            gp[~ok] = 0
        gW = None
        if need_w:
            gW = (gp.to(E.dtype) * w_coef.to(E.dtype)).sum().reshape(weights.shape)
        return losses, (gX if need_e else None), gW


criterion.CRITERIA["stc_chain"] = _STCChain()


def _check_p(p):
    if isinstance(p, torch.Tensor):
        if p.dim() != 0 or not p.is_floating_point():
            raise ValueError(
                f"p must be a positive float or a 0-dim float tensor, got a tensor of shape "
                f"{tuple(p.shape)} and dtype {p.dtype}"
            )
        return torch.log(p)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (math.isfinite(p) and p > 0):
        raise ValueError(f"p must be a positive finite number (the token insertion penalty), got {p!r}")
    return math.log(float(p))


def stc_loss(
    emissions: torch.Tensor,
    targets,
    input_lengths,
    target_lengths=None,
    *,
    blank: int = 0,
    p: Union[float, torch.Tensor] = 1.0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    impl: Optional[str] = None,
) -> torch.Tensor:
    """The Star Temporal Classification loss of a batch (batch first).

    Loss of example ``b`` = ``-log`` of the total score of the STC graph of ``targets[b]``
    (CTC without token self-loops, plus a star node per gap, see :func:`stc_graph`) against
    ``emissions[b, :input_lengths[b]]`` augmented with the star columns
    (:func:`stc_emissions`), where each frame read by a star costs ``log p``. No
    denominator, as in the research code. A ``torch.library`` custom op behind torch ops:
    works under ``torch.compile(fullgraph=True)``.

    The penalty enters as an offset of the star columns (every star arc carries exactly
    ``log p``), not as a graph weight: graphs stay cached per ``(target, blank, C)`` whatever
    ``p`` is, and a 0-dim tensor ``p`` is a graph input under ``torch.compile``, not a constant.

    Args:
        emissions: ``(B, T, C)`` log-probabilities (``log_softmax`` outputs), ``C >= 2``.
            float32/float64; float16/bfloat16 are scored in float32.
        targets: padded ``(B, S)``, concatenated 1-D, or a list of B sequences; labels in
            ``[0, C)``, never ``blank``. Partial transcripts: tokens may be missing anywhere.
        input_lengths: ``(B,)`` integer frames per example, ``0 <= input_lengths[b] <= T``.
        target_lengths: ``(B,)`` labels per example; needed with tensor targets.
        blank: the blank label (the research code requires 0; any id works here).
        p: the token insertion penalty (before the log), a positive float or a 0-dim float
            tensor (its value is not checked, its log is taken). ``p < 1`` makes stars costly.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean"``: each loss divided by its
            target length (at least 1), then averaged over the batch.
        zero_infinity: infeasible examples give 0 instead of ``inf`` (gradient zero either way).
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"`` (``"gtn"`` is
            not offered for STC: ValueError).

    Returns:
        A scalar, or ``(B,)`` for ``reduction="none"``, in the emissions' dtype and device.

    Example:
        >>> import torch
        >>> from lightning_gtn.functional import stc_loss
        >>> lp = torch.randn(2, 10, 5).log_softmax(-1)
        >>> loss = stc_loss(lp, torch.tensor([[1, 2], [3, 0]]), [10, 8], [2, 1], p=0.5)
        >>> loss.shape
        torch.Size([])
    """
    return criterion.apply_loss(
        criterion.CRITERIA["stc"],
        emissions,
        targets,
        input_lengths,
        target_lengths,
        weights=p,
        blank=blank,
        reduction=reduction,
        zero_infinity=zero_infinity,
        impl=impl,
    )
