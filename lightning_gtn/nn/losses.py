"""Loss modules: each holds its options (and ASG its transitions), declares its token
convention, computes the loss through :mod:`lightning_gtn.functional` and decodes emissions.

Every loss is called the same way::

    loss = module(emissions (B, T, C), targets, input_lengths (B,), target_lengths (B,))

and declares its convention on :class:`StructuredLoss` (``blank``, ``repeat_label``,
``target_classes``, ``tokens``, ``num_classes``, ``topology``, ``frame_transitions``,
``vocabulary_arguments``), so that decoders, the Lightning layer and the CLIs read it instead of
guessing. ``best_paths`` and ``decode`` give the best frame-level paths and the token sequences
they spell.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from .. import functional as lgf  # not torch.nn.functional: the engine computes every loss
from ..core import checks
from ..core.checks import check_label, check_reduction

__all__ = [
    "LOSS_TOPOLOGIES",
    "Preparation",
    "prepare_word_pieces",
    "TextsUnavailable",
    "Decoding",
    "StructuredLoss",
    "CTCLoss",
    "ASGLoss",
    "SequenceLoss",
    "STCLoss",
    "GraphLoss",
    "TargetGraphLoss",
    "ModuleLoss",
]


#: The decoding topologies a loss declares (:attr:`StructuredLoss.topology`), how a frame-level
#: label path reads as tokens (the topologies of :mod:`lightning_gtn.decode`):
#:
#: * ``"ctc"``: consecutive equal labels merge, the blank (``blank``, an emission class) drops out;
#: * ``"asg"``: no blank; consecutive equal labels merge (with ``repeat_label`` a doubled token is
#:   written with the repeat token, the last emission class);
#: * ``"transducer"``: as ``"ctc"``, but the emission classes are the loss's own ``tokens`` (word
#:   pieces spelled in ``target_classes`` graphemes), the blank last;
#: * ``"rnnt"``: an RNN-T loss (:class:`lightning_gtn.nn.rnnt.RNNTStructuredLoss`) over joiner
#:   outputs ``(B, T, U + 1, V)``: decoded by the transducer searches, not from frame paths.
LOSS_TOPOLOGIES = ("ctc", "asg", "transducer", "rnnt")


class TextsUnavailable(ValueError):
    """A loss's preparation asked for the training transcripts where there are none to read
    (:meth:`Preparation.texts` without a source)."""


class Preparation:
    """What a loss's :meth:`StructuredLoss.prepare` may read and write before the loss is built.

    Args:
        chars: the data's characters, in vocabulary order.
        texts: ``texts(key) -> list of str``, the training transcripts (``key`` names the config
            key that asks, for its error messages), or None where none can be read (then
            :meth:`texts` raises :class:`TextsUnavailable`).
        output_dir: the run folder the preparation writes its files into (None: nothing is
            written).
    """

    def __init__(
        self,
        chars: Sequence[str],
        texts: Optional[Callable[[str], Sequence[str]]] = None,
        output_dir: Optional[os.PathLike | str] = None,
    ) -> None:
        self.chars: List[str] = list(chars)
        self._texts = texts
        self.output_dir = None if output_dir is None else Path(output_dir)

    @property
    def has_texts(self) -> bool:
        """Whether :meth:`texts` has a source."""
        return self._texts is not None

    def texts(self, key: str) -> List[str]:
        """The training transcripts.

        Raises:
            TextsUnavailable: naming ``key``, when this preparation has no source of them.
            ValueError: naming ``key``, when the source has none.
        """
        if self._texts is None:
            raise TextsUnavailable(f"{key}: built from the training transcripts, which are not available here")
        texts = list(self._texts(key))
        if not texts:
            raise ValueError(f"{key}: built from the training transcripts, but the data has none (train_set.texts)")
        return texts

    def path(self, name: str) -> Optional[Path]:
        """``output_dir / name`` for a file the preparation writes (the folder is made), or None
        when there is no run folder."""
        if self.output_dir is None:
            return None
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return self.output_dir / name


def prepare_word_pieces(config: Dict[str, Any], context: Preparation) -> Dict[str, Any]:
    """``config`` (a loss config, not changed in place) with its ``tokens`` resolved: ``<N>`` (an
    integer) trains N word pieces on the training transcripts
    (:func:`lightning_gtn.wordpieces.train_word_pieces`), ``<file>`` reads them; either way the
    characters the transcripts lack are added, the list is written to ``<run>/word_pieces.txt``
    and put into the config. ``"letters"`` and a list are left as they are.

    Raises:
        ValueError: naming ``loss.tokens``.
    """
    config = dict(config)
    tokens = config.get("tokens", "letters")
    pieces = None
    if isinstance(tokens, bool):
        raise ValueError(
            f"loss.tokens: expected 'letters', a number of word pieces or a word-piece file, got {tokens!r}"
        )
    if isinstance(tokens, int):
        from ..wordpieces import train_word_pieces

        texts = context.texts("loss.tokens")
        try:
            pieces = train_word_pieces(texts, int(tokens))
        except ValueError as e:
            raise ValueError(
                f"loss.tokens={tokens}: {str(e).replace('num_pieces', 'the number of word pieces')}; "
                "or loss.tokens=letters"
            ) from None
    elif isinstance(tokens, str) and tokens != "letters":
        from ..wordpieces import load_word_pieces

        if not Path(tokens).is_file():
            raise ValueError(
                f"loss.tokens: expected 'letters', a number of word pieces or a word-piece file; no such file: {tokens}"
            )
        try:
            pieces = load_word_pieces(tokens)
        except (OSError, ValueError) as e:
            raise ValueError(f"loss.tokens: cannot read word pieces from {tokens}: {e}") from None
    if pieces is not None:
        from ..wordpieces import save_word_pieces

        # characters the training transcripts lack still get a token, so every text is spellable
        pieces = list(pieces) + sorted(set(context.chars) - set(pieces))
        path = context.path("word_pieces.txt")
        if path is not None:
            save_word_pieces(pieces, path)
        config["tokens"] = list(pieces)
    return config


@dataclasses.dataclass(frozen=True)
class Decoding:
    """How a loss's outputs are decoded (:meth:`StructuredLoss.decoding`), read by the decoders of
    :mod:`lightning_gtn.lightning.decoding`.

    What is decoded follows ``network_methods``: a loss over emissions decodes its best frame paths
    (:meth:`StructuredLoss.decode`) or a beam search over frame paths
    (:class:`lightning_gtn.decode.BeamSearchDecoder`, read in the loss's ``topology``, ``blank``,
    ``repeat_label`` and ``tokens``); a loss with ``network_methods`` is decoded by the searches
    over its network (:mod:`lightning_gtn.decode.transducer`, :mod:`lightning_gtn.decode.transducer_beam`).

    Attributes:
        beam: None when the beam search of the loss's outputs applies; else why it does not (the
            decoders' error message).
        options: keyword arguments of the greedy search over a network
            (:func:`lightning_gtn.decode.transducer.greedy_search`) beyond the blank.
    """

    beam: Optional[str] = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class StructuredLoss(nn.Module):
    """Base class of the loss modules: the calling convention, the token convention, decoding.

    Every loss declares the convention below (class attributes or properties; a subclass
    overrides them). Decoders, the Lightning layer (:mod:`lightning_gtn.lightning`) and the
    CLIs read these and nothing else; they never inspect a loss's other attributes or signature.

    Attributes:
        blank: the blank's emission class id (an ``int``), or None when the loss has no blank.
        repeat_label: whether targets write a doubled token with a repeat token (losses that merge
            consecutive equal labels and have no blank to separate them: ASG, the sequence
            criterion). The repeat token is then the last emission class, ``C - 1``, after the
            characters (:class:`lightning_gtn.lightning.Vocabulary`). Never True with a blank.
        target_classes: None when targets and decoded outputs are emission class ids (the
            vocabulary's ids); else the number of classes targets are written in, which are not
            the emission classes (the word-piece transducer: graphemes), and :meth:`decode`
            returns ids of those classes.
        tokens: None (the emission classes are the vocabulary's characters), or the spelling of
            each non-blank emission class in class order (the word-piece transducer's tokens:
            strings or tuples of graphemes, as its constructor takes them).
        num_classes: the emission classes ``C`` the loss needs, or None when any ``C`` works
            (checked per call).
        topology: one of :data:`LOSS_TOPOLOGIES`, how :mod:`lightning_gtn.decode` reads this loss's
            frame paths. By default ``"ctc"`` with a blank, ``"asg"`` without (what
            :meth:`decode` does: merge repeats, drop blanks).
        frame_transitions: the ``(C + 1, C)`` frame-label transition scores the loss adds to the
            emissions (ASG's ``transitions``: row 0 start scores, ``[i + 1, j]`` label ``i``
            after label ``j``), which a decoder or an aligner adds too; None for losses without.
        vocabulary_arguments: names of constructor arguments that the Lightning layer fills from
            the data when a config leaves them out: ``"num_classes"`` (the vocabulary's class
            count), ``"blank"`` / ``"repeat_label"`` (from an older config's ``vocabulary``
            block), ``"graphemes_to_idx"`` / ``"tokens"`` (the data's characters as graphemes and
            letter tokens).
        network_methods: the methods of a network that training and decoding call when the loss
            scores a network's outputs rather than emissions (:meth:`network_loss`; the protocol of
            :mod:`lightning_gtn.nn.rnnt`); ``()`` (this default) for losses over emissions.
        run_files: the files :meth:`prepare` may write into a run folder (names).

    Before a loss is built from a config, :meth:`prepare` turns what the config asks to learn from
    the data (word pieces, a denominator, a transitions graph) into plain data in the config;
    :meth:`decoding` says how its outputs are decoded; :meth:`set_step` is told the training step.
    """

    blank: Optional[int] = None
    repeat_label: bool = False
    target_classes: Optional[int] = None
    tokens: Optional[Sequence] = None
    num_classes: Optional[int] = None
    vocabulary_arguments: Tuple[str, ...] = ()
    network_methods: Tuple[str, ...] = ()
    run_files: Tuple[str, ...] = ()

    @classmethod
    def prepare(cls, config: Dict[str, Any], context: Preparation) -> Dict[str, Any]:
        """The loss config ``config`` (a plain dict with ``_target_``) with what it asks to learn
        from the data resolved into plain data, so that the checkpoint's hyper-parameters carry
        it; called before the loss is built. This default returns it unchanged.

        Args:
            config: the loss config (not changed in place).
            context: the data's characters, the training transcripts and the run folder.

        Raises:
            ValueError: naming the ``loss.<key>`` at fault.
            TextsUnavailable: the config needs the training transcripts and ``context`` has none.
        """
        return dict(config)

    def decoding(self, num_classes: int) -> Decoding:
        """How the loss's outputs decode (see :class:`Decoding`); ``num_classes`` is the
        vocabulary's class count. This default: frame paths, beam search applies."""
        return Decoding()

    def spell(self, ids: Sequence[int]) -> List[int]:
        """The target-class ids that the emission-class ids ``ids`` (one decoded sequence, blanks
        dropped) spell: ``ids`` themselves (this default); a loss with ``target_classes`` whose
        network is decoded (a word-piece RNN-T loss) gives each token's graphemes."""
        return [int(i) for i in ids]

    def set_step(self, step: int) -> None:
        """Told the global training step before each training batch (the Lightning layer calls it);
        a loss with a schedule (a warm-up) overrides it. A no-op here."""

    def network_arguments(self) -> Dict[str, Any]:
        """Constructor arguments the Lightning layer gives the network of a loss with
        ``network_methods`` (an RNN-T loss's ``extra_outputs``: the joiner outputs it reads beyond
        the token scores); ``{}`` here."""
        return {}

    def network_loss(self, network: Any, frames, frame_lengths, targets, target_lengths):
        """The loss of a batch from ``network`` and the frames its ``encode`` gave, for a loss with
        ``network_methods``; losses over emissions are called directly instead.

        Raises:
            NotImplementedError: this loss scores emissions.
        """
        raise NotImplementedError(f"{type(self).__qualname__} scores emissions, not a network's outputs")

    @property
    def topology(self) -> str:
        """How decoders read the frame paths (see :data:`LOSS_TOPOLOGIES`): ``"ctc"`` with a blank,
        ``"asg"`` without."""
        return "ctc" if self.blank is not None else "asg"

    @property
    def frame_transitions(self) -> Optional[torch.Tensor]:
        """The ``(C + 1, C)`` frame-label transition scores of the loss, or None (this default)."""
        return None

    def forward(self, emissions, targets, input_lengths, target_lengths):  # pragma: no cover - abstract
        """The loss of a batch (implemented by each subclass).

        Args:
            emissions: ``(B, T, C)`` scores or log-probabilities.
            targets: ``(B, S)`` padded or ``(sum(target_lengths),)`` concatenated label ids.
            input_lengths: ``(B,)`` valid frames of each example.
            target_lengths: ``(B,)`` target lengths.

        Returns:
            a scalar, or ``(B,)`` with ``reduction="none"``.
        """
        raise NotImplementedError

    def best_paths(self, emissions: torch.Tensor, input_lengths=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(paths (B, T) int64 padded with -1, scores (B,))``: the best frame-level label
        paths for this loss (per-frame argmax unless the loss has transitions)."""
        return lgf.best_paths(emissions, input_lengths)

    def decode(self, emissions: torch.Tensor, input_lengths=None) -> List[List[int]]:
        """Token ids of each example: the best path with repeats merged and blanks dropped."""
        paths, _ = self.best_paths(emissions, input_lengths)
        return [lgf.collapse(p, self.blank) for p in paths.cpu().tolist()]


def _check_common(reduction: str, impl) -> None:
    check_reduction(reduction)
    checks.check_impl(impl)


class CTCLoss(StructuredLoss):
    """:func:`lightning_gtn.functional.ctc_loss` as a module (batch-first ``(B, T, C)``).

    Args:
        blank: the blank label (an integer).
        reduction: ``"none"`` | ``"mean"`` | ``"sum"`` (torch's meanings).
        zero_infinity: infeasible examples give 0 instead of ``inf``.
        impl: None (the device's default: the CTC kernel on the CPU, the Triton CTC kernel on
            CUDA where it passes its self-check), ``"numba_ctc"``, ``"triton_ctc"``, ``"numba"``,
            ``"numba_log"``, ``"torch"``, ``"triton"`` or ``"gtn"`` (see
            :func:`lightning_gtn.functional.ctc_loss`).

    Shape:
        ``forward(log_probs (B, T, C), targets (B, S) or (sum(target_lengths),),
        input_lengths (B,), target_lengths (B,))`` -> scalar, or ``(B,)`` with ``"none"``.
    """

    blank = 0
    vocabulary_arguments = ("blank",)

    def __init__(
        self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False, impl: Optional[str] = None
    ) -> None:
        super().__init__()
        _check_common(reduction, impl)
        self.blank = check_label(blank, "blank", 2**62)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        """The CTC loss of ``log_probs`` ``(B, T, C)``: a scalar, or ``(B,)`` with ``reduction="none"``."""
        return lgf.ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            self.blank,
            self.reduction,
            self.zero_infinity,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return f"blank={self.blank}, reduction={self.reduction!r}, zero_infinity={self.zero_infinity}"


class ASGLoss(StructuredLoss):
    """:func:`lightning_gtn.functional.asg_loss` with its transitions as an ``nn.Parameter``
    (so DDP syncs them). No blank; targets use a repeat label for doubled tokens.

    Args:
        num_classes: ``C``; the transitions have shape ``(C + 1, C)`` (row 0: start scores,
            ``transitions[i + 1, j]``: label ``i`` after label ``j``), initialised to zeros.
        reduction: ``"none"`` | ``"mean"`` (per target length, then batch) | ``"sum"``.
        zero_infinity: infeasible examples give 0.
        impl: as :class:`CTCLoss`.

    Shape:
        ``forward(emissions (B, T, C), targets, input_lengths (B,), target_lengths (B,))``.
    """

    repeat_label = True
    vocabulary_arguments = ("num_classes",)

    def __init__(
        self, num_classes: int, reduction: str = "mean", zero_infinity: bool = False, impl: Optional[str] = None
    ) -> None:
        super().__init__()
        _check_common(reduction, impl)
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
        self.num_classes = int(num_classes)
        self.transitions = nn.Parameter(torch.zeros(self.num_classes + 1, self.num_classes))
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl

    def forward(self, emissions, targets, input_lengths, target_lengths=None):
        """The ASG loss of ``emissions`` ``(B, T, C)``: a scalar, or ``(B,)`` with ``reduction="none"``."""
        return lgf.asg_loss(
            emissions,
            targets,
            input_lengths,
            target_lengths,
            transitions=self.transitions,
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )

    @property
    def frame_transitions(self) -> torch.Tensor:
        """The learned ``transitions`` (the ``nn.Parameter``)."""
        return self.transitions

    def best_paths(self, emissions, input_lengths=None):
        """Best paths through emissions plus these transitions."""
        return lgf.best_paths(emissions, input_lengths, transitions=self.transitions)

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return f"num_classes={self.num_classes}, reduction={self.reduction!r}"


class SequenceLoss(StructuredLoss):
    """:func:`lightning_gtn.functional.sequence_loss` (GTN's alignment-free criterion) as a
    module. No blank; targets use a repeat label for doubled tokens.

    Args:
        reduction, zero_infinity, impl: as :class:`CTCLoss`.
    """

    repeat_label = True

    def __init__(self, reduction: str = "mean", zero_infinity: bool = False, impl: Optional[str] = None) -> None:
        super().__init__()
        _check_common(reduction, impl)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl

    def forward(self, emissions, targets, input_lengths, target_lengths=None):
        """The sequence criterion of ``emissions`` ``(B, T, C)``: a scalar, or ``(B,)`` with ``reduction="none"``."""
        return lgf.sequence_loss(
            emissions,
            targets,
            input_lengths,
            target_lengths,
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )


class STCLoss(StructuredLoss):
    """Star Temporal Classification (:func:`lightning_gtn.functional.stc_loss`) with the
    research code's token insertion penalty schedule.

    The constructor arguments are those of gtn_applications' ``STC``, with one default changed:
    ``reduction`` is ``"mean"``, as in every other loss module (the research code's ``"none"``
    is ``reduction="none"``). The penalty after
    ``n`` training steps is ``p(n) = plast + (p0 - plast) * exp(-n * log(2) / thalf)``: it starts
    at ``p0``, is halfway to ``plast`` after ``thalf`` steps and tends to ``plast``. Each
    forward in training mode counts one step *before* computing ``p`` (as the research code
    does); eval mode leaves the count alone. The count is the buffer ``nstep`` (int64, in the
    ``state_dict``), so a resumed run continues the schedule, and ``p`` reaches the loss as a
    0-dim tensor, so a compiled step does not recompile when it changes.

    Args:
        blank_idx: the blank label (the research code requires 0; so does the Lightning
            layer's vocabulary).
        p0: initial token insertion penalty (before the log), ``> 0``.
        plast: final penalty (before the log), ``> 0``.
        thalf: steps for the penalty to reach ``(p0 + plast) / 2``, ``> 0``.
        reduction: ``"mean"`` (the default: each loss divided by its target length, then
            averaged), ``"sum"`` or ``"none"`` (the research code's default: the ``(B,)``
            losses).
        zero_infinity: infeasible examples give 0 instead of ``inf``.
        impl: as :class:`CTCLoss` (``"gtn"`` excepted).

    Shape:
        ``forward(log_probs (B, T, C), targets, input_lengths (B,), target_lengths (B,))`` ->
        scalar, or ``(B,)`` with ``"none"``. Decoding: per-frame argmax, repeats merged,
        blanks dropped.
    """

    blank = 0
    nstep: torch.Tensor  # a buffer: the training steps counted

    def __init__(
        self,
        blank_idx: int = 0,
        p0: float = 1,
        plast: float = 1,
        thalf: float = 1,
        reduction: str = "mean",
        zero_infinity: bool = False,
        impl: Optional[str] = None,
    ) -> None:
        super().__init__()
        _check_common(reduction, impl)
        if impl == "gtn":
            raise ValueError("impl='gtn' is not offered for STCLoss")
        self.blank = check_label(blank_idx, "blank_idx", 2**62)
        for name, v in (("p0", p0), ("plast", plast), ("thalf", thalf)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        self.p0, self.plast, self.thalf = float(p0), float(plast), float(thalf)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.register_buffer("nstep", torch.zeros((), dtype=torch.int64))

    @property
    def blank_idx(self) -> int:
        """The blank label (gtn_applications' name for :attr:`blank`)."""
        return self.blank

    def penalty(self) -> torch.Tensor:
        """The current token insertion penalty ``p(nstep)`` as a 0-dim float64 tensor."""
        decay = torch.exp(self.nstep.to(torch.float64) * (-math.log(2) / self.thalf))
        return self.plast + (self.p0 - self.plast) * decay

    def forward(self, log_probs, targets, input_lengths, target_lengths=None):
        """The STC loss of ``log_probs`` ``(B, T, C)`` with the current penalty: a scalar, or
        ``(B,)`` with ``reduction="none"``. In training mode it first counts one step."""
        if self.training:
            self.nstep.add_(1)
        return lgf.stc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            blank=self.blank,
            p=self.penalty(),
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"blank_idx={self.blank}, p0={self.p0}, plast={self.plast}, thalf={self.thalf}, "
            f"reduction={self.reduction!r}, zero_infinity={self.zero_infinity}"
        )


class GraphLoss(StructuredLoss):
    """:func:`lightning_gtn.functional.graph_loss` as a module: the criterion graphs are
    passed per call (keyword-only). Eager only (graph objects); for graphs built from the
    targets, and for ``torch.compile``, use :class:`TargetGraphLoss`.

    Args:
        reduction: ``"none"`` | ``"mean"`` | ``"sum"``.
        zero_infinity: examples without a path give 0.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.
        blank, repeat_label: the token convention of the graphs (for decoding and the
            Lightning layer); the topology is ``"ctc"`` with a blank, ``"asg"`` without.

    Shape:
        ``forward(emissions (B, T, C), targets=None, input_lengths=None, target_lengths=None, *,
        graphs, denominators=None, weights=None)``.
    """

    vocabulary_arguments = ("blank", "repeat_label")

    def __init__(
        self,
        reduction: str = "mean",
        zero_infinity: bool = False,
        impl: Optional[str] = None,
        blank: Optional[int] = None,
        repeat_label: bool = False,
    ) -> None:
        super().__init__()
        _check_common(reduction, impl)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.blank = check_label(blank, "blank", 2**62, allow_none=True)
        self.repeat_label = bool(repeat_label)

    def forward(  # type: ignore[override]  # the graphs come with each call (keyword-only)
        self,
        emissions,
        targets=None,
        input_lengths=None,
        target_lengths=None,
        *,
        graphs,
        denominators=None,
        weights=None,
    ):
        """The loss of ``emissions`` ``(B, T, C)`` against ``graphs`` (one per example, or one for all),
        normalized by ``denominators`` when given: a scalar, or ``(B,)`` with ``reduction="none"``."""
        return lgf.graph_loss(
            emissions,
            targets,
            input_lengths,
            target_lengths,
            graphs=graphs,
            denominators=denominators,
            weights=weights,
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )


class TargetGraphLoss(StructuredLoss):
    """A criterion graph per target from a builder function: the way to train with your own
    criterion graphs.

    ``builder(target_ids, **builder_kwargs)`` returns a :class:`lightning_gtn.wfst.Graph`
    acceptor over the emission classes (e.g. :func:`lightning_gtn.wfst.criterion.ctc_graph`);
    compiled graphs are cached per target. The loss of example ``b`` is
    ``-forward_score(graph_b o E_b)``, plus the forward score of all label paths when
    ``normalize=True`` (for unnormalised emissions or criteria that are not distributions).
    Graphs are built inside a custom op, so a model step with this loss compiles with
    ``torch.compile(fullgraph=True)``.

    Args:
        builder: the function, or its dotted name (what a config gives): a registered builder
            of :mod:`lightning_gtn.trust` (``lightning_gtn.wfst.criterion.ctc_graph``) or one
            of an opted-in module.
        builder_kwargs: extra keyword arguments of the builder.
        normalize: add the all-paths forward score.
        blank: the blank label id of the graphs (None: no blank), for targets and decoding.
        repeat_label: whether targets need a repeat label for doubled tokens.
        reduction: ``"mean"`` (per-token, then batch average), ``"sum"`` or ``"none"``.
        zero_infinity: targets with no path give 0.
        cache_size: at most this many cached graphs.
        impl: None, ``"numba"``, ``"numba_log"``, ``"torch"`` or ``"triton"``.
        num_classes: accepted for configs that name it; the graphs are checked against the
            emissions' ``C`` at each call.

    Shape:
        ``forward(emissions (B, T, C), targets (B, S) padded or concatenated 1-D,
        input_lengths (B,), target_lengths (B,))``. Decoding: per-frame argmax, read as
        ``topology`` ``"ctc"`` with a blank, ``"asg"`` without.
    """

    vocabulary_arguments = ("blank", "repeat_label", "num_classes")

    def __init__(
        self,
        builder,
        builder_kwargs: Optional[Mapping] = None,
        normalize: bool = False,
        blank: Optional[int] = None,
        repeat_label: bool = False,
        reduction: str = "mean",
        zero_infinity: bool = False,
        cache_size: int = 100_000,
        impl: Optional[str] = None,
        num_classes: Optional[int] = None,
    ):
        super().__init__()
        _check_common(reduction, impl)
        if impl == "gtn":
            raise ValueError("loss.impl: 'gtn' is not available for TargetGraphLoss")
        if isinstance(builder, str):
            from ..trust import resolve

            builder = resolve(builder, "loss.builder", kinds=("builder",))
        crit = lgf.TargetGraphCriterion(builder, dict(builder_kwargs or {}), bool(normalize), cache_size)
        self.blank = check_label(blank, "loss.blank", 2**62, allow_none=True)
        self.repeat_label = bool(repeat_label)
        self.normalize = bool(normalize)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.num_classes = num_classes
        self._criterion = crit  # pickled by its arguments: a copy gets its own cache and handle

    @property
    def builder(self) -> Callable:
        """The function that builds a target's criterion graph."""
        return self._criterion.builder

    @property
    def _handle(self) -> int:
        return self._criterion.handle

    def forward(self, emissions, targets, input_lengths, target_lengths):
        """The loss of ``emissions`` ``(B, T, C)`` against the graphs the builder makes of ``targets``:
        a scalar, or ``(B,)`` with ``reduction="none"``."""
        return lgf.target_graph_loss(
            emissions,
            targets,
            input_lengths,
            target_lengths,
            criterion=self._criterion,
            blank=self.blank,
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        name = getattr(self.builder, "__qualname__", repr(self.builder))
        return f"builder={name}, normalize={self.normalize}, blank={self.blank}, reduction={self.reduction!r}"


class ModuleLoss(StructuredLoss):
    """Any loss module with the calling convention, with its token convention stated.

    Args:
        module: called as ``module(emissions, targets, input_lengths, target_lengths)``.
        blank: the blank's id, or None.
        repeat_label: whether targets need a repeat label for doubled tokens.

    The topology is ``"ctc"`` with a blank, ``"asg"`` without (decoding: per-frame argmax).
    """

    vocabulary_arguments = ("blank", "repeat_label")

    def __init__(self, module: nn.Module, blank: Optional[int] = None, repeat_label: bool = False) -> None:
        super().__init__()
        self.module = module
        self.blank = check_label(blank, "blank", 2**62, allow_none=True)
        self.repeat_label = bool(repeat_label)

    def forward(self, emissions, targets, input_lengths, target_lengths):
        """The wrapped module's loss of ``emissions`` ``(B, T, C)``."""
        return self.module(emissions, targets, input_lengths, target_lengths)
