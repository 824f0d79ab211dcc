"""``LFMMILoss``: lattice-free MMI (:func:`lightning_gtn.functional.mmi_loss`) as a structured loss
module, with icefall's CTC + MMI weighted sum and an optional CTC warm-up.

The emissions are over the CTC classes (blank 0, token ``k`` = class ``k``, what
:class:`lightning_gtn.lightning.Vocabulary` gives with a blank), the loss declares CTC's
convention (``blank = 0``, ``topology = "ctc"``), so the greedy, beam and ``beam_lm`` decoders
read its emissions as they read CTC's. The denominator graph (one for the whole batch, see
:func:`lightning_gtn.functional.denominator_graph`) is given as a graph or as plain data
(:func:`lightning_gtn.functional.mmi_graph_to_data`): ``lightning-gtn-train`` builds it from the
training transcripts and puts the data into the loss config, so a checkpoint carries it and the
module rebuilds it when loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Optional

import numpy as np

from .. import functional as lgf  # not torch.nn.functional: the engine computes every loss
from ..core import checks
from ..wfst import Graph
from .losses import Preparation, StructuredLoss, _check_common

__all__ = ["LFMMILoss", "LFMMI_TOPOLOGIES", "SPEC_KEYS"]

#: The topologies :class:`LFMMILoss` trains: those whose emission classes are CTC's (blank 0,
#: token k = class k), so the CTC decoders read them. The HMM topologies (``"hmm1"``,
#: ``"hmm2"``: no blank, ``N`` or ``2N`` classes) are scored by
#: :func:`lightning_gtn.functional.mmi_loss` directly.
LFMMI_TOPOLOGIES = ("ctc", "modified_ctc")

#: The keys of a denominator *recipe* (``loss.denominator: {order: 2, prune: 0, topology: ctc}``),
#: which ``lightning-gtn-train`` turns into a graph from the training transcripts.
SPEC_KEYS = ("order", "prune", "topology", "method")


def _denominator_graph(denominator) -> Graph:
    """A Graph as is; plain data (``mmi_graph_to_data``) rebuilt; anything else a ValueError."""
    if isinstance(denominator, Graph):
        return denominator
    if denominator is None:
        raise ValueError(
            "denominator: required, a lightning_gtn.wfst.Graph or its data "
            "(lightning_gtn.functional.mmi_graph_to_data); lightning-gtn-train builds it from the training "
            "transcripts when the config says loss.denominator: {order: 2, prune: 0, topology: ctc}"
        )
    if isinstance(denominator, Mapping):
        if denominator and set(denominator) <= set(SPEC_KEYS):
            raise ValueError(
                f"denominator: {dict(denominator)!r} is a recipe, which lightning-gtn-train resolves from the "
                "training transcripts; here give the graph (lightning_gtn.functional.denominator_graph(texts as "
                "token ids, num_tokens, order=..., topology=...)) or its data (functional.mmi_graph_to_data)"
            )
        return lgf.mmi_graph_from_data(dict(denominator))
    raise ValueError(
        "denominator: expected a lightning_gtn.wfst.Graph or its data (a mapping from "
        f"lightning_gtn.functional.mmi_graph_to_data), got {type(denominator).__name__}"
    )


def _info(denominator) -> dict:
    """The ``info`` mapping of denominator data (``{"topology": ..., "order": ...}``), or ``{}``."""
    info = denominator.get("info") if isinstance(denominator, Mapping) else None
    return dict(info) if isinstance(info, Mapping) else {}


class LFMMILoss(StructuredLoss):
    """Lattice-free MMI over a shared denominator graph, optionally mixed with CTC.

    The loss of example ``b`` is ``-(log Z_num - den_scale * log Z_den)``
    (:func:`lightning_gtn.functional.mmi_loss`); with ``ctc_weight > 0`` it is
    ``ctc_weight * ctc + (1 - ctc_weight) * mmi`` (icefall's weighted sum), and for the first
    ``warmup_steps`` training steps (the step the training loop sets with :meth:`set_step`;
    :class:`lightning_gtn.lightning.StructuredLossMixin` does it before each step) it is the CTC
    loss alone.

    Args:
        num_classes: ``C`` (tokens + the blank); the Lightning layer fills it from the vocabulary.
            Checked against the denominator's labels and, per call, the emissions.
        denominator: the denominator graph (an epsilon-free acceptor over the ``C`` classes whose
            arc weights are the log-probabilities of the token n-gram), or its plain data
            (:func:`lightning_gtn.functional.mmi_graph_to_data`), rebuilt here.
        topology: ``"ctc"`` or ``"modified_ctc"`` (:data:`LFMMI_TOPOLOGIES`), the topology the
            numerators are built in; it must be the one the denominator was built with.
        den_scale: the denominator's weight (1: MMI).
        leaky_hmm: Kaldi's leaky-HMM coefficient in ``[0, 1)`` (0: none).
        ctc_weight: in ``[0, 1]``; the CTC share of the weighted sum (0: pure MMI; 1: CTC).
        warmup_steps: training steps of CTC alone before the MMI (or mixed) loss.
        reduction: ``"mean"`` (each loss divided by its target length, then the batch mean, for
            both parts), ``"sum"`` or ``"none"`` (``(B,)``).
        zero_infinity: examples without a numerator path give 0 (both parts).
        impl: passed to the scoring functions (None: the device's default).

    Attributes:
        step: the training step the warm-up reads (0 until :meth:`set_step` is called).
        denominator: the denominator graph (a :class:`lightning_gtn.wfst.Graph`).
        mmi_topology: the ``topology`` argument (the declared :attr:`topology` is ``"ctc"``, how
            decoders read the emissions).

    Shape:
        ``forward(log_probs (B, T, C), targets (B, S) padded or (sum(target_lengths),),
        input_lengths (B,), target_lengths (B,))`` -> scalar, or ``(B,)`` with ``"none"``. Targets
        are token ids ``1 .. C - 1``. Decoding: as CTC (per-frame argmax, repeats merged, blanks
        dropped; with ``"modified_ctc"`` a token repeated on consecutive frames reads as one).
    """

    blank = 0
    vocabulary_arguments = ("num_classes",)
    run_files = ("denominator.bin",)

    @classmethod
    def prepare(cls, config: Dict[str, Any], context: Preparation) -> Dict[str, Any]:
        """Resolves ``denominator`` before the loss is built (see :meth:`StructuredLoss.prepare`).

        A recipe ``{order: 2, prune: 0, topology: ctc}`` (``method`` too: ``kneser_ney``) builds the
        denominator graph from the training transcripts (tokens: the data's characters, ids
        ``1 .. N`` as :class:`lightning_gtn.lightning.Vocabulary` encodes them with a blank) with
        :func:`lightning_gtn.functional.denominator_graph`, saves it as ``<run>/denominator.bin``
        (:func:`lightning_gtn.wfst.save`) and puts it into the config as data
        (:func:`lightning_gtn.functional.mmi_graph_to_data`), so the checkpoint carries it; the
        loss's ``topology`` follows the recipe's. Graph data (what a checkpoint holds) is kept.

        Raises:
            ValueError: naming ``loss.denominator``: missing, neither a recipe nor graph data, a bad
                recipe value, transcripts outside the characters.
        """
        config = dict(config)
        den = config.get("denominator")
        recipe = "a recipe {order: 2, prune: 0, topology: ctc} (built from the training transcripts)"
        if den is None:
            raise ValueError(f"loss.denominator: missing; give {recipe} or a graph as data")
        if not isinstance(den, Mapping) or len(den) == 0:
            raise ValueError(f"loss.denominator: expected {recipe} or a graph as data, got {den!r}")
        spec = dict(den)
        if not set(spec) <= set(SPEC_KEYS):
            if set(spec) & set(SPEC_KEYS) - {"topology"}:
                unknown = sorted(set(spec) - set(SPEC_KEYS))
                raise ValueError(
                    f"loss.denominator.{unknown[0]}: unknown key of a denominator recipe (keys: {SPEC_KEYS})"
                )
            return config  # graph data (a checkpoint's, or the user's own): checked when the loss is built
        order, prune = spec.get("order", 2), spec.get("prune", 0)
        topology, method = spec.get("topology", config.get("topology", "ctc")), spec.get("method", "kneser_ney")
        if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= 6:
            raise ValueError(f"loss.denominator.order: expected an integer in [1, 6], got {order!r}")
        if prune is not None and (isinstance(prune, bool) or not isinstance(prune, int) or prune < 0):
            raise ValueError(
                f"loss.denominator.prune: expected an integer >= 0 (n-grams of order >= 2 seen at most this many "
                f"times are dropped; 0: none), got {prune!r}"
            )
        if config.get("topology") is not None and config.get("topology") != topology:
            raise ValueError(
                f"loss.denominator.topology: {topology!r} differs from loss.topology {config.get('topology')!r} "
                "(the numerators and the denominator need the same topology)"
            )
        ids = {c: i + 1 for i, c in enumerate(context.chars)}  # the blank is 0
        seqs = []
        for text in context.texts("loss.denominator"):
            bad = next((c for c in text if c not in ids), None)
            if bad is not None:
                raise ValueError(
                    "loss.denominator: the training transcripts do not fit the vocabulary: "
                    f"character {bad!r} of {text!r} is not in the vocabulary"
                )
            seqs.append([ids[c] for c in text])
        try:
            graph = lgf.denominator_graph(
                seqs, len(context.chars), order=order, topology=topology, prune=prune or None, method=method
            )
            data = lgf.mmi_graph_to_data(graph, info={"topology": topology, "order": order, "prune": prune or 0})
        except ValueError as e:
            raise ValueError(f"loss.denominator: {' '.join(str(e).split())}") from e
        path = context.path("denominator.bin")
        if path is not None:
            from .. import wfst

            wfst.save(str(path), graph)
        config["denominator"] = data
        config["topology"] = topology
        return config

    def __init__(
        self,
        num_classes: Optional[int] = None,
        denominator=None,
        topology: str = "ctc",
        den_scale: float = 1.0,
        leaky_hmm: float = 0.0,
        ctc_weight: float = 0.0,
        warmup_steps: int = 0,
        reduction: str = "mean",
        zero_infinity: bool = True,
        impl: Optional[str] = None,
    ) -> None:
        super().__init__()
        _check_common(reduction, impl)
        if topology not in LFMMI_TOPOLOGIES:
            raise ValueError(
                f"topology must be one of {LFMMI_TOPOLOGIES} (the CTC emission classes, which the CTC decoders "
                f"read), got {topology!r}; the HMM topologies are scored by lightning_gtn.functional.mmi_loss"
            )
        if num_classes is not None:
            num_classes = checks.check_int(num_classes, "num_classes", 2)
        self.num_classes = num_classes
        self.mmi_topology = topology
        self.den_scale = checks.check_real(den_scale, "den_scale", 0.0)
        self.leaky_hmm = checks.check_real(leaky_hmm, "leaky_hmm", 0.0, 1.0, hi_open=True)
        self.ctc_weight = checks.check_real(ctc_weight, "ctc_weight", 0.0, 1.0)
        self.warmup_steps = checks.check_int(warmup_steps, "warmup_steps", 0)
        self.reduction = reduction
        self.zero_infinity = bool(zero_infinity)
        self.impl = impl
        self.step = 0
        built_for = _info(denominator).get("topology", topology)
        if built_for != topology:
            raise ValueError(
                f"denominator: built for topology {built_for!r}, but topology={topology!r} (the numerators and the "
                "denominator need the same topology)"
            )
        self.denominator = _denominator_graph(denominator)
        self._check_denominator_labels()

    def _check_denominator_labels(self) -> None:
        """ValueError unless every denominator label is a class in ``[0, num_classes)``."""
        labels = np.asarray(self.denominator.arrays().ilabel)
        if labels.size == 0:
            raise ValueError("denominator: the graph has no arcs")
        low, high = int(labels.min()), int(labels.max())
        if low < 0:
            raise ValueError(f"denominator: every arc must consume a frame (labels >= 0), got label {low}")
        if self.num_classes is not None and high >= self.num_classes:
            raise ValueError(
                f"denominator: labels must be classes in [0, num_classes={self.num_classes}), got label {high} "
                "(was it built for another vocabulary?)"
            )

    @property
    def topology(self) -> str:
        """``"ctc"``: the emissions decode as CTC's."""
        return "ctc"

    def set_step(self, step: int) -> None:
        """Sets :attr:`step`, the training step the warm-up reads."""
        self.step = checks.check_int(step, "step", 0)

    @property
    def warming_up(self) -> bool:
        """Whether the loss at :attr:`step` is the CTC warm-up alone."""
        return self.step < self.warmup_steps

    def _ctc(self, log_probs, targets, input_lengths, target_lengths):
        return lgf.ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            0,
            self.reduction,
            self.zero_infinity,
            impl=self.impl,
        )

    def _mmi(self, log_probs, targets, input_lengths, target_lengths):
        if (
            self.num_classes is not None
            and getattr(log_probs, "ndim", 0) == 3
            and log_probs.shape[-1] != self.num_classes
        ):
            raise ValueError(
                f"log_probs: expected (B, T, C={self.num_classes}) (num_classes), got {tuple(log_probs.shape)}"
            )
        return lgf.mmi_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            denominator=self.denominator,
            topology=self.mmi_topology,
            den_scale=self.den_scale,
            leaky_hmm=self.leaky_hmm,
            reduction=self.reduction,
            zero_infinity=self.zero_infinity,
            impl=self.impl,
        )

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        """The loss of ``log_probs`` ``(B, T, C)`` at :attr:`step`: a scalar, or ``(B,)`` with
        ``reduction="none"``."""
        if self.warming_up or self.ctc_weight == 1.0:
            return self._ctc(log_probs, targets, input_lengths, target_lengths)
        mmi = self._mmi(log_probs, targets, input_lengths, target_lengths)
        if self.ctc_weight == 0.0:
            return mmi
        ctc = self._ctc(log_probs, targets, input_lengths, target_lengths)
        return self.ctc_weight * ctc + (1.0 - self.ctc_weight) * mmi

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return (
            f"num_classes={self.num_classes}, topology={self.mmi_topology!r}, "
            f"denominator=<{self.denominator.num_nodes()} nodes, {self.denominator.num_arcs()} arcs>, "
            f"den_scale={self.den_scale}, leaky_hmm={self.leaky_hmm}, ctc_weight={self.ctc_weight}, "
            f"warmup_steps={self.warmup_steps}, reduction={self.reduction!r}"
        )
