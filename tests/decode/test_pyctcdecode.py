"""Agreement with pyctcdecode (no LM): same best text at comparable settings.

pyctcdecode is not a dependency: install it outside the shared venv
(``python -m pip install --target /work/extra-pyctcdecode pyctcdecode``) and run with that folder on
PYTHONPATH; skipped otherwise.

Comparable settings: pyctcdecode ``beam_width`` = ``beam_size``, ``beam_prune_logp`` =
``-beam_threshold``, ``token_min_logp`` the same (or very low in pyctcdecode and None in ours: every
token expanded),
``prune_history=False``, no LM. pyctcdecode log-softmaxes its input and clips it at ln(1e-15);
ours gets the same clipped log-probabilities. Both merge hypotheses by (text, last frame token)
with log-add and treat a space with no open word as a no-op, so with no ties the beams agree frame by
frame: best texts and their scores are equal.
"""

from __future__ import annotations

import numpy as np
import pytest

from lightning_gtn.decode import BeamSearchDecoder

pyctcdecode = pytest.importorskip("pyctcdecode")

LETTERS = ["_", " ", "'"] + [chr(ord("a") + i) for i in range(26)]


def _logprobs(rng, T, C, peak):
    x = rng.normal(size=(T, C))
    if peak:  # a few classes dominate each frame, like a trained model's output
        x[np.arange(T), rng.integers(0, C, size=T)] += peak
        x[:, 0] += peak / 2
    x = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return np.clip(x, np.log(1e-15), 0).astype(np.float32)


@pytest.mark.parametrize(
    "peak,beam,tmin",
    [(0.0, 8, None), (0.0, 25, None), (6.0, 16, None), (12.0, 50, None), (6.0, 16, -5.0), (0.0, 25, -4.0)],
)
def test_best_text_equals_pyctcdecode(peak, beam, tmin):
    rng = np.random.default_rng(int(peak) * 100 + beam)
    ref = pyctcdecode.build_ctcdecoder([""] + LETTERS[1:])
    dec = BeamSearchDecoder(LETTERS, blank=0, beam_size=beam, beam_threshold=10.0, token_min_logp=tmin)
    x = np.stack([_logprobs(rng, 40, len(LETTERS), peak) for _ in range(4)])
    ours = dec.decode(x)
    for b in range(len(x)):
        theirs = ref.decode_beams(
            x[b],
            beam_width=beam,
            beam_prune_logp=-10.0,
            token_min_logp=-1e30 if tmin is None else tmin,
            prune_history=False,
        )
        text, _, _, logit_score, _ = theirs[0]
        assert " ".join(ours[b][0].words) == text
        assert ours[b][0].score == pytest.approx(logit_score, abs=1e-3)
