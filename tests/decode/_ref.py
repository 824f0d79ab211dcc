"""Test helpers: a tiny back-off n-gram LM that fulfils the LM contract, and a brute-force decoder."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from lightning_gtn.lm import LMArrays  # the contract's arrays


class TinyLM:
    """A bigram back-off LM from dicts: ``uni[w]`` log-probs, ``bi[(u, w)]`` log-probs, ``bo[u]``.

    ``score`` works on the dicts (the reference); ``arrays`` builds the contract's arrays (what the
    decoder reads), so the two paths are independent.
    """

    order = 2

    def __init__(
        self, vocab: Sequence[str], uni: Dict[str, float], bi: Dict[Tuple[str, str], float], bo: Dict[str, float]
    ):
        self.words = ["<s>", "</s>", "<unk>"] + [w for w in vocab if w not in ("<s>", "</s>", "<unk>")]
        self._id = {w: i for i, w in enumerate(self.words)}
        self.uni, self.bi, self.bo = uni, bi, bo
        self.contexts = sorted({u for u, _ in bi} | set(bo) | {"<s>"})

    @classmethod
    def random(cls, vocab: Sequence[str], rng, n_bigrams: int = 6) -> "TinyLM":
        full = ["</s>", "<unk>"] + list(vocab)
        uni = {w: float(-rng.uniform(0.5, 3.0)) for w in full}
        ctx = ["<s>"] + list(vocab)
        bi = {}
        for _ in range(n_bigrams):
            u = ctx[rng.integers(len(ctx))]
            w = full[rng.integers(len(full))]
            bi[(u, w)] = float(-rng.uniform(0.05, 2.0))
        bo = {u: float(-rng.uniform(0.0, 1.0)) for u in ctx if rng.random() < 0.7}
        return cls(vocab, uni, bi, bo)

    def word_id(self, w: str) -> int:
        return self._id.get(w, self._id["<unk>"])

    # --- the reference (dicts) ---
    def _name(self, state: int) -> Optional[str]:
        return None if state == 0 else self.contexts[state - 1]

    def _state_of(self, w: str) -> int:
        return self.contexts.index(w) + 1 if w in self.contexts else 0

    def start_state(self) -> int:
        return self._state_of("<s>")

    def score(self, state: int, word: int) -> Tuple[float, int]:
        w = self.words[word]
        u = self._name(state)
        nxt = self._state_of(w)
        if u is not None and (u, w) in self.bi:
            return self.bi[(u, w)], nxt
        acc = self.bo.get(u, 0.0) if u is not None else 0.0
        return acc + self.uni[w], nxt

    def final_score(self, state: int) -> float:
        return self.score(state, self.word_id("</s>"))[0]

    def sentence(self, words: Sequence[str]) -> float:
        s, tot = self.start_state(), 0.0
        for w in words:
            lp, s = self.score(s, self.word_id(w))
            tot += lp
        return tot + self.final_score(s)

    # --- the contract's arrays ---
    def arrays(self) -> LMArrays:
        offs, aw, alp, an, bol, bos = [0], [], [], [], [], []
        root = sorted((self._id[w], lp) for w, lp in self.uni.items())
        for wid, lp in root:
            aw.append(wid), alp.append(lp), an.append(self._state_of(self.words[wid]))
        offs.append(len(aw))
        bol.append(0.0), bos.append(-1)
        for u in self.contexts:
            arcs = sorted((self._id[w], lp) for (uu, w), lp in self.bi.items() if uu == u)
            for wid, lp in arcs:
                aw.append(wid), alp.append(lp), an.append(self._state_of(self.words[wid]))
            offs.append(len(aw))
            bol.append(self.bo.get(u, 0.0)), bos.append(0)
        return LMArrays(
            np.array(offs, np.int64),
            np.array(aw, np.int32),
            np.array(alp, np.float32),
            np.array(an, np.int32),
            np.array(bol, np.float32),
            np.array(bos, np.int32),
            self.start_state(),
            0,
            1,
            2,
        )


def collapse(path, topology: str, blank: Optional[int], rep: Optional[int], sep: Optional[int]):
    """Frame path -> emitted tokens (None if the path is invalid: ASG repeat with nothing to repeat)."""
    out: List[int] = []
    prev = None
    for lab in path:
        if lab != prev and lab != blank:
            if rep is not None and lab == rep:
                if not out or out[-1] == sep:
                    return None
                out.append(out[-1])
            else:
                out.append(lab)
        prev = lab
    return out


def segmentations(toks: Sequence[int], spell: Dict[str, List[List[int]]], sep: Optional[int]):
    """All word sequences (one per segmentation, spelling choices included) spelling ``toks``;
    ``sep`` tokens may appear only between words."""
    toks = tuple(toks)
    out = []

    def rec(i, acc):
        if i == len(toks):
            out.append(tuple(acc))
            return
        if toks[i] == sep:
            rec(i + 1, acc)
            return
        for w, sps in spell.items():
            for sp in {tuple(s) for s in sps}:
                if toks[i : i + len(sp)] == sp:
                    rec(i + len(sp), acc + [w])

    rec(0, [])
    return out


def _lse(xs):
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def _trans_score(trans, path):
    if trans is None:
        return 0.0
    s = float(trans[0, path[0]]) if len(path) else 0.0
    return s + sum(float(trans[path[t] + 1, path[t - 1]]) for t in range(1, len(path)))


def brute_lexicon(
    em, topology, blank, rep, sep, spell, lm=None, lm_weight=0.0, word_score=0.0, hotwords=None, trans=None
):
    """Word sequence -> total score, summing over (frame path, segmentation) pairs."""
    T, C = em.shape
    acc = defaultdict(list)
    for path in itertools.product(range(C), repeat=T):
        toks = collapse(path, topology, blank, rep, sep)
        if toks is None:
            continue
        ac = float(sum(float(em[t, c]) for t, c in enumerate(path))) + _trans_score(trans, path)
        for words in segmentations(toks, spell, sep):
            acc[words].append(ac)
    res = {}
    for words, lst in acc.items():
        s = _lse(lst) + word_score * len(words) + sum((hotwords or {}).get(w, 0.0) for w in words)
        if lm is not None:
            s += lm_weight * (lm.sentence(words) if hasattr(lm, "sentence") else lm.sentence_score(list(words)))
        res[words] = s
    return res


def brute_free(em, tokens, topology, blank, rep, sep, lm=None, lm_weight=0.0, word_score=0.0, hotwords=None):
    """Lexicon-free: words tuple of the text -> total score (token LM over the kept tokens)."""
    T, C = em.shape
    acc = defaultdict(list)
    for path in itertools.product(range(C), repeat=T):
        toks = collapse(path, topology, blank, rep, sep)
        if toks is None:
            continue
        ac = float(sum(float(em[t, c]) for t, c in enumerate(path)))
        kept, open_word, nwords = [], False, 0
        for k in toks:
            if k == sep:
                if open_word:
                    kept.append(k)
                open_word = False
            else:
                if not open_word:
                    nwords += 1
                open_word = True
                kept.append(k)
        words = tuple(w for w in "".join(tokens[k] for k in toks).split(tokens[sep] if sep is not None else "\0") if w)
        s = ac + word_score * nwords
        if lm is not None:
            s += lm_weight * lm.sentence([tokens[k] for k in kept])
        acc[words].append(s)
    return {w: _lse(lst) + sum((hotwords or {}).get(x, 0.0) for x in w) for w, lst in acc.items()}


def random_emissions(rng, T, C, peak=0.0):
    x = rng.normal(size=(T, C)) * (1.0 + peak)
    x = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return x.astype(np.float32)
