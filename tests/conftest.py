"""Fixtures shared by the whole test suite (kept small on purpose), and the numba warm-up of a
parallel run."""

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _workers(config) -> int:
    """The number of pytest-xdist workers this run starts (0 without xdist or with ``-n 0``)."""
    n = getattr(config.option, "numprocesses", None)
    if n in (None, 0, "0"):
        return 0
    return n if isinstance(n, int) else os.cpu_count() or 1  # "auto", "logical"


def pytest_configure(config):
    """In the controller of a parallel run (``pytest -n 2``, what ``make test`` runs), compile
    the numba kernels once before the workers start (:mod:`tests._warmup`), so they load them
    from numba's on-disk cache instead of each compiling the same kernels from a cold cache.
    A warm-up that fails stops the run with its traceback. ``LIGHTNING_GTN_TEST_WARMUP=0``
    skips it."""
    if hasattr(config, "workerinput") or os.environ.get("LIGHTNING_GTN_TEST_WARMUP", "1") == "0":
        return
    n = _workers(config)
    if n == 0:
        return
    from tests._warmup import GROUPS

    groups = list(GROUPS)
    chunks = [groups[i::n] for i in range(min(n, len(groups)))]  # one process per worker, side by side
    start = time.perf_counter()

    def run(chunk):
        cmd = [sys.executable, "-m", "tests._warmup", *chunk]
        return chunk, subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)

    with ThreadPoolExecutor(len(chunks)) as pool:
        results = list(pool.map(run, chunks))
    for chunk, proc in results:
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            pytest.exit(
                f"numba warm-up failed (python -m tests._warmup {' '.join(chunk)}, exit status "
                f"{proc.returncode}):\n{tail}",
                returncode=1,
            )
    sys.stderr.write(
        f"numba warm-up: {len(groups)} kernel groups in {len(chunks)} processes, "
        f"{time.perf_counter() - start:.0f} s\n"
    )


@pytest.fixture
def rng():
    """A seeded numpy random generator, so every test run sees the same numbers."""
    return np.random.default_rng(1234)


@pytest.fixture
def apply_loss_calls(monkeypatch):
    """``[(criterion, keyword arguments)]`` of every call of the one loss prologue,
    :func:`lightning_gtn.core.criterion.apply_loss`, from the test's start (the losses look it up
    on its module, where it is patched)."""
    from lightning_gtn.core import criterion

    seen: list = []
    real = criterion.apply_loss

    def counting(crit, *args, **kwargs):
        seen.append((crit, kwargs))
        return real(crit, *args, **kwargs)

    monkeypatch.setattr(criterion, "apply_loss", counting)
    return seen
