"""The numba warm-up of a parallel test run (tests/conftest.py, tests/_warmup.py)."""

import subprocess
from types import SimpleNamespace

import pytest

from tests import _warmup, conftest


def _config(n):
    return SimpleNamespace(option=SimpleNamespace(numprocesses=n))


def test_controller_compiles_every_group_once_in_one_process_per_worker(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd[cmd.index("tests._warmup") + 1 :])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(conftest.subprocess, "run", fake_run)
    monkeypatch.delenv("LIGHTNING_GTN_TEST_WARMUP", raising=False)
    conftest.pytest_configure(_config(2))
    assert len(calls) == 2 and sorted(g for c in calls for g in c) == sorted(_warmup.GROUPS)
    calls.clear()
    conftest.pytest_configure(SimpleNamespace(option=SimpleNamespace(numprocesses=2), workerinput={}))
    conftest.pytest_configure(_config(0))  # a worker, or no workers: nothing to warm
    conftest.pytest_configure(SimpleNamespace(option=SimpleNamespace()))  # xdist not loaded
    assert calls == []


def test_a_failing_warm_up_stops_the_run(monkeypatch):
    def fake_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "numba.core.errors.TypingError: bad kernel\n")

    monkeypatch.setattr(conftest.subprocess, "run", fake_run)
    monkeypatch.delenv("LIGHTNING_GTN_TEST_WARMUP", raising=False)
    with pytest.raises(pytest.exit.Exception, match=r"numba warm-up failed .*\n.*TypingError: bad kernel"):
        conftest.pytest_configure(_config(2))


def test_every_group_runs():
    _warmup.main([])  # seconds once the kernels are cached
