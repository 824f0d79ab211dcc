"""``benchmarks/bench_biasing.py --ctc/--rnnt`` on checkpoints of a two-step text_small run."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports bench_decode
    try:
        spec = importlib.util.spec_from_file_location("bench_biasing", ROOT / "benchmarks" / "bench_biasing.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mod


def _train(tmp_path, loss):
    run = tmp_path / loss
    args = ["data=text_small", f"loss={loss}", "trainer.max_steps=2", "trainer.max_epochs=1"]
    args += ["trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0", f"hydra.run.dir={run}"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_gtn.train", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("loss,flag,name", [("ctc", "--ctc", "CTC, beam"), ("rnnt", "--rnnt", "RNN-T, rnnt_beam")])
def test_checkpoint_mode_decodes_the_first_lines(tmp_path, loss, flag, name):
    ckpt = _train(tmp_path, loss)
    argv = [flag, str(ckpt), "--lines", "3", "--transducer-lines", "3", "--reps", "1"]
    argv += ["--phrases", "5", "--rare", "2", "--scores", "0.5", "--beam", "4"]
    text = _bench().main(argv)
    rows = [line for line in text.splitlines() if line.startswith(f"| {name} (checkpoint) |")]
    assert len(rows) == 3  # the timing row, no context, one score
    assert rows[0].split("|")[2].strip() == "3"  # --lines cuts inside the first batch of 10
    assert "5 phrases" in text
