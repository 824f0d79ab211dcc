"""The RNN-T family's shared argument checks (lightning_gtn.core.checks): each names the argument."""

import math

import numpy as np
import pytest
import torch

from lightning_gtn.core import checks


def test_joiner_logits_and_float_tensors():
    assert checks.check_joiner_logits(torch.zeros(2, 3, 4, 5)) == (2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"logits must be a torch.Tensor of shape \(B, T, U \+ 1, V\)"):
        checks.check_joiner_logits([[0.0]])
    with pytest.raises(ValueError, match=r"logits must have shape \(B, T, U \+ 1, V\), got 3 dims"):
        checks.check_joiner_logits(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="floating point"):
        checks.check_joiner_logits(torch.zeros(2, 3, 4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, T, S \+ 1, C\) with S \+ 1 >= 1 and C >= 1"):
        checks.check_joiner_logits(torch.zeros(2, 3, 4, 0), shape="(B, T, S + 1, C)")
    with pytest.raises(ValueError, match=r"py must have shape \(B, S \+ 1, T\)"):
        checks.check_float_tensor(torch.zeros(2, 3), "py", 3, "(B, S + 1, T)")


def test_index_tensors():
    t = checks.check_index_tensor([[1, 2], [3, 4]], "targets", (2, None), "(B, U)")
    assert t.dtype == torch.int64 and t.shape == (2, 2)
    with pytest.raises(ValueError, match="targets must be an int32 or int64 tensor"):
        checks.check_index_tensor(torch.zeros(2, 2), "targets", (2, None), "(B, U)")
    with pytest.raises(ValueError, match=r"targets must have shape \(B, U\) with B=3, got \(2, 2\)"):
        checks.check_index_tensor(t, "targets", (3, None), "(B, U)")
    with pytest.raises(ValueError, match=r"boundary must have shape \(B, 4\) with B=2, got \(2, 3\)"):
        checks.check_index_tensor(torch.zeros(2, 3, dtype=torch.long), "boundary", (2, 4), "(B, 4)")
    meta = torch.zeros(2, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match="logit_lengths is on meta"):
        checks.check_index_tensor(meta, "logit_lengths", (2,), "(B,)", torch.device("cpu"))


def test_ranges_labels_and_class_ids():
    checks.check_in_range(np.array([0, 3]), "logit_lengths", "T", 3, inclusive=True)
    with pytest.raises(ValueError, match=r"logit_lengths must lie in \[0, T\] with T=3 \(logits of .*\), got 4"):
        checks.check_in_range(np.array([4, 1]), "logit_lengths", "T", 3, inclusive=True, of="logits of (B, T)")
    with pytest.raises(ValueError, match=r"symbols must lie in \[0, C\) with C=4, got -1"):
        checks.check_in_range(torch.tensor([[-1, 2]]), "symbols", "C", 4, inclusive=False)
    tg, tl = np.array([[1, 2], [3, 9]]), np.array([2, 1])  # 9 is padding: never read
    assert checks.check_padded_labels(tg, tl, 4, 0).tolist() == [[True, True], [True, False]]
    with pytest.raises(ValueError, match=r"target_lengths must be <= S=2"):
        checks.check_padded_labels(tg, np.array([3, 1]), 4, 0)
    with pytest.raises(ValueError, match=r"targets: label 4 out of range \[0, V\) with V=4"):
        checks.check_padded_labels(tg + 1, tl, 4, 0)
    with pytest.raises(ValueError, match="targets: label equal to blank=2 found"):
        checks.check_padded_labels(tg, tl, 4, 2)
    with pytest.raises(ValueError, match=r"targets: label 2 is a blank class \[2, 3\]"):
        checks.check_padded_labels(tg, tl, 4, [3, 2], classes="K")
    assert checks.check_class_id(-1, "blank", 5) == 4
    assert checks.check_class_id(torch.tensor(2), "blank", 5) == 2
    with pytest.raises(ValueError, match=r"blank must lie in \[-V, V\) with V=5"):
        checks.check_class_id(5, "blank", 5)
    for bad in (True, 1.0, torch.tensor(True)):
        with pytest.raises(ValueError, match="blank must be an integer class id"):
            checks.check_class_id(bad, "blank", 5)


def test_reals_and_bools():
    assert checks.check_real(np.float32(0.5), "sigma") == 0.5
    assert checks.check_real(math.inf, "delay_penalty", finite=False) == math.inf
    with pytest.raises(ValueError, match="clamp must be finite"):
        checks.check_real(float("nan"), "clamp")
    with pytest.raises(ValueError, match="delay_penalty must be a number"):
        checks.check_real(float("nan"), "delay_penalty", finite=False)
    with pytest.raises(ValueError, match=r"omega must lie in \[0.0, 1.0\]"):
        checks.check_real(1.5, "omega", 0.0, 1.0)
    assert checks.check_real(1.0, "omega", 0.0, 1.0) == 1.0
    assert checks.check_real(np.float64(0.999), "leaky_hmm", 0.0, 1.0, hi_open=True) == 0.999
    with pytest.raises(ValueError, match=r"leaky_hmm must lie in \[0.0, 1.0\), got 1.0"):
        checks.check_real(1.0, "leaky_hmm", 0.0, 1.0, hi_open=True)
    with pytest.raises(ValueError, match="sigma must be a real number"):
        checks.check_real("0.1", "sigma")
    with pytest.raises(ValueError, match="zero_infinity must be a bool"):
        checks.check_bool(1, "zero_infinity")


def test_emission_values_name_what_is_wrong():
    check_emission_values = checks.check_emission_values
    x = torch.zeros(2, 3, 4, dtype=torch.float64)
    check_emission_values(x, "em", [3, 3], torch.float32)
    x[1, 2, 0] = 1e300
    with pytest.raises(ValueError, match=r"em: example 1, frame 2: a value beyond torch.float32's range"):
        check_emission_values(x, "em", [3, 3], torch.float32)
    check_emission_values(x, "em", [3, 2], torch.float32)  # past the length: never read
    check_emission_values(x, "em", [3, 3], torch.float64)
    x[0, 1] = -math.inf
    with pytest.raises(ValueError, match=r"example 0, frame 1: no finite emission"):
        check_emission_values(x, "em", None, torch.float64)


def test_check_int_one_order_one_message():
    assert checks.check_int(3, "n", 1) == 3 and type(checks.check_int(np.int64(3), "n", 1)) is int
    assert checks.check_int(-7, "offset") == -7  # no bound
    assert checks.check_int(5, "k", 1, 5) == 5
    for bad in (2.0, True, np.bool_(True), "2", None, torch.tensor(2)):
        # not an integer: both a TypeError and a ValueError, the bounds in the message
        with pytest.raises(checks.NotAnIntegerError, match=r"^k must be an integer in \[1, 5\], got "):
            checks.check_int(bad, "k", 1, 5)
        with pytest.raises(TypeError):
            checks.check_int(bad, "k", 1)
        with pytest.raises(ValueError, match=r"^k must be an integer >= 1, got "):
            checks.check_int(bad, "k", 1)
    with pytest.raises(ValueError, match=r"^k must be an integer in \[1, 5\], got 6$") as e:
        checks.check_int(6, "k", 1, 5)
    assert not isinstance(e.value, TypeError)  # in range is a value question only
    with pytest.raises(ValueError, match=r"^stride must be an integer >= 1, got 0$"):
        checks.check_int(np.int32(0), "stride", 1)
    with pytest.raises(ValueError, match=r"^depth must be an integer <= 3, got 4$"):
        checks.check_int(4, "depth", maximum=3)


def test_check_int_is_the_only_integer_check():
    # the engine, the word pieces, the speech synthesis and the models call the one in core.checks
    import lightning_gtn.integers
    import lightning_gtn.lightning.models as models
    import lightning_gtn.lightning.spoken as spoken
    import lightning_gtn.wfst.ngram as ngram
    import lightning_gtn.wordpieces as wordpieces

    assert checks.check_int is lightning_gtn.integers.check_int
    for mod in (models, spoken, ngram, wordpieces):
        assert mod.check_int is checks.check_int and not hasattr(mod, "_check_int")
    with pytest.raises(ValueError, match=r"model\.channels must be an integer in \[1, 4096\], got 0"):
        models.ConvEncoder(feature_dim=8, num_classes=5, channels=0)
