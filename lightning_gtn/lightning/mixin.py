"""``StructuredLossMixin``: training, evaluation and decoding steps for LightningModules whose
``forward`` returns emissions.

Usage::

    class MyModel(StructuredLossMixin, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = ...
            self.configure_structured_loss("ctc", chars="0123456789 ")

        def forward(self, inputs, input_lengths):
            return emissions, output_lengths   # (B, T, C), (B,)

Batches are dicts with ``inputs`` ``(B, T, F)``, ``input_lengths`` ``(B,)`` and either ``texts``
(list of B strings, encoded by the vocabulary) or ``targets`` ``(B, S)`` and ``target_lengths``
``(B,)`` (plus optional ``texts`` for the metrics). Override :meth:`StructuredLossMixin.unpack_batch` for other
layouts, or any ``*_step``.

A loss that declares ``network_methods`` (:attr:`lightning_gtn.nn.StructuredLoss.network_methods`:
the RNN-T losses) scores a network's outputs, not emissions: its network (``self.net``, or the
module itself) offers those methods (the protocol of :mod:`lightning_gtn.nn.rnnt`); the steps call
its ``encode`` and the loss's ``network_loss``, and decoding follows the loss's
:meth:`~lightning_gtn.nn.StructuredLoss.decoding` (the searches over the network instead of frame
paths). The methods are checked by :meth:`StructuredLossMixin.configure_structured_loss` when the
network is there, else at ``setup``.

A loss config whose preparation (:meth:`lightning_gtn.nn.StructuredLoss.prepare`) learns from the
training transcripts (an LF-MMI denominator recipe, a number of word pieces) is built at ``setup``,
from the training transcripts of the trainer's data module (``train_set.texts``).

Before each training step the loss is given the global step (``set_step``).

A non-finite training loss stops training with :class:`NonFiniteLossError` (naming the global
step and the batch) before the optimizer step, or, with ``nonfinite={"action": "skip",
"max_consecutive": 10}``, skips that batch with a warning and stops after more than
``max_consecutive`` such batches in a row. The loss, optimizer and scheduler configs may only
name registered types of :mod:`lightning_gtn.trust` with plain-data arguments.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torchmetrics import MeanMetric
from torchmetrics.text import CharErrorRate, WordErrorRate

from lightning_gtn import trust
from lightning_gtn.nn import NETWORK_METHODS, StructuredLoss, TextsUnavailable

from .loss_builder import build_loss, loss_class
from .vocabulary import Vocabulary

__all__ = [
    "StructuredLossMixin",
    "NonFiniteLossError",
    "NONFINITE_ACTIONS",
    "NETWORK_METHODS",
    "offers_network",
    "network_methods",
]


def network_methods(loss=None) -> tuple[str, ...]:
    """The methods a loss's network needs: :data:`NETWORK_METHODS` (the methods of any such
    network) and the ``network_methods`` the loss declares."""
    own = tuple(loss.network_methods) if loss is not None else ()
    return NETWORK_METHODS + tuple(m for m in own if m not in NETWORK_METHODS)


def _offers(obj, method: str) -> bool:
    """Whether ``obj`` has ``method`` of its own (the mixin's ``encode`` calls the network's)."""
    own = getattr(obj, method, None)
    if not callable(own):
        return False
    cls = obj if isinstance(obj, type) else type(obj)
    inherited = getattr(StructuredLossMixin, method, None)
    return not issubclass(cls, StructuredLossMixin) or getattr(cls, method) is not inherited


def offers_network(obj, loss=None) -> bool:
    """Whether ``obj`` (a network or its class) offers every method of :func:`network_methods`
    (of ``loss`` when given)."""
    return all(_offers(obj, m) for m in network_methods(loss))


#: What a non-finite training loss does: stop with an error, or skip the batch.
NONFINITE_ACTIONS = ("error", "skip")


class NonFiniteLossError(RuntimeError):
    """The training loss was NaN or infinite; the message names the global step and the batch.

    Attributes:
        global_step, batch_idx, epoch: where it happened.
    """

    def __init__(self, msg: str, global_step: int, batch_idx: int, epoch: int):
        super().__init__(msg)
        self.global_step, self.batch_idx, self.epoch = global_step, batch_idx, epoch


def _network_loss_names() -> str:
    """The packaged loss configs whose loss declares ``network_methods`` (how errors name them)."""
    from .loss_builder import loss_config, loss_names

    names = []
    for name in loss_names():
        cls = loss_class(loss_config(name))
        if cls is not None and cls.network_methods:
            names.append(name)
    return ", ".join(names)


def _provisional_vocabulary(loss, chars) -> tuple[Vocabulary, bool]:
    """The vocabulary of a loss config built at setup, from its class's declared convention, and
    whether its classes are the emission classes (not so for a loss whose targets are graphemes and
    whose tokens are learned)."""
    from omegaconf import DictConfig, OmegaConf

    from .loss_builder import loss_config

    if isinstance(loss, str):
        loss = loss_config(loss)
    if isinstance(loss, DictConfig):
        loss = OmegaConf.to_container(loss, resolve=True)
    cls = loss_class(loss)
    graphemes = cls is None or "graphemes_to_idx" in cls.vocabulary_arguments
    if isinstance(chars, Vocabulary):
        return chars, not graphemes
    if cls is None or graphemes:
        return Vocabulary(chars, blank=False, repeat_label=False), False
    blank = loss.get("blank", cls.blank) is not None
    repeat = bool(loss.get("repeat_label", cls.repeat_label))
    return Vocabulary(chars, blank=blank, repeat_label=repeat), True


def _nonfinite_policy(spec) -> tuple[str, int]:
    """``"error"`` / ``"skip"`` / ``{action, max_consecutive}`` / ``None`` -> ``(action, max)``."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(spec, DictConfig):
        spec = OmegaConf.to_container(spec, resolve=True)
    if spec is None:
        spec = {}
    elif isinstance(spec, str):
        spec = {"action": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"nonfinite: expected {{action: error|skip, max_consecutive: N}}, got {spec!r}")
    unknown = sorted(set(spec) - {"action", "max_consecutive"})
    if unknown:
        raise ValueError(f"nonfinite.{unknown[0]}: unknown key (use action and max_consecutive)")
    action = spec.get("action") or "error"
    if action not in NONFINITE_ACTIONS:
        raise ValueError(f"nonfinite.action: must be one of {NONFINITE_ACTIONS}, got {action!r}")
    n = spec.get("max_consecutive", 10)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"nonfinite.max_consecutive: must be an integer >= 0, got {n!r}")
    return action, n


def _as_factory(spec, what: str) -> Callable | None:
    """A Hydra config with ``_partial_: true`` or a callable -> callable; ``None`` -> ``None``."""
    if spec is None or callable(spec):
        return spec
    from omegaconf import DictConfig, OmegaConf

    if isinstance(spec, DictConfig):
        spec = OmegaConf.to_container(spec, resolve=True)
    if not isinstance(spec, Mapping) or "_target_" not in spec:
        raise ValueError(f"{what}: expected a config with '_target_' and '_partial_: true', got {spec!r}")
    kind = "scheduler" if what.endswith("scheduler") else "optimizer"
    trust.check_config(spec, what, kind)
    spec = dict(spec)
    spec.setdefault("_partial_", True)
    try:
        return trust.instantiate(spec, what, kind)
    except trust.UntrustedTargetError:
        raise
    except Exception as e:
        raise ValueError(f"{what}: cannot build {spec.get('_target_')}: {e}") from e


def _multiprocess_summary(trainer) -> str:
    """One line for the start of a multi-process run: the processes split each epoch, so a step
    reads ``world_size`` batches and an epoch has ``1 / world_size`` of one process's steps."""
    n = int(trainer.world_size)
    per_epoch, steps = trainer.num_training_batches, trainer.estimated_stepping_batches
    parts = [f"{n} processes: each optimizer step reads one batch per process ({n} batches)"]
    if per_epoch != float("inf"):
        parts.append(f"an epoch is {int(per_epoch)} steps (one process: {int(per_epoch) * n})")
    if steps != float("inf"):
        parts.append(f"this run trains at most {int(steps)} steps")
    return (
        "; ".join(parts) + f": the samples of a one-process run in 1/{n} of its steps (to train as many "
        f"steps, multiply max_epochs by {n} or set max_steps)"
    )


class StructuredLossMixin:
    """Adds a structured loss, Viterbi decoding, CER/WER and default optimizers to a
    ``LightningModule``. Put it first in the bases: ``class M(StructuredLossMixin, L.LightningModule)``.

    Call :meth:`configure_structured_loss` in ``__init__`` after ``super().__init__()``.

    Logged: ``train/loss`` (per step and epoch), ``val/loss``, ``val/cer``, ``val/wer`` and the
    same under ``test/``. Metrics are torchmetrics states reduced by sum across processes, so
    multi-process validation gives the single-process figures.
    """

    structured_loss: StructuredLoss
    vocabulary: Vocabulary
    # a loss config built at setup (its preparation reads the training transcripts), and whether its
    # vocabulary's classes are the emission classes
    _pending_loss: tuple | None = None
    _pending_classes: bool = True
    _pending_reason: str = ""
    # what the LightningModule this is mixed into provides
    __call__: Callable[..., Any]
    log: Callable[..., None]
    parameters: Callable[..., Iterator[torch.nn.Parameter]]
    global_step: int
    current_epoch: int

    def configure_structured_loss(
        self,
        loss,
        chars: str | Vocabulary,
        optimizer=None,
        scheduler=None,
        scheduler_interval: str = "epoch",
        blank: bool | None = None,
        repeat_label: bool | None = None,
        nonfinite=None,
        decoder=None,
    ) -> None:
        """Sets up the loss, the vocabulary, the metrics and the optimizer factory.

        Args:
            loss: a loss name (any packaged ``conf/loss/<name>.yaml``: ``"ctc"``, ``"asg"``,
                ``"rnnt"``, ``"pruned_rnnt"``, ...), a config mapping with ``_target_`` (as in
                ``conf/loss``), or a :class:`lightning_gtn.nn.StructuredLoss`
                (any other ``nn.Module`` only with ``blank`` and ``repeat_label``, which wrap it
                in :class:`lightning_gtn.nn.ModuleLoss`). The loss's declared convention
                (``blank``, ``repeat_label``, ``target_classes``, ``num_classes``, ``tokens``,
                ``topology``) and its protocol (``prepare``, ``decoding``, ``network_methods``,
                ``network_loss``, ``set_step``) are all this mixin reads of it.
            chars: characters of the vocabulary (a string) or a :class:`Vocabulary` matching
                the loss's convention.
            optimizer: a callable ``params -> Optimizer`` or a config with ``_target_``
                (``_partial_`` is implied); default Adam with lr 3e-3.
            scheduler: a callable ``optimizer -> LRScheduler`` or such a config; optional.
            scheduler_interval: ``"epoch"`` or ``"step"``.
            blank, repeat_label: the convention of a loss module that is not a
                :class:`lightning_gtn.nn.StructuredLoss` (see :func:`build_loss`).
            nonfinite: what a NaN/inf training loss does: ``"error"`` (default: raise
                :class:`NonFiniteLossError`) or ``{"action": "skip", "max_consecutive": 10}``
                (skip the batch with a warning; more than ``max_consecutive`` in a row raise).
            decoder: how validation, test and predict decode: None or ``{"name": "greedy"}``
                (the loss's Viterbi path), ``{"name": "beam", ...}`` or ``{"name": "beam_lm",
                "lexicon": data, "lm": data, ...}`` (files turned into data by
                :func:`lightning_gtn.lightning.decoding.resolve_decoder`; see
                :mod:`lightning_gtn.lightning.decoding`).

        Raises:
            lightning_gtn.trust.UntrustedTargetError: a config names something that is not a
                registered type, or an argument that is not plain data (see
                :mod:`lightning_gtn.trust`).
            ValueError: ``loss.blank`` disagrees with the vocabulary's blank id; ``loss`` is (or a
                config builds) something that is not a ``StructuredLoss``, without a convention; an
                RNN-T loss's network (already set) lacks a method the loss or decoding calls.
            TypeError: ``loss`` is none of a name, a mapping or an ``nn.Module``.
        """
        self._nonfinite_action, self._nonfinite_max = _nonfinite_policy(nonfinite)
        self._nonfinite_run = 0
        self._pending_loss = None
        # build_loss checks every dotted path of a loss config against the allow-list and that
        # the loss's blank is the vocabulary's
        try:
            self.structured_loss, self.vocabulary = build_loss(loss, chars, blank, repeat_label)
        except TextsUnavailable as e:
            # its preparation learns from the training transcripts: built at setup
            self._pending_loss = (loss, chars, blank, repeat_label, decoder)
            self._pending_reason = str(e)
            self.vocabulary, self._pending_classes = _provisional_vocabulary(loss, chars)
        else:
            self._check_loss_network()
            self.configure_decoder(decoder)
        self._optimizer_factory = _as_factory(optimizer, "optim.optimizer")
        self._scheduler_factory = _as_factory(scheduler, "optim.scheduler")
        self._scheduler_interval = scheduler_interval
        self.val_cer, self.val_wer = CharErrorRate(), WordErrorRate()
        self.test_cer, self.test_wer = CharErrorRate(), WordErrorRate()
        self.val_loss_mean, self.test_loss_mean = MeanMetric(), MeanMetric()

    def configure_decoder(self, decoder) -> None:
        """Sets the decoder of validation, test and predict (see ``configure_structured_loss``)."""
        from .decoding import build_decoder

        self.beam_decoder = build_decoder(decoder, self.structured_loss, self.vocabulary)

    def _build_pending_loss(self) -> None:
        """Builds a loss whose preparation reads the training transcripts (those of the trainer's
        data module, set up before this module's ``setup``)."""
        assert self._pending_loss is not None
        loss, chars, blank, repeat_label, decoder = self._pending_loss
        trainer = getattr(self, "_trainer", None)
        data = getattr(trainer, "datamodule", None) if trainer is not None else None
        found = getattr(getattr(data, "train_set", None), "texts", None)

        def texts(key: str) -> list:
            if not found:
                raise ValueError(
                    f"{key}: built from the training transcripts, but the trainer's data module has none "
                    "(datamodule.train_set.texts after its setup)"
                )
            return list(found)

        built, vocabulary = build_loss(loss, chars, blank, repeat_label, texts=texts)
        if vocabulary.num_classes != self.vocabulary.num_classes:
            raise ValueError(
                f"loss: {type(built).__qualname__} has {vocabulary.num_classes} classes once prepared, but "
                f"{self.vocabulary.num_classes} were given out before setup (num_classes)"
            )
        self.structured_loss, self.vocabulary = built, vocabulary
        self._pending_loss = None
        self._check_loss_network()
        self.configure_decoder(decoder)

    @property
    def num_classes(self) -> int:
        """``C``, the emission classes the model must output (the loss's own count when its
        targets are graphemes and its emissions are tokens, as the word-piece transducer's)."""
        if getattr(self, "_pending_loss", None) is not None:
            if not self._pending_classes:
                raise ValueError(
                    "num_classes: the loss learns its tokens from the training transcripts when it is built, at "
                    "setup; its emission classes are known then"
                )
            return self.vocabulary.num_classes
        own = self.structured_loss.num_classes
        if self.structured_loss.target_classes is not None and own is not None:
            return int(own)
        return self.vocabulary.num_classes

    # ------------------------------------------------------------------ hooks
    def setup(self, stage: str) -> None:
        """Resets the metric states in this process, then runs the parent class's ``setup``."""
        # Fresh metric states in every process: with ddp_spawn on a CPU the spawned copies would
        # otherwise start from the parent's (shared-memory) states.
        for m in self._metrics():
            m.reset()
        if getattr(self, "_pending_loss", None) is not None:
            self._build_pending_loss()
        if self.reads_network:
            self.loss_network()  # a network assigned after configure_structured_loss
        parent = getattr(super(), "setup", None)
        if parent is not None:
            parent(stage)

    def on_train_start(self) -> None:
        """With several processes, says (on rank 0) how many optimizer steps the run trains and
        that each reads one batch per process, then runs the parent class's hook."""
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and int(trainer.world_size) > 1:
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(_multiprocess_summary(trainer))
        parent = getattr(super(), "on_train_start", None)
        if parent is not None:
            parent()

    def _metrics(self):
        return [self.val_cer, self.val_wer, self.test_cer, self.test_wer, self.val_loss_mean, self.test_loss_mean]

    # ------------------------------------------------------------------ building blocks
    def unpack_batch(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list | None]:
        """Batch -> ``(inputs, input_lengths, targets, target_lengths, texts)``."""
        if not isinstance(batch, Mapping):
            raise TypeError(
                "StructuredLossMixin expects dict batches with 'inputs', 'input_lengths' and "
                "'texts' or 'targets'/'target_lengths'; override unpack_batch for other layouts"
            )
        inputs, input_lengths = batch["inputs"], batch["input_lengths"]
        texts = batch.get("texts")
        if "targets" in batch:
            targets, target_lengths = batch["targets"], batch["target_lengths"]
        elif texts is not None:
            targets, target_lengths = self.vocabulary.batch_encode(texts)
        else:
            raise KeyError("batch has neither 'targets' nor 'texts'")
        return inputs, input_lengths, targets, target_lengths, texts

    @property
    def reads_network(self) -> bool:
        """Whether the loss scores a network's outputs (it declares ``network_methods``)."""
        return bool(self.structured_loss.network_methods)

    def loss_network(self) -> Any:
        """The network of a loss that declares ``network_methods``: ``self.net`` when it offers the
        methods the loss needs (:func:`network_methods`), else this module itself when it does.

        Raises:
            ValueError: neither does.
        """
        loss = self.structured_loss
        net = getattr(self, "net", None)
        if net is not None and offers_network(net, loss):
            return net
        if offers_network(self, loss):
            return self
        needs = network_methods(loss)
        # name the candidate that comes closest (a module with its own encode, ... and a plain self.net)
        candidates = [c for c in (net, self) if c is not None]
        obj = max(candidates, key=lambda c: sum(_offers(c, m) for m in needs))
        lacks = ", ".join(m for m in needs if not _offers(obj, m))
        where = "self.net" if obj is net else "this module"
        raise ValueError(
            f"loss: {type(loss).__qualname__} is an RNN-T loss: it trains a transducer network, self.net or the "
            f"module itself, offering {', '.join(needs)} (the protocol of lightning_gtn.nn.rnnt; "
            f"lightning_gtn.lightning.TransducerModel is one), but {where} ({type(obj).__qualname__}) lacks {lacks}"
        )

    def _check_loss_network(self) -> None:
        """At construction: the network of a loss with ``network_methods`` offers what the loss and
        decoding call. Checked once ``self.net`` is set or the module defines any of those methods
        itself; a module that assigns ``self.net`` after :meth:`configure_structured_loss` is
        checked at ``setup``."""
        if not self.reads_network:
            return
        needs = network_methods(self.structured_loss)
        if getattr(self, "net", None) is not None or any(_offers(type(self), m) for m in needs):
            self.loss_network()

    def _check_emission_network(self) -> None:
        net = getattr(self, "net", None)
        if net is not None and offers_network(net) and self.reads_network:
            raise ValueError(
                f"model.emissions: the loss {type(self.structured_loss).__qualname__} reads the transducer "
                "network's encoder frames, not emissions: call model.outputs (or model.encode) instead"
            )
        if net is not None and offers_network(net):
            raise ValueError(
                f"model: {type(net).__qualname__} is a transducer network, which the RNN-T losses train "
                f"(the loss names {_network_loss_names()}), but the loss is {type(self.structured_loss).__qualname__} "
                f"(topology {self.structured_loss.topology!r}): pick an RNN-T loss or another model"
            )

    def encode(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A loss with ``network_methods``: its network's ``encode`` -> ``(enc (B, T', J), lengths (B,))``."""
        enc, lengths = self.loss_network().encode(inputs, input_lengths)
        return enc, lengths.to(device=enc.device, dtype=torch.long)

    def outputs(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the loss and the decoder read: the network's frames for a loss with
        ``network_methods`` (:meth:`encode`), else emissions (:meth:`emissions`)."""
        if self.reads_network:
            return self.encode(inputs, input_lengths)
        return self.emissions(inputs, input_lengths)

    def emissions(self, inputs: torch.Tensor, input_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Calls ``self(inputs, input_lengths)``; a bare tensor output means all frames are valid."""
        self._check_emission_network()
        out = self(inputs, input_lengths)
        if isinstance(out, torch.Tensor):
            B, T = out.shape[:2]
            return out, torch.full((B,), T, dtype=torch.long, device=out.device)
        emissions, lengths = out
        if emissions.ndim != 3:
            raise ValueError(f"forward must return emissions (B, T, C), got shape {tuple(emissions.shape)}")
        if emissions.shape[-1] != self.num_classes:
            raise ValueError(
                f"forward returned {emissions.shape[-1]} classes but the vocabulary has "
                f"{self.num_classes} ({self.vocabulary!r})"
            )
        return emissions, lengths.to(device=emissions.device, dtype=torch.long)

    def compute_loss(self, emissions, emission_lengths, targets, target_lengths) -> torch.Tensor:
        """The configured structured loss of a batch (a scalar); for a loss with ``network_methods``
        ``emissions`` are the network's frames (:meth:`outputs`), scored by its ``network_loss``."""
        dev = emissions.device
        targets, target_lengths = targets.to(dev, torch.long), target_lengths.to(dev, torch.long)
        if self.reads_network:
            return self.structured_loss.network_loss(
                self.loss_network(), emissions, emission_lengths, targets, target_lengths
            )
        return self.structured_loss(emissions, targets, emission_lengths, target_lengths)

    def viterbi_paths(self, emissions, emission_lengths) -> list[list[int]]:
        """Best frame-level label path of each example (lists of length ``emission_lengths[b]``),
        as the loss decodes it."""
        with torch.no_grad():
            paths, _ = self.structured_loss.best_paths(emissions.detach(), emission_lengths)
        return [[v for v in row if v >= 0] for row in paths.cpu().tolist()]

    def decode(self, emissions, emission_lengths) -> list[str]:
        """Decoding to strings: the configured beam search, else the loss's Viterbi path; for a
        loss with ``network_methods`` (``emissions`` are then the network's frames) the configured
        search over the network (greedy by default)."""
        if self.reads_network:
            from .decoding import NetworkDecoder

            decoder = getattr(self, "beam_decoder", None)
            if not isinstance(decoder, NetworkDecoder):
                decoder = NetworkDecoder()
            with torch.no_grad():
                ids = decoder.decode(
                    self.loss_network(),
                    emissions.detach(),
                    emission_lengths,
                    self.structured_loss,
                    self.num_classes,
                )
            spell = self.structured_loss.spell  # token ids -> the vocabulary's (word pieces: graphemes)
            return [self.vocabulary.decode_tokens(spell(t)) for t in ids]
        if getattr(self, "beam_decoder", None) is not None:
            from .decoding import decode_texts

            return decode_texts(self.beam_decoder, emissions, emission_lengths)
        if self.structured_loss.target_classes is not None:
            with torch.no_grad():  # the loss decodes to grapheme ids itself
                ids = self.structured_loss.decode(emissions.detach(), emission_lengths)
            return [self.vocabulary.decode_tokens(t) for t in ids]
        return [self.vocabulary.decode_path(p) for p in self.viterbi_paths(emissions, emission_lengths)]

    def decode_hypotheses(self, emissions, emission_lengths) -> tuple[list, list[str]]:
        """The best hypothesis of each example with token and word times and confidences (what
        :func:`lightning_gtn.align.forced.to_ctm` / ``to_json`` write), from the decoder
        :meth:`decode` uses, and the text of each token id; words are split at the space (a
        lexicon decoder's are its words).

        Raises:
            ValueError: the loss declares no decoding convention the timed searches read.
        """
        with torch.no_grad():
            if self.reads_network:
                from .decoding import NetworkDecoder

                decoder = getattr(self, "beam_decoder", None)
                if not isinstance(decoder, NetworkDecoder):
                    decoder = NetworkDecoder()
                texts = self._network_token_texts()
                sep = texts.index(" ") if " " in texts else None
                hyps = decoder.hypotheses(
                    self.loss_network(),
                    emissions.detach(),
                    emission_lengths,
                    self.structured_loss,
                    self.num_classes,
                    word_separator_id=sep,
                )
                return hyps, texts
            if getattr(self, "beam_decoder", None) is not None:
                from .decoding import best_hypotheses

                return best_hypotheses(self.beam_decoder, emissions, emission_lengths), list(self.beam_decoder.tokens)
            from .decoding import greedy_frame_hypotheses

            return greedy_frame_hypotheses(self.structured_loss, self.vocabulary, emissions, emission_lengths)

    def _network_token_texts(self) -> list[str]:
        """The text of each class the network's joiner emits (its token ids, blank ``""``)."""
        loss = self.structured_loss
        V = int(loss.num_classes) if loss.num_classes is not None else int(self.num_classes)
        blank = int(loss.blank or 0)
        return ["" if i == blank else self.vocabulary.decode_tokens(loss.spell([i])) for i in range(V)]

    # ------------------------------------------------------------------ steps
    def training_step(self, batch, batch_idx):
        """The loss of one batch, logged as ``train/loss``.

        Returns:
            the scalar loss, or None (Lightning then skips the step) when it is not finite and
            ``nonfinite`` says to skip.
        """
        inputs, input_lengths, targets, target_lengths, _ = self.unpack_batch(batch)
        # a loss's schedule (a warm-up) follows the global step
        self.structured_loss.set_step(int(self.global_step))
        emissions, lengths = self.outputs(inputs, input_lengths)
        loss = self.compute_loss(emissions, lengths, targets, target_lengths)
        if self._skip_nonfinite(loss, batch_idx):
            return None  # Lightning skips backward and the optimizer step
        self.log(
            "train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=inputs.shape[0], sync_dist=True
        )
        return loss

    def _skip_nonfinite(self, loss: torch.Tensor, batch_idx: int) -> bool:
        """``False`` for a finite loss; ``True`` to skip the batch; raises to stop training.

        Under DDP the decision is reduced over the processes (any non-finite -> all skip or all
        raise), so the ranks stay in step."""
        bad = not bool(torch.isfinite(loss.detach()).all())
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.world_size > 1:
            bad = bool(trainer.strategy.reduce_boolean_decision(bad, all=False))
        if not bad:
            self._nonfinite_run = 0
            return False
        self._nonfinite_run = getattr(self, "_nonfinite_run", 0) + 1
        step, epoch = int(self.global_step), int(self.current_epoch)
        where = f"global step {step} (epoch {epoch}, batch {batch_idx})"
        action = getattr(self, "_nonfinite_action", "error")
        limit = getattr(self, "_nonfinite_max", 10)
        value = float(loss.detach().float().sum()) if loss.numel() else float("nan")
        if action == "error":
            raise NonFiniteLossError(
                f"non-finite training loss {value} at {where}; training stopped before the optimizer "
                "step (lower optim.optimizer.lr, check the data, or set nonfinite.action=skip)",
                step,
                batch_idx,
                epoch,
            )
        if self._nonfinite_run > limit:
            raise NonFiniteLossError(
                f"non-finite training loss {value} at {where}: {self._nonfinite_run} batches in a row "
                f"(nonfinite.max_consecutive={limit}); training stopped",
                step,
                batch_idx,
                epoch,
            )
        warnings.warn(
            f"non-finite training loss {value} at {where}: batch skipped "
            f"({self._nonfinite_run} in a row, at most {limit})",
            RuntimeWarning,
            stacklevel=2,
        )
        return True

    def _eval_step(self, batch, prefix: str):
        inputs, input_lengths, targets, target_lengths, texts = self.unpack_batch(batch)
        emissions, lengths = self.outputs(inputs, input_lengths)
        loss = self.compute_loss(emissions, lengths, targets, target_lengths)
        if texts is None:
            texts = [self.vocabulary.decode_tokens(t[: int(n)].tolist()) for t, n in zip(targets, target_lengths)]
        preds = self.decode(emissions, lengths)
        cer, wer, mean = (
            (self.val_cer, self.val_wer, self.val_loss_mean)
            if prefix == "val"
            else (self.test_cer, self.test_wer, self.test_loss_mean)
        )
        cer.update(preds, texts)
        wer.update(preds, texts)
        mean.update(loss.detach().float(), weight=inputs.shape[0])
        bs = inputs.shape[0]
        self.log(f"{prefix}/loss", mean, on_step=False, on_epoch=True, prog_bar=True, batch_size=bs)
        self.log(f"{prefix}/cer", cer, on_step=False, on_epoch=True, prog_bar=True, batch_size=bs)
        self.log(f"{prefix}/wer", wer, on_step=False, on_epoch=True, batch_size=bs)
        return {"loss": loss.detach(), "preds": preds, "texts": texts}

    def validation_step(self, batch, batch_idx):
        """Loss and error rates of one validation batch (logged as ``val/...``)."""
        return self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx):
        """Loss and error rates of one test batch (logged as ``test/...``)."""
        return self._eval_step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> list[str]:
        """The decoded transcripts of a batch with ``inputs`` ``(B, T, F)`` and ``input_lengths`` ``(B,)``."""
        inputs, input_lengths = batch["inputs"], batch["input_lengths"]
        emissions, lengths = self.outputs(inputs, input_lengths)
        return self.decode(emissions, lengths)

    # ------------------------------------------------------------------ optimizers
    def configure_optimizers(self):
        """The optimizer (Adam, lr 3e-3, unless configured) and, when configured, its scheduler."""
        factory = self._optimizer_factory or (lambda params: torch.optim.Adam(params, lr=3e-3))
        optimizer = factory(self.parameters())
        if self._scheduler_factory is None:
            return optimizer
        scheduler = self._scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self._scheduler_interval, "monitor": "val/loss"},
        }
