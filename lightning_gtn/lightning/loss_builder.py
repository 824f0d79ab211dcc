"""Building the loss of a LightningModule from a name, a config or a module.

The Lightning layer never touches graphs and never guesses: every loss is a
:class:`lightning_gtn.nn.StructuredLoss`, called as ``loss(emissions (B, T, C), targets (B, S),
input_lengths (B,), target_lengths (B,))``, which declares its token convention (``blank``: the
blank's id or None; ``repeat_label``; ``target_classes``; ``num_classes``; ...) and decodes its own
emissions (``best_paths``). Only those declarations are read here, never a loss's signature or
other attributes. A loss is given as

* a loss name: the name of a packaged config ``conf/loss/<name>.yaml`` (``"ctc"``, ``"asg"``,
  ``"rnnt"``, ``"pruned_rnnt"``, ...; :func:`loss_names`), built from that config as below,
* a config mapping with ``_target_`` naming a loss class (what ``conf/loss/*.yaml`` holds);
  the arguments the class declares in ``vocabulary_arguments`` (``num_classes``,
  ``graphemes_to_idx``, ...) are filled in from the characters. It may only name registered types of
  :mod:`lightning_gtn.trust` (a registered loss, a registered ``builder``) with plain-data
  arguments, checked before anything is called; a transducer's ``transitions`` is a graph as
  data (:func:`lightning_gtn.nn.transducer.transitions_to_data`), never a file path unless the
  user trusts that exact path (``lightning_gtn.trust.trusted(paths=[path])``),
* or an ``nn.Module`` instance: a ``StructuredLoss`` as is, any other module wrapped in
  :class:`lightning_gtn.nn.ModuleLoss` with the ``blank`` / ``repeat_label`` you pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import nn

from lightning_gtn import trust
from lightning_gtn.nn import ModuleLoss, Preparation, StructuredLoss, TargetGraphLoss

from .vocabulary import Vocabulary

__all__ = [
    "build_loss",
    "prepare_loss",
    "loss_class",
    "BUILTIN_LOSSES",
    "LOSS_CONFIG_DIR",
    "loss_config",
    "loss_names",
    "TargetGraphLoss",
]

#: The folder of the packaged loss configs (``conf/loss/*.yaml``): each file's name is a loss name.
LOSS_CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf" / "loss"


def loss_names() -> list[str]:
    """The names :func:`build_loss` accepts: one per packaged config ``conf/loss/<name>.yaml``."""
    return sorted(p.stem for p in LOSS_CONFIG_DIR.glob("*.yaml"))


def loss_config(name: str) -> dict:
    """The packaged config of loss ``name`` as a plain dict, without its Hydra ``defaults`` list
    (which picks the CLI's model: not part of the loss).

    Raises:
        ValueError: ``name`` is not one of :func:`loss_names`.
    """
    from omegaconf import OmegaConf

    names = loss_names()
    if name not in names:
        raise ValueError(f"loss: unknown name {name!r}; choose from {names}")
    cfg = OmegaConf.to_container(OmegaConf.load(LOSS_CONFIG_DIR / f"{name}.yaml"), resolve=True)
    assert isinstance(cfg, dict)
    cfg.pop("defaults", None)
    return cfg


class _BuiltinLosses(Mapping):
    """``name -> the _target_ of conf/loss/<name>.yaml``, read when asked."""

    def __getitem__(self, name):
        if name not in loss_names():
            raise KeyError(name)
        return loss_config(name)["_target_"]

    def __iter__(self):
        return iter(loss_names())

    def __len__(self):
        return len(loss_names())


#: Loss names and the loss classes their packaged configs name.
BUILTIN_LOSSES: Mapping[str, str] = _BuiltinLosses()

# configs written before the loss classes moved or stated their own convention
_MOVED = {
    "lightning_gtn.lightning.TargetGraphLoss": "lightning_gtn.nn.TargetGraphLoss",
    "lightning_gtn.lightning.losses.TargetGraphLoss": "lightning_gtn.nn.TargetGraphLoss",
}


def _import(path) -> type:
    return trust.resolve(path, "loss._target_", kinds=("loss",))


def loss_class(config) -> type[StructuredLoss] | None:
    """The :class:`~lightning_gtn.nn.StructuredLoss` class a loss config's ``_target_`` names (a
    registered type, or one the caller trusts), or None (a constructor function, a name that is
    not a loss class or cannot be resolved: building it reports why)."""
    if not isinstance(config, Mapping) or not isinstance(config.get("_target_"), str):
        return None
    try:
        cls = _import(_MOVED.get(config["_target_"], config["_target_"]))
    except Exception:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, StructuredLoss) else None


def prepare_loss(config: Mapping, context: Preparation) -> dict:
    """``config`` (a loss config mapping) after its class's :meth:`~lightning_gtn.nn.StructuredLoss.prepare`:
    what it learns from the data (``context``) turned into plain data. Configs of anything else
    are returned as they are.

    Raises:
        ValueError: naming the ``loss.<key>`` at fault.
        lightning_gtn.nn.TextsUnavailable: the preparation needs the training transcripts and
            ``context`` has none.
    """
    cls = loss_class(config)
    return dict(config) if cls is None else dict(cls.prepare(dict(config), context))


def _check_tokens(cfg: dict) -> None:
    """A word-piece *file* named by a config is read only when the user trusts that exact path."""
    t = cfg.get("tokens")
    if isinstance(t, str) and t != "letters" and not trust.is_trusted_path(t):
        raise ValueError(
            f"loss.tokens: expected 'letters' or a list of token spellings, got {t!r} (a word-piece file is "
            "read by lightning-gtn-train, or here inside `with lightning_gtn.trust.trusted(paths=[...])`)"
        )


def _check_transitions(cfg: dict) -> None:
    """A transitions *file* named by a config is read only when the user trusts that exact path
    (checkpoints carry the graph as data; a path in one may have moved or been swapped)."""
    t = cfg.get("transitions")
    if isinstance(t, str) and not trust.is_trusted_path(t):
        raise trust.UntrustedTargetError(
            f"loss.transitions: {t!r} names a file; a config read from a checkpoint carries the transitions "
            "graph as data (lightning_gtn.nn.transducer.transitions_to_data), and files it names are not read "
            "(a checkpoint written by an older lightning_gtn: if you trust that file, load inside "
            f"`with lightning_gtn.trust.trusted(paths=[{t!r}]):` and save the checkpoint again)"
        )


def _fill_graphemes(cfg: dict, chars: list) -> None:
    """Losses over graphemes (the word-piece transducer): ``graphemes_to_idx`` is the
    vocabulary's characters in order, and ``tokens: letters`` means one token per character."""
    if cfg.get("graphemes_to_idx") is None:
        cfg["graphemes_to_idx"] = {c: i for i, c in enumerate(chars)}
    tokens = cfg.get("tokens", "letters")
    if tokens is None or tokens == "letters":
        cfg["tokens"] = list(chars)
    elif isinstance(tokens, str) or not isinstance(tokens, (list, tuple)):
        raise ValueError(
            f"loss.tokens: expected 'letters' or a list of token spellings, got {tokens!r} (a number "
            "of word pieces is resolved by lightning-gtn-train from the training transcripts)"
        )


def _from_config(cfg: dict, chars: list, texts=None) -> StructuredLoss:
    num_chars = len(chars)
    if "_target_" not in cfg:
        raise ValueError(f"loss: config needs a '_target_' naming the loss class, got keys {sorted(cfg)}")
    cfg["_target_"] = _MOVED.get(cfg["_target_"], cfg["_target_"])
    trust.check_config(cfg, "loss", "loss")
    _check_transitions(cfg)
    cls = _import(cfg["_target_"])
    if isinstance(cls, type) and issubclass(cls, StructuredLoss):
        _check_tokens(cfg)
        # what the config learns from the training transcripts (nothing is written: no run folder)
        cfg = dict(cls.prepare(cfg, Preparation(chars, texts)))
    if isinstance(cls, type) and not issubclass(cls, StructuredLoss):
        raise ValueError(_not_structured(f"loss._target_: {cfg['_target_']} names", cls))
    # a class declares the arguments filled from the data; a registered constructor function
    # declares none (it is checked once it has built its loss)
    fills = cls.vocabulary_arguments if isinstance(cls, type) else ()
    old = cfg.pop("vocabulary", None)  # the older way of stating a convention in a config
    if isinstance(old, Mapping):
        if "blank" in fills and "blank" not in cfg:
            cfg["blank"] = 0 if old.get("blank") else None
        if "repeat_label" in fills and "repeat_label" not in cfg:
            cfg["repeat_label"] = bool(old.get("repeat_label", False))
    if "graphemes_to_idx" in fills:
        _fill_graphemes(cfg, chars)
    if "num_classes" in fills and cfg.get("num_classes") is None:
        has_blank = cfg.get("blank", cls.blank) is not None
        cfg["num_classes"] = num_chars + int(has_blank) + int(bool(cfg.get("repeat_label", cls.repeat_label)))
    try:
        module = trust.instantiate(cfg, "loss", "loss")
    except trust.UntrustedTargetError:
        raise
    except Exception as e:
        root = e.__cause__ if e.__cause__ is not None else e
        msg = " ".join(str(root).split())
        raise ValueError(f"loss: cannot build {cfg['_target_']}: {msg}") from e
    if not isinstance(module, StructuredLoss):
        raise ValueError(_not_structured(f"loss._target_: {cfg['_target_']} built", module))
    return module


def _not_structured(what: str, given) -> str:
    kind = f"the class {given.__qualname__}" if isinstance(given, type) else f"a {type(given).__qualname__}"
    return (
        f"{what} {kind}, which is not a lightning_gtn.nn.StructuredLoss (the base that declares the "
        "token convention: blank, repeat_label, target_classes, topology, ...); subclass it, or wrap "
        "your module in lightning_gtn.nn.ModuleLoss(module, blank=..., repeat_label=...)"
    )


def _grapheme_vocabulary(module: StructuredLoss, chars, char_list: list) -> Vocabulary:
    """The vocabulary of a loss whose targets and decoded outputs are graphemes (ids
    ``0 .. target_classes - 1``, no blank) while its emissions have ``num_classes`` columns."""
    if isinstance(chars, Vocabulary):
        if chars.blank or chars.repeat_label:
            raise ValueError(
                f"vocabulary {chars!r} does not match the loss: {type(module).__qualname__} takes "
                "grapheme targets (no blank, no repeat label)"
            )
        vocab = chars
    else:
        vocab = Vocabulary(char_list, blank=False, repeat_label=False)
    if module.target_classes != len(vocab.chars):
        raise ValueError(
            f"loss.graphemes_to_idx: the loss reads {module.target_classes} graphemes but the data "
            f"has {len(vocab.chars)} characters"
        )
    return vocab


def _check_blank(loss: StructuredLoss) -> None:
    if loss.target_classes is not None:
        return  # the blank is an emission class of the loss, not a vocabulary id
    if loss.blank is not None and loss.blank != 0:
        raise ValueError(
            f"loss.blank: the loss uses blank id {loss.blank} but the vocabulary puts the blank "
            "at id 0; remove the override or set loss.blank=0"
        )


def build_loss(
    loss,
    chars: str | Vocabulary,
    blank: bool | None = None,
    repeat_label: bool | None = None,
    texts=None,
) -> tuple[StructuredLoss, Vocabulary]:
    """Builds the loss module and the vocabulary that matches its convention.

    Args:
        loss: a loss name (:func:`loss_names`: the packaged ``conf/loss/<name>.yaml``), a config
            mapping with ``_target_``, or an ``nn.Module``.
        chars: the characters (a string), or a ready :class:`Vocabulary` (checked against the
            loss's convention).
        blank, repeat_label: the convention of an ``nn.Module`` that is not a
            ``StructuredLoss`` (a blank at id 0 or none; a repeat token or not).
        texts: ``texts(key) -> list of str``, the training transcripts a config's preparation
            (:meth:`lightning_gtn.nn.StructuredLoss.prepare`) may learn from, or None.

    Returns:
        ``(loss module, vocabulary)``.
    """
    from omegaconf import DictConfig, OmegaConf

    if isinstance(loss, str):
        loss = loss_config(loss)
    if isinstance(loss, DictConfig):
        loss = OmegaConf.to_container(loss, resolve=True)
    char_list = list(chars.chars) if isinstance(chars, Vocabulary) else list(chars)

    if isinstance(loss, StructuredLoss):
        module = loss
        if (blank is not None and bool(blank) != (loss.blank is not None)) or (
            repeat_label is not None and bool(repeat_label) != loss.repeat_label
        ):
            raise ValueError(
                f"loss: {type(loss).__qualname__} states blank={loss.blank}, repeat_label={loss.repeat_label}, "
                f"which contradicts blank={blank}, repeat_label={repeat_label}; set the convention on the loss "
                "(e.g. TargetGraphLoss(builder, blank=0)) and leave these out"
            )
    elif isinstance(loss, nn.Module):
        if blank is None:
            raise ValueError(
                f"loss: {type(loss).__qualname__} is not a lightning_gtn.nn.StructuredLoss and does not "
                "declare its token convention; pass blank=True|False and repeat_label=True|False (it is "
                "then wrapped in lightning_gtn.nn.ModuleLoss), or subclass lightning_gtn.nn.StructuredLoss"
            )
        module = ModuleLoss(loss, blank=0 if blank else None, repeat_label=bool(repeat_label))
    elif isinstance(loss, Mapping):
        module = _from_config(dict(loss), char_list, texts)
    else:
        raise TypeError(
            f"loss must be a name, a config mapping or an nn.Module (a lightning_gtn.nn.StructuredLoss), "
            f"got {type(loss).__qualname__}: {str(loss)[:80]!r}"
        )
    _check_blank(module)

    if module.target_classes is not None:
        return module, _grapheme_vocabulary(module, chars, char_list)
    conv_blank = module.blank is not None
    if isinstance(chars, Vocabulary):
        vocab = chars
        if vocab.blank != conv_blank or vocab.repeat_label != module.repeat_label:
            raise ValueError(
                f"vocabulary {vocab!r} does not match the loss (blank={module.blank}, "
                f"repeat_label={module.repeat_label}); pass the characters and let build_loss make the vocabulary"
            )
    else:
        vocab = Vocabulary(chars, blank=conv_blank, repeat_label=module.repeat_label)
    n = module.num_classes
    if n is not None and n != vocab.num_classes:
        raise ValueError(f"loss.num_classes: {n} does not match the vocabulary's {vocab.num_classes} classes")
    return module, vocab
