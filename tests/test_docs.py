"""The documentation is true: README.md and docs/*.md run, link and name what exists.

* Every fenced ``python`` block runs: each file's blocks in order in one namespace, in a child
  process whose working directory is a fresh temporary folder (so files the examples write land
  there). A block may opt out with ``# doc: no-run`` on its first line, only where it cannot run
  on a CPU within the test's time; :data:`OPT_OUTS` lists each one and why.
* Every relative link points to an existing file (and, with ``#anchor``, to a heading of it).
* Every ``lightning_gtn.<dotted.name>`` in backticks resolves (import the longest module prefix,
  then ``getattr`` the rest), and every repository path in backticks exists.
* The table of docs/reference.md names every public name of ``functional``, ``nn``, ``decode`` and
  the CLIs; the README stays short.
"""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEV_PAGES = sorted((ROOT / "docs" / "dev").glob("*.md"))  # development notes: linked, not run
LINKED = PAGES + DEV_PAGES + sorted((ROOT / "benchmarks").glob("*.md"))
REFERENCE = ROOT / "docs" / "reference.md"  # the table of every public name
NO_RUN = "# doc: no-run"

# (page, text on the block's first line) -> why the block does not run here
OPT_OUTS = {
    (
        "docs/losses.md",
        "torch.compile",
    ): "torch.compile builds C++ kernels: minutes on a CPU; tests run the compiled step",
}
# pages whose blocks run in a second child marked slow, and why
SLOW_PAGES = {
    "docs/lm.md": "the beam decoder's numba kernels compile on first use (about 20 s on 2 cores; cached after)",
}

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"(?<![\w./-])lightning_gtn(?:\.[A-Za-z_]\w*)+(?![\w/])")
REPO_PATH = re.compile(r"^(?:lightning_gtn|tests|benchmarks|examples|conf|docs)/[\w./-]*$")


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _blocks(page: Path):
    """``(language, first line number, source)`` of each fenced block."""
    text = page.read_text()
    for m in FENCE.finditer(text):
        yield m.group(1), text.count("\n", 0, m.start(2)) + 1, m.group(2)


def _prose(page: Path) -> str:
    """The page without its fenced blocks."""
    return FENCE.sub("", page.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", _prose(page), re.M)}


# The child: runs each page's blocks in one namespace, in its own working directory, and prints
# one JSON line per page: {"page", "ok", "error", "seconds"}.
CHILD = r"""
import json, os, sys, time, traceback
jobs = json.load(open(sys.argv[1]))
for job in jobs:
    os.makedirs(job["cwd"], exist_ok=True)
    os.chdir(job["cwd"])
    ns = {"__name__": "__doc_page__"}
    t0 = time.perf_counter()
    err = None
    for line, src in job["blocks"]:
        try:
            exec(compile("\n" * (line - 1) + src, job["page"], "exec"), ns)
        except BaseException:
            err = traceback.format_exc(limit=-6)
            break
    print(json.dumps({"page": job["page"], "ok": err is None, "error": err,
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
"""


def _runnable(page: Path):
    """``(first line, source)`` of the page's python blocks that run; checks each opt-out is listed."""
    blocks = []
    for lang, line, src in _blocks(page):
        if lang != "python":
            continue
        first = src.lstrip().splitlines()[0] if src.strip() else ""
        if first.startswith(NO_RUN):
            assert any(
                k[0] == _rel(page) and k[1] in first for k in OPT_OUTS
            ), f"{_rel(page)}:{line}: an opt-out not listed in OPT_OUTS: {first!r}"
            continue
        blocks.append((line, src))
    return blocks


def test_opt_outs_are_few_and_listed():
    found = set()
    for page in PAGES:
        _runnable(page)  # every opt-out is listed
        for lang, _, src in _blocks(page):
            first = src.lstrip().split("\n", 1)[0]
            if lang == "python" and first.startswith(NO_RUN):
                found |= {k for k in OPT_OUTS if k[0] == _rel(page) and k[1] in first}
    assert found == set(OPT_OUTS), f"OPT_OUTS lists blocks that no longer opt out: {set(OPT_OUTS) - found}"
    assert set(SLOW_PAGES) <= {_rel(p) for p in PAGES}


@pytest.mark.parametrize("group", ["fast", pytest.param("slow", marks=pytest.mark.slow)])
def test_every_python_block_runs(group, tmp_path):
    jobs = []
    for page in PAGES:
        if (_rel(page) in SLOW_PAGES) != (group == "slow"):
            continue
        blocks = _runnable(page)
        if blocks:
            jobs.append({"page": _rel(page), "cwd": str(tmp_path / page.stem), "blocks": blocks})
    if group == "fast":
        assert {j["page"] for j in jobs} >= {"README.md", "docs/losses.md", "docs/engine.md"}
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MPLBACKEND", "Agg")
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(spec)], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path
    )
    results = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"page"')]
    done = {r["page"] for r in results}
    failed = [f"{r['page']}:\n{r['error']}" for r in results if not r["ok"]]
    assert res.returncode == 0 and done == {
        j["page"] for j in jobs
    }, f"the child stopped (exit {res.returncode}) after {sorted(done)}\n{res.stderr[-4000:]}"
    assert not failed, "\n\n".join(failed)


@pytest.mark.parametrize("page", LINKED, ids=_rel)
def test_relative_links_point_to_existing_files_and_headings(page):
    bad = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_names_and_paths_in_backticks_exist(page):
    spans = CODE_SPAN.findall(_prose(page))
    names = {n for s in spans for n in DOTTED.findall(s)}
    bad = sorted(n for n in names if not _resolves(n))
    paths = {s.strip() for s in spans if REPO_PATH.match(s.strip())}
    bad += sorted(p for p in paths if not (ROOT / p).exists())
    assert not bad, f"{_rel(page)} names what does not exist: {bad}"


def test_reference_table_names_every_public_name():
    import lightning_gtn.decode
    import lightning_gtn.functional
    import lightning_gtn.nn

    reference = REFERENCE.read_text()
    table = "\n".join(line for line in reference.splitlines() if line.startswith("| `"))
    listed = set(re.findall(r"`([\w.-]+)`", table))
    want = set(lightning_gtn.functional.__all__)
    want |= {f"nn.{n}" for n in lightning_gtn.nn.__all__}
    want |= {f"decode.{n}" for n in lightning_gtn.decode.__all__}
    scripts = re.findall(r"^(lightning-gtn-[\w-]+) =", (ROOT / "pyproject.toml").read_text(), re.M)
    want |= set(scripts)
    assert len(scripts) >= 4
    assert not want - listed, f"docs/reference.md's table lacks {sorted(want - listed)}"


# words by which a page speaks of its own making (work items, sessions, targets) rather than of
# the library; measurement logs and history belong in docs/dev/
HISTORY = re.compile(
    r"\b(?:sessions?|ninth|tenth|eleventh|the issue|issue's|targets? (?:was|were|met|not met)|"
    r"until the first|before this)\b",
    re.I,
)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_reference_pages_do_not_speak_of_their_history(page):
    bad = [
        f"{_rel(page)}:{n}: {line.strip()}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not bad, "move these to docs/dev/ or say what the library does:\n" + "\n".join(bad)


def test_history_pattern_finds_what_it_should():
    assert HISTORY.search("the ninth session's run") and HISTORY.search("the issue's target (10%)")
    assert HISTORY.search("(the target was under 10%)")
    assert not HISTORY.search("the composition with the target is determinised")
    assert HISTORY.search("Checkpoints written before this held a path")
    assert not HISTORY.search("rows with no path are dropped; targets are padded")


def test_readme_is_short_and_links_the_reference():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "(docs/reference.md)" in readme and "(docs/dev/benchmarks.md)" in readme
