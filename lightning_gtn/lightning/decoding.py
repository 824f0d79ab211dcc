"""The ``decoder`` config group: greedy, beam search, beam search with a lexicon and a word LM.

A decoder config is plain data (``conf/decoder/*.yaml``)::

    name: beam_lm          # greedy | beam | beam_lm
    beam_size: 50
    beam_threshold: 25.0
    lm_weight: 0.5         # beam_lm: weight of the natural-log LM score
    word_score: 0.0        # beam_lm: added per word
    lexicon: train         # beam_lm: "train" (the words of the training transcripts) or a file
    lm: train              # beam_lm: "train" (an n-gram estimated on the training transcripts) or an ARPA file
    lm_order: 3
    lm_method: kneser_ney

:func:`resolve_decoder` turns ``train`` into files written next to the run
(``<run>/lexicon.txt``, ``<run>/lm.arpa``), so the checkpoint's hyperparameters name files, and
:func:`build_decoder` makes a :class:`lightning_gtn.decode.BeamSearchDecoder` whose topology,
tokens and blank come from the loss's declared convention (``blank``, ``repeat_label``,
``target_classes`` with the transducer's ``tokens``): this layer never looks at graphs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["DECODERS", "resolve_decoder", "build_decoder", "decode_texts"]

DECODERS = ("greedy", "beam", "beam_lm")
_KEYS = {"name", "beam_size", "beam_threshold", "lm_weight", "word_score", "lexicon", "lm", "lm_order",
         "lm_method", "token_beam", "nbest", "unk_score"}


def _plain(cfg) -> dict | None:
    if cfg is None:
        return None
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, str):
        cfg = {"name": cfg}
    if not isinstance(cfg, Mapping):
        raise ValueError(f"decoder: expected a mapping with 'name' ({'|'.join(DECODERS)}), got {cfg!r}")
    cfg = dict(cfg)
    unknown = sorted(set(cfg) - _KEYS)
    if unknown:
        raise ValueError(f"decoder.{unknown[0]}: unknown key; known keys: {sorted(_KEYS)}")
    name = cfg.get("name", "greedy")
    if name not in DECODERS:
        raise ValueError(f"decoder.name: expected one of {DECODERS}, got {name!r}")
    return cfg


def resolve_decoder(cfg, train_texts: Callable[[], list], out_dir: str | Path) -> dict | None:
    """``lexicon: train`` / ``lm: train`` -> files in ``out_dir`` built from ``train_texts()``.

    Returns the plain config with those keys replaced by the files' paths (or ``None`` for no
    decoder config)."""
    cfg = _plain(cfg)
    if cfg is None or cfg.get("name", "greedy") != "beam_lm":
        return cfg
    out_dir = Path(out_dir)
    texts = None
    if cfg.get("lexicon", "train") == "train":
        texts = texts if texts is not None else train_texts()
        words = sorted({w for t in texts for w in t.split()})
        if not words:
            raise ValueError("decoder.lexicon: the training transcripts have no words")
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "lexicon.txt"
        path.write_text("".join(f"{w}\t{' '.join(w)}\n" for w in words), encoding="utf-8")
        cfg["lexicon"] = str(path)
    if cfg.get("lm", "train") == "train":
        from lightning_gtn.lm import estimate

        texts = texts if texts is not None else train_texts()
        lm = estimate([t.split() for t in texts], order=int(cfg.get("lm_order", 3)),
                      method=str(cfg.get("lm_method", "kneser_ney")))
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "lm.arpa"
        lm.to_arpa(str(path))
        cfg["lm"] = str(path)
    return cfg


def _topology(loss, vocabulary) -> dict:
    """Decoder tokens, topology and blank from the loss's token convention."""
    if getattr(loss, "target_classes", None) is not None:  # the word-piece transducer
        # a token is a string or a tuple of graphemes (the keys of graphemes_to_idx)
        toks = ["".join(t) for t in loss.tokens]
        if loss.blank is None:  # no blank: frames of a token merge, as ASG's without a repeat token
            return {"tokens": toks, "topology": "asg"}
        if getattr(loss, "blank_mode", "optional") != "optional" or not getattr(loss, "allow_repeats", True):
            raise ValueError("decoder: beam search decodes the transducer with blank='optional' and allow_repeats=True "
                             "(or blank='none'); use decoder=greedy for this loss")
        return {"tokens": toks + ["<blank>"], "topology": "transducer", "blank": loss.blank}
    chars = list(vocabulary.chars)
    if vocabulary.blank:
        return {"tokens": ["<blank>"] + chars, "topology": "ctc", "blank": 0}
    toks = chars + (["<rep>"] if vocabulary.repeat_label else [])
    return {"tokens": toks, "topology": "asg", "repeat": vocabulary.repeat_id}


def _read_words(path: str) -> list[str]:
    from lightning_gtn.lm import read_lexicon

    return list(read_lexicon(path))


def build_decoder(cfg, loss, vocabulary):
    """A :class:`lightning_gtn.decode.BeamSearchDecoder` for ``cfg`` (None for greedy).

    Args:
        cfg: a decoder config (see the module docstring), already resolved
            (:func:`resolve_decoder`): ``lexicon`` and ``lm`` are file paths for ``beam_lm``.
        loss: the :class:`lightning_gtn.nn.StructuredLoss` whose emissions are decoded.
        vocabulary: the :class:`Vocabulary` of the targets.
    """
    cfg = _plain(cfg)
    name = "greedy" if cfg is None else cfg.get("name", "greedy")
    if name == "greedy":
        return None
    from lightning_gtn.decode import BeamSearchDecoder, Lexicon

    topo = _topology(loss, vocabulary)
    common = dict(beam_size=int(cfg.get("beam_size", 50)), beam_threshold=float(cfg.get("beam_threshold", 25.0)),
                  token_beam=cfg.get("token_beam"), nbest=int(cfg.get("nbest", 1)), **topo)
    if name == "beam":
        return BeamSearchDecoder(lexicon_free=True, **common)
    for key in ("lexicon", "lm"):
        p = cfg.get(key)
        if not isinstance(p, str) or p == "train" or not Path(p).is_file():
            raise ValueError(f"decoder.{key}: expected a file (or 'train', resolved by the training/eval CLI), got {p!r}")
    from lightning_gtn.lm import NGramLM

    words = _read_words(cfg["lexicon"])
    toks = topo["tokens"]
    if topo["topology"] == "transducer":
        skip = [topo["blank"]] if topo["blank"] is not None else []
        lexicon = Lexicon.from_pieces(words, toks, skip=skip)
    else:
        token_of = {t: i for i, t in enumerate(toks) if len(t) == 1}
        lexicon = Lexicon.from_words(words, token_of)
    lm = NGramLM.from_arpa(cfg["lm"])
    unk = cfg.get("unk_score", -math.inf)
    return BeamSearchDecoder(lexicon=lexicon, lm=lm, lm_weight=float(cfg.get("lm_weight", 0.5)),
                             word_score=float(cfg.get("word_score", 0.0)),
                             unk_score=float(unk) if unk is not None else -math.inf, **common)


def decode_texts(decoder, emissions, lengths) -> list[str]:
    """The best hypothesis' text of each example (words joined by spaces)."""
    hyps = decoder.decode(emissions.detach().float().cpu(), lengths.detach().cpu())
    return [(" ".join(h[0].words) if decoder.lexicon is not None else h[0].text) if h else "" for h in hyps]
