"""The old name of :mod:`lightning_gtn.trust`, kept only while ``lightning_gtn/nn/losses.py``
still imports it (the same objects, not a copy). Delete it once nothing imports it:
``tests/test_layout.py`` lists who still does."""

from .trust import *  # noqa: F403
from .trust import __all__  # noqa: F401
