"""The one implementation picker: which kernel computes a loss for tensors on a device.

Every family of kernels (the graph DP of the graph losses, the RNN-T lattices of the transducer
losses and k2's recursion, the MMI denominator) declares a :class:`Backends`: the ``impl=`` names
it offers, and how the Triton kernels are found and self-checked. :meth:`Backends.pick` then
turns a user's ``impl`` into the implementation that runs:

* ``impl=None``: ``"numba"`` on the CPU (``"torch"`` for a family that offers no numba
  kernels); on a CUDA device ``"triton"`` when triton is installed and the family's self-check
  passes there (run once per device and self-check, remembered for
  the process; a failure to compile or launch, or a wrong value, warns and leaves the device to
  ``"torch"``); ``"torch"`` elsewhere.
* an explicit ``impl``: checked, never replaced. ValueError naming the family and ``impl`` for a
  name not offered, a numba implementation off the CPU, ``"triton"`` without the triton package or
  on a device it cannot run on (a CPU tensor without Triton's interpreter, ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

__all__ = ["Backends", "interpreted"]

#: ``{(self-check, device): passed}``: each self-check runs once per device, whichever family asks
_CHECKED: Dict[Tuple[Callable, str], bool] = {}


def interpreted() -> bool:
    """True when Triton's interpreter is switched on (``TRITON_INTERPRET=1``): the Triton kernels
    then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class Backends:
    """The implementations one family of kernels offers, and how ``impl=None`` resolves.

    Args:
        what: how messages name the family (``"rnnt_loss"``, ``"mutual_information"``).
        offered: the ``impl=`` names besides None (``"numba"``, ``"numba_log"``, ``"torch"``,
            ``"triton"``); names starting with ``"numba"`` run on CPU tensors only.
        triton_available: whether the family's Triton kernels are importable.
        self_check: ``self_check(device)`` runs the Triton kernels on a small case on ``device``
            and returns None when they agree with the reference, else what differed (an exception
            counts as a failure); shared by the families that pass the same function.
        kernels: how the warning of a failed self-check names the kernels (``"Triton RNN-T"``).
        fallback: how that warning names what runs instead (default ``"the torch implementation"``).
    """

    def __init__(
        self,
        what: str,
        offered: Sequence[str],
        *,
        triton_available: Callable[[], bool],
        self_check: Callable[[torch.device], Optional[str]],
        kernels: str = "Triton",
        fallback: str = "the torch implementation",
    ) -> None:
        self.what = what
        self.offered = tuple(offered)
        self.triton_available = triton_available
        self.self_check = self_check
        self.kernels = kernels
        self.fallback = fallback

    def default(self, device) -> str:
        """The implementation ``impl=None`` stands for on ``device``."""
        device = torch.device(device)
        if device.type == "cpu":
            # a family without numba kernels (the joiner loss's torch matmuls) runs its torch ones
            return "torch" if "numba" not in self.offered and "torch" in self.offered else "numba"
        if device.type == "cuda" and "triton" in self.offered and self.triton_available() and self.passed(device):
            return "triton"
        return "torch"

    def passed(self, device) -> bool:
        """Whether the Triton kernels passed their self-check on ``device`` (run on first call)."""
        key = (self.self_check, str(torch.device(device)))
        ok = _CHECKED.get(key)
        if ok is None:
            try:
                err = self.self_check(torch.device(device))
            except Exception as e:  # noqa: BLE001 - any failure means: do not use the kernels here
                err = f"{type(e).__name__}: {e}"
            ok = _CHECKED[key] = err is None
            if not ok:
                warnings.warn(
                    f"lightning_gtn: the {self.kernels} kernels failed their self-check on {key[1]} ({err}); "
                    f"using {self.fallback} instead",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return ok

    def pick(self, device, impl: Optional[str], what: Optional[str] = None) -> str:
        """``impl`` checked for tensors on ``device``, or :meth:`default` for None; ``what``
        names the caller in messages (default the family's name)."""
        device = torch.device(device)
        if impl is None:
            return self.default(device)
        what = what or self.what
        if impl not in self.offered:
            raise ValueError(f"{what}: impl must be None or one of {self.offered}, got {impl!r}")
        if impl.startswith("numba") and device.type != "cpu":
            raise ValueError(f"{what}: impl={impl!r} runs on CPU tensors, got tensors on {device}")
        if impl == "triton":
            if not self.triton_available():
                raise ValueError(f"{what}: impl='triton' needs the triton package, which is not installed")
            if device.type != "cuda" and not (device.type == "cpu" and interpreted()):
                raise ValueError(
                    f"{what}: impl='triton' runs on CUDA tensors (or on CPU tensors under Triton's "
                    f"interpreter, TRITON_INTERPRET=1), got tensors on {device}"
                )
        return impl
