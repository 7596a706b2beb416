"""The KV page store against a real redis-server: two engines in two processes share
prompt pages, and every fault (server down at start, killed mid-run, slow, full, values
evicted between lookup and fetch, corrupt or of another model) leaves the output equal to
the run without a store."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from engine_helpers import ToyModel
from redis_fixture import redis_server  # noqa: F401  (the fixture)
from pagedcy.engine import LLMEngine, SamplingParams

PS = 4
GREEDY = SamplingParams(max_tokens=6, temperature=0)
SEEDED = SamplingParams(max_tokens=6, temperature=0.9, seed=7)


def _prompts(seed=0, n=4, lo=17, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _engine(store=None, model_seed=0, **kw):
    kw.setdefault("kv_cache_pages", 96)
    return LLMEngine.from_model(ToyModel(seed=model_seed), page_size=PS, kv_store=store, **kw)


def _run(eng, prompts, params=GREEDY, during=None):
    """{request id: token ids}; ``during(step_index)`` runs before each step."""
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    out, k = {}, 0
    while eng.has_unfinished_requests():
        if during is not None:
            during(k)
        k += 1
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    eng.manager.check_invariants()
    assert eng.manager.free_blocks() == eng.manager.total_blocks()
    return out


def _full_pages(prompts):
    return sum((len(p) - 1) // PS for p in prompts)


def _fill(url, prompts, params=GREEDY, model_seed=0):
    eng = _engine(url, model_seed)
    out = _run(eng, prompts, params)
    assert eng.kv_store.flush(10)
    eng.close()
    return out


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_store_round_trip_in_process(redis_server, params):
    prompts = _prompts()
    ref = _run(_engine(), prompts, params)
    assert _fill(redis_server.url, prompts, params) == ref
    eng = _engine(redis_server.url)
    assert _run(eng, prompts, params) == ref
    assert eng.kv_store.flush(10)
    st = eng.stats()
    assert st.kv_store_pages_loaded == st.kv_store_pages_hit == _full_pages(prompts)
    assert st.kv_store_tokens_loaded == _full_pages(prompts) * PS
    assert st.prompt_tokens == sum(len(p) for p in prompts) - _full_pages(prompts) * PS
    # only a last full page, never looked up (its last token must be computed), is re-sent
    assert st.kv_store_pages_stored == sum(len(p) % PS == 0 for p in prompts)
    assert st.kv_store_bytes_in > 0
    assert st.kv_store_lookups == len(prompts) and st.kv_store_load_seconds > 0
    eng.close()


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_round_trip_over_tcp_in_other_dtypes(redis_server, kv_dtype):
    prompts = _prompts(2)
    ref = _run(_engine(kv_dtype=kv_dtype), prompts)
    eng = _engine(redis_server.tcp_url, kv_dtype=kv_dtype)
    assert _run(eng, prompts) == ref
    eng.close()                                 # (sends what is queued)
    eng = _engine(redis_server.tcp_url, kv_dtype=kv_dtype)
    assert _run(eng, prompts) == ref
    assert eng.stats().kv_store_pages_loaded == _full_pages(prompts)
    assert all(f":{kv_dtype}:{PS}:".encode() in k
               for k in redis_server.client().keys("pagedcy:kv:*"))
    eng.close()


def test_pages_already_stored_are_not_sent_again(redis_server):
    prompts = _prompts()
    eng = _engine(redis_server.url)
    _run(eng, prompts)
    _run(eng, [p + [1, 2, 3, 4, 5] for p in prompts])   # the same pages, locally cached
    eng.kv_store.flush(10)
    st = eng.stats()
    assert st.kv_store_pages_stored == redis_server.client().dbsize()
    # every full page once (the first run's are a prefix of the second's)
    assert st.kv_store_pages_stored == sum((len(p) + 5) // PS for p in prompts)
    eng.close()


# -- two processes -------------------------------------------------------------------------
_CHILD = """
import json, sys
from pagedcy import LLM, SamplingParams
ckpt, url, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = LLM(ckpt, page_size=8, kv_cache_pages=64, kv_store=url)
res = {}
for name, p in (("greedy", SamplingParams(max_tokens=8, temperature=0)),
                ("seeded", SamplingParams(max_tokens=8, temperature=0.8, seed=11))):
    before = llm.llm_engine.stats().prompt_tokens
    res[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)]
    res[name + "_prompt_tokens"] = llm.llm_engine.stats().prompt_tokens - before
    llm.llm_engine.manager.reset_prefix_cache()     # the second run reads the store again
assert llm.llm_engine.kv_store.flush(20)
st = llm.llm_engine.stats()
res.update((k, v) for k, v in vars(st).items() if k.startswith("kv_store"))
res["loaded"] = st.kv_store_pages_loaded
res["stored"] = st.kv_store_pages_stored
print(json.dumps(res))
"""


def test_two_engines_in_two_processes_share_pages(redis_server, tmp_path):
    from pagedcy import LLM
    from pagedcy.models import write_random_checkpoint
    ckpt = write_random_checkpoint(str(tmp_path / "m"), tokenizer=False, seed=5)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 200, n).tolist() for n in (41, 57, 24)]

    def child():
        r = subprocess.run([sys.executable, "-c", _CHILD, ckpt, redis_server.url,
                            json.dumps(prompts)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": "random"})
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    first, second = child(), child()
    why = f"first process: {first}, second: {second}"
    llm = LLM(ckpt, page_size=8, kv_cache_pages=64)          # no store: the reference
    for name, p in (("greedy", SamplingParams(max_tokens=8, temperature=0)),
                    ("seeded", SamplingParams(max_tokens=8, temperature=0.8, seed=11))):
        ref = [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)]
        llm.llm_engine.manager.reset_prefix_cache()
        assert first[name] == ref and second[name] == ref, (name, why)
    full = sum((len(p) - 1) // 8 for p in prompts)
    assert first["stored"] == sum(len(p) // 8 for p in prompts), why
    assert first["greedy_prompt_tokens"] == sum(map(len, prompts)), why
    # the second process computed only each prompt's tail, in both runs
    tails = sum(len(p) - (len(p) - 1) // 8 * 8 for p in prompts)
    assert second["greedy_prompt_tokens"] == second["seeded_prompt_tokens"] == tails, why
    # (a last full page is never looked up: its last token must be computed; it is sent
    # once more, then known)
    assert second["loaded"] == 2 * full, why
    assert second["stored"] == sum(len(p) % 8 == 0 for p in prompts), why


# -- faults ----------------------------------------------------------------------------------
def test_store_down_at_start(tmp_path):
    pytest.importorskip("redis")
    prompts = _prompts()
    ref = _run(_engine(), prompts)
    eng = _engine(f"unix://{tmp_path}/nobody.sock")
    assert _run(eng, prompts) == ref
    assert _run(eng, _prompts(1)) == _run(_engine(), _prompts(1))
    st = eng.stats()
    assert st.kv_store_errors >= 1 and st.kv_store_pages_loaded == 0
    assert st.kv_store_pages_stored == 0
    eng.close()


def test_store_killed_mid_run_then_back(redis_server):
    prompts = _prompts(n=6)
    ref = _run(_engine(), prompts)
    _fill(redis_server.url, prompts[:3])
    eng = _engine(redis_server.url, max_num_seqs=2)
    killed = []

    def during(k):
        if k == 3:
            redis_server.kill()
            killed.append(k)
    assert _run(eng, prompts, during=during) == ref and killed
    assert eng.stats().kv_store_errors >= 1
    redis_server.start()                                  # an empty server comes back
    end = time.monotonic() + 40
    more = _prompts(2)
    while eng.stats().kv_store_pages_stored == 0:
        assert time.monotonic() < end, "the store never reconnected"
        time.sleep(0.3)
        eng.manager.reset_prefix_cache()
        assert _run(eng, more) == _run(_engine(), more)
        eng.kv_store.flush(5)
    eng.close()


def test_slow_store_times_out(redis_server):
    prompts = _prompts()
    ref = _run(_engine(), prompts)
    _fill(redis_server.url, prompts)
    redis_server.client().execute_command("CLIENT", "PAUSE", "1500", "ALL")
    try:
        eng = _engine(redis_server.url + "?socket_timeout=0.2")
        assert _run(eng, prompts) == ref             # (the pause outlasts the timeouts)
        st = eng.stats()
        assert st.kv_store_errors >= 1 and st.kv_store_pages_loaded == 0
    finally:
        redis_server.client().execute_command("CLIENT", "UNPAUSE")
    eng.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
def test_full_store(redis_server, policy):
    c = redis_server.client()
    used = int(c.info("memory")["used_memory"])
    c.config_set("maxmemory-policy", policy)
    c.config_set("maxmemory", str(used + 300_000))    # room for a third of the pages
    prompts = _prompts(n=30, lo=30, hi=60)
    ref = _run(_engine(), prompts)
    filler = _engine(redis_server.url)
    assert _run(filler, prompts) == ref
    assert filler.kv_store.flush(10)
    if policy == "noeviction":                         # SETs refused with OOM
        assert filler.stats().kv_store_errors >= 1
    else:                                              # SETs evict older pages
        assert int(c.info("stats")["evicted_keys"]) > 0
    filler.close()
    eng = _engine(redis_server.url)
    assert _run(eng, prompts) == ref
    assert eng.stats().kv_store_pages_loaded < _full_pages(prompts)
    eng.close()


def _overwrite(client, make):
    for key in client.keys("pagedcy:kv:*"):
        client.set(key, make(key, client.get(key)))


@pytest.mark.parametrize("how", ["garbage", "truncated", "flipped", "empty"])
def test_corrupt_values_are_refused(redis_server, how):
    prompts = _prompts()
    ref = _fill(redis_server.url, prompts)
    make = {"garbage": lambda k, v: os.urandom(len(v)),
            "truncated": lambda k, v: v[:len(v) // 2],
            "flipped": lambda k, v: v[:-3] + bytes([v[-3] ^ 0x40]) + v[-2:],
            "empty": lambda k, v: b""}[how]
    _overwrite(redis_server.client(), make)
    eng = _engine(redis_server.url)
    assert _run(eng, prompts) == ref
    st = eng.stats()
    assert st.kv_store_pages_loaded == 0 and st.kv_store_values_rejected == len(prompts)
    eng.close()


def test_values_of_another_model_are_refused(redis_server):
    """A second model of the same config (another seed) writes its own keys; its bytes
    copied onto the first model's keys are refused."""
    prompts = _prompts()
    ref = _fill(redis_server.url, prompts)
    _fill(redis_server.url, prompts, model_seed=1)
    c = redis_server.client()
    keys = sorted(c.keys("pagedcy:kv:*"))
    assert len(keys) == 2 * sum(len(p) // PS for p in prompts)   # two fingerprints
    by_hash = {}
    for k in keys:
        by_hash.setdefault(k.rsplit(b":", 1)[1], []).append(k)
    for a, b in by_hash.values():
        va, vb = c.get(a), c.get(b)
        c.set(a, vb)
        c.set(b, va)
    eng = _engine(redis_server.url)
    assert _run(eng, prompts) == ref
    assert eng.stats().kv_store_values_rejected == len(prompts)
    assert eng.stats().kv_store_pages_loaded == 0
    eng.close()


def test_value_evicted_between_lookup_and_fetch(redis_server):
    prompts = _prompts(lo=30, hi=40)
    ref = _fill(redis_server.url, prompts)
    c = redis_server.client()
    eng = _engine(redis_server.url)
    eng.kv_store.before_fetch = lambda keys: c.delete(keys[2]) if len(keys) > 2 else None
    assert _run(eng, prompts) == ref
    st = eng.stats()
    assert st.kv_store_pages_loaded == 2 * len(prompts)   # the run stops at the deleted page
    eng.kv_store.flush(10)
    assert c.dbsize() == sum(len(p) // PS for p in prompts)   # the deleted ones written again
    eng.close()


def test_password_passes_through_and_a_wrong_one_only_costs_prefill(redis_server):
    prompts = _prompts()
    ref = _run(_engine(), prompts)
    redis_server.client().config_set("requirepass", "s3cret")
    assert _fill(redis_server.url + "?password=s3cret", prompts) == ref
    eng = _engine(redis_server.url + "?password=wrong")
    assert _run(eng, prompts) == ref
    assert eng.stats().kv_store_pages_loaded == 0 and eng.stats().kv_store_errors >= 1
    eng.close()
    eng = _engine(redis_server.url + "?password=s3cret")
    assert _run(eng, prompts) == ref
    assert eng.stats().kv_store_pages_loaded == _full_pages(prompts)
    eng.close()
    assert _run(eng, prompts) == ref            # closed: the engine goes on without it


def test_options_checked():
    with pytest.raises(ValueError, match="redis://"):
        _engine("http://x")
    with pytest.raises(TypeError):
        _engine(5)
    with pytest.raises(ValueError, match="prefix"):
        _engine("redis://localhost", enable_prefix_cache=False)
    pytest.importorskip("redis")
    with pytest.raises(ValueError, match="URL"):
        _engine("redis://localhost:notaport")


def test_cli_and_metrics():
    import argparse
    from pagedcy.engine import EngineStats
    from pagedcy.server.launch import add_engine_arguments, engine_kwargs
    from pagedcy.server.metrics import ServerMetrics
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    assert engine_kwargs(p.parse_args(["--kv-store", "unix:///x.sock"]))["kv_store"] \
        == "unix:///x.sock"
    assert engine_kwargs(p.parse_args([]))["kv_store"] is None
    st = EngineStats(0, 0, 0, 8, 0, 8, 0, 0, 0, 0, 0, kv_store_pages_loaded=3,
                     kv_store_tokens_loaded=12, kv_store_bytes_in=999, kv_store_lookups=2,
                     kv_store_load_seconds=0.5, kv_store_errors=4)
    text = ServerMetrics(lambda: st, "m").render()[0].decode()
    for line in ('pagedcy_kv_store_pages_loaded_total{model_name="m"} 3.0',
                 'pagedcy_kv_store_tokens_loaded_total{model_name="m"} 12.0',
                 'pagedcy_kv_store_bytes_in_total{model_name="m"} 999.0',
                 'pagedcy_kv_store_errors_total{model_name="m"} 4.0',
                 'pagedcy_kv_store_load_seconds_count{model_name="m"} 2.0',
                 'pagedcy_kv_store_load_seconds_sum{model_name="m"} 0.5'):
        assert line in text, line


def test_two_servers_share_pages_and_export_metrics(redis_server, tmp_path):
    """``serve --kv-store``: a second server answers a prompt the first one prefilled with
    the same tokens, loads its pages, and /metrics says so."""
    import httpx
    from pagedcy.models import write_random_checkpoint
    from server_proc import ServerProcess, scrape
    ckpt = write_random_checkpoint(str(tmp_path / "m"), seed=2)
    prompt = list(range(3, 60))
    body = {"model": ckpt, "prompt": prompt, "max_tokens": 6, "temperature": 0}

    def serve_once():
        srv = ServerProcess(ckpt, "--kv-store", redis_server.url, "--page-size", "8",
                            "--kv-cache-pages", "64", log_path=str(tmp_path / "log"))
        try:
            r = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"], scrape(srv.base_url)
        finally:
            assert srv.stop() == 0, srv.log()           # SIGTERM sends the queued pages

    first_text, first = serve_once()
    second_text, second = serve_once()
    assert first_text == second_text
    full = (len(prompt) - 1) // 8
    assert first["pagedcy_kv_store_pages_loaded_total"] == 0
    assert second["pagedcy_kv_store_pages_loaded_total"] == full
    assert second["pagedcy_kv_store_tokens_loaded_total"] == full * 8
    assert second["pagedcy_prompt_tokens_total"] == len(prompt) - full * 8
    assert second["pagedcy_kv_store_bytes_in_total"] > 0
    assert second["pagedcy_kv_store_load_seconds_count"] == 1
