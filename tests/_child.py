"""Running a test file as a child process, so that a crash fails the test instead of pytest."""

import os
import subprocess
import sys


def run_as_child(path: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Runs ``python path`` with the checkout on ``PYTHONPATH``; asserts it exited 0 and printed
    ``fuzzed`` (the loop really ran). Returns the finished process."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, os.path.abspath(path)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-8000:]}"
    assert "fuzzed" in res.stdout  # the loop really ran
    return res
