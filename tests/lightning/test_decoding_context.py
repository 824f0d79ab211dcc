"""The decoder config's context-biasing keys (context_phrases, context_file, context_score, context_cap)."""

from __future__ import annotations

import pytest
import torch

from lightning_gtn import trust
from lightning_gtn.decode.context_graph import ContextGraph
from lightning_gtn.lightning import build_loss
from lightning_gtn.lightning.decoding import build_decoder, decode_texts, resolve_decoder

from .test_decoding import CHARS, TEXTS, _emissions


def test_context_file_is_read_once_into_the_config(tmp_path):
    f = tmp_path / "phrases.txt"
    f.write_text("# boosted\nthe cot\n", encoding="utf-8")
    cfg = resolve_decoder({"name": "beam", "context_phrases": ["dog"], "context_file": str(f)}, lambda: TEXTS, tmp_path)
    assert cfg["context_phrases"] == ["dog", "the cot"] and cfg["context_file"] is None
    loss, vocab = build_loss("ctc", CHARS)
    with pytest.raises(trust.UntrustedTargetError, match="decoder.context_file"):
        build_decoder({"name": "beam", "context_file": str(f)}, loss, vocab)


def test_ctc_beam_and_beam_lm_take_the_phrases(tmp_path):
    loss, vocab = build_loss("ctc", CHARS)
    x = _emissions("the cat sat", vocab, wrong=(5, "o"))
    x[0, 15:17] = x[0, 15:17].clone().fill_(-4.0)  # the 'o' frames: 'o' and 'a' nearly tied
    x[0, 15:17, vocab.encode("o")[0]] = -0.6
    x[0, 15:17, vocab.encode("a")[0]] = -0.9
    x = x.log_softmax(-1)
    n = torch.tensor([x.shape[1]])
    plain = build_decoder({"name": "beam", "beam_size": 8}, loss, vocab)
    assert decode_texts(plain, x, n) == ["the cot sat"]
    biased = build_decoder(
        {"name": "beam", "beam_size": 8, "context_phrases": ["cat"], "context_score": 1.0}, loss, vocab
    )
    assert isinstance(biased.context, ContextGraph) and decode_texts(biased, x, n) == ["the cat sat"]
    lm_cfg = resolve_decoder(
        {"name": "beam_lm", "lm_order": 2, "lm_weight": 0.0, "beam_size": 8, "context_phrases": ["sat"]},
        lambda: TEXTS + ["the cot sat"],
        tmp_path,
    )
    dec = build_decoder(lm_cfg, loss, vocab)
    assert dec.context is not None and len(dec.context) == 1
    with pytest.raises(ValueError, match=r"decoder.context_phrases\[0\]: word 'zebra' is not in the lexicon"):
        build_decoder(dict(lm_cfg, context_phrases=["zebra"]), loss, vocab)
    with pytest.raises(ValueError, match="decoder.context_score"):
        build_decoder({"name": "beam", "context_phrases": ["cat"], "context_score": -1.0}, loss, vocab)
    with pytest.raises(ValueError, match="needs a beam search"):
        build_decoder({"name": "greedy", "context_phrases": ["cat"]}, loss, vocab)


def test_rnnt_beam_takes_the_phrases():
    from lightning_gtn.decode.transducer_beam import modified_beam_search
    from lightning_gtn.lightning import TransducerModel, Vocabulary
    from lightning_gtn.nn.rnnt import RNNTStructuredLoss

    class Declared(RNNTStructuredLoss):
        blank = 0

    vocab = Vocabulary("0123 ", blank=True)
    dec = build_decoder(
        {"name": "rnnt_beam", "beam_size": 4, "context_phrases": ["12", "3"], "context_score": 1.0}, Declared(), vocab
    )
    assert dec.context is not None and dec.context.num_tokens == 6
    torch.manual_seed(1)
    net = TransducerModel(feature_dim=4, num_classes=6, conv_channels=8, hidden_size=8, predictor_dim=8, joiner_dim=8)
    net.eval()
    with torch.no_grad():
        enc, n = net.encode(torch.randn(2, 12, 4), torch.tensor([12, 7]))
        got = dec.decode(net, enc, n, Declared(), vocab.num_classes)
        want = modified_beam_search(net, enc, n, blank=0, beam=4, max_symbols_per_frame=3, context=dec.context)
        plain = modified_beam_search(net, enc, n, blank=0, beam=4, max_symbols_per_frame=3)
    assert got == want and got != plain
    with pytest.raises(ValueError, match="decoder.context_phrases"):
        build_decoder({"name": "rnnt_beam", "context_phrases": ["9"]}, Declared(), vocab)


def test_eval_cli_reads_the_context_file(tmp_path):
    from lightning_gtn.evaluate import _set_decoder, evaluate, load_model
    from tests.lightning.test_checkpoint_trust import write_checkpoint
    from tests.test_train_cli import _compose

    f = tmp_path / "phrases.txt"
    f.write_text("12 34\n5\n", encoding="utf-8")
    ckpt = write_checkpoint(tmp_path / "greedy.ckpt")
    own = ["decoder=beam", "decoder.beam_size=4", f"decoder.context_file={f}", "decoder.context_score=0.5"]
    common = ["data=digits_small", "data.num_val=4", "num_samples=0", "trainer.enable_progress_bar=false"]
    cfg = _compose([f"ckpt_path={ckpt}", *common, *own], tmp_path / "e", config_name="eval")
    model = load_model(ckpt, decoder=None)
    _set_decoder(cfg, model, None)
    g = model.beam_decoder.context
    assert isinstance(g, ContextGraph) and len(g) == 2 and g.score == 0.5
    assert torch.isfinite(torch.tensor(evaluate(cfg, overrides=own)["val/cer"]))
