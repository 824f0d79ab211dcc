"""ConvEncoder, the all-convolutional speech encoder: shapes, output lengths, padding
independence, finite gradients, option checks, and a checkpoint that loads back through the
trusted-target check."""

import pytest
import torch

from lightning_gtn.lightning import ConvEncoder, SequenceModule
from tests._checkpoints import save_module_checkpoint

SMALL = {"channels": 8, "blocks": 2, "kernel_size": 3, "input_kernel": 3}


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_shapes_and_output_lengths(stride):
    torch.manual_seed(0)
    net = ConvEncoder(6, 5, stride=stride, **SMALL)
    lengths = torch.tensor([7, 4, 1])  # odd lengths, and one frame
    scores, out_lengths = net(torch.randn(3, 7, 6), lengths)
    expect = [-(-n // stride) for n in lengths.tolist()]
    assert scores.shape == (3, expect[0], 5)
    assert out_lengths.tolist() == expect == net.output_lengths(lengths).tolist()
    assert out_lengths.dtype == torch.int64
    # log-probabilities: each frame's distribution sums to one
    torch.testing.assert_close(scores.exp().sum(-1), torch.ones(3, expect[0]))


def test_padding_never_reaches_valid_frames():
    torch.manual_seed(0)
    net = ConvEncoder(4, 6, stride=2, **SMALL).eval()
    x = torch.randn(2, 9, 4)
    x[1, 5:] = 1e3  # garbage in the padding of the second example
    batch, lengths = net(x, torch.tensor([9, 5]))
    alone, alone_lengths = net(x[1:, :5], torch.tensor([5]))
    assert lengths.tolist() == [5, 3] and alone_lengths.tolist() == [3]
    torch.testing.assert_close(batch[1, :3], alone[0])


def test_gradients_are_finite_and_reach_every_parameter():
    torch.manual_seed(0)
    net = ConvEncoder(5, 4, dropout=0.2, **SMALL)
    x = torch.randn(3, 11, 5, requires_grad=True)
    scores, lengths = net(x, torch.tensor([11, 8, 3]))
    targets = torch.tensor([[1, 2], [3, 3], [2, 0]])
    loss = torch.nn.functional.ctc_loss(
        scores.transpose(0, 1), targets, lengths, torch.tensor([2, 2, 1]), zero_infinity=False
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(x.grad).all() and x.grad[2, 3:].abs().sum() == 0  # padding gets no gradient
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    "option, value",
    [
        ("channels", 0),
        ("channels", 5000),
        ("blocks", -1),
        ("blocks", 65),
        ("kernel_size", 4),
        ("kernel_size", 65),
        ("input_kernel", 0),
        ("stride", 0),
        ("stride", 9),
        ("stride", 2.0),
        ("dropout", 1.0),
        ("activation", "tanh"),
    ],
)
def test_bad_options_name_the_option(option, value):
    with pytest.raises(ValueError, match=f"model.{option}"):
        ConvEncoder(4, 5, **{**SMALL, option: value})


def test_bad_inputs():
    net = ConvEncoder(4, 5, **SMALL)
    with pytest.raises(ValueError, match=r"inputs must be \(B, T, F\)"):
        net(torch.randn(4, 5), torch.tensor([5]))
    with pytest.raises(ValueError, match="input_lengths"):
        net(torch.randn(2, 5, 4), torch.tensor([5]))


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    net = {"_target_": "lightning_gtn.lightning.ConvEncoder", **SMALL}
    model = SequenceModule(net, {"_target_": "lightning_gtn.nn.CTCLoss"}, "ab ", feature_dim=4)
    path = tmp_path / "m.ckpt"
    save_module_checkpoint(model, path)
    loaded = SequenceModule.load_from_checkpoint(str(path), map_location="cpu")
    assert isinstance(loaded.net, ConvEncoder)
    x, lengths = torch.randn(2, 6, 4), torch.tensor([6, 3])
    torch.testing.assert_close(loaded.net.eval()(x, lengths)[0], model.net.eval()(x, lengths)[0])


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        ("ConvRNNEncoder", dict(hidden_size=10**9), "model.hidden_size"),
        ("ConvRNNEncoder", dict(rnn_layers=0), "model.rnn_layers"),
        ("ConvRNNEncoder", dict(conv_layers=-1), "model.conv_layers"),
        ("ConvRNNEncoder", dict(kernel_size=4), "model.kernel_size"),
        ("ConvRNNEncoder", dict(hidden_size=8000, rnn_layers=10), "over the limit"),
        ("ConvEncoder", dict(channels=4096, blocks=64), "over the limit"),
    ],
)
def test_sizes_a_config_may_not_ask_for(cls, kwargs, match):
    """A config or checkpoint asking for unbounded weights is refused before anything is allocated."""
    import lightning_gtn.lightning.models as models

    with pytest.raises(ValueError, match=match):
        getattr(models, cls)(40, 30, **kwargs)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        ("ConvRNNEncoder", dict()),
        ("ConvRNNEncoder", dict(conv_channels=32, hidden_size=48, rnn="lstm", rnn_layers=2, stride=2)),
        ("ConvRNNEncoder", dict(conv_layers=0)),
        ("ConvEncoder", dict(channels=64, blocks=3)),
    ],
)
def test_the_weight_estimate_bounds_the_real_count(cls, kwargs):
    """The estimate checked against MAX_PARAMS is never below the model's real size, nor far above."""
    import lightning_gtn.lightning.models as models

    seen = []
    real_check = models._check_params
    models._check_params = seen.append
    try:
        net = getattr(models, cls)(40, 30, **kwargs)
    finally:
        models._check_params = real_check
    n = sum(p.numel() for p in net.parameters())
    assert len(seen) == 1 and n <= seen[0] <= 1.1 * n, (seen, n)
