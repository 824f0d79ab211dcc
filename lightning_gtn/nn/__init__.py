"""``lightning_gtn.nn``: thin ``nn.Module`` wrappers over :mod:`lightning_gtn.functional`."""

from .conv_transduce import ConvTransduce1D
from .linear import Linear
from .losses import (
    TOPOLOGIES,
    ASGLoss,
    CTCLoss,
    Decoding,
    GraphLoss,
    ModuleLoss,
    Preparation,
    SequenceLoss,
    STCLoss,
    StructuredLoss,
    TargetGraphLoss,
    TextsUnavailable,
)
from .mmi import LFMMILoss
from .pruned import PrunedRNNTLoss
from .rnnt import NETWORK_METHODS, RNNTJoinerLoss, RNNTLoss, RNNTStructuredLoss
from .rnnt_variants import MultiBlankRNNTLoss, TDTLoss
from .transducer import TransducerLoss

__all__ = [
    "TOPOLOGIES",
    "NETWORK_METHODS",
    "StructuredLoss",
    "Preparation",
    "TextsUnavailable",
    "Decoding",
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
    "RNNTJoinerLoss",
    "MultiBlankRNNTLoss",
    "TDTLoss",
    "PrunedRNNTLoss",
    "LFMMILoss",
    "Linear",
    "ConvTransduce1D",
]
