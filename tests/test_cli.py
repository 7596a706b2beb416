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
    for key in ("tokens/s", "prefill/decode", "prefix-cache hit", "preemptions",
                "peak pages used"):
        assert key in out
    assert "leak check: ok" in out and "same tokens" in out
    assert "\r" not in out                      # no progress bar


def checkpoint(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    from pagedcy.models import write_random_checkpoint
    return write_random_checkpoint(str(tmp_path / "ckpt"), seed=1)


def test_generate_prints_the_greedy_completion(tmp_path):
    path = checkpoint(tmp_path)
    out = run("generate", "--model", path, "--prompt", "The quick brown fox",
              "--max-tokens", "12", "--threads", "1")
    from pagedcy.engine import LLM, SamplingParams
    want = LLM(path, num_threads=1).generate("The quick brown fox", SamplingParams(
        temperature=0, max_tokens=12), use_tqdm=False)[0].outputs[0].text
    # the child's stdout is read in text mode: universal newlines turn "\r" into "\n"
    assert out == want.replace("\r\n", "\n").replace("\r", "\n") + "\n"


def test_generate_streams_pieces_as_tokens_arrive(tmp_path):
    import argparse
    from pagedcy.tools.generate import main

    class Recorder:
        def __init__(self):
            self.pieces = []

        def write(self, s):
            self.pieces.append(s)

        def flush(self):
            pass

    args = argparse.Namespace(model=checkpoint(tmp_path), prompt="Once upon a time",
                              max_tokens=10, temperature=0.9, top_p=1.0, top_k=0, seed=3,
                              stop=None, threads=1, verbose=False)
    rec = Recorder()
    assert main(args, out=rec) == 0
    assert len(rec.pieces) > 3 and rec.pieces[-1] == "\n"


def test_generate_bad_input_exits_2(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(pagedcy.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    for extra in (["--model", str(tmp_path / "missing"), "--prompt", "hi"],
                  ["--model", checkpoint(tmp_path), "--prompt", "hi", "--max-tokens", "0"],
                  ["--model", checkpoint(tmp_path), "--prompt", ""]):
        proc = subprocess.run([sys.executable, "-m", "pagedcy", "generate", *extra],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr


def test_bench_quick_table():
    out = run("bench", "--quick", "--no-baselines", "--repeats", "1")
    assert "decode" in out and "prefill" in out and "GB/s" in out and "GFLOP/s" in out
    assert "huge pages:" in out
