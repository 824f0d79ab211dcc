"""``SequenceModule``: the ready-made LightningModule that ``lightning-gtn-train`` builds.

It is the mixin plus a network built from a config, with every argument stored as plain data in
its hyperparameters, so ``SequenceModule.load_from_checkpoint(path)`` rebuilds it alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
from torch import nn

from lightning_gtn import trust

from .mixin import StructuredLossMixin, offers_network

__all__ = ["SequenceModule", "check_hyperparameters", "HPARAM_SECTIONS"]

#: hyper-parameter -> (config key in messages, kind of its ``_target_``); the other
#: hyper-parameters must be plain data.
HPARAM_SECTIONS = {
    "network": ("model", "model"),
    "loss": ("loss", "loss"),
    "optimizer": ("optim.optimizer", "optimizer"),
    "scheduler": ("optim.scheduler", "scheduler"),
}


def check_hyperparameters(hparams: Mapping) -> None:
    """Checks a :class:`SequenceModule`'s hyper-parameters (e.g. a checkpoint's) before anything
    is built: ``network``, ``loss``, ``optimizer``, ``scheduler`` may only name registered types of
    their kind with plain-data arguments (see :mod:`lightning_gtn.trust`), everything else must be
    plain data. Built-in loss names (``loss: ctc``) are plain strings.

    Raises:
        lightning_gtn.trust.UntrustedTargetError: naming the key path
            (``optim.scheduler.T_max._target_``).
    """
    from lightning_gtn.lightning.loss_builder import _MOVED

    for name, value in hparams.items():
        key, kind = HPARAM_SECTIONS.get(name, (str(name), None))
        value = _plain(value)
        if name == "loss" and isinstance(value, Mapping) and isinstance(value.get("_target_"), str):
            value = {**value, "_target_": _MOVED.get(value["_target_"], value["_target_"])}
        if name in HPARAM_SECTIONS and isinstance(value, Mapping):
            trust.check_config(value, key, kind)
        elif name in HPARAM_SECTIONS and callable(value) and name != "network":
            continue  # an object given in Python (a factory, a loss module): the caller's own
        elif name == "loss" and isinstance(value, nn.Module):
            continue
        else:
            trust.check_config(value, key, None)


def _plain(x):
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x


class SequenceModule(StructuredLossMixin, L.LightningModule):
    """A network config + a loss config + characters -> a trainable LightningModule.

    Args:
        network: config mapping with ``_target_`` (e.g. ``conf/model/conv_gru.yaml``); it gets
            ``feature_dim`` and ``num_classes`` filled in. Its ``forward(inputs, input_lengths)``
            returns emissions ``(B, T, C)`` and output lengths ``(B,)``. With an RNN-T loss it must
            be a transducer network (``conf/model/transducer.yaml``), which also gets the loss's
            ``extra_outputs``.
        loss: a loss name or config (see :func:`lightning_gtn.lightning.build_loss`).
        chars: the vocabulary characters.
        feature_dim: ``F`` of the inputs.
        optimizer, scheduler: configs with ``_target_`` (``_partial_`` implied) or ``None``.
        scheduler_interval: ``"epoch"`` or ``"step"``.
        nonfinite: what a NaN/inf training loss does (see
            :meth:`~lightning_gtn.lightning.StructuredLossMixin.configure_structured_loss`).
        decoder: the decoder of validation/test/predict (``conf/decoder``; greedy by default).

    ``network``, ``loss``, ``optimizer`` and ``scheduler`` may only name registered types of
    :mod:`lightning_gtn.trust` with plain-data arguments, checked before anything is called
    and built by :func:`lightning_gtn.trust.instantiate`, so
    ``SequenceModule.load_from_checkpoint(path)`` (which reads with ``weights_only=True``) calls
    nothing else the file names; opt in with ``with lightning_gtn.trust.trusted(["mypkg"]): ...``
    or :func:`lightning_gtn.trust.register_type`. Artefacts (word pieces, a transducer's
    transitions graph) are plain data inside ``loss``, so a checkpoint loads from anywhere.
    """

    def __init__(
        self,
        network: Mapping,
        loss,
        chars: str,
        feature_dim: int,
        optimizer: Mapping | None = None,
        scheduler: Mapping | None = None,
        scheduler_interval: str = "epoch",
        nonfinite: Mapping | str | None = None,
        decoder: Mapping | str | None = None,
    ):
        super().__init__()
        network, loss, optimizer, scheduler, nonfinite, decoder = map(
            _plain, (network, loss, optimizer, scheduler, nonfinite, decoder)
        )
        self.save_hyperparameters(
            {
                "network": network,
                "loss": loss,
                "chars": chars,
                "feature_dim": feature_dim,
                "optimizer": optimizer,
                "scheduler": scheduler,
                "scheduler_interval": scheduler_interval,
                "nonfinite": nonfinite,
                "decoder": decoder,
            }
        )
        if not isinstance(network, Mapping) or "_target_" not in network:
            raise ValueError(f"model: expected a config with '_target_', got {network!r}")
        # every section checked before the first call
        check_hyperparameters(dict(self.hparams))
        self.configure_structured_loss(
            loss,
            chars,
            optimizer=optimizer,
            scheduler=scheduler,
            scheduler_interval=scheduler_interval,
            nonfinite=nonfinite,
            decoder=decoder,
        )
        if self._pending_loss is not None:
            # what the loss learns must travel inside the checkpoint: prepared before the module is built
            raise ValueError(
                f"{self._pending_reason}: prepare the loss config first (lightning_gtn.train.prepare_loss, as "
                "lightning-gtn-train does), so that the checkpoint carries what it learns"
            )
        extra = self._check_network(network)
        try:
            self.net: nn.Module = trust.instantiate(
                dict(network), "model", "model", feature_dim=feature_dim, num_classes=self.num_classes, **extra
            )
        except trust.UntrustedTargetError:
            raise
        except Exception as e:
            root = e.__cause__ if e.__cause__ is not None else e
            msg = " ".join(str(root).split())
            raise ValueError(f"model: cannot build {network.get('_target_')}: {msg}") from e

    def _check_network(self, network: Mapping) -> dict:
        """The network class must match the loss (a transducer network for a loss with
        ``network_methods`` and only then); returns the extra constructor arguments the loss declares
        (``network_arguments``: a transducer's ``extra_outputs``)."""
        target = network.get("_target_")
        cls = trust.resolve(target, "model._target_", kinds=("model",))
        offers = offers_network(cls)
        loss = self.structured_loss
        if self.reads_network and not offers:
            raise ValueError(
                f"model: {type(loss).__qualname__} scores a network's outputs (its network_methods: "
                f"{', '.join(loss.network_methods)}) and needs a network that offers them, but model._target_ is "
                f"{target}: add model=transducer (the packaged network of that protocol, lightning_gtn.nn.rnnt)"
            )
        if offers and not self.reads_network:
            raise ValueError(
                f"model: {target} is a transducer network, trained by a loss that scores a network's outputs "
                f"(one with network_methods: loss=rnnt|pruned_rnnt|tdt|multiblank), but the loss is "
                f"{type(loss).__qualname__}, which scores emissions: model=transducer needs an RNN-T loss"
            )
        if not offers:
            return {}
        extra = dict(loss.network_arguments())
        for key, want in extra.items():
            given = network.get(key)
            if given is not None and given != want:
                raise ValueError(
                    f"model.{key}: {given} does not match the loss's {want} (leave it out: it is filled in from "
                    "the loss)"
                )
        return extra

    @classmethod  # the override: weights_only is a bool defaulting to True, not Lightning's Optional
    def load_from_checkpoint(cls, checkpoint_path, *args, weights_only: bool = True, **kwargs):  # type: ignore[override]
        """Lightning's ``load_from_checkpoint``, always with ``weights_only=True`` unless told
        otherwise (Lightning's default is ``False`` for URLs)."""
        # *args are Lightning's positional parameters before weights_only
        return super().load_from_checkpoint(checkpoint_path, *args, weights_only=weights_only, **kwargs)  # type: ignore[misc]

    #: what the inputs of a loaded checkpoint were (its ``feature_settings``: see
    #: :meth:`~lightning_gtn.lightning.LhotseDataModule.feature_settings`), or None
    feature_settings: dict | None = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Stores the training data's feature settings (a data module's ``feature_settings()``:
        filterbank sizes, frame stacking and shift, normalisation) as plain data, so that
        evaluation reads the inputs the network was trained on."""
        trainer = getattr(self, "_trainer", None)
        get = getattr(getattr(trainer, "datamodule", None), "feature_settings", None)
        settings = get() if callable(get) else self.feature_settings
        if settings is not None:
            checkpoint["feature_settings"] = settings

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Reads the checkpoint's feature settings (checked as data)."""
        from .lhotse_data import check_feature_settings

        settings = checkpoint.get("feature_settings")
        self.feature_settings = None if settings is None else check_feature_settings(settings)

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor):
        """The network's ``(emissions (B, T', C), lengths (B,))`` for ``inputs`` ``(B, T, F)`` and
        ``input_lengths`` ``(B,)``."""
        return self.net(inputs, input_lengths)
