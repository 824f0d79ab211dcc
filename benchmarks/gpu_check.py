"""The check of a machine with a CUDA GPU (``make gpu-check``): tests, tables and short runs, in
at most 10 minutes, without network access.

Parts, in order, each in its own process with its own time budget (:data:`PARTS`; the budgets
sum to 600 s), each recorded as it ends, a failing or overrunning part recorded and the next
one started:

1. ``tests``: every CUDA and Triton test (``pytest -k "cuda or triton"`` over the test folders
   with GPU code, leaving out the checks that run Triton's interpreter on the CPU).
2. ``ctc``: CTC forward + backward on CUDA against torch's ctc_loss
   (``bench_losses.gpu_ctc_table``: CUDA events, medians, peak memory).
3. ``rnnt``: rnnt_loss against a log_softmax forward + backward over the same logits
   (``bench_rnnt.gpu_table``).
4. ``joiner``: ``rnnt_joiner_loss`` forward + backward at ``(B, T, U, V, J) = (8, 300, 60, 1024,
   512)`` with ``impl="triton"`` and ``impl="torch"`` against the materialised path (the joiner
   output built by torch, given to ``rnnt_loss``): CUDA-event medians, the peak of
   ``torch.cuda.max_memory_allocated`` beyond the inputs, and the largest differences of the
   losses and gradients (a failure beyond ``1e-4`` / ``1e-3``).
5. ``lattice``: the Triton transducer lattices walked by time rows against the anti-diagonal
   wavefront, regular RNN-T, k2's px/py and TDT at the rnnt shapes, and their largest
   difference (``bench_rnnt.gpu_lattice_table``).
6. ``mmi``: the shared MMI denominator against the generic Triton scorer (``bench_mmi_gpu``).
7. ``compile``: a small model + ctc_loss step under ``torch.compile(fullgraph=True)`` on CUDA,
   against the eager step.
8. ``train-ctc``, ``train-rnnt``, ``train-mmi``: ``lightning-gtn-train experiment=smoke
   trainer=gpu loss=...``, the final metrics line.

Everything goes to ONE markdown file, rewritten after each part: ``$OUT/gpu_check.md`` when the
environment sets ``OUT``, else ``benchmarks/GPU_RESULTS.md`` (``--out`` overrides both). Without
a CUDA device the script prints one line and exits with status 1; with one, it exits with 0 when
every part passed, else 1.

Usage: ``python benchmarks/gpu_check.py [--only NAME ...] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: the test folders that hold GPU code paths (what ``-k "cuda or triton"`` selects from)
TEST_DIRS = ["tests/losses", "tests/kernels", "tests/core", "tests/align", "tests/decode"]


@dataclass
class Part:
    """One part of the check: ``cmd`` run from the repository root within ``budget`` seconds."""

    name: str
    budget: float
    cmd: List[str]
    what: str = ""


@dataclass
class Result:
    part: Part
    seconds: float
    ok: bool
    verdict: str
    body: str


def _script_part(name: str) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "--part", name]


def _train(loss: str, run_dir: str) -> List[str]:
    return [
        sys.executable, "-m", "lightning_gtn.train", "experiment=smoke", "trainer=gpu", f"loss={loss}",
        "trainer.enable_progress_bar=false", f"hydra.run.dir={os.path.join(run_dir, loss)}",
    ]  # fmt: skip


def default_parts(run_dir: str) -> List[Part]:
    """The parts of the check, their budgets summing to 600 s; training runs write under
    ``run_dir``."""
    workers = ["-n", "4"] if importlib.util.find_spec("xdist") is not None else []  # the machine's own packages
    tests = [
        sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *workers,
        "-k", "(cuda or triton) and not interpreter", *TEST_DIRS,
    ]  # fmt: skip
    return [
        Part("tests", 180, tests, "every CUDA and Triton test"),
        Part("ctc", 80, _script_part("ctc"), "CTC fwd+bwd vs torch's CUDA ctc_loss"),
        Part("rnnt", 40, _script_part("rnnt"), "rnnt_loss vs log_softmax fwd+bwd"),
        Part("joiner", 35, _script_part("joiner"), "rnnt_joiner_loss (triton, torch) vs the materialised joiner"),
        Part("lattice", 30, _script_part("lattice"), "Triton lattices: time rows vs anti-diagonals"),
        Part("mmi", 50, _script_part("mmi"), "MMI denominator vs the generic Triton scorer"),
        Part("compile", 50, _script_part("compile"), "torch.compile(fullgraph=True) of model + ctc_loss"),
        Part("train-ctc", 45, _train("ctc", run_dir), "experiment=smoke trainer=gpu loss=ctc"),
        Part("train-rnnt", 45, _train("rnnt", run_dir), "experiment=smoke trainer=gpu loss=rnnt"),
        Part("train-mmi", 45, _train("mmi", run_dir), "experiment=smoke trainer=gpu loss=mmi"),
    ]


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_part(part: Part) -> Result:
    """Runs one part; its verdict is PASS, ``FAIL (exit N)`` or ``FAIL (over its budget)``."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(part.cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=part.budget)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        body = "```\n" + _tail(out + "\n" + err, 30) + "\n```"
        return Result(part, time.perf_counter() - t0, False, f"FAIL (over its budget of {part.budget:.0f} s)", body)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        body = "```\n" + _tail(proc.stdout, 30) + "\n" + _tail(proc.stderr, 30) + "\n```"
        return Result(part, seconds, False, f"FAIL (exit {proc.returncode})", body)
    if part.cmd[:3] == [sys.executable, "-m", "pytest"]:
        body = "```\n" + _tail(proc.stdout, 15) + "\n```"
    elif "lightning_gtn.train" in part.cmd:
        body = "Final metrics: `" + _tail(proc.stdout, 1) + "`"
    else:
        body = proc.stdout.strip()
    return Result(part, seconds, True, "PASS", body)


def render(results: Sequence[Result], pending: Sequence[Part], header: str) -> str:
    """The report: a summary table (part, budget, time used, verdict) and each part's output."""
    lines = [
        "# GPU check",
        "",
        header,
        "",
        "| part | what | budget (s) | used (s) | result |",
        "|---|---|---:|---:|---|",
    ]
    for r in results:
        lines.append(f"| {r.part.name} | {r.part.what} | {r.part.budget:.0f} | {r.seconds:.1f} | {r.verdict} |")
    for p in pending:
        lines.append(f"| {p.name} | {p.what} | {p.budget:.0f} | | not run yet |")
    for r in results:
        lines += ["", f"## {r.part.name}: {r.verdict}", "", r.body]
    return "\n".join(lines) + "\n"


def run_parts(parts: Sequence[Part], out: str, header: str = "") -> List[Result]:
    """Runs ``parts`` in turn, rewriting the report at ``out`` before each and after the last."""
    results: List[Result] = []
    total = sum(p.budget for p in parts)
    print(f"[gpu-check] {len(parts)} parts, {total:.0f} s of budget in all; report: {out}", flush=True)
    for i, part in enumerate(parts):
        with open(out, "w") as f:
            f.write(render(results, parts[i:], header))
        print(f"[gpu-check] {part.name}: budget {part.budget:.0f} s ({part.what})", flush=True)
        r = run_part(part)
        results.append(r)
        print(f"[gpu-check] {part.name}: {r.verdict} in {r.seconds:.1f} s", flush=True)
    with open(out, "w") as f:
        f.write(render(results, [], header))
    return results


# ---------------------------------------------------------------------------------------------
# the parts that run in this script (``--part NAME``): each prints markdown, fails by exception


def _part_ctc() -> None:
    import bench_losses

    print(bench_losses.gpu_ctc_table(5))


def _part_rnnt() -> None:
    import bench_rnnt

    bench_rnnt.gpu_table(5)


def _part_joiner(repeats: int = 3, device: str = "cuda", size: Optional[Sequence[int]] = None) -> None:
    import bench_losses
    import bench_rnnt_joiner
    import torch

    from lightning_gtn.functional import rnnt_joiner_loss, rnnt_loss

    dev = torch.device(device)
    B, T, U, V, J = size or bench_rnnt_joiner.SIZE
    tensors, tg, il, tl = bench_rnnt_joiner._inputs(B, T, U, V, J)
    x = tuple(t.detach().to(dev).requires_grad_() for t in tensors)
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)

    def step(path):
        for t in x:
            t.grad = None
        if path == "materialised":
            loss = rnnt_loss(torch.tanh(x[0][:, :, None] + x[1][:, None]) @ x[2].T + x[3], tg, il, tl, blank=0)
        else:
            loss = rnnt_joiner_loss(*x, tg, il, tl, blank=0, impl=path)
        loss.backward()
        return loss.detach(), [t.grad for t in x]

    rows, out = {}, {}
    for path in ("triton", "torch", "materialised"):
        ms = 1e3 * bench_losses._cuda_median(lambda p=path: step(p), repeats)  # CUDA events, after a warm-up
        for t in x:
            t.grad = None
        torch.cuda.empty_cache()
        rows[path] = (ms, bench_losses._gpu_peak_mb(lambda p=path: out.__setitem__(p, step(p))))
    m_ms, m_mb = rows["materialised"]
    print(f"float32, reduction mean, B, T, U, V, J = {B}, {T}, {U}, {V}, {J}; {torch.cuda.get_device_name(0)}")
    print("")
    print("| path | fwd+bwd (ms) | peak extra MiB | time / materialised | memory / materialised |")
    print("|---|---:|---:|---:|---:|")
    for path, (ms, mb) in rows.items():
        print(f"| {path} | {ms:.2f} | {mb:.1f} | {ms / m_ms:.2f} | {mb / m_mb:.3f} |")
    ref_loss, ref_grads = out["materialised"]
    bad = []
    for path in ("triton", "torch"):
        loss, grads = out[path]
        dl = float((loss - ref_loss).abs() / ref_loss.abs().clamp_min(1e-30))
        dg = max(float((a - c).abs().max() / c.abs().max().clamp_min(1e-30)) for a, c in zip(grads, ref_grads))
        print(
            f"\n{path}: loss relative difference {dl:.1e}, largest gradient difference {dg:.1e} (of the largest entry)"
        )
        if not (dl <= 1e-4 and dg <= 1e-3):
            bad.append(path)
    if bad:
        raise SystemExit(f"the joiner loss differs from the materialised path: {bad}")


def _part_lattice() -> None:
    import bench_rnnt

    bench_rnnt.gpu_lattice_table(5)


def _part_mmi() -> None:
    import bench_mmi_gpu

    bench_mmi_gpu.main(["--repeats", "3"])


def _part_compile() -> None:
    import torch

    from lightning_gtn.functional import ctc_loss
    from lightning_gtn.losses import ctc as ctc_mod

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(4, 50, 16, generator=g).to(dev)
    tg = torch.randint(1, 12, (4, 10), generator=g).to(dev)
    il = torch.tensor([50, 45, 40, 30], device=dev)
    tl = torch.tensor([10, 8, 6, 4], device=dev)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 12)).to(dev)

    def step(feats, tg, il, tl):
        return ctc_loss(model(feats).log_softmax(-1), tg, il, tl)

    def run(fn):
        model.zero_grad(set_to_none=True)
        loss = fn(feats, tg, il, tl)
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]

    eager, g_eager = run(step)  # also runs the kernels' self-check, once, before tracing
    t0 = time.perf_counter()
    compiled, g_comp = run(torch.compile(step, fullgraph=True))
    seconds = time.perf_counter() - t0
    again, _ = run(torch.compile(step, fullgraph=True))
    err = max(float((a - b).abs().max()) for a, b in zip(g_eager, g_comp))
    impl = ctc_mod.criterion.CRITERIA["ctc"].own_kernel(feats.device, None) or "the graph path"
    print("| impl=None runs | eager loss | compiled loss | max gradient difference | first compiled step (s) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| {impl} | {float(eager):.6f} | {float(compiled):.6f} | {err:.2e} | {seconds:.1f} |")
    if not (abs(float(eager) - float(compiled)) <= 1e-5 * max(1.0, abs(float(eager))) and err <= 1e-4):
        raise SystemExit("compiled step differs from the eager one")
    if float(again) != float(compiled):
        raise SystemExit("a second compiled step gave another loss")


_PARTS = {
    "ctc": _part_ctc,
    "rnnt": _part_rnnt,
    "joiner": _part_joiner,
    "lattice": _part_lattice,
    "mmi": _part_mmi,
    "compile": _part_compile,
}


def report_path(arg: Optional[str]) -> str:
    """``--out``, else ``$OUT/gpu_check.md``, else ``benchmarks/GPU_RESULTS.md``."""
    if arg:
        return arg
    if os.environ.get("OUT"):
        return os.path.join(os.environ["OUT"], "gpu_check.md")
    return os.path.join(HERE, "GPU_RESULTS.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the report file (default: $OUT/gpu_check.md, else benchmarks/GPU_RESULTS.md)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these parts")
    ap.add_argument("--part", choices=sorted(_PARTS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}); nothing checked")
        return 1
    if args.part:  # run as a script, so the bench scripts beside it import by name
        _PARTS[args.part]()
        return 0
    out = report_path(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as runs:
        parts = default_parts(runs)
        if args.only:
            unknown = sorted(set(args.only) - {p.name for p in parts})
            if unknown:
                ap.error(f"unknown parts {unknown}; the parts are {[p.name for p in parts]}")
            parts = [p for p in parts if p.name in args.only]
        name = torch.cuda.get_device_name(0)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        header = f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}; {when}"
        results = run_parts(parts, out, header)
    failed = [r.part.name for r in results if not r.ok]
    summary = f"[gpu-check] {len(results) - len(failed)}/{len(results)} parts passed"
    print(summary + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
