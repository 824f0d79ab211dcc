"""The log semiring's one log-add (lightning_gtn.kernels.logmath), in each of its forms, against
``numpy.logaddexp``; the special values each form documents; and no other definition of it."""

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from numba import njit

from lightning_gtn.kernels import logmath

INF, NAN = math.inf, math.nan
VALUES = [-INF, -1e30, -745.0, -3.5, -0.0, 0.0, 1e-12, 2.0, 2.0 + 1e-9, 700.0, 1e30]


@njit
def _add(a, b):
    return logmath.log_add(a, b)


@njit
def _add_checked(a, b):
    return logmath.log_add_checked(a, b)


@pytest.mark.parametrize("f", [_add, _add_checked, logmath.log_add.py_func, logmath.log_add_checked.py_func])
def test_values_match_logaddexp(f):
    for a in VALUES:
        for b in VALUES:
            want = np.logaddexp(a, b)
            assert f(a, b) == pytest.approx(want, rel=1e-15, abs=0), (a, b)
            assert f(a, b) == f(b, a)  # symmetric, bit for bit


def test_special_values():
    for f in (_add, _add_checked):
        assert f(-INF, -INF) == -INF and f(-INF, 3.0) == 3.0 and f(INF, 3.0) == INF
        for x in (-INF, 0.0, INF, NAN):
            assert math.isnan(f(NAN, x)) and math.isnan(f(x, NAN))
    assert math.isnan(_add(INF, INF))  # inf - inf
    assert _add_checked(INF, INF) == INF  # a + log 2
    assert _add_checked(1.5, 1.5) == 1.5 + logmath.LOG2 == _add(1.5, 1.5)


def test_torch_form():
    a = torch.tensor([-1e30, -3.5, 0.0, 2.0, 700.0], dtype=torch.float64)
    b = torch.tensor([-1e30, 4.0, 0.0, -2.0, 699.0], dtype=torch.float64)
    torch.testing.assert_close(logmath.log_add_torch(a, b), torch.logaddexp(a, b), rtol=1e-15, atol=0)
    a.requires_grad_(True)
    g = torch.autograd.grad(logmath.log_add_torch(a, b).sum(), a)[0]
    assert torch.isfinite(g).all()


def test_no_other_log_add_is_defined():
    # the package's numba, torch and Triton code calls logmath; no module defines its own
    root = Path(logmath.__file__).resolve().parent.parent
    names = {"_logadd", "_lae", "_lse2", "logadd", "_log_add"}
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and (node.name in names or "log_add" in node.name):
                found.append(f"{path.relative_to(root)}:{node.name}")
    assert sorted(found) == [
        "kernels/logmath.py:log_add",
        "kernels/logmath.py:log_add_checked",
        "kernels/logmath.py:log_add_torch",
        "kernels/logmath.py:log_add_triton",
    ]
