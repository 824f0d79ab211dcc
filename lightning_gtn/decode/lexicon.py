"""The lexicon L of a decoder: words and their token spellings, as a prefix trie in flat arrays."""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

import numpy as np

__all__ = ["Lexicon", "MAX_TRIE_NODES", "MAX_SPELLING_TOKENS"]

#: the most trie nodes a lexicon builds (about 2 GB of Python objects while building)
MAX_TRIE_NODES = 1 << 23
#: the most tokens over all spellings (each is a step of the trie's construction)
MAX_SPELLING_TOKENS = 1 << 24


class Lexicon:
    """Words and their spellings as sequences of output-token ids, built into a token prefix trie.

    A word may have several spellings (pronunciations, or word-piece segmentations), and several
    words may share a spelling (then a decoder emits each of them from the same trie node). The trie
    is stored as flat arrays for the compiled decoder: node 0 is the root; the children of node
    ``n`` are ``child_node[child_offsets[n]:child_offsets[n + 1]]`` reached by the tokens
    ``child_token[...]`` (sorted ascending), and the words spelled by the path to ``n`` are
    ``node_word[word_offsets[n]:word_offsets[n + 1]]`` (indices into :attr:`words`).

    Args:
        words_to_spellings: word -> list of spellings, each a non-empty list of token ids (int >= 0).
            Insertion order gives the word ids.

    Example:
        >>> lex = Lexicon({"ab": [[1, 2]], "a": [[1]]})
        >>> lex.words, lex.num_nodes
        (['ab', 'a'], 3)
    """

    def __init__(self, words_to_spellings: Mapping[str, Sequence[Sequence[int]]]):
        if not isinstance(words_to_spellings, Mapping):
            raise ValueError(
                f"words_to_spellings must be a dict word -> list of spellings, got {type(words_to_spellings).__name__}"
            )
        if len(words_to_spellings) == 0:
            raise ValueError("words_to_spellings is empty: a lexicon needs at least one word")
        self.words: List[str] = []
        # the trie as one dict (node, token) -> child and the words ending at each node: nodes are
        # numbered in the order they are first reached (the decoder's tie order), and one dict of
        # tuples takes about half the memory of a dict per node
        edges: Dict[Tuple[int, int], int] = {}
        node_words: Dict[int, List[int]] = {}
        num_nodes = 1
        max_token = -1
        total = 0
        top = int(np.iinfo(np.int32).max)
        for word, spellings in words_to_spellings.items():
            if not isinstance(word, str) or not word:
                raise ValueError(f"words_to_spellings: words must be non-empty strings, got {word!r}")
            if isinstance(spellings, (str, bytes)) or not isinstance(spellings, Iterable):
                raise ValueError(f"words_to_spellings[{word!r}] must be a list of spellings (lists of token ids)")
            wid = len(self.words)
            self.words.append(word)
            n_sp = 0
            for sp in spellings:
                if isinstance(sp, (str, bytes)) or not isinstance(sp, Iterable):
                    raise ValueError(
                        f"words_to_spellings[{word!r}]: a spelling must be a list of token ids, got {sp!r}"
                    )
                sp = list(sp)
                if not sp:
                    raise ValueError(f"words_to_spellings[{word!r}]: empty spelling")
                total += len(sp)
                if total > MAX_SPELLING_TOKENS:
                    raise ValueError(
                        f"words_to_spellings: more than MAX_SPELLING_TOKENS={MAX_SPELLING_TOKENS} tokens over all "
                        "spellings (fewer words, or fewer spellings per word)"
                    )
                node = 0
                for tok in sp:
                    if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, (int, np.integer)):
                        raise ValueError(f"words_to_spellings[{word!r}]: token ids must be integers, got {tok!r}")
                    tok = int(tok)
                    if tok < 0 or tok > top:
                        raise ValueError(f"words_to_spellings[{word!r}]: token id {tok} out of range (must be >= 0)")
                    if tok > max_token:
                        max_token = tok
                    nxt = edges.get((node, tok))
                    if nxt is None:
                        nxt = num_nodes
                        if nxt >= MAX_TRIE_NODES:
                            raise ValueError(
                                f"words_to_spellings: the trie would exceed MAX_TRIE_NODES={MAX_TRIE_NODES} nodes "
                                "(fewer words, or fewer spellings per word)"
                            )
                        edges[(node, tok)] = nxt
                        num_nodes += 1
                    node = nxt
                here = node_words.setdefault(node, [])
                if wid not in here:
                    here.append(wid)
                n_sp += 1
            if n_sp == 0:
                raise ValueError(f"words_to_spellings[{word!r}] has no spelling")
        #: the largest token id used by a spelling (checked against the decoder's tokens)
        self.max_token = max_token
        N = num_nodes
        E = len(edges)
        src = np.fromiter((k[0] for k in edges), dtype=np.int64, count=E)
        tok_of = np.fromiter((k[1] for k in edges), dtype=np.int64, count=E)
        child = np.fromiter(edges.values(), dtype=np.int64, count=E)
        del edges
        order = np.lexsort((tok_of, src))  # each node's children by token
        self.child_token = tok_of[order].astype(np.int32)
        self.child_node = child[order].astype(np.int32)
        self.child_offsets = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=N), out=self.child_offsets[1:])
        ends = sorted(node_words)
        self.word_offsets = np.zeros(N + 1, dtype=np.int64)
        counts = np.zeros(N, dtype=np.int64)
        counts[ends] = [len(node_words[n]) for n in ends]
        np.cumsum(counts, out=self.word_offsets[1:])
        self.node_word = np.asarray([w for n in ends for w in node_words[n]], dtype=np.int32)
        self._index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def from_words(cls, words: Iterable[str], token_of: Mapping[str, int]) -> "Lexicon":
        """A lexicon of letter spellings: each word spelled by the tokens of its characters.

        Args:
            words: the words (duplicates are merged).
            token_of: character -> token id.

        Example:
            >>> Lexicon.from_words(["ab", "ba"], {"a": 1, "b": 2}).words
            ['ab', 'ba']
        """
        if isinstance(words, str):
            raise ValueError("words must be a list of words, not one string")
        spell: Dict[str, List[List[int]]] = {}
        for w in words:
            if not isinstance(w, str) or not w:
                raise ValueError(f"words: each word must be a non-empty string, got {w!r}")
            missing = [ch for ch in w if ch not in token_of]
            if missing:
                raise ValueError(f"words: word {w!r} uses characters {missing!r} that token_of does not map")
            spell.setdefault(w, [[int(token_of[ch]) for ch in w]])
        return cls(spell)

    @classmethod
    def from_pieces(
        cls, words: Iterable[str], pieces: Sequence[str], *, max_spellings: int = 16, skip: Iterable[int] = ()
    ) -> "Lexicon":
        """A lexicon of word-piece spellings: every way to write each word with the pieces.

        Each word gets its decompositions into ``pieces`` (as the word-piece transducer's
        learned decompositions), the ones with fewest pieces first, at most ``max_spellings``.

        Args:
            words: the words.
            pieces: the token strings (index = token id); empty strings never match.
            max_spellings: the most spellings kept per word (bounds the trie).
            skip: token ids never used in spellings (the blank, a separator).

        Example:
            >>> lex = Lexicon.from_pieces(["abab"], ["a", "b", "ab", "<b>"], skip=[3])
            >>> lex.num_nodes > 1, len(lex)
            (True, 1)
        """
        if isinstance(words, str):
            raise ValueError("words must be a list of words, not one string")
        if isinstance(max_spellings, bool) or not isinstance(max_spellings, int) or max_spellings < 1:
            raise ValueError(f"max_spellings must be a positive integer, got {max_spellings!r}")
        skip = {int(k) for k in skip}
        by_text: Dict[str, List[int]] = {}  # piece -> its token ids, ascending
        for i, p in enumerate(pieces):
            if isinstance(p, str) and p and i not in skip:
                by_text.setdefault(p, []).append(i)
        longest = max(map(len, by_text), default=0)
        spell: Dict[str, List[List[int]]] = {}
        total = 0
        for w in words:
            if not isinstance(w, str) or not w:
                raise ValueError(f"words: each word must be a non-empty string, got {w!r}")
            n = len(w)
            # best[i]: up to max_spellings decompositions of w[i:], fewest pieces first, each as
            # (pieces, token, j, k): the token, then decomposition k of w[j:] (no lists copied)
            best: List[List[tuple]] = [[] for _ in range(n + 1)]
            best[n] = [(0, -1, n, -1)]
            for i in range(n - 1, -1, -1):
                starts = sorted(
                    (tok, i + ln) for ln in range(1, min(longest, n - i) + 1) for tok in by_text.get(w[i : i + ln], ())
                )
                cand = [(best[j][k][0] + 1, tok, j, k) for tok, j in starts for k in range(len(best[j]))]
                cand.sort(key=lambda c: c[0])  # stable: token order within a length, as the pieces
                best[i] = cand[:max_spellings]
            if not best[0]:
                raise ValueError(f"words: {w!r} cannot be spelled with the pieces")
            out = []
            for entry in best[0]:
                sp = []
                while entry[1] >= 0:
                    sp.append(entry[1])
                    entry = best[entry[2]][entry[3]]
                out.append(sp)
            spell[w] = out
            total += sum(map(len, out))
            if total > MAX_SPELLING_TOKENS:  # before the trie: each token is a step of its construction
                raise ValueError(
                    f"words: more than MAX_SPELLING_TOKENS={MAX_SPELLING_TOKENS} tokens over all spellings "
                    f"(fewer words, or a smaller max_spellings than {max_spellings})"
                )
        return cls(spell)

    @property
    def num_nodes(self) -> int:
        """The number of trie nodes, the root included."""
        return len(self.child_offsets) - 1

    def spellings(self) -> Dict[str, List[List[int]]]:
        """``{word: [spelling, ...]}`` read back from the trie (each spelling a list of token ids)."""
        out: Dict[str, List[List[int]]] = {}
        stack: List[Tuple[int, List[int]]] = [(0, [])]
        while stack:
            node, path = stack.pop()
            for i in range(int(self.word_offsets[node]), int(self.word_offsets[node + 1])):
                out.setdefault(self.words[int(self.node_word[i])], []).append(path)
            for i in range(int(self.child_offsets[node]), int(self.child_offsets[node + 1])):
                stack.append((int(self.child_node[i]), path + [int(self.child_token[i])]))
        return out

    def word_id(self, word: str) -> int:
        """The id of ``word`` (KeyError if it is not in the lexicon)."""
        return self._index[word]

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def __len__(self) -> int:
        return len(self.words)

    def __repr__(self) -> str:
        return f"Lexicon({len(self.words)} words, {self.num_nodes} trie nodes)"
