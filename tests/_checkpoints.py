"""A Lightning checkpoint of a module written without a Trainer (what the checkpoint tests load back)."""

import lightning as L
import torch


def save_module_checkpoint(model, path, **extra) -> None:
    """Writes ``model``'s state dict and hyperparameters to ``path`` as Lightning lays a checkpoint
    out (epoch and step 0); ``extra`` entries are added to it."""
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "epoch": 0,
            "global_step": 0,
            "pytorch-lightning_version": L.__version__,
            **extra,
        },
        path,
    )
