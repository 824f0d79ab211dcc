"""``lightning_gtn.functional``: batched structured losses on dense ``(B, T, C)`` emissions.

Every loss builds (and caches) one small criterion graph per target with
:mod:`lightning_gtn.wfst` and scores all examples in one batched forward-backward pass on
the emissions' device. Every loss is called the same way::

    loss(emissions (B, T, C), targets, input_lengths, target_lengths, *, <options>,
         reduction="mean", zero_infinity=False, impl=None)

(``ctc_loss`` keeps torch's positional ``blank, reduction, zero_infinity``). The losses and
:func:`best_paths` are ``torch.library`` custom ops, so they work inside
``torch.compile(..., fullgraph=True)``. See ``docs/losses.md`` for shapes, reductions and
examples.
"""

from ._graphs import (
    all_paths_graph,
    asg_full_graph,
    asg_target_graph,
    clear_cache,
    force_align_graph,
    set_cache_size,
)
from .asg import asg_loss
from .ctc import ctc_loss
from .graph_loss import graph_loss
from .seq import sequence_loss
from .stc import stc_emissions, stc_graph, stc_loss
from .transducer import segment, transducer_loss, transitions_graph
from .viterbi import best_paths, collapse, viterbi

__all__ = [
    "ctc_loss",
    "asg_loss",
    "sequence_loss",
    "stc_loss",
    "stc_graph",
    "stc_emissions",
    "transducer_loss",
    "transitions_graph",
    "segment",
    "graph_loss",
    "viterbi",
    "best_paths",
    "collapse",
    "force_align_graph",
    "all_paths_graph",
    "asg_full_graph",
    "asg_target_graph",
    "clear_cache",
    "set_cache_size",
]
