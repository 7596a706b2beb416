"""``python -m pagedcy serve --replicas 2`` as a real process on a local Ray cluster this
module starts, driven by the official ``openai`` client and checked against offline
``LLM.generate``; and the ``serve run`` app builder. The routing rules: test_routing.py.

The cluster: ``ray.init(num_cpus=2)`` here (shut down at the end); the server joins it with
``--ray-address``, so this process can kill a replica's actor. About a minute on 2 cores.
"""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from server_proc import free_port  # noqa: E402


def test_serve_run_builder_takes_the_serve_flags(tmp_path):
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


def test_init_ray_retries_only_a_start_that_timed_out(monkeypatch):
    from pagedcy.server import replicas
    calls = []

    def fake_init(**kw):
        calls.append(kw)
        if len(calls) <= failures:
            raise Exception(message)
        return "ctx"

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(replicas.time, "sleep", lambda s: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    message = "The current node timed out during startup. This could happen..."
    failures = 2
    assert replicas.init_ray(num_cpus=2, namespace="n") == "ctx" and len(calls) == 3
    assert calls[-1]["num_cpus"] == 2 and calls[-1]["namespace"] == "n"
    calls.clear()
    failures = 3
    with pytest.raises(Exception, match="timed out"):
        replicas.init_ray(num_cpus=2)
    assert len(calls) == 3
    calls.clear()
    message = "some other failure"
    failures = 1
    with pytest.raises(Exception, match="other"):
        replicas.init_ray(num_cpus=2)
    assert len(calls) == 1


# --- the server on Ray Serve ----------------------------------------------------------------

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
    from pagedcy.server.replicas import init_ray
    # init_ray puts this pagedcy on the workers' path and retries a start that times out
    ctx = init_ray(num_cpus=2, namespace="pagedcy-tests")
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
