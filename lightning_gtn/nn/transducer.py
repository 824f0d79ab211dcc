"""The word-piece transducer criterion as a loss module (gtn_applications' ``Transducer``)."""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..functional import _validate
from ..functional import transducer as _td
from ..functional.viterbi import collapse
from ..wfst import Graph
from .losses import StructuredLoss, _check_common

__all__ = ["TransducerLoss"]


class TransducerLoss(StructuredLoss):
    """The word-piece transducer loss with learned n-gram transitions, as a module.

    The constructor arguments and meanings are those of gtn_applications' ``Transducer``
    (see :func:`lightning_gtn.functional.transducer_loss`): emissions ``(B, T, C)`` over the
    tokens plus, unless ``blank="none"``, a blank (the last class); targets are GRAPHEME ids.
    Without transitions the inputs go through ``log_softmax`` first (as the research
    ``forward`` does); with transitions (``ngram > 0`` or a user graph) the loss is normalised
    by the transitions' full score and the inputs are used as they are.

    The transition weights are the parameter ``transition_params``, zeros, one per arc in the
    transitions graph's arc id order (for ``ngram`` the research graph's creation order), so a
    parameter vector is interchangeable with the research code's; DDP syncs it and the
    ``state_dict`` carries it.

    Args:
        tokens: the token spellings (strings or sequences of graphemes).
        graphemes_to_idx: grapheme -> id.
        ngram: order of the transitions (0: none).
        transitions: instead of ``ngram``, an acceptor over the ``C`` frame labels (epsilon
            arcs allowed).
        blank: ``"none"``, ``"optional"`` or ``"forced"``.
        allow_repeats: False forbids a repeated token without a blank between (needs
            ``blank="optional"``).
        reduction: ``"mean"`` (per target length, then the batch mean: the research "mean"),
            ``"sum"`` or ``"none"`` (``(B,)``; the research "none" is our ``"sum"`` / B).
        decompositions: False trains on one segmentation per target
            (:func:`lightning_gtn.functional.segment`).
        zero_infinity: infeasible examples give 0.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.

    Attributes:
        num_classes: ``C``.
        blank: the blank's class (``len(tokens)``), or None.
        target_classes: the number of graphemes (max id + 1): targets and decoded outputs are
            graphemes, not emission classes.
        transition_params: the ``nn.Parameter`` of transition weights, or None.

    Shape:
        ``forward(emissions (B, T, C), targets (B, S) padded / concatenated 1-D / list,
        input_lengths (B,) or None, target_lengths (B,) or None)`` -> scalar, or ``(B,)`` with
        ``"none"``.

    Example:
        >>> import torch
        >>> from lightning_gtn.nn import TransducerLoss
        >>> crit = TransducerLoss(["a", "b", "ab"], {"a": 0, "b": 1}, ngram=1, blank="optional")
        >>> loss = crit(torch.randn(2, 6, 4), [[0, 1], [1, 1]])
        >>> loss.backward()
        >>> crit.transition_params.grad.shape
        torch.Size([4])
    """

    repeat_label = False

    def __init__(self, tokens: Sequence[Sequence], graphemes_to_idx: dict, ngram: int = 0,
                 transitions: Optional[Graph] = None, blank: str = "none", allow_repeats: bool = True,
                 reduction: str = "mean", decompositions: bool = True, zero_infinity: bool = False,
                 impl: Optional[str] = None) -> None:
        super().__init__()
        _check_common(reduction, impl)
        if impl == "gtn":
            raise ValueError("impl='gtn' is not offered for TransducerLoss")
        blank = _td._check_blank(blank, allow_repeats)
        ngram = _td._check_ngram(ngram)
        if ngram > 0 and transitions is not None:
            raise ValueError("pass ngram > 0 or transitions, not both (as in the research code)")
        if transitions is not None and not isinstance(transitions, Graph):
            raise ValueError(f"transitions must be a lightning_gtn.wfst.Graph, got {type(transitions).__name__}")
        self.tokens = [t if isinstance(t, str) else tuple(t) for t in tokens]
        self.graphemes_to_idx = dict(graphemes_to_idx)
        toks, n_graph = _td.token_ids(self.tokens, self.graphemes_to_idx)
        self.ngram = ngram
        self.blank_mode = blank
        self.allow_repeats = bool(allow_repeats)
        self.decompositions = bool(decompositions)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.num_classes = len(toks) + int(blank != "none")
        self.blank = len(toks) if blank != "none" else None
        self.target_classes = n_graph
        if ngram > 0:
            transitions = _td.transitions_graph(ngram, self.num_classes)
        self.transitions = transitions
        self._make_criterion()
        if transitions is not None:
            self.transition_params = nn.Parameter(torch.zeros(transitions.num_arcs()))
        else:
            self.transition_params = None

    def _make_criterion(self) -> None:
        toks, n_graph = _td.token_ids(self.tokens, self.graphemes_to_idx)
        self._token_ids = toks
        self._criterion = _td.TransducerCriterion(toks, n_graph, self.blank_mode, self.allow_repeats,
                                                  self.decompositions, self.transitions)
        self._handle = _td._ops.register_criterion(self._criterion)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_criterion"] = None  # caches and a lock: rebuilt on load
        state["_handle"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_criterion()

    def forward(self, emissions, targets, input_lengths=None, target_lengths=None):
        if self.transitions is None:
            emissions = torch.nn.functional.log_softmax(emissions, dim=2)
        return _td.apply_criterion(self._criterion, self._handle, emissions, targets, input_lengths, target_lengths,
                                   self.transition_params, self.reduction, self.zero_infinity, self.impl)

    # -- decoding ---------------------------------------------------------------
    def best_paths(self, emissions: torch.Tensor, input_lengths=None):
        """``(paths (B, T) int64 padded with -1, scores (B,))``: the best frame label paths
        (through the transitions when there are some, else the per-frame argmax)."""
        B, T, C = _validate.check_emissions(emissions, "emissions")
        if C != self.num_classes:
            raise ValueError(f"emissions must have C = {self.num_classes} classes, got shape {(B, T, C)}")
        il = torch.full((B,), T, dtype=torch.int64) if input_lengths is None else input_lengths
        lengths = _validate.as_lengths(il, B, "input_lengths", emissions.device, max_value=T)
        with torch.no_grad():
            return self._criterion.best_paths(emissions.detach(), lengths, self.transition_params)

    def viterbi(self, emissions: torch.Tensor, input_lengths=None) -> List[torch.Tensor]:
        """Token ids of each example, as the research ``viterbi``: the best frame path, then
        its shortest token reading (repeats merged, blanks dropped); a list of B int32 tensors."""
        paths, _ = self.best_paths(emissions, input_lengths)
        return [torch.tensor(collapse(p, self.blank), dtype=torch.int32) for p in paths.cpu().tolist()]

    def decode(self, emissions: torch.Tensor, input_lengths=None) -> List[List[int]]:
        """GRAPHEME ids of each example: the tokens of :meth:`viterbi`, spelled out."""
        paths, _ = self.best_paths(emissions, input_lengths)
        spell = self._token_ids
        return [[g for k in collapse(p, self.blank) for g in spell[k]] for p in paths.cpu().tolist()]

    def extra_repr(self) -> str:
        return (f"num_tokens={len(self.tokens)}, ngram={self.ngram}, blank={self.blank_mode!r}, "
                f"allow_repeats={self.allow_repeats}, decompositions={self.decompositions}, "
                f"reduction={self.reduction!r}")
