"""WordPieceRNNTLoss: grapheme targets spelled in word pieces (longest match first, checked against
an independent spelling), its loss equal to RNNTLoss on those pieces through both joiner paths,
decoded pieces spelled back, its errors, and loss=rnnt_wordpieces trained from its config."""

import json
import math

import pytest
import torch

from lightning_gtn.lightning import TransducerModel, build_loss
from lightning_gtn.nn import RNNTLoss, WordPieceRNNTLoss

CHARS = "abc "
G2I = {c: i for i, c in enumerate(CHARS)}
PIECES = ["a", "b", "c", " ", "ab", "abc", "ca", "bb"]
SMALL = dict(conv_channels=8, hidden_size=8, predictor_dim=8, joiner_dim=12, stride=2)


def _longest_first(text, pieces):
    """Independent spelling: at each position the longest piece that starts there."""
    out, k = [], 0
    while k < len(text):
        best = max((p for p in pieces if text.startswith(p, k)), key=len)
        out.append(pieces.index(best))
        k += len(best)
    return out


def _targets(texts):
    rows = [[G2I[c] for c in t] for t in texts]
    S = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (S - len(r)) for r in rows]), torch.tensor([len(r) for r in rows])


def test_pieces_spell_the_targets_longest_first_and_spell_back():
    loss = WordPieceRNNTLoss(PIECES, G2I)
    assert loss.num_classes == len(PIECES) + 1 and loss.target_classes == 4 and loss.blank == 0
    texts = ["abcab", "bbca a", "", "c"]
    targets, lengths = _targets(texts)
    pieces, n = loss.piece_targets(targets, lengths)
    assert n.tolist() == [len(_longest_first(t, PIECES)) for t in texts]
    for b, t in enumerate(texts):
        got = pieces[b, : n[b]].tolist()
        assert got == [k + 1 for k in _longest_first(t, PIECES)]  # class k + 1: the blank is 0
        assert (pieces[b, n[b] :] == 0).all()
        assert "".join(CHARS[g] for g in loss.spell(got)) == t
    with pytest.raises(ValueError, match=r"spell: 0 is not a word-piece class \(1 \.\. 8\)"):
        loss.spell([1, 0])


def test_joint_loss_is_rnnt_of_the_pieces_through_both_joiner_paths():
    torch.manual_seed(0)
    m = TransducerModel(6, len(PIECES) + 1, **SMALL).double()
    texts = ["abcab", "bbca a", "c"]
    targets, lengths = _targets(texts)
    want_t = [[k + 1 for k in _longest_first(t, PIECES)] for t in texts]
    U = max(len(r) for r in want_t)
    piece_targets = torch.tensor([r + [0] * (U - len(r)) for r in want_t])
    piece_lengths = torch.tensor([len(r) for r in want_t])
    enc, el = torch.randn(3, 7, 12, dtype=torch.float64), torch.tensor([7, 6, 2])
    values = {}
    for joiner in ("chunked", "materialised"):
        got = WordPieceRNNTLoss(PIECES, G2I, reduction="none", joiner=joiner).joint_loss(m, enc, el, targets, lengths)
        want = RNNTLoss(blank=0, reduction="none", joiner="materialised").joint_loss(
            m, enc, el, piece_targets, piece_lengths
        )
        assert torch.isfinite(want).all()
        torch.testing.assert_close(got, want, rtol=1e-7, atol=0)
        values[joiner] = got
    assert WordPieceRNNTLoss(PIECES, G2I).chunked(m) and not WordPieceRNNTLoss(
        PIECES, G2I, joiner="materialised"
    ).chunked(m)


@pytest.mark.parametrize(
    "tokens,g2i,match",
    [
        (["a", "b", " ", "ab"], G2I, r"every grapheme must be a word piece of its own.*missing \['c'\]"),
        (["a", "b", "c", " ", "a"], G2I, "tokens must be distinct"),
        (["a", "b", "c", " ", ""], G2I, r"tokens\[4\] must be a non-empty string"),
        (["a", "b", "c", " ", "ad"], G2I, r"grapheme 'd' is not in graphemes_to_idx"),
        (["a", "b"], {"a": 0, "b": 2}, r"graphemes_to_idx must give the ids 0 \.\. 2 once each"),
        ("abc", G2I, "tokens must be a list of word pieces"),
    ],
)
def test_bad_pieces_name_the_argument(tokens, g2i, match):
    with pytest.raises(ValueError, match=match):
        WordPieceRNNTLoss(tokens, g2i)


def test_bad_targets_name_the_argument():
    loss = WordPieceRNNTLoss(PIECES, G2I)
    with pytest.raises(ValueError, match=r"targets\[1\] holds a grapheme id outside \[0, 4\)"):
        loss.piece_targets(torch.tensor([[0, 1], [4, 0]]), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match=r"target_lengths must be \(B,\) = \(2,\) lengths in \[0, 2\]"):
        loss.piece_targets(torch.tensor([[0, 1], [2, 0]]), torch.tensor([3, 1]))
    with pytest.raises(ValueError, match=r"targets must have shape \(B, S\)"):
        loss.piece_targets(torch.tensor([0, 1]), torch.tensor([2]))


def test_config_learns_pieces_and_a_run_trains_and_decodes(tmp_path):
    """loss=rnnt_wordpieces loss.tokens=<N> learns the pieces from the training transcripts (and
    writes word_pieces.txt); a one-step run trains through the chunked joiner and decodes strings."""
    from lightning_gtn.train import run
    from tests.test_train_cli import SMOKE, _compose

    texts = ["12 34 12", "34 12", "1234 1234"]
    loss, vocab = build_loss(
        _compose(["loss=rnnt_wordpieces", "loss.tokens=16"], tmp_path).loss, "0123456789 ", texts=lambda k: texts
    )
    assert isinstance(loss, WordPieceRNNTLoss) and loss.joiner == "chunked" and "12" in loss.tokens
    assert set("0123456789 ") <= set(loss.tokens) and vocab.num_classes == 11 and not vocab.blank
    cfg = _compose(["loss=rnnt_wordpieces", "loss.tokens=30", "trainer.fast_dev_run=true", *SMOKE], tmp_path)
    metrics = run(cfg, output_dir=tmp_path)
    assert metrics["global_step"] == 1 and math.isfinite(metrics["train/loss"]) and metrics["val/cer"] >= 0
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert (tmp_path / "word_pieces.txt").is_file()
    preset = _compose(["experiment=rnnt_wordpieces"], tmp_path)
    assert preset.loss._target_ == "lightning_gtn.nn.WordPieceRNNTLoss" and preset.loss.tokens >= 500
    assert preset.loss.joiner == "chunked" and preset.model._target_ == "lightning_gtn.lightning.TransducerModel"


def test_the_mixin_decodes_a_network_into_the_pieces_spelling(monkeypatch):
    """Validation text of a word-piece RNN-T: the network decoder's piece classes, spelled in the
    vocabulary's graphemes (the decoder is told the loss's own V = len(tokens) + 1)."""
    from lightning_gtn.lightning import SequenceModule
    from lightning_gtn.lightning.decoding import NetworkDecoder

    net = {"_target_": "lightning_gtn.lightning.TransducerModel", **SMALL}
    loss = {"_target_": "lightning_gtn.nn.WordPieceRNNTLoss", "tokens": PIECES}
    m = SequenceModule(net, loss, CHARS, feature_dim=6)
    assert m.num_classes == len(PIECES) + 1 and m.net.joiner.out_features == len(PIECES) + 1
    seen = []

    def decode(self, network, encoder_out, encoder_lengths, loss, num_classes):
        seen.append(num_classes)
        return [[6, 4, 5], [3]]  # "abc", " ", "ab"; "c"

    monkeypatch.setattr(NetworkDecoder, "decode", decode)
    enc, lengths = m.outputs(torch.randn(2, 16, 6), torch.tensor([16, 12]))
    assert m.decode(enc, lengths) == ["abc ab", "c"] and seen == [len(PIECES) + 1]


def test_a_character_lm_is_refused_for_word_pieces_and_the_beam_without_one_is_built():
    from lightning_gtn.lightning.decoding import NetworkDecoder, build_decoder

    loss, vocab = build_loss({"_target_": "lightning_gtn.nn.WordPieceRNNTLoss", "tokens": PIECES}, CHARS)
    with pytest.raises(ValueError, match=r"decoder.lm: .*WordPieceRNNTLoss scores its own tokens"):
        build_decoder({"name": "rnnt_beam", "lm": "train"}, loss, vocab)
    assert isinstance(build_decoder({"name": "rnnt_beam"}, loss, vocab), NetworkDecoder)
