"""``lightning_gtn.nn``: thin ``nn.Module`` wrappers over :mod:`lightning_gtn.functional`."""

from .conv_transduce import ConvTransduce1D
from .linear import Linear
from .losses import (
    TOPOLOGIES,
    ASGLoss,
    CTCLoss,
    GraphLoss,
    ModuleLoss,
    SequenceLoss,
    STCLoss,
    StructuredLoss,
    TargetGraphLoss,
)
from .mmi import LFMMILoss
from .pruned import PrunedRNNTLoss
from .rnnt import RNNTLoss, RNNTStructuredLoss
from .rnnt_variants import MultiBlankRNNTLoss, TDTLoss
from .transducer import TransducerLoss

__all__ = [
    "TOPOLOGIES",
    "StructuredLoss",
    "CTCLoss",
    "ASGLoss",
    "SequenceLoss",
    "STCLoss",
    "GraphLoss",
    "TargetGraphLoss",
    "ModuleLoss",
    "TransducerLoss",
    "RNNTStructuredLoss",
    "RNNTLoss",
    "MultiBlankRNNTLoss",
    "TDTLoss",
    "PrunedRNNTLoss",
    "LFMMILoss",
    "Linear",
    "ConvTransduce1D",
]
