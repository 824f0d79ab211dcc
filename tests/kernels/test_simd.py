"""kernels.simd: the eight-lane vector type against numpy, and the types it refuses."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from lightning_gtn.kernels.simd import (
    LANES,
    ld,
    st,
    vadd,
    vexp,
    vfma,
    vload,
    vmax,
    vmul,
    vsplat,
    vstore,
    vsub,
    vtrans8,
    vzero,
)


@njit(cache=False)
def _ops(x, y, out, s, idx):
    """out[0:8] = x[o:o+8] * y[o:o+8] + s * x[o:o+8], out[8:16] = x + y, out[16:24] = 0, o = 8 * idx[1]."""
    o = ld(idx, 1) * 8
    a = vload(x, o)
    b = vload(y, o)
    vstore(out, 0, vfma(vmul(a, vsplat(s)), a, b))
    vstore(out, 8, vadd(a, b))
    vstore(out, 16, vzero(out))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_ops_equal_numpy(dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, LANES)).astype(dtype)  # a 2-D array: offsets are flat
    y = rng.normal(size=(3, LANES)).astype(dtype)
    out = np.full(3 * LANES, 7.0, dtype=dtype)
    idx = np.array([0, 2, 1], dtype=np.int32)
    _ops(x, y, out, dtype(1.5), idx)
    np.testing.assert_allclose(out[:8], x[2] * y[2] + 1.5 * x[2], rtol=1e-6)
    np.testing.assert_allclose(out[8:16], x[2] + y[2], rtol=1e-6)
    assert (out[16:] == 0).all()


def test_mixed_or_non_float_types_are_refused():
    @njit(cache=False)
    def ints(a):
        return vload(a, 0)

    @njit(cache=False)
    def mixed(a, b):
        vstore(a, 0, vload(b, 0))

    with pytest.raises(TypingError):
        ints(np.zeros(8, dtype=np.int64))
    with pytest.raises(TypingError):
        mixed(np.zeros(8, dtype=np.float32), np.zeros(8, dtype=np.float64))
    with pytest.raises(TypingError):  # a strided view is not C-contiguous: flat offsets would be wrong
        ints(np.zeros((8, 2))[:, 0])


@njit(cache=False)
def _exp_max(x, out, m):
    """out = exp(x) lane by lane, m = lane-wise max of x's two halves, and x[0] copied by st."""
    for k in range(0, x.size, LANES):
        vstore(out, k, vexp(vload(x, k)))
    vstore(m, 0, vmax(vload(x, 0), vsub(vload(x, 8), vzero(x))))
    st(m, 8, ld(x, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vexp_vmax_st(dtype):
    x = np.concatenate(
        [-np.geomspace(1e-6, 100.0, 1014), [0.0, -87.5, -np.inf, -1e-30, -88.0, -86.9, -0.5, -2.0, -3.0, -4.0]]
    )
    x = x.astype(dtype)
    out = np.empty_like(x)
    m = np.zeros(16, dtype=dtype)
    _exp_max(x, out, m)
    want = np.exp(x.astype(np.float64))
    if dtype == np.float32:  # vexp's contract: relative error below 2e-7 in float32's normal range, 0 below -87
        normal = x > -87.0
        np.testing.assert_allclose(out[normal], want[normal], rtol=3e-7)
        assert (out[~normal] == 0).all()
    else:
        np.testing.assert_allclose(out, want, rtol=1e-15)
    np.testing.assert_array_equal(m[:8], np.maximum(x[:8], x[8:16]))
    assert m[8] == x[0]


@njit(cache=False)
def _trans(src, soff, sbase, dst, doff, dbase):
    vtrans8(src, soff, sbase, dst, doff, dbase)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vtrans8_reads_eight_vectors_and_writes_their_transpose(dtype):
    rng = np.random.default_rng(1)
    src = rng.normal(size=200).astype(dtype)
    soff = rng.choice(180, size=8, replace=False).astype(np.int64)  # anywhere, unaligned
    dst = np.zeros(300, dtype=dtype)
    doff = (np.arange(8) * 31).astype(np.int64)
    _trans(src, soff, 3, dst, doff, 5)
    block = np.stack([src[o + 3 : o + 11] for o in soff])  # (8 read, 8 lanes)
    for j in range(8):
        np.testing.assert_array_equal(dst[doff[j] + 5 : doff[j] + 13], block[:, j])
    written = np.zeros(300, dtype=bool)
    for j in range(8):
        written[doff[j] + 5 : doff[j] + 13] = True
    assert (dst[~written] == 0).all()  # nothing else touched
