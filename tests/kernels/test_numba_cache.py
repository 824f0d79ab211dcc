"""Every numba kernel of the package is compiled with ``cache=True``: the first use of a kernel
compiles it for seconds to tens of seconds (the beam search's about 20 s on 2 cores), and
without the on-disk cache every process (each DDP rank, each train or evaluate run, each test
worker) pays that again."""

import importlib
import pkgutil

from numba.core.caching import NullCache
from numba.core.registry import CPUDispatcher

import lightning_gtn

# modules that pull in Lightning or the data sets; none of them defines a numba kernel
SKIP = ("lightning_gtn.lightning", "lightning_gtn.train", "lightning_gtn.evaluate", "lightning_gtn.align_cli")


def test_every_numba_kernel_is_cached_on_disk():
    kernels, uncached = 0, []
    for info in pkgutil.walk_packages(lightning_gtn.__path__, "lightning_gtn."):
        if info.name.startswith(SKIP):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == info.name:
                kernels += 1
                if isinstance(obj._cache, NullCache):
                    uncached.append(f"{info.name}.{name}")
    assert kernels > 50  # the walk found the kernels
    assert not uncached, f"numba kernels without cache=True: {uncached}"
