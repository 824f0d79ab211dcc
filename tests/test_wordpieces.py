"""Word pieces: the BPE-style trainer, greedy segmentation, and the piece file format."""

import os
import random
import tempfile
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_gtn.wordpieces import greedy_segment, load_word_pieces, save_word_pieces, train_word_pieces

_WORDS = (
    "the a cat cats sat sitting hat hats that this these mat on in under over quickly slowly "
    "father fathers mother stand stands standing walked walks talking talked city cities don't "
    "arrive arrives today tomorrow we she he they smiled smiles across two three"
).split()


def make_sentences(num, seed):
    """Seeded English-like transcripts (kept here: the data module drags in Lightning)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8))) for _ in range(num)]


TEXTS = ["the cat sat", "the hat", "that cat", "a cat that sat on the mat"]


def _reference_bpe(texts, num_pieces, min_count=1, sep=" "):
    """An independent, slow BPE: recount every pair from scratch at every step."""
    words = Counter(w for t in texts for w in t.split(sep) if w)
    segs = {w: list(w) for w in words}
    pieces = sorted({c for w in words for c in w} | {sep})
    while len(pieces) < num_pieces:
        pairs = Counter()
        for w, f in words.items():
            s = segs[w]
            for p in zip(s, s[1:]):
                pairs[p] += f
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < min_count:
            break
        for w in words:
            s, out, k = segs[w], [], 0
            while k < len(s):
                if k + 1 < len(s) and (s[k], s[k + 1]) == best:
                    out.append(s[k] + s[k + 1])
                    k += 2
                else:
                    out.append(s[k])
                    k += 1
            segs[w] = out
        if best[0] + best[1] not in pieces:
            pieces.append(best[0] + best[1])
    return pieces


def test_graphemes_first_and_separator_is_a_piece():
    pieces = train_word_pieces(TEXTS, 20)
    graphemes = sorted(set("".join(TEXTS)))
    assert pieces[: len(graphemes)] == graphemes
    assert " " in pieces
    assert len(pieces) == len(set(pieces)) <= 20
    # No piece crosses a word boundary: the space occurs only as the piece " " itself.
    assert all(" " not in p for p in pieces if p != " ")


def test_separator_is_a_piece_even_without_spaces():
    assert train_word_pieces(["abab"], 3, min_count=1) == [" ", "a", "b"]
    assert "|" in train_word_pieces(["ab|ab"], 3, word_boundary="|")


def test_matches_a_slow_reference_and_is_deterministic():
    texts = make_sentences(300, seed=3)
    fast = train_word_pieces(texts, 120, min_count=1)
    assert fast == _reference_bpe(texts, 120)
    assert train_word_pieces(list(texts), 120, min_count=1) == fast


def test_ties_are_broken_lexically():
    # ("a","b") and ("c","d") both occur twice: the lexically smaller pair is merged first.
    assert train_word_pieces(["cd ab", "ab cd"], 6, min_count=1)[5] == "ab"
    assert train_word_pieces(["ab cd", "cd ab"], 6, min_count=1)[5] == "ab"


def test_min_count_stops_merging():
    pieces = train_word_pieces(["abc", "abd"], 50, min_count=2)
    assert pieces == [" ", "a", "b", "c", "d", "ab"]  # only ("a", "b") occurs twice
    assert len(train_word_pieces(["abc", "abd"], 50, min_count=3)) == 5


def test_every_training_text_is_spellable_and_segments_round_trip():
    texts = make_sentences(500, seed=1)
    pieces = train_word_pieces(texts, 150)
    for t in texts:
        ids = greedy_segment(t, pieces)
        assert "".join(pieces[i] for i in ids) == t
        for w in t.split(" "):
            ids = greedy_segment(w, pieces)
            assert "".join(pieces[i] for i in ids) == w


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet="ab c\u00e9\n\\\u00a0\r", max_size=12), min_size=1, max_size=8),
    st.integers(0, 20),
    st.integers(1, 3),
)
def test_property_spellable_and_within_budget(texts, extra, min_count):
    n_graphemes = len(set("".join(texts)) | {" "})
    pieces = train_word_pieces(texts, n_graphemes + extra, min_count=min_count)
    assert n_graphemes <= len(pieces) <= n_graphemes + extra
    assert len(set(pieces)) == len(pieces)
    for t in texts:
        assert "".join(pieces[i] for i in greedy_segment(t, pieces)) == t
    with tempfile.TemporaryDirectory() as d:
        save_word_pieces(pieces, os.path.join(d, "p.txt"))
        assert load_word_pieces(os.path.join(d, "p.txt")) == pieces


def test_greedy_segment_is_longest_match_first():
    pieces = ["a", "b", "ab", "abab", "ba"]
    assert greedy_segment("ababa", pieces) == [3, 0]
    assert greedy_segment("bab", pieces) == [4, 1]
    assert greedy_segment("", pieces) == []


def test_greedy_segment_errors():
    with pytest.raises(ValueError, match="'z' at position 2"):
        greedy_segment("abz", ["a", "b"])
    with pytest.raises(ValueError, match="duplicate"):
        greedy_segment("a", ["a", "a"])
    with pytest.raises(ValueError, match="empty"):
        greedy_segment("a", ["a", ""])
    with pytest.raises(TypeError, match="word"):
        greedy_segment(["a"], ["a"])
    with pytest.raises(TypeError, match=r"pieces\[1\] must be a str"):
        greedy_segment("a", ["a", ["b"]])
    with pytest.raises(TypeError, match="pieces must be a sequence of str"):
        greedy_segment("a", "ab")


def test_train_argument_errors():
    with pytest.raises(TypeError, match="texts must be a sequence of str"):
        train_word_pieces("the cat", 10)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        train_word_pieces(["a", 3], 10)
    with pytest.raises(ValueError, match="at least the number of distinct graphemes"):
        train_word_pieces(["abc"], 3)  # a, b, c and the space
    with pytest.raises(TypeError, match="num_pieces must be an int"):
        train_word_pieces(["abc"], 10.0)
    with pytest.raises(TypeError, match="num_pieces must be an int"):
        train_word_pieces(["abc"], True)
    with pytest.raises(ValueError, match="min_count"):
        train_word_pieces(["abc"], 10, min_count=0)
    with pytest.raises(ValueError, match="word_boundary"):
        train_word_pieces(["abc"], 10, word_boundary="  ")


def test_progress_bar_does_not_change_the_result():
    texts = make_sentences(200, seed=5)
    assert train_word_pieces(texts, 80, progress=True) == train_word_pieces(texts, 80, progress=False)


# -- files ------------------------------------------------------------------------------------


def test_save_load_round_trip_with_odd_pieces(tmp_path):
    pieces = [" ", "a", "\\", "\\s", "\n", "\t", "x y", "\u00a0", "\u00e9t\u00e9", "\U0001f600", "\r", "#"]
    path = tmp_path / "pieces.txt"
    save_word_pieces(pieces, path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    assert len(lines) == len(pieces) + 1 and lines[-1] == ""
    assert all(line and line == line.strip() for line in lines[:-1])
    assert load_word_pieces(path) == pieces


def test_trained_pieces_round_trip(tmp_path):
    pieces = train_word_pieces(make_sentences(200, seed=2), 100)
    save_word_pieces(pieces, tmp_path / "p.txt")
    assert load_word_pieces(str(tmp_path / "p.txt")) == pieces


def test_load_accepts_crlf_and_no_final_newline(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"\\s\r\na\r\nb")
    assert load_word_pieces(path) == [" ", "a", "b"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "no word pieces"),
        (b"a\n\nb\n", "line 2 is empty"),
        (b"a\nb\na\n", "line 3 repeats the piece 'a' of line 1"),
        (b"a\n\\q\n", r"line 2: unknown escape"),
        (b"a\\\n", r"line 1: unknown escape"),
        (b"\\U0000zz41\n", "8 hex digits"),
        (b"\\U00110000\n", "not a Unicode scalar value"),
        (b"\\U0000d800\n", "not a Unicode scalar value"),
        (b"a\tb\n", "raw character U\\+0009"),
        (b"\xff\xfe\n", "not UTF-8"),
    ],
)
def test_load_rejects_malformed_files(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_word_pieces(path)


def test_load_refuses_oversized_files(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"ab\n" * 1000)
    with pytest.raises(ValueError, match="larger than max_bytes=100"):
        load_word_pieces(path, max_bytes=100)
    if os.path.exists("/dev/zero"):  # a file that never ends is not read at all
        with pytest.raises(ValueError, match="not a regular file"):
            load_word_pieces("/dev/zero", max_bytes=1000)


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_word_pieces(tmp_path / "nope.txt")


def test_save_rejects_bad_pieces(tmp_path):
    with pytest.raises(ValueError, match="duplicate"):
        save_word_pieces(["a", "a"], tmp_path / "p.txt")
    with pytest.raises(ValueError, match="must not be empty"):
        save_word_pieces([], tmp_path / "p.txt")
    with pytest.raises(TypeError):
        save_word_pieces(["a", 1], tmp_path / "p.txt")


def test_docstring_examples():
    import doctest

    import lightning_gtn.wordpieces as module

    assert doctest.testmod(module).failed == 0
