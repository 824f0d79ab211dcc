"""viterbi decoding against brute force."""

import itertools

import torch

from lightning_gtn.functional import collapse, viterbi
from tests.losses._brute import asg_path_score


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
    for _trial in range(3):
        x = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
        tr = torch.randn(4, 3, generator=g, dtype=torch.float64)
        tokens, paths = viterbi(x, [5, 4], blank=None, transitions=tr, return_paths=True)
        for b, T in enumerate([5, 4]):
            best = max(itertools.product(range(3), repeat=T), key=lambda p: asg_path_score(x[b], tr, list(p)).item())
            assert paths[b] == list(best)
            assert tokens[b] == collapse(best)


def test_graph_decoding_force_aligns_through_epsilon_arcs():
    import lightning_gtn.wfst as gtn
    from tests.losses._brute import ctc_paths, emission_score

    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 6, 3, generator=g, dtype=torch.float64)
    target = [1, 2]
    crit = gtn.criterion.ctc_graph(target, 0)
    # an epsilon detour in front: a new start node that reaches the old start for free
    pre = gtn.Graph(False)
    pre.add_node(True)
    for i in range(crit.num_nodes()):
        pre.add_node(False, crit.is_accept(i))
    pre.add_arc(0, 1, gtn.epsilon)
    for a in range(crit.num_arcs()):
        pre.add_arc(crit.srcnode(a) + 1, crit.dstnode(a) + 1, crit.ilabel(a))
    tokens, paths = viterbi(x, [6], blank=0, graphs=pre, return_paths=True)
    best = max(ctc_paths(target, 6, 0), key=lambda p: emission_score(x[0], p).item())
    assert paths[0] == best and tokens[0] == target
