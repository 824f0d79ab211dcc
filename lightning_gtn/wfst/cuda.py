"""``gtn.cuda``: the engine's graphs stay on the CPU, so CUDA is reported unavailable.

Dense emissions on a GPU are scored there by ``lightning_gtn.functional``.

As in a GTN build without CUDA, every function but :func:`is_available` raises. GTN's
error surfaces as ``RuntimeError`` while its own tests expect ``ValueError``; ours is both.
"""

__all__ = ["is_available", "device_count", "get_device", "set_device", "synchronize", "CudaUnavailableError"]


class CudaUnavailableError(RuntimeError, ValueError):
    """Raised by the ``gtn.cuda`` functions: the engine has no CUDA graphs."""


def is_available() -> bool:
    """Always ``False``: graphs live on the CPU."""
    return False


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise CudaUnavailableError(
            f"[cuda::{name}] CUDA not available: lightning_gtn.wfst graphs live on the CPU; "
            "score dense emissions on a GPU with lightning_gtn.functional"
        )

    fn.__name__ = name
    fn.__doc__ = f"Raises ``CudaUnavailableError`` (GTN's ``cuda::{name}`` without CUDA)."
    return fn


device_count = _unavailable("deviceCount")
device_count.__name__ = "device_count"
get_device = _unavailable("getDevice")
get_device.__name__ = "get_device"
set_device = _unavailable("setDevice")
set_device.__name__ = "set_device"
synchronize = _unavailable("synchronize")
