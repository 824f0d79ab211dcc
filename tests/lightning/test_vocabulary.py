import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_gtn.lightning import Vocabulary

CHARS = "0123456789 "
texts = st.text(alphabet=CHARS, max_size=12)


@given(texts)
@settings(max_examples=60, deadline=None)
def test_blank_round_trip_and_collapse(text):
    v = Vocabulary(CHARS, blank=True)
    ids = v.encode(text)
    assert 0 not in ids and len(ids) == len(text)
    assert v.decode_tokens(ids) == text
    # A CTC-style path: each token repeated twice, blanks between tokens.
    path = [0]
    for i in ids:
        path += [i, i, 0]
    assert v.decode_path(path) == text


@given(texts)
@settings(max_examples=60, deadline=None)
def test_repeat_label_round_trip_without_blank(text):
    v = Vocabulary(CHARS, blank=False, repeat_label=True)
    ids = v.encode(text)
    # no two equal neighbours, so a frame path that repeats each token still decodes
    assert all(a != b for a, b in zip(ids, ids[1:]))
    path = [i for i in ids for _ in range(3)]
    assert v.decode_path(path) == text


def test_ids_and_num_classes():
    v = Vocabulary("ab", blank=True)
    assert v.encode("ab") == [1, 2] and v.num_classes == 3 and v.blank_id == 0
    w = Vocabulary("ab", blank=False, repeat_label=True)
    assert w.encode("aab") == [0, 2, 1] and w.num_classes == 3 and w.repeat_id == 2
    assert w.encode("aaa") == [0, 2, 0]
    plain = Vocabulary("ab", blank=False)
    assert plain.num_classes == 2 and plain.decode_path([0, 0, 1]) == "ab"


def test_batch_encode_pads():
    v = Vocabulary("ab", blank=True)
    targets, lengths = v.batch_encode(["ab", "", "bab"])
    assert targets.shape == (3, 3) and lengths.tolist() == [2, 0, 3]
    assert targets[2].tolist() == [2, 1, 2] and targets.dtype == torch.long


def test_errors():
    with pytest.raises(ValueError, match="not in the vocabulary"):
        Vocabulary("ab").encode("abc")
    with pytest.raises(ValueError, match="unique"):
        Vocabulary("aa")
    with pytest.raises(ValueError, match="repeat_label"):
        Vocabulary("ab", blank=True, repeat_label=True)


def test_dict_round_trip():
    v = Vocabulary("xyz", blank=False, repeat_label=True)
    assert repr(Vocabulary.from_dict(v.to_dict())) == repr(v)
