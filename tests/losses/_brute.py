"""Independent references: brute-force enumeration of alignments for tiny cases."""

import itertools

import torch


def segmentations(target, T):
    """Frame label paths where token i of ``target`` covers one or more consecutive frames."""
    L = len(target)
    if L == 0:
        if T == 0:
            yield []
        return
    for cuts in itertools.combinations(range(1, T), L - 1):
        bounds = (0,) + cuts + (T,)
        yield [target[i] for i in range(L) for _ in range(bounds[i + 1] - bounds[i])]


def ctc_paths(target, T, blank):
    """All frame label paths that CTC-collapse to ``target`` (each counted once)."""
    for path in itertools.product(sorted(set(target) | {blank}), repeat=T):
        out, prev = [], None
        for lab in path:
            if lab != prev and lab != blank:
                out.append(lab)
            prev = lab
        if out == list(target):
            yield list(path)


def lse(scores, like):
    if not scores:
        return torch.tensor(float("-inf"), dtype=like.dtype)
    return torch.logsumexp(torch.stack(scores), 0)


def emission_score(x, path):
    return sum((x[t, lab] for t, lab in enumerate(path)), torch.zeros((), dtype=x.dtype))


def ctc_ref(x, target, blank=0):
    """-log sum over CTC alignments; ``x`` is ``(T, C)``."""
    return -lse([emission_score(x, p) for p in ctc_paths(target, x.shape[0], blank)], x)


def seq_ref(x, target):
    T, C = x.shape
    full = lse([emission_score(x, p) for p in itertools.product(range(C), repeat=T)], x)
    return full - lse([emission_score(x, p) for p in segmentations(target, T)], x)


def asg_path_score(x, tr, path):
    s = emission_score(x, path)
    if path:
        s = s + tr[0, path[0]]
    for i in range(1, len(path)):
        s = s + tr[path[i] + 1, path[i - 1]]
    return s


def asg_ref(x, tr, target):
    T, C = x.shape
    full = lse([asg_path_score(x, tr, p) for p in itertools.product(range(C), repeat=T)], x)
    return full - lse([asg_path_score(x, tr, p) for p in segmentations(target, T)], x)


# the small batch that test_asg.py and test_seq.py share
IMPLS = ["numba", "numba_log", "torch"]
TARGETS = [[0, 1], [2], [1, 1, 0], []]
LENS = [4, 3, 4, 0]


def _inputs(seed=0, B=4, T=4, C=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64, requires_grad=True)
    tr = torch.randn(C + 1, C, generator=g, dtype=torch.float64, requires_grad=True)
    return x, tr
