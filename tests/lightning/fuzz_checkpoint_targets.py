"""Run as a child process by test_checkpoint_trust.py (an attack that gets through could crash
the process): every key path of a real checkpoint's hyper-parameters is replaced by nested
targets of file writers, raw-address takers and arbitrary functions; each load must be refused,
before anything is called, with an error naming that key path. Prints ``fuzzed N`` at the end."""

import os
import tempfile

import torch

from lightning_gtn import trust
from lightning_gtn.evaluate import ConfigError, load_model
from lightning_gtn.lightning import SequenceModule
from tests.lightning.test_checkpoint_trust import SECTION_KEYS, key_paths, real_checkpoint, replaced


def payloads(d):
    m = lambda name: os.path.join(d, name)  # noqa: E731
    return {
        "save_word_pieces": {
            "_target_": "lightning_gtn.wordpieces.save_word_pieces",
            "pieces": ["$(touch$IFS/tmp/X)"],
            "path": m("wp"),
        },
        "lm.cli.main": {"_target_": "lightning_gtn.lm.cli.main", "argv": ["--text", "/etc/passwd", "--out", m("lm")]},
        "write_symbols": {"_target_": "lightning_gtn.wfst.openfst.write_symbols", "symbols": {"a": 1}, "path": m("sy")},
        "set_weights": {
            "_target_": "lightning_gtn.wfst.Graph.set_weights",
            "self": {"_target_": "lightning_gtn.wfst.linear_graph", "M": 1000, "N": 1000},
            "weights": 2**46,
        },
        "os.system": {"_target_": "os.system", "_args_": [f"touch {m('sh')}"]},
        "partial exec": {"_target_": "builtins.exec", "_partial_": True, "_args_": [f"open({m('ex')!r}, 'w')"]},
        "torch.save": {"_target_": "torch.save", "obj": 1, "f": m("ts")},
        "registered, args not data": {
            "_target_": "torch.nn.ReLU",
            "inplace": {"_target_": "posix.system", "_args_": [f"touch {m('px')}"]},
        },
    }


def main():
    with tempfile.TemporaryDirectory() as d:
        good = real_checkpoint(os.path.join(d, "good.ckpt"))
        ckpt = torch.load(good, weights_only=True)
        paths = key_paths(ckpt["hyper_parameters"])
        assert len(paths) > 40, paths
        n = 0
        for path in paths:
            for name, payload in payloads(d).items():
                is_target = path[-1] in ("_target_", "builder")
                value = payload["_target_"] if is_target else payload
                evil = os.path.join(d, "evil.ckpt")
                torch.save(replaced(ckpt, path, value), evil)
                where = SECTION_KEYS.get(path[0], path[0]) + "".join(
                    f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:]
                )
                want = where if is_target else where + "._target_"
                loader = (
                    (lambda evil=evil: load_model(evil))
                    if n % 2
                    else (lambda evil=evil: SequenceModule.load_from_checkpoint(evil, map_location="cpu"))
                )
                try:
                    loader()
                except (ConfigError, trust.UntrustedTargetError) as e:
                    msg = str(e)
                    # a registered ReLU may stand where a module fits: then its argument is refused
                    ok = (f"{want}: ", f"{where}.inplace._target_: ")
                    assert any(k in msg for k in ok) and "not trusted" in msg, (path, name, msg[:400])
                else:
                    raise AssertionError(f"{path} <- {name}: loaded")
                leaked = sorted(set(os.listdir(d)) - {"good.ckpt", "evil.ckpt"})
                assert not leaked, (path, name, leaked)
                n += 1
    print(f"fuzzed {n}")


if __name__ == "__main__":
    main()
