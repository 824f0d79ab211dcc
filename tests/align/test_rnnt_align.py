"""RNN-T forced alignment against brute-force enumeration of the lattice's paths."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from lightning_gtn.align.rnnt import rnnt_align, rnnt_forced_align
from lightning_gtn.functional import to_ctm, to_json
from lightning_gtn.kernels.rnnt_viterbi import rnnt_viterbi


def _brute(lp, y, T, blank):
    """All paths of one example: {emission frames per token: log-probability} (``lp`` log-probs)."""
    U = len(y)
    out = {}
    # a path: the frames at which tokens are emitted (non-decreasing, in [0, T))
    for frames in itertools.combinations_with_replacement(range(T), U):
        s, u = 0.0, 0
        for t in range(T):
            while u < U and frames[u] == t:
                s += float(lp[t, u, y[u]])
                u += 1
            s += float(lp[t, u, blank])
        out[frames] = s
    return out


@pytest.mark.parametrize("blank", [0, 3])
def test_viterbi_equals_brute_force(blank):
    g = torch.Generator().manual_seed(0)
    B, T, U, V = 3, 4, 3, 4
    # float32 logits (one compiled signature for the whole file); the kernel accumulates in float64
    logits = 2 * torch.randn(B, T, U + 1, V, generator=g)
    ys = [[1, 2, 1], [2, 2, 1], [1, 2, 0]] if blank == 3 else [[1, 2, 3], [3, 3, 1], [2, 1, 3]]
    targets = torch.tensor(ys)
    tl = torch.tensor([4, 3, 2])
    ul = torch.tensor([3, 2, 3])  # the last: U > T (several tokens at one frame)
    al = rnnt_forced_align(logits, targets, tl, ul, blank=blank)
    lp = logits.double().log_softmax(-1)
    for b in range(B):
        T_b, U_b = int(tl[b]), int(ul[b])
        paths = _brute(lp[b], ys[b][:U_b], T_b, blank)
        best = max(paths, key=paths.get)
        assert float(al.score[b]) == pytest.approx(paths[best], abs=1e-5)
        assert al.token_start[b, :U_b].tolist() == list(best)
        assert (al.token_start[b, U_b:] == -1).all()
        logz = math.log(sum(math.exp(v) for v in paths.values()))
        for u in range(U_b):
            t = best[u]
            post = sum(math.exp(v - logz) for f, v in paths.items() if f[u] == t)
            assert float(al.token_confidence[b, u]) == pytest.approx(post, abs=1e-5)
            assert float(al.token_score[b, u]) == pytest.approx(float(lp[b, t, u, ys[b][u]]), abs=1e-5)
        # labels: the last token emitted at each frame, else the blank; -1 past the length
        want = [blank] * T_b + [-1] * (T - T_b)
        for u in range(U_b):
            want[best[u]] = ys[b][u]
        assert al.labels[b].tolist() == want
    _, _, _, _, logz_k = rnnt_viterbi(logits.numpy(), targets.numpy(), tl.numpy(), ul.numpy(), blank)
    ref = math.log(sum(math.exp(v) for v in _brute(lp[0], ys[0], 4, blank).values()))
    assert logz_k[0] == pytest.approx(ref, abs=1e-5)


def test_properties_random_batch_and_log_prob_inputs():
    g = torch.Generator().manual_seed(3)
    B, T, U, V = 4, 9, 5, 6
    logits = torch.randn(B, T, U + 1, V, generator=g)
    targets = torch.randint(1, V, (B, U), generator=g)
    tl = torch.tensor([9, 1, 5, 0])
    ul = torch.tensor([5, 3, 0, 2])
    al = rnnt_forced_align(logits, targets, tl, ul, blank=0)
    assert al.score.dtype == torch.float32
    for b in range(3):
        k = int(ul[b])
        f = al.token_start[b, :k]
        assert (f.diff() >= 0).all() and (f >= 0).all() and (f < tl[b]).all()
        assert ((al.token_confidence[b, :k] >= 0) & (al.token_confidence[b, :k] <= 1)).all()
        assert (al.token_end[b, :k] == f + 1).all()
    assert al.score[3] == -math.inf and (al.token_start[3] == -1).all() and (al.labels[3] == -1).all()
    # log-probabilities with fused_log_softmax=False: the same alignment
    al2 = rnnt_forced_align(logits.log_softmax(-1), targets, tl, ul, blank=0, fused_log_softmax=False)
    assert torch.equal(al2.token_start, al.token_start)
    assert torch.allclose(al2.score[:3], al.score[:3], atol=1e-5)
    # blank=-1 is V - 1 (torchaudio's default)
    t2 = torch.where(targets == V - 1, torch.ones_like(targets), targets)
    a = rnnt_forced_align(logits, t2, tl, ul, blank=-1)
    c = rnnt_forced_align(logits, t2, tl, ul, blank=V - 1)
    assert torch.equal(a.token_start, c.token_start)


def test_outputs_write_json_and_ctm():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 6, 4, 4, generator=g)
    targets = torch.tensor([[1, 2, 3]])
    al = rnnt_forced_align(logits, targets, [6], [3], blank=0)
    rec = json.loads(to_json(al, targets, tokens="_a b", frame_shift=0.04))[0]
    assert [t["text"] for t in rec["tokens"]] == ["a", " ", "b"]
    assert [t["start_frame"] for t in rec["tokens"]] == al.token_start[0].tolist()
    ctm = to_ctm(al, targets, tokens="_a b", word_separator_id=2, frame_shift=0.04)
    assert len(ctm.strip().splitlines()) == 2


class _Net:
    """A toy transducer network: linear encoder, embedding predictor, additive joiner."""

    def __init__(self, F=3, J=5, V=4):
        g = torch.Generator().manual_seed(0)
        self.W = torch.randn(F, J, generator=g)
        self.E = torch.randn(V, J, generator=g)
        self.O = torch.randn(J, V, generator=g)

    def encode(self, x, lengths):
        return x @ self.W, lengths // 1

    def predict(self, tokens, state=None):
        return self.E[tokens], None

    def join(self, enc, pred):
        return torch.tanh(enc + pred) @ self.O


def test_rnnt_align_runs_the_network():
    net = _Net()
    x = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([[1, 2, 3], [3, 1, 0]])
    tl, ul = torch.tensor([7, 5]), torch.tensor([3, 2])
    al = rnnt_align(net, x, tl, targets, ul, blank=0)
    pred = net.E[torch.cat([torch.zeros(2, 1, dtype=torch.long), targets], 1)]
    logits = net.join((x @ net.W)[:, :, None], pred[:, None])
    ref = rnnt_forced_align(logits, targets, tl, ul, blank=0)
    assert torch.equal(al.token_start, ref.token_start)
    assert torch.allclose(al.score, ref.score)
    with pytest.raises(ValueError, match="model"):
        rnnt_align(object(), x, tl, targets, ul, blank=0)


def _args():
    return dict(
        logits=torch.zeros(2, 3, 3, 4),
        targets=torch.tensor([[1, 2], [3, 0]]),
        logit_lengths=torch.tensor([3, 2]),
        target_lengths=torch.tensor([2, 1]),
        blank=0,
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(logits=torch.zeros(2, 3, 3)), "logits"),
        (dict(logits=torch.zeros(2, 3, 3, 4, dtype=torch.long)), "logits"),
        (dict(targets=torch.tensor([[1, 2, 3], [3, 0, 0]])), "targets"),
        (dict(targets=torch.tensor([[1, 4], [3, 0]])), "targets"),
        (dict(targets=torch.tensor([[1, 0], [3, 0]])), "blank"),
        (dict(targets=torch.tensor([[1.0, 2.0], [3.0, 0.0]])), "targets"),
        (dict(logit_lengths=torch.tensor([4, 2])), "logit_lengths"),
        (dict(logit_lengths=torch.tensor([-1, 2])), "logit_lengths"),
        (dict(logit_lengths=torch.tensor([3])), "logit_lengths"),
        (dict(target_lengths=torch.tensor([3, 1])), "target_lengths"),
        (dict(target_lengths=torch.tensor([2.0, 1.0])), "target_lengths"),
        (dict(blank=4), "blank"),
        (dict(blank=-5), "blank"),
        (dict(blank=True), "blank"),
    ],
)
def test_bad_inputs(change, match):
    a = _args()
    a.update(change)
    logits = a.pop("logits")
    with pytest.raises(ValueError, match=match):
        rnnt_forced_align(logits, a.pop("targets"), a.pop("logit_lengths"), a.pop("target_lengths"), **a)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_logits_are_errors(bad):
    a = _args()
    a["logits"][1, 2, 0, 1] = bad
    logits = a.pop("logits")
    with pytest.raises(ValueError, match="NaN"):
        rnnt_forced_align(logits, a.pop("targets"), a.pop("logit_lengths"), a.pop("target_lengths"), **a)


def test_minus_inf_logits_leave_no_path():
    logits = torch.zeros(1, 2, 2, 3)
    logits[0, :, 0, 1] = -math.inf  # token 1 can never be emitted
    al = rnnt_forced_align(logits, torch.tensor([[1]]), [2], [1], blank=0)
    assert al.score[0] == -math.inf and al.token_start[0, 0] == -1 and al.token_confidence[0, 0] == 0
    frames, *_ = rnnt_viterbi(np.zeros((1, 1, 1, 2), np.float32), np.zeros((1, 0), np.int64), [1], [0], 1)
    assert frames.shape == (1, 0)


def test_align_cli_on_an_rnnt_checkpoint(tmp_path, capsys):
    """lightning-gtn-align on an (untrained) checkpoint of a transducer network with an RNN-T loss."""
    import lightning as L
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from lightning_gtn.align_cli import main
    from lightning_gtn.lightning import SequenceModule
    from lightning_gtn.train import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose("train", overrides=["data=digits_small", "data.num_test=4"])
    dm = instantiate(cfg.data)
    net = {"_target_": "lightning_gtn.lightning.TransducerModel", "conv_channels": 8, "hidden_size": 8}
    net.update(predictor="lstm", predictor_dim=8, joiner_dim=8)
    model = SequenceModule(net, {"_target_": "lightning_gtn.nn.RNNTLoss", "blank": 0}, dm.chars, dm.feature_dim)
    ckpt = tmp_path / "rnnt.ckpt"
    hp = dict(model.hparams)
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": hp, "pytorch-lightning_version": L.__version__}, ckpt
    )
    out = tmp_path / "a.json"
    args = ["--checkpoint", str(ckpt), "--split", "test", "--no-progress"]
    plots = ["--plot-dir", str(tmp_path / "plots"), "--num-plots", "2"]
    rc = main([*args, "--out", str(out), *plots, "data=digits_small", "data.num_test=4"])
    assert rc == 0, capsys.readouterr().err
    recs = json.loads(out.read_text())
    assert len(recs) == 4
    assert len(list((tmp_path / "plots").glob("test*.png"))) == 2
    # the same by hand: the network's lattice aligned directly
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    model.eval()
    with torch.no_grad():
        x, n, tg, tl, _ = model.unpack_batch(batch)
    al = rnnt_align(model.net, x, n, tg, tl, blank=0)
    for b, r in enumerate(recs[: len(tl)]):
        k = int(tl[b])
        assert [t["start_frame"] for t in r["tokens"]] == al.token_start[b, :k].tolist()
        assert all(t["end_frame"] == t["start_frame"] + 1 and 0 <= t["confidence"] <= 1 for t in r["tokens"])
        assert "".join(t["text"] for t in r["tokens"]) == batch["texts"][b]
    assert main([*args, "--star", "-1", "data=digits_small"]) == 2
    assert "--star" in capsys.readouterr().err


def test_plot_of_the_lattice_path(tmp_path):
    from lightning_gtn.align.rnnt_plot import plot_rnnt_alignment

    logits = torch.randn(2, 7, 4, 5, generator=torch.Generator().manual_seed(6))
    targets = torch.tensor([[1, 2, 3], [4, 0, 0]])
    al = rnnt_forced_align(logits, targets, [7, 5], [3, 1], blank=0)
    fig = plot_rnnt_alignment(logits, al, targets, 1, tokens="_abcd", path=tmp_path / "p.png")
    line = fig.axes[0].lines[0]
    # the path ends at the last frame's right edge, all tokens emitted
    assert line.get_xdata()[-1] == 4.5 and line.get_ydata()[-1] == 0.5
    assert (tmp_path / "p.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="b must"):
        plot_rnnt_alignment(logits, al, targets, 2)
