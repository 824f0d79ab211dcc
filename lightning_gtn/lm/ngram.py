"""The back-off n-gram language model :class:`NGramLM` and its array form :class:`LMArrays`.

An n-gram model of order ``N`` stores, for each explicit n-gram ``h + (w,)`` (``len(h) < N``),
its probability ``ln P(w | h)`` and, for ``n < N``, a back-off weight ``ln bow(h + (w,))``. A word
``w`` after a history ``h`` that has no explicit n-gram ``h + (w,)`` is scored by back-off
(the ARPA semantics)::

    ln P(w | h) = ln bow(h) + ln P(w | h[1:])        (ln bow = 0 for an absent history)

All numbers are NATURAL logs (ARPA files hold log10; :meth:`NGramLM.from_arpa` and
:meth:`NGramLM.to_arpa` convert).

The decoder sees the model as a lazy back-off automaton (:meth:`NGramLM.arrays`): one state per
history that is an explicit n-gram of order ``< N`` (plus the root, the empty history, state 0),
one arc per explicit n-gram, one back-off link per state. Scoring word ``w`` from state ``s``::

    acc = 0
    while s != -1:
        find w in s's arcs -> return acc + arc_logp, arc_next
        acc += backoff_logp[s]; s = backoff_state[s]

The root has an arc for every word except ``<s>``, so the loop ends at the root for every word
but ``<s>`` (whose score is ``-inf``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Optional

import numpy as np

from .arpa import format_arpa, parse_arpa
from .symbols import BOS, EOS, MAX_ORDER, MISSING_LOGP, UNK

__all__ = ["BOS", "EOS", "UNK", "LMArrays", "NGramLM", "check_arrays", "read_arpa", "write_arpa"]


class LMArrays(NamedTuple):
    """An :class:`NGramLM` as flat numpy arrays, for compiled (numba) decoding loops.

    ``S`` states (state 0 is the root, the unigram state), ``A`` arcs. State ``s``'s arcs are
    ``state_offsets[s] : state_offsets[s + 1]``, sorted by ``arc_word`` ascending.

    Attributes:
        state_offsets: ``(S + 1,)`` int64, non-decreasing, ``[0] == 0``, ``[S] == A``.
        arc_word: ``(A,)`` int32 word ids, strictly ascending within each state.
        arc_logp: ``(A,)`` float32 natural-log probability of the arc's word.
        arc_next: ``(A,)`` int32 state reached after the word.
        backoff_logp: ``(S,)`` float32 natural-log back-off weight (0 at the root).
        backoff_state: ``(S,)`` int32 back-off state, ``-1`` at the root only.
        start_state: the state after ``<s>``.
        bos: id of ``<s>``.
        eos: id of ``</s>``.
        unk: id of ``<unk>``.
    """

    state_offsets: np.ndarray
    arc_word: np.ndarray
    arc_logp: np.ndarray
    arc_next: np.ndarray
    backoff_logp: np.ndarray
    backoff_state: np.ndarray
    start_state: int
    bos: int
    eos: int
    unk: int


def check_arrays(a: LMArrays, num_words: int) -> None:
    """Checks every index of an :class:`LMArrays` (dtypes, shapes, ranges, sorting).

    Compiled loops index these arrays without bounds checks, so arrays that come from outside
    data pass this first (:meth:`NGramLM.arrays` calls it).

    Args:
        a: the arrays.
        num_words: the vocabulary size ``V``; word ids must be in ``[0, V)``.

    Raises:
        ValueError: naming the field that is wrong.
    """
    want = {
        "state_offsets": np.int64,
        "arc_word": np.int32,
        "arc_logp": np.float32,
        "arc_next": np.int32,
        "backoff_logp": np.float32,
        "backoff_state": np.int32,
    }
    for name, dtype in want.items():
        x = getattr(a, name)
        if not isinstance(x, np.ndarray) or x.dtype != dtype or x.ndim != 1:
            raise ValueError(f"LMArrays.{name} must be a 1-D {np.dtype(dtype)} array")
    S = a.backoff_logp.shape[0]
    A = a.arc_word.shape[0]
    if S < 1:
        raise ValueError("LMArrays: at least one state (the root) is needed")
    if a.state_offsets.shape[0] != S + 1 or a.backoff_state.shape[0] != S:
        raise ValueError(f"LMArrays.state_offsets must be (S + 1,) and backoff_state (S,), S={S}")
    if a.arc_logp.shape[0] != A or a.arc_next.shape[0] != A:
        raise ValueError(f"LMArrays.arc_logp and arc_next must be (A,), A={A}")
    off = a.state_offsets
    if off[0] != 0 or off[-1] != A or np.any(np.diff(off) < 0):
        raise ValueError("LMArrays.state_offsets must rise from 0 to the number of arcs")
    if A and (a.arc_word.min() < 0 or a.arc_word.max() >= num_words):
        raise ValueError(f"LMArrays.arc_word must be in [0, {num_words})")
    if A and (a.arc_next.min() < 0 or a.arc_next.max() >= S):
        raise ValueError(f"LMArrays.arc_next must be in [0, {S})")
    if A > 1:
        d = np.diff(a.arc_word.astype(np.int64))
        starts = off[1:-1]
        inner = np.ones(A - 1, dtype=bool)
        inner[starts[(starts > 0) & (starts < A)] - 1] = False
        if np.any(d[inner] <= 0):
            raise ValueError("LMArrays.arc_word must be strictly ascending within each state")
    bs = a.backoff_state
    if bs[0] != -1 or (S > 1 and (bs[1:].min() < 0 or bs[1:].max() >= S)):
        raise ValueError("LMArrays.backoff_state must be -1 at the root (0) and in [0, S) elsewhere")
    if S > 1 and np.any(bs[1:] >= np.arange(1, S)):
        # states are numbered by history length, so back-off always goes to a smaller id:
        # this also proves that every back-off chain ends at the root
        raise ValueError("LMArrays.backoff_state[s] must be smaller than s")
    for name in ("start_state", "bos", "eos", "unk"):
        v = getattr(a, name)
        hi = S if name == "start_state" else num_words
        if not isinstance(v, (int, np.integer)) or not 0 <= int(v) < hi:
            raise ValueError(f"LMArrays.{name} must be an int in [0, {hi})")


class NGramLM:
    """A back-off n-gram language model (natural logs), e.g. read from an ARPA file.

    Build one with :func:`~lightning_gtn.lm.estimate`, :meth:`from_arpa` or :meth:`from_ngrams`.

    Attributes:
        order: the highest n-gram order ``N``.
        words: the vocabulary; a word's id is its index. Always contains ``<s>``, ``</s>`` and
            ``<unk>``.

    Example:
        >>> from lightning_gtn.lm import estimate
        >>> lm = estimate(["a b", "a c"], order=2)
        >>> s = lm.start_state()
        >>> logp, s = lm.score(s, lm.word_id("a"))
        >>> round(math.exp(logp), 3) > 0.5
        True
        >>> lm.final_score(s) < 0
        True
    """

    def __init__(self) -> None:  # use the factories
        self.order = 0
        self.words: list[str] = []
        self._ids: dict[str, int] = {}
        # _ngrams[n - 1]: {tuple of n word ids: (ln p, ln bow)}
        self._ngrams: list[dict[tuple, tuple[float, float]]] = []
        self._arrays: Optional[LMArrays] = None

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_ngrams(
        cls,
        ngrams: Sequence[Mapping[tuple, tuple[float, float]]],
        *,
        add_missing: bool = True,
    ) -> "NGramLM":
        """Builds a model from explicit n-grams (natural logs), checked.

        Args:
            ngrams: ``ngrams[n - 1]`` maps an n-tuple of words (str) to ``(ln P, ln bow)``;
                ``bow`` is ignored at the highest order. Orders ``1 .. N`` must all be given.
            add_missing: add what a back-off model needs but the n-grams lack, as KenLM does:
                ``<s>``, ``</s>``, ``<unk>`` unigrams (ln P = log10 -99 in natural log), and
                the history ``h`` of an n-gram ``h + (w,)`` when ``h`` is absent, with the
                probability back-off gives it and ``ln bow = 0``, which leaves every
                distribution unchanged. ``False`` raises instead.

        Raises:
            ValueError: a word of a higher order missing from the unigrams, ``<s>`` anywhere
                but first or ``</s>`` anywhere but last, a non-finite number, a missing
                history or special word when ``add_missing`` is False.
        """
        N = len(ngrams)
        if not 1 <= N <= MAX_ORDER:
            raise ValueError(f"ngrams: order must be in [1, {MAX_ORDER}], got {N}")
        uni = ngrams[0]
        words = [g[0] if isinstance(g, tuple) and len(g) == 1 else g for g in uni]
        for w in words:
            if not isinstance(w, str):
                raise ValueError(f"ngrams[0]: key {w!r} is not a 1-tuple of words")
        for sp in (BOS, EOS, UNK):
            if (sp,) not in uni:
                if not add_missing:
                    raise ValueError(f"ngrams: the unigram {sp!r} is missing")
                words.append(sp)
        ids = {w: i for i, w in enumerate(words)}
        if len(ids) != len(words):
            raise ValueError("ngrams: a unigram repeats")
        tables: list[dict] = []
        for n, table in enumerate(ngrams, start=1):
            out: dict[tuple, tuple[float, float]] = {}
            for g, (p, b) in table.items():
                if not isinstance(g, tuple) or len(g) != n:
                    raise ValueError(f"ngrams[{n - 1}]: key {g!r} is not a {n}-tuple of words")
                try:
                    key = tuple(ids[w] for w in g)
                except (KeyError, TypeError):
                    bad = next(w for w in g if not isinstance(w, str) or w not in ids)
                    raise ValueError(f"ngrams[{n - 1}]: {g!r}: word {bad!r} has no unigram") from None
                out[key] = (float(p), 0.0 if n == N else float(b))
            tables.append(out)
        return cls._from_id_tables(words, tables, add_missing=add_missing)

    @classmethod
    def _from_id_tables(cls, words: list, tables: list, *, add_missing: bool) -> "NGramLM":
        """Builds a model from n-gram tables keyed by word-id tuples (``words[i]`` is word ``i``,
        every table entry ``(ln P, ln bow)`` of floats, ``bow = 0`` at the highest order).

        The tables are checked and then owned by the model (changed in place, not copied: the
        ARPA reader's memory bound counts them once)."""
        lm = cls()
        N = len(tables)
        lm.order = N
        lm.words = words
        lm._ids = {w: i for i, w in enumerate(words)}
        if len(lm._ids) != len(words):
            raise ValueError("ngrams: a unigram repeats")
        bos = lm._ids[BOS]
        eos = lm._ids[EOS]
        W = words
        for n, table in enumerate(tables, start=1):
            for g, (p, b) in table.items():
                if not (math.isfinite(p) or (n == 1 and g[0] == bos and p == -math.inf)):
                    raise ValueError(f"ngrams[{n - 1}]: {tuple(W[i] for i in g)!r}: probability {p} is not finite")
                if not math.isfinite(b):
                    raise ValueError(f"ngrams[{n - 1}]: {tuple(W[i] for i in g)!r}: back-off {b} is not finite")
                if p > 1e-6:
                    raise ValueError(f"ngrams[{n - 1}]: {tuple(W[i] for i in g)!r}: ln probability {p} is above 0")
                if bos in g[1:] or eos in g[:-1]:
                    raise ValueError(
                        f"ngrams[{n - 1}]: {tuple(W[i] for i in g)!r}: <s> may only begin and </s> only end an n-gram"
                    )
                if n > 1 and g[-1] == bos:
                    raise ValueError(f"ngrams[{n - 1}]: {tuple(W[i] for i in g)!r}: <s> is never predicted")
        key = (bos,)
        if key in tables[0]:
            p, b = tables[0][key]
            tables[0][key] = (max(p, MISSING_LOGP), b)
        for sp in (BOS, EOS, UNK):
            key = (lm._ids[sp],)
            if key not in tables[0]:
                if not add_missing:
                    raise ValueError(f"ngrams: the unigram {sp!r} is missing")
                tables[0][key] = (MISSING_LOGP, 0.0)
        lm._ngrams = tables
        # histories, lowest order first, so each added one can be scored by back-off
        for n in range(2, N + 1):
            lower = tables[n - 2]
            for g in list(tables[n - 1]):
                h = g[:-1]
                if h not in lower:
                    if not add_missing:
                        names = " ".join(words[i] for i in g)
                        raise ValueError(f"ngrams: the history of {names!r} is missing")
                    # an (n-1)-gram whose own history is missing too: add that first
                    lm._add_history(h)
        return lm

    def _add_history(self, h: tuple) -> None:
        n = len(h)
        if n == 0 or h in self._ngrams[n - 1]:
            return
        self._add_history(h[:-1])
        p = self._backoff_logp(h[:-1], h[-1])
        self._ngrams[n - 1][h] = (p, 0.0)

    def _backoff_logp(self, h: tuple, w: int) -> float:
        """ln P(w | h) by the ARPA rule, from the n-gram tables (no arrays needed)."""
        acc = 0.0
        while True:
            e = self._ngrams[len(h)].get(h + (w,))
            if e is not None:
                return acc + e[0]
            if not h:
                return -math.inf
            b = self._ngrams[len(h) - 1].get(h)
            if b is not None:
                acc += b[1]
            h = h[1:]

    # -- the contract --------------------------------------------------------------------
    def word_id(self, word: str) -> int:
        """The id of ``word``; the ``<unk>`` id for a word outside the vocabulary."""
        return self._ids.get(word, self._ids[UNK])

    @property
    def bos(self) -> int:
        """Id of ``<s>``."""
        return self._ids[BOS]

    @property
    def eos(self) -> int:
        """Id of ``</s>``."""
        return self._ids[EOS]

    @property
    def unk(self) -> int:
        """Id of ``<unk>``."""
        return self._ids[UNK]

    def start_state(self) -> int:
        """The state after ``<s>`` (the state of a sentence's beginning)."""
        return self.arrays().start_state

    def root_state(self) -> int:
        """The root (unigram) state: 0."""
        return 0

    @property
    def num_states(self) -> int:
        """The number of states ``S`` of :meth:`arrays`."""
        return int(self.arrays().backoff_logp.shape[0])

    def score(self, state: int, word: int) -> tuple[float, int]:
        """Scores ``word`` after ``state`` with back-off.

        Args:
            state: a state id in ``[0, S)``.
            word: a word id in ``[0, V)`` (use :meth:`word_id`).

        Returns:
            ``(ln P(word | state), next state)``; ``(-inf, 0)`` for ``<s>``.

        Raises:
            ValueError: a state or word id out of range.
        """
        a = self.arrays()
        s = _check_index(state, a.backoff_logp.shape[0], "state")
        w = _check_index(word, len(self.words), "word")
        acc = 0.0
        off, aw = a.state_offsets, a.arc_word
        while s != -1:
            lo, hi = int(off[s]), int(off[s + 1])
            k = lo + int(np.searchsorted(aw[lo:hi], w))
            if k < hi and aw[k] == w:
                return acc + float(a.arc_logp[k]), int(a.arc_next[k])
            acc += float(a.backoff_logp[s])
            s = int(a.backoff_state[s])
        return -math.inf, 0

    def final_score(self, state: int) -> float:
        """``ln P(</s> | state)``."""
        return self.score(state, self.eos)[0]

    def sentence_score(self, words: Iterable[str], eos: bool = True) -> float:
        """ln P of a sentence (words as strings, unknown ones as ``<unk>``), ``</s>`` included
        unless ``eos=False``."""
        s = self.start_state()
        total = 0.0
        for w in words:
            p, s = self.score(s, self.word_id(w))
            total += p
        if eos:
            total += self.final_score(s)
        return total

    def ngrams(self, n: int) -> dict[tuple, tuple[float, float]]:
        """The explicit n-grams of order ``n`` as ``{words tuple: (ln P, ln bow)}`` (a copy)."""
        if not 1 <= n <= self.order:
            raise ValueError(f"n must be in [1, {self.order}], got {n}")
        W = self.words
        return {tuple(W[i] for i in g): v for g, v in self._ngrams[n - 1].items()}

    def counts(self) -> list[int]:
        """The number of explicit n-grams of each order."""
        return [len(t) for t in self._ngrams]

    def arrays(self) -> LMArrays:
        """The model as a lazy back-off automaton in flat arrays (built once, checked).

        States: 0 is the root (empty history); then every explicit n-gram of order
        ``1 .. N-1`` that does not end with ``</s>``, by order. See :class:`LMArrays`.
        """
        if self._arrays is None:
            self._arrays = self._build_arrays()
        return self._arrays

    def _build_arrays(self) -> LMArrays:
        N = self.order
        bos, eos = self.bos, self.eos
        state_of: dict[tuple, int] = {(): 0}
        hists: list[tuple] = [()]
        for n in range(1, N):
            for g in sorted(self._ngrams[n - 1]):
                if g[-1] != eos:
                    state_of[g] = len(hists)
                    hists.append(g)
        S = len(hists)

        def longest_state(g: tuple) -> int:
            g = g[-(N - 1) :] if N > 1 else ()
            while g not in state_of:
                g = g[1:]
            return state_of[g]

        offsets = np.zeros(S + 1, dtype=np.int64)
        words_l: list[int] = []
        logp_l: list[float] = []
        next_l: list[int] = []
        backoff_logp = np.zeros(S, dtype=np.float32)
        backoff_state = np.full(S, -1, dtype=np.int32)
        # arcs of each state: explicit n-grams h + (w,), grouped by history
        by_hist: dict[tuple, list[tuple[int, float]]] = {}
        for n in range(1, N + 1):
            for g, (p, _) in self._ngrams[n - 1].items():
                if g[-1] == bos:
                    continue  # the root has no arc for <s>
                h = g[:-1]
                if h in state_of:
                    by_hist.setdefault(h, []).append((g[-1], p))
        for s, h in enumerate(hists):
            for w, p in sorted(by_hist.get(h, ())):
                words_l.append(w)
                logp_l.append(p)
                next_l.append(0 if w == eos else longest_state(h + (w,)))
            offsets[s + 1] = len(words_l)
            if s:
                backoff_logp[s] = self._ngrams[len(h) - 1][h][1]
                backoff_state[s] = longest_state(h[1:]) if len(h) > 1 else 0
        a = LMArrays(
            offsets,
            np.asarray(words_l, dtype=np.int32),
            np.asarray(logp_l, dtype=np.float32),
            np.asarray(next_l, dtype=np.int32),
            backoff_logp,
            backoff_state,
            state_of[(bos,)] if (bos,) in state_of else 0,
            bos,
            eos,
            self.unk,
        )
        root = a.arc_word[: offsets[1]]
        if root.shape[0] != len(self.words) - 1:
            raise ValueError("NGramLM: the root state must have an arc for every word but <s>")
        check_arrays(a, len(self.words))
        return a

    # -- ARPA ----------------------------------------------------------------------------
    @classmethod
    def from_arpa(cls, path, *, max_bytes: int = 1 << 32, add_missing: bool = True) -> "NGramLM":
        """Reads an ARPA file (untrusted input: see :func:`read_arpa`).

        Args:
            path: a file path, or an open text file.
            max_bytes: refuse a file whose declared n-gram counts need more memory (4 GiB).
            add_missing: add missing histories and special words as KenLM does.
        """
        return read_arpa(path, max_bytes=max_bytes, add_missing=add_missing)

    def to_arpa(self, path=None) -> str:
        """Writes the model as an ARPA file (log10) and returns the text.

        Args:
            path: a file path, an open text file, or None (only return the text).
        """
        return write_arpa(self, path)

    def __repr__(self) -> str:
        return f"NGramLM(order={self.order}, words={len(self.words)}, ngrams={self.counts()})"


def read_arpa(path, *, max_bytes: int = 1 << 32, add_missing: bool = True) -> NGramLM:
    """Reads an ARPA back-off language model.

    Numbers follow the format's grammar (ASCII digits, ``[+-]digits[.digits][e[+-]digits]``,
    ``-inf`` for ``<s>``). Log10 probabilities must lie in ``[MIN_LOG10_PROB, 0]`` (-99, SRILM's
    "never"), back-off weights in ``[MIN_LOG10_PROB, MAX_LOG10_BACKOFF]`` (10); see
    :mod:`lightning_gtn.lm.arpa` for the format and its checks.

    Args:
        path: a file path, or an open text file.
        max_bytes: refuse a file whose declared n-gram counts would take more memory than this
            (:func:`~lightning_gtn.lm.arpa.estimate_bytes`: it bounds what reading, the model and
            its arrays allocate, missing histories included), before reading the n-grams; the
            unigrams' words are added to the estimate as they are read, and no more than
            ``max_bytes`` characters are read.
        add_missing: add missing histories and special words as KenLM does (see
            :meth:`NGramLM.from_ngrams`); False makes them errors.

    Returns:
        The model (natural logs).

    Raises:
        ValueError: on malformed input; the message names the line number.

    Example:
        >>> import io
        >>> text = "\\\\data\\\\\\nngram 1=3\\n\\n\\\\1-grams:\\n-1 <s> 0\\n-0.3 </s>\\n-0.3 <unk>\\n\\\\end\\\\\\n"
        >>> read_arpa(io.StringIO(text)).order
        1
    """
    words, tables = parse_arpa(path, max_bytes=max_bytes, add_missing=add_missing)
    try:
        return NGramLM._from_id_tables(words, tables, add_missing=add_missing)
    except ValueError as e:
        raise ValueError(f"ARPA: {e}") from None


def write_arpa(lm: NGramLM, path=None) -> str:
    """Writes ``lm`` as ARPA text (log10, 9 significant digits) and returns the text.

    Args:
        lm: the model.
        path: a file path, an open text file, or None.
    """
    return format_arpa(lm.words, lm._ngrams, path)


def _check_index(x, n: int, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(x).__name__}")
    x = int(x)
    if not 0 <= x < n:
        raise ValueError(f"{name} must be in [0, {n}), got {x}")
    return x
