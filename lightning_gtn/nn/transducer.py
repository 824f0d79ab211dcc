"""The word-piece transducer criterion as a loss module (gtn_applications' ``Transducer``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from .. import functional as lgf  # not torch.nn.functional: the engine computes every loss
from ..core import checks
from ..wfst import Graph
from .losses import Decoding, Preparation, StructuredLoss, _check_common, prepare_word_pieces

__all__ = ["TransducerLoss", "transitions_to_data", "transitions_from_data", "MAX_DATA_ARCS"]

#: The most arcs a transitions graph given as data (a config, a checkpoint) may have.
MAX_DATA_ARCS = 2_000_000
_DATA_FORMAT = "lightning_gtn.transitions/1"
_MAX_NODES = 2**31 - 1


def transitions_to_data(graph: Graph) -> dict:
    """A transitions acceptor as plain data, for a config or a checkpoint's hyper-parameters:
    ``{"format": "lightning_gtn.transitions/1", "num_nodes": N, "start": [ids], "accept": [ids],
    "arcs": "src dst label\\n..."}`` (one line of decimal integers per arc, label -1 for epsilon).
    Arc order (the order of the learned ``transition_params``) is kept; weights are not stored
    (they are the module's parameters, in the state dict).

    Raises:
        ValueError: the graph is not an acceptor or has more than :data:`MAX_DATA_ARCS` arcs.
    """
    if not isinstance(graph, Graph):
        raise ValueError(f"transitions must be a lightning_gtn.wfst.Graph, got {type(graph).__name__}")
    a = graph.arrays()
    if len(a.src) > MAX_DATA_ARCS:
        raise ValueError(f"transitions: {len(a.src)} arcs; at most {MAX_DATA_ARCS} travel as data")
    if not np.array_equal(a.ilabel, a.olabel):
        raise ValueError("transitions must be an acceptor (input label == output label on every arc)")
    rows = np.stack([a.src, a.dst, a.ilabel], axis=1).astype(np.int64)
    return {
        "format": _DATA_FORMAT,
        "num_nodes": int(a.num_nodes),
        "start": [int(i) for i in a.start],
        "accept": [int(i) for i in a.accept],
        "arcs": "\n".join(f"{s} {d} {l}" for s, d, l in rows.tolist()),
    }


def _ids(v, key: str, num_nodes: int) -> np.ndarray:
    if (
        not isinstance(v, (list, tuple))
        or len(v) > num_nodes
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_nodes for i in v)
    ):
        raise ValueError(
            f"loss.transitions.{key}: expected a list of distinct node ids in [0, {num_nodes}), got " f"{str(v)[:200]}"
        )
    if len(set(v)) != len(v):
        raise ValueError(f"loss.transitions.{key}: node ids must be distinct")
    return np.asarray(v, dtype=np.int32)


def transitions_from_data(data) -> Graph:
    """The acceptor of :func:`transitions_to_data`'s ``data``, checked: the format tag, at most
    :data:`MAX_DATA_ARCS` arcs, node ids in ``[0, num_nodes)``, labels ``>= -1`` (the labels'
    upper bound is checked against the loss's classes by the criterion), decimal integers only.

    Raises:
        ValueError: naming ``loss.transitions.<key>`` and what was expected.
    """
    import re

    if not isinstance(data, dict) or data.get("format") != _DATA_FORMAT:
        raise ValueError(
            f"loss.transitions: expected a graph as data with format {_DATA_FORMAT!r} "
            "(see lightning_gtn.nn.transducer.transitions_to_data)"
        )
    unknown = sorted(set(data) - {"format", "num_nodes", "start", "accept", "arcs"})
    if unknown:
        raise ValueError(f"loss.transitions.{unknown[0]}: unknown key")
    n = data.get("num_nodes")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= min(_MAX_NODES, 2 * MAX_DATA_ARCS + 2):
        raise ValueError(f"loss.transitions.num_nodes: expected an integer in [1, {2 * MAX_DATA_ARCS + 2}], got {n!r}")
    start, accept = _ids(data.get("start"), "start", n), _ids(data.get("accept"), "accept", n)
    arcs = data.get("arcs")
    max_chars = MAX_DATA_ARCS * 36  # three int32 and separators per arc
    if not isinstance(arcs, str) or len(arcs) > max_chars:
        raise ValueError(
            f"loss.transitions.arcs: expected a string of at most {max_chars} characters "
            f"(lines 'src dst label'), got {type(arcs).__name__} of {len(arcs) if isinstance(arcs, str) else '?'}"
        )
    if not re.fullmatch(r"[0-9 \n-]*", arcs):
        raise ValueError("loss.transitions.arcs: only decimal integers, spaces and newlines are allowed")
    try:
        flat = np.array([int(t) for t in arcs.split()], dtype=np.int64)
    except (ValueError, OverflowError):
        raise ValueError("loss.transitions.arcs: a token is not a decimal integer") from None
    if flat.size % 3:
        raise ValueError(f"loss.transitions.arcs: expected 3 integers per arc, got {flat.size} in all")
    rows = flat.reshape(-1, 3)
    if len(rows) > MAX_DATA_ARCS:
        raise ValueError(f"loss.transitions.arcs: {len(rows)} arcs; at most {MAX_DATA_ARCS}")
    if len(rows) and (rows[:, :2].min() < 0 or rows[:, :2].max() >= n):
        raise ValueError(f"loss.transitions.arcs: a node id outside [0, {n})")
    if len(rows) and (rows[:, 2].min() < -1 or rows[:, 2].max() > 2**31 - 1):
        raise ValueError("loss.transitions.arcs: a label below -1 (epsilon) or beyond int32")
    lab = rows[:, 2].astype(np.int32)
    return Graph.from_arrays(
        n, start, accept, rows[:, 0].astype(np.int32), rows[:, 1].astype(np.int32), lab, lab.copy()
    )


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
            arcs allowed): a :class:`~lightning_gtn.wfst.Graph`, the same as data
            (:func:`transitions_to_data`; what configs and checkpoints carry), or a file of
            :func:`lightning_gtn.wfst.ngram.save_transitions` (Python callers only: a config
            from a checkpoint may not name files).
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
        blank: the blank's class (``len(tokens)``, an ``int``), or None; the constructor's
            ``blank`` string is :attr:`blank_mode`.
        blank_mode: ``"none"``, ``"optional"`` or ``"forced"`` (the constructor's ``blank``).
        target_classes: the number of graphemes (max id + 1): targets and decoded outputs are
            graphemes, not emission classes.
        tokens: the token spellings, one per non-blank emission class, in class order.
        topology: ``"transducer"`` with a blank, ``"asg"`` without (frames of a token merge).
        frame_transitions: None (the transitions, if any, are a graph over the tokens:
            :attr:`transitions` and :attr:`transition_params`).
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
    vocabulary_arguments = ("graphemes_to_idx", "tokens")
    run_files = ("word_pieces.txt", "transitions.bin")

    @classmethod
    def prepare(cls, config: Dict[str, Any], context: Preparation) -> Dict[str, Any]:
        """Resolves what the config learns from the training transcripts (see
        :meth:`StructuredLoss.prepare`).

        ``tokens: <N>`` (an integer) trains N word pieces on the training transcripts
        (:func:`lightning_gtn.wordpieces.train_word_pieces`) and ``tokens: <file>`` reads them;
        either way the characters the transcripts lack are added, the list is written to
        ``<run>/word_pieces.txt`` and put into the config. ``transitions: {order: 2, prune: 10}``
        builds the token-level transition graph (back-off, n-grams seen at most ``prune`` times
        dropped) from the training transcripts and saves it as ``<run>/transitions.bin``; that
        file, or the one ``transitions: <file>`` names, is read and put into the config as data
        (:func:`transitions_to_data`), so a checkpoint carries the graph.

        Raises:
            ValueError: naming ``loss.tokens`` / ``loss.transitions``.
        """
        config = prepare_word_pieces(config, context)
        trans = config.get("transitions")
        if isinstance(trans, Mapping) and "format" not in trans:  # a recipe
            from ..wfst.ngram import save_transitions, transitions_graph

            toks = list(context.chars) if isinstance(config.get("tokens", "letters"), str) else list(config["tokens"])
            blank = str(config.get("blank", "none"))
            seqs = [lgf.segment(t, toks) for t in context.texts("loss.transitions")]
            num = len(toks) + int(blank != "none")
            g = transitions_graph(
                seqs,
                num,
                order=int(trans.get("order", 2)),
                prune=int(trans.get("prune", 0)),
                blank=blank,
                self_loops=True,
            )
            names = toks + (["<blank>"] if blank != "none" else [])
            path = context.path("transitions.bin")
            if path is None:
                config["transitions"] = transitions_to_data(g)
                return config
            save_transitions(str(path), g, num, tokens=names)
            trans = str(path)
        if isinstance(trans, str):
            # the user's own file (or the one just built): read here, carried by the checkpoint as data
            from ..wfst.ngram import load_transitions

            try:
                data = transitions_to_data(load_transitions(trans)[0])
            except (OSError, ValueError) as e:
                raise ValueError(f"loss.transitions: cannot use {trans!r}: {e}") from e
            config["transitions"] = data
        return config

    def decoding(self, num_classes: int) -> Decoding:
        """Frame paths; the beam searches read the transducer's frame paths only with
        ``blank="optional"`` and ``allow_repeats=True`` (or without a blank)."""
        if self.blank is not None and (self.blank_mode != "optional" or not self.allow_repeats):
            return Decoding(
                beam="beam search decodes the transducer with blank='optional' and allow_repeats=True "
                "(or blank='none'); use decoder=greedy for this loss"
            )
        return Decoding()

    @property
    def topology(self) -> str:
        """``"transducer"`` with a blank, ``"asg"`` without (see :data:`lightning_gtn.nn.LOSS_TOPOLOGIES`)."""
        return "transducer" if self.blank is not None else "asg"

    transition_params: Optional[nn.Parameter]

    def __init__(
        self,
        tokens: Sequence[Sequence],
        graphemes_to_idx: dict,
        ngram: int = 0,
        transitions: Optional[Graph] = None,
        blank: str = "none",
        allow_repeats: bool = True,
        reduction: str = "mean",
        decompositions: bool = True,
        zero_infinity: bool = False,
        impl: Optional[str] = None,
    ) -> None:
        super().__init__()
        _check_common(reduction, impl)
        if impl == "gtn":
            raise ValueError("impl='gtn' is not offered for TransducerLoss")
        blank = checks.check_blank(blank, allow_repeats)
        ngram = checks.check_ngram(ngram)
        if ngram > 0 and transitions is not None:
            raise ValueError("pass ngram > 0 or transitions, not both (as in the research code)")
        if isinstance(transitions, (str, os.PathLike)):
            # a file of lightning_gtn.wfst.ngram.save_transitions (validated on load)
            from ..wfst.ngram import load_transitions

            transitions = load_transitions(os.fspath(transitions))[0]
        elif isinstance(transitions, dict):
            transitions = transitions_from_data(transitions)
        if transitions is not None and not isinstance(transitions, Graph):
            raise ValueError(
                "transitions must be a lightning_gtn.wfst.Graph, its data (transitions_to_data) or a transitions "
                f"file, got {type(transitions).__name__}"
            )
        self.tokens = [t if isinstance(t, str) else tuple(t) for t in tokens]
        self.graphemes_to_idx = dict(graphemes_to_idx)
        toks, n_graph = checks.token_ids(self.tokens, self.graphemes_to_idx)
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
            transitions = lgf.full_ngram_transitions(ngram, self.num_classes)
        self.transitions = transitions
        self._make_criterion()
        if transitions is not None:
            self.transition_params = nn.Parameter(torch.zeros(transitions.num_arcs()))
        else:
            self.transition_params = None

    def _config(self) -> dict:
        """The configuration arguments of the functional API: the module's own transitions graph
        (for ``ngram`` too), so that a copy of the module has its own criterion."""
        return dict(
            tokens=self.tokens,
            graphemes_to_idx=self.graphemes_to_idx,
            transitions=self.transitions,
            blank=self.blank_mode,
            allow_repeats=self.allow_repeats,
            decompositions=self.decompositions,
        )

    def _make_criterion(self) -> None:
        # built (and checked) now, through the functional API's cache; holding it keeps it (and
        # its handle) alive, so the functional calls of forward and best_paths find it even after
        # the cache of recent configurations dropped it (torch.compile traces those lookups)
        self._token_ids = checks.token_ids(self.tokens, self.graphemes_to_idx)[0]
        self._criterion, self._handle = lgf.transducer_criterion(**self._config())

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_criterion"] = None  # caches and a lock: rebuilt on load
        state["_handle"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_criterion()

    def forward(self, emissions, targets, input_lengths=None, target_lengths=None):
        """The transducer loss of ``emissions`` ``(B, T, C)``: a scalar, or ``(B,)`` with
        ``reduction="none"``. Without transitions the emissions are log-softmaxed first."""
        if self.transitions is None:
            emissions = torch.nn.functional.log_softmax(emissions, dim=2)
        return lgf.transducer_loss(
            emissions,
            targets,
            input_lengths,
            target_lengths,
            **self._config(),
            transition_params=self.transition_params,
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )

    # -- decoding ---------------------------------------------------------------
    def best_paths(self, emissions: torch.Tensor, input_lengths=None):
        """``(paths (B, T) int64 padded with -1, scores (B,))``: the best frame label paths
        (through the transitions when there are some, else the per-frame argmax)."""
        B, T, C = checks.check_emissions(emissions, "emissions")
        if C != self.num_classes:
            raise ValueError(f"emissions must have C = {self.num_classes} classes, got shape {(B, T, C)}")
        return lgf.transducer_best_paths(
            emissions, input_lengths, **self._config(), transition_params=self.transition_params
        )

    def viterbi(self, emissions: torch.Tensor, input_lengths=None) -> List[torch.Tensor]:
        """Token ids of each example, as the research ``viterbi``: the best frame path, then
        its shortest token reading (repeats merged, blanks dropped); a list of B int32 tensors.

        Without transitions the best frame path is the per-frame argmax, which with
        ``blank="forced"`` need not be a path of the token graph (no blank between two
        tokens); the research code then returns an empty reading, this one still merges
        repeats and drops blanks."""
        paths, _ = self.best_paths(emissions, input_lengths)
        return [torch.tensor(lgf.collapse(p, self.blank), dtype=torch.int32) for p in paths.cpu().tolist()]

    def decode(self, emissions: torch.Tensor, input_lengths=None) -> List[List[int]]:
        """GRAPHEME ids of each example: the tokens of :meth:`viterbi`, spelled out."""
        paths, _ = self.best_paths(emissions, input_lengths)
        spell = self._token_ids
        return [[g for k in lgf.collapse(p, self.blank) for g in spell[k]] for p in paths.cpu().tolist()]

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"num_tokens={len(self.tokens or ())}, ngram={self.ngram}, blank={self.blank_mode!r}, "
            f"allow_repeats={self.allow_repeats}, decompositions={self.decompositions}, "
            f"reduction={self.reduction!r}"
        )
