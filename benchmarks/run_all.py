"""Runs every benchmark script and prints their tables (``make bench``).

Each ``bench_*.py`` here has ``main(argv) -> str`` that prints a markdown table and returns it.
The combined output is also written to ``benchmarks/RESULTS.md`` with the machine it ran on;
the hand-written notes below ``NOTES_MARKER`` in that file are kept. ``--only NAME ... --update``
replaces only those sections, each marked with the date and machine of its own run.
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
    "bench_word_times",
    "bench_biasing",
    "bench_lm",
    "bench_wordpieces",
    "bench_stc",
    "bench_rnnt",
    "bench_rnnt_joiner",
    "bench_rnnt_wordpieces",
    "bench_rnnt_variants",
    "bench_transducer_torch",
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
    p.add_argument(
        "--update",
        action="store_true",
        help="with --only: replace those sections of RESULTS.md, each marked with its own run's date and machine",
    )
    args = p.parse_args(argv)
    names = [n for n in ORDER if (HERE / f"{n}.py").exists() and (args.only is None or n in args.only)]
    header = f"# Benchmarks\n\n{datetime.date.today()} on {machine()}\n"
    print(header)
    parts = [header]
    for name in names:
        print(f"## {name}\n", flush=True)
        table = _load(name).main(["--quick"] if args.quick else [])
        parts.append(f"## {name}\n\n{table}\n")
    out = HERE / "RESULTS.md"
    old = out.read_text() if out.exists() else ""
    if args.only is None:
        if NOTES_MARKER in old:
            parts.append(old[old.index(NOTES_MARKER) :])
        out.write_text("\n".join(parts))
    elif args.update:
        out.write_text(update_sections(old, dict(zip(names, parts[1:])), header))
    return 0


def update_sections(text: str, sections: dict, header: str) -> str:
    """``text`` (a RESULTS.md) with the ``## name`` sections of ``sections`` replaced (or added
    before the notes), each followed by a line naming the run it came from (``header``'s date and
    machine): the other sections keep their own run's header."""
    head, notes = (text.split(NOTES_MARKER, 1) + [""])[:2] if NOTES_MARKER in text else (text, None)
    run = header.strip().splitlines()[-1]
    blocks = head.split("\n## ")
    order = [b.split("\n", 1)[0].strip() for b in blocks[1:]]
    body = {b.split("\n", 1)[0].strip(): "## " + b for b in blocks[1:]}
    for name, part in sections.items():
        body[name] = part.rstrip("\n") + f"\n\n(This section: {run}.)\n"
        if name not in order:
            order.append(name)
    new = blocks[0].rstrip("\n") + "\n\n" + "\n".join(body[n].rstrip("\n") + "\n" for n in order)
    return new + ("\n" + NOTES_MARKER + notes if notes is not None else "")


if __name__ == "__main__":
    sys.exit(main())
