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
    context_phrases: []    # beam, beam_lm, rnnt_beam: phrases (of words) to boost
    context_file: null     # ... or a file of them, one a line
    context_score: 0.5     # the bonus per matched token
    context_cap: null      # the most one match may earn (null: 8 tokens' worth)

Lexicon and LM travel inside the checkpoint as data. :func:`resolve_decoder` (called by
``lightning-gtn-train`` and ``lightning-gtn-eval`` on the user's own config) builds ``train``
from the training transcripts, or reads the files the user named, once, and replaces both keys
by plain data (:func:`lexicon_to_data`, :func:`lm_to_data`)::

    lexicon: {format: lightning_gtn.lexicon/1, entries: [[word, token, ...], ...]}
    lm: {format: lightning_gtn.arpa/1, text: "\\data\\ ..."}   # the LM as ARPA text

so a checkpoint's hyper-parameters hold the lexicon and the LM, not file names, and a checkpoint
loads from any directory. Both are bounded (:data:`MAX_LEXICON_ENTRIES`,
:data:`MAX_LEXICON_CHARS`, :data:`MAX_SPELLING_CHARS`, :data:`MAX_LM_CHARS`, :data:`MAX_LM_BYTES`)
and range-checked when the decoder is built, the ARPA text by the ARPA reader
(:meth:`lightning_gtn.lm.NGramLM.from_arpa`) and the entries by the lexicon reader
(:func:`lightning_gtn.lm.read_lexicon`); errors name ``decoder.lexicon`` / ``decoder.lm``.
:func:`build_decoder` never reads a file a config names (a checkpoint written before held paths:
it is refused, naming the key) unless the user trusts that exact path
(``with lightning_gtn.trust.trusted(paths=[path]):``).

:func:`build_decoder` makes a :class:`lightning_gtn.decode.BeamSearchDecoder` whose topology,
tokens and blank come from the loss's declared convention (``topology``, ``blank``,
``repeat_label``, the transducer's ``tokens``): this layer never looks at graphs. A lexicon
entry's spelling is used as written: for CTC and ASG each token of the spelling is one output
token (a character), for the word-piece transducer the spelling's graphemes are decomposed into
the loss's word pieces (up to 16 decompositions, fewest pieces first).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from lightning_gtn import trust

__all__ = [
    "DECODERS",
    "resolve_decoder",
    "build_decoder",
    "decode_texts",
    "best_hypotheses",
    "greedy_frame_hypotheses",
    "NetworkDecoder",
    "lexicon_to_data",
    "lm_to_data",
    "lexicon_from_data",
    "lm_from_data",
    "MAX_LEXICON_ENTRIES",
    "MAX_LEXICON_CHARS",
    "MAX_SPELLING_CHARS",
    "MAX_LM_CHARS",
    "MAX_LM_BYTES",
]

DECODERS = ("greedy", "beam", "beam_lm", "rnnt_beam")
DECODER_KEYS = {
    "name",
    "max_symbols_per_frame",
    "beam_size",
    "beam_threshold",
    "lm_weight",
    "word_score",
    "lexicon",
    "lm",
    "lm_order",
    "lm_method",
    "token_beam",
    "nbest",
    "unk_score",
    "context_phrases",
    "context_file",
    "context_score",
    "context_cap",
}

#: The most lexicon entries (one per spelling of a word) a decoder config may carry.
MAX_LEXICON_ENTRIES = 1_000_000
#: The most characters a lexicon carried as data may have (words and tokens together).
MAX_LEXICON_CHARS = 32 * 2**20
#: The longest word, and the most characters of one spelling (its tokens together).
MAX_SPELLING_CHARS = 256
#: The most characters of an LM carried as ARPA text.
MAX_LM_CHARS = 64 * 2**20
#: The memory the LM may take once read (the ARPA reader's ``max_bytes``).
MAX_LM_BYTES = 2**31

_LEXICON_FORMAT = "lightning_gtn.lexicon/1"
_LM_FORMAT = "lightning_gtn.arpa/1"


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
    unknown = sorted(set(cfg) - DECODER_KEYS)
    if unknown:
        raise ValueError(f"decoder.{unknown[0]}: unknown key; known keys: {sorted(DECODER_KEYS)}")
    name = cfg.get("name", "greedy")
    if name not in DECODERS:
        raise ValueError(f"decoder.name: expected one of {DECODERS}, got {name!r}")
    if name == "greedy" and (cfg.get("context_phrases") or cfg.get("context_file")):
        raise ValueError(
            "decoder.context_phrases: context biasing needs a beam search (decoder=beam|beam_lm|rnnt_beam)"
        )
    return cfg


def _resolve_context(cfg: dict) -> dict:
    """``context_file`` of the user's own config read once: its phrases join ``context_phrases``."""
    path = cfg.get("context_file")
    if not path:
        return cfg
    from lightning_gtn.decode.context_graph import read_phrases

    if not isinstance(path, str):
        raise ValueError(f"decoder.context_file: expected a file path, got {path!r}")
    phrases = list(_phrases(cfg)) + read_phrases(path)
    return dict(cfg, context_phrases=phrases, context_file=None)


def _phrases(cfg: dict) -> list:
    from lightning_gtn.decode.context_graph import MAX_CONTEXT_PHRASES

    p = cfg.get("context_phrases") or []
    if isinstance(p, str) or not isinstance(p, (list, tuple)):
        raise ValueError(f"decoder.context_phrases: expected a list of phrases, got {str(p)[:100]!r}")
    if len(p) > MAX_CONTEXT_PHRASES:
        raise ValueError(f"decoder.context_phrases: {len(p)} phrases, more than {MAX_CONTEXT_PHRASES}")
    return list(p)


def _context_args(cfg: dict) -> dict:
    """The phrases, score and cap of a decoder config (a ``context_file`` left in it is read only
    when the user trusts that exact path)."""
    path = cfg.get("context_file")
    if path:
        if not isinstance(path, str) or not trust.is_trusted_path(path):
            raise trust.UntrustedTargetError(
                f"decoder.context_file: {str(path)[:100]!r} names a file; a decoder config from a checkpoint "
                "carries its phrases as decoder.context_phrases, and files it names are not read"
            )
        cfg = _resolve_context(cfg)
    score, cap = cfg.get("context_score", 0.5), cfg.get("context_cap")
    for key, v in (("context_score", score), ("context_cap", cap)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"decoder.{key}: expected a number, got {v!r}")
    return {"phrases": _phrases(cfg), "score": 0.5 if score is None else float(score), "cap": cap}


def _context_error(e: ValueError) -> ValueError:
    msg = str(e)
    return ValueError(msg if msg.startswith("decoder.") else f"decoder.{msg}")


# ----------------------------------------------------------------------------- artefacts as data
def _is_token(s) -> bool:
    return isinstance(s, str) and 0 < len(s) <= MAX_SPELLING_CHARS and not any(c.isspace() for c in s)


def _check_entries(entries, key: str) -> None:
    """Bounds and types of lexicon entries ``[[word, token, ...], ...]``."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"{key}: expected a list of [word, token, ...] entries, got {type(entries).__name__}")
    if not entries:
        raise ValueError(f"{key}: no entries (a lexicon needs at least one word)")
    if len(entries) > MAX_LEXICON_ENTRIES:
        raise ValueError(f"{key}: {len(entries)} entries; at most {MAX_LEXICON_ENTRIES} travel as data")
    total = 0
    for i, e in enumerate(entries):
        if not isinstance(e, (list, tuple)) or len(e) < 2:
            raise ValueError(f"{key}[{i}]: expected [word, token, ...] with at least one token, got {str(e)[:100]}")
        if len(e) > MAX_SPELLING_CHARS + 1 or not all(_is_token(s) for s in e):
            raise ValueError(
                f"{key}[{i}]: the word and tokens must be non-empty strings without whitespace, of at "
                f"most {MAX_SPELLING_CHARS} characters, got {str(e)[:100]}"
            )
        chars = sum(len(s) for s in e[1:])
        if chars > MAX_SPELLING_CHARS:
            raise ValueError(
                f"{key}[{i}]: the spelling of {e[0][:40]!r} has {chars} characters; at most " f"{MAX_SPELLING_CHARS}"
            )
        total += chars + len(e[0]) + len(e)
        if total > MAX_LEXICON_CHARS:
            raise ValueError(
                f"{key}: over {MAX_LEXICON_CHARS} characters; a lexicon that large does not travel as "
                "data (in a checkpoint)"
            )


def lexicon_to_data(lexicon: Mapping, key: str = "decoder.lexicon") -> dict:
    """``{word: [spelling, ...]}`` (as :func:`lightning_gtn.lm.read_lexicon` returns) as plain data:
    ``{"format": "lightning_gtn.lexicon/1", "entries": [[word, token, ...], ...]}``, one entry per
    spelling, words in order.

    Raises:
        ValueError: naming ``key``: over the bounds of the module (:data:`MAX_LEXICON_ENTRIES`, ...).
    """
    entries = [[w, *sp] for w, sps in lexicon.items() for sp in sps]
    _check_entries(entries, f"{key}.entries")
    return {"format": _LEXICON_FORMAT, "entries": entries}


def lexicon_from_data(data, key: str = "decoder.lexicon") -> dict[str, list[list[str]]]:
    """``{word: [spelling, ...]}`` of :func:`lexicon_to_data`'s ``data``, checked (types, bounds,
    then the lexicon reader's own checks).

    Raises:
        ValueError: naming ``key`` and what was expected.
    """
    from lightning_gtn.lm import read_lexicon

    _check_data(data, key, "a lexicon", _LEXICON_FORMAT, "entries", "lexicon_to_data")
    entries = data.get("entries")
    _check_entries(entries, f"{key}.entries")
    text = "".join(" ".join(e) + "\n" for e in entries)
    try:
        return read_lexicon(io.StringIO(text), probabilities=False, max_bytes=len(text) + 1)
    except ValueError as e:
        raise ValueError(f"{key}.entries: {e} (line n is entry n - 1)") from None


def _check_data(data, key: str, what: str, fmt: str, field: str, writer: str) -> None:
    """``data`` must be ``{"format": fmt, field: ...}`` and nothing else."""
    if not isinstance(data, Mapping) or data.get("format") != fmt:
        raise ValueError(
            f"{key}: expected {what} as data with format {fmt!r} " f"(see lightning_gtn.lightning.decoding.{writer})"
        )
    unknown = sorted(set(data) - {"format", field})
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown key")


def lm_to_data(lm, key: str = "decoder.lm") -> dict:
    """An :class:`lightning_gtn.lm.NGramLM` as plain data: ``{"format": "lightning_gtn.arpa/1",
    "text": <its ARPA text>}``.

    Raises:
        ValueError: naming ``key``: the text has more than :data:`MAX_LM_CHARS` characters.
    """
    text = lm.to_arpa()
    if len(text) > MAX_LM_CHARS:
        raise ValueError(
            f"{key}: the LM's ARPA text has {len(text)} characters; at most {MAX_LM_CHARS} travel "
            "inside a checkpoint (prune the LM or lower decoder.lm_order)"
        )
    return {"format": _LM_FORMAT, "text": text}


def lm_from_data(data, key: str = "decoder.lm"):
    """The :class:`lightning_gtn.lm.NGramLM` of :func:`lm_to_data`'s ``data``, read by the ARPA
    reader with all its checks, in at most :data:`MAX_LM_BYTES` of memory.

    Raises:
        ValueError: naming ``key`` (and the ARPA line).
    """
    from lightning_gtn.lm import NGramLM

    _check_data(data, key, "an LM", _LM_FORMAT, "text", "lm_to_data")
    text = data.get("text")
    if not isinstance(text, str) or len(text) > MAX_LM_CHARS:
        n = len(text) if isinstance(text, str) else type(text).__name__
        raise ValueError(f"{key}.text: expected ARPA text of at most {MAX_LM_CHARS} characters, got {n}")
    try:
        return NGramLM.from_arpa(io.StringIO(text), max_bytes=MAX_LM_BYTES)
    except ValueError as e:
        raise ValueError(f"{key}.text: {e}") from None


def _read_files(cfg: dict) -> dict:
    """``lexicon`` / ``lm`` file paths of the user's own config, read once, as data."""
    from lightning_gtn.lm import NGramLM, read_lexicon

    cfg = dict(cfg)
    p = cfg.get("lexicon")
    if isinstance(p, str):
        try:
            cfg["lexicon"] = lexicon_to_data(read_lexicon(p, max_bytes=MAX_LEXICON_CHARS * 4))
        except (OSError, ValueError) as e:
            raise ValueError(f"decoder.lexicon: cannot use {p!r}: {e}") from None
    p = cfg.get("lm")
    if isinstance(p, str):
        try:
            cfg["lm"] = lm_to_data(NGramLM.from_arpa(p, max_bytes=MAX_LM_BYTES))
        except (OSError, ValueError) as e:
            raise ValueError(f"decoder.lm: cannot use {p!r}: {e}") from None
    return cfg


def resolve_decoder(cfg, train_texts: Callable[[], list], out_dir: str | Path) -> dict | None:
    """The user's own decoder config with its lexicon and LM as data (what a checkpoint stores).

    ``lexicon: train`` / ``lm: train`` are built from ``train_texts()`` (also written to
    ``out_dir/lexicon.txt`` and ``out_dir/lm.arpa`` for you to read); a file path is read once
    (the config is the user's own: call this on trusted configs only). Returns the plain config
    with both keys replaced by data (:func:`lexicon_to_data`, :func:`lm_to_data`), or ``None``
    for no decoder config.

    Raises:
        ValueError: naming ``decoder.lexicon`` / ``decoder.lm``: an unreadable or malformed file,
            no words, over the bounds of the module.
    """
    cfg = _plain(cfg)
    if cfg is not None:
        cfg = _resolve_context(cfg)
    if cfg is not None and cfg.get("name") == "rnnt_beam":
        return _resolve_token_lm(cfg, train_texts, out_dir)
    if cfg is None or cfg.get("name", "greedy") != "beam_lm":
        return cfg
    out_dir = Path(out_dir)
    texts = None
    if cfg.get("lexicon", "train") == "train":
        texts = texts if texts is not None else train_texts()
        words = sorted({w for t in texts for w in t.split()})
        if not words:
            raise ValueError("decoder.lexicon: the training transcripts have no words")
        cfg["lexicon"] = lexicon_to_data({w: [list(w)] for w in words})
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "lexicon.txt").write_text("".join(f"{w}\t{' '.join(w)}\n" for w in words), encoding="utf-8")
    if cfg.get("lm", "train") == "train":
        from lightning_gtn.lm import estimate

        texts = texts if texts is not None else train_texts()
        lm = estimate(
            [t.split() for t in texts],
            order=int(cfg.get("lm_order", 3)),
            method=str(cfg.get("lm_method", "kneser_ney")),
        )
        cfg["lm"] = lm_to_data(lm)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "lm.arpa").write_text(cfg["lm"]["text"], encoding="utf-8")
    return _read_files(cfg)


def _topology(loss, vocabulary) -> dict:
    """Decoder tokens, topology, blank and repeat token from the loss's declared convention
    (``topology``, ``blank``, ``repeat_label``, ``tokens``): the loss's own tokens (the word-piece
    transducer's), else the vocabulary's characters, the repeat token after them, the blank at
    its id."""
    from lightning_gtn.nn import LOSS_TOPOLOGIES

    topology = loss.topology
    if topology not in LOSS_TOPOLOGIES:
        raise ValueError(
            f"decoder: {type(loss).__qualname__} declares topology={topology!r}; the decoders read {LOSS_TOPOLOGIES}"
        )
    refused = loss.decoding(vocabulary.num_classes).beam
    if refused is not None:
        raise ValueError(f"decoder: {refused}")
    # a token is a string or a tuple of graphemes (the keys of graphemes_to_idx)
    names = ["".join(t) for t in loss.tokens] if loss.tokens is not None else list(vocabulary.chars)
    repeat = None
    if loss.repeat_label:
        repeat = len(names)
        names.append("<rep>")
    if loss.blank is not None:
        names.insert(loss.blank, "<blank>")
    return {"tokens": names, "topology": topology, "blank": loss.blank, "repeat": repeat}


def _artefact(cfg: dict, key: str, from_data):
    """``decoder.<key>`` as data, or the file it names when the user trusts that exact path."""
    v = cfg.get(key)
    if isinstance(v, Mapping):
        return from_data(v, f"decoder.{key}")
    if not isinstance(v, str) or v == "train":
        raise ValueError(
            f"decoder.{key}: expected the {key} as data (or 'train' or a file, resolved by the "
            f"training/eval CLI with lightning_gtn.lightning.decoding.resolve_decoder), got {str(v)[:100]!r}"
        )
    if not trust.is_trusted_path(v):
        raise trust.UntrustedTargetError(
            f"decoder.{key}: {v!r} names a file; a decoder config read from a checkpoint carries its lexicon and "
            "LM as data, and files it names are not read (a checkpoint written by an older lightning_gtn: if you "
            f"trust that file, load inside `with lightning_gtn.trust.trusted(paths=[{v!r}]):` and save the "
            "checkpoint again, or give lightning-gtn-eval the files on its command line: decoder=beam_lm "
            "decoder.lexicon=<file> decoder.lm=<file>)"
        )
    return from_data(_read_files({key: v})[key], f"decoder.{key}")


def _trie_spellings(lexicon) -> dict[str, list[list[int]]]:
    """``{word: [spelling, ...]}`` read back from a :class:`lightning_gtn.decode.Lexicon`'s trie."""
    return lexicon.spellings()


def _lexicon(spellings: dict[str, list[list[str]]], topo: dict):
    """The decoder's :class:`lightning_gtn.decode.Lexicon`: each spelling as written, in the
    loss's tokens (a character per token for CTC/ASG; word-piece decompositions of the spelled
    graphemes for the transducer)."""
    from lightning_gtn.decode import Lexicon

    toks = topo["tokens"]
    special = {i for i in (topo.get("blank"), topo.get("repeat")) if i is not None}
    ids: dict[str, list[list[int]]] = {}
    if topo["topology"] == "transducer":
        spelled = list(dict.fromkeys("".join(sp) for sps in spellings.values() for sp in sps))
        try:
            pieces = _trie_spellings(Lexicon.from_pieces(spelled, toks, skip=sorted(special)))
        except ValueError as e:
            raise ValueError(f"decoder.lexicon: {e}") from None
        for w, sps in spellings.items():
            ids[w] = [p for sp in sps for p in pieces["".join(sp)]]
    else:
        token_of = {t: i for i, t in enumerate(toks) if i not in special}
        for w, sps in spellings.items():
            for sp in sps:
                bad = [t for t in sp if t not in token_of]
                if bad:
                    raise ValueError(
                        f"decoder.lexicon: the spelling {' '.join(sp)[:80]!r} of {w[:40]!r} has "
                        f"{bad[0][:40]!r}, not a token of this loss (one of {''.join(token_of)[:80]!r})"
                    )
                ids.setdefault(w, []).append([token_of[t] for t in sp])
    return Lexicon(ids)


def build_decoder(cfg, loss, vocabulary):
    """A :class:`lightning_gtn.decode.BeamSearchDecoder` for ``cfg`` (None for greedy).

    Args:
        cfg: a decoder config (see the module docstring); for ``beam_lm`` its ``lexicon`` and
            ``lm`` are data (:func:`resolve_decoder`), range-checked here. A file path there is
            read only when the user trusts that exact path
            (``with lightning_gtn.trust.trusted(paths=[path]):``).
        loss: the :class:`lightning_gtn.nn.StructuredLoss` whose emissions are decoded.
        vocabulary: the :class:`~lightning_gtn.lightning.vocabulary.Vocabulary` of the targets.

    Raises:
        ValueError: naming the ``decoder.<key>`` at fault;
            :class:`lightning_gtn.trust.UntrustedTargetError` (a ValueError) for a file path
            the user does not trust.
    """
    cfg = _plain(cfg)
    name = "greedy" if cfg is None else cfg.get("name", "greedy")
    if loss.network_methods:
        return _network_decoder(cfg or {}, name, loss, vocabulary)
    if name == "rnnt_beam":
        raise ValueError(
            f"decoder=rnnt_beam decodes RNN-T losses (loss=rnnt|pruned_rnnt|tdt|multiblank), not "
            f"{type(loss).__qualname__}; use decoder=beam or decoder=beam_lm"
        )
    if name == "greedy":
        return None
    from lightning_gtn.decode import BeamSearchDecoder

    topo = _topology(loss, vocabulary)
    ctx = _context_args(cfg)
    common = dict(
        beam_size=int(cfg.get("beam_size", 50)),
        beam_threshold=float(cfg.get("beam_threshold", 25.0)),
        token_beam=cfg.get("token_beam"),
        nbest=int(cfg.get("nbest", 1)),
        context=ctx["phrases"] or None,
        context_score=ctx["score"],
        context_cap=ctx["cap"],
        **topo,
    )
    try:
        if name == "beam":
            return BeamSearchDecoder(lexicon_free=True, **common)
        spellings = _artefact(cfg, "lexicon", lexicon_from_data)
        lm = _artefact(cfg, "lm", lm_from_data)
        lexicon = _lexicon(spellings, topo)
        unk = cfg.get("unk_score", -math.inf)
        return BeamSearchDecoder(
            lexicon=lexicon,
            lm=lm,
            lm_weight=float(cfg.get("lm_weight", 0.5)),
            word_score=float(cfg.get("word_score", 0.0)),
            unk_score=float(unk) if unk is not None else -math.inf,
            **common,
        )
    except ValueError as e:
        if "context_" in str(e):
            raise _context_error(e) from None
        raise


def best_hypotheses(decoder, emissions, lengths) -> list:
    """The best :class:`lightning_gtn.decode.Hypothesis` of each example (token and word times
    filled by the search; an utterance the beam returned nothing for gets an empty one of score
    ``-inf``, which the writers give no words)."""
    from lightning_gtn.decode.beam import Hypothesis

    lens = lengths.detach().cpu()
    hyps = decoder.decode(emissions.detach().float().cpu(), lens)
    inf = -math.inf
    return [h[0] if h else Hypothesis([], [], [], inf, inf, inf, "", num_frames=int(n)) for h, n in zip(hyps, lens)]


def greedy_frame_hypotheses(loss, vocabulary, emissions, lengths) -> tuple[list, list[str]]:
    """The best-frame path of each example as a :class:`lightning_gtn.decode.Hypothesis` with
    token and word times (words split at the space), over the tokens, topology and blank the
    loss declares; and the text of each token id."""
    from lightning_gtn.decode.timed import greedy_hypotheses

    topo = _topology(loss, vocabulary)
    hyps = greedy_hypotheses(emissions.detach().float().cpu(), lengths.detach().cpu(), **topo)
    return hyps, topo["tokens"]


def decode_texts(decoder, emissions, lengths) -> list[str]:
    """The best hypothesis' text of each example (words joined by spaces)."""
    hyps = decoder.decode(emissions.detach().float().cpu(), lengths.detach().cpu())
    return [(" ".join(h[0].words) if decoder.lexicon is not None else h[0].text) if h else "" for h in hyps]


class NetworkDecoder:
    """How an RNN-T loss's network is decoded: ``greedy`` (:func:`lightning_gtn.decode.transducer.greedy_search`)
    or ``rnnt_beam`` (:func:`lightning_gtn.decode.transducer_beam.modified_beam_search`, with an
    optional n-gram LM fused in with weight ``lm_weight``).

    Args:
        name: ``"greedy"`` or ``"rnnt_beam"``.
        max_symbols_per_frame: labels emitted on one frame at most.
        beam_size: hypotheses kept (``rnnt_beam``).
        lm: a :class:`lightning_gtn.decode.transducer_beam.TokenLM` (a character n-gram seen
            through the token ids) for shallow fusion, or None (``rnnt_beam``).
        lm_weight: its weight.
        context: a :class:`lightning_gtn.decode.context_graph.ContextGraph` over the token ids
            for context biasing, or None (``rnnt_beam``).
    """

    def __init__(
        self,
        name: str = "greedy",
        max_symbols_per_frame: int = 3,
        beam_size: int = 4,
        lm=None,
        lm_weight: float = 0.0,
        context=None,
    ):
        if name not in ("greedy", "rnnt_beam"):
            raise ValueError(
                f"decoder.name: RNN-T losses decode with decoder=greedy or decoder=rnnt_beam, got {name!r} "
                "(beam and beam_lm search frame paths of CTC-like losses)"
            )
        if isinstance(max_symbols_per_frame, bool) or not isinstance(max_symbols_per_frame, int):
            raise ValueError(f"decoder.max_symbols_per_frame: expected an integer >= 1, got {max_symbols_per_frame!r}")
        if max_symbols_per_frame < 1:
            raise ValueError(f"decoder.max_symbols_per_frame: expected an integer >= 1, got {max_symbols_per_frame}")
        if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
            raise ValueError(f"decoder.beam_size: expected an integer >= 1, got {beam_size!r}")
        self.name = name
        self.max_symbols_per_frame = max_symbols_per_frame
        self.beam_size = beam_size
        self.lm = lm
        self.lm_weight = float(lm_weight)
        self.context = context
        self.lexicon = None

    def __repr__(self) -> str:
        return (
            f"NetworkDecoder({self.name!r}, max_symbols_per_frame={self.max_symbols_per_frame}, "
            f"beam_size={self.beam_size}, lm={'yes' if self.lm is not None else None}, lm_weight={self.lm_weight})"
        )

    def hypotheses(self, network, encoder_out, encoder_lengths, loss, num_classes: int, word_separator_id=None) -> list:
        """The best :class:`lightning_gtn.decode.transducer_beam.TransducerHypothesis` of each
        example (arguments as :meth:`decode`), with token times, confidences and ``word_spans``
        grouped at ``word_separator_id`` (None: one word per token)."""
        blank = int(loss.blank)
        lengths = encoder_lengths.to(encoder_out.device)
        if self.name == "rnnt_beam":
            from lightning_gtn.decode.transducer_beam import modified_beam_search_nbest

            nbest = modified_beam_search_nbest(
                network,
                encoder_out,
                lengths,
                blank=blank,
                beam=self.beam_size,
                lm=self.lm,
                lm_weight=self.lm_weight,
                max_symbols_per_frame=self.max_symbols_per_frame,
                nbest=1,
                word_separator_id=word_separator_id,
                context=self.context,
            )
            from lightning_gtn.decode.transducer_beam import best_hypotheses

            return best_hypotheses(nbest, lengths.tolist())  # a beam that died out: an empty one
        from lightning_gtn.decode.timed import greedy_search_hypotheses

        return greedy_search_hypotheses(
            network,
            encoder_out,
            lengths,
            blank=blank,
            max_symbols_per_frame=self.max_symbols_per_frame,
            num_classes=int(num_classes),
            word_separator_id=word_separator_id,
            **loss.decoding(int(num_classes)).options,
        )

    def decode(self, network, encoder_out, encoder_lengths, loss, num_classes: int) -> list[list[int]]:
        """Label ids of each example from ``network``'s encoder frames ``(B, T, J)``.

        ``loss`` (one with ``network_methods``) declares the blank and, in its
        :meth:`~lightning_gtn.nn.StructuredLoss.decoding`, the greedy search's options (how the
        joiner's extra outputs advance frames); ``num_classes`` is ``V``, the vocabulary's classes
        (the joiner's outputs before the extra ones)."""
        return [list(h.tokens) for h in self.hypotheses(network, encoder_out, encoder_lengths, loss, num_classes)]


#: the LM word of a space in the character LMs of ``rnnt_beam`` (as ``lightning-gtn-lm --chars``)
TOKEN_LM_SPACE = "|"


def _resolve_token_lm(cfg: dict, train_texts: Callable[[], list], out_dir: str | Path) -> dict:
    """``rnnt_beam``'s ``lm``: ``train`` estimates a character n-gram (``lm_order``, ``lm_method``)
    from the training transcripts (a space is the word ``|``; also written to ``out_dir/lm.arpa``),
    a file path is read once; either way the config then carries the LM as ARPA text."""
    if cfg.get("lm") != "train":
        return _read_files(cfg) if isinstance(cfg.get("lm"), str) else cfg
    from lightning_gtn.lm import estimate

    sents = []
    for t in train_texts():
        chars = [TOKEN_LM_SPACE if c == " " else c for c in " ".join(str(t).split())]
        if chars:
            sents.append(chars)
    if not sents:
        raise ValueError("decoder.lm: the training transcripts have no characters to estimate an LM from")
    lm = estimate(sents, order=int(cfg.get("lm_order", 6)), method=str(cfg.get("lm_method", "kneser_ney")))
    cfg = dict(cfg, lm=lm_to_data(lm))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lm.arpa").write_text(cfg["lm"]["text"], encoding="utf-8")
    return cfg


def _token_texts(vocabulary, blank: int, num_tokens: int) -> list:
    """The text of each token id of an RNN-T loss (None for the blank and ids without a character)."""
    texts: list = [None] * num_tokens
    off = 1 if vocabulary.blank else 0
    for i, c in enumerate(vocabulary.chars):
        if 0 <= i + off < num_tokens:
            texts[i + off] = c
    if 0 <= blank < num_tokens:
        texts[blank] = None
    return texts


def _network_decoder(cfg: dict, name: str, loss, vocabulary=None) -> NetworkDecoder:
    """The decoder of a loss with ``network_methods`` from a decoder config (greedy or rnnt_beam)."""
    if name not in ("greedy", "rnnt_beam"):
        raise ValueError(
            f"decoder={name}: {type(loss).__qualname__} is an RNN-T loss, decoded by decoder=greedy or "
            "decoder=rnnt_beam (beam and beam_lm search the frame paths of CTC-like losses)"
        )
    if name == "rnnt_beam":
        refused = loss.decoding(vocabulary.num_classes if vocabulary is not None else 0).beam
        if refused is not None:
            raise ValueError(f"decoder=rnnt_beam: {refused}")
    lm = None
    if name == "rnnt_beam" and cfg.get("lm") is not None:
        from lightning_gtn.decode.transducer_beam import TokenLM

        if vocabulary is None:
            raise ValueError("decoder.lm: the LM of rnnt_beam needs the vocabulary (its token texts)")
        if loss.target_classes is not None:
            raise ValueError(
                "decoder.lm: the LM of rnnt_beam reads the vocabulary's characters as the joiner's classes, but "
                f"{type(loss).__qualname__} scores its own tokens; use decoder=rnnt_beam without an lm, or "
                "decoder=greedy"
            )
        blank = int(loss.blank or 0)
        V = int(loss.num_classes) if loss.num_classes is not None else vocabulary.num_classes
        lm = TokenLM(_artefact(cfg, "lm", lm_from_data), _token_texts(vocabulary, blank, V), space=TOKEN_LM_SPACE)
    context = None
    ctx = _context_args(cfg) if name == "rnnt_beam" else {"phrases": []}
    if ctx["phrases"]:
        from lightning_gtn.decode.context_graph import ContextGraph

        if vocabulary is None:
            raise ValueError("decoder.context_phrases: context biasing of rnnt_beam needs the vocabulary")
        blank = int(loss.blank or 0)
        V = int(loss.num_classes) if loss.num_classes is not None else vocabulary.num_classes
        try:
            context = ContextGraph.from_phrases(
                ctx["phrases"], _token_texts(vocabulary, blank, V), score=ctx["score"], cap=ctx["cap"], skip=[blank]
            )
        except ValueError as e:
            raise _context_error(e) from None
    return NetworkDecoder(
        name,
        max_symbols_per_frame=cfg.get("max_symbols_per_frame", 3),
        beam_size=cfg.get("beam_size", 4),
        lm=lm,
        lm_weight=float(cfg.get("lm_weight", 0.0)),
        context=context,
    )
