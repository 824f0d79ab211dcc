"""TDT and multi-blank forced alignment against brute-force enumeration of the lattice's paths."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from lightning_gtn.align.rnnt import DurationAlignment, multiblank_forced_align, rnnt_forced_align
from lightning_gtn.functional import tdt_forced_align, to_records


def _tdt_arcs(x, y, blank, durations, sigma):
    """``arcs(t, u)``: the arcs leaving node ``(t, u)`` as ``(is_token, duration, score)``, from
    torch's log_softmax of each group (the materialised definition of the TDT lattice)."""
    D = len(durations)
    lp = torch.log_softmax(x[..., :-D], -1)
    dp = torch.log_softmax(x[..., -D:], -1)

    def arcs(t, u):
        out = []
        for i, d in enumerate(durations):
            if u < len(y):
                out.append((True, d, float(lp[t, u, y[u]] + dp[t, u, i]) - sigma))
            if d > 0:
                out.append((False, d, float(lp[t, u, blank] + dp[t, u, i]) - sigma))
        return out

    return arcs


def _mb_arcs(x, y, blank, big_durs, big_ids, sigma):
    """As :func:`_tdt_arcs` for multi-blank RNN-T: the token keeps the frame, each blank advances."""
    lp = torch.log_softmax(x, -1)

    def arcs(t, u):
        out = [(False, 1, float(lp[t, u, blank]) - sigma)]
        out += [(False, d, float(lp[t, u, c]) - sigma) for d, c in zip(big_durs, big_ids)]
        if u < len(y):
            out.append((True, 0, float(lp[t, u, y[u]]) - sigma))
        return out

    return arcs


def _paths(arcs, T, U):
    """Every complete path: a list of ``(t, u, is_token, duration)`` and its score."""
    out = []

    def walk(t, u, so_far, s):
        if (t, u) == (T, U):
            out.append((list(so_far), s))
            return
        if t >= T:
            return
        for tok, d, sc in arcs(t, u):
            nt, nu = t + d, u + int(tok)
            if nt > T or (tok and nt >= T):
                continue
            so_far.append((t, u, tok, d))
            walk(nt, nu, so_far, s + sc)
            so_far.pop()

    walk(0, 0, [], 0.0)
    return out


def _rebuild(al: DurationAlignment, b: int, T: int, U: int):
    """The path the alignment's frames and durations describe, as :func:`_paths` lists it."""
    path, t, u = [], 0, 0
    assert al.token_duration is not None and al.blank_duration is not None
    while (t, u) != (T, U):
        assert t < T
        if u < U and int(al.token_start[b, u]) == t:
            d = int(al.token_duration[b, u])
            path.append((t, u, True, d))
            t, u = t + d, u + 1
        else:
            d = int(al.blank_duration[b, t])
            assert d > 0
            path.append((t, u, False, d))
            t += d
    return path


def _score(arcs, path):
    table = {}
    for t, u, _, _ in path:
        table.setdefault((t, u), {(a[0], a[1]): a[2] for a in arcs(t, u)})
    return sum(table[(t, u)][(tok, d)] for t, u, tok, d in path)


def _check_against_brute(al, b, arcs, T, U):
    paths = _paths(arcs, T, U)
    best_path, best = max(paths, key=lambda p: p[1])
    assert math.isclose(float(al.score[b]), best, rel_tol=0, abs_tol=1e-9)
    got = _rebuild(al, b, T, U)
    assert got == best_path  # random logits: the best path is unique
    assert math.isclose(_score(arcs, got), float(al.score[b]), abs_tol=1e-9)
    logz = math.log(sum(math.exp(s) for _, s in paths))
    for u in range(U):  # each token arc's posterior, over the paths through it
        t, d = int(al.token_start[b, u]), int(al.token_duration[b, u])
        through = [s for p, s in paths if (t, u, True, d) in p]
        assert math.isclose(float(al.token_confidence[b, u]), sum(math.exp(s - logz) for s in through), abs_tol=1e-9)
        assert math.isclose(float(al.token_score[b, u]), _score(arcs, [(t, u, True, d)]), abs_tol=1e-9)
    assert (al.token_start[b, U:] == -1).all() and (al.token_duration[b, U:] == -1).all()


@pytest.mark.parametrize("durations", [[0, 1, 2], [1, 3], [0, 2]])
@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_tdt_equals_brute_force(durations, sigma):
    g = torch.Generator().manual_seed(len(durations) * 10 + int(sigma * 10))
    B, T, U, K = 3, 5, 2, 4
    x = 2 * torch.randn(B, T, U + 1, K + len(durations), generator=g, dtype=torch.float64)
    ys = torch.tensor([[1, 2], [3, 1], [2, 0]])
    tl, ul = torch.tensor([5, 4, 3]), torch.tensor([2, 2, 1])
    al = tdt_forced_align(x, ys, tl, ul, blank=0, durations=durations, sigma=sigma)
    assert isinstance(al, DurationAlignment)
    for b in range(B):
        T_b, U_b = int(tl[b]), int(ul[b])
        arcs = _tdt_arcs(x[b], ys[b, :U_b].tolist(), 0, durations, sigma)
        if not _paths(arcs, T_b, U_b):  # e.g. durations [0, 2] over an odd number of frames
            assert float(al.score[b]) == -math.inf and (al.token_start[b] == -1).all()
            continue
        _check_against_brute(al, b, arcs, T_b, U_b)


@pytest.mark.parametrize("big", [([2], None), ([2, 3], [1, 3]), ([], None)])
def test_multiblank_equals_brute_force(big):
    durs, ids = big
    g = torch.Generator().manual_seed(7 + len(durs))
    B, T, U, V = 2, 5, 2, 6
    x = 2 * torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    blank = 5
    ys = torch.tensor([[0, 2], [4 if ids else 0, 0]]) if ids else torch.tensor([[1, 2], [0, 1]])
    tl, ul = torch.tensor([5, 4]), torch.tensor([2, 2])
    al = multiblank_forced_align(x, ys, tl, ul, blank=blank, big_blank_durations=durs, sigma=0.1, big_blank_ids=ids)
    big_ids = ids if ids is not None else [blank - 1 - i for i in range(len(durs))]
    for b in range(B):
        arcs = _mb_arcs(x[b], ys[b].tolist(), blank, durs, big_ids, 0.1)
        _check_against_brute(al, b, arcs, int(tl[b]), int(ul[b]))
        assert (al.token_duration[b] == 0).all()


def test_multiblank_without_big_blanks_is_rnnt_forced_align():
    g = torch.Generator().manual_seed(3)
    B, T, U, V = 4, 7, 3, 5
    x = 2 * torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    ys = torch.randint(1, V, (B, U), generator=g)
    tl, ul = torch.tensor([7, 5, 0, 3]), torch.tensor([3, 1, 2, 3])
    a = multiblank_forced_align(x, ys, tl, ul, blank=0)
    r = rnnt_forced_align(x, ys, tl, ul, blank=0)
    assert torch.equal(a.token_start, r.token_start) and torch.equal(a.labels, r.labels)
    assert torch.equal(a.token_end, r.token_end)
    torch.testing.assert_close(a.score, r.score, rtol=0, atol=1e-10)
    torch.testing.assert_close(a.token_score, r.token_score, rtol=0, atol=1e-10)
    torch.testing.assert_close(a.token_confidence, r.token_confidence, rtol=0, atol=1e-10)
    assert float(a.score[2]) == -math.inf and (a.token_start[2] == -1).all()
    # the blank leaves every frame once (one frame each)
    assert (a.blank_duration[0] == 1).all() and (a.blank_duration[3, :3] == 1).all()


def _random_path(rng, T, U, tok_durs, blank_durs):
    path, t, u = [], 0, 0
    while (t, u) != (T, U):
        opts = [(True, d) for d in tok_durs if u < U and t + d < T]
        opts += [(False, d) for d in blank_durs if t + d < T or (t + d == T and u == U)]
        tok, d = rng.choice(opts)
        path.append((t, u, tok, d))
        t, u = t + d, u + int(tok)
    return path


def test_tdt_recovers_a_planted_path():
    rng = random.Random(5)
    durations = [0, 1, 2, 3]
    T, U, K, D, blank = 9, 4, 5, 4, 4
    for _ in range(5):
        y = [rng.randrange(0, 4) for _ in range(U)]
        path = _random_path(rng, T, U, durations, [1, 2, 3])
        x = torch.zeros(1, T, U + 1, K + D, dtype=torch.float64)
        for t, u, tok, d in path:
            x[0, t, u, y[u] if tok else blank] = 20.0
            x[0, t, u, K + durations.index(d)] = 20.0
        al = tdt_forced_align(
            x, torch.tensor([y]), torch.tensor([T]), torch.tensor([U]), blank=blank, durations=durations
        )
        assert _rebuild(al, 0, T, U) == path
        assert float(al.score[0]) > -1e-3 * len(path)
        frames = {(t, u): d for t, u, tok, d in path if not tok}
        for t in range(T):  # the blank leaving each frame, 0 where none does
            assert int(al.blank_duration[0, t]) == next((d for (tt, _), d in frames.items() if tt == t), 0)


def test_multiblank_recovers_a_planted_path():
    rng = random.Random(6)
    T, U, V, blank = 10, 3, 6, 5
    durs = [2, 4]
    for _ in range(5):
        y = [rng.randrange(0, 3) for _ in range(U)]
        path = _random_path(rng, T, U, [0], [1] + durs)
        x = torch.zeros(1, T, U + 1, V, dtype=torch.float64)
        for t, u, tok, d in path:
            x[0, t, u, y[u] if tok else {1: 5, 2: 4, 4: 3}[d]] = 20.0
        al = multiblank_forced_align(
            x, torch.tensor([y]), torch.tensor([T]), torch.tensor([U]), blank=blank, big_blank_durations=durs
        )
        assert _rebuild(al, 0, T, U) == path
        # a frame's label: the last token emitted there, else the class of the blank arc over it
        want = [-1] * T
        for t, u, tok, d in path:
            if tok:
                want[t] = y[u]
            else:
                for f in range(t, t + d):
                    if f > t or want[f] == -1:
                        want[f] = {1: 5, 2: 4, 4: 3}[d]
        assert al.labels[0].tolist() == want


def test_float32_and_device_copy():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, 7, generator=g)
    ys, tl, ul = torch.tensor([[1, 2], [2, 1]]), torch.tensor([4, 3]), torch.tensor([2, 1])
    a = tdt_forced_align(x, ys, tl, ul, blank=0, durations=[0, 1, 2])
    b = tdt_forced_align(x.double(), ys, tl, ul, blank=0, durations=[0, 1, 2])
    assert a.score.dtype == torch.float32 and torch.equal(a.token_start, b.token_start)
    torch.testing.assert_close(a.score.double(), b.score, rtol=0, atol=1e-5)
    c = a.to("cpu")
    assert isinstance(c, DurationAlignment) and torch.equal(c.blank_duration, a.blank_duration)
    rec = to_records(a, ys)  # the writers read it as any Alignment
    assert [t["start_frame"] for t in rec[1]["tokens"]] == a.token_start[1, :1].tolist()


_X = torch.zeros(1, 4, 3, 7)
_Y, _TL, _UL = torch.tensor([[1, 2]]), torch.tensor([4]), torch.tensor([2])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=0, durations=[]), "durations"),
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=0, durations=[0]), "durations"),
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=0, durations=[2, 1]), "durations"),
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=4, durations=[0, 1, 2]), "blank"),
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=1, durations=[0, 1, 2]), "targets"),
        (lambda: tdt_forced_align(_X, torch.tensor([[1, 5]]), _TL, _UL, blank=0, durations=[0, 1, 2]), "targets"),
        (lambda: tdt_forced_align(_X, _Y, torch.tensor([5]), _UL, blank=0, durations=[0, 1, 2]), "logit_lengths"),
        (lambda: tdt_forced_align(_X, _Y, _TL, torch.tensor([3]), blank=0, durations=[0, 1, 2]), "target_lengths"),
        (lambda: tdt_forced_align(_X, _Y[0], _TL, _UL, blank=0, durations=[0, 1, 2]), "targets"),
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=0, durations=[0, 1], sigma=math.nan), "sigma"),
        (lambda: tdt_forced_align(_X[0], _Y, _TL, _UL, blank=0), "logits"),
        (lambda: tdt_forced_align(_X.clone().fill_(math.nan), _Y, _TL, _UL, blank=0, durations=[0, 1, 2]), "NaN"),
        (lambda: tdt_forced_align(_X, _Y, _TL, _UL, blank=0, durations=[0, 1], fused_log_softmax=2), "fused"),
        (lambda: multiblank_forced_align(_X, _Y, _TL, _UL, blank=0, big_blank_durations=[2]), "big blank"),
        (lambda: multiblank_forced_align(_X, _Y, _TL, _UL, blank=-1, big_blank_durations=[0]), "big_blank_durations"),
        (lambda: multiblank_forced_align(_X, _Y, _TL, _UL, blank=3, big_blank_durations=[2, 3]), "targets"),
        (lambda: multiblank_forced_align(_X, _Y, _TL, _UL, blank=6, big_blank_ids=[3]), "big_blank_ids"),
        (
            lambda: multiblank_forced_align(_X, _Y, _TL, _UL, blank=6, big_blank_durations=[2], big_blank_ids=[6]),
            "big_blank_ids",
        ),
        (lambda: multiblank_forced_align(_X, _Y, _TL, _UL, blank=7), "blank"),
    ],
)
def test_bad_inputs_give_one_line_errors(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_no_path_and_padding():
    x = torch.randn(2, 3, 3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    al = tdt_forced_align(
        x, torch.tensor([[1, 2], [1, 0]]), torch.tensor([0, 3]), torch.tensor([2, 1]), blank=0, durations=[0, 1, 2]
    )
    assert float(al.score[0]) == -math.inf and (al.labels[0] == -1).all() and (al.blank_duration[0] == -1).all()
    assert np.isfinite(float(al.score[1])) and int(al.token_start[1, 1]) == -1
