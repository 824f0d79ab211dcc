"""``benchmarks/run_all.py --only ... --update`` rewrites only the sections it ran."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_update_replaces_only_the_sections_run():
    ra = _run_all()
    text = (
        "# Benchmarks\n\n2026-01-01 on old machine\n\n## bench_a\n\nA table\n\n## bench_b\n\nB table\n\n"
        + ra.NOTES_MARKER
        + " -->\n## Notes\n\nkept\n"
    )
    new = ra.update_sections(
        text, {"bench_b": "## bench_b\n\nnew B\n", "bench_c": "## bench_c\n\nC\n"}, "# B\n\n2026-12-02 on M\n"
    )
    assert "A table" in new and "B table" not in new and "new B" in new
    assert new.index("## bench_a") < new.index("## bench_b") < new.index("## bench_c") < new.index(ra.NOTES_MARKER)
    assert "2026-01-01 on old machine" in new  # the other sections keep their run's header
    assert new.count("(This section: 2026-12-02 on M.)") == 2
    assert new.endswith(ra.NOTES_MARKER + " -->\n## Notes\n\nkept\n")
