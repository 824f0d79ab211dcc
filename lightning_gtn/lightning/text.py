"""The embedded text task: lines of English words rendered with matplotlib's fonts (no download).

Sentences come from a small hand-written probabilistic grammar (below, in this file) over a word
list of about 400 common English words: subject-verb agreement, determiners before optional
adjectives before nouns, transitive verbs with objects, prepositional phrases, adverbs, "and"
and "but" between clauses. So a word n-gram model helps: "the" is followed by an adjective or a
noun, "two" by a plural noun, a singular subject by a verb ending in "s".

Each sentence is rendered with PIL on one of the DejaVu TrueType faces that ship with matplotlib
(``matplotlib.get_data_path()/fonts/ttf``), with a random size, slant, vertical offset,
contrast, blur and noise, into a grey image of fixed ``height``; its pixel columns are the frames:
features ``(T, F)`` with ``F = height // downsample``, ink near 1, paper near 0.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .data import SequenceDataset, _BaseDataModule

__all__ = [
    "TEXT_CHARS",
    "DEFAULT_FONTS",
    "font_path",
    "make_sentences",
    "render_line",
    "make_text_lines",
    "save_text_lines_png",
    "TextLinesDataModule",
]

#: the characters of the text task's transcripts
TEXT_CHARS = "abcdefghijklmnopqrstuvwxyz '"

#: DejaVu Sans, Serif and Sans Mono in regular, bold, oblique/italic and bold oblique/italic
DEFAULT_FONTS = (
    "DejaVuSans",
    "DejaVuSans-Bold",
    "DejaVuSans-Oblique",
    "DejaVuSans-BoldOblique",
    "DejaVuSerif",
    "DejaVuSerif-Bold",
    "DejaVuSerif-Italic",
    "DejaVuSerif-BoldItalic",
    "DejaVuSansMono",
    "DejaVuSansMono-Bold",
    "DejaVuSansMono-Oblique",
    "DejaVuSansMono-BoldOblique",
)

# ----------------------------------------------------------------------------------------------
# The grammar. Word lists written for this project (common English words).

_NOUNS = """
cat dog bird fish horse cow sheep goat pig duck mouse rabbit fox wolf bear lion tiger monkey
snake frog teacher doctor farmer baker driver singer writer painter player student child girl
boy woman man king queen friend neighbour sister brother mother father pilot nurse cook
soldier sailor house garden river road city village forest mountain lake field door window
table chair book letter song story picture car train boat ship bridge tower castle school
market shop kitchen room apple bread cake cheese soup coffee tea milk box bag hat coat
shoe ball kite clock lamp key map phone computer flower tree stone island""".split()
_IRREGULAR_PLURALS = {
    "mouse": "mice",
    "sheep": "sheep",
    "fish": "fish",
    "child": "children",
    "woman": "women",
    "man": "men",
    "wolf": "wolves",
    "knife": "knives",
}
_ANIMATE = set(
    """
cat dog bird fish horse cow sheep goat pig duck mouse rabbit fox wolf bear lion tiger monkey
snake frog teacher doctor farmer baker driver singer writer painter player student child girl
boy woman man king queen friend neighbour sister brother mother father pilot nurse cook
soldier sailor""".split()
)
_ADJECTIVES = """
big small old young new happy sad quiet loud quick slow tall short red green blue yellow
black white brown dark bright warm cold hot wet dry clean dirty strong weak rich poor kind
brave clever busy lazy hungry tired angry calm gentle wild tiny huge heavy light long round
soft hard sweet fresh strange famous lonely friendly funny proud shy curious careful noisy
pretty ugly empty full broken golden silver wooden""".split()
# transitive verbs: (base, third person singular, past)
_VERBS_T = [
    (
        v,
        v + "es"
        if v.endswith(("s", "sh", "ch", "x", "o"))
        else v[:-1] + "ies"
        if v.endswith("y") and v[-2] not in "aeiou"
        else v + "s",
        p,
    )
    for v, p in [
        ("see", "saw"),
        ("find", "found"),
        ("like", "liked"),
        ("love", "loved"),
        ("watch", "watched"),
        ("follow", "followed"),
        ("help", "helped"),
        ("call", "called"),
        ("paint", "painted"),
        ("carry", "carried"),
        ("take", "took"),
        ("bring", "brought"),
        ("buy", "bought"),
        ("sell", "sold"),
        ("build", "built"),
        ("open", "opened"),
        ("close", "closed"),
        ("clean", "cleaned"),
        ("visit", "visited"),
        ("miss", "missed"),
        ("push", "pushed"),
        ("pull", "pulled"),
        ("chase", "chased"),
        ("hide", "hid"),
        ("keep", "kept"),
        ("want", "wanted"),
        ("need", "needed"),
        ("know", "knew"),
        ("remember", "remembered"),
        ("forget", "forgot"),
        ("draw", "drew"),
        ("catch", "caught"),
        ("throw", "threw"),
        ("wash", "washed"),
        ("fix", "fixed"),
        ("lose", "lost"),
        ("meet", "met"),
        ("leave", "left"),
        ("hold", "held"),
        ("teach", "taught"),
    ]
]
_VERBS_I = [
    (
        v,
        v + "es"
        if v.endswith(("s", "sh", "ch", "x", "o"))
        else v[:-1] + "ies"
        if v.endswith("y") and v[-2] not in "aeiou"
        else v + "s",
        p,
    )
    for v, p in [
        ("sleep", "slept"),
        ("run", "ran"),
        ("walk", "walked"),
        ("sing", "sang"),
        ("dance", "danced"),
        ("laugh", "laughed"),
        ("cry", "cried"),
        ("smile", "smiled"),
        ("wait", "waited"),
        ("work", "worked"),
        ("play", "played"),
        ("swim", "swam"),
        ("jump", "jumped"),
        ("fall", "fell"),
        ("sit", "sat"),
        ("stand", "stood"),
        ("talk", "talked"),
        ("rest", "rested"),
        ("shout", "shouted"),
        ("arrive", "arrived"),
        ("listen", "listened"),
        ("stay", "stayed"),
        ("travel", "travelled"),
        ("go", "went"),
    ]
]
_ADVERBS = """
slowly quickly quietly loudly happily sadly early late often never always soon today
tonight again together alone carefully gently badly well outside inside""".split()
_PLACES_PREP = "in near under behind beside across over through into past".split()
_WITH_PREP = "with without for".split()
_DET_SING = ["the", "the", "the", "a", "this", "that", "every", "my", "your", "our", "her", "his"]
_DET_PLUR = ["the", "the", "some", "many", "these", "those", "two", "three", "all the", "my", "our", "their", "few"]
_PLACES = """house garden river road city village forest mountain lake field school market
shop kitchen room bridge tower castle island park station""".split()
_SUBJ_PRONOUNS = [
    ("he", False),
    ("she", False),
    ("it", False),
    ("they", True),
    ("we", True),
    ("you", True),
    ("i", True),
]


def _plural(noun: str) -> str:
    if noun in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[noun]
    if noun.endswith(("s", "sh", "ch", "x")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def vocabulary_words() -> list[str]:
    """Every word the grammar can produce (sorted); a few hundred."""
    words = set(_NOUNS) | {_plural(n) for n in _NOUNS} | set(_ADJECTIVES) | set(_ADVERBS)
    words |= {w for forms in _VERBS_T + _VERBS_I for w in forms}
    words |= set(_PLACES_PREP) | set(_WITH_PREP) | set(_PLACES)
    words |= {w for d in _DET_SING + _DET_PLUR for w in d.split()}
    words |= {p for p, _ in _SUBJ_PRONOUNS} | {"and", "but", "did", "not", "doesn't", "don't", "didn't", "a", "an"}
    return sorted(words)


def _noun_phrase(rng: np.random.Generator, plural: bool, nouns=_NOUNS) -> str:
    noun = nouns[rng.integers(len(nouns))]
    words = [_DET_PLUR[rng.integers(len(_DET_PLUR))] if plural else _DET_SING[rng.integers(len(_DET_SING))]]
    if rng.random() < 0.45:
        words.append(_ADJECTIVES[rng.integers(len(_ADJECTIVES))])
    words.append(_plural(noun) if plural else noun)
    if words[0] == "a" and words[1][0] in "aeiou":
        words[0] = "an"
    return " ".join(words)


def _clause(rng: np.random.Generator) -> str:
    """subject (pronoun or noun phrase) + verb phrase, agreeing in number."""
    if rng.random() < 0.25:
        subject, plural = _SUBJ_PRONOUNS[rng.integers(len(_SUBJ_PRONOUNS))]
    else:
        plural = bool(rng.random() < 0.4)
        animate = sorted(_ANIMATE)
        subject = _noun_phrase(rng, plural, animate)
    tense = rng.choice(3, p=[0.5, 0.35, 0.15])  # present, past, negated
    transitive = rng.random() < 0.55
    base, third, past = (_VERBS_T if transitive else _VERBS_I)[rng.integers(len(_VERBS_T if transitive else _VERBS_I))]
    if tense == 0:
        verb = base if plural or subject == "i" else third
    elif tense == 1:
        verb = past
    else:
        neg = (
            ["didn't", "did not"][int(rng.random() < 0.3)]
            if rng.random() < 0.5
            else ("don't" if plural or subject == "i" else "doesn't")
        )
        verb = f"{neg} {base}"
    words = [subject, verb]
    if transitive:
        words.append(_noun_phrase(rng, bool(rng.random() < 0.35)))
    r = rng.random()
    if r < 0.3:
        place = _PLACES[rng.integers(len(_PLACES))]
        words.append(f"{_PLACES_PREP[rng.integers(len(_PLACES_PREP))]} the {place}")
    elif r < 0.55:
        words.append(_ADVERBS[rng.integers(len(_ADVERBS))])
    return " ".join(words)


def make_sentences(num: int, seed: int, max_chars: int = 40, exclude: Sequence[str] = ()) -> list[str]:
    """``num`` distinct sentences of the grammar, each at most ``max_chars`` characters.

    Deterministic in ``seed``; sentences in ``exclude`` are never returned.

    Raises:
        ValueError: ``max_chars`` too small for the grammar to produce ``num`` distinct sentences.
    """
    rng = np.random.default_rng(seed)
    seen = set(exclude)
    out: list[str] = []
    tries = 0
    while len(out) < num:
        tries += 1
        if tries > 50 * num + 1000:
            raise ValueError(
                f"could not draw {num} distinct sentences of at most {max_chars} "
                f"characters (got {len(out)}); raise max_chars"
            )
        s = _clause(rng)
        if rng.random() < 0.2:
            s = f"{s} {['and', 'but'][int(rng.random() < 0.3)]} {_clause(rng)}"
        if len(s) > max_chars or s in seen:
            continue
        seen.add(s)
        out.append(s)
    return out


# ----------------------------------------------------------------------------------------------
# Rendering.


def _font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def font_path(name: str) -> str:
    """The TrueType file of a font face shipped with matplotlib, e.g. ``"DejaVuSerif-Bold"``
    (a path to any ``.ttf`` file is also accepted).

    Raises:
        ValueError: no such face (the message lists the available ones).
    """
    if os.path.isfile(name):
        return name
    path = _font_dir() / f"{name}.ttf"
    if not path.is_file():
        faces = sorted(p.stem for p in _font_dir().glob("*.ttf"))
        raise ValueError(f"unknown font {name!r}; matplotlib ships: {', '.join(faces)}")
    return str(path)


@lru_cache(maxsize=256)
def _font(path: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(path, size)


def render_line(
    text: str,
    font: str = "DejaVuSans",
    size: int = 20,
    height: int = 32,
    slant: float = 0.0,
    blur: float = 0.0,
    noise: float = 0.0,
    contrast: float = 1.0,
    offset: int = 0,
    margin: int = 2,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Renders one line of text as a grey image ``(height, W)`` float32, ink ``contrast``, paper 0.

    Args:
        text: the line.
        font: a face name of :func:`font_path` or a ``.ttf`` path.
        size: font size in pixels; the text's ascent + descent should fit ``height``.
        slant: horizontal shear (x shift per pixel above the baseline; 0.2 leans right).
        blur: Gaussian blur radius in pixels (0: none).
        noise: std of additive Gaussian noise (needs ``rng``).
        offset: vertical shift of the text in pixels (positive: down), clipped to fit.
        margin: blank columns left and right.
    """
    from PIL import Image, ImageDraw, ImageFilter

    f = _font(font_path(font), int(size))
    ascent, descent = f.getmetrics()
    width = int(np.ceil(f.getlength(text))) + 2 * margin + int(np.ceil(abs(slant) * height))
    img = Image.new("L", (width, height), 0)
    top = (height - ascent - descent) // 2
    top = int(np.clip(top + offset, -(ascent // 8), max(0, height - ascent - descent)))
    x0 = margin + (int(np.ceil(slant * height)) if slant > 0 else 0) // 2
    ImageDraw.Draw(img).text((x0, top), text, fill=255, font=f)
    if slant:
        # x_src = x + slant * (y - baseline): rows above the baseline move right for slant > 0
        baseline = top + ascent
        img = img.transform(
            img.size, Image.Transform.AFFINE, (1, slant, -slant * baseline, 0, 1, 0), resample=Image.Resampling.BILINEAR
        )
    if blur > 0:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    x = np.asarray(img, dtype=np.float32) * (contrast / 255.0)
    if noise > 0:
        if rng is None:
            raise ValueError("noise > 0 needs an rng")
        x += noise * rng.standard_normal(x.shape, dtype=np.float32)
    return x


def _pool_rows(img: np.ndarray, factor: int) -> np.ndarray:
    if factor == 1:
        return img
    h = img.shape[0] // factor * factor
    return img[:h].reshape(h // factor, factor, -1).mean(axis=1)


def make_text_lines(
    sentences: Sequence[str],
    seed: int,
    fonts: Sequence[str] = DEFAULT_FONTS,
    sizes: tuple[int, int] = (16, 22),
    height: int = 32,
    downsample: int = 1,
    slant: float = 0.25,
    blur: tuple[float, float] = (0.0, 0.8),
    noise: float = 0.05,
    contrast: tuple[float, float] = (0.7, 1.0),
    jitter: int = 2,
    return_fonts: bool = False,
):
    """Renders each sentence as a feature array ``(T, F)``, ``F = height // downsample``.

    Per line, drawn from ``seed``: a face of ``fonts`` (uniformly), a size in ``sizes`` (inclusive,
    pixels), a slant in ``[-slant, slant]``, a blur radius in ``blur``, an ink intensity in
    ``contrast``, a vertical offset in ``[-jitter, jitter]``, and Gaussian noise of std ``noise``.
    A frame is one pixel column (rows averaged in groups of ``downsample``); ink is near 1.

    Returns:
        features: list of float32 arrays ``(T_i, F)``; texts: the sentences; with
        ``return_fonts``, also the face used for each line.
    """
    if height // downsample < 1:
        raise ValueError(f"height {height} // downsample {downsample} leaves no feature")
    rng = np.random.default_rng(seed)
    feats, used = [], []
    for text in sentences:
        face = fonts[int(rng.integers(len(fonts)))]
        img = render_line(
            text,
            face,
            int(rng.integers(sizes[0], sizes[1] + 1)),
            height,
            slant=float(rng.uniform(-slant, slant)),
            blur=float(rng.uniform(*blur)),
            noise=noise,
            contrast=float(rng.uniform(*contrast)),
            offset=int(rng.integers(-jitter, jitter + 1)),
            rng=rng,
        )
        feats.append(np.ascontiguousarray(_pool_rows(img, downsample).T, dtype=np.float32))
        used.append(face)
    if return_fonts:
        return feats, list(sentences), used
    return feats, list(sentences)


def save_text_lines_png(
    features: Sequence[np.ndarray], texts: Sequence[str], path: str | os.PathLike, max_lines: int = 8
) -> None:
    """Saves a picture of a few feature arrays ``(T, F)`` (as images, F rows) with their texts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = min(max_lines, len(features))
    width = max(f.shape[0] for f in features[:n])
    fig, axes = plt.subplots(n, 1, figsize=(max(4, width / 40), 0.9 * n + 0.3), squeeze=False)
    for ax, f, t in zip(axes[:, 0], features, texts):
        ax.imshow(f.T, cmap="gray_r", aspect="equal", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xlim(0, width)
        ax.set_title(t, fontsize=8, loc="left")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class TextLinesDataModule(_BaseDataModule):
    """Lines of English words rendered with matplotlib's DejaVu fonts (no download).

    Sentences come from the grammar of this module (:func:`make_sentences`); train, val and
    test hold distinct sentences (no sentence is in two splits). Images are rendered at
    ``setup()`` (about 1 ms a line on one core) and kept in memory. Deterministic in ``seed``.

    Args:
        num_train, num_val, num_test: number of lines per split.
        batch_size, eval_batch_size, num_workers: DataLoader settings.
        seed: the seed of the sentences and of the rendering.
        max_chars: longest line in characters.
        fonts: face names of matplotlib's fonts (see :func:`font_path`).
        sizes: ``[min, max]`` font size in pixels.
        height, downsample: image height in pixels; rows averaged in groups of ``downsample``
            (``feature_dim = height // downsample``).
        slant, blur, noise, contrast, jitter: see :func:`make_text_lines`.
        label_drop: drop this fraction of the training transcripts' characters (partial labels,
            the STC setting: ``loss=stc data.label_drop=0.3``); validation and test keep theirs.
    """

    chars = TEXT_CHARS

    def __init__(
        self,
        num_train: int = 8000,
        num_val: int = 500,
        num_test: int = 500,
        batch_size: int = 16,
        eval_batch_size: int | None = 100,
        num_workers: int = 0,
        seed: int = 0,
        max_chars: int = 40,
        fonts: Sequence[str] = DEFAULT_FONTS,
        sizes: Sequence[int] = (16, 22),
        height: int = 32,
        downsample: int = 1,
        slant: float = 0.25,
        blur: Sequence[float] = (0.0, 0.8),
        noise: float = 0.05,
        contrast: Sequence[float] = (0.7, 1.0),
        jitter: int = 2,
        label_drop: float = 0.0,
    ):
        super().__init__(batch_size, num_workers, eval_batch_size, label_drop)
        fonts = [str(f) for f in fonts]
        for f in fonts:
            font_path(f)  # fail early, naming the face
        if len(sizes) != 2 or len(blur) != 2 or len(contrast) != 2:
            raise ValueError("sizes, blur and contrast are [min, max] pairs")
        # plain lists in the saved hyper-parameters (Hydra passes ListConfigs), so a checkpoint
        # loads with torch.load(weights_only=True)
        sizes, blur, contrast = [int(v) for v in sizes], [float(v) for v in blur], [float(v) for v in contrast]
        self.save_hyperparameters()
        self.sizes = (num_train, num_val, num_test)
        self.seed = seed
        self.max_chars = max_chars
        self.feature_dim = height // downsample
        self.render_args: dict[str, Any] = dict(
            fonts=fonts,
            sizes=(int(sizes[0]), int(sizes[1])),
            height=height,
            downsample=downsample,
            slant=slant,
            blur=(float(blur[0]), float(blur[1])),
            noise=noise,
            contrast=(float(contrast[0]), float(contrast[1])),
            jitter=jitter,
        )

    def setup(self, stage: str | None = None) -> None:
        """Generates the sentences and builds the train, validation and test sets (once)."""
        if self.train_set is not None:
            return
        sentences = make_sentences(sum(self.sizes), self.seed, self.max_chars)
        n_train, n_val, _ = self.sizes
        parts = (sentences[:n_train], sentences[n_train : n_train + n_val], sentences[n_train + n_val :])
        sets = []
        #: per split, the face of each line
        self.fonts_used = {}
        for k, (name, part) in enumerate(zip(("train", "val", "test"), parts)):
            feats, texts, used = make_text_lines(
                part, seed=self.seed * 1000 + k + 1, return_fonts=True, **self.render_args
            )
            self.fonts_used[name] = used
            sets.append(SequenceDataset(feats, texts))
        self.train_set, self.val_set, self.test_set = sets
        self._drop_train_labels(self.seed)
