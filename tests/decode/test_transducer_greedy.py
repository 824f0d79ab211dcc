"""greedy_search on hand-built networks whose best label at each (frame, labels so far) is a
table lookup, so the answer is known: the labels, max_symbols_per_frame, per-example lengths,
tuple states batched along different dimensions, TDT durations, multi-blank big blanks."""

import pytest
import torch

from lightning_gtn.decode.transducer import greedy_search

BLANK = 0


class TableNet:
    """A transducer network whose joiner emits ``table[b][t][u]`` (a class id; 0 the blank) at
    frame ``t`` of example ``b`` after ``u`` labels, as a one-hot score; the state is the label
    count, kept as a tuple batched along dimension 0 (the count) and 1 (a copy of it), so that
    greedy_search's merge of states is exercised. ``extra`` adds outputs that give a duration
    index: ``dur[b][t][u]``."""

    def __init__(self, table, V, extra=0, dur=None):
        self.table, self.V, self.extra, self.dur = table, V, extra, dur
        self.calls = 0

    def encoder_out(self):
        B, T = len(self.table), max(len(r) for r in self.table)
        enc = torch.zeros(B, T, 3)
        enc[:, :, 0] = torch.arange(T, dtype=torch.float)[None]
        enc[:, :, 2] = torch.arange(B, dtype=torch.float)[:, None]
        return enc

    def predict(self, tokens, state=None):
        self.calls += 1
        N, S = tokens.shape
        count = torch.zeros(N, 1) if state is None else state[0].clone()
        assert state is None or torch.equal(state[1][0, :, 0], count[:, 0]), "the state's two copies diverged"
        outs = []
        for s in range(S):
            count = count + (tokens[:, s : s + 1] != BLANK).float()
            outs.append(torch.cat([torch.zeros(N, 1), count, torch.zeros(N, 1)], 1))
        return torch.stack(outs, 1), (count, count[None].expand(2, N, 1).clone())

    def select_state(self, state, index):
        return state[0][index], state[1][:, index]

    def join(self, enc, pred):
        s = enc + pred
        out = torch.full((*s.shape[:-1], self.V + self.extra), -10.0)
        for i in range(s.shape[0]):
            t, u, b = (int(v) for v in s[i])
            row = self.table[b][t]
            out[i, row[u] if u < len(row) else BLANK] = 0.0
            if self.extra:
                out[i, self.V + self.dur[b][t][min(u, len(self.dur[b][t]) - 1)]] = 1.0
        return out


def test_known_labels_per_example_lengths_and_no_blanks():
    # example 0: frame 0 emits 1 then 2, frame 1 nothing, frame 2 emits 3; example 1 (2 frames
    # valid of 3): frame 0 nothing, frame 1 emits 4, frame 2 (padding) would emit 1
    table = [[[1, 2, 0], [0, 0, 0, 0], [0, 0, 3, 0]], [[0], [4, 0], [0, 1]]]
    net = TableNet(table, V=5)
    hyps = greedy_search(net, net.encoder_out(), torch.tensor([3, 2]), blank=BLANK)
    assert hyps == [[1, 2, 3], [4]]


def test_max_symbols_per_frame_caps_labels_on_one_frame():
    table = [[[1, 1, 1, 1, 1, 0], [2, 2, 2, 2, 2, 2, 2, 0]]]  # frame 0 would emit five 1s
    net = TableNet(table, V=3)
    assert greedy_search(net, net.encoder_out(), torch.tensor([2]), blank=BLANK, max_symbols_per_frame=2) == [
        [1, 1, 2, 2]
    ]
    assert greedy_search(net, net.encoder_out(), torch.tensor([2]), blank=BLANK, max_symbols_per_frame=5) == [
        [1, 1, 1, 1, 1, 2, 2]
    ]


def test_empty_examples_and_zero_lengths():
    table = [[[1, 0]], [[2, 0]]]
    net = TableNet(table, V=3)
    assert greedy_search(net, net.encoder_out(), torch.tensor([0, 1]), blank=BLANK) == [[], [2]]
    assert greedy_search(net, torch.zeros(0, 4, 3), torch.zeros(0, dtype=torch.long), blank=BLANK) == []


def test_tdt_durations_skip_frames():
    # durations [0, 1, 2]; rows are indexed by the labels emitted so far. Frame 0 emits 1 with
    # duration 2 (frame 1, which would emit 2, is skipped); frame 2 emits 3 with duration 0, then
    # a blank whose duration 0 still moves one frame; frame 3 emits 4 with duration 1.
    table = [[[1, 0], [0, 2, 0], [0, 3, 0], [0, 0, 4, 0]]]
    dur = [[[2, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1, 1]]]
    net = TableNet(table, V=5, extra=3, dur=dur)
    assert greedy_search(net, net.encoder_out(), torch.tensor([4]), blank=BLANK, durations=[0, 1, 2]) == [[1, 3, 4]]
    # the same joiner read as plain RNN-T (the extra outputs ignored) visits every frame
    assert greedy_search(net, net.encoder_out(), torch.tensor([4]), blank=BLANK, num_classes=5) == [[1, 2, 4]]


def test_multiblank_big_blank_skips_its_frames():
    # outputs 0..2 tokens (0 the blank), 3 a big blank of 2 frames: frame 0 emits the big blank,
    # so frame 1 (which would emit 1) is skipped and frame 2 emits 2
    table = [[[3], [1, 0], [2, 0]]]
    net = TableNet(table, V=4)
    got = greedy_search(net, net.encoder_out(), torch.tensor([3]), blank=BLANK, big_blank_durations=[2])
    assert got == [[2]]


def test_bad_arguments_are_reported():
    net = TableNet([[[0]]], V=2)
    enc = net.encoder_out()
    with pytest.raises(ValueError, match=r"encoder_out must be a tensor of shape \(B, T, J\)"):
        greedy_search(net, enc[0], torch.tensor([1]), blank=0)
    with pytest.raises(ValueError, match=r"encoder_lengths must be in \[0, T=1\]"):
        greedy_search(net, enc, torch.tensor([2]), blank=0)
    with pytest.raises(ValueError, match=r"encoder_lengths must have shape \(B,\)"):
        greedy_search(net, enc, torch.tensor([1, 1]), blank=0)
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        greedy_search(net, enc, torch.tensor([1]), blank=0, max_symbols_per_frame=0)
    with pytest.raises(ValueError, match="blank"):
        greedy_search(net, enc, torch.tensor([1]), blank=-1)
    with pytest.raises(ValueError, match="does not match num_classes"):
        greedy_search(net, enc, torch.tensor([1]), blank=0, num_classes=5)
