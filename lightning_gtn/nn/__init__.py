"""``lightning_gtn.nn``: thin ``nn.Module`` wrappers over :mod:`lightning_gtn.functional`."""

from .linear import Linear
from .losses import ASGLoss, CTCLoss, GraphLoss, SequenceLoss

__all__ = ["CTCLoss", "ASGLoss", "SequenceLoss", "GraphLoss", "Linear"]
