"""``lightning_gtn.k2``: k2's RNN-T API with k2's names, so icefall's loss code runs with
``import lightning_gtn.k2 as k2``.

The functions are those of ``k2/python/k2/rnnt_loss.py`` and ``mutual_information.py``, computed
by this library (numba on the CPU, torch on other devices); shapes, arguments and what changes
beyond k2 (checked arguments, no ``inf`` where k2 users met it) are in ``docs/k2.md`` and
:mod:`lightning_gtn.losses.k2_rnnt`.
"""

from ..losses.k2_rnnt import (
    RNNT_TYPES,
    do_rnnt_pruning,
    fix_for_boundary,
    get_hat_logprobs_pruned,
    get_rnnt_logprobs,
    get_rnnt_logprobs_joint,
    get_rnnt_logprobs_pruned,
    get_rnnt_logprobs_smoothed,
    get_rnnt_prune_ranges,
    get_rnnt_prune_ranges_deprecated,
    joint_mutual_information_recursion,
    mutual_information_recursion,
    rnnt_loss,
    rnnt_loss_pruned,
    rnnt_loss_simple,
    rnnt_loss_smoothed,
)

__all__ = [
    "RNNT_TYPES",
    "mutual_information_recursion",
    "joint_mutual_information_recursion",
    "fix_for_boundary",
    "get_rnnt_logprobs",
    "rnnt_loss_simple",
    "get_rnnt_logprobs_joint",
    "rnnt_loss",
    "get_rnnt_prune_ranges",
    "get_rnnt_prune_ranges_deprecated",
    "do_rnnt_pruning",
    "get_rnnt_logprobs_pruned",
    "get_hat_logprobs_pruned",
    "rnnt_loss_pruned",
    "get_rnnt_logprobs_smoothed",
    "rnnt_loss_smoothed",
]
