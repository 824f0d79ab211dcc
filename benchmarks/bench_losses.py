"""Loss benchmarks: lightning_gtn against torch on the same inputs, forward + backward.

Tables (markdown):

1. CTC on the CPU against ``torch.nn.functional.ctc_loss``: runs interleaved in one process
   (ours, torch, ours, torch, ...), median wall time of forward + backward, and peak memory;
   then a tiny call ``(2, 20, 10, 5)`` (the per-call cost) and the shapes of the table, each
   against torch and against the criterion-graph path (``impl="numba"``), with the load
   average (``--ctc-only``: only this table).
2. ASG and the alignment-free sequence criterion against a plain torch-autograd version of the
   same dynamic programme (written below).
3. Long CTC inputs against torch's ctc_loss (time, and the float32 gradient error of each
   against float64), and ASG with C=5000 (time, peak memory): one run each (``--long-only``).
4. On a GPU, when present (``--gpu-only``: these alone): CTC by its CUDA default (the Triton
   CTC kernel, ``impl="triton_ctc"``) and by the graph path's Triton scorer (``impl="triton"``)
   against torch's CUDA ctc_loss at :data:`GPU_CTC_SHAPES` (medians of CUDA-event times, peak
   memory from ``torch.cuda.max_memory_allocated``); ASG and the sequence criterion against
   the torch DP.

Thread contention: on a machine with no spare core, torch's OpenMP workers keep spinning for
a while after each parallel torch op and take a core from lightning_gtn's pool, which can
double the small shapes' times; ``OMP_WAIT_POLICY=PASSIVE`` in the environment (read when
torch is imported) lets them sleep. The header line says which policy a run used.

Where the real ``gtn`` package is importable (it is not on PyPI in an installable form; put a
build of it on ``PYTHONPATH``), every CPU table gains a column for the GTN pattern: the same
loss with ``impl="gtn"`` (host copy, one graph per example, ``gtn.parallel_for``,
``gtn.backward``), timed interleaved with the others.

Memory method: each (loss, shape) runs once more in a fresh subprocess with glibc's malloc
told to mmap every buffer of 4 KiB or more and to trim freed heap at once
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``), so that the
buffers of torch, numpy and numba get fresh pages and give them back when freed; after a
warm-up the peak resident size is reset (``/proc/self/clear_refs``) and the reported figure is
``VmHWM - VmRSS`` across one forward + backward: the extra resident memory at the peak, inputs
excluded. Page-granular, and blind to small allocations served from memory the process already
holds, so tiny figures are lower bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as TF
from _procmem import peak_growth  # noqa: E402
from _timing import QUIESCE, times_in_turn  # noqa: E402

from lightning_gtn.functional import asg_loss, ctc_loss, sequence_loss

SHAPES = [(32, 250, 30, 50), (32, 1000, 30, 200), (8, 250, 1000, 50)]
#: the CTC shapes of the GPU table: the CPU ones and a long input
GPU_CTC_SHAPES = SHAPES + [(8, 5000, 30, 500)]
TINY_CTC_SHAPE = (2, 20, 10, 5)  # B, T, C, L: what a call costs besides the dynamic programme
TINY_CALLS = 100  # calls per timed run of the tiny shape
LONG_CTC_SHAPES = [(8, 5000, 30, 500), (2, 20000, 30, 2000)]  # one run each ("no cliffs")
LARGE_ASG_SHAPE = (2, 50, 5000, 10)  # B, T, C, L: a 25-million-arc full graph


# ---------------------------------------------------------------------------
# plain torch-autograd references of the same dynamic programmes
# ---------------------------------------------------------------------------


def _chain_score(x, enter, stay, targets, input_lengths, target_lengths):
    """log-sum over alignments where token l covers >= 1 frames (autograd through torch ops).

    ``enter[b, l]`` / ``stay[b, l]``: transition scores into / staying on token l.
    """
    B, T, C = x.shape
    L = targets.shape[1]
    em = x.gather(2, targets.unsqueeze(1).expand(B, T, L)).unbind(1)  # T x (B, L); one backward
    ninf = torch.tensor(float("-inf"), dtype=x.dtype)
    alpha = torch.where(torch.arange(L, device=x.device) == 0, em[0] + enter[:, 0:1].expand(B, L), ninf)
    pad = torch.full((B, 1), float("-inf"), dtype=x.dtype, device=x.device)
    for t in range(1, T):
        prev = torch.cat([pad, alpha[:, :-1]], 1)
        new = torch.logaddexp(alpha + stay, prev + enter) + em[t]
        alpha = torch.where((t < input_lengths).unsqueeze(1), new, alpha)
    last = alpha.gather(1, (target_lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return last


def torch_sequence_loss(x, targets, input_lengths, target_lengths):
    B, T, C = x.shape
    mask = (torch.arange(T, device=x.device).unsqueeze(0) < input_lengths.unsqueeze(1)).to(x.dtype)
    full = (torch.logsumexp(x, -1) * mask).sum(1)
    z = torch.zeros(B, targets.shape[1], dtype=x.dtype, device=x.device)
    return (full - _chain_score(x, z, z, targets, input_lengths, target_lengths)).mean()


def torch_asg_loss(x, tr, targets, input_lengths, target_lengths):
    B, T, C = x.shape
    xs = x.unbind(1)
    alpha = tr[0].unsqueeze(0) + xs[0]
    trans = tr[1:].unsqueeze(0)  # (1, C, C): [i, j] = i after j
    for t in range(1, T):
        new = torch.logsumexp(alpha.unsqueeze(1) + trans, -1) + xs[t]
        alpha = torch.where((t < input_lengths).unsqueeze(1), new, alpha)
    full = torch.logsumexp(alpha, -1)
    prev = torch.cat([targets[:, :1], targets[:, :-1]], 1)
    enter = tr[targets + 1, prev]
    enter = torch.cat([tr[0, targets[:, 0]].unsqueeze(1), enter[:, 1:]], 1)
    stay = tr[targets + 1, targets]
    return (full - _chain_score(x, enter, stay, targets, input_lengths, target_lengths)).mean()


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


def _inputs(B, T, C, L, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).log_softmax(-1).to(device)
    tg = torch.randint(1, C, (B, L), generator=g).to(device)
    il = torch.full((B,), T, dtype=torch.long, device=device)
    tl = torch.full((B,), L, dtype=torch.long, device=device)
    return x, tg, il, tl


def _make(kind, impl, B, T, C, L, device="cpu"):
    x, tg, il, tl = _inputs(B, T, C, L, device=device)
    x = x.requires_grad_(True)
    tr = torch.zeros(C + 1, C, device=device, requires_grad=True)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    if impl in ("gtn", "ours_torch"):  # the GTN pattern, or the per-frame torch implementation
        opt = {"impl": "gtn" if impl == "gtn" else "torch"}
        fn = {"ctc": ctc_loss, "seq": sequence_loss}.get(kind)
        if fn is None:
            f = lambda: asg_loss(x, tg, il, tl, transitions=tr, **opt)
        else:
            f = lambda: fn(x, tg, il, tl, **opt)
    elif kind == "ctc":
        if impl == "ours":
            f = lambda: ctc_loss(x, tg, il, tl)
        elif impl == "ours_graph":  # the criterion-graph path (one compiled CTC graph per target)
            f = lambda: ctc_loss(x, tg, il, tl, impl="numba" if device == "cpu" else "triton")
        else:
            xt = x.detach().transpose(0, 1).requires_grad_(True)
            f = lambda: TF.ctc_loss(xt, tg, il, tl)
    elif kind == "asg":
        if impl == "ours":
            f = lambda: asg_loss(x, tg, il, tl, transitions=tr)
        elif impl == "graph":  # the arc-by-arc graph path for every alphabet size (before the dense normaliser)
            from lightning_gtn.kernels import dense_torch

            def f():
                keep = dense_torch.DENSE_MIN_CLASSES
                dense_torch.DENSE_MIN_CLASSES = 10**9
                try:
                    return asg_loss(x, tg, il, tl, transitions=tr)
                finally:
                    dense_torch.DENSE_MIN_CLASSES = keep
        else:
            f = lambda: torch_asg_loss(x, tr, tg, il, tl)
    else:
        f = (lambda: sequence_loss(x, tg, il, tl)) if impl == "ours" else (lambda: torch_sequence_loss(x, tg, il, tl))

    def step():
        x.grad = None
        tr.grad = None
        f().backward()
        sync()

    return step


def _time_interleaved(steps, reps, warm=True):
    """Median seconds of each step, run in turn (a, b, a, b, ...) after a warm-up (``warm``)."""
    for step in steps if warm else ():
        step()  # warm-up (compilation, caches)
    times = [[] for _ in steps]
    for _ in range(reps):
        for k, step in enumerate(steps):
            t0 = time.perf_counter()
            step()
            times[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _gtn_available() -> bool:
    try:
        import gtn  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def _memory_worker(kind, impl, shape) -> None:
    import gc

    step = _make(kind, impl, *shape)
    step()
    gc.collect()
    extra, _ = peak_growth(step)
    print(json.dumps({"extra_mb": (extra or 0) / 2**20}))


def _memory(kind, impl, shape):
    # small mmap threshold and no trim/top padding: buffers freed by the warm-up go back to
    # the system, so what the measured step needs shows up as new resident pages
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="4096", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    cmd = [sys.executable, __file__, "--memory-worker", kind, impl, ",".join(map(str, shape))]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])["extra_mb"]
    except Exception:  # pragma: no cover - reported as unknown
        return float("nan")


def _table(title, rows, ref_name, with_gtn):
    gcols = " GTN pattern (ms) | time ratio to GTN |" if with_gtn else ""
    head = (
        f"### {title}\n\n| B, T, C, L | lightning_gtn (ms) | {ref_name} (ms) | time ratio |{gcols} "
        f"lightning_gtn peak extra (MB) | {ref_name} peak extra (MB) | memory ratio |\n"
        "|---|---|---|---|" + ("---|---|" if with_gtn else "") + "---|---|---|\n"
    )
    body = ""
    for shape, times, ma, mb in rows:
        a, b = times[0], times[1]
        mem = f"{ma:.1f} | {mb:.1f} | {ma / mb:.2f}" if mb == mb and mb > 0 else f"{ma:.1f} | {mb:.1f} | n/a"
        g = f" {times[2] * 1e3:.1f} | {a / times[2]:.2f} |" if with_gtn else ""
        body += f"| {', '.join(map(str, shape))} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f} |{g} {mem} |\n"
    return head + body


def _ctc_kernel_table(reps: int) -> str:
    """The tiny call and :data:`SHAPES`: the CPU default (the CTC kernel), torch's ctc_loss and
    the criterion-graph path, in turn, each run after a pause (:mod:`_timing`: torch's OpenMP
    workers stop spinning); the tiny call as runs of :data:`TINY_CALLS` calls, each call timed
    alone (the median over all calls)."""
    load0 = os.getloadavg()
    rows = []
    for shape in [TINY_CTC_SHAPE] + SHAPES:
        steps = [_make("ctc", impl, *shape) for impl in ("ours", "ref", "ours_graph")]
        for st in steps:
            st()  # warm-up (compilation, caches)
        if shape == TINY_CTC_SHAPE:  # each call timed alone: a median robust to preemption
            per_call = [[] for _ in steps]
            for _ in range(3 * reps):
                for k, st in enumerate(steps):
                    time.sleep(QUIESCE)
                    for _ in range(TINY_CALLS):
                        t0 = time.perf_counter()
                        st()
                        per_call[k].append(time.perf_counter() - t0)
            times = [statistics.median(c) for c in per_call]
        else:
            times = [statistics.median(w for w, _ in r) for r in times_in_turn(steps, reps)]
        rows.append((shape, times))
        print(f"  ctc kernel {shape}: " + " / ".join(f"{t * 1e6:.0f} us" for t in times), flush=True)
    load1 = os.getloadavg()
    out = (
        "### CTC, CPU: the CTC kernel against torch and the graph path\n\n"
        '| B, T, C, L | lightning_gtn | torch ctc_loss | time ratio | graph path (impl="numba") '
        "| ratio to graph path |\n|---|---:|---:|---:|---:|---:|\n"
    )
    for shape, (a, b, c) in rows:
        unit, k = ("us", 1e6) if shape == TINY_CTC_SHAPE else ("ms", 1e3)
        out += (
            f"| {', '.join(map(str, shape))} | {a * k:.1f} {unit} | {b * k:.1f} {unit} | {a / b:.2f} | "
            f"{c * k:.1f} {unit} | {a / c:.2f} |\n"
        )
    out += (
        f"\nForward + backward, medians of runs in turn, each after a pause (the tiny call: runs of "
        f"{TINY_CALLS} calls, the median call); "
        f"load average {load0[0]:.2f} before, {load1[0]:.2f} after.\n"
    )
    return out


def _gpu_peak_mb(step) -> float:
    """Extra GPU memory at the peak of one forward + backward (inputs excluded), in MB."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _cuda_median(step, reps: int) -> float:
    """Median seconds of ``step`` between two CUDA events, after one warm-up call."""
    step()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def gpu_ctc_table(reps: int = 7) -> str:
    """CTC forward + backward on CUDA: the default (the Triton CTC kernel), the graph path's
    Triton scorer and torch's ctc_loss at :data:`GPU_CTC_SHAPES`, float32, reduction mean."""
    if not torch.cuda.is_available():
        return "### CTC, GPU\n\nNo GPU on this machine: not measured.\n"
    from lightning_gtn.losses import ctc as ctc_mod

    dev = torch.device("cuda", torch.cuda.current_device())  # as the tensors' device reads
    default = ctc_mod.criterion.CRITERIA["ctc"].own_kernel(dev, None) or "the graph path"
    out = (
        f"### CTC, GPU ({torch.cuda.get_device_name(0)}; impl=None runs {default})\n\n"
        '| B, T, C, L | impl=None (ms) | graph path, impl="triton" (ms) | torch ctc_loss (ms) | time ratio '
        "| impl=None peak (MB) | graph path peak (MB) | torch peak (MB) | memory ratio |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for shape in GPU_CTC_SHAPES:
        steps = [_make("ctc", impl, *shape, device="cuda") for impl in ("ours", "ours_graph", "ref")]
        times, peaks = [], []
        for st in steps:
            try:
                times.append(_cuda_median(st, reps))
                peaks.append(_gpu_peak_mb(st))
            except torch.OutOfMemoryError:
                times.append(float("nan"))
                peaks.append(float("nan"))
            torch.cuda.empty_cache()
        print(f"  gpu ctc {shape}: " + " / ".join(f"{t * 1e3:.2f} ms" for t in times), flush=True)
        out += (
            f"| {', '.join(map(str, shape))} | {times[0] * 1e3:.2f} | {times[1] * 1e3:.2f} | {times[2] * 1e3:.2f} "
            f"| {times[0] / times[2]:.2f} | {peaks[0]:.1f} | {peaks[1]:.1f} | {peaks[2]:.1f} "
            f"| {peaks[0] / peaks[2]:.2f} |\n"
        )
    return out + f"\nMedians of {reps} calls between CUDA events, after a warm-up; peaks exclude the inputs.\n"


def _gpu_tables(reps: int, asg_large: bool) -> str:
    """CTC (:func:`gpu_ctc_table`); ASG and the sequence criterion against the torch DP.

    The ASG and sequence rows also time lightning_gtn's per-frame torch implementation
    (``impl="torch"``, the path taken without Triton or for graphs with epsilon arcs).
    """
    if not torch.cuda.is_available():
        return "### GPU\n\nNo GPU on this machine: not measured.\n"
    from lightning_gtn.kernels import graph_triton

    ctc = gpu_ctc_table(reps)
    name = torch.cuda.get_device_name(0)
    head = (
        f"### GPU ({name}; Triton kernels {'available' if graph_triton.available() else 'NOT available'})\n\n"
        "| loss | B, T, C, L | lightning_gtn (ms) | per-frame torch impl (ms) | reference (ms) | "
        "time ratio | lightning_gtn peak (MB) | reference peak (MB) | memory ratio |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    body = ""
    for kind, ref in (("seq", "torch DP"), ("asg", "torch DP")):
        for shape in SHAPES:
            if kind == "asg" and shape[2] > 100 and not asg_large:
                continue
            steps = [_make(kind, impl, *shape, device="cuda") for impl in ("ours", "ours_torch", "ref")]
            times = _time_interleaved(steps, max(3, reps // 2))
            ma, mb = _gpu_peak_mb(steps[0]), _gpu_peak_mb(steps[2])
            print(f"  gpu {kind} {shape}: " + " / ".join(f"{t * 1e3:.2f} ms" for t in times), flush=True)
            body += (
                f"| {kind} ({ref}) | {', '.join(map(str, shape))} | {times[0] * 1e3:.2f} | "
                f"{times[1] * 1e3:.2f} | {times[2] * 1e3:.2f} | {times[0] / times[2]:.2f} | "
                f"{ma:.1f} | {mb:.1f} | {ma / mb:.2f} |\n"
            )
    return ctc + "\n" + head + body


def _ctc_grad_errors(shape):
    """Max abs error of the float32 gradient w.r.t. the logits (through log_softmax) of ours and
    of torch's ctc_loss, each against torch's ctc_loss computed in float64 from the same logits."""
    B, T, C, L = shape
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, C, generator=g)
    tg = torch.randint(1, C, (B, L), generator=g)
    il = torch.full((B,), T, dtype=torch.long)
    tl = torch.full((B,), L, dtype=torch.long)

    def grad(fn, dtype):
        x = logits.to(dtype).clone().requires_grad_(True)  # own leaf: no gradient accumulates across calls
        fn(x.log_softmax(-1)).backward()
        return x.grad.double()

    theirs = lambda lp: TF.ctc_loss(lp.transpose(0, 1), tg, il, tl, reduction="sum")
    ours = lambda lp: ctc_loss(lp, tg, il, tl, reduction="sum")
    ref = grad(theirs, torch.float64)
    return (grad(ours, torch.float32) - ref).abs().max().item(), (grad(theirs, torch.float32) - ref).abs().max().item()


def _graph_loss_row() -> str:
    """graph_loss called again with the same user graphs (cached) against a cold compile."""
    from lightning_gtn.functional import clear_cache, graph_loss
    from lightning_gtn.wfst.criterion import ctc_graph

    B, T, C, L = 32, 250, 30, 50
    x, tg, il, tl = _inputs(B, T, C, L)
    x.requires_grad_(True)
    graphs = [ctc_graph(t, 0) for t in tg.tolist()]

    def warm():
        x.grad = None
        graph_loss(x, tg, il, tl, graphs=graphs).backward()

    def cold():
        clear_cache()
        warm()

    a, b = _time_interleaved([warm, cold], 5)
    return (
        f"| graph_loss, same graphs again (cold compile) | {B}, {T}, {C}, {L} | {a * 1e3:.1f} | "
        f"{b * 1e3:.1f} | {a / b:.2f} | | | | |\n"
    )


def _long_row(kind: str, ref: str, label: str, shape, memory: bool) -> str:
    """One row of the long-input table: one run each of ours and the reference."""
    a, b = _time_interleaved([_make(kind, impl, *shape) for impl in ("ours", ref)], 1, warm=False)
    ea, eb = _ctc_grad_errors(shape) if kind == "ctc" else ("", "")
    ma = mb = float("nan")
    if memory:
        ma, mb = _memory(kind, "ours", shape), _memory(kind, ref, shape)
    print(f"  long {kind} {shape}: {a:.2f} s vs {b:.2f} s; peak extra {ma:.0f} vs {mb:.0f} MB", flush=True)
    err = f"{ea:.2g} | {eb:.2g}" if kind == "ctc" else " | "
    return (
        f"| {label} | {', '.join(map(str, shape))} | {a * 1e3:.0f} | {b * 1e3:.0f} | {a / b:.2f} | {err} | "
        f"{ma:.0f} | {mb:.0f} |\n"
    )


def _long_table(memory: bool) -> str:
    """Long CTC inputs against torch's ctc_loss, and ASG with a large alphabet: one run each."""
    _make("ctc", "ours", 2, 600, 30, 60)()  # compiles both kernel paths (one scale, segments)
    _make("asg", "ours", 2, 5, 200, 2)()
    head = (
        "### Long inputs and large alphabets, CPU (one run each after a small warm-up)\n\n"
        "| loss | B, T, C, L | lightning_gtn (ms) | reference (ms) | time ratio | "
        "lightning_gtn grad error | reference grad error | lightning_gtn peak extra (MB) | "
        "reference peak extra (MB) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = [("ctc", "ref", "CTC (torch ctc_loss)", shape) for shape in LONG_CTC_SHAPES]
    rows.append(("asg", "graph", "ASG (arc-by-arc graph path)", LARGE_ASG_SHAPE))
    body = "".join(_long_row(kind, ref, label, shape, memory) for kind, ref, label, shape in rows)
    body += _graph_loss_row()
    note = (
        "\nGrad error: max abs difference of the float32 gradient w.r.t. the logits (through "
        "log_softmax) from torch's ctc_loss computed in float64 on the same logits. Peak extra: "
        "the VmHWM - VmRSS method above (a fresh subprocess, one warm-up step, then one measured "
        "step; the inputs, including ASG's 100 MB transition matrix, are excluded). The ASG row's "
        "reference is this library's own arc-by-arc graph path, what ASG used before its dense "
        "normaliser (25 million arcs per frame at C=5000). The graph_loss row: the same 32 user "
        "graphs (CTC graphs of 50 tokens built with the engine) passed again, against the same call "
        "with the compiled-graph cache emptied before it (what every call cost before the cache).\n"
    )
    return head + body + note


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument(
        "--asg-large", action="store_true", help="also run ASG on C=1000 (a dense 1000x1000 transition graph: minutes)"
    )
    p.add_argument("--memory-worker", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--gpu-only", action="store_true", help="only the GPU table")
    p.add_argument("--long-only", action="store_true", help="only the long-input / large-alphabet table")
    p.add_argument("--ctc-only", action="store_true", help="only the CTC kernel table (tiny call and shapes)")
    args = p.parse_args(argv)
    if args.memory_worker:
        kind, impl, shape = args.memory_worker
        _memory_worker(kind, impl, tuple(int(s) for s in shape.split(",")))
        return ""
    reps = 3 if args.quick else 7
    if args.gpu_only:
        text = _gpu_tables(reps, args.asg_large)
        print(text)
        return text
    if args.long_only:
        text = _long_table(not args.no_memory)
        print(text)
        return text
    if args.ctc_only:
        text = _ctc_kernel_table(reps)
        print(text)
        return text
    with_gtn = _gtn_available()
    out = [
        f"CPU threads: torch {torch.get_num_threads()}, lightning_gtn pool "
        f"{__import__('lightning_gtn.wfst', fromlist=['x']).get_num_threads()}; forward + backward, "
        f"median of {reps} interleaved runs; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
        + ("; the real gtn package is importable, so the GTN pattern is timed too" if with_gtn else "")
        + ".\n"
    ]
    for kind, ref, title in [
        ("ctc", "torch ctc_loss", "CTC, CPU"),
        ("seq", "torch autograd DP", "Sequence criterion, CPU"),
        ("asg", "torch autograd DP", "ASG, CPU"),
    ]:
        rows = []
        for shape in SHAPES:
            if kind == "asg" and shape[2] > 100 and not args.asg_large:
                continue
            r = reps if kind == "ctc" else max(1, reps // 2)
            impls = ["ours", "ref"] + (["gtn"] if with_gtn else [])
            times = _time_interleaved([_make(kind, impl, *shape) for impl in impls], r)
            ma = mb = float("nan")
            if not args.no_memory:
                ma, mb = _memory(kind, "ours", shape), _memory(kind, "ref", shape)
            rows.append((shape, times, ma, mb))
            print(
                f"  {kind} {shape}: " + " vs ".join(f"{t * 1e3:.1f} ms ({i})" for i, t in zip(impls, times)), flush=True
            )
        table = _table(title, rows, ref, with_gtn)
        if kind == "asg" and not args.asg_large:
            table += (
                "\n(8, 250, 1000, 50) left out: ASG's transition graph on C=1000 has a million "
                "arcs per frame; run with --asg-large.)\n"
            )
        out.append(table)
        if kind == "ctc":
            out.append(_ctc_kernel_table(reps))
    out.append(_long_table(not args.no_memory))
    out.append(_gpu_tables(reps, args.asg_large))
    text = "\n".join(out)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
