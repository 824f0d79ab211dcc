"""Runs every benchmark script and prints their tables (``make bench``).

Each ``bench_*.py`` here has ``main(argv) -> str`` that prints a markdown table and returns it.
The combined output is also written to ``benchmarks/RESULTS.md`` with the machine it ran on;
the hand-written notes below ``NOTES_MARKER`` in that file are kept.
Benchmarks are scripts, never timed assertions in tests.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# RESULTS.md keeps everything from this line on (hand-written notes and earlier runs) when rewritten
NOTES_MARKER = "<!-- run_all.py keeps everything from this line on"
ORDER = [
    "bench_engine",
    "bench_losses",
    "bench_linear",
    "bench_mixin",
    "bench_transducer",
    "bench_conv_transduce",
    "bench_align",
    "bench_decode",
    "bench_lm",
    "bench_wordpieces",
    "bench_stc",
    "bench_rnnt",
    "bench_rnnt_joiner",
    "bench_rnnt_variants",
    "bench_pruned",
    "bench_lattice",
    "bench_mmi",
    "bench_loader",
]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__}, Python {platform.python_version()}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", nargs="*", default=None, help="benchmark names, e.g. bench_engine")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)
    names = [n for n in ORDER if (HERE / f"{n}.py").exists() and (args.only is None or n in args.only)]
    header = f"# Benchmarks\n\n{datetime.date.today()} on {machine()}\n"
    print(header)
    parts = [header]
    for name in names:
        print(f"## {name}\n", flush=True)
        table = _load(name).main(["--quick"] if args.quick else [])
        parts.append(f"## {name}\n\n{table}\n")
    if args.only is None:
        out = HERE / "RESULTS.md"
        old = out.read_text() if out.exists() else ""
        if NOTES_MARKER in old:
            parts.append(old[old.index(NOTES_MARKER) :])
        out.write_text("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
