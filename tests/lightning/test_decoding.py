"""The decoder config group: resolving 'train' lexicon/LM files, building decoders from a loss's
convention, and decoding through the mixin."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_gtn.lightning import build_loss
from lightning_gtn.lightning.decoding import build_decoder, decode_texts, resolve_decoder

TEXTS = ["the cat sat", "the dog sat", "a cat ran", "the cat ran", "a dog sat"]
CHARS = "abcdefghijklmnopqrstuvwxyz '"


def _emissions(text, vocab, blank=True, noise=0.0, seed=0, wrong=None):
    """Peaked log-probs spelling ``text`` (each char 2 frames, blanks between), optionally with
    one position's best label replaced by ``wrong`` (a char)."""
    g = torch.Generator().manual_seed(seed)
    frames = []
    for i, ch in enumerate(text):
        lab = vocab.encode(wrong[1] if (wrong is not None and i == wrong[0]) else ch)[0]
        frames += [lab, lab] + ([0] if blank else [])
    C = vocab.num_classes
    x = torch.full((len(frames), C), -8.0) + noise * torch.randn(len(frames), C, generator=g)
    for t, lab in enumerate(frames):
        x[t, lab] = -0.05
    return x.log_softmax(-1)[None]


def test_resolve_writes_lexicon_and_lm(tmp_path):
    cfg = resolve_decoder(
        {"name": "beam_lm", "lexicon": "train", "lm": "train", "lm_order": 2}, lambda: TEXTS, tmp_path
    )
    # the lexicon and the LM are data (what a checkpoint stores), no paths
    assert cfg["lexicon"]["format"] == "lightning_gtn.lexicon/1" and cfg["lm"]["format"] == "lightning_gtn.arpa/1"
    assert cfg["lexicon"]["entries"][1] == ["cat", "c", "a", "t"] and "\\2-grams:" in cfg["lm"]["text"]
    assert str(tmp_path) not in repr(cfg)
    # also written next to the run, for reading
    lines = (tmp_path / "lexicon.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == ["a", "cat", "dog", "ran", "sat", "the"]
    assert (tmp_path / "lm.arpa").read_text() == cfg["lm"]["text"]
    # greedy and beam need no files
    assert resolve_decoder({"name": "beam"}, lambda: pytest.fail("no texts needed"), tmp_path) == {"name": "beam"}
    assert resolve_decoder(None, lambda: TEXTS, tmp_path) is None


def test_bad_decoder_configs(tmp_path):
    loss, vocab = build_loss("ctc", CHARS)
    with pytest.raises(ValueError, match="decoder.name"):
        build_decoder({"name": "viterbi"}, loss, vocab)
    with pytest.raises(ValueError, match="decoder.beam_sise"):
        build_decoder({"name": "beam", "beam_sise": 3}, loss, vocab)
    with pytest.raises(ValueError, match="decoder.lexicon"):
        build_decoder({"name": "beam_lm", "lexicon": "train", "lm": "train"}, loss, vocab)
    assert build_decoder({"name": "greedy"}, loss, vocab) is None and build_decoder(None, loss, vocab) is None


def test_ctc_beam_lm_corrects_a_misread_character(tmp_path):
    loss, vocab = build_loss("ctc", CHARS)
    cfg = resolve_decoder(
        {"name": "beam_lm", "lm_order": 2, "lm_weight": 1.0, "beam_size": 32}, lambda: TEXTS, tmp_path
    )
    dec = build_decoder(cfg, loss, vocab)
    x = _emissions("the cat sat", vocab, wrong=(5, "o"))  # 'the cot sat': 'cot' is no word
    lengths = torch.tensor([x.shape[1]])
    greedy = [vocab.decode_path(p) for p in loss.best_paths(x, lengths)[0].tolist()]
    assert greedy == ["the cot sat"]
    assert decode_texts(dec, x, lengths) == ["the cat sat"]
    plain = build_decoder({"name": "beam", "beam_size": 8}, loss, vocab)
    assert decode_texts(plain, x, lengths) == ["the cot sat"]  # no lexicon: what the frames say


def test_asg_and_transducer_conventions(tmp_path):
    cfg = resolve_decoder({"name": "beam_lm", "lm_order": 2}, lambda: TEXTS, tmp_path)
    loss, vocab = build_loss("asg", CHARS)
    dec = build_decoder(cfg, loss, vocab)
    assert dec.topology == "asg" and dec.tokens[-1] == "<rep>"
    td, tvocab = build_loss(
        {
            "_target_": "lightning_gtn.nn.TransducerLoss",
            "tokens": ["the", "ca", "at"] + list(CHARS),
            "blank": "optional",
        },
        CHARS,
    )
    dec = build_decoder(cfg, td, tvocab)
    assert dec.topology == "transducer" and dec.blank == td.num_classes - 1 and dec.tokens[0] == "the"
    # one frame per token reading "the cat sat" with word pieces, blanks between
    seq = ["the", " ", "ca", "t", " ", "s", "at"]
    frames = []
    for piece in seq:
        frames += [dec.tokens.index(piece), td.blank]
    x = torch.full((1, len(frames), td.num_classes), -9.0)
    for t, k in enumerate(frames):
        x[0, t, k] = -0.01
    assert decode_texts(dec, x.log_softmax(-1), torch.tensor([len(frames)])) == ["the cat sat"]


def test_mixin_uses_the_decoder(tmp_path):
    from lightning_gtn.lightning import SequenceModule

    cfg = resolve_decoder({"name": "beam_lm", "lm_order": 2, "lm_weight": 1.0}, lambda: TEXTS, tmp_path)
    net = {"_target_": "lightning_gtn.lightning.ConvRNNEncoder", "hidden_size": 8, "conv_channels": 4}
    m = SequenceModule(network=net, loss="ctc", chars=CHARS, feature_dim=4, decoder=cfg)
    assert m.hparams.decoder["lm"] == cfg["lm"]
    x = _emissions("a dog sat", m.vocabulary, wrong=(2, "b"))
    assert m.decode(x, torch.tensor([x.shape[1]])) == ["a dog sat"]
    m.configure_decoder(None)
    assert m.decode(x, torch.tensor([x.shape[1]])) == ["a bog sat"]
    assert math.isfinite(float(x.sum()))


def test_transducer_tokens_given_as_grapheme_tuples(tmp_path):
    # the research code also accepts tokens as sequences of graphemes: they spell the same strings
    import lightning_gtn.nn as lnn
    from lightning_gtn.lightning.vocabulary import Vocabulary

    g2i = {c: i for i, c in enumerate(CHARS)}
    td = lnn.TransducerLoss([("t", "h", "e")] + [(c,) for c in CHARS], g2i, blank="optional")
    dec = build_decoder({"name": "beam"}, td, Vocabulary(CHARS, blank=False))
    assert dec.tokens[0] == "the" and dec.tokens[1:-1] == list(CHARS) and dec.tokens[-1] == "<blank>"


def test_lexicon_spellings_are_used_as_written(tmp_path):
    # issue 16 finding 12: the line 'cat d o g' spells "cat" as d-o-g; it was spelled c-a-t
    from lightning_gtn.lm import estimate

    (tmp_path / "lex.txt").write_text("cat d o g\nsat s a t\n", encoding="utf-8")
    estimate([["cat", "sat"], ["sat", "cat"]], order=2).to_arpa(str(tmp_path / "lm.arpa"))
    cfg = resolve_decoder(
        {"name": "beam_lm", "lexicon": str(tmp_path / "lex.txt"), "lm": str(tmp_path / "lm.arpa"), "beam_size": 16},
        list,
        tmp_path / "run",
    )
    assert cfg["lexicon"]["entries"] == [["cat", "d", "o", "g"], ["sat", "s", "a", "t"]]
    loss, vocab = build_loss("ctc", CHARS)
    x = _emissions("dog sat", vocab)
    lengths = torch.tensor([x.shape[1]])
    assert decode_texts(build_decoder(cfg, loss, vocab), x, lengths) == ["cat sat"]
    # the word-piece transducer: the spelled graphemes, decomposed into its pieces
    td, tvocab = build_loss(
        {"_target_": "lightning_gtn.nn.TransducerLoss", "tokens": ["do"] + list(CHARS), "blank": "optional"}, CHARS
    )
    dec = build_decoder(cfg, td, tvocab)
    frames = []
    for piece in ["do", "g", " ", "s", "a", "t"]:
        frames += [dec.tokens.index(piece), td.blank]
    y = torch.full((1, len(frames), td.num_classes), -9.0)
    for t, k in enumerate(frames):
        y[0, t, k] = -0.01
    assert decode_texts(dec, y.log_softmax(-1), torch.tensor([len(frames)])) == ["cat sat"]
