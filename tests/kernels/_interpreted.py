"""Runs a test file as a script under Triton's interpreter (``TRITON_INTERPRET=1`` must be set
before triton is imported, so the interpreted checks of a file run in a child process)."""

import os
import subprocess
import sys


def run_interpreted(path: str, expect: str, args=()) -> None:
    """Runs ``path`` as a script (with command-line ``args``) with ``TRITON_INTERPRET=1`` and the
    repository on the path; asserts it exits 0 and prints ``expect``."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(path), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert expect in proc.stdout, proc.stdout[-2000:]
