"""Fuzzing the functional losses with malformed tensors: they may raise, never crash.

The Hypothesis loop runs in a child process (this file run as a script), so a segmentation
fault fails the test instead of killing pytest. Every call to the losses goes through
:func:`call_loss` below: update it alone when their signatures change.
"""

import os

from tests._child import run_as_child

EXPECTED = (ValueError, TypeError, IndexError, RuntimeError, KeyError)
EXAMPLES = int(os.environ.get("LGTN_FUZZ_EXAMPLES", "60"))


def call_loss(F, name, emissions, targets, input_lengths, target_lengths, extra):
    """The one place that knows the functional signatures. ``extra``: blank, transitions, graphs."""
    if name == "ctc_loss":
        return F.ctc_loss(emissions, targets, input_lengths, target_lengths, blank=extra["blank"])
    if name == "asg_loss":
        return F.asg_loss(emissions, targets, input_lengths, target_lengths, transitions=extra["transitions"])
    if name == "stc_loss":
        return F.stc_loss(emissions, targets, input_lengths, target_lengths, blank=extra["blank"])
    if name == "sequence_loss":
        return F.sequence_loss(emissions, targets, input_lengths, target_lengths)
    if name == "graph_loss":
        return F.graph_loss(emissions, None, input_lengths, graphs=extra["graphs"], reduction="none")
    if name == "viterbi":
        return F.viterbi(emissions, input_lengths, blank=extra["blank"], graphs=extra["graphs"])
    raise AssertionError(name)


LOSSES = ("ctc_loss", "asg_loss", "sequence_loss", "stc_loss", "graph_loss", "viterbi")


def test_adapter_calls_work_on_valid_input():
    """The fuzz loop accepts TypeError: make sure a stale adapter does not hide behind it."""
    import torch

    import lightning_gtn.functional as F
    from lightning_gtn.wfst.criterion import ctc_graph

    x = torch.randn(2, 6, 4).log_softmax(-1)
    extra = {"blank": 0, "transitions": torch.zeros(5, 4), "graphs": [ctc_graph([1], 0), ctc_graph([2, 3], 0)]}
    for name in LOSSES:
        out = call_loss(F, name, x, torch.tensor([[1, 0], [2, 3]]), torch.tensor([6, 5]), torch.tensor([1, 2]), extra)
        assert out is not None, name


def test_losses_survive_malformed_input():
    run_as_child(__file__)


def main():
    import torch
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import lightning_gtn.functional as F
    import lightning_gtn.wfst as gtn

    cfg = settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    odd = st.sampled_from([-1, -(2**31), 2**31, 2**40, 2**63 - 1, 10**6])

    @st.composite
    def graph(draw, C):
        g = gtn.Graph(draw(st.booleans()))
        n = draw(st.integers(1, 4))
        for i in range(n):
            g.add_node(i == 0 or draw(st.booleans()), i == n - 1 or draw(st.booleans()))
        for _ in range(draw(st.integers(0, 6))):
            lab = draw(st.one_of(st.integers(-1, C + 1), st.just(2**31 - 1)))
            g.add_arc(draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1)), lab, lab, draw(st.floats(-3, 3)))
        return g

    @st.composite
    def case(draw):
        B, T, C = draw(st.integers(1, 3)), draw(st.integers(0, 5)), draw(st.integers(1, 4))
        shape = draw(st.one_of(st.just((B, T, C)), st.lists(st.integers(0, 3), max_size=4).map(tuple)))
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64]))
        x = torch.randn(shape).to(dtype) if dtype != torch.int64 else torch.randint(0, 3, shape)
        if draw(st.booleans()) and x.numel() and x.is_floating_point():
            x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(
                st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30])
            )
        if draw(st.booleans()) and x.is_floating_point():
            x.requires_grad_(True)

        def lengths(n, hi):
            return draw(
                st.one_of(
                    st.lists(st.integers(0, hi), min_size=n, max_size=n).map(torch.tensor),
                    st.lists(st.one_of(st.integers(-3, hi + 3), odd), min_size=n, max_size=n).map(torch.tensor),
                    st.lists(st.floats(-2, hi + 2), min_size=n, max_size=n).map(torch.tensor),
                    st.lists(st.integers(0, hi), max_size=4),
                    st.none(),
                    st.just("x"),
                    st.just(torch.zeros(2, 2, dtype=torch.long)),
                )
            )

        S = draw(st.integers(0, 4))
        targets = draw(
            st.one_of(
                st.lists(st.lists(st.integers(0, C - 1), min_size=S, max_size=S), min_size=B, max_size=B).map(
                    lambda v: torch.tensor(v, dtype=torch.long).reshape(B, S)
                ),
                st.lists(
                    st.lists(st.one_of(st.integers(-2, C + 2), odd), min_size=S, max_size=S), min_size=B, max_size=B
                ).map(lambda v: torch.tensor(v).reshape(B, S)),
                st.lists(st.integers(-1, C), max_size=8).map(lambda v: torch.tensor(v, dtype=torch.long)),
                st.just(torch.zeros(0)),
                st.just(torch.rand(B, S)),
                st.none(),
            )
        )
        extra = {
            "blank": draw(st.one_of(st.integers(-1, C), odd, st.none())),
            "transitions": torch.randn(
                draw(st.one_of(st.just((C + 1, C)), st.lists(st.integers(0, 4), max_size=3).map(tuple)))
            ),
            "graphs": draw(
                st.one_of(
                    st.lists(graph(C), min_size=B, max_size=B),
                    graph(C),
                    st.lists(graph(C), max_size=4),
                    st.just(["not a graph"] * B),
                )
            ),
        }
        return x, targets, lengths(B, T), lengths(B, S), extra

    def fuzzer(name):
        # one Hypothesis test per loss, built here so that each one holds its own ``name``
        @cfg
        @given(case())
        def fuzz(args):
            x, targets, in_len, tgt_len, extra = args
            try:
                out = call_loss(F, name, x, targets, in_len, tgt_len, extra)
            except EXPECTED:
                return
            if isinstance(out, torch.Tensor) and out.requires_grad:
                try:
                    out.sum().backward()
                except EXPECTED:
                    pass

        return fuzz

    for name in LOSSES:
        fuzzer(name)()
        print("fuzzed", name, flush=True)


if __name__ == "__main__":
    main()
