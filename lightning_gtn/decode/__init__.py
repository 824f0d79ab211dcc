"""Decoding of dense emissions: greedy, and beam search over T o L o G with a lexicon and n-gram LM.

Engine-level (imports neither Lightning nor the losses). ``BeamSearchDecoder`` composes the
topology (CTC, ASG, word-piece transducer), the :class:`Lexicon` trie and an n-gram LM (the
``lightning_gtn.lm.NGramLM`` contract: back-off arrays) on the fly, in numba.
"""

from .beam import BeamSearchDecoder, Hypothesis, check_lm_arrays
from .greedy import TOPOLOGIES, greedy_decode
from .lexicon import Lexicon

__all__ = ["BeamSearchDecoder", "Hypothesis", "Lexicon", "greedy_decode", "check_lm_arrays", "TOPOLOGIES"]
