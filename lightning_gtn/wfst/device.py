"""GTN's device names. The engine computes on the CPU; see ``lightning_gtn.functional``
for scoring dense emissions on the emissions' own device (GPUs included)."""

from __future__ import annotations

import enum


class DeviceType(enum.IntEnum):
    """The kind of device a graph lives on, as GTN numbers them: ``CPU`` (0) or ``CUDA`` (1)."""

    CPU = 0
    CUDA = 1


CPU = DeviceType.CPU
CUDA = DeviceType.CUDA


class Device:
    """A device: ``Device(gtn.CPU)`` or ``Device(gtn.CUDA, index)``."""

    __slots__ = ("type", "index")

    def __init__(self, type: DeviceType | int = CPU, index: int = 0) -> None:
        self.type = DeviceType(type)
        self.index = int(index)

    @property
    def is_cuda(self) -> bool:
        """Whether this is a CUDA device."""
        return self.type == CUDA

    def __eq__(self, other) -> bool:
        other = _as_device(other)
        return self.type == other.type and self.index == other.index

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __repr__(self) -> str:
        return f"Device({self.type.name}, {self.index})"


def _as_device(device) -> Device:
    if isinstance(device, Device):
        return device
    if isinstance(device, (DeviceType, int)):
        return Device(device)
    if isinstance(device, str):  # "cpu", "cuda", "cuda:1"
        kind, _, idx = device.partition(":")
        return Device(CUDA if kind == "cuda" else CPU, int(idx or 0))
    raise TypeError(f"device must be a gtn.Device, gtn.CPU or gtn.CUDA, got {device!r}")


def _check_cpu(device, name: str = "device") -> None:
    if _as_device(device).is_cuda:
        raise RuntimeError(
            f"{name}: lightning_gtn.wfst graphs live on the CPU (gtn.cuda.is_available() is False); "
            "score dense emissions on a GPU with lightning_gtn.functional instead"
        )
