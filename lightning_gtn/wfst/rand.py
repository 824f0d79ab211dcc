"""Random paths (placeholder)."""


def sample(g, max_length=1000):
    raise NotImplementedError


def rand_equivalent(g1, g2, num_samples=100, tol=1e-4, max_length=1000):
    raise NotImplementedError
