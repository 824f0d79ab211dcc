"""Token vocabulary: characters to label ids, with the blank handling each loss needs.

Two conventions cover the losses of :mod:`lightning_gtn.nn`:

* **blank** losses (CTC): id ``0`` is the blank, characters are ``1..N``. Decoding collapses
  repeated labels and drops blanks, so ``"11"`` is told apart from ``"1"`` by a blank between them.
* **no-blank** losses (ASG, the alignment-free sequence criterion): characters are ``0..N-1``
  and, with ``repeat_label=True``, one extra *repeat* token ``N`` that stands for "the previous
  character again" (wav2letter's replabel with one repetition). Without it a path cannot express
  two equal neighbours, since consecutive equal labels collapse. ``"111"`` is encoded
  ``[1, <rep>, 1]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch

from lightning_gtn.functional import collapse

__all__ = ["Vocabulary", "check_transcript", "MAX_TRANSCRIPT_CHARS"]

#: the longest transcript (characters) a data source may hold: every source (Lhotse manifests,
#: HF datasets, audio folders, feature files) refuses a longer one, naming it
MAX_TRANSCRIPT_CHARS = 100_000
#: characters no transcript may hold: C0/C1 control characters (Unicode category Cc) and lone
#: surrogates (Cs: valid JSON escapes, but not text; fonts, encoders and plots fail on them)
_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def check_transcript(text, what: str, *, max_chars: int | None = None) -> str:
    """Returns ``text`` if it is a transcript a run can train and report on, else raises.

    A transcript is a ``str`` of at most ``max_chars`` characters (default
    :data:`MAX_TRANSCRIPT_CHARS`) without control characters (tabs and newlines included: sources
    that collapse whitespace do so before this check) or lone surrogates.

    Args:
        text: the transcript.
        what: what holds it (the file and line, the cut, the row), for the message.
        max_chars: the length bound.

    Raises:
        ValueError: naming ``what``, the first bad character (as ``U+XXXX``) and its position.

    Example:
        >>> check_transcript("a cat", "cut 'a'")
        'a cat'
    """
    limit = MAX_TRANSCRIPT_CHARS if max_chars is None else max_chars
    if not isinstance(text, str):
        raise ValueError(f"{what}: the transcript must be a string, got {type(text).__name__}")
    if len(text) > limit:
        raise ValueError(f"{what}: the transcript has {len(text)} characters (at most {limit})")
    m = _BAD_CHARS.search(text)
    if m is not None:
        c = m.group()
        kind = "a lone surrogate" if "\ud800" <= c <= "\udfff" else "the control character"
        raise ValueError(
            f"{what}: the transcript holds {kind} U+{ord(c):04X} at position {m.start()} (text must be "
            "printable Unicode: no control characters or unpaired surrogates)"
        )
    return text


class Vocabulary:
    """Maps characters to label ids and back.

    Args:
        chars: the characters, in id order (each a single character, no duplicates).
        blank: reserve id 0 for the blank (CTC-style losses).
        repeat_label: add a repeat token after the characters (only for ``blank=False``).

    Example:
        >>> v = Vocabulary("0123456789 ", blank=True)
        >>> v.encode("10 01")
        [2, 1, 11, 1, 2]
        >>> v.decode_path([0, 2, 2, 0, 1, 1, 11, 1, 0, 2])
        '10 01'
        >>> w = Vocabulary("01", blank=False, repeat_label=True)
        >>> w.encode("0001")
        [0, 2, 0, 1]
        >>> w.decode_tokens([0, 2, 0, 1])
        '0001'
    """

    def __init__(self, chars: Iterable[str], blank: bool = True, repeat_label: bool = False):
        chars = list(chars)
        if len(set(chars)) != len(chars):
            raise ValueError(f"vocabulary chars must be unique, got {chars!r}")
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError(f"vocabulary chars must be single characters, got {chars!r}")
        bad = [c for c in chars if _BAD_CHARS.match(c)]
        if bad:
            raise ValueError(
                f"vocabulary chars must be printable: {bad[0]!r} (U+{ord(bad[0]):04X}) is a control character or "
                "a lone surrogate"
            )
        if blank and repeat_label:
            raise ValueError("repeat_label is for losses without a blank; use blank=False")
        self.chars = chars
        self.blank = bool(blank)
        self.repeat_label = bool(repeat_label)
        self._offset = 1 if self.blank else 0
        self._index = {c: i + self._offset for i, c in enumerate(chars)}

    @property
    def blank_id(self) -> int | None:
        """Id of the blank, or ``None`` for no-blank vocabularies."""
        return 0 if self.blank else None

    @property
    def repeat_id(self) -> int | None:
        """Id of the repeat token, or ``None``."""
        return len(self.chars) if self.repeat_label else None

    @property
    def num_classes(self) -> int:
        """Number of emission classes ``C`` the model must output."""
        return len(self.chars) + int(self.blank) + int(self.repeat_label)

    def __len__(self) -> int:
        return self.num_classes

    def __repr__(self) -> str:
        return f"Vocabulary({''.join(self.chars)!r}, blank={self.blank}, " f"repeat_label={self.repeat_label})"

    def encode(self, text: str) -> list[int]:
        """Text to target ids (no blanks; repeats replaced by the repeat token if enabled).

        Raises:
            ValueError: a character not in the vocabulary.
        """
        ids: list[int] = []
        prev_char = None
        prev_was_rep = False
        for ch in text:
            if ch not in self._index:
                raise ValueError(f"character {ch!r} of {text!r} is not in the vocabulary")
            if self.repeat_label and ch == prev_char and not prev_was_rep:
                ids.append(self.repeat_id)  # type: ignore[arg-type]  # an int with repeat_label
                prev_was_rep = True
            else:
                ids.append(self._index[ch])
                prev_was_rep = False
            prev_char = ch
        return ids

    def decode_tokens(self, ids: Iterable[int]) -> str:
        """Target ids (already collapsed, no blanks) to text; inverse of :meth:`encode`."""
        out: list[str] = []
        for i in ids:
            i = int(i)
            if self.blank and i == 0:
                continue
            if self.repeat_label and i == self.repeat_id:
                if out:
                    out.append(out[-1])
                continue
            k = i - self._offset
            if 0 <= k < len(self.chars):
                out.append(self.chars[k])
        return "".join(out)

    def collapse(self, path: Iterable[int]) -> list[int]:
        """Frame-level label path to tokens: merge consecutive equal labels, drop blanks."""
        return collapse(path, self.blank_id)

    def decode_path(self, path: Iterable[int]) -> str:
        """Frame-level label path (e.g. a Viterbi path) to text."""
        return self.decode_tokens(self.collapse(path))

    def batch_encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts to padded targets ``(B, S)`` int64 (pad value 0) and lengths ``(B,)`` int64."""
        encoded = [self.encode(t) for t in texts]
        lengths = torch.tensor([len(e) for e in encoded], dtype=torch.long)
        width = int(lengths.max()) if len(encoded) else 0
        targets = torch.zeros(len(encoded), max(width, 1), dtype=torch.long)
        for b, e in enumerate(encoded):
            if e:
                targets[b, : len(e)] = torch.tensor(e, dtype=torch.long)
        return targets, lengths

    def to_dict(self) -> dict:
        """Plain-data form (for checkpoints and configs)."""
        return {"chars": "".join(self.chars), "blank": self.blank, "repeat_label": self.repeat_label}

    @classmethod
    def from_dict(cls, d: dict) -> "Vocabulary":
        """The vocabulary saved by :meth:`to_dict`."""
        return cls(d["chars"], blank=d["blank"], repeat_label=d.get("repeat_label", False))
