"""``python -m pagedcy info|demo|bench`` run and print what they promise."""
import io
import os
import subprocess
import sys

import pytest

import pagedcy


def run_proc(*args, timeout=240, env=None):
    # The child imports the same pagedcy as this process (installed, or an in-place build).
    root = os.path.dirname(os.path.dirname(os.path.abspath(pagedcy.__file__)))
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pagedcy", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def run(*args, **kwargs):
    return run_proc(*args, **kwargs).stdout


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


CPUINFO_X86 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R)  Platinum 8480+
cache size\t: 107520 KB

processor\t: 1
model name\t: Intel(R) Xeon(R)  Platinum 8480+
"""
CPUINFO_ARM = """processor\t: 0
BogoMIPS\t: 50.00
CPU implementer\t: 0x41

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""


def fake_caches(root, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return str(root)


def test_cpu_model_and_caches_from_fake_files(tmp_path):
    from pagedcy.tools.info import cpu_caches, cpu_description, cpu_model
    (tmp_path / "x86").write_text(CPUINFO_X86)
    (tmp_path / "arm").write_text(CPUINFO_ARM)
    (tmp_path / "empty").write_text("processor\t: 0\n")
    assert cpu_model(str(tmp_path / "x86")) == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu_model(str(tmp_path / "arm")) == "Raspberry Pi 4 Model B Rev 1.4"
    import platform
    fallback = platform.processor() or "unknown"
    assert cpu_model(str(tmp_path / "empty")) == fallback
    assert cpu_model(str(tmp_path / "missing")) == fallback
    caches = fake_caches(tmp_path / "cache", [(1, "Data", "48K"), (1, "Instruction", "32K"),
                                              (2, "Unified", "2048K"), (3, "Unified", "107520K")])
    assert cpu_caches(caches) == {"L1d": 48 << 10, "L1i": 32 << 10, "L2": 2 << 20, "L3": 105 << 20}
    assert cpu_description(str(tmp_path / "x86"), caches) == \
        "Intel(R) Xeon(R) Platinum 8480+ (L1d 48 KiB, L1i 32 KiB, L2 2 MiB, L3 105 MiB)"
    # Unreadable or malformed entries are skipped; no cache data leaves the model alone.
    odd = fake_caches(tmp_path / "odd", [(1, "Data", "32K"), (2, "Unified", "lots"),
                                         (3, "Unified", "1M")])
    assert cpu_caches(odd) == {"L1d": 32 << 10, "L3": 1 << 20}
    assert cpu_caches(str(tmp_path / "nothing")) == {}
    assert cpu_description(str(tmp_path / "arm"), str(tmp_path / "nothing")) == \
        "Raspberry Pi 4 Model B Rev 1.4"


def test_info_names_the_cpu():
    from pagedcy.tools.info import cpu_description
    assert f"cpu: {cpu_description()}" in run("info")


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_drawn_on_a_terminal_only():
    from pagedcy.tools._progress import Progress
    for stream, drawn in [(FakeTerminal(), True), (io.StringIO(), False)]:
        with Progress(3, "building", file=stream) as bar:
            assert bar.drawn == drawn
            bar.status("case A")
            bar.update()
            bar.set(3)
        text = stream.getvalue()
        assert ("building" in text and "case A" in text and "0/3" in text) == drawn
        assert (text == "") == (not drawn)
    with Progress(3, "off", file=FakeTerminal(), enabled=False) as bar:
        assert not bar.drawn


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


def test_user_errors_are_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    # A bad option or a bad checkpoint is the user's mistake: exit 2 with one line. These
    # printed tracebacks (a config the engine refused at its first step, a port out of
    # range, a demo of 0 requests, a bench of a missing model).
    # With OPENBLAS_CORETYPE set, `bench --engine` called in-process once replaced the
    # caller's interpreter (os.execve) with the command: pytest itself ended here, exit 2.
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    import json
    from pagedcy.tools.cli import main
    bad = checkpoint(tmp_path)
    cfg = json.loads(open(os.path.join(bad, "config.json")).read())
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(dict(cfg, rms_norm_eps=-1.0), f)
    for argv in (["generate", "--model", bad, "--prompt", "hi"],
                 ["bench", "--engine", "--quick", "--model-dir", str(tmp_path / "missing"),
                  "--no-transformers", "--no-llama-cpp", "--only", "A"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for argv in (["serve", "--model", bad, "--port", "70000"], ["demo", "--requests", "0"],
                 ["generate", "--model", bad, "--prompt", "hi", "--threads", "0"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and "error:" in capsys.readouterr().err


# One thread drops the 1-thread duplicates of the multi-threaded rows; without AVX-512
# (PAGEDCY_SIMD=avx2 caps it) the AVX2-kernel rows are missing too. The prefill-scaling
# summary used to index the case list by position and crashed with IndexError there.
@pytest.mark.parametrize("threads, simd", [("2", None), ("1", None), ("1", "avx2")])
def test_bench_quick_table(threads, simd):
    proc = run_proc("bench", "--quick", "--no-baselines", "--repeats", "1", "--threads", threads,
                    env={"PAGEDCY_SIMD": simd} if simd else None)
    out = proc.stdout
    assert "decode" in out and "prefill" in out and "GB/s" in out and "GFLOP/s" in out
    assert "huge pages:" in out
    from pagedcy.tools.info import cpu_model
    assert f"CPU: {cpu_model()}" in out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    rows = lines[start:lines.index("", start)]
    assert rows and all(line.startswith(("decode", "prefill")) for line in rows)
    assert {int(line[34:38]) for line in rows} == ({1, 2} if threads == "2" else {1})
    assert ("prefill scaling 1 -> 2 threads" in out) == (threads == "2")
    # decode rows also give their share of the page-walk read rate, in the footer
    walk = next(line for line in lines if line.startswith("page-walk read rate"))
    assert ("2 threads" in walk) == (threads == "2") and "of the read bandwidth" in walk
    for line in rows:
        cell = line[73:81].strip()
        assert cell.endswith("%") if line.startswith("decode") else cell == "-", line
        # the roof's share: best over best, and the median of the rounds' own shares
        for cell in (line[92:100].strip(), line[100:107].strip()):
            assert cell.endswith("%") if line.startswith("decode") else cell == "-", line
    assert any(line.startswith("% roof: the best time's rate") for line in lines)
    from pagedcy._libs._attention import simd_level
    assert any("AVX2 kernels" in line for line in rows) == (simd is None and simd_level() == 2)
    # stderr is a pipe here: no progress drawing (it used to write "\r\033[K" status lines)
    assert proc.stderr == "", repr(proc.stderr[:300])
