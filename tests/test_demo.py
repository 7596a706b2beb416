"""The demo's parts: workload, pool sizing, spot check and leak check (the whole quick run
is in test_cli.py)."""
import argparse

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from pagedcy.engine import LLM, SamplingParams  # noqa: E402
from pagedcy.tools import demo  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return demo.build_checkpoint(str(tmp_path_factory.mktemp("demo")), quick=True)


def test_workload_shares_prefixes_and_mixes_requests():
    prompts, params = demo.workload(60, seed=0, quick=True)
    assert len(prompts) == len(params) == 60
    starts = {p.split("\n")[0] for p in prompts}
    assert starts <= set(demo.SYSTEM_PROMPTS) and len(starts) > 1
    assert any(p.n == 2 for p in params) and any(p.greedy for p in params)
    assert len({p.max_tokens for p in params}) > 5
    assert demo.workload(60, seed=0, quick=True) == (prompts, params)


def test_pool_is_smaller_than_the_batch_but_fits_each_request():
    params = [SamplingParams(max_tokens=20), SamplingParams(max_tokens=40, n=2)] * 10
    tokens = [[1] * 30, [1] * 100] * 10
    pages = demo.pool_pages(tokens, params, 16, max_num_seqs=32)
    one = -(-(100 + 40) // 16)
    assert one < pages < sum(-(-(len(t) + p.max_tokens) // 16) * p.n
                             for t, p in zip(tokens, params))


def test_small_run_preempts_and_checks_out(tmp_path):
    args = argparse.Namespace(quick=True, requests=16, seed=1, no_progress=True, threads=1)
    summary, ok = demo.run(args, str(tmp_path))
    assert ok
    assert summary["leak check"].startswith("ok")
    assert not summary["preemptions"].startswith("0 ")
    assert "same tokens" in summary["spot check"]


def test_leak_check_sees_a_held_page(ckpt):
    llm = LLM(ckpt, kv_cache_pages=32, num_threads=1)
    eng = llm.llm_engine
    llm.generate(["hello"], SamplingParams(max_tokens=3), use_tqdm=False)
    assert demo.leak_check(eng)
    eng.add_request("held", "hello there", SamplingParams(max_tokens=5))
    eng.step()
    assert not demo.leak_check(eng)


def test_spot_check_catches_a_wrong_answer(ckpt):
    prompts = ["one two three", "the harbour"]
    params = [SamplingParams(temperature=0, max_tokens=6)] * 2
    outs = LLM(ckpt, num_threads=1).generate(prompts, params, use_tqdm=False)
    assert demo.spot_check(ckpt, prompts, params, outs, 1) == (2, 0)
    outs[1].outputs[0].token_ids[2] += 1
    assert demo.spot_check(ckpt, prompts, params, outs, 1) == (2, 1)
