"""The server's own logic against a weightless engine that follows the LLMEngine interface:
in-process uvicorn on 127.0.0.1, the official openai client and raw httpx."""
import asyncio
import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from server_fake import FakeEngine, InProcessServer, expected_text  # noqa: E402
from server_proc import scrape as metrics, wait_for  # noqa: E402

from pagedcy.server.chat_template import ChatTemplate  # noqa: E402

MODEL = "fake-model"
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
            "{{ raise_exception('tool messages are not supported') }}{% endif %}"
            "<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def ids(text):
    return [ord(c) for c in text]


@pytest.fixture(scope="module")
def server():
    with InProcessServer(FakeEngine(), chat_template=ChatTemplate(
            TEMPLATE, {"bos_token": "\x02", "eos_token": "\x03"})) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def test_completion_text_and_usage(client):
    r = client.completions.create(model=MODEL, prompt="hello", max_tokens=7)
    assert r.choices[0].text == expected_text(ids("hello"), 7)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 7, 12)
    r = client.completions.create(model=MODEL, prompt=[104, 105], max_tokens=3, n=3, seed=4)
    assert [c.text for c in r.choices] == [expected_text([104, 105], 3, index=i, seed=4)
                                          for i in range(3)]
    assert r.usage.completion_tokens == 9


def test_stream_concatenates_to_the_full_text(client):
    full = client.completions.create(model=MODEL, prompt="stream me", max_tokens=20, n=2)
    chunks = list(client.completions.create(model=MODEL, prompt="stream me", max_tokens=20, n=2,
                                            stream=True, stream_options={"include_usage": True}))
    texts = ["", ""]
    reasons = [None, None]
    for ch in chunks[:-1]:
        assert len(ch.choices) == 1 and ch.usage is None
        c = ch.choices[0]
        texts[c.index] += c.text
        reasons[c.index] = c.finish_reason or reasons[c.index]
    assert texts == [c.text for c in full.choices]
    assert reasons == ["length", "length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    # token by token, except that a consumer that falls behind gets the tokens it missed at once
    assert all(c.choices[0].text for c in chunks[:-1])
    assert 2 <= len(chunks) - 1 <= 40


def test_stop_string(client):
    text = expected_text(ids("ab"), 10)
    stop = text[4:6]
    r = client.completions.create(model=MODEL, prompt="ab", max_tokens=10, stop=[stop])
    assert r.choices[0].text == text[:4]
    assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason == stop
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="ab", max_tokens=10, stop=stop, stream=True))
    assert streamed == text[:4]


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="lp", max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == list(r.choices[0].text)
    assert lp.token_logprobs == [-1.0] * 4
    assert lp.text_offset == [0, 1, 2, 3]
    assert all(len(t) == 2 and max(t.values()) == -1.0 for t in lp.top_logprobs)


def test_chat_renders_the_template(client, server):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"}]
    prompt = "\x02<system>sys\x03<user>hi there\x03<assistant>"
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6)
    assert r.choices[0].message.content == expected_text(ids(prompt), 6)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(prompt)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        r.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == len(prompt)
    # text parts of a list content are joined
    r2 = client.chat.completions.create(model=MODEL, max_tokens=6, messages=[
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}])
    assert r2.usage.prompt_tokens == len(prompt)


def test_chat_template_kwargs_may_set_add_generation_prompt(client):
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3,
                                       extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert r.usage.prompt_tokens == len("\x02<user>hi\x03")
    assert r.choices[0].message.content == expected_text(ids("\x02<user>hi\x03"), 3)


def test_chat_default_max_tokens_fills_the_context(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert r.usage.total_tokens == 256 and r.choices[0].finish_reason == "length"


BAD = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_body"),
    (json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), 422, None),
    (json.dumps({"prompt": 17}).encode(), 422, None),
    (json.dumps({"max_tokens": 3}).encode(), 422, None),
    (json.dumps({"prompt": "x", "model": "gpt-17"}).encode(), 404, "model_not_found"),
    (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400, None),
    (json.dumps({"prompt": "x", "max_tokens": -5}).encode(), 400, None),
    (json.dumps({"prompt": "x" * 250, "max_tokens": 7}).encode(), 400, "context_length_exceeded"),
    (json.dumps({"prompt": [5000]}).encode(), 400, None),
    (json.dumps({"prompt": ""}).encode(), 400, None),
    (json.dumps({"prompt": "x", "temperature": -1}).encode(), 400, None),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400, None),
    (json.dumps({"prompt": "x", "n": 0}).encode(), 400, None),
    (json.dumps({"prompt": "x", "stream": True, "max_tokens": 0}).encode(), 400, None),
    (json.dumps({"prompt": ["a", "b"]}).encode(), 422, None),
    (b'{"prompt": "x", "model": "\\ud800"}', 404, "model_not_found"),   # a lone surrogate
    (json.dumps({"prompt": "x", "n": 2**63}).encode(), 400, None),
    (json.dumps({"prompt": "x", "n": 20_000_000}).encode(), 400, None),
]


@pytest.mark.parametrize("body,status,code", BAD)
def test_bad_completion_input_then_good(server, client, body, status, code):
    r = httpx.post(server.base_url + "/v1/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    good = client.completions.create(model=MODEL, prompt="ok", max_tokens=2)
    assert good.choices[0].text == expected_text(ids("ok"), 2)


@pytest.mark.parametrize("body,status", [
    ({"messages": []}, 422),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400),          # raise_exception
    ({"messages": [{"content": "x"}]}, 422),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400),
    ({"messages": [{"role": "user", "content": "x" * 300}]}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "model": "other"}, 404),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2**40}, 400),
])
def test_bad_chat_input_then_good(server, client, body, status):
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    if status == 400 and body["messages"] and body["messages"][0].get("role") == "tool":
        assert "tool messages are not supported" in r.json()["error"]["message"]
    good = client.chat.completions.create(model=MODEL, max_tokens=2,
                                          messages=[{"role": "user", "content": "ok"}])
    assert good.choices[0].finish_reason == "length"


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.base_url + "/v1/models").json()["data"][0]["max_model_len"] == 256
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_no_chat_template_is_a_clear_400():
    with InProcessServer(FakeEngine()) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert c.completions.create(model=MODEL, prompt="x", max_tokens=1).choices[0].text


def test_api_key():
    with InProcessServer(FakeEngine(), api_key="s3cret") as s:
        for headers in ({}, {"Authorization": ""}, {"Authorization": "Basic s3cret"}):
            # the client refuses an empty key: "no key" is an empty Authorization header
            c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="wrong", max_retries=0,
                              default_headers=headers)
            with pytest.raises(openai.AuthenticationError):
                c.completions.create(model=MODEL, prompt="x", max_tokens=1)
            with pytest.raises(openai.AuthenticationError):
                c.models.list()
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert "s3cret" not in r.text
        assert httpx.get(s.base_url + "/health").status_code == 200
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="s3cret", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].text


def test_full_waiting_queue_gets_503_then_serves():
    engine = FakeEngine(max_num_seqs=1, step_delay=0.01)
    with InProcessServer(engine, max_waiting=2) as s:
        async def run():
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
            return await asyncio.gather(*[c.completions.create(model=MODEL, prompt="q", max_tokens=30)
                                          for _ in range(8)], return_exceptions=True)
        results = asyncio.run(run())
        busy = [r for r in results if isinstance(r, openai.APIStatusError)]
        ok = [r for r in results if not isinstance(r, Exception)]
        assert busy and all(e.status_code == 503 for e in busy)
        assert len(ok) + len(busy) == 8 and len(ok) >= 2
        assert all(r.choices[0].text == expected_text(ids("q"), 30) for r in ok)
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="q", max_tokens=2).choices[0].text
        assert metrics(s.base_url)["pagedcy_request_errors_total[503]"] == len(busy)


def test_disconnects_free_pages_and_spare_the_others():
    engine = FakeEngine(step_delay=0.005)
    with InProcessServer(engine) as s:
        async def run():
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)

            async def leaver(k):
                stream = await c.completions.create(model=MODEL, prompt=f"leave {k}",
                                                    max_tokens=200, stream=True)
                got = 0
                async for _ in stream:
                    got += 1
                    if got == 1 + k % 5:
                        break
                await stream.close()

            async def stayer(k):
                stream = await c.completions.create(model=MODEL, prompt=f"stay {k}",
                                                    max_tokens=60, stream=True)
                return "".join([ch.choices[0].text async for ch in stream])

            res = await asyncio.gather(*[leaver(k) for k in range(10)],
                                       *[stayer(k) for k in range(5)])
            return res[10:]
        texts = asyncio.run(run())
        assert texts == [expected_text(ids(f"stay {k}"), 60) for k in range(5)]
        assert wait_for(lambda: not engine.reqs)
        m = metrics(s.base_url)
        assert m["pagedcy_kv_pages_used"] == 0
        assert m["pagedcy_request_success_total[abort]"] == 10
        assert m["pagedcy_request_success_total[length]"] == 5


def test_metrics_count_what_was_sent():
    with InProcessServer(FakeEngine()) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        prompt_sum = completion_sum = 0
        for k in range(6):
            r = c.completions.create(model=MODEL, prompt="m" * (k + 1), max_tokens=k + 2,
                                     stream=bool(k % 2), **({"stream_options": {"include_usage": True}}
                                                            if k % 2 else {}))
            usage = list(r)[-1].usage if k % 2 else r.usage
            prompt_sum += usage.prompt_tokens
            completion_sum += usage.completion_tokens
        m = metrics(s.base_url)
        assert m["pagedcy_request_success_total[length]"] == 6
        assert m["pagedcy_prompt_tokens_total"] == prompt_sum == 21
        assert m["pagedcy_generation_tokens_total"] == completion_sum == 27
        assert m["pagedcy_request_prompt_tokens_total"] == prompt_sum
        assert m["pagedcy_request_generation_tokens_total"] == completion_sum
        assert m["pagedcy_time_to_first_token_seconds_count"] == 6
        assert m["pagedcy_time_per_output_token_seconds_count"] == 6
        assert m["pagedcy_num_requests_running"] == 0 and m["pagedcy_kv_pages_used"] == 0


def test_engine_runs_on_one_thread_and_the_loop_stays_free():
    gate = threading.Event()
    threads = set()

    class Gated(FakeEngine):
        def step(self):
            threads.add(threading.get_ident())
            gate.wait(10)
            return super().step()

        def add_request(self, *a):
            threads.add(threading.get_ident())
            return super().add_request(*a)

    engine = Gated()
    with InProcessServer(engine) as s:
        result = {}

        def call():
            c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
            result["r"] = c.completions.create(model=MODEL, prompt="g", max_tokens=3)

        t = threading.Thread(target=call)
        t.start()
        assert wait_for(lambda: engine.reqs)
        # the engine thread is blocked inside step(): the event loop still answers
        assert httpx.get(s.base_url + "/health", timeout=5).status_code == 200
        assert metrics(s.base_url)["pagedcy_num_requests_running"] in (0, 1)
        gate.set()
        t.join(10)
        assert result["r"].choices[0].text == expected_text(ids("g"), 3)
        assert threads == {s.async_engine._thread.ident}


def test_engine_failure_fails_its_requests_only():
    engine = FakeEngine()
    with InProcessServer(engine) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        engine.fail_next_step = True
        with pytest.raises(openai.InternalServerError):
            c.completions.create(model=MODEL, prompt="x", max_tokens=3)
        assert c.completions.create(model=MODEL, prompt="x", max_tokens=3).choices[0].text
        assert not engine.reqs


def test_stop_accepting_aborts_running_streams():
    engine = FakeEngine(step_delay=0.01)
    with InProcessServer(engine) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        stream = c.completions.create(model=MODEL, prompt="x", max_tokens=200, stream=True)
        first = next(iter(stream))
        s.async_engine.stop_accepting()
        rest = list(stream)
        assert rest[-1].choices[0].finish_reason == "abort"
        assert len(first.choices[0].text + "".join(r.choices[0].text for r in rest)) < 200
        assert wait_for(lambda: not engine.reqs)
        with pytest.raises(openai.InternalServerError) as info:
            c.completions.create(model=MODEL, prompt="x", max_tokens=3)
        assert info.value.status_code == 503


def test_a_crashed_engine_thread_fails_requests_instead_of_hanging():
    engine = FakeEngine()
    with InProcessServer(engine) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].text

        def broken_stats():
            raise SystemError("stats broke")
        engine.stats = broken_stats
        with pytest.raises(openai.InternalServerError) as info:
            c.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert info.value.status_code == 500
        assert wait_for(lambda: not s.async_engine.is_alive())
        assert httpx.get(s.base_url + "/health").status_code == 503
        with pytest.raises(openai.InternalServerError) as info:
            c.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert info.value.status_code == 503


def test_engine_refusal_other_than_bad_input_is_a_500():
    class Refusing(FakeEngine):
        def add_request(self, *a):
            raise MemoryError("no room")

    with InProcessServer(Refusing()) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError, match="no room"):
                c.completions.create(model=MODEL, prompt="x", max_tokens=2, stream=stream)
        assert httpx.get(s.base_url + "/health").status_code == 200


def test_bench_serve_metrics_follow_vllm_definitions():
    from pagedcy.tools.bench_serve import summarize, workload
    # (ttft, latency, output tokens) per request, as benchmark_serving measures them
    results = [(0.5, 2.5, 5), (1.0, 1.0, 1), (0.25, 4.25, 9)]
    s = summarize(results, duration=4.0)
    assert s["req_s"] == 3 / 4.0 and s["tok_s"] == 15 / 4.0
    assert s["ttft_p50"] == pytest.approx(500.0)
    # TPOT = (latency - ttft) / (tokens - 1), requests with one token left out
    assert s["tpot_p50"] == pytest.approx(500.0)
    assert s["tpot_p99"] == pytest.approx(500.0)
    prompts = workload(50, vocab=1000, seed=3, min_len=128, max_len=1024)
    assert all(128 <= len(p) <= 1024 and max(p) < 1000 for p in prompts)
    assert prompts == workload(50, vocab=1000, seed=3)


def test_a_bug_mid_stream_ends_that_stream_with_an_error_event():
    class BadIndex(FakeEngine):
        def step(self):
            outs = super().step()
            for o in outs:
                if o.request_id in self.broken:
                    o.outputs[0].index = 7          # no such choice: the tracker fails
            return outs

    engine = BadIndex()
    engine.broken = set()
    orig_add = engine.add_request

    def add(rid, prompt, params):
        orig_add(rid, prompt, params)
        if params.max_tokens == 5:
            engine.broken.add(rid)
    engine.add_request = add
    with InProcessServer(engine) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="internal error"):
            list(c.completions.create(model=MODEL, prompt="x", max_tokens=5, stream=True))
        assert wait_for(lambda: not engine.reqs)          # the broken request was aborted
        r = c.completions.create(model=MODEL, prompt="x", max_tokens=4)
        assert r.choices[0].text == expected_text(ids("x"), 4)


def test_closing_a_stream_that_never_started_aborts_its_request():
    """The client can leave between the first output and the response's first byte: the
    event iterator is then closed without ever being iterated."""
    from pagedcy.server.async_engine import AsyncEngine
    from pagedcy.server.serving import RequestRunner
    from pagedcy.server.tracker import RequestTracker
    from pagedcy.engine import SamplingParams

    class Request:                      # a client that stays (until the iterator is closed)
        async def receive(self):
            await asyncio.sleep(3600)

    engine = FakeEngine(step_delay=0.02)     # 100 tokens take 2 s

    async def run():
        ae = AsyncEngine(engine)
        ae.start()
        try:
            finished = []
            runner = RequestRunner(ae, [MODEL])
            runner._finish = finished.append
            tracker = RequestTracker(1, 2)
            events = await runner.stream("r1", [104, 105], SamplingParams(max_tokens=100),
                                         tracker, Request(), lambda deltas: [], None, False)
            assert "r1" in engine.reqs
            await events.aclose()                       # never iterated
            assert finished == [tracker] and tracker.finish_reasons == ["abort"]
            for _ in range(100):
                if "r1" not in engine.reqs:
                    break
                await asyncio.sleep(0.02)
            assert "r1" not in engine.reqs
        finally:
            ae.shutdown()
    asyncio.run(run())


def test_a_non_streaming_client_that_leaves_aborts_its_request():
    engine = FakeEngine(step_delay=0.02)
    with InProcessServer(engine) as s:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 200},
                       timeout=0.5)
        assert wait_for(lambda: not engine.reqs)       # aborted long before 200 tokens
        assert wait_for(lambda: metrics(s.base_url).get("pagedcy_request_success_total[abort]") == 1)
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="x", max_tokens=3).choices[0].text


def test_chat_logprobs_and_n(client):
    msgs = [{"role": "user", "content": "lp"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, n=2,
                                       logprobs=True, top_logprobs=2)
    assert len(r.choices) == 2 and r.choices[0].message.content != r.choices[1].message.content
    for ch in r.choices:
        content = ch.logprobs.content
        assert "".join(t.token for t in content) == ch.message.content
        assert all(t.logprob == -1.0 and len(t.top_logprobs) == 2 for t in content)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, n=2,
                                                 stream=True))
    texts = ["", ""]
    for c in chunks:
        texts[c.choices[0].index] += c.choices[0].delta.content or ""
    assert texts == [ch.message.content for ch in r.choices]


def test_infinite_logprobs_are_sent_as_json_numbers():
    class InfLogprobs(FakeEngine):
        def step(self):
            outs = super().step()
            for o in outs:
                for c in o.outputs:
                    if c.logprobs:
                        c.logprobs = [{t: float("-inf"), 5: float("nan")} for t in c.token_ids]
            return outs

    with InProcessServer(InfLogprobs()) as s:
        r = httpx.post(s.base_url + "/v1/completions",
                       json={"prompt": "x", "max_tokens": 2, "logprobs": 2})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["logprobs"]["token_logprobs"] == [-9999.0, -9999.0]


@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "bfloat16", "int8"])
def test_engine_options_take_every_kv_dtype(kv_dtype):
    import argparse

    from pagedcy.server.launch import add_engine_arguments, engine_kwargs
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    assert engine_kwargs(p.parse_args(["--kv-dtype", kv_dtype]))["kv_dtype"] == kv_dtype
    with pytest.raises(SystemExit):
        p.parse_args(["--kv-dtype", "int4"])


def test_abort_ends_that_requests_stream():
    # AsyncEngine.abort(request_id) used to drop the stream without a last item, so the
    # request's generate() waited forever.
    from engine_helpers import ToyModel
    from pagedcy.engine import LLMEngine, SamplingParams
    from pagedcy.server.async_engine import Aborted, AsyncEngine

    async def main():
        ae = AsyncEngine(LLMEngine.from_model(ToyModel(), page_size=4, kv_cache_pages=64))
        ae.start()
        try:
            items = []

            async def consume():
                async for out in ae.generate("r1", {"prompt_token_ids": [1, 2, 3]},
                                             SamplingParams(temperature=0.0, max_tokens=200)):
                    items.append(out)
                    if len(items) == 1:
                        ae.abort("r1")

            await asyncio.wait_for(consume(), 30)
            assert isinstance(items[-1], Aborted) and items[-1].request_id == "r1"
            assert not ae.engine.has_unfinished_requests()
        finally:
            ae.shutdown()

    asyncio.run(main())
