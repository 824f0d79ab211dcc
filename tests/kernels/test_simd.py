"""kernels.simd: the eight-lane vector type against numpy, and the types it refuses."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from lightning_gtn.kernels.simd import LANES, ld, vadd, vfma, vload, vmul, vsplat, vstore, vzero


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
