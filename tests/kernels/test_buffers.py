"""kernels.buffers: an array is handed out again only when nobody holds it."""

import gc

import numpy as np
import torch

from lightning_gtn.kernels.buffers import BufferPool


def test_an_array_is_reused_only_after_every_holder_is_gone():
    pool = BufferPool(1 << 20)
    a = pool.empty((4, 8), np.float32)
    first = id(a.base)
    t = torch.from_numpy(a)
    view = t[1:]
    del a, t
    b = pool.empty((4, 8), np.float32)
    assert id(b.base) != first  # the view of the tensor still holds the first array
    del view
    gc.collect()
    c = pool.empty((2, 16), np.float32)  # same size and dtype, another shape
    assert id(c.base) == first and c.shape == (2, 16)
    d = pool.empty((4, 8), np.float64)  # another dtype: a new array
    assert id(d.base) not in (first, id(b.base))


def test_the_pool_keeps_at_most_its_budget():
    pool = BufferPool(1000, max_arrays=2)
    big = pool.empty((300,), np.float32)  # 1200 bytes: handed out, not kept
    assert pool.kept_bytes == 0 and big.size == 300
    for _ in range(4):
        pool.empty((10,), np.float32)  # each released at once: the pool keeps reusing one
    assert pool.kept_bytes == 40
    held = [pool.empty((10,), np.float32) for _ in range(3)]  # three held at once: two kept
    assert pool.kept_bytes == 80 and len({id(h.base) for h in held}) == 3
    pool.clear()
    assert pool.kept_bytes == 0
