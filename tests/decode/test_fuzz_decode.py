"""Fuzzing the decoders with random and malformed inputs: they may raise ValueError, never crash.

The Hypothesis loop runs in a child process (this file run as a script) with numba's bounds
checking on, so an out-of-range index in a kernel raises IndexError (a failure here) instead of
reading memory, and a segmentation fault fails the test instead of killing pytest.
"""

import os

from tests._child import run_as_child

EXAMPLES = int(os.environ.get("LGTN_FUZZ_EXAMPLES", "60"))


def test_decoders_survive_random_input():
    run_as_child(__file__)


def main():
    os.environ["NUMBA_BOUNDSCHECK"] = "1"  # before numba is imported
    import math

    import numpy as np
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from lightning_gtn.decode import BeamSearchDecoder, greedy_decode
    from tests.decode._ref import TinyLM

    decoded = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.data())
    def loop(data):
        C = data.draw(st.integers(1, 6))
        topology = data.draw(st.sampled_from(["ctc", "asg", "transducer"]))

        def rare(valid, invalid):  # mostly valid values, a malformed one one time in eight
            return data.draw(invalid) if data.draw(st.integers(0, 7)) == 0 else data.draw(valid)

        blank = None if topology == "asg" else rare(st.one_of(st.none(), st.integers(0, C - 1)), st.integers(-1, C))
        repeat = rare(st.integers(0, C - 1) if topology == "asg" else st.none(), st.integers(-1, C))
        tokens = [data.draw(st.sampled_from(["a", "b", " ", "_", "ab", " c"])) for _ in range(C)]
        use_lex = data.draw(st.booleans())
        lexicon = None
        if use_lex:
            lexicon = {
                f"w{i}": [
                    rare(
                        st.lists(st.integers(0, C - 1), min_size=1, max_size=3),
                        st.lists(st.integers(-1, C + 1), min_size=0, max_size=3),
                    )
                    for _ in range(data.draw(st.integers(1, 2)))
                ]
                for i in range(rare(st.integers(1, 4), st.just(0)))
            }
        lm = None
        if data.draw(st.booleans()):
            rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
            lm = TinyLM.random(sorted(lexicon) if lexicon else ["a", "b", " "], rng)
            if data.draw(st.integers(0, 3)) == 0:  # corrupt one array entry
                arr = lm.arrays()
                field = data.draw(st.sampled_from(["arc_next", "backoff_state", "arc_word", "state_offsets"]))
                a = getattr(arr, field).copy()
                if len(a):
                    a[data.draw(st.integers(0, len(a) - 1))] = data.draw(st.integers(-5, 50))
                bad = arr._replace(**{field: a})
                lm.arrays = lambda bad=bad: bad
        hot = rare(st.none(), st.dictionaries(st.sampled_from(["a", "ab", "w0", "zz"]), st.floats(-5, 5), max_size=2))
        kwargs = dict(
            topology=topology,
            blank=blank,
            repeat=repeat,
            lexicon=lexicon,
            lm=lm,
            lexicon_free=lm is not None and lexicon is None,
            hotwords=hot,
            beam_size=data.draw(st.integers(1, 8)),
            nbest=data.draw(st.integers(1, 4)),
            beam_threshold=data.draw(st.sampled_from([0.0, 3.0, math.inf])),
            token_beam=data.draw(st.one_of(st.none(), st.integers(1, C + 2))),
            token_min_logp=data.draw(st.one_of(st.none(), st.floats(-10, 0))),
            unk_score=data.draw(st.sampled_from([-math.inf, -1.0])),
        )
        B = data.draw(st.integers(0, 3))
        T = data.draw(st.integers(0, 7))
        C_in = C if data.draw(st.integers(0, 9)) else data.draw(st.integers(1, 7))
        x = np.random.default_rng(data.draw(st.integers(0, 1000))).normal(size=(B, T, C_in)).astype(np.float32)
        if x.size and data.draw(st.integers(0, 3)) == 0:
            x.reshape(-1)[data.draw(st.integers(0, x.size - 1))] = data.draw(
                st.sampled_from([-math.inf, math.inf, math.nan, -1e30, 1e30])
            )
        lengths = rare(
            st.one_of(st.none(), st.lists(st.integers(0, T), min_size=B, max_size=B)),
            st.lists(st.integers(-1, T + 1), min_size=B, max_size=B),
        )
        try:
            dec = BeamSearchDecoder(tokens, **kwargs)
            out = dec.decode(x, lengths)
        except ValueError:
            out = None
        if out is not None:
            decoded.append(sum(len(h) for h in out))
            assert len(out) == B
            for b, hyps in enumerate(out):
                n = T if lengths is None else lengths[b]
                scores = [h.score for h in hyps]
                assert scores == sorted(scores, reverse=True) and len(hyps) <= kwargs["nbest"]
                for h in hyps:
                    assert all(0 <= t < C for t in h.tokens) and all(0 <= f < n for f in h.timesteps)
        try:
            greedy_decode(x, lengths, topology=topology, blank=blank, repeat=repeat)
        except ValueError:
            pass

    loop()
    # the loop must reach the kernels: some examples decode, some of those to hypotheses
    assert len(decoded) >= EXAMPLES // 10 and sum(decoded) > 0, decoded
    print(f"fuzzed: {len(decoded)} decoded, {sum(decoded)} hypotheses")


if __name__ == "__main__":
    main()
