"""``SequenceModule``: the ready-made LightningModule that ``lightning-gtn-train`` builds.

It is the mixin plus a network built from a config, with every argument stored as plain data in
its hyperparameters, so ``SequenceModule.load_from_checkpoint(path)`` rebuilds it alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
from torch import nn

from lightning_gtn import _trust

from .mixin import StructuredLossMixin

__all__ = ["SequenceModule"]


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
            returns emissions ``(B, T, C)`` and output lengths ``(B,)``.
        loss: a loss name or config (see :func:`lightning_gtn.lightning.build_loss`).
        chars: the vocabulary characters.
        feature_dim: ``F`` of the inputs.
        optimizer, scheduler: configs with ``_target_`` (``_partial_`` implied) or ``None``.
        scheduler_interval: ``"epoch"`` or ``"step"``.
        nonfinite: what a NaN/inf training loss does (see
            :meth:`~lightning_gtn.lightning.StructuredLossMixin.configure_structured_loss`).
        decoder: the decoder of validation/test/predict (``conf/decoder``; greedy by default).

    Every dotted path of ``network``, ``loss``, ``optimizer`` and ``scheduler`` is checked by
    :mod:`lightning_gtn._trust` before anything is imported, so
    ``SequenceModule.load_from_checkpoint(path)`` never calls a function the file names outside
    the allow-list; opt in with ``with lightning_gtn._trust.trusted(["mypkg"]): ...``.
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
            _plain, (network, loss, optimizer, scheduler, nonfinite, decoder))
        self.save_hyperparameters(
            {"network": network, "loss": loss, "chars": chars, "feature_dim": feature_dim,
             "optimizer": optimizer, "scheduler": scheduler, "scheduler_interval": scheduler_interval,
             "nonfinite": nonfinite, "decoder": decoder}
        )
        if not isinstance(network, Mapping) or "_target_" not in network:
            raise ValueError(f"model: expected a config with '_target_', got {network!r}")
        _trust.check_config(network, "model")
        self.configure_structured_loss(loss, chars, optimizer=optimizer, scheduler=scheduler,
                                       scheduler_interval=scheduler_interval, nonfinite=nonfinite,
                                       decoder=decoder)
        from hydra.utils import instantiate

        try:
            self.net: nn.Module = instantiate(
                dict(network), feature_dim=feature_dim, num_classes=self.num_classes
            )
        except Exception as e:
            root = e.__cause__ if e.__cause__ is not None else e
            msg = " ".join(str(root).split())
            raise ValueError(f"model: cannot build {network.get('_target_')}: {msg}") from e

    def forward(self, inputs: torch.Tensor, input_lengths: torch.Tensor):
        return self.net(inputs, input_lengths)
