"""``serve --replicas``: the routing rules alone (no Ray), then ``python -m pagedcy serve
--replicas 2`` as a real process on a local Ray cluster this module starts, driven by the
official ``openai`` client and checked against offline ``LLM.generate``.

The cluster: ``ray.init(num_cpus=2)`` here (shut down at the end); the server joins it with
``--ray-address``, so this process can kill a replica's actor. About a minute on 2 cores.
"""
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pagedcy.server.routing import (KEY_BYTES, Candidate, PrefixIndex, leading_match, pack_keys,
                                    page_keys, rank, unpack_keys)

# --- routing rules, no Ray ------------------------------------------------------------------


def _cands(*rows):
    return [Candidate(name, load, match, pages) for name, load, match, pages in rows]


def test_rank_longest_prefix_first():
    cands = _cands(("a", 0, 3, 10), ("b", 0, 5, 10), ("c", 0, 0, 0))
    assert rank(cands, max_load_gap=8) == ["b", "a", "c"]


def test_rank_load_divergence_falls_back_to_least_loaded():
    cands = _cands(("busy", 9, 5, 10), ("idle", 0, 0, 0), ("mid", 4, 1, 3))
    # busy is 9 requests past the least loaded: over a gap of 8 it goes last
    assert rank(cands, max_load_gap=8) == ["mid", "idle", "busy"]
    assert rank(cands, max_load_gap=3) == ["idle", "mid", "busy"]
    assert rank(cands, max_load_gap=9) == ["busy", "mid", "idle"]
    with pytest.raises(ValueError):
        rank(cands, max_load_gap=-1)


def test_rank_ties():
    # equal match: the less loaded, then the one holding fewer pages (room for a new prefix)
    assert rank(_cands(("a", 2, 1, 0), ("b", 1, 1, 50)), max_load_gap=8) == ["b", "a"]
    assert rank(_cands(("a", 1, 0, 40), ("b", 1, 0, 20)), max_load_gap=8) == ["b", "a"]
    # all equal: a random draw, each side sometimes
    rng = random.Random(0)
    firsts = {rank(_cands(("a", 0, 0, 0), ("b", 0, 0, 0)), max_load_gap=8, rng=rng)[0]
              for _ in range(50)}
    assert firsts == {"a", "b"}
    assert rank([], max_load_gap=8) == []


def test_leading_match_stops_at_the_first_gap():
    held = {b"k1", b"k2", b"k4"}
    assert leading_match([b"k1", b"k2", b"k3", b"k4"], held.__contains__) == 2
    assert leading_match([b"k3", b"k1"], held.__contains__) == 0
    assert leading_match([], held.__contains__) == 0


def test_page_keys_are_the_engines_hashes_in_every_process(tmp_path):
    """The keys equal the prefix cache's page hashes after a real prefill, and another
    interpreter (its own hash seed) computes the same ones."""
    from pagedcy.engine import LLMEngine, SamplingParams
    from pagedcy.models import write_random_checkpoint
    model = write_random_checkpoint(tmp_path / "m", seed=3, tokenizer=False)
    engine = LLMEngine(model, kv_cache_pages=32, page_size=16, num_threads=1)
    ids = list(range(20, 20 + 53))                       # 3 full pages and 5 tokens
    engine.add_request("r", {"prompt_token_ids": ids}, SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    keys = page_keys(ids, 16)
    assert len(keys) == 3 and all(len(k) == KEY_BYTES for k in keys)
    assert unpack_keys(pack_keys(engine.manager.cached_page_hashes().values())) == set(keys)
    code = ("import sys; from pagedcy.server.routing import page_keys; "
            "sys.stdout.write(b''.join(page_keys(range(20, 73), 16)).hex())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out == b"".join(keys).hex()
    assert page_keys(ids[:16], 16) == keys[:1] and page_keys(ids[:15], 16) == []
    # a different first page changes every later key (chained)
    other = page_keys([21] + ids[1:], 16)
    assert not set(other) & set(keys)


def test_pack_keys_round_trip_and_bad_blob():
    hashes = [bytes([i]) * 16 for i in range(5)]
    blob = pack_keys(hashes + hashes[:2])
    assert len(blob) == 5 * KEY_BYTES and pack_keys(reversed(hashes)) == blob
    assert unpack_keys(blob) == {h[:KEY_BYTES] for h in hashes}
    with pytest.raises(ValueError):
        unpack_keys(blob[:-1])


def test_prefix_index_expects_routed_prompts_until_a_later_report():
    idx = PrefixIndex()
    keys = [b"p1______", b"p2______"]
    assert idx.candidate("a", keys).match == 0
    idx.routed("a", "r1", keys)
    c = idx.candidate("a", keys)
    assert (c.match, c.load, c.pages) == (2, 1, 2)
    idx.completed("a", "r1", at=10.0)
    assert idx.candidate("a", keys).match == 2 and idx.inflight("a") == 0
    idx.report("a", frozenset(), at=9.0)               # taken before the end: still expected
    assert idx.candidate("a", keys).match == 2
    idx.report("a", frozenset({keys[0]}), at=11.0)     # after: the report is the truth
    assert idx.candidate("a", keys).match == 1
    idx.report("a", frozenset(keys), at=10.5)          # older than the last: ignored
    assert idx.candidate("a", keys).match == 1
    assert idx.candidate("a", keys, load=7).load == 7
    idx.routed("b", "r2", keys)
    idx.retain(["a"])
    assert idx.candidate("b", keys).match == 0 and idx.inflight("b") == 0
    idx.forget("a")
    assert idx.last_report("a") is None and idx.candidate("a", keys).pages == 0


def test_deltas_rebuild_the_cumulative_outputs(tmp_path):
    """Replica-side deltas of a real engine's outputs (n=2, logprobs, stop strings) turn
    back into outputs equal to the engine's own, step by step."""
    from pagedcy.engine import LLMEngine, SamplingParams
    from pagedcy.models import write_random_checkpoint
    from pagedcy.server.remote_engine import DeltaEncoder, OutputAccumulator, sum_stats
    model = write_random_checkpoint(tmp_path / "m", seed=4, tokenizer=True)
    engine = LLMEngine(model, kv_cache_pages=64, num_threads=1)
    params = SamplingParams(n=2, max_tokens=12, temperature=0.8, seed=5, logprobs=2, stop=["e"])
    engine.add_request("r", "the cat sat", params)
    enc, acc = DeltaEncoder("rep"), None
    seen = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            acc = acc or OutputAccumulator("r", out.prompt_token_ids)
            delta = enc.encode(out, engine.stats() if out.finished else None)
            assert delta.replica == "rep" and (delta.stats is not None) == out.finished
            got = acc.apply(delta)
            assert got.outputs == out.outputs and got.finished == out.finished
            seen += 1
    assert seen > 1
    s = engine.stats()
    total = sum_stats([s, s])
    assert total.generation_tokens == 2 * s.generation_tokens and sum_stats([]).num_running == 0


def test_serve_run_builder_takes_the_serve_flags(tmp_path):
    pytest.importorskip("ray.serve")
    from pagedcy.server.replicas import build_app
    app = build_app({"model": str(tmp_path), "replicas": "3", "num_threads": "2",
                     "no_prefix_cache": "true", "router": "round-robin", "api_key": "k"})
    front = app._bound_deployment
    engine = front.init_args[0]._bound_deployment
    assert front.init_args[1] == {"model": str(tmp_path), "served_model_name": None,
                                  "api_key": "k"}
    assert (engine.num_replicas, engine.ray_actor_options) == (3, {"num_cpus": 2.0})
    assert engine.init_args[1]["num_threads"] == 2
    assert engine.init_args[1]["enable_prefix_cache"] is False
    assert engine._deployment_config.request_router_config.request_router_class.endswith(
        "RoundRobinRouter")
    for bad in ({"model": "m", "replicas": "0"}, {"model": "m", "router": "nope"},
                {"replicas": "2"}, {"model": "m", "replica_cpus": "0"}):
        with pytest.raises(ValueError):
            build_app(bad)


# --- the server on Ray Serve ----------------------------------------------------------------

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from server_proc import free_port  # noqa: E402

CONTEXT = 2048
PAGES = 256
ENGINE_ARGS = ("--num-threads", "1", "--kv-cache-pages", str(PAGES))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from pagedcy.models import write_random_checkpoint
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", seed=1,
                                   tokenizer=True, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def cluster():
    from pagedcy.server.replicas import _worker_path
    _worker_path()                       # workers import this pagedcy
    ctx = ray.init(num_cpus=2, include_dashboard=False, namespace="pagedcy-tests",
                   log_to_driver=False)
    yield ctx.address_info["address"]
    ray.shutdown()


class ReplicaServer:
    """``python -m pagedcy serve --replicas 2`` on 127.0.0.1, joined to ``address``."""

    def __init__(self, model_dir, address, log_path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        cmd = [sys.executable, "-m", "pagedcy", "serve", "--model", str(model_dir),
               "--replicas", "2", "--ray-address", address, "--host", "127.0.0.1",
               "--port", str(self.port), *ENGINE_ARGS]
        self.proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 150
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"the server did not come up: {self.log()}")
            time.sleep(0.25)

    def healthy(self):
        try:
            return httpx.get(self.base_url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]

    def replicas(self):
        return httpx.get(self.base_url + "/debug/replicas", timeout=10).json()["replicas"]


@pytest.fixture(scope="module")
def server(model_dir, cluster, tmp_path_factory):
    s = ReplicaServer(model_dir, cluster, tmp_path_factory.mktemp("log") / "serve.log")
    yield s
    if s.proc.poll() is None:
        s.proc.terminate()
        try:
            s.proc.wait(60)
        except subprocess.TimeoutExpired:
            s.proc.kill()


@pytest.fixture(scope="module")
def llm(model_dir):
    from pagedcy import LLM
    return LLM(model_dir, num_threads=1, kv_cache_pages=PAGES)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def _offline(llm, prompt, max_tokens):
    from pagedcy import SamplingParams
    out = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0),
                       use_tqdm=False)[0].outputs[0]
    return out.text, out.finish_reason


def test_completions_chat_and_streams_equal_offline(server, client, llm, model_dir):
    prompts = ["the cat sat on a mat", "seven quick foxes jumped over", "numbers like 12 or 3.5"]
    for p in prompts:
        r = client.completions.create(model=str(model_dir), prompt=p, max_tokens=12, temperature=0)
        assert (r.choices[0].text, r.choices[0].finish_reason) == _offline(llm, p, 12)
        stream = client.completions.create(model=str(model_dir), prompt=p, max_tokens=12,
                                           temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices) == r.choices[0].text
    messages = [{"role": "user", "content": "Hello there"}]
    chat = client.chat.completions.create(model=str(model_dir), messages=messages,
                                          max_tokens=10, temperature=0)
    from pagedcy.server.chat_template import ChatTemplate
    template = ChatTemplate.from_model_dir(model_dir, llm.get_tokenizer())
    ids = llm.get_tokenizer().encode(template.render(messages, add_generation_prompt=True),
                                      add_special_tokens=False)
    text, reason = _offline(llm, {"prompt_token_ids": list(ids)}, 10)
    assert (chat.choices[0].message.content, chat.choices[0].finish_reason) == (text, reason)
    stream = client.chat.completions.create(model=str(model_dir), messages=messages,
                                            max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    assert [m.id for m in client.models.list().data] == [str(model_dir)]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=str(model_dir), prompt="x", max_tokens=CONTEXT + 1)
    metrics = httpx.get(server.base_url + "/metrics").text
    assert "pagedcy_generation_tokens_total" in metrics


def _token_prompt(prefix, k):
    return prefix + [int(t) for t in np.random.default_rng(k).integers(20, 400, size=9)]


def _landed(server, client, model_dir, prompt, max_tokens=2):
    """The replica that served one completion of ``prompt`` (its request count grew)."""
    before = server.replicas()
    client.completions.create(model=str(model_dir), prompt=prompt, max_tokens=max_tokens,
                              temperature=0)
    after = server.replicas()
    grew = [r for r in after if after[r]["requests"] > before.get(r, {}).get("requests", 0)]
    assert len(grew) == 1, (before, after)
    return grew[0]


def test_repeats_of_a_prefix_land_on_its_replica(server, client, model_dir):
    rng = np.random.default_rng(7)
    prefixes = [[int(t) for t in rng.integers(20, 400, size=64)] for _ in range(2)]  # 4 pages
    owners = [_landed(server, client, model_dir, _token_prompt(p, 100 + i))
              for i, p in enumerate(prefixes)]
    # two new prefixes, equal loads: the second goes to the replica that holds fewer pages
    assert owners[0] != owners[1]
    time.sleep(1.5)          # past a routing report: the replicas' own page lists decide now
    before = server.replicas()
    # repeats in an order no turn-taking follows: 1 1 0 0 0 1 0 0 1 1 1 0
    for k, i in enumerate(np.random.default_rng(3).permutation([0, 1] * 6)):
        assert _landed(server, client, model_dir, _token_prompt(prefixes[i], k)) == owners[i]
    after = server.replicas()
    for owner in owners:
        # every repeat found its 4 prefix pages in its replica's cache
        assert after[owner]["prefix_cache_hits"] - before[owner]["prefix_cache_hits"] >= 6 * 64


def _replica_actor(replica_id):
    from ray.serve._private.constants import SERVE_NAMESPACE
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["namespace"] == SERVE_NAMESPACE and a["name"].endswith("#" + replica_id):
            return ray.get_actor(a["name"], namespace=SERVE_NAMESPACE)
    raise LookupError(replica_id)


def test_disconnect_aborts_and_a_killed_replica_fails_its_requests(server, client, model_dir):
    prefix = [int(t) for t in np.random.default_rng(11).integers(20, 400, size=64)]
    # the replica that holds the prefix: where its requests land
    victim = _landed(server, client, model_dir, _token_prompt(prefix, 0))
    assert _landed(server, client, model_dir, _token_prompt(prefix, 1)) == victim

    # a client that leaves mid-stream aborts its request on the replica
    long = CONTEXT - len(prefix) - 16
    stream = client.completions.create(model=str(model_dir), prompt=_token_prompt(prefix, 2),
                                       max_tokens=long, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    time.sleep(0.5)
    gen_before = server.replicas()[victim]["generation_tokens"]
    client.completions.create(model=str(model_dir), prompt=_token_prompt(prefix, 3),
                              max_tokens=2, temperature=0)
    s = server.replicas()[victim]
    assert s["num_running"] == 0 and s["num_waiting"] == 0
    assert s["generation_tokens"] - gen_before < long // 2     # the long one stopped early

    # requests in flight on a replica that dies fail with a 5xx, quickly
    results = {}

    def blocking():
        try:
            client.completions.create(model=str(model_dir), prompt=_token_prompt(prefix, 4),
                                      max_tokens=long, temperature=0,
                                      extra_body={"ignore_eos": True})
            results["blocking"] = "finished"
        except openai.APIStatusError as exc:
            results["blocking"] = exc.status_code
    stream = client.completions.create(model=str(model_dir), prompt=_token_prompt(prefix, 5),
                                       max_tokens=long, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    t = threading.Thread(target=blocking)
    t.start()
    time.sleep(0.5)
    ray.kill(_replica_actor(victim), no_restart=True)
    t0 = time.monotonic()
    with pytest.raises(openai.APIError):
        for _ in chunks:
            pass
    t.join(60)
    assert not t.is_alive() and results["blocking"] == 503
    assert time.monotonic() - t0 < 30

    # the service keeps answering, and Serve brings a replacement up
    for k in range(4):
        r = client.completions.create(model=str(model_dir), prompt=f"after the kill {k}",
                                      max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
    from ray import serve
    deadline = time.monotonic() + 60
    while True:
        dep = serve.status().applications["pagedcy"].deployments["PagedcyEngine"]
        if dep.status == "HEALTHY" and dep.replica_states.get("RUNNING") == 2:
            break
        assert time.monotonic() < deadline, dep
        time.sleep(0.5)


def test_sigterm_drains_and_exits_0(server, client, model_dir):
    """Runs last: a request running when SIGTERM arrives still finishes; exit code 0."""
    result = {}

    def run():
        r = client.completions.create(model=str(model_dir), prompt="drain me", max_tokens=300,
                                      temperature=0, extra_body={"ignore_eos": True})
        result["reason"] = r.choices[0].finish_reason
    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    server.proc.terminate()
    assert server.proc.wait(90) == 0, server.log()
    t.join(30)
    assert result.get("reason") == "length"
