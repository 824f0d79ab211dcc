"""Peak resident memory of one call, read from Linux's ``/proc/self`` (the benchmarks' memory columns).

Writing 5 to ``/proc/self/clear_refs`` resets the peak (``VmHWM``) to the current resident set, so
the peak after the call is the call's own, not that of the imports or compilation before it. Run
it in a fresh process after a warm-up call.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple


def status_kb(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (0 when absent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def peak_growth(fn: Callable[[], Any]) -> Tuple[Optional[int], Any]:
    """``(bytes the peak resident set grew over the resident set before fn(), fn()'s result)``;
    ``None`` bytes where the peak cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None, fn()
    before = status_kb("VmRSS")
    out = fn()
    return max(status_kb("VmHWM") - before, 0) * 1024, out
