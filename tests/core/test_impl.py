"""The one implementation picker (lightning_gtn.core.impl.Backends): defaults per device, the
once-per-device self-check, the errors naming the family and ``impl``, and every family using it."""

import pytest
import torch

from lightning_gtn.core import impl as impl_mod
from lightning_gtn.core.impl import Backends


def _family(calls, result=None, available=True, what="my_loss", offered=("numba", "numba_log", "torch", "triton")):
    def check(device):
        calls.append(str(device))
        if isinstance(result, Exception):
            raise result
        return result

    return Backends(what, offered, triton_available=lambda: available, self_check=check, kernels="Triton test")


def test_defaults_and_the_once_per_device_self_check(monkeypatch):
    monkeypatch.setattr(impl_mod, "_CHECKED", {})
    calls = []
    fam = _family(calls)
    assert fam.default("cpu") == "numba" and fam.pick(torch.device("cpu"), None) == "numba"
    assert fam.default("meta") == "torch" and calls == []  # not CUDA: no self-check
    assert fam.default("cuda:3") == "triton" == fam.default(torch.device("cuda:3"))
    assert calls == ["cuda:3"]  # once per device
    other = Backends("other", ("torch", "triton"), triton_available=lambda: True, self_check=fam.self_check)
    assert other.default("cuda:3") == "triton" and calls == ["cuda:3"]  # shared by the same self-check
    assert _family(calls, available=False).default("cuda:4") == "torch" and calls == ["cuda:3"]
    no_triton = _family(calls, offered=("numba", "torch"))
    assert no_triton.default("cuda:5") == "torch" and calls == ["cuda:3"]


@pytest.mark.parametrize("failure", ["scores differ by 0.1", RuntimeError("no kernel image")])
def test_a_failed_self_check_warns_once_and_gives_torch(monkeypatch, failure):
    monkeypatch.setattr(impl_mod, "_CHECKED", {})
    calls = []
    fam = _family(calls, result=failure)
    with pytest.warns(
        RuntimeWarning, match=r"Triton test kernels failed their self-check on cuda:1 \(.*(differ|kernel image)"
    ):
        assert fam.default("cuda:1") == "torch"
    assert fam.default("cuda:1") == "torch" and calls == ["cuda:1"]
    assert fam.pick("cuda:1", "triton") == "triton"  # asked for explicitly: never replaced


def test_errors_name_the_family_and_impl(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fam = _family([])
    with pytest.raises(
        ValueError,
        match=r"^my_loss: impl must be None or one of \('numba', 'numba_log', 'torch', 'triton'\), got 'gtn'",
    ):
        fam.pick("cpu", "gtn")
    with pytest.raises(ValueError, match=r"^tdt_loss: impl='numba_log' runs on CPU tensors, got tensors on meta"):
        fam.pick("meta", "numba_log", "tdt_loss")
    with pytest.raises(ValueError, match=r"^my_loss: impl='triton' runs on CUDA tensors .* got tensors on cpu"):
        fam.pick("cpu", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fam.pick("cpu", "triton") == "triton"  # the interpreter runs them on the CPU
    with pytest.raises(ValueError, match=r"^my_loss: impl='triton' needs the triton package"):
        _family([], available=False).pick("cpu", "triton")
    assert fam.pick("meta", "torch") == "torch"


def test_every_family_declares_its_backends():
    from lightning_gtn.core.scoring import GRAPH_BACKENDS
    from lightning_gtn.losses.k2_rnnt import MI_BACKENDS
    from lightning_gtn.losses.mmi import DEN_BACKENDS
    from lightning_gtn.losses.rnnt import RNNT_BACKENDS
    from lightning_gtn.losses.rnnt_variants import BACKENDS as DURATION_BACKENDS

    fams = [GRAPH_BACKENDS, DEN_BACKENDS, MI_BACKENDS, RNNT_BACKENDS, DURATION_BACKENDS]
    assert all(isinstance(f, Backends) for f in fams)
    assert GRAPH_BACKENDS.offered == ("numba", "numba_log", "torch", "triton")
    assert all(f.offered == ("numba", "torch", "triton") for f in fams[1:])
    # the RNN-T lattices and k2's recursion share one self-check (run once per device for all three)
    assert RNNT_BACKENDS.self_check is MI_BACKENDS.self_check is DURATION_BACKENDS.self_check


def test_a_family_without_numba_defaults_to_torch_on_the_cpu():
    fam = Backends("f", ("torch",), triton_available=lambda: False, self_check=lambda d: None)
    assert fam.default("cpu") == "torch"
    assert (
        Backends("g", ("numba", "torch"), triton_available=lambda: False, self_check=lambda d: None).default("cpu")
        == "numba"
    )
