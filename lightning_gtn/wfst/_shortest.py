"""forward_score, viterbi_score, viterbi_path (placeholder until the numba kernels land)."""


def forward_score(g):
    raise NotImplementedError


def viterbi_score(g):
    raise NotImplementedError


def viterbi_path(g):
    raise NotImplementedError
