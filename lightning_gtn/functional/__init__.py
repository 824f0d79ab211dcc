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

:func:`forced_align` aligns known transcripts to emissions (one batched Viterbi with
backpointers over the same cached graphs; token spans, scores, confidences, an optional star for
untranscribed stretches), with :func:`word_spans`, :func:`to_json`, :func:`to_ctm` and
:func:`plot_alignment` for its output; see ``docs/alignment.md``. Transducer (RNN-T) networks
decode with :func:`modified_beam_search` (optionally fused with a :class:`TokenLM`) and align
with :func:`rnnt_forced_align` / :func:`rnnt_align` (TDT and multi-blank: :func:`tdt_forced_align`,
:func:`multiblank_forced_align`); see ``docs/rnnt_decoding.md``.
"""

from ..align.forced import (
    Alignment,
    forced_align,
    hypotheses_alignment,
    to_ctm,
    to_json,
    to_records,
    word_spans,
)
from ..align.plot import plot_alignment
from ..align.rnnt import DurationAlignment, multiblank_forced_align, rnnt_align, rnnt_forced_align, tdt_forced_align
from ..align.rnnt_plot import plot_rnnt_alignment
from ..core.criterion_graphs import (
    all_paths_graph,
    asg_full_graph,
    asg_target_graph,
    clear_cache,
    force_align_graph,
    set_cache_size,
)
from ..core.topologies import MMI_TOPOLOGIES, numerator_graph, topology_graph
from ..decode.timed import greedy_search_hypotheses
from ..decode.transducer_beam import TokenLM, modified_beam_search, modified_beam_search_nbest
from ..decode.viterbi import best_paths, collapse, viterbi
from ..lm.denominator import denominator_graph, token_lm_graph
from ..lm.denominator import graph_from_data as mmi_graph_from_data
from ..lm.denominator import graph_to_data as mmi_graph_to_data
from ..lm.mmi_lexicon import lexicon_numerator_graph
from ..losses.asg import asg_loss
from ..losses.conv_transduce import NORMALIZATIONS as NORMALIZATIONS
from ..losses.conv_transduce import SCALES as SCALES
from ..losses.conv_transduce import KernelBank as KernelBank
from ..losses.conv_transduce import conv_transduce1d, kernel_graph
from ..losses.ctc import ctc_loss
from ..losses.graph import TargetGraphCriterion, graph_loss, target_graph_loss
from ..losses.lattice import (
    LatticeCriterion,
    LatticePath,
    frame_lattice,
    lattice_criterion_loss,
    lattice_loss,
    lattice_viterbi,
    pruned_rnnt_lattice,
    rnnt_lattice,
    rnnt_lattice_loss,
)
from ..losses.mmi import mmi_denominator_score, mmi_loss
from ..losses.rnnt import RNNT_IMPLS as RNNT_IMPLS
from ..losses.rnnt import rnnt_loss
from ..losses.rnnt_joiner import multiblank_rnnt_joiner_loss, rnnt_joiner_loss, tdt_joiner_loss
from ..losses.rnnt_variants import multiblank_rnnt_loss, tdt_loss
from ..losses.sequence import sequence_loss
from ..losses.stc import stc_emissions, stc_graph, stc_loss
from ..losses.transducer import (
    full_ngram_transitions,
    segment,
    transducer_best_paths,
    transducer_criterion,
    transducer_loss,
    transitions_graph,
)

__all__ = [
    "ctc_loss",
    "asg_loss",
    "sequence_loss",
    "rnnt_loss",
    "rnnt_joiner_loss",
    "tdt_joiner_loss",
    "multiblank_rnnt_joiner_loss",
    "multiblank_rnnt_loss",
    "tdt_loss",
    "stc_loss",
    "stc_graph",
    "stc_emissions",
    "transducer_loss",
    "transducer_best_paths",
    "transducer_criterion",
    "full_ngram_transitions",
    "transitions_graph",
    "segment",
    "graph_loss",
    "mmi_loss",
    "mmi_denominator_score",
    "target_graph_loss",
    "TargetGraphCriterion",
    "lattice_loss",
    "lattice_viterbi",
    "LatticePath",
    "rnnt_lattice",
    "pruned_rnnt_lattice",
    "frame_lattice",
    "rnnt_lattice_loss",
    "lattice_criterion_loss",
    "LatticeCriterion",
    "viterbi",
    "best_paths",
    "collapse",
    "force_align_graph",
    "all_paths_graph",
    "asg_full_graph",
    "asg_target_graph",
    "conv_transduce1d",
    "kernel_graph",
    "clear_cache",
    "set_cache_size",
    "Alignment",
    "forced_align",
    "word_spans",
    "hypotheses_alignment",
    "to_records",
    "to_json",
    "to_ctm",
    "plot_alignment",
    "rnnt_forced_align",
    "rnnt_align",
    "tdt_forced_align",
    "multiblank_forced_align",
    "DurationAlignment",
    "plot_rnnt_alignment",
    "modified_beam_search",
    "modified_beam_search_nbest",
    "greedy_search_hypotheses",
    "TokenLM",
    "denominator_graph",
    "token_lm_graph",
    "numerator_graph",
    "lexicon_numerator_graph",
    "topology_graph",
    "mmi_graph_to_data",
    "mmi_graph_from_data",
    "MMI_TOPOLOGIES",
]
