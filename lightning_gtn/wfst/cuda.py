"""``gtn.cuda``: the engine's graphs stay on the CPU, so CUDA is reported unavailable.

Dense emissions on a GPU are scored there by ``lightning_gtn.functional``.
"""


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def _unavailable(*args, **kwargs):
    raise RuntimeError("lightning_gtn.wfst has no CUDA graphs (gtn.cuda.is_available() is False)")


synchronize = get_device = set_device = _unavailable
