"""``bench --engine --gguf FILE`` / ``--bf16-vs-f32``: the quick runs print tables that parse,
llama.cpp's rows are parsed and set beside ours with the right ratios (fake binaries), and a
crashing llama.cpp build is reported, not raised. Never asserts a speed."""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")

from pagedcy.tools import bench_gguf, engine_baselines  # noqa: E402
from test_bench_engine import tables  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "data", "tiny-llama-q4_k_m.gguf")


def _run(*args, anchors):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PAGEDCY_ANCHORS=str(anchors), OPENBLAS_L2_SIZE="262144")
    out = subprocess.run([sys.executable, "-m", "pagedcy", "bench", "--engine", "--quick", *args],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_gguf_quick_run_without_llama_cpp(tmp_path):
    text = _run("--gguf", FIXTURE, anchors=tmp_path)      # an empty anchors dir: nothing built
    head = text.split("\n## ")[0]
    assert head.startswith("CPU: ") and "SIMD " in head and "OPENBLAS_L2_SIZE" not in head
    (t,) = tables(text)
    assert t[0] == ["row", "pagedcy", "llama.cpp", "pagedcy speed / llama.cpp"]
    rows = {r[0]: r for r in t[1]}
    assert set(rows) == {"prefill pp32 tok/s", "decode tg8 tok/s", "2 x (32 + 4) total s"}
    for r in rows.values():
        assert float(r[1]) >= 0 and r[2] == "not built" and r[3] == "-"
    assert float(rows["decode tg8 tok/s"][1]) > 0
    size = os.path.getsize(FIXTURE) / 2**20
    assert f"file {size:.2f} MiB" in text and "RSS after load " in text and "target <= 1.25x" in text
    assert "read bandwidth " in text and "pagedcy decode = " in text and "llama.cpp's =" not in text
    # the best tg against the best of the probes before, between and after the 3 runs
    local = next(line for line in text.splitlines() if line.startswith("read bandwidth probed"))
    assert local.split(": ")[1].split(" GB/s")[0].count(", ") == 3 and "target" not in local
    # the target rides on each decode step against the read after it: 3 runs of 8 steps
    paired = next(line for line in text.splitlines() if line.startswith("decode steps each"))
    assert "of 16 MiB (24 steps, reads " in paired and paired.endswith("%; target >= 70%)")


def test_bf16_vs_f32_quick_run(tmp_path):
    (t,) = tables(_run("--bf16-vs-f32", anchors=tmp_path))
    assert t[0][1:3] == ["dtype=auto (bf16)", "dtype=float32"]
    rows = {r[0]: r for r in t[1]}
    for how in ("alternating", "own process"):
        tg = rows[f"decode tg8 tok/s, {how}"]
        assert float(tg[1]) > 0 and float(tg[2]) > 0
        assert tg[3].startswith(f"{float(tg[1]) / float(tg[2]):.2f}x")
    # the target rides on the alternating runs: their run-by-run ratios, one per round (3)
    alt = rows["decode tg8 tok/s, alternating"][3]
    assert "(target >= 1.7x; run by run " in alt and alt.count(", ") == 2
    assert "target" not in rows["decode tg8 tok/s, own process"][3]
    # bf16 matrices held as stored: half the bytes, but for the float32 norms
    assert 0.5 <= float(rows["weights as held"][3]) < 0.53


BENCH = """| model | size | params | backend | threads | test | t/s |
| --- | ---: | ---: | --- | ---: | ---: | ---: |
| llama ? | 1 MiB | 1 M | CPU | 2 | pp32 | 100.00 ± 1.00 |
| llama ? | 1 MiB | 1 M | CPU | 2 | tg8 | 50.00 ± 0.50 |
"""
BATCHED = """|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    32 |      4 |    2 |     72 |    0.100 |   640.00 |    0.050 |   160.00 |    0.150 |   480.00 |
"""


def _fake_llama_cpp(anchors, bench_rc=0):
    """Shell scripts in the anchor layout that print ``BENCH`` / ``BATCHED`` (llama-bench
    then exits with ``bench_rc``) and log their arguments."""
    b = anchors / "llama_cpp_python-0.0.0" / "vendor" / "llama.cpp" / "build" / "bin"
    b.mkdir(parents=True)
    for name, table, rc in (("llama-bench", BENCH, bench_rc), ("llama-batched-bench", BATCHED, 0)):
        p = b / name
        p.write_text(f"#!/bin/sh\necho \"$@\" >> {anchors}/args.log\ncat <<'EOF'\n{table}EOF\n"
                     f"exit {rc}\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return b


def test_llama_cpp_rows_beside_ours(tmp_path, monkeypatch):
    _fake_llama_cpp(tmp_path)
    monkeypatch.setattr(engine_baselines, "LLAMA_CPP_CACHE", str(tmp_path))
    res = engine_baselines.run_llama_cpp(2, 2, 32, 4, model=FIXTURE, tg=8)
    assert "error" not in res
    assert (res["single_prefill_tps"], res["single_decode_tps"]) == (100.0, 50.0)
    assert (res["prefill_tps"], res["gen_tps"], res["total_s"]) == (640.0, 160.0, 0.15)
    args = (tmp_path / "args.log").read_text()
    assert f"-m {FIXTURE}" in args and "-p 32 -n 8" in args and "-npl 2" in args
    ours = dict(config="x", file_size=2**20, load_s=0.1, pp=200.0, tg=25.0, batched_s=0.3,
                rss_before_load=0, rss_after_load=2**20, rss_after_runs=2**21, peak_rss=2**21,
                pool=2**20, weight_bytes=2**20, decode_bytes=10**6, kv_bytes_per_position=0,
                probes=[1.0, 0.5, 2.0, 0.25])
    text = bench_gguf.format_file("f.gguf", ours, res, bw=1.0, threads=2, quick=True)
    rows = {r[0]: r for r in tables(text)[0][1]}
    # speed ratios: pagedcy's rate / llama.cpp's; for the total, llama.cpp's seconds / ours
    assert rows["prefill pp32 tok/s"][2:] == ["100.0", "2.00x"]
    assert rows["decode tg8 tok/s"][2:] == ["50.00", "0.50x"]
    assert rows["2 x (32 + 4) total s"][1:] == ["0.30", "0.15", "0.50x"]
    # 1 GB/s over 1 MB a token: 1000 tok/s allowed; ours 25 = 2.5%, theirs 50 = 5%
    assert "allows 1000.0 tok/s: pagedcy decode = 2% of it" in text and "llama.cpp's = 5%" in text
    # the best probe around the runs, 2 GB/s: 2000 tok/s allowed; 25 = 1.25%, 50 = 2.5%
    assert ("probed before, between and after the tg runs: 1.0, 0.5, 2.0, 0.2 GB/s; the best, 2.0, "
            "allows 2000.0 tok/s: pagedcy decode = 1% of it, llama.cpp's = 2%") in text
    # each step against the read after it: 1 MB in 1 ms at 2 GB/s = 50%, in 0.5 ms at 2 = 100%,
    # in 1 ms at 4 = 25%: median 50%, quartiles (statistics' exclusive method) 25-100%
    ours["steps_vs_reads"] = [[1e-3, 2.0], [0.5e-3, 2.0], [1e-3, 4.0]]
    text = bench_gguf.format_file("f.gguf", ours, res, bw=1.0, threads=2, quick=True)
    assert ("decode steps each followed by a read of 16 MiB (3 steps, reads 2.0-4.0 GB/s): a step's "
            "rate over what its read's bandwidth allows, median 50% (quartiles 25-100%; target >= 70%)") in text
    assert "0.50x after load" in text and "1.00x after the runs" in text


def test_crashing_llama_cpp_is_reported(tmp_path, monkeypatch):
    _fake_llama_cpp(tmp_path, bench_rc=139)
    monkeypatch.setattr(engine_baselines, "LLAMA_CPP_CACHE", str(tmp_path))
    res = engine_baselines.run_llama_cpp(2, 2, 32, 4, model=FIXTURE, tg=8)
    assert res["error"] == "llama-bench exited with 139" and res["total_s"] == 0.15
    assert engine_baselines.run_llama_cpp(2, 2, 32, 4, model=str(tmp_path / "missing.gguf")) is None


def test_decode_read_bytes_skips_an_untied_embedding_only():
    from pagedcy.models.loader import load_gguf
    model, _, _ = load_gguf(FIXTURE, num_threads=1)
    embed = model._embed
    assert embed is not None          # the fixture's llama has its own output.weight
    assert bench_gguf.decode_read_bytes(model) == model.weight_bytes - embed.nbytes
    model._embed = None               # tied: the table is the LM head, read whole
    assert bench_gguf.decode_read_bytes(model) == model.weight_bytes
    assert np.isfinite(bench_gguf.rss_bytes())


def test_llama_cpp_runs_between_ours(tmp_path):
    """With llama.cpp built, its runs alternate with pagedcy's in the file's child process:
    one llama-bench run (-r 1) after each of the 3 pp / tg runs, then llama-batched-bench
    after the batched run; its rows are the best of those runs, beside ours."""
    _fake_llama_cpp(tmp_path)
    text = _run("--gguf", FIXTURE, anchors=tmp_path)
    calls = (tmp_path / "args.log").read_text().splitlines()
    assert len(calls) == 4 and all("-r 1" in c and "-p 32 -n 8" in c for c in calls[:3])
    assert "-npl 2" in calls[3] and "-r " not in calls[3]
    rows = {r[0]: r for r in tables(text)[0][1]}
    assert rows["prefill pp32 tok/s"][2] == "100.0" and rows["decode tg8 tok/s"][2] == "50.00"
    assert rows["2 x (32 + 4) total s"][2] == "0.15"
    assert "llama.cpp's =" in text and "runs between pagedcy's runs" in text


def test_repeats_sets_the_runs_on_both_sides(tmp_path):
    """``--repeats 2``: two pp / tg runs of ours, each followed by one llama-bench run, and
    three bandwidth probes around them; the header says best of 2."""
    _fake_llama_cpp(tmp_path)
    text = _run("--gguf", FIXTURE, "--repeats", "2", anchors=tmp_path)
    calls = (tmp_path / "args.log").read_text().splitlines()
    assert len(calls) == 3 and all("-r 1" in c for c in calls[:2]) and "-npl 2" in calls[2]
    assert "best of 2 for pp / tg" in text and "best of 3" not in text
    local = next(line for line in text.splitlines() if line.startswith("read bandwidth probed"))
    assert local.split(": ")[1].split(" GB/s")[0].count(", ") == 2


def test_merge_llama_cpp_takes_each_rows_best():
    parts = [{"single_prefill_tps": 90.0, "single_decode_tps": 55.0, "tables": ["a"]},
             {"single_prefill_tps": 110.0, "single_decode_tps": 45.0, "tables": ["b"],
              "error": "llama-bench exited with 1"},
             {"prefill_tps": 600.0, "gen_tps": 150.0, "total_s": 0.2, "tables": ["c"]}]
    res = engine_baselines.merge_llama_cpp(parts)
    assert (res["single_prefill_tps"], res["single_decode_tps"], res["total_s"]) == (110.0, 55.0, 0.2)
    assert res["tables"] == ["a", "b", "c"] and res["error"] == "llama-bench exited with 1"
    assert engine_baselines.merge_llama_cpp([]) == {"tables": []}
