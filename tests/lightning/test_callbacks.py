"""Callbacks: the process-group cleanup of spawned DDP ranks."""

import socket
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from lightning_gtn.lightning import SpawnedProcessGroupCleanup


@pytest.fixture
def gloo_group():
    """A one-process gloo group in this process, destroyed afterwards if the test left it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _trainer(launcher):
    return SimpleNamespace(strategy=SimpleNamespace(launcher=launcher))


def test_spawned_rank_destroys_its_group(gloo_group):
    launcher = _MultiProcessingLauncher.__new__(_MultiProcessingLauncher)
    SpawnedProcessGroupCleanup().teardown(_trainer(launcher), None, "fit")
    assert not dist.is_initialized()


@pytest.mark.parametrize("launcher", [None, _SubprocessScriptLauncher.__new__(_SubprocessScriptLauncher)])
def test_other_launchers_keep_the_group(gloo_group, launcher):
    # strategy=ddp: rank 0 is the launching process and may go on to trainer.test
    SpawnedProcessGroupCleanup().teardown(_trainer(launcher), None, "fit")
    assert dist.is_initialized()


def test_no_group_is_fine():
    assert not dist.is_initialized()
    SpawnedProcessGroupCleanup().teardown(_trainer(_MultiProcessingLauncher.__new__(_MultiProcessingLauncher)),
                                          None, "validate")
