"""compose, intersect, remove (placeholder until the numba kernels land)."""


def compose(g1, g2):
    raise NotImplementedError


def intersect(g1, g2):
    raise NotImplementedError


def remove(g, ilabel, olabel):
    raise NotImplementedError
