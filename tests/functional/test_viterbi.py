"""viterbi decoding against brute force."""

import itertools

import torch

from lightning_gtn.functional import collapse, viterbi

from ._brute import asg_path_score


def test_collapse_rules():
    assert collapse([0, 1, 1, 0, 1, 2, 2, 0], blank=0) == [1, 1, 2]
    assert collapse([1, 1, 2, 2, 1], blank=None) == [1, 2, 1]


def test_argmax_decoding_with_lengths():
    x = torch.full((2, 5, 3), -5.0)
    for t, lab in enumerate([0, 1, 1, 0, 2]):
        x[0, t, lab] = 0.0
        x[1, t, lab] = 0.0
    tokens, paths = viterbi(x, [5, 3], blank=0, return_paths=True)
    assert paths == [[0, 1, 1, 0, 2], [0, 1, 1]]
    assert tokens == [[1, 2], [1]]


def test_transitions_decoding_is_the_brute_force_best_path():
    g = torch.Generator().manual_seed(0)
    for trial in range(3):
        x = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
        tr = torch.randn(4, 3, generator=g, dtype=torch.float64)
        tokens, paths = viterbi(x, [5, 4], blank=None, transitions=tr, return_paths=True)
        for b, T in enumerate([5, 4]):
            best = max(itertools.product(range(3), repeat=T), key=lambda p: asg_path_score(x[b], tr, list(p)).item())
            assert paths[b] == list(best)
            assert tokens[b] == collapse(best)
