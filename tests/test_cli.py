"""``python -m pagedcy info|demo|bench`` run and print what they promise."""
import os
import subprocess
import sys

import pytest

import pagedcy


def run(*args, timeout=240):
    # The child imports the same pagedcy as this process (installed, or an in-place build).
    root = os.path.dirname(os.path.dirname(os.path.abspath(pagedcy.__file__)))
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pagedcy", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_info_prints_config():
    out = run("info")
    for key in ("pagedcy", "openmp", "num_threads", "build_flags", "simd"):
        assert key in out


def test_demo_quick_summary_and_no_leak():
    out = run("demo", "--quick", "--no-progress")
    assert "tokens evicted" in out and "pages used" in out
    assert "prefix-cache hit" in out and "swaps" in out
    assert "leak check: ok" in out


def test_bench_quick_table():
    out = run("bench", "--quick", "--no-baselines", "--repeats", "1")
    assert "decode" in out and "prefill" in out and "GB/s" in out and "GFLOP/s" in out
