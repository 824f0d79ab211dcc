"""lightning-gtn-eval's data side: the decoder's lexicon and LM at evaluation, and the feature
settings a checkpoint carries."""

import pytest
import torch

from lightning_gtn.evaluate import ConfigError, _set_decoder, evaluate, load_model
from tests.lightning.test_checkpoint_trust import write_checkpoint
from tests.test_train_cli import _compose

EVAL = ["data=digits_small", "data.num_val=4", "num_samples=0", "trainer.enable_progress_bar=false"]


def test_evaluation_never_estimates_a_lexicon_or_lm_from_its_data(tmp_path):
    # data.train_* at evaluation may be the very transcripts being scored: a `train` lexicon / LM is
    # the checkpoint's own, estimated when it was trained, or an error
    from lightning_gtn.lightning.decoding import lexicon_to_data, lm_to_data
    from lightning_gtn.lm import estimate

    greedy = write_checkpoint(tmp_path / "greedy.ckpt")
    own = ["decoder=beam_lm", "decoder.beam_size=4"]
    cfg = _compose([f"ckpt_path={greedy}", *EVAL, *own], tmp_path / "e1", config_name="eval")
    with pytest.raises(ConfigError, match=r"decoder.lexicon=train: evaluation does not estimate a lexicon"):
        evaluate(cfg, overrides=own)
    assert not (tmp_path / "e1" / "lexicon.txt").exists()
    lex = lexicon_to_data({"12": [["1", "2"]], "34": [["3", "4"]], "5": [["5"]]})
    lm = lm_to_data(estimate([["12", "34"], ["34", "5"]], order=2))
    trained = write_checkpoint(tmp_path / "lm.ckpt", decoder={"name": "beam_lm", "lexicon": lex, "lm": lm})
    model = load_model(trained, decoder=None)
    cfg = _compose([f"ckpt_path={trained}", *EVAL, *own], tmp_path / "e2", config_name="eval")
    _set_decoder(cfg, model, None)
    assert model.beam_decoder.lexicon.words == ["12", "34", "5"] and model.beam_decoder.beam_size == 4
    assert torch.isfinite(torch.tensor(evaluate(cfg, overrides=own)["val/cer"]))
