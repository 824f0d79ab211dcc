"""Every nn loss declares the token convention of StructuredLoss consistently (blank, repeat_label,
target_classes, tokens, num_classes, topology, frame_transitions, vocabulary_arguments), its
decoding agrees with the topology it declares, and the Lightning layer refuses what is not a
StructuredLoss, naming what it was given."""

import inspect

import pytest
import torch
from torch import nn

import lightning_gtn.nn as lnn
from lightning_gtn.decode import DECODER_TOPOLOGIES
from lightning_gtn.functional import collapse
from lightning_gtn.wfst.criterion import ctc_graph

G2I = {"a": 0, "b": 1, "c": 2}
PIECES = ["a", "b", "c", "ab", ("b", "c")]


def _losses():
    """``(name, loss, emission classes C)`` for each nn loss (and its variants)."""
    return [
        ("ctc", lnn.CTCLoss(), 5),
        ("ctc_blank3", lnn.CTCLoss(blank=3), 5),
        ("asg", lnn.ASGLoss(5), 5),
        ("seq", lnn.SequenceLoss(), 5),
        ("stc", lnn.STCLoss(0, 1.0, 0.5, 10), 5),
        ("graph", lnn.GraphLoss(blank=0), 5),
        ("graph_rep", lnn.GraphLoss(repeat_label=True), 5),
        ("target_graph", lnn.TargetGraphLoss(ctc_graph, {"blank_idx": 0}, blank=0, num_classes=5), 5),
        ("target_graph_noblank", lnn.TargetGraphLoss(ctc_graph, {"blank_idx": 0}), 5),
        ("module", lnn.ModuleLoss(nn.Identity(), blank=0), 5),
        ("module_rep", lnn.ModuleLoss(nn.Identity(), repeat_label=True), 5),
        ("transducer_none", lnn.TransducerLoss(PIECES, G2I, blank="none"), len(PIECES)),
        ("transducer_optional", lnn.TransducerLoss(PIECES, G2I, ngram=1, blank="optional"), len(PIECES) + 1),
        ("transducer_forced", lnn.TransducerLoss(PIECES, G2I, blank="forced"), len(PIECES) + 1),
    ]


LOSSES = _losses()


@pytest.mark.parametrize("name,loss,C", LOSSES, ids=[n for n, _, _ in LOSSES])
def test_every_loss_declares_the_convention(name, loss, C):
    assert isinstance(loss, lnn.StructuredLoss)
    # blank: an integer class id or None, never a bool or a string
    assert loss.blank is None or (type(loss.blank) is int and 0 <= loss.blank < C)
    assert type(loss.repeat_label) is bool
    assert not (loss.repeat_label and loss.blank is not None), "a repeat token only without a blank"
    assert loss.num_classes is None or (type(loss.num_classes) is int and loss.num_classes == C)
    assert loss.target_classes is None or (type(loss.target_classes) is int and loss.target_classes > 0)
    # the topology is one the decoders read, and agrees with the blank
    # every frame-path topology has a decoder; "rnnt" losses decode through the transducer searches
    assert loss.topology in lnn.LOSS_TOPOLOGIES and set(lnn.LOSS_TOPOLOGIES) - {"rnnt"} == set(DECODER_TOPOLOGIES)
    assert (loss.topology == "asg") == (loss.blank is None)
    if loss.topology == "transducer":
        assert loss.target_classes is not None and loss.tokens is not None
    # tokens name every non-blank emission class
    if loss.tokens is not None:
        assert len(loss.tokens) + int(loss.blank is not None) == C
        assert all(isinstance(t, (str, tuple)) for t in loss.tokens)
    if loss.target_classes is not None:
        assert loss.tokens is not None and loss.num_classes == C
    # frame transitions: ASG's (C + 1, C) scores, which its best paths use
    ft = loss.frame_transitions
    assert ft is None or (isinstance(ft, torch.Tensor) and ft.shape == (C + 1, C))
    assert (ft is not None) == isinstance(loss, lnn.ASGLoss)
    # the arguments the Lightning layer fills are constructor arguments of the class
    params = set(inspect.signature(type(loss)).parameters)
    assert isinstance(loss.vocabulary_arguments, tuple) and set(loss.vocabulary_arguments) <= params


def test_transducer_keeps_its_blank_string_as_blank_mode():
    for mode, blank in (("none", None), ("optional", len(PIECES)), ("forced", len(PIECES))):
        m = lnn.TransducerLoss(PIECES, G2I, blank=mode)
        assert m.blank_mode == mode and m.blank == blank
        assert m.topology == ("asg" if blank is None else "transducer")
        assert m.tokens == ["a", "b", "c", "ab", ("b", "c")] and m.target_classes == 3


@pytest.mark.parametrize(
    "name,loss,C",
    [x for x in LOSSES if x[1].target_classes is None],
    ids=[n for n, l, _ in LOSSES if l.target_classes is None],
)
def test_decode_reads_paths_as_the_declared_topology(name, loss, C):
    """Losses over emission classes decode by the collapse their topology names: merge repeats,
    drop the declared blank (none for ``"asg"``)."""
    em = torch.randn(3, 8, C, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    lengths = torch.tensor([8, 5, 3])
    paths, _ = loss.best_paths(em, lengths)
    blank = loss.blank if loss.topology == "ctc" else None
    assert loss.decode(em, lengths) == [collapse(p, blank) for p in paths.tolist()]


def test_subclass_declares_by_overriding():
    class Mine(lnn.StructuredLoss):
        blank = 2
        vocabulary_arguments = ()

        def forward(self, emissions, targets, input_lengths, target_lengths):
            return emissions.sum()

    m = Mine()
    assert m.blank == 2 and m.topology == "ctc" and m.repeat_label is False
    assert m.target_classes is None and m.tokens is None and m.num_classes is None and m.frame_transitions is None


# ------------------------------------------------------------------ the Lightning layer reads only these


def test_build_loss_refuses_what_is_not_a_structured_loss():
    from lightning_gtn.lightning import build_loss

    class Mystery(nn.Module):
        def forward(self, *a):
            return torch.zeros(())

    with pytest.raises(ValueError, match=r"loss: .*Mystery is not a lightning_gtn\.nn\.StructuredLoss"):
        build_loss(Mystery(), "ab")
    with pytest.raises(TypeError, match=r"got int: '3'"):
        build_loss(3, "ab")
    with pytest.raises(TypeError, match=r"StructuredLoss"):
        build_loss(object(), "ab")


BUILT = []


class NotALoss(nn.Module):
    """A loss module that is not a StructuredLoss (a config may name it once its module is trusted)."""

    def __init__(self, **kw):
        BUILT.append(kw)
        super().__init__()


def test_config_naming_a_class_that_is_not_a_structured_loss_is_refused_before_it_is_built():
    from lightning_gtn import trust
    from lightning_gtn.lightning import build_loss

    with trust.trusted([__name__.split(".")[0]]):
        with pytest.raises(
            ValueError,
            match=r"loss\._target_: tests\.nn\.test_convention\.NotALoss names the class NotALoss, which is "
            r"not a lightning_gtn\.nn\.StructuredLoss",
        ):
            build_loss({"_target_": f"{__name__}.NotALoss"}, "ab")
    assert BUILT == []


def test_mixin_refuses_a_module_that_is_not_a_structured_loss():
    import lightning as L

    from lightning_gtn.lightning import StructuredLossMixin

    class Model(StructuredLossMixin, L.LightningModule):
        def __init__(self, loss):
            super().__init__()
            self.configure_structured_loss(loss, chars="ab")

    with pytest.raises(ValueError, match=r"loss: CrossEntropyLoss is not a lightning_gtn\.nn\.StructuredLoss"):
        Model(nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match=r"loss must be a name, a config mapping or an nn\.Module.*got function"):
        Model(torch.nn.functional.ctc_loss)
    assert Model(lnn.CTCLoss()).num_classes == 3


def test_config_fills_only_declared_arguments():
    from lightning_gtn.lightning import build_loss

    asg, v = build_loss({"_target_": "lightning_gtn.nn.ASGLoss"}, "abc")
    assert asg.num_classes == v.num_classes == 4 and v.repeat_id == 3
    tg, v = build_loss(
        {
            "_target_": "lightning_gtn.nn.TargetGraphLoss",
            "builder": "lightning_gtn.wfst.criterion.ctc_graph",
            "builder_kwargs": {"blank_idx": 0},
            "vocabulary": {"blank": True},
        },
        "abc",
    )
    assert tg.blank == 0 and tg.num_classes == 4 and v.blank
    td, v = build_loss({"_target_": "lightning_gtn.nn.TransducerLoss", "blank": "optional"}, "abc")
    assert td.tokens == ["a", "b", "c"] and td.graphemes_to_idx == {"a": 0, "b": 1, "c": 2} and td.blank == 3


def test_the_deprecated_topologies_names_warn_and_give_the_new_ones():
    import lightning_gtn.decode as decode

    with pytest.warns(DeprecationWarning, match=r"lightning_gtn\.nn\.LOSS_TOPOLOGIES"):
        from lightning_gtn.nn import TOPOLOGIES
    assert TOPOLOGIES is lnn.LOSS_TOPOLOGIES
    with pytest.warns(DeprecationWarning, match=r"lightning_gtn\.decode\.DECODER_TOPOLOGIES"):
        assert decode.TOPOLOGIES is DECODER_TOPOLOGIES
    assert "TOPOLOGIES" not in lnn.__all__ and "TOPOLOGIES" not in decode.__all__
    with pytest.raises(AttributeError, match="NO_SUCH_NAME"):
        lnn.NO_SUCH_NAME  # noqa: B018
