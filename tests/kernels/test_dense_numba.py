"""The unigram normaliser's numba pass against torch's logsumexp / softmax."""

import numpy as np
import pytest
import torch

from lightning_gtn.kernels import dense_numba


def _reference(E, w, lens):
    z = E.double() + w.double()
    lse = torch.logsumexp(z, -1)
    mask = torch.arange(E.shape[1])[None, :] < torch.as_tensor(lens)[:, None]
    logz = torch.where(mask, lse, torch.zeros_like(lse)).sum(1)
    p = torch.softmax(z, -1) * mask[..., None]
    return logz, p, p.sum(1)


@pytest.fixture(autouse=True, params=["numba", "torch"])
def unigram_impl(request, monkeypatch):
    """Each test once per implementation of the unigram pass."""
    monkeypatch.setattr(dense_numba, "UNIGRAM_TORCH_MIN_CLASSES", 10**9 if request.param == "numba" else 0)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_softmax_added_in_place(dtype):
    g = torch.Generator().manual_seed(0)
    E = torch.randn(5, 7, 11, generator=g, dtype=dtype) * 3
    w = torch.randn(11, generator=g, dtype=dtype)
    lens = np.array([7, 3, 0, 1, 7])
    base = torch.randn(5, 7, 11, generator=g, dtype=dtype)
    buf = base.clone()
    logz, psum = dense_numba.unigram_pass(E, w, lens, buf)
    rz, rp, rs = _reference(E, w, lens)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert (logz - rz).abs().max() < tol * 10
    assert (buf.double() - (base.double() + rp)).abs().max() < tol
    assert (psum - rs).abs().max() < tol * 10
    z_only, none = dense_numba.unigram_pass(E, w, lens)
    assert none is None and torch.equal(z_only, logz)


def test_dead_and_nan_frames():
    E = torch.randn(3, 4, 5, dtype=torch.float64)
    E[0, 2] = -float("inf")
    E[1, 1, 3] = float("nan")
    E[2, 3] = -float("inf")  # past row 2's length: ignored
    buf = torch.zeros_like(E)
    logz, psum = dense_numba.unigram_pass(E, torch.zeros(5, dtype=torch.float64), np.array([4, 4, 3]), buf)
    assert logz[0] == -float("inf") and torch.isnan(logz[1]) and torch.isfinite(logz[2])
    assert buf[0, 2].abs().sum() == 0 and buf[2, 3].abs().sum() == 0
    assert torch.isfinite(psum[0]).all()


def test_bad_arguments_are_refused():
    E = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="lengths"):
        dense_numba.unigram_pass(E, torch.zeros(4), np.array([4, 1]))
    with pytest.raises(ValueError, match="w must be"):
        dense_numba.unigram_pass(E, torch.zeros(5), np.array([3, 1]))
    with pytest.raises(ValueError, match="gE"):
        dense_numba.unigram_pass(E, torch.zeros(4), np.array([3, 1]), torch.zeros(2, 3, 5))


def test_new_buffer_pass_gives_the_same_results():
    g = torch.Generator().manual_seed(3)
    E = torch.randn(4, 6, 9, generator=g, dtype=torch.float64)
    E[1, 2] = -float("inf")
    w = torch.randn(9, generator=g, dtype=torch.float64)
    lens = np.array([6, 6, 2, 0])
    b1 = torch.zeros_like(E)
    z1, p1 = dense_numba.unigram_pass(E, w, lens, b1)
    z2, p2, b2 = dense_numba.unigram_pass(E, w, lens, new_buffer=True)
    torch.testing.assert_close(z1, z2)
    torch.testing.assert_close(p1, p2)
    torch.testing.assert_close(b1, b2)
    assert torch.isfinite(b1).all() and b1[2, 2:].abs().sum() == 0 and b1[3].abs().sum() == 0
