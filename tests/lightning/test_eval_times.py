"""lightning-gtn-eval's timed outputs: ``output_ctm`` / ``output_json`` write one row per decoded
word with its frames inside the utterance, for CTC (greedy, beam) and transducer (greedy,
rnnt_beam) checkpoints."""

import json

import pytest
import torch

from lightning_gtn import trust
from lightning_gtn.evaluate import ConfigError, _set_decoder, build_datamodule, decode_samples, evaluate, load_model
from lightning_gtn.lightning import SequenceModule
from lightning_gtn.lightning.decoding import lexicon_to_data, lm_to_data
from lightning_gtn.lm import estimate
from tests._checkpoints import save_module_checkpoint
from tests.lightning.test_checkpoint_trust import CHARS, write_checkpoint
from tests.test_train_cli import _compose

EVAL = ["data=digits_small", "data.num_val=3", "num_samples=0", "trainer.enable_progress_bar=false"]
TRANSDUCER = {
    "_target_": "lightning_gtn.lightning.TransducerModel",
    **dict(conv_channels=8, hidden_size=8, predictor_dim=8, joiner_dim=12, stride=2),
}
LEX = lexicon_to_data({w: [list(w)] for w in ("1", "2", "12", "34", "5", "6", "7", "8", "9", "0")})
LM = lm_to_data(estimate([["12", "34"], ["34", "5"], ["6", "7", "8", "9", "0", "1", "2"]], order=2))


def _transducer_checkpoint(path):
    with trust.trusted([]):
        model = SequenceModule(TRANSDUCER, {"_target_": "lightning_gtn.nn.RNNTLoss", "blank": 0}, CHARS, feature_dim=8)
    save_module_checkpoint(model, path)
    return path


def _words_of_ctm(text):
    rows = [line.split() for line in text.splitlines()]
    assert all(len(r) == 6 for r in rows), rows
    return rows


@pytest.mark.parametrize(
    "kind, decoder",
    [
        ("ctc", []),
        ("ctc", ["decoder=beam", "decoder.beam_size=4"]),
        ("lexicon", ["decoder=beam_lm", "decoder.beam_size=4", "decoder.word_score=2.0"]),
        ("rnnt", []),
        ("rnnt", ["decoder=rnnt_beam"]),
    ],
)
def test_eval_writes_one_row_per_word_inside_the_utterance(tmp_path, kind, decoder):
    torch.manual_seed(2 if kind == "ctc" else 0)  # untrained networks whose outputs have words (rnnt: ~25)
    if kind == "rnnt":
        ckpt = _transducer_checkpoint(tmp_path / "m.ckpt")
    elif kind == "lexicon":  # the checkpoint carries the lexicon and LM of its training
        ckpt = write_checkpoint(tmp_path / "m.ckpt", decoder={"name": "beam_lm", "lexicon": LEX, "lm": LM})
    else:
        ckpt = write_checkpoint(tmp_path / "m.ckpt")
    ctm, js = tmp_path / "out.ctm", tmp_path / "out.json"
    over = [f"output_ctm={ctm}", f"output_json={js}", "frame_shift=0.04", *decoder]
    cfg = _compose([f"ckpt_path={ckpt}", *EVAL, *over], tmp_path / "e", config_name="eval")
    evaluate(cfg, overrides=over)
    records = json.loads(js.read_text())
    assert len(records) == 3
    rows = _words_of_ctm(ctm.read_text())
    words = [w for r in records for w in r["words"]]
    assert words and len(rows) == len(words)  # one CTM line per JSON word, in order
    for r in records:
        assert r["utterance"].startswith("val") and isinstance(r["reference"], str) and r["num_frames"] > 0
        joined = "".join(t["text"] for t in r["tokens"])
        for w in r["words"]:
            assert 0 <= w["start"] < w["end"] <= r["num_frames"], w
            assert 0.0 <= w["confidence"] <= 1.0 + 1e-9
            assert w["text"] and " " not in w["text"] and w["text"] in joined
        # the words are the decoded text split at its spaces (a lexicon's words need none)
        assert kind == "lexicon" or [w["text"] for w in r["words"]] == joined.split()
        for t in r["tokens"]:
            assert 0 <= t["start_frame"] < t["end_frame"] <= r["num_frames"]
    # the words are those of the strings the metrics score (the same decoder, as model.decode)
    model = load_model(ckpt, **({"decoder": None} if decoder else {}))
    if decoder:  # as the eval sets the command line's (a `train` lexicon / LM: the checkpoint's)
        _set_decoder(cfg, model, None)
    dm = build_datamodule(cfg.data, model)
    dm.setup("validate")
    texts = [hyp for _, hyp in decode_samples(model, dm.val_dataloader(), 3)]
    assert [[w["text"] for w in r["words"]] for r in records] == [t.split() for t in texts]
    assert [r["reference"] for r in records] == [ref for ref, _ in decode_samples(model, dm.val_dataloader(), 3)]
    by_utt = {r["utterance"]: r for r in records}
    for (utt, ch, start, dur, text, conf), w in zip(rows, words):
        n = by_utt[utt]["num_frames"]
        assert ch == "1" and float(dur) > 0 and 0 <= float(start) and float(start) + float(dur) <= n * 0.04 + 1e-3
        assert text == w["text"] and abs(float(start) - w["start"] * 0.04) < 1e-3
        assert abs(float(conf) - w["confidence"]) < 1e-4


def test_eval_refuses_a_folder_or_a_missing_folder_before_it_runs(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.ckpt")
    for over, match in (
        ([f"output_ctm={tmp_path}"], "output_ctm: .* is a folder"),
        ([f"output_json={tmp_path / 'no' / 'x.json'}"], "output_json: .* is not an existing folder"),
        ([f"output_ctm={tmp_path / 'a'}", f"output_json={tmp_path / 'a'}"], "output_json: the same file"),
        (["output_ctm=x.ctm", "frame_shift=0"], "frame_shift: expected a positive number"),
    ):
        cfg = _compose([f"ckpt_path={ckpt}", *EVAL, *over], tmp_path / "e", config_name="eval")
        with pytest.raises(ConfigError, match=match):
            evaluate(cfg, overrides=over)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ckpt"]  # nothing written
