"""The engine benchmark's plumbing: the smoke run's tables parse, the profiling hook times a
forward without changing it, llama.cpp's tables parse. Never asserts a speed."""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")

from pagedcy.tools import bench_engine, engine_baselines  # noqa: E402
from pagedcy.tools.engine_profile import StepProfile, gemm_only_seconds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tables(text):
    """Markdown tables in ``text``: list of (header, rows), cells stripped."""
    found, cur = [], None
    for line in text.splitlines():
        if line.startswith("|") and line.endswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cur is None:
                cur = (cells, [])
                found.append(cur)
            elif not all(set(c) <= set("-:") for c in cells):
                cur[1].append(cells)
        else:
            cur = None
    return found


def test_quick_run_prints_tables_that_parse():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OPENBLAS_L2_SIZE="262144")     # the bench must drop it and re-execute itself
    out = subprocess.run([sys.executable, "-m", "pagedcy", "bench", "--engine", "--quick",
                          "--tiny-model", "--no-transformers", "--no-llama-cpp"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("CPU: ")
    assert "OPENBLAS_L2_SIZE" not in text.split("model:")[0]   # env as run, after the re-exec
    a, b, parts = tables(text)
    assert a[0][:3] == ["row", "seconds", "output tok/s"]
    ours = dict((r[0], r) for r in a[1])["pagedcy LLM.generate"]
    assert float(ours[1]) > 0 and float(ours[2]) > 0
    # 8 requests x 16 tokens in the reported seconds
    secs = float(ours[1])
    assert 8 * 16 / (secs + 5e-4) - 0.05 <= float(ours[2]) <= 8 * 16 / (secs - 5e-4) + 0.05
    assert [r[-1] for r in a[1][1:]] == ["--no-transformers"] * 2
    metrics = {r[0]: r for r in b[1]}
    for m in ("prefill tok/s", "generation tok/s (all sequences)", "total seconds",
              "single-sequence decode tok/s"):
        assert float(metrics[m][1]) > 0 and metrics[m][2] == "not built"
    shares = {r[0]: float(r[2].rstrip("%")) for r in parts[1]}
    assert set(shares) == {"gemm", "attention", "elementwise", "Python + scheduling + sampling",
                           "whole step"}
    assert shares["gemm"] > 0 and shares["attention"] > 0 and shares["whole step"] == 100
    assert "peak RSS (workload A, pool sized to it):" in text and "failed" not in text


def _tiny_engine(tmp_path):
    path = bench_engine.ensure_checkpoint(str(tmp_path / "m"), tiny=True)
    return bench_engine._engine(path, 1, kv_cache_pages=64)


def test_profile_hook_times_the_parts_and_leaves_the_forward_unchanged(tmp_path):
    from pagedcy.models import model as m
    originals = (m.linear, m.run_attention, m.rms_norm)
    prompts = bench_engine.workload_a_prompts(3, 5, 20, 512, seed=4)

    def run(profile):
        eng = _tiny_engine(tmp_path)
        for i, p in enumerate(prompts):
            eng.add_request(str(i), {"prompt_token_ids": p}, bench_engine._greedy(6))
        outs = {}
        while eng.has_unfinished_requests():
            if profile is None:
                res = eng.step()
            else:
                with profile:
                    res = eng.step()
            outs.update({o.request_id: o.outputs[0].token_ids for o in res})
        return outs

    prof = StepProfile()
    assert run(prof) == run(None)
    assert (m.linear, m.run_attention, m.rms_norm) == originals      # restored
    assert all(v > 0 for v in prof.acc.values()), prof.acc
    prof.reset()
    assert set(prof.acc.values()) == {0.0}


def test_profile_restores_globals_after_an_exception():
    from pagedcy.models import model as m
    before = m.run_attention
    with pytest.raises(RuntimeError):
        with StepProfile():
            assert m.run_attention is not before
            raise RuntimeError("boom")
    assert m.run_attention is before


def test_run_batched_counts_every_token(tmp_path):
    eng = _tiny_engine(tmp_path)
    r = bench_engine.run_batched(eng, 3, 10, 4, 512)
    assert r["prefill_s"] > 0 and r["gen_s"] > 0
    assert r["total_s"] == pytest.approx(r["prefill_s"] + r["gen_s"])
    assert r["prefill_tps"] == pytest.approx(30 / r["prefill_s"])
    assert not eng.has_unfinished_requests()
    assert eng.stats().generation_tokens == 3 * 5


def test_gemm_yardstick_shapes():
    from pagedcy.models.config import ModelConfig
    cfg = ModelConfig.from_dict(dict(bench_engine.TINY_MODEL, architectures=["LlamaForCausalLM"],
                                     model_type="llama"))
    assert gemm_only_seconds(cfg, 16, 2, repeats=1) > 0


def test_workload_a_prompts_are_reproducible_and_in_range():
    p = bench_engine.workload_a_prompts(50, 128, 1024, 32000)
    assert p == bench_engine.workload_a_prompts(50, 128, 1024, 32000)
    lens = np.array([len(x) for x in p])
    assert lens.min() >= 128 and lens.max() <= 1024 and len(set(lens)) > 10
    assert min(min(x) for x in p) >= 3 and max(max(x) for x in p) < 32000


BATCHED = """
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   512 |     32 |   16 |   8704 |    1.612 |  5081.93 |    0.433 |  1182.42 |    2.045 |  4256.23 |
"""


def test_llama_cpp_tables_parse():
    rows = engine_baselines._table_rows(BATCHED)
    assert rows[0][5] == "S_PP t/s" and rows[1][5] == "5081.93" and len(rows) == 2
    assert engine_baselines._table_rows("no table here\n") == []
