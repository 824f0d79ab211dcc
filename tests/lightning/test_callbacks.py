"""Callbacks: the process-group cleanup of spawned DDP ranks."""

import socket
from types import SimpleNamespace

import numpy as np
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
    SpawnedProcessGroupCleanup().teardown(
        _trainer(_MultiProcessingLauncher.__new__(_MultiProcessingLauncher)), None, "validate"
    )


# -- pictures (second probe: dense tick labels, misaligned axes, word-piece labels, hidden CER) ----


def test_class_ticks_are_bounded_and_name_the_path():
    from lightning_gtn.lightning.plots import MAX_CLASS_TICKS, class_ticks

    assert class_ticks(10, [1, 2]) == list(range(10))
    path = [3, 3, 40, 40, 61, 7]
    ticks = class_ticks(62, path)
    assert len(ticks) <= MAX_CLASS_TICKS and {3, 7, 40, 61} <= set(ticks) and ticks == sorted(ticks)
    many = list(range(0, 62, 2))  # the path visits more classes than fit
    assert len(class_ticks(62, many)) <= MAX_CLASS_TICKS


def test_alignment_panels_share_the_frame_axis(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_gtn.lightning.plots import plot_alignments

    captured = {}
    orig = plt.close
    plt.close = lambda fig=None: captured.setdefault("fig", fig)
    try:
        rng = np.random.default_rng(0)
        plot_alignments(
            [rng.standard_normal((20, 62))],
            [[5] * 20],
            [f"c{i}" for i in range(62)],
            ["t"],
            tmp_path / "a.png",
            inputs=[rng.random((80, 28))],
        )  # stride 4: 80 columns, 20 frames
    finally:
        plt.close = orig
    ax_in, ax_em = captured["fig"].axes
    assert ax_in.get_xlim() == ax_em.get_xlim() == (-0.5, 19.5)
    assert ax_in.images[0].get_extent()[:2] == [-0.5, 19.5]
    assert len(ax_em.get_yticklabels()) <= 16 and "c5" in [t.get_text() for t in ax_em.get_yticklabels()]
    plt.close(captured["fig"])
    with pytest.raises(ValueError, match="one name per emission class"):
        plot_alignments([np.zeros((5, 4))], [[0] * 5], ["a", "b"], ["t"], tmp_path / "b.png")


def test_word_piece_classes_are_named_by_their_tokens_in_class_order():
    from lightning_gtn.lightning.callbacks import class_labels
    from lightning_gtn.lightning.vocabulary import Vocabulary
    from lightning_gtn.nn import TransducerLoss

    chars = "abc "
    loss = TransducerLoss(
        ["a", "b", "c", " ", "ab", "ca", "b c"], {c: i for i, c in enumerate(chars)}, blank="optional"
    )
    names = class_labels(Vocabulary(chars, blank=False), loss)
    assert names == ["a", "b", "c", "<sp>", "ab", "ca", "b_c", "<b>"]
    assert len(names) == loss.num_classes


def test_equal_cer_and_wer_curves_stay_visible(tmp_path):
    import matplotlib.pyplot as plt

    from lightning_gtn.lightning.plots import plot_training_curves

    captured = {}
    orig = plt.close
    plt.close = lambda fig=None: captured.setdefault("fig", fig)
    try:
        same = [(0, 0.5), (5, 0.25)]
        plot_training_curves({"val/cer": same, "val/wer": same, "train/loss": [(0, 1.0)]}, tmp_path / "c.png")
    finally:
        plt.close = orig
    lines = {ln.get_label(): ln for ln in captured["fig"].axes[1].lines}
    cer, wer = lines["val/cer"], lines["val/wer"]
    assert cer.get_linestyle() != wer.get_linestyle() and cer.get_linewidth() > wer.get_linewidth()
    assert wer.get_markerfacecolor() == "none"  # hollow markers let the CER line show through
    plt.close(captured["fig"])


def test_a_figure_that_cannot_be_drawn_is_a_warning(tmp_path):
    """A transcript matplotlib cannot render (a lone surrogate reached ``set_text``) failed the
    run at its very end, before metrics.json was written."""
    from types import SimpleNamespace

    from lightning_gtn.lightning.callbacks import TrainingPlots

    cb = TrainingPlots(tmp_path, num_alignments=0)
    cb.history = {"val/cer": [(1, 0.5), (2, 0.25)]}
    cb.history["train/loss \ud800"] = [(1, 1.0)]  # a name matplotlib cannot draw
    trainer = SimpleNamespace(is_global_zero=True, datamodule=None)
    with pytest.warns(UserWarning, match=r"curves.png not written: "):
        cb.on_fit_end(trainer, None)
