"""Estimating back-off n-gram models from text: interpolated modified Kneser-Ney and Witten-Bell.

Each sentence ``w_1 .. w_k`` is counted as ``<s> w_1 .. w_k </s>`` (one ``<s>``, as KenLM
does: n-grams that begin with ``<s>`` are shorter than ``N``). Both methods interpolate each
order with the next lower one and end in the uniform distribution over the vocabulary ``V``
(every word but ``<s>``, with ``</s>`` and ``<unk>``)::

    P(w | h) = alpha(h w) + gamma(h) * P(w | h[1:])          P(w | ()) uses P_uniform = 1 / |V|

Kneser-Ney (Chen & Goodman's interpolated modified KN):

* counts ``a(g)``: the raw count at the highest order and for n-grams that begin with ``<s>``;
  else the continuation count ``N1+(. g)``, the number of distinct words seen before ``g``;
* discounts per order from the count-of-counts ``t_k`` (n-grams with ``a = k``) of that order:
  ``Y = t1 / (t1 + 2 t2)``, ``D1 = 1 - 2 Y t2 / t1``, ``D2 = 2 - 3 Y t3 / t2``,
  ``D3+ = 3 - 4 Y t4 / t3`` (when a ``t_k`` is 0 or a D falls outside ``(0, k)``, the order
  uses KenLM's fallback ``(0.5, 1.0, 1.5)``);
* ``alpha(h w) = (a(h w) - D(a(h w))) / sum_v a(h v)``,
  ``gamma(h) = (D1 N1(h .) + D2 N2(h .) + D3+ N3+(h .)) / sum_v a(h v)``, ``N_k(h .)`` the number
  of words ``v`` with ``a(h v) = k`` (3 or more for ``N3+``).

Witten-Bell: raw counts ``c`` at every order,
``alpha(h w) = c(h w) / (c(h) + T(h))``, ``gamma(h) = T(h) / (c(h) + T(h))``, with
``c(h) = sum_v c(h v)`` and ``T(h) = N1+(h .)`` the number of distinct words seen after ``h``.

The explicit n-grams are those seen in the text (all words of ``V`` at order 1); their stored
probability is the interpolated ``P(w | h)`` and the back-off weight of ``h`` is ``gamma(h)``.
With pruning (``prune[n - 1]``: minimum raw count of an explicit n-gram of order ``n >= 2``;
n-grams that are the history of a kept higher one are kept), the back-off weight of a history
that lost n-grams is renormalised so that its distribution still sums to one::

    bow(h) = (1 - sum_{kept h w} P(w | h)) / (1 - sum_{kept h w} P_backoff(w | h[1:]))
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Optional, Union

from .ngram import NGramLM
from .symbols import BOS, EOS, MAX_ORDER, MISSING_LOGP, UNK

__all__ = ["estimate", "perplexity", "kn_discounts"]

FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


def _sentences(sentences) -> Iterable[list[str]]:
    if isinstance(sentences, str):
        raise TypeError("sentences must be an iterable of sentences (str or list of str), not one str")
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            yield s.split()
        elif isinstance(s, (list, tuple)):
            for w in s:
                if not isinstance(w, str):
                    raise TypeError(f"sentences[{i}]: tokens must be str, got {type(w).__name__}")
            yield list(s)
        else:
            raise TypeError(f"sentences[{i}] must be a str or a list of str, got {type(s).__name__}")


def kn_discounts(count_of_counts: Sequence[int]) -> tuple[float, float, float]:
    """Modified Kneser-Ney discounts ``(D1, D2, D3+)`` from ``(t1, t2, t3, t4)``.

    Falls back to ``(0.5, 1.0, 1.5)`` (KenLM's ``--discount_fallback``) when a count is 0 or a
    discount leaves ``(0, k)``.

    Example:
        >>> kn_discounts([10, 4, 2, 1])
        (0.5555555555555556, 1.1666666666666665, 1.8888888888888888)
    """
    t1, t2, t3, t4 = (int(x) for x in count_of_counts[:4])
    if min(t1, t2, t3, t4) <= 0:
        return FALLBACK_DISCOUNTS
    y = t1 / (t1 + 2 * t2)
    d = (1 - 2 * y * t2 / t1, 2 - 3 * y * t3 / t2, 3 - 4 * y * t4 / t3)
    if not all(0 < dk < k for k, dk in zip((1, 2, 3), d)):
        return FALLBACK_DISCOUNTS
    return d


def _check_discount(discount, order: int) -> Optional[list]:
    if discount is None:
        return None
    if isinstance(discount, (int, float)) and not isinstance(discount, bool):
        discount = [discount] * order
    if not isinstance(discount, Sequence) or len(discount) != order:
        raise ValueError(f"discount must be a float, or a sequence of {order} (one per order)")
    out = []
    for n, d in enumerate(discount, start=1):
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            d = (d, d, d)
        if not isinstance(d, Sequence) or len(d) != 3:
            raise ValueError(f"discount[{n - 1}] must be a float or a (D1, D2, D3+) triple")
        d = tuple(float(x) for x in d)
        if not all(0 <= dk <= k for k, dk in zip((1, 2, 3), d)):
            raise ValueError(f"discount[{n - 1}] = {d}: need 0 <= D1 <= 1, 0 <= D2 <= 2, 0 <= D3+ <= 3")
        out.append(d)
    return out


def estimate(
    sentences: Iterable[Union[str, Sequence[str]]],
    order: int = 3,
    method: str = "kneser_ney",
    discount=None,
    prune: Optional[Sequence[int]] = None,
    vocab: Optional[Iterable[str]] = None,
    progress=None,
) -> NGramLM:
    """Estimates a back-off n-gram model from sentences (formulas in the module docstring).

    A character-level model is the same with characters as words (pass ``list(line)``).

    Args:
        sentences: iterable of sentences, each a list of tokens or a string split on spaces.
        order: the n-gram order ``N`` (1 to 16).
        method: ``"kneser_ney"`` (``"kn"``) or ``"witten_bell"`` (``"wb"``).
        discount: Kneser-Ney only. None: modified KN's ``D1, D2, D3+`` from the count-of-counts
            of each order; a float: that discount everywhere; a sequence of ``order`` floats or
            ``(D1, D2, D3+)`` triples, one per order.
        prune: minimum raw counts of explicit n-grams, one per order; the unigram entry must be
            0 or 1 (restrict the words with ``vocab`` instead). None keeps every n-gram.
        vocab: the words of the model; other words of the text count as ``<unk>``. None: every
            word of the text.
        progress: optional callable ``progress(n)`` called after every ``n`` sentences counted
            (used by the CLI's progress bar).

    Returns:
        The model; ``P(. | h)`` sums to 1 over the vocabulary (without ``<s>``) for every
        history ``h``.

    Raises:
        ValueError: a bad ``order``, ``method``, ``discount`` or ``prune``; TypeError for
            sentences that are not strings or lists of strings.

    Example:
        >>> lm = estimate(["the cat sat", "the dog sat"], order=2, method="witten_bell")
        >>> lm.order, len(lm.words)
        (2, 7)
    """
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise ValueError(f"order must be an int in [1, {MAX_ORDER}], got {order!r}")
    methods = {"kneser_ney": "kn", "kn": "kn", "witten_bell": "wb", "wb": "wb"}
    if method not in methods:
        raise ValueError(f"method must be 'kneser_ney' or 'witten_bell', got {method!r}")
    kn = methods[method] == "kn"
    if discount is not None and not kn:
        raise ValueError("discount applies to method='kneser_ney' only")
    discounts = _check_discount(discount, order)
    if prune is not None:
        prune = [int(x) for x in prune]
        if len(prune) != order or any(x < 0 for x in prune) or prune[0] > 1:
            raise ValueError(f"prune must give {order} non-negative minimum counts, the first 0 or 1")
    N = order
    vset = None if vocab is None else {w for w in vocab if w not in (BOS, EOS, UNK)}

    # -- counting ----------------------------------------------------------------------------
    raw: list[Counter] = [Counter() for _ in range(N)]
    seen_words: set[str] = set()
    for k, words in enumerate(_sentences(sentences), start=1):
        for w in words:
            if w in (BOS, EOS):
                raise ValueError(f"sentence {k - 1}: {w!r} is added by the estimator, not allowed in the text")
        if vset is not None:
            words = [w if w in vset else UNK for w in words]
        seen_words.update(words)
        toks = [BOS] + words + [EOS]
        L = len(toks)
        for n in range(1, N + 1):
            c: dict = raw[n - 1]  # a Counter here; the counts of one order below
            for i in range(L - n + 1):
                g = tuple(toks[i : i + n])
                if g != (BOS,):
                    c[g] += 1
        if progress is not None:
            progress(1)
    vocab_words = sorted((vset if vset is not None else seen_words) - {BOS, EOS, UNK})
    V = [w for w in vocab_words] + [EOS, UNK]  # predicted words (all but <s>)

    # -- counts used by each order -------------------------------------------------------------
    if kn:
        adj: list[dict] = [None] * N  # type: ignore[list-item]
        adj[N - 1] = dict(raw[N - 1])
        for n in range(N - 1, 0, -1):
            cont: Counter = Counter()
            for g in raw[n]:  # (n+1)-grams
                cont[g[1:]] += 1
            a = {}
            for g, k in raw[n - 1].items():
                a[g] = k if g[0] == BOS else cont.get(g, 0)
            adj[n - 1] = a
        cnt = adj
    else:
        cnt = [dict(c) for c in raw]

    # -- interpolated probabilities of seen n-grams, order by order -----------------------------
    probs: list[dict] = []  # probs[n-1][g] = P(g[-1] | g[:-1]) interpolated
    gammas: list[dict] = []  # gammas[n-1][h] for histories h of length n-1
    uniform = 1.0 / len(V)
    for n in range(1, N + 1):
        c = cnt[n - 1]
        by_h: dict[tuple, list] = defaultdict(list)
        for g, x in c.items():
            if x > 0:
                by_h[g[:-1]].append((g, x))
        if kn:
            if discounts is not None:
                D = discounts[n - 1]
            else:
                t = Counter(x for x in c.values() if 1 <= x <= 4)
                D = kn_discounts([t[1], t[2], t[3], t[4]])
        p_n: dict[tuple, float] = {}
        g_n: dict[tuple, float] = {}
        for h, items in by_h.items():
            total = sum(x for _, x in items)
            if kn:
                nk = [0, 0, 0]
                for _, x in items:
                    nk[min(x, 3) - 1] += 1
                gamma = (D[0] * nk[0] + D[1] * nk[1] + D[2] * nk[2]) / total
                alpha = {g: (x - D[min(x, 3) - 1]) / total for g, x in items}
            else:
                T = len(items)
                gamma = T / (total + T)
                alpha = {g: x / (total + T) for g, x in items}
            g_n[h] = gamma
            for g, al in alpha.items():
                lower = uniform if n == 1 else probs[n - 2][g[1:]]
                p_n[g] = al + gamma * lower
        if n == 1:
            gamma0 = g_n.get((), 1.0)
            for w in V:
                if (w,) not in p_n:
                    p_n[(w,)] = gamma0 * uniform
        probs.append(p_n)
        gammas.append(g_n)

    # -- pruning and back-off weights ------------------------------------------------------------
    kept: list[set] = [set(probs[0])] + [set() for _ in range(N - 1)]
    if prune is None:
        for n in range(2, N + 1):
            kept[n - 1] = set(probs[n - 1])
    else:
        for n in range(N, 1, -1):
            need = {g[:-1] for g in kept[n]} if n < N else set()
            kept[n - 1] = {g for g in probs[n - 1] if raw[n - 1][g] >= prune[n - 1] or g in need}
    tables: list[dict] = [dict() for _ in range(N)]
    # word ids: <unk>, <s>, </s>, then the words sorted (KenLM puts the specials first too)
    tables[0][(UNK,)] = (math.log(probs[0][(UNK,)]), 0.0)
    tables[0][(BOS,)] = (MISSING_LOGP, 0.0)
    for w in [EOS] + vocab_words:
        tables[0][(w,)] = (math.log(probs[0][(w,)]), 0.0)
    for n in range(2, N + 1):
        pruned_h: set = set()
        if prune is not None:
            pruned_h = {g[:-1] for g in probs[n - 1] if g not in kept[n - 1]}
        kept_by_h: dict[tuple, list] = defaultdict(list)
        for g in sorted(kept[n - 1]):
            tables[n - 1][g] = (math.log(probs[n - 1][g]), 0.0)
            kept_by_h[g[:-1]].append(g)
        for h, gamma in gammas[n - 1].items():
            if h not in tables[n - 2]:
                continue  # cannot happen: a history of a kept n-gram is kept
            if h in pruned_h:
                num = 1.0 - sum(probs[n - 1][g] for g in kept_by_h.get(h, ()))
                den = 1.0 - sum(_backoff_p(tables, g[1:]) for g in kept_by_h.get(h, ()))
                bow = num / den if num > 0 and den > 0 else gamma
            else:
                bow = gamma
            p, _ = tables[n - 2][h]
            tables[n - 2][h] = (p, math.log(bow) if bow > 0 else MISSING_LOGP)
    return NGramLM.from_ngrams(tables, add_missing=True)


def _backoff_p(tables: list[dict], g: tuple) -> float:
    """P(g[-1] | g[:-1]) from the tables built so far (ARPA back-off)."""
    acc = 0.0
    h = g[:-1]
    w = g[-1]
    while True:
        e = tables[len(h)].get(h + (w,))
        if e is not None:
            return math.exp(acc + e[0])
        if not h:
            return 0.0
        b = tables[len(h) - 1].get(h)
        if b is not None:
            acc += b[1]
        h = h[1:]


def perplexity(lm: NGramLM, sentences: Iterable[Union[str, Sequence[str]]]) -> float:
    """Perplexity of ``lm`` on sentences: ``exp(-sum ln P / number of tokens)``.

    Every word and each sentence's ``</s>`` count as tokens; unknown words are scored as
    ``<unk>`` (SRILM's ``ppl``, KenLM's perplexity with OOVs included).

    Args:
        lm: the model.
        sentences: iterable of sentences (lists of tokens, or strings split on spaces).

    Returns:
        The perplexity (``inf`` when a token has probability 0; ``nan`` for no tokens).

    Example:
        >>> lm = estimate(["a b", "a b"], order=2)
        >>> 1.0 < perplexity(lm, ["a b"]) < 2.0
        True
    """
    total = 0.0
    n = 0
    for words in _sentences(sentences):
        total += lm.sentence_score(words)
        n += len(words) + 1
    if n == 0:
        return math.nan
    return math.exp(-total / n)
