"""``benchmarks/gpu_check.py`` (``make gpu-check``) on a machine without a GPU: its one-line exit,
and its part runner and report with stand-in parts (a pass, a failure, an overrun)."""

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_without_cuda_it_exits_with_one_line():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, lines)
    assert lines[0].startswith("gpu_check: no CUDA device here")


def test_parts_run_in_turn_past_failures_into_one_report(tmp_path, monkeypatch):
    gc = _module()
    py = sys.executable
    parts = [
        gc.Part("table", 60, [py, "-c", "print('| a | b |')"], "a table"),
        gc.Part("broken", 60, [py, "-c", "import sys; print('half'); sys.exit(3)"], "a failing part"),
        gc.Part("slow", 1, [py, "-c", "import time; print('started', flush=True); time.sleep(30)"], "an overrun"),
        gc.Part("train-x", 60, [py, "-c", "print('lightning_gtn.train'); print('{\"val/cer\": 0.5}')"], "a run"),
    ]
    parts[3].cmd.append("lightning_gtn.train")  # read as a training run: its last line is the metrics
    out = tmp_path / "report.md"
    results = gc.run_parts(parts, str(out), "test machine")
    assert [r.verdict for r in results] == ["PASS", "FAIL (exit 3)", "FAIL (over its budget of 1 s)", "PASS"]
    assert results[2].seconds < 20
    text = out.read_text()
    assert text.startswith("# GPU check\n\ntest machine\n")
    assert "| table | a table | 60 |" in text and "| slow | an overrun | 1 |" in text
    assert "## table: PASS\n\n| a | b |" in text
    assert "## broken: FAIL (exit 3)" in text and "half" in text
    assert "## slow: FAIL (over its budget of 1 s)" in text
    assert 'Final metrics: `{"val/cer": 0.5}`' in text
    assert sum(p.budget for p in gc.default_parts(str(tmp_path))) <= 600
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gc.report_path(None) == os.path.join(str(tmp_path), "gpu_check.md")
    monkeypatch.delenv("OUT")
    assert gc.report_path(None).endswith(os.path.join("benchmarks", "GPU_RESULTS.md"))
    assert gc.report_path("x.md") == "x.md"
