"""``lightning_gtn.lm``: back-off n-gram language models and lexicons, for decoding.

* :class:`NGramLM`: a back-off n-gram model (natural logs) with the scoring interface of the
  decoder (``word_id``, ``start_state``, ``score``, ``final_score``) and its array form
  :class:`LMArrays` (``arrays()``) for compiled loops.
* :meth:`NGramLM.from_arpa` / :meth:`NGramLM.to_arpa`: ARPA files (untrusted input checked).
* :func:`estimate`: interpolated modified Kneser-Ney or Witten-Bell from text;
  :func:`perplexity`.
* :func:`read_lexicon`: Kaldi-style lexicons (word followed by its tokens).

The console script ``lightning-gtn-lm`` (:mod:`lightning_gtn.lm.cli`) estimates an ARPA file
from a text file.
"""

from .estimate import estimate, kn_discounts, perplexity
from .lexicon import read_lexicon
from .ngram import LMArrays, NGramLM, check_arrays, read_arpa, write_arpa
from .symbols import BOS, EOS, UNK

__all__ = [
    "NGramLM",
    "LMArrays",
    "check_arrays",
    "BOS",
    "EOS",
    "UNK",
    "estimate",
    "kn_discounts",
    "perplexity",
    "read_arpa",
    "write_arpa",
    "read_lexicon",
]
