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
    for key in ("pagedcy", "openmp", "num_threads", "build_flags", "simd", "huge_pages"):
        assert key in out


@pytest.mark.parametrize("text, mode", [
    ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"),
    ("always madvise never\n", "unavailable"),      # no mode selected: not a THP file
    ("", "unavailable"),
])
def test_huge_pages_reads_the_selected_mode(tmp_path, text, mode):
    from pagedcy.tools.info import huge_pages
    f = tmp_path / "enabled"
    f.write_text(text)
    assert huge_pages(str(f)) == mode
    assert huge_pages(str(tmp_path / "missing")) == "unavailable"


@pytest.mark.parametrize("asks", [True, False])
def test_huge_pages_madvise_follows_numpy(tmp_path, asks):
    import numpy as np
    from pagedcy.tools.info import huge_pages
    ma = (getattr(np, "_core", None) or np.core).multiarray   # numpy >= 1.25 has the switch
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    before = ma._set_madvise_hugepage(asks)           # returns the previous setting
    try:
        expect = "madvise (numpy asks)" if asks else "madvise (numpy does not ask: base pages)"
        assert huge_pages(str(f)) == expect
    finally:
        ma._set_madvise_hugepage(before)


def test_demo_quick_summary_and_no_leak():
    out = run("demo", "--quick", "--no-progress")
    assert "tokens evicted" in out and "pages used" in out
    assert "prefix-cache hit" in out and "swaps" in out
    assert "leak check: ok" in out


def test_bench_quick_table():
    out = run("bench", "--quick", "--no-baselines", "--repeats", "1")
    assert "decode" in out and "prefill" in out and "GB/s" in out and "GFLOP/s" in out
    assert "huge pages:" in out
