"""RNN-T over word pieces: the targets are graphemes, the joiner's classes word pieces.

:class:`WordPieceRNNTLoss` is :class:`~lightning_gtn.nn.RNNTLoss` whose emission classes are the
blank (class 0) and the word pieces ``tokens`` (piece ``k`` is class ``k + 1``), while its targets,
like those of the word-piece transducer (:class:`~lightning_gtn.nn.TransducerLoss`), are the data's
graphemes (``graphemes_to_idx``, no blank): :meth:`~WordPieceRNNTLoss.joint_loss` spells each
target in pieces, longest match first (:func:`lightning_gtn.wordpieces.greedy_segment`), and scores
the pieces; decoding spells the decoded pieces back into graphemes (:meth:`~WordPieceRNNTLoss.spell`).
A large piece set makes the materialised joiner output ``(B, T, U + 1, V)`` large: the chunked joiner
path (``joiner="chunked"``, the default) never holds it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from ..core import checks
from .losses import Preparation, prepare_word_pieces
from .rnnt import RNNTLoss

__all__ = ["WordPieceRNNTLoss", "MAX_TOKENS"]

#: the most word pieces a loss may have (the joiner's classes, less the blank)
MAX_TOKENS = 1 << 20


class WordPieceRNNTLoss(RNNTLoss):
    """RNN-T over word pieces, with grapheme targets.

    Args:
        tokens: the word pieces, distinct non-empty strings of graphemes (after the preparation
            of a config: ``tokens: <N>`` learns N from the training transcripts, ``tokens: <file>``
            reads them, ``tokens: letters`` is one piece per grapheme); every grapheme must be a
            piece of its own, so that every target can be spelled.
        graphemes_to_idx: grapheme -> target id (the data's characters, ids ``0 .. G - 1``; the
            Lightning layer fills it in).
        clamp, reduction, zero_infinity, fastemit_lambda, joiner: as :class:`~lightning_gtn.nn.RNNTLoss`
            (the blank is class 0, the fused log-softmax, the default kernels).

    ``num_classes`` is ``len(tokens) + 1`` and ``target_classes`` is ``G``.

    Shape:
        ``forward(logits (B, T, U + 1, len(tokens) + 1), targets (B, U), ...)`` takes PIECE targets
        (classes ``1 .. len(tokens)``), as :class:`~lightning_gtn.nn.RNNTLoss`;
        :meth:`joint_loss` takes GRAPHEME targets ``(B, S)`` and their lengths.
    """

    vocabulary_arguments: Tuple[str, ...] = ("graphemes_to_idx", "tokens")
    run_files = ("word_pieces.txt",)

    def __init__(
        self,
        tokens: Sequence[str],
        graphemes_to_idx: Dict[str, int],
        clamp: float = -1.0,
        reduction: str = "mean",
        zero_infinity: bool = False,
        fastemit_lambda: float = 0.0,
        joiner: str = "chunked",
    ) -> None:
        super().__init__(
            blank=0,
            clamp=clamp,
            reduction=reduction,
            zero_infinity=zero_infinity,
            fastemit_lambda=fastemit_lambda,
            joiner=joiner,
        )
        if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
            raise ValueError(f"tokens must be a list of word pieces (strings), got {type(tokens).__name__}")
        pieces: List[str] = []
        for k, t in enumerate(tokens):
            if k >= MAX_TOKENS:
                raise ValueError(f"tokens must hold at most MAX_TOKENS={MAX_TOKENS} word pieces, got more")
            if not isinstance(t, str) or not t:
                raise ValueError(f"tokens[{k}] must be a non-empty string, got {t!r}")
            pieces.append(t)
        if len(set(pieces)) != len(pieces):
            raise ValueError("tokens must be distinct word pieces")
        spelled, G = checks.token_ids(pieces, dict(graphemes_to_idx))
        self.graphemes_to_idx = {str(g): int(i) for g, i in graphemes_to_idx.items()}
        if sorted(self.graphemes_to_idx.values()) != list(range(G)):
            raise ValueError(f"graphemes_to_idx must give the ids 0 .. {G - 1} once each")
        missing = sorted(set(self.graphemes_to_idx) - set(pieces))
        if missing:
            raise ValueError(
                f"tokens: every grapheme must be a word piece of its own (so every target can be spelled); "
                f"missing {missing[:5]}"
            )
        self.tokens = pieces
        self._pieces: List[str] = pieces
        self.num_classes = len(pieces) + 1
        self.target_classes = G
        self._graphemes = [""] * G
        for g, i in self.graphemes_to_idx.items():
            self._graphemes[i] = g
        self._spelled: Tuple[Tuple[int, ...], ...] = spelled

    @classmethod
    def prepare(cls, config: Dict[str, Any], context: Preparation) -> Dict[str, Any]:
        """``tokens: <N>`` / ``tokens: <file>`` resolved into the list of pieces (see
        :func:`~lightning_gtn.nn.losses.prepare_word_pieces`; ``<run>/word_pieces.txt``)."""
        return prepare_word_pieces(config, context)

    def piece_targets(self, targets: torch.Tensor, target_lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Grapheme targets ``(B, S)`` and lengths ``(B,)`` -> the piece classes ``(B, U)`` (padded
        with 0) and their lengths ``(B,)``, on the targets' device: each target spelled longest
        piece first."""
        from ..wordpieces import greedy_segment

        if not isinstance(targets, torch.Tensor) or targets.dim() != 2:
            got = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise ValueError(f"targets must have shape (B, S) of grapheme ids, got {got}")
        B, S = targets.shape
        lengths = torch.as_tensor(target_lengths).reshape(-1).to("cpu", torch.int64).tolist()
        if len(lengths) != B or any(n < 0 or n > S for n in lengths):
            raise ValueError(f"target_lengths must be (B,) = ({B},) lengths in [0, {S}], got {lengths[:8]}")
        rows = targets.to("cpu", torch.int64).tolist()
        G = len(self._graphemes)
        out: List[List[int]] = []
        for b, (row, n) in enumerate(zip(rows, lengths)):
            ids = row[:n]
            if any(i < 0 or i >= G for i in ids):
                raise ValueError(f"targets[{b}] holds a grapheme id outside [0, {G}): {ids[:16]}")
            text = "".join(self._graphemes[i] for i in ids)
            out.append([k + 1 for k in greedy_segment(text, self._pieces)])
        U = max((len(r) for r in out), default=0)
        pieces = torch.zeros((B, U), dtype=torch.int64)
        for b, r in enumerate(out):
            pieces[b, : len(r)] = torch.tensor(r, dtype=torch.int64)
        n_out = torch.tensor([len(r) for r in out], dtype=torch.int64)
        return pieces.to(targets.device), n_out.to(targets.device)

    def joint_loss(self, network, encoder_out, encoder_lengths, targets, target_lengths):
        """:meth:`RNNTLoss.joint_loss` of the GRAPHEME targets spelled in pieces (:meth:`piece_targets`)."""
        pieces, lengths = self.piece_targets(targets, target_lengths)
        return super().joint_loss(network, encoder_out, encoder_lengths, pieces, lengths)

    def spell(self, ids: Sequence[int]) -> List[int]:
        """The grapheme ids the decoded piece classes ``ids`` (``1 .. len(tokens)``) spell.

        Raises:
            ValueError: an id that is not a piece class (the blank included).
        """
        out: List[int] = []
        for i in ids:
            i = int(i)
            if not 1 <= i <= len(self._spelled):
                raise ValueError(f"spell: {i} is not a word-piece class (1 .. {len(self._spelled)})")
            out.extend(self._spelled[i - 1])
        return out

    def extra_repr(self) -> str:
        """The options shown by ``repr``."""
        return f"num_tokens={len(self._pieces)}, " + super().extra_repr()
