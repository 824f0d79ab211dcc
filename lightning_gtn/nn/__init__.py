"""``lightning_gtn.nn``: thin ``nn.Module`` wrappers over :mod:`lightning_gtn.functional`.

``TOPOLOGIES`` is a deprecated name of :data:`LOSS_TOPOLOGIES`.
"""

import warnings

from .conv_transduce import ConvTransduce1D
from .linear import Linear
from .losses import (
    LOSS_TOPOLOGIES,
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
from .rnnt_wordpieces import WordPieceRNNTLoss
from .transducer import TransducerLoss

__all__ = [
    "LOSS_TOPOLOGIES",
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
    "WordPieceRNNTLoss",
    "MultiBlankRNNTLoss",
    "TDTLoss",
    "PrunedRNNTLoss",
    "LFMMILoss",
    "Linear",
    "ConvTransduce1D",
]

#: deprecated names and the names that replaced them
_DEPRECATED = {"TOPOLOGIES": "LOSS_TOPOLOGIES"}


def __getattr__(name: str):
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        message = f"lightning_gtn.nn.{name} is deprecated, use lightning_gtn.nn.{new}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
