"""The regular RNN-T loss on the CPU: ``rnnt_loss`` forward + backward against torch's own
``log_softmax`` forward + backward over the same logits (the memory-bound floor: every element is
read and a gradient written) and against warprnnt-numba's CPU loss.

Shapes: ``(B, T, U, V) = (8, 150, 40, 128)`` and ``(4, 500, 100, 500)``, logits ``(B, T, U + 1, V)``
float32, full lengths, blank 0, ``reduction="mean"``.

Columns: the best of ``--repeats`` (default 5) wall times (after one warm-up call; ``rnnt_loss``
and ``log_softmax`` timed in turn, each after a 50 ms pause, :func:`_best_interleaved`) of ``rnnt_loss`` (impl
numba: the kernel with the log-softmax fused, gradient computed in the forward, scaled by the
backward), of ``log_softmax`` + its backward (``torch.autograd.grad`` with a ready ones tensor), the
ratio; the same as process CPU time (all threads; steadier than wall time on a shared machine);
warprnnt-numba's time (one call: its loops run in Python; ``not installed`` when it cannot
be imported; at the large shape only with ``--full``, since it takes minutes there) and its ratio to
ours; the peak memory of one ``rnnt_loss`` forward + backward beyond the inputs and beyond the
``(B, T, U + 1, V)`` gradient itself, measured in a fresh process as the growth of its peak
resident set (``VmHWM``, reset before the run) over the run, minus the gradient's bytes; and the same for
``log_softmax`` (whose output is a second full buffer).

On a machine with a CUDA device a second table (``--gpu-only``: that table alone, ``make
gpu-check``) times the same shapes on the GPU: ``impl="triton"`` (the default there once the
kernels pass their self-check), ``impl="torch"`` (the reference) and ``log_softmax`` forward +
backward, median wall time after ``torch.cuda.synchronize()``, and the peak CUDA memory of one
triton forward + backward beyond the logits and the gradient. Without CUDA it prints "no CUDA".

``--gpu-lattice`` (``make gpu-check``'s ``lattice`` part) times the Triton lattices walked by time
rows (``lattice="rows"``, one scan per row) against the anti-diagonal wavefront
(``lattice="diagonals"``) at the same shapes: ``rnnt_triton`` with and without the gradient, k2's
px/py recursion (regular and modified) and TDT (durations 0..4), median wall time, and the largest
difference between the two walks (it exits with an error past 1e-4 relative in the costs or 1e-3
in the gradients).

warprnnt-numba is never a dependency: install it into a side folder
(``python -m pip install --target /tmp/side warprnnt-numba --no-deps``; it needs numba, which the
environment has) and this script adds ``/tmp/side`` (or ``--side``) to ``sys.path`` when present.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

import torch
from _procmem import peak_growth  # noqa: E402
from _timing import times_in_turn  # noqa: E402

SHAPES = [(8, 150, 40, 128), (4, 500, 100, 500)]
SIDE = "/tmp/side"


def _inputs(B, T, U, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g)
    tg = torch.randint(1, V, (B, U), generator=g, dtype=torch.int32)
    il = torch.full((B,), T, dtype=torch.int32)
    tl = torch.full((B,), U, dtype=torch.int32)
    return x, tg, il, tl


def _ours(x, tg, il, tl):
    from lightning_gtn.functional import rnnt_loss

    z = x.detach().requires_grad_()
    rnnt_loss(z, tg, il, tl, blank=0, impl="numba").backward()
    return z.grad


def _log_softmax(x, ones):
    z = x.detach().requires_grad_()
    y = torch.log_softmax(z, dim=-1)
    return torch.autograd.grad(y, z, ones)[0]


def _warp(side: str):
    if os.path.isdir(side) and side not in sys.path:
        sys.path.append(side)
    try:
        from warprnnt_numba.rnnt_loss.rnnt_pytorch import rnnt_loss as warp
    except Exception:  # noqa: BLE001 - any import failure means "not installed" here
        return None
    return warp


def _best_interleaved(calls, repeats):
    """Per ``(fn, args)`` of ``calls``, ``(best wall time, best process CPU time (all threads))``
    of ``repeats`` calls after one warm-up call (numba's cache, torch's allocator), the
    functions timed in turn, each after a pause (:func:`_timing.times_in_turn`)."""
    fns = [functools.partial(fn, *args) for fn, args in calls]
    for fn in fns:
        fn()
    return [(min(t[0] for t in ts), min(t[1] for t in ts)) for ts in times_in_turn(fns, repeats)]


def _memory_child(kind, B, T, U, V):
    """Runs in a fresh process: prints the peak-RSS growth (bytes) of one forward + backward.

    Linux: writing 5 to ``/proc/self/clear_refs`` resets the peak (``VmHWM``) to the current
    resident set, so the peak is the run's own, not that of the imports or compilation before."""
    small = _inputs(1, 3, 2, 5)
    if kind == "ours":
        _ours(*small)
    else:
        _log_softmax(small[0], torch.ones_like(small[0]))
    x, tg, il, tl = _inputs(B, T, U, V)
    ones = torch.ones_like(x) if kind == "lsm" else None
    growth, g = peak_growth(lambda: _ours(x, tg, il, tl) if kind == "ours" else _log_softmax(x, ones))
    print(json.dumps({"growth": growth or 0, "grad": g.numel() * g.element_size()}))


def _memory(kind, shape):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + sys.path)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--memory-child", kind, *map(str, shape)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if out.returncode != 0:
        return None
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return (rec["growth"] - rec["grad"]) / 2**20


def _cuda_median(fn, repeats):
    """Median wall time (s) of ``fn`` on the GPU, synchronised, after one warm-up call."""
    import statistics

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gpu_step(x, tg, il, tl, impl):
    def run():
        from lightning_gtn.functional import rnnt_loss

        z = x.detach().requires_grad_()
        rnnt_loss(z, tg, il, tl, blank=0, impl=impl).backward()

    return run


def gpu_table(repeats: int = 5) -> str:
    """The CUDA table (see the module docstring), or a line saying there is no CUDA device."""
    title = "### rnnt_loss (CUDA: impl='triton' against impl='torch' and log_softmax)"
    if not torch.cuda.is_available():
        print(f"{title}\n\nno CUDA: skipped")
        return f"{title}\n\nno CUDA: skipped"
    dev = torch.device("cuda")
    rows = [
        "| B, T, U, V | triton fwd+bwd (ms) | torch fwd+bwd (ms) | log_softmax fwd+bwd (ms) | triton / log_softmax "
        "| torch / triton | extra peak MB, triton | gradient MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for B, T, U, V in SHAPES:
        x, tg, il, tl = (t.to(dev) for t in _inputs(B, T, U, V))
        ones = torch.ones_like(x)

        tt = _cuda_median(_gpu_step(x, tg, il, tl, "triton"), repeats)
        try:
            tr = _cuda_median(_gpu_step(x, tg, il, tl, "torch"), max(1, repeats // 2))
        except torch.OutOfMemoryError:
            tr = float("nan")
        ls = _cuda_median(functools.partial(_log_softmax, x, ones), repeats)
        del ones
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _gpu_step(x, tg, il, tl, "triton")()
        torch.cuda.synchronize()
        grad_b = x.numel() * x.element_size()
        extra = (torch.cuda.max_memory_allocated() - base - grad_b) / 2**20
        rows.append(
            f"| {B}, {T}, {U}, {V} | {tt * 1e3:.2f} | {tr * 1e3:.2f} | {ls * 1e3:.2f} | {tt / ls:.2f} "
            f"| {tr / tt:.1f}x | {extra:.1f} | {grad_b / 2**20:.0f} |"
        )
    table = "\n".join([title, "", f"float32, reduction mean; {torch.cuda.get_device_name(0)}", ""] + rows)
    print(table)
    return table


def _lattice_cases(B, T, U, V, dev):
    """``(name, fn(lattice) -> (costs, grads or None))`` of each lattice timed by
    :func:`gpu_lattice_table`, on inputs of shape ``(B, T, U, V)`` on ``dev``."""
    from lightning_gtn.kernels.rnnt_triton import mutual_information_triton, rnnt_triton, tdt_triton

    x, tg, il, tl = (t.to(dev) for t in _inputs(B, T, U, V))
    g = torch.Generator().manual_seed(1)
    px = torch.randn(B, U, T + 1, generator=g).to(dev)
    pxm = px[:, :, :T].contiguous()
    py = torch.randn(B, U + 1, T, generator=g).to(dev)
    xd = torch.randn(B, T, U + 1, V + 5, generator=g).to(dev)

    def mi(p):
        def run(lattice):
            scores, grads = mutual_information_triton(p, py, lattice=lattice)
            return scores, grads[0]  # px's gradient

        return run

    return [
        ("rnnt_triton, cost and gradient", lambda lattice: rnnt_triton(x, tg, il, tl, 0, lattice=lattice)),
        ("rnnt_triton, cost only", lambda lattice: rnnt_triton(x, tg, il, tl, 0, need_grad=False, lattice=lattice)),
        ("k2 px/py, regular", mi(px)),
        ("k2 px/py, modified", mi(pxm)),
        ("tdt_triton, durations 0..4", lambda lattice: tdt_triton(xd, tg, il, tl, 0, [0, 1, 2, 3, 4], lattice=lattice)),
    ]


def gpu_lattice_table(repeats: int = 5, device=None, shapes=None, timer=None) -> str:
    """The CUDA table of the lattice walks (see the module docstring), or a line saying there is
    no CUDA device; raises SystemExit after printing it when the two walks disagree. ``device``,
    ``shapes`` and ``timer(fn, repeats) -> seconds`` replace the GPU, :data:`SHAPES` and
    :func:`_cuda_median` (a test runs the table on the CPU under Triton's interpreter)."""
    title = "### Triton lattices: time rows against anti-diagonals (CUDA)"
    if device is None and not torch.cuda.is_available():
        print(f"{title}\n\nno CUDA: skipped")
        return f"{title}\n\nno CUDA: skipped"
    dev = torch.device(device or "cuda")
    timer = timer or _cuda_median
    rows = [
        "| B, T, U, V | kernel | rows (ms) | diagonals (ms) | diagonals / rows | max cost diff (rel) "
        "| max gradient diff |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    bad = []
    for B, T, U, V in shapes or SHAPES:
        for name, fn in _lattice_cases(B, T, U, V, dev):
            (c_r, g_r), (c_d, g_d) = fn("rows"), fn("diagonals")
            live = torch.isfinite(c_d)
            dc = float(((c_r - c_d).abs() / c_d.abs().clamp_min(1.0))[live].max()) if bool(live.any()) else 0.0
            dg = float((g_r - g_d).abs().max()) if g_r is not None else float("nan")
            del g_r, g_d
            t_r = timer(functools.partial(fn, "rows"), repeats)
            t_d = timer(functools.partial(fn, "diagonals"), repeats)
            rows.append(
                f"| {B}, {T}, {U}, {V} | {name} | {t_r * 1e3:.2f} | {t_d * 1e3:.2f} | {t_d / t_r:.2f} "
                f"| {dc:.1e} | {dg:.1e} |"
            )
            if not (dc <= 1e-4 and (dg != dg or dg <= 1e-3)) or bool((torch.isfinite(c_r) != live).any()):
                bad.append(f"{name} at {(B, T, U, V)}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    where = torch.cuda.get_device_name(0) if dev.type == "cuda" else str(dev)
    table = "\n".join([title, "", f"float32, full lengths; {where}", ""] + rows)
    print(table)
    if bad:
        raise SystemExit(f"the row and anti-diagonal lattices disagree: {bad}")
    return table


def main(argv=None) -> str:
    """Prints the table and returns it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--full", action="store_true", help="also run warprnnt-numba at the large shape (minutes)")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory columns (fresh processes)")
    ap.add_argument("--side", default=SIDE, help="folder warprnnt-numba was installed into with pip --target")
    ap.add_argument("--shapes", default="all", choices=["all", "small"])
    ap.add_argument("--gpu-only", action="store_true", help="only the CUDA table (impl='triton')")
    ap.add_argument("--gpu-lattice", action="store_true", help="only the CUDA table of the lattice walks")
    args = ap.parse_args(argv)
    if args.gpu_only:
        return gpu_table(max(args.repeats, 5))
    if args.gpu_lattice:
        return gpu_lattice_table(max(args.repeats, 5))
    warp = _warp(args.side)
    rows = [
        "| B, T, U, V | rnnt_loss fwd+bwd (s) | log_softmax fwd+bwd (s) | ratio | CPU s, rnnt_loss "
        "| CPU s, log_softmax | CPU ratio | warprnnt-numba (s) | warprnnt / ours "
        "| extra peak MB, rnnt_loss | extra peak MB, log_softmax | gradient MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    shapes = SHAPES if args.shapes == "all" else SHAPES[:1]
    for k, (B, T, U, V) in enumerate(shapes):
        x, tg, il, tl = _inputs(B, T, U, V)
        ones = torch.ones_like(x)
        (ours, ours_cpu), (lsm, lsm_cpu) = _best_interleaved(
            [(_ours, (x, tg, il, tl)), (_log_softmax, (x, ones))], args.repeats
        )
        del ones
        if warp is None:
            w_col, r_col = "not installed", "-"
        elif k > 0 and not args.full:
            w_col, r_col = "not run (--full)", "-"
        else:
            z = x.detach().requires_grad_()
            t0 = time.perf_counter()
            warp(z, tg, il, tl, blank=0, reduction="mean").backward()
            wt = time.perf_counter() - t0
            w_col, r_col = f"{wt:.2f}", f"{wt / ours:.0f}x"
        if args.no_memory:
            m_ours = m_lsm = None
        else:
            m_ours = _memory("ours", (B, T, U, V))
            m_lsm = _memory("lsm", (B, T, U, V))
        grad_mb = x.numel() * x.element_size() / 2**20

        def fmt(m):
            return "-" if m is None else f"{m:.1f}"

        rows.append(
            f"| {B}, {T}, {U}, {V} | {ours:.3f} | {lsm:.3f} | {ours / lsm:.2f} | {ours_cpu:.3f} | {lsm_cpu:.3f} "
            f"| {ours_cpu / lsm_cpu:.2f} | {w_col} | {r_col} "
            f"| {fmt(m_ours)} | {fmt(m_lsm)} | {grad_mb:.0f} |"
        )
    threads = f"torch threads {torch.get_num_threads()}"
    try:
        from lightning_gtn.wfst.parallel import get_num_threads

        threads += f", lightning_gtn pool {get_num_threads()}"
    except ImportError:  # pragma: no cover
        pass
    table = "\n".join(["### rnnt_loss (CPU)", "", f"float32, reduction mean; {threads}", ""] + rows)
    print(table)
    return table + "\n\n" + gpu_table(max(args.repeats, 5))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-child":
        _memory_child(sys.argv[2], *map(int, sys.argv[3:7]))
    else:
        main()
