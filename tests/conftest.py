"""Fixtures shared by the whole test suite (kept small on purpose)."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A seeded numpy random generator, so every test run sees the same numbers."""
    return np.random.default_rng(1234)
