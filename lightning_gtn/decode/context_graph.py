"""Context biasing: an Aho-Corasick automaton over phrases that gives a bonus per matched token.

A :class:`ContextGraph` is built from phrases of token ids (:class:`ContextGraph`) or of words
(:meth:`ContextGraph.from_phrases`: spelled by a lexicon or by the token texts), and is walked by
the beam searches beside each hypothesis (:class:`lightning_gtn.decode.BeamSearchDecoder`,
:func:`lightning_gtn.decode.transducer_beam.modified_beam_search`).

**Symbols.** The automaton reads the token ids ``0..C-1`` and one more symbol, the word boundary
``C`` (:attr:`ContextGraph.boundary`). A search feeds it the utterance's text as tokens: a
boundary first, then each token of each word, a boundary at each word's end (a separator token
after an open word, a word-starting piece such as ``"▁york"`` after an open word, a lexicon word's
end, the end of the utterance). Separator tokens themselves are not fed. A phrase of words
``"new york"`` is the symbols ``boundary, n e w, boundary, y o r k, boundary``, so it matches
whole words only; a phrase of token ids matches wherever those tokens follow each other.

**Bonus (the definition).** Each token of a phrase (not the boundaries) is worth ``score``; the
worth of a partial match ``m`` (a prefix of some phrase) is ``acc(m) = min(score x tokens(m),
cap)``, and ``floor(m)`` is the worth of the longest complete phrase that is a prefix of ``m``
(0 if none). The automaton's state is the longest suffix of what was read that is a phrase prefix
(since the last failure, see below). Reading a symbol that extends the match moves to the longer
prefix and earns the difference of ``acc``. Reading one that does not is a failure: the match
keeps ``floor`` (what its complete phrases earned), gives back the rest, and restarts at the
longest suffix of the match plus the symbol that is a phrase prefix (the failure link), earning
that suffix's ``acc``. At the end of the utterance a pending partial match is given back the
same way (:meth:`ContextGraph.final`). So the total bonus of an utterance is the sum, over the
failures and the end, of the ``floor`` of the match that ended there; partial matches only lend
their bonus to the search while they last, which is what keeps a boosted phrase in the beam.

**Cap.** ``cap`` bounds what one match may earn (``acc`` never exceeds it), so a long phrase
cannot outweigh the acoustics by its length alone; the default is :data:`DEFAULT_CAP_TOKENS`
tokens' worth (``8 x score``). ``score = 0`` or no phrases gives no bonus at all: the searches then
score exactly as without a context graph.

**Bounds.** At most :data:`MAX_CONTEXT_PHRASES` phrases, :data:`MAX_PHRASE_SYMBOLS` symbols a
phrase and :data:`MAX_CONTEXT_STATES` states; more is a ValueError naming the limit.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Optional

import numpy as np

from ..kernels.context_numba import context_row, context_step, context_table
from .lexicon import Lexicon

__all__ = [
    "ContextArrays",
    "ContextGraph",
    "read_phrases",
    "MAX_CONTEXT_PHRASES",
    "MAX_CONTEXT_STATES",
    "MAX_PHRASE_SYMBOLS",
    "MAX_SPELLINGS",
    "DEFAULT_CAP_TOKENS",
]

#: the most phrases one graph may hold
MAX_CONTEXT_PHRASES = 100_000
#: the most states (trie nodes) one graph may hold
MAX_CONTEXT_STATES = 2_000_000
#: the most symbols (tokens and word boundaries) one phrase may have
MAX_PHRASE_SYMBOLS = 512
#: the most spellings one phrase of words may expand to (the product over its words)
MAX_SPELLINGS = 64
#: the default cap is this many tokens' worth of ``score``
DEFAULT_CAP_TOKENS = 8
#: graphs with at most this many (state, symbol) pairs also get dense tables (one lookup a step)
MAX_DENSE_ENTRIES = 1 << 21
#: the longest phrase file read (bytes)
MAX_PHRASE_FILE_BYTES = 64 * 2**20


class ContextArrays(NamedTuple):
    """A context graph as flat arrays for compiled searches (see :mod:`lightning_gtn.kernels.context_numba`).

    ``child_offsets`` (N + 1,) int64, ``child_token`` and ``child_node`` int32 (the children of state
    n, sorted by symbol), ``fail`` (N,) int32, ``acc`` and ``floor`` (N,) float64, ``start`` the state
    after the first boundary, ``boundary`` the boundary symbol ``C``."""

    child_offsets: np.ndarray
    child_token: np.ndarray
    child_node: np.ndarray
    fail: np.ndarray
    acc: np.ndarray
    floor: np.ndarray
    start: int
    boundary: int


def read_phrases(path) -> list[str]:
    """The phrases of a text file: one a line, blank lines and lines starting with ``#`` skipped.

    Raises:
        ValueError: naming the file, if it cannot be read, is over 64 MiB or is not UTF-8.
    """
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
        if size > MAX_PHRASE_FILE_BYTES:
            raise ValueError(f"{size} bytes, more than {MAX_PHRASE_FILE_BYTES}")
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"context_file: cannot read {p!r}: {e}") from None
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _number(name: str, v, *, positive: bool = False, allow_none: bool = False) -> Optional[float]:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0 or positive and v == 0:
        what = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {what} finite number{' or None' if allow_none else ''}, got {v!r}")
    return float(v)


class ContextGraph:
    """An Aho-Corasick automaton over phrases of token ids, with the bonus of the module docstring.

    Args:
        phrases: phrases of symbols: each a non-empty sequence of ints in ``[0, num_tokens]``
            (``num_tokens`` is the word boundary; two boundaries in a row are not allowed).
            Duplicates are merged.
        num_tokens: ``C``, the searches' number of token ids.
        score: the bonus of each matched token (>= 0).
        cap: the most one match may earn (> 0); None: ``DEFAULT_CAP_TOKENS x score``; ``math.inf``:
            no cap.
        token_kind: ``(C,)`` ints for searches that read emitted token ids
            (:meth:`token_row`): 0 a plain token, 1 a separator (closes an open word), 2 a
            word-starting piece (closes an open word, then is read); None: all plain.
            :meth:`from_phrases` sets it from the token texts.
        totals: None, or one entry per phrase: None (the phrase earns by ``score`` and ``cap``)
            or a finite number ``b`` (of any sign): the phrase's own worth, ``b x k / L`` after
            ``k`` of its ``L`` tokens and exactly ``b`` when complete (no cap). A state on several
            phrases is worth the largest of their worths there. This is how the decoders'
            ``hotwords`` (word -> bonus) enter the graph.

    Raises:
        ValueError: one line naming the argument (an empty phrase, a symbol out of range, too many
            phrases, symbols or states).

    Example:
        >>> g = ContextGraph([[1, 2]], num_tokens=3, score=1.0)
        >>> s, b1 = g.step(g.start, 1)
        >>> s, b2 = g.step(s, 2)
        >>> b1, b2, g.final(s)
        (1.0, 1.0, 0.0)
    """

    def __init__(
        self,
        phrases: Iterable[Sequence[int]],
        num_tokens: int,
        *,
        score: float = 0.5,
        cap: Optional[float] = None,
        token_kind=None,
        totals: Optional[Sequence[Optional[float]]] = None,
    ) -> None:
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
            raise ValueError(f"num_tokens must be a positive integer, got {num_tokens!r}")
        if num_tokens >= 2**31 - 1:
            raise ValueError(f"num_tokens must be below 2**31 - 1, got {num_tokens}")
        C = int(num_tokens)
        self.num_tokens = C
        self.boundary = C
        self.score = float(_number("context_score", score) or 0.0)
        c = _number("context_cap", cap, positive=True, allow_none=True) if cap != math.inf else math.inf
        self.cap = DEFAULT_CAP_TOKENS * self.score if c is None else float(c)
        if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Iterable):
            raise ValueError("context_phrases must be a list of phrases (lists of token ids)")
        seqs: list[tuple[int, ...]] = []
        vals: list[Optional[float]] = []
        seen: set[tuple[tuple[int, ...], Optional[float]]] = set()
        total = 0
        phrases = list(phrases) if totals is not None else phrases
        if totals is not None and (isinstance(totals, (str, bytes)) or len(totals) != len(phrases)):  # type: ignore[arg-type]
            raise ValueError("totals must have one entry (None or a number) per phrase")
        for i, p in enumerate(phrases):
            if i >= MAX_CONTEXT_PHRASES:
                raise ValueError(f"context_phrases: more than {MAX_CONTEXT_PHRASES} phrases")
            if isinstance(p, (str, bytes)) or not isinstance(p, Sequence):
                raise ValueError(f"context_phrases[{i}] must be a list of token ids, got {type(p).__name__}")
            if len(p) == 0:
                raise ValueError(f"context_phrases[{i}] is empty")
            if len(p) > MAX_PHRASE_SYMBOLS:
                raise ValueError(f"context_phrases[{i}] has {len(p)} symbols, more than {MAX_PHRASE_SYMBOLS}")
            for a in p:
                if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a <= C:
                    raise ValueError(f"context_phrases[{i}]: token {a!r} out of range [0, {C}] (C={C} is the boundary)")
            t = tuple(int(a) for a in p)
            if any(x == C and y == C for x, y in zip(t, t[1:])) or t == (C,):
                raise ValueError(f"context_phrases[{i}]: a phrase needs a token and no two boundaries in a row")
            total += len(t)
            if total >= MAX_CONTEXT_STATES:
                raise ValueError(f"context_phrases: more than {MAX_CONTEXT_STATES} states (symbols of all phrases)")
            v = None if totals is None else totals[i]
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                    raise ValueError(f"totals[{i}] must be None or a finite number, got {v!r}")
                v = float(v)
            if (t, v) not in seen:
                seen.add((t, v))
                seqs.append(t)
                vals.append(v)
        self.phrases = seqs
        self.totals = vals
        kind = np.zeros(C, dtype=np.int8) if token_kind is None else np.asarray(token_kind)
        if kind.shape != (C,) or kind.dtype.kind not in "iu" or (kind.size and (kind.min() < 0 or kind.max() > 2)):
            raise ValueError(f"token_kind must be ({C},) integers in {{0, 1, 2}}, got {kind.dtype} {kind.shape}")
        self.token_kind = kind.astype(np.int8)
        self._build()
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._token_rows: dict[tuple[int, bool, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        C = self.boundary
        children: list[dict[int, int]] = [{}]
        worth = [0.0]  # the largest worth of a phrase through the state
        endv: list[Optional[float]] = [None]  # the largest worth of a phrase ending there
        for p, v in zip(self.phrases, self.totals):
            n = 0
            L = sum(a != C for a in p)
            k = 0
            for a in p:
                k += a != C
                x = min(self.score * k, self.cap) if v is None else v if k == L else v * k / L
                nxt = children[n].get(a)
                if nxt is None:
                    nxt = len(children)
                    children[n][a] = nxt
                    children.append({})
                    worth.append(x)
                    endv.append(None)
                else:
                    worth[nxt] = max(worth[nxt], x)
                n = nxt
            e = endv[n]
            endv[n] = x if e is None else max(e, x)
        N = len(children)
        acc = np.asarray(worth, dtype=np.float64)
        floor = np.zeros(N, dtype=np.float64)
        fail = np.zeros(N, dtype=np.int32)
        order = [0]  # breadth first: a failure link points at a shallower state
        for n in order:
            e = endv[n]
            if e is not None:
                floor[n] = e
            for a, m in children[n].items():
                if n:
                    f = int(fail[n])
                    while f and a not in children[f]:
                        f = int(fail[f])
                    fail[m] = children[f].get(a, 0)
                floor[m] = floor[n]  # overwritten above when m itself ends a phrase
                order.append(m)
        off = np.zeros(N + 1, dtype=np.int64)
        toks: list[int] = []
        nodes: list[int] = []
        for n in range(N):
            items = sorted(children[n].items())
            off[n + 1] = off[n] + len(items)
            toks.extend(a for a, _ in items)
            nodes.extend(m for _, m in items)
        self.arrays = ContextArrays(
            off,
            np.asarray(toks, dtype=np.int32),
            np.asarray(nodes, dtype=np.int32),
            fail,
            acc,
            floor,
            0,
            C,
        )
        start, _ = context_step(*self.arrays[:6], 0, C)
        self.arrays = self.arrays._replace(start=int(start))
        self.start = int(start)
        if N * (C + 1) <= MAX_DENSE_ENTRIES:
            self.dense: Optional[tuple[np.ndarray, np.ndarray]] = context_table(*self.arrays[:6], C + 1)
        else:
            self.dense = None
        self._tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._codes: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def kernel_arrays(self) -> tuple:
        """What the compiled searches take: the six arrays of :class:`ContextArrays`, the dense
        tables (empty ``(0, 0)`` arrays when the graph is too large for them), ``start``,
        ``boundary``, and whether the graph gives any bonus."""
        a = self.arrays
        nxt, bon = self.dense if self.dense is not None else (np.zeros((0, 0), np.int64), np.zeros((0, 0)))
        return (*a[:6], nxt, bon, a.start, a.boundary, not self.empty)

    @property
    def num_states(self) -> int:
        """The number of states (trie nodes), the root included."""
        return int(self.arrays.fail.shape[0])

    @property
    def empty(self) -> bool:
        """True when the graph can give no bonus (no phrase, or ``score`` 0)."""
        return not self.phrases or (self.score == 0.0 and all(not v for v in self.totals))

    def __len__(self) -> int:
        return len(self.phrases)

    def __repr__(self) -> str:
        return (
            f"ContextGraph({len(self.phrases)} phrases, {self.num_states} states, score={self.score}, cap={self.cap})"
        )

    # ------------------------------------------------------------------ walking
    def step(self, state: int, symbol: int) -> tuple[int, float]:
        """``(next state, bonus)`` after ``symbol`` (a token id or :attr:`boundary`)."""
        if not 0 <= symbol <= self.boundary:
            raise ValueError(f"symbol must be in [0, {self.boundary}], got {symbol}")
        k, r = context_step(*self.arrays[:6], int(state), int(symbol))
        return int(k), float(r)

    def final(self, state: int) -> float:
        """The bonus at the end of the utterance in ``state`` (``floor - acc``: a pending match given back)."""
        a = self.arrays
        return float(a.floor[state] - a.acc[state])

    def row(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """``(next states (C + 1,), bonuses (C + 1,))`` for every symbol from ``state`` (cached)."""
        hit = self._rows.get(state)
        if hit is None:
            if len(self._rows) > 65536:
                self._rows.clear()
            hit = self._rows[state] = context_row(*self.arrays[:6], int(state), self.boundary + 1)
        return hit

    def token_row(self, state: int, open_word: bool, blank: int = -1):
        """What emitting each token id does, for searches over token ids (the transducer's).

        A separator closes an open word (the boundary), a word-starting piece closes an open word
        and is then read, any other token is read; ``blank`` (if in range) changes nothing.

        Returns:
            ``(next states (C,) int64, bonuses (C,) float64, open after (C,) bool)`` (cached).
        """
        key = (int(state), bool(open_word), int(blank))
        hit = self._token_rows.get(key)
        if hit is not None:
            return hit
        C, B = self.num_tokens, self.boundary
        nxt, bon = self.row(state)
        nxt, bon = nxt[:C].copy(), bon[:C].copy()
        opened = np.ones(C, dtype=np.bool_)
        kind = self.token_kind
        sep = kind == 1
        if open_word:
            s_b, r_b = int(self.row(state)[0][B]), float(self.row(state)[1][B])
            after_n, after_b = self.row(s_b)
            starts = kind == 2
            nxt[starts] = after_n[:C][starts]
            bon[starts] = r_b + after_b[:C][starts]
            nxt[sep], bon[sep] = s_b, r_b
        else:
            nxt[sep], bon[sep] = state, 0.0
        opened[sep] = False
        if 0 <= blank < C:
            nxt[blank], bon[blank], opened[blank] = state, 0.0, open_word
        if len(self._token_rows) > 65536:
            self._token_rows.clear()
        hit = self._token_rows[key] = (nxt, bon, opened)
        return hit

    def token_tables(self, blank: int = -1):
        """:meth:`token_row` of every state at once, or None when the graph is too large for dense
        tables: ``(next, bonus, open after)``, each ``(2, N, C)`` indexed ``[open_word, state,
        token]`` (cached per ``blank``)."""
        if self.dense is None or 2 * self.num_states * self.num_tokens > 2 * MAX_DENSE_ENTRIES:
            return None
        hit = self._tables.get(int(blank))
        if hit is not None:
            return hit
        C, B, N = self.num_tokens, self.boundary, self.num_states
        dn, db = self.dense
        states = np.arange(N)
        nxt = np.empty((2, N, C), dtype=np.int64)
        bon = np.empty((2, N, C), dtype=np.float64)
        opened = np.ones((2, N, C), dtype=np.bool_)
        nxt[:], bon[:] = dn[:, :C], db[:, :C]
        kind = self.token_kind
        sep, starts = np.flatnonzero(kind == 1), np.flatnonzero(kind == 2)
        s_b, r_b = dn[:, B], db[:, B]  # the boundary from each state (an open word closes)
        nxt[1][:, starts] = dn[s_b][:, starts]
        bon[1][:, starts] = r_b[:, None] + db[s_b][:, starts]
        nxt[0][:, sep], bon[0][:, sep] = states[:, None], 0.0
        nxt[1][:, sep], bon[1][:, sep] = s_b[:, None], r_b[:, None]
        opened[:, :, sep] = False
        if 0 <= blank < C:
            nxt[:, :, blank], bon[:, :, blank] = states[None, :], 0.0
            opened[0, :, blank], opened[1, :, blank] = False, True
        hit = self._tables[int(blank)] = (nxt, bon, opened)
        return hit

    def token_codes(self, blank: int = -1):
        """:meth:`token_tables` by state code ``2 x state + open_word``: ``(next codes, bonus)``,
        each ``(2N, C)`` with row ``2 x state + open_word`` (cached per ``blank``), or None."""
        hit = self._codes.get(int(blank))
        if hit is not None:
            return hit
        t = self.token_tables(blank)
        if t is None:
            return None
        nxt, bon, opened = t
        N, C = self.num_states, self.num_tokens
        codes = (2 * nxt + opened).transpose(1, 0, 2).reshape(2 * N, C)
        hit = (np.ascontiguousarray(codes), np.ascontiguousarray(bon.transpose(1, 0, 2).reshape(2 * N, C)))
        self._codes[int(blank)] = hit
        return hit

    def end_bonus(self, state: int, open_word: bool) -> float:
        """The bonus at the end of an utterance of a token-id search: the boundary closing an
        open word, then :meth:`final`."""
        r = 0.0
        if open_word:
            state, r = self.step(state, self.boundary)
        return r + self.final(state)

    def total(self, symbols: Iterable[int]) -> float:
        """The bonus of a whole symbol sequence (read from :attr:`start`, :meth:`final` included)."""
        s, tot = self.start, 0.0
        for a in symbols:
            s, r = self.step(s, a)
            tot += r
        return tot + self.final(s)

    # ------------------------------------------------------------------ phrases of words
    @classmethod
    def from_phrases(
        cls,
        phrases: Iterable,
        tokens: Sequence[Optional[str]],
        *,
        score: float = 0.5,
        cap: Optional[float] = None,
        lexicon: Optional[Lexicon] = None,
        word_separator: str = " ",
        skip: Iterable[int] = (),
    ) -> "ContextGraph":
        """A graph of phrases of words (strings) or of token ids (lists of ints).

        A phrase string is split at whitespace into words; each word is spelled by ``lexicon``
        (every spelling, up to :data:`MAX_SPELLINGS` per phrase) or, without one, by the token
        texts, longest match first (with word-starting pieces such as ``"▁new"`` when the tokens
        have them; a word no piece starts is spelled after the separator token, which the
        searches read as the boundary). The phrase is then ``boundary, word 1, boundary, ..., word n, boundary``.

        Args:
            phrases: strings, lists of token ids, or a mix.
            tokens: the text of each token id (None or ``""`` for ids that spell nothing: blank).
            score, cap: see :class:`ContextGraph`.
            lexicon: spell words by it (a word it lacks is an error), or None.
            word_separator: the separator's text; a token equal to it is not used in spellings.
            skip: token ids never used in spellings (blank, ASG's repeat).

        Raises:
            ValueError: one line: an empty phrase, a word that cannot be spelled, the bounds.
        """
        if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Iterable):
            raise ValueError("context_phrases must be a list of phrases (strings or lists of token ids)")
        C = len(tokens)
        spell = _Speller(tokens, lexicon, word_separator, skip)
        out: list[list[int]] = []
        for i, p in enumerate(phrases):
            if isinstance(p, str):
                words = p.split()
                if not words:
                    raise ValueError(f"context_phrases[{i}] is empty")
                combos: list[list[int]] = [[C]]
                for w in words:
                    sp = spell(w, i)
                    if len(combos) * len(sp) > MAX_SPELLINGS:
                        raise ValueError(f"context_phrases[{i}]: {p[:60]!r} has more than {MAX_SPELLINGS} spellings")
                    combos = [c + s + [C] for c in combos for s in sp]
                out.extend(combos)
            else:
                out.append(p)
            if len(out) > MAX_CONTEXT_PHRASES:
                raise ValueError(f"context_phrases: more than {MAX_CONTEXT_PHRASES} phrases")
        return cls(out, C, score=score, cap=cap, token_kind=token_kinds(tokens, word_separator))


def token_kinds(tokens: Sequence[Optional[str]], word_separator: str) -> np.ndarray:
    """:class:`ContextGraph`'s ``token_kind`` from the token texts: 1 the separator, 2 a token
    starting with it (a word-starting piece), 0 any other."""
    kind = np.zeros(len(tokens), dtype=np.int8)
    for j, t in enumerate(tokens):
        if isinstance(t, str) and t:
            kind[j] = 1 if t == word_separator else 2 if t.startswith(word_separator) else 0
    return kind


class _Speller:
    """Spells a word as token ids: by a lexicon, or greedily by the token texts."""

    def __init__(self, tokens, lexicon, sep: str, skip) -> None:
        self.lex = lexicon.spellings() if lexicon is not None else None
        skip = {int(s) for s in skip}
        self.of: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if isinstance(t, str) and t and t != sep and i not in skip:
                self.of.setdefault(t, i)
        self.sep = sep
        self.longest = max((len(t) for t in self.of), default=0)
        self.pieces = any(t.startswith(sep) for t in self.of)  # word-starting pieces ("▁new")

    def __call__(self, word: str, i: int) -> list[list[int]]:
        if self.lex is not None:
            sp = self.lex.get(word)
            if not sp:
                raise ValueError(f"context_phrases[{i}]: word {word[:60]!r} is not in the lexicon")
            return sp
        text = self.sep + word if self.pieces else word
        ids: list[int] = []
        k = 0
        while k < len(text):
            for L in range(min(self.longest, len(text) - k), 0, -1):
                j = self.of.get(text[k : k + L])
                if j is not None:
                    ids.append(j)
                    k += L
                    break
            else:
                if k == 0 and self.pieces:  # no piece starts the word: the separator then its letters
                    k = len(self.sep)
                    continue
                raise ValueError(
                    f"context_phrases[{i}]: word {word[:60]!r} cannot be spelled by the tokens "
                    f"(no token for {text[k : k + 8]!r})"
                )
        return [ids]
