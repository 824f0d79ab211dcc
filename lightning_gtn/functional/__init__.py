"""``lightning_gtn.functional``: batched structured losses on dense ``(B, T, C)`` emissions."""

from ._graphs import clear_cache
from .ctc import ctc_loss

__all__ = ["ctc_loss", "clear_cache"]
