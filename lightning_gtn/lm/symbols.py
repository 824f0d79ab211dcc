"""The vocabulary conventions every n-gram module shares: the special words, the log base, the
highest order and the "never" probability.

Kept apart from :mod:`~lightning_gtn.lm.ngram` (the model) and :mod:`~lightning_gtn.lm.arpa` (the
file format) so that both read them and neither imports the other's module for them.
"""

from __future__ import annotations

import math

__all__ = ["BOS", "EOS", "UNK", "LN10", "MAX_ORDER", "MISSING_LOGP"]

BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"

LN10 = math.log(10.0)
MAX_ORDER = 16
"""Highest n-gram order a model may have."""

#: ln-probability given to a special word (``<s>``, ``</s>``, ``<unk>``) that a model or an
#: ARPA file lacks: log10 -99, SRILM's convention for "never".
MISSING_LOGP = -99.0 * LN10
