"""The thin adapter between the Lightning layer and the loss modules of :mod:`lightning_gtn.nn`.

The Lightning layer never touches graphs. It needs three things from a loss, which
:class:`LossAdapter` provides: the loss value for a padded batch, the vocabulary convention
(blank or not, repeat token or not), and Viterbi decoding of emissions into label paths.

A loss is given as

* a name of a built-in loss (``"ctc"``, ``"asg"``, ``"seq"``),
* a config mapping with ``_target_`` naming an ``nn.Module`` class (what ``conf/loss/*.yaml``
  holds); the optional key ``vocabulary`` (``{blank: bool, repeat_label: bool}``) states the
  convention for classes the adapter does not know and is not passed to the class; ``num_classes``
  is filled in when the class accepts it;
* or an ``nn.Module`` instance (then pass ``blank`` / ``repeat_label`` to :func:`build_loss`).

Every loss module is called as ``module(emissions (B, T, C), targets (B, S), input_lengths (B,),
target_lengths (B,))`` and returns a scalar.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from lightning_gtn import functional as LF

from .vocabulary import Vocabulary

__all__ = ["LossAdapter", "LossConvention", "TargetGraphLoss", "build_loss", "BUILTIN_LOSSES"]

#: Built-in loss names and their module classes.
BUILTIN_LOSSES = {
    "ctc": "lightning_gtn.nn.CTCLoss",
    "asg": "lightning_gtn.nn.ASGLoss",
    "seq": "lightning_gtn.nn.SequenceLoss",
    "graph": "lightning_gtn.lightning.losses.TargetGraphLoss",
}


@dataclass(frozen=True)
class LossConvention:
    """How targets are encoded for a loss: a blank at id 0, or a repeat token."""

    blank: bool
    repeat_label: bool = False


# Known classes by name (so that user subclasses inherit the convention through the MRO).
_CONVENTIONS = {
    "CTCLoss": LossConvention(blank=True),
    "ASGLoss": LossConvention(blank=False, repeat_label=True),
    "SequenceLoss": LossConvention(blank=False, repeat_label=True),
}


def _convention_of(cls: type, override: Mapping | None) -> LossConvention:
    if override is not None:
        return LossConvention(bool(override.get("blank", False)), bool(override.get("repeat_label", False)))
    conv = getattr(cls, "token_convention", None)
    if isinstance(conv, LossConvention):
        return conv
    for klass in cls.__mro__:
        if klass.__name__ in _CONVENTIONS:
            return _CONVENTIONS[klass.__name__]
    raise ValueError(
        f"loss: do not know whether {cls.__module__}.{cls.__qualname__} uses a blank; add "
        "'vocabulary: {blank: true|false, repeat_label: true|false}' to the loss config"
    )


def _import(path: str) -> type:
    from hydra.utils import get_class

    try:
        return get_class(path)
    except Exception as e:  # hydra raises ImportError / ValueError variants
        msg = " ".join(str(e).split())
        raise ValueError(f"loss._target_: cannot import {path!r} ({msg})") from e


class LossAdapter(nn.Module):
    """Wraps a loss module; its parameters (e.g. ASG transitions) become the model's parameters.

    Args:
        module: the loss ``nn.Module`` (called as described in the module docstring).
        convention: the target convention of that loss.
    """

    def __init__(self, module: nn.Module, convention: LossConvention):
        super().__init__()
        self.module = module
        self.convention = convention

    def forward(self, emissions, input_lengths, targets, target_lengths) -> torch.Tensor:
        """Loss of a padded batch.

        Args:
            emissions: ``(B, T, C)`` on any device; low-precision inputs are scored in float32.
            input_lengths: ``(B,)`` int64 valid frames per example.
            targets: ``(B, S)`` int64 padded target ids; target_lengths ``(B,)`` int64.
        """
        if emissions.dtype in (torch.float16, torch.bfloat16):
            emissions = emissions.float()
        return self.module(emissions, targets, input_lengths, target_lengths)

    def transitions(self) -> torch.Tensor | None:
        """The loss's transition scores if it has any (used by Viterbi decoding)."""
        t = getattr(self.module, "transitions", None)
        return t if isinstance(t, torch.Tensor) else None

    @torch.no_grad()
    def viterbi_paths(self, emissions: torch.Tensor, input_lengths: torch.Tensor) -> list[list[int]]:
        """Best frame-level label path per example (lists of length ``input_lengths[b]``)."""
        blank = 0 if self.convention.blank else None
        _, paths = LF.viterbi(emissions.detach(), input_lengths, blank=blank,
                              transitions=self.transitions(), return_paths=True)
        return [[int(x) for x in p] for p in paths]


def build_loss(
    loss,
    chars: str | Vocabulary,
    blank: bool | None = None,
    repeat_label: bool | None = None,
) -> tuple[LossAdapter, Vocabulary]:
    """Builds the loss adapter and the vocabulary that matches the loss's convention.

    Args:
        loss: a built-in name, a config mapping with ``_target_``, or an ``nn.Module``.
        chars: the characters (a string), or a ready :class:`Vocabulary` (used as is).
        blank, repeat_label: the convention of an ``nn.Module`` instance the adapter does not know.

    Returns:
        ``(adapter, vocabulary)``.
    """
    from hydra.utils import instantiate
    from omegaconf import DictConfig, OmegaConf

    if isinstance(loss, str):
        if loss not in BUILTIN_LOSSES:
            raise ValueError(f"loss: unknown name {loss!r}; choose from {sorted(BUILTIN_LOSSES)}")
        loss = {"_target_": BUILTIN_LOSSES[loss]}
    if isinstance(loss, DictConfig):
        loss = OmegaConf.to_container(loss, resolve=True)
    override = {"blank": blank, "repeat_label": repeat_label} if blank is not None else None

    if isinstance(loss, nn.Module):
        conv = _convention_of(type(loss), override)
        module = loss
    elif isinstance(loss, Mapping):
        cfg = dict(loss)
        if "_target_" not in cfg:
            raise ValueError(f"loss: config needs a '_target_' naming the loss class, got keys {sorted(cfg)}")
        cfg_override = cfg.pop("vocabulary", None)
        cls = _import(cfg["_target_"])
        conv = _convention_of(cls, cfg_override if cfg_override is not None else override)
        module = None
    else:
        raise TypeError(f"loss must be a name, a config mapping or an nn.Module, got {type(loss)}")

    if isinstance(chars, Vocabulary):
        vocab = chars
        if vocab.blank != conv.blank or vocab.repeat_label != conv.repeat_label:
            raise ValueError(
                f"vocabulary {vocab!r} does not match the loss convention {conv} "
                "(pass the characters instead and let build_loss make the vocabulary)"
            )
    else:
        vocab = Vocabulary(chars, blank=conv.blank, repeat_label=conv.repeat_label)

    if module is None:
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            params = {}
        if "num_classes" in params and "num_classes" not in cfg:
            cfg["num_classes"] = vocab.num_classes
        try:
            module = instantiate(cfg)
        except Exception as e:
            root = e.__cause__ if e.__cause__ is not None else e
            msg = " ".join(str(root).split())
            raise ValueError(f"loss: cannot build {cfg['_target_']} from {cfg}: {msg}") from e
    return LossAdapter(module, conv), vocab


class TargetGraphLoss(nn.Module):
    """A criterion graph per target from a builder function, scored by
    :class:`lightning_gtn.nn.GraphLoss`: the way to train with your own criterion graphs.

    ``builder(target_ids, **builder_kwargs)`` returns a :class:`lightning_gtn.wfst.Graph`
    acceptor over the emission classes (e.g. :func:`lightning_gtn.wfst.criterion.ctc_graph`);
    graphs are cached per target. The loss of example ``b`` is ``-forward_score(graph_b o E_b)``,
    plus the forward score of all label paths when ``normalize=True`` (for unnormalised emissions
    or criteria that are not distributions), divided by the target length for ``"mean"``.

    Args:
        builder: the function, or its dotted import path (what a config gives).
        builder_kwargs: extra keyword arguments of the builder.
        normalize: add the all-paths forward score (needs ``num_classes``).
        num_classes: ``C`` (filled in by :func:`build_loss`).
        reduction: ``"mean"`` (per-token, then batch average), ``"sum"`` or ``"none"``.
        zero_infinity: targets with no path give 0.
        cache_size: at most this many cached graphs.

    Shapes:
        emissions ``(B, T, C)``, targets ``(B, S)`` padded, input_lengths and target_lengths ``(B,)``.
    """

    def __init__(
        self,
        builder,
        builder_kwargs: Mapping | None = None,
        normalize: bool = False,
        num_classes: int | None = None,
        reduction: str = "mean",
        zero_infinity: bool = True,
        cache_size: int = 100_000,
    ):
        super().__init__()
        from lightning_gtn.nn import GraphLoss

        if isinstance(builder, str):
            from hydra.utils import get_method

            try:
                builder = get_method(builder)
            except Exception as e:
                raise ValueError(f"loss.builder: cannot import {builder!r}: {' '.join(str(e).split())}") from e
        if not callable(builder):
            raise ValueError(f"loss.builder must be callable, got {builder!r}")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"loss.reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if normalize and num_classes is None:
            raise ValueError("loss.normalize needs num_classes")
        self.builder = builder
        self.builder_kwargs = dict(builder_kwargs or {})
        self.normalize = normalize
        self.num_classes = num_classes
        self.reduction = reduction
        self.cache_size = cache_size
        self._graphs: dict = {}
        self._denominator = None
        self.graph_loss = GraphLoss(reduction="none", zero_infinity=zero_infinity)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_graphs"] = {}  # rebuilt on demand (keeps checkpoints and spawned copies small)
        state["_denominator"] = None
        return state

    def graph(self, target: tuple):
        g = self._graphs.get(target)
        if g is None:
            if len(self._graphs) >= self.cache_size:
                self._graphs.clear()
            g = self._graphs[target] = self.builder(list(target), **self.builder_kwargs)
        return g

    def forward(self, emissions, targets, input_lengths, target_lengths):
        tl = target_lengths.tolist()
        rows = targets.tolist()
        graphs = [self.graph(tuple(rows[b][: tl[b]])) for b in range(len(tl))]
        dens = None
        if self.normalize:
            if self._denominator is None:
                from lightning_gtn.functional import all_paths_graph

                self._denominator = all_paths_graph(self.num_classes)
            dens = [self._denominator] * len(graphs)
        losses = self.graph_loss(emissions, graphs, input_lengths, denominators=dens)
        if self.reduction == "none":
            return losses
        if self.reduction == "sum":
            return losses.sum()
        return (losses / target_lengths.to(losses.device, losses.dtype).clamp(min=1)).mean()
