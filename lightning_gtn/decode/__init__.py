"""Decoding of dense emissions: greedy, and beam search over T o L o G with a lexicon and n-gram LM.

Engine-level (imports neither Lightning nor the losses). ``BeamSearchDecoder`` composes the
topology (CTC, ASG, word-piece transducer), the :class:`Lexicon` trie and an n-gram LM (the
``lightning_gtn.lm.NGramLM`` contract: back-off arrays) on the fly, in numba; a
:class:`ContextGraph` biases it (and the transducer's beam search) towards given phrases.
``TOPOLOGIES`` is a deprecated name of :data:`DECODER_TOPOLOGIES`.
"""

import warnings

from .beam import BeamSearchDecoder, Hypothesis, check_lm_arrays
from .context_graph import ContextGraph, read_phrases
from .greedy import DECODER_TOPOLOGIES, greedy_decode
from .lexicon import Lexicon
from .timed import greedy_hypotheses

__all__ = [
    "BeamSearchDecoder",
    "ContextGraph",
    "Hypothesis",
    "Lexicon",
    "greedy_decode",
    "greedy_hypotheses",
    "check_lm_arrays",
    "read_phrases",
    "DECODER_TOPOLOGIES",
]

#: deprecated names and the names that replaced them
_DEPRECATED = {"TOPOLOGIES": "DECODER_TOPOLOGIES"}


def __getattr__(name: str):
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        message = f"lightning_gtn.decode.{name} is deprecated, use lightning_gtn.decode.{new}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
