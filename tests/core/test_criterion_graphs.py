"""User graphs are compiled once per (identity, version): repeated calls compile nothing."""

import gc

import pytest
import torch

import lightning_gtn.wfst as gtn
from lightning_gtn.core import criterion_graphs
from lightning_gtn.functional import graph_loss, viterbi


def chain(labels, weight=0.0):
    g = gtn.Graph(False)
    g.add_node(True)
    for i, lab in enumerate(labels):
        g.add_node(False, i == len(labels) - 1)
        g.add_arc(i, i + 1, lab, lab, weight)
    return g


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = criterion_graphs.compile_graph

    def counting(g, *args, **kwargs):
        calls.append(g)
        return real(g, *args, **kwargs)

    monkeypatch.setattr(criterion_graphs, "compile_graph", counting)
    criterion_graphs.clear_cache()
    yield calls
    criterion_graphs.clear_cache()


def test_graph_loss_compiles_each_graph_once(count_compiles):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3).log_softmax(-1)
    graphs = [chain([0, 1]), chain([2])]
    first = graph_loss(x, None, torch.tensor([4, 3]), graphs=graphs, reduction="none")
    assert len(count_compiles) == 2
    second = graph_loss(x, None, torch.tensor([4, 3]), graphs=graphs, reduction="none")
    assert len(count_compiles) == 2  # no compilation on the second call
    assert torch.equal(first, second)
    assert criterion_graphs.compiled_user_graph(graphs[0]) is criterion_graphs.compiled_user_graph(graphs[0])


@pytest.mark.parametrize(
    "mutate",
    [lambda g: g.set_weights([1.0, 1.0]), lambda g: g.set_weight(0, 2.0), lambda g: g.add_arc(0, 1, 2)],
)
def test_mutating_a_graph_recompiles(count_compiles, mutate):
    x = torch.randn(1, 2, 3).log_softmax(-1)
    g = chain([0, 1])
    before = graph_loss(x, None, torch.tensor([2]), graphs=[g], reduction="none")
    cg = criterion_graphs.compiled_user_graph(g)
    mutate(g)
    after = graph_loss(x, None, torch.tensor([2]), graphs=[g], reduction="none")
    assert len(count_compiles) == 2
    assert criterion_graphs.compiled_user_graph(g) is not cg
    assert torch.isfinite(before) and torch.isfinite(after)
    assert not torch.equal(before, after)  # the change is seen (weights or an extra path)


def test_viterbi_uses_the_cache_and_checks_labels(count_compiles):
    x = torch.randn(1, 3, 3)
    g = chain([0, 1, 2])
    viterbi(x, torch.tensor([3]), blank=None, graphs=[g])
    viterbi(x, torch.tensor([3]), blank=None, graphs=[g])
    assert len(count_compiles) == 1
    with pytest.raises(ValueError, match="out of range"):
        viterbi(x, torch.tensor([3]), blank=None, graphs=[chain([0, 5, 1])])


def test_entries_go_with_their_graph():
    criterion_graphs.clear_cache()
    g = chain([0])
    criterion_graphs.compiled_user_graph(g)
    assert len(criterion_graphs._USER_GRAPHS) == 1
    del g
    gc.collect()
    assert len(criterion_graphs._USER_GRAPHS) == 0


def test_cache_is_bounded(monkeypatch):
    criterion_graphs.clear_cache()
    monkeypatch.setattr(criterion_graphs, "USER_CACHE_SIZE", 3)
    keep = [chain([i]) for i in range(5)]
    for g in keep:
        criterion_graphs.compiled_user_graph(g)
    assert len(criterion_graphs._USER_GRAPHS) == 3
    criterion_graphs.clear_cache()


def test_non_graph_is_a_type_error():
    with pytest.raises(TypeError):
        criterion_graphs.compiled_user_graph("not a graph")
