"""Which implementation scores a transducer lattice on a device: numba, torch or Triton.

The RNN-T losses (:mod:`lightning_gtn.losses.rnnt`), their variants
(:mod:`lightning_gtn.losses.rnnt_variants`) and k2's recursion
(:mod:`lightning_gtn.kernels.mutual_information`) choose here, as the graph losses choose in
:mod:`lightning_gtn.core.dispatch`: ``impl=None`` is numba on the CPU, the Triton kernels of
:mod:`.rnnt_triton` on a CUDA device once they have passed their self-check there (torchaudio's
small published case; a failure to compile or launch, or a wrong value, gives a warning and the
torch reference for the rest of the process), and the torch reference elsewhere.

``impl="triton"`` asks for the Triton kernels explicitly: they run on CUDA tensors, and on CPU
tensors only under Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported,
how the tests run them without a GPU); anything else is a ValueError naming the implementation and
the device.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional, Sequence

import torch

from . import rnnt_triton

__all__ = ["interpreted", "default_impl", "pick"]

_default: dict = {}


def interpreted() -> bool:
    """True when Triton's interpreter is switched on (``TRITON_INTERPRET=1``): the Triton kernels
    then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def default_impl(device: torch.device) -> str:
    """The implementation ``impl=None`` stands for on ``device``: ``"numba"`` on the CPU,
    ``"triton"`` on a CUDA device where the kernels are installed and pass their self-check (run
    once per device and remembered), else ``"torch"``."""
    device = torch.device(device)
    if device.type == "cpu":
        return "numba"
    key = str(device)
    impl = _default.get(key)
    if impl is None:
        impl = "torch"
        if device.type == "cuda" and rnnt_triton.available():
            try:
                err = rnnt_triton.self_check(device)
            except Exception as e:  # noqa: BLE001 - any failure means: do not use the kernels here
                err = f"{type(e).__name__}: {e}"
            if err is None:
                impl = "triton"
            else:
                warnings.warn(
                    f"lightning_gtn: the Triton RNN-T kernels failed their self-check on {device} ({err}); "
                    "using the torch implementation instead",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _default[key] = impl
    return impl


def pick(device: torch.device, impl: Optional[str], allowed: Sequence[str], what: str) -> str:
    """``impl`` checked for tensors on ``device`` (None: :func:`default_impl`).

    Raises:
        ValueError: ``impl`` is not one of ``allowed``; ``"numba"`` off the CPU; ``"triton"``
            without the triton package, or on a device it cannot run on (a CPU tensor without
            ``TRITON_INTERPRET=1``); each message names ``what``, the implementation and the device.
    """
    device = torch.device(device)
    if impl is None:
        return default_impl(device)
    if impl not in allowed:
        raise ValueError(f"{what}: impl must be None or one of {tuple(allowed)}, got {impl!r}")
    if impl == "numba" and device.type != "cpu":
        raise ValueError(f"{what}: impl='numba' runs on CPU tensors, got tensors on {device}")
    if impl == "triton":
        if not rnnt_triton.available():
            raise ValueError(f"{what}: impl='triton' needs the triton package, which is not installed")
        if device.type != "cuda" and not (device.type == "cpu" and interpreted()):
            raise ValueError(
                f"{what}: impl='triton' runs on CUDA tensors (or on CPU tensors under Triton's interpreter, "
                f"TRITON_INTERPRET=1), got tensors on {device}"
            )
    return impl
