"""The graph-free star alignment kernel: the graph path's paths, brute force, known paths, errors."""

import math

import numpy as np
import pytest
import torch

import lightning_gtn.align.forced as forced
from lightning_gtn.functional import forced_align
from lightning_gtn.kernels import star_paths, viterbi_paths

FIELDS = ("labels", "token_start", "token_end", "token_score", "token_confidence", "score", "star_frames")


def _both(monkeypatch, *args, **kw):
    """forced_align through the kernel and through the graph path (the same numba Viterbi over
    :func:`align_graph` as before the kernel existed)."""
    fast = forced_align(*args, **kw)
    with monkeypatch.context() as m:
        m.setattr(forced, "_STAR_KERNEL", False)
        graph = forced_align(*args, **kw)
    return fast, graph


def _assert_same(a, b, what=""):
    for f in FIELDS:
        u, v = getattr(a, f), getattr(b, f)
        assert u.dtype == v.dtype and torch.equal(u, v), f"{what}: {f} differs\n{u}\n{v}"


def _emissions(g, B, T, C, kind, dtype):
    x = torch.randn(B, T, C, generator=g, dtype=dtype)
    if kind == "ties":  # few distinct values: many equal sums
        return x.mul(0.7).round().log_softmax(-1)
    if kind == "flat":  # every path of a length scores the same
        return torch.zeros(B, T, C, dtype=dtype)
    if kind == "holes":  # -inf entries cut some paths
        x = x.mul(2).log_softmax(-1)
        return x.masked_fill(torch.rand(B, T, C, generator=g) < 0.15, -math.inf)
    return x.mul(2).log_softmax(-1)


@pytest.mark.parametrize("blank", [0, 2, None])
@pytest.mark.parametrize("kind", ["random", "ties", "flat", "holes"])
def test_the_kernel_gives_the_graph_paths_bit_for_bit(monkeypatch, blank, kind):
    g = torch.Generator().manual_seed(hash((blank, kind)) % 2**31)
    for rep in range(12):
        B, T, C = 4, int(torch.randint(0, 22, (1,), generator=g)), int(torch.randint(3, 7, (1,), generator=g))
        dtype = (torch.float32, torch.float64)[rep % 2]
        x = _emissions(g, B, T, C, kind, dtype)
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        labels = [c for c in range(C) if c != blank]
        targets = [
            [labels[int(i)] for i in torch.randint(0, len(labels), (int(torch.randint(0, 9, (1,), generator=g)),))]
            for _ in range(B)
        ]
        star = float(torch.randn((), generator=g, dtype=torch.float64) * 2)  # either sign
        fast, graph = _both(monkeypatch, x, targets, lengths, blank=blank, star=star)
        _assert_same(fast, graph, f"rep {rep}: T={T}, lengths={lengths.tolist()}, targets={targets}, star={star}")


@pytest.mark.parametrize("blank", [0, None])
def test_checkpoints_and_threads_give_the_same_paths(monkeypatch, blank):
    g = torch.Generator().manual_seed(3)
    B, T, C = 5, 260, 6
    x = torch.randn(B, T, C, generator=g).mul(0.6).round().log_softmax(-1)  # ties too
    lengths = torch.tensor([260, 200, 97, 260, 31])
    lo = 1 if blank == 0 else 0
    targets = [torch.randint(lo, C, (n,), generator=g).tolist() for n in (70, 40, 30, 0, 12)]
    fast, graph = _both(monkeypatch, x, targets, lengths, blank=blank, star=-1.3)
    _assert_same(fast, graph, "one pass")
    assert int(fast.star_frames.sum()) > 0
    monkeypatch.setattr(viterbi_paths, "BP_BUDGET", 200)  # chunks of a few frames, checkpoints
    small = forced_align(x, targets, lengths, blank=blank, star=-1.3)
    _assert_same(small, fast, "checkpointed")
    # work above the threshold of the threads (dealt round-robin), and one by one
    for b in range(B):
        n = int(lengths[b])
        one = forced_align(x[b : b + 1, :n], [targets[b]], [n], blank=blank, star=-1.3)
        assert torch.equal(one.labels[0], fast.labels[b, :n]) and torch.equal(one.score[0], fast.score[b])


# --- brute force over every path of the star topology, written from its definition ----------


def _successors(state, y, blank):
    """The next states of the star topology (``("B", g)`` blank of gap g, ``("K", l)`` token l,
    ``("R", g)`` the star of gap g; ``("S", 0)`` the start without a blank)."""
    kind, i = state
    L = len(y)
    out = []
    if blank is not None:
        if kind == "B":
            out += [("B", i), ("R", i)] + ([("K", i)] if i < L else [])
        elif kind == "K":
            out += [("K", i), ("B", i + 1), ("R", i + 1)]
            if i + 1 < L and y[i + 1] != y[i]:
                out.append(("K", i + 1))
        else:
            out += [("R", i), ("B", i)] + ([("K", i)] if i < L else [])
    else:
        if kind == "S":
            out += [("R", 0)] + ([("K", 0)] if L else [])
        elif kind == "K":
            out += [("K", i), ("R", i + 1)] + ([("K", i + 1)] if i + 1 < L else [])
        else:
            out += [("R", i)] + ([("K", i)] if i < L else [])
    return out


def _brute_best(x, y, blank, star, n):
    """The best score over all state paths of ``n`` frames (``-inf`` when none)."""
    L = len(y)
    accept = {("R", L)} | ({("K", L - 1)} if L else set()) | ({("B", L)} if blank is not None else set())
    start = ("B", 0) if blank is not None else ("S", 0)
    row = x.clone()
    if blank is not None:
        row[:, blank] = -math.inf
    star_score = row.max(-1).values + star

    def frame(state, t):
        kind, i = state
        if kind == "B":
            return float(x[t, blank])
        return float(x[t, y[i]]) if kind == "K" else float(star_score[t])

    best = -math.inf

    def walk(state, t, s):
        nonlocal best
        if t == n:
            if state in accept or (n == 0 and L == 0):
                best = max(best, s)
            return
        for nxt in _successors(state, y, blank):
            walk(nxt, t + 1, s + frame(nxt, t))

    walk(start, 0, 0.0)
    return best


@pytest.mark.parametrize("blank", [0, None])
def test_best_path_is_the_brute_force_best_over_all_paths(blank):
    g = torch.Generator().manual_seed(11)
    C = 4
    cases = [([1, 1], 5), ([1, 2, 1], 6), ([2], 1), ([], 0), ([], 4), ([3, 3, 3], 6), ([1, 2], 2), ([2, 3], 1)]
    if blank is None:
        cases += [([0, 0, 1], 5), ([0], 3)]
    for star in (-0.8, 0.4):
        x = torch.randn(len(cases), 6, C, generator=g, dtype=torch.float64).mul(2).log_softmax(-1)
        al = forced_align(x, [c[0] for c in cases], [c[1] for c in cases], blank=blank, star=star)
        for b, (y, n) in enumerate(cases):
            best = _brute_best(x[b], y, blank, star, n)
            assert float(al.score[b]) == pytest.approx(best, abs=1e-9), (y, n, star)
            if best == -math.inf:
                assert (al.labels[b] == -1).all() and not al.star_frames[b].any()
                continue
            # the reported frames score the best score: labels, plus star per star frame
            lab = al.labels[b, :n].tolist()
            s = sum(float(x[b, t, lab[t]]) for t in range(n)) + star * int(al.star_frames[b].sum())
            assert s == pytest.approx(best, abs=1e-9)
            assert (al.labels[b, n:] == -1).all()


# --- exact recovery of a known path ----------------------------------------------------------


def _known_path(g, y, blank, noise):
    """Frame labels, star mask and token spans of a random path: per gap optional blanks, an
    optional star stretch of untranscribed labels (``noise``), optional blanks, then the token."""
    frames, stars, spans = [], [], []

    def run(lab, k, is_star=False):
        for _ in range(k):
            frames.append(int(noise[int(torch.randint(0, len(noise), (1,), generator=g))]) if is_star else lab)
            stars.append(is_star)

    def rnd(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    for gap in range(len(y) + 1):
        need_sep = gap > 0 and gap < len(y) and y[gap] == y[gap - 1]
        if blank is not None:
            run(blank, rnd(0, 2))
        k_star = rnd(0, 4)
        if blank is None and need_sep:
            k_star = max(k_star, 1)  # equal neighbours of the chain need something between
        run(None, k_star, True)
        if blank is not None:
            run(blank, rnd(1 if need_sep and k_star == 0 else 0, 2))
        if gap < len(y):
            s = len(frames)
            run(y[gap], rnd(1, 3))
            spans.append((s, len(frames)))
    return frames, stars, spans


@pytest.mark.parametrize("blank", [0, None])
def test_exact_recovery_of_a_known_path(blank):
    g = torch.Generator().manual_seed(5)
    C = 9
    noise = [7, 8]  # labels never in the targets: only the star can take them
    lo = 1 if blank == 0 else 0
    for rep in range(20):
        y = torch.randint(lo, 7, (int(torch.randint(0, 7, (1,), generator=g)),), generator=g).tolist()
        frames, stars, spans = _known_path(g, y, blank, noise)
        T = len(frames)
        x = torch.full((1, max(T, 1), C), -9.0)
        for t, lab in enumerate(frames):
            x[0, t, lab] = -0.01
        al = forced_align(x, [y], [T], blank=blank, star=-2.0)
        assert al.labels[0, :T].tolist() == frames, rep
        assert al.star_frames[0, :T].tolist() == stars
        assert al.token_start[0, : len(y)].tolist() == [s for s, _ in spans]
        assert al.token_end[0, : len(y)].tolist() == [e for _, e in spans]
        want = sum(float(x[0, t, lab]) for t, lab in enumerate(frames)) - 2.0 * sum(stars)
        assert float(al.score[0]) == pytest.approx(want, abs=1e-4)


# --- errors ------------------------------------------------------------------------------------


def _one_line(excinfo):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


def test_bad_inputs_give_one_line_errors():
    x = torch.randn(2, 6, 4).log_softmax(-1)
    col = x[..., 1:].max(-1).values - 1.0
    tg, tl, il = np.array([[1, 2], [3, 0]]), np.array([2, 1]), np.array([6, 5])
    cases = [
        (dict(star_col=col[:, :5]), "star_col must be"),
        (dict(star_col=col.double()), "star_col must be"),
        (dict(blank=4), "blank=4 must lie in"),
        (dict(blank=-2), "blank=-2 must lie in"),
        (dict(targets=np.array([[1, 4], [3, 0]])), "targets must lie in"),
        (dict(target_lengths=np.array([3, 1])), "target_lengths must be"),
        (dict(input_lengths=np.array([7, 5])), "input_lengths must be"),
        (dict(input_lengths=np.array([6])), "target_lengths must be|input_lengths must be"),
    ]
    for change, match in cases:
        kw = dict(E=x, star_col=col, targets=tg, target_lengths=tl, input_lengths=il, blank=0) | change
        with pytest.raises(ValueError, match=match) as e:
            star_paths.star_states(**kw)
        _one_line(e)
    for kw, match in (
        (dict(star=float("inf")), "star must be"),
        (dict(star="1"), "star must be"),
        (dict(star=-1.0, blank=None, transitions=torch.zeros(5, 4)), "star is not supported"),
    ):
        with pytest.raises(ValueError, match=match) as e:
            forced_align(x, [[1, 2], [3]], [6, 5], **kw)
        _one_line(e)


def test_memory_limit_error_names_the_star_graph(monkeypatch):
    monkeypatch.setattr(viterbi_paths, "MAX_ALIGN_BYTES", 300)
    x = torch.randn(1, 50, 4).log_softmax(-1)
    for blank, nodes in ((0, 3 * 3 + 2), (None, 2 * 3 + 2)):
        with pytest.raises(ValueError, match=rf"T=50 frames against a graph of S={nodes} nodes needs \d+ bytes") as e:
            forced_align(x, [[1, 2, 3]], [50], blank=blank, star=-1.0)
        _one_line(e)


# --- progress ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(star=-1.0), dict(star=-1.0, blank=None), dict(), dict(blank=None)])
def test_progress_hook_hears_every_frame_once(monkeypatch, kw):
    monkeypatch.setattr(viterbi_paths, "PROGRESS_INTERVAL", 0.001)
    monkeypatch.setattr(viterbi_paths, "BP_BUDGET", 2000)  # checkpointed: two passes
    x = torch.randn(3, 400, 5).log_softmax(-1)
    targets, lengths = [[1, 2, 3] * 20, [4] * 3, [1, 2, 99 % 5]], [400, 250, 1]
    calls = []
    with forced.alignment_progress(calls.append):
        al = forced_align(x, targets, lengths, **kw)
    assert all(n > 0 for n in calls) and sum(calls) == 651
    assert torch.equal(al.labels, forced_align(x, targets, lengths, **kw).labels)
