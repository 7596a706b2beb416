"""A weightless engine that follows the LLMEngine interface (interfaces.md section 3), and an
in-process uvicorn server on 127.0.0.1 around it: fast tests of the server's own logic
(errors, auth, streaming deltas, disconnects, queue limits, metrics) without a model.

The fake "model" is character-level: token id = a character code (< 128). Request r's
choice i generates the characters of ``CYCLE`` starting at ``(sum(prompt) + i + seed) % 26``;
one token per running request per step; ``step_delay`` seconds per step.
"""
import asyncio
import math
import threading
import time

from pagedcy.engine import CompletionOutput, EngineStats, RequestOutput

CYCLE = "abcdefghijklmnopqrstuvwxyz"
EOS = 3


class FakeTokenizer:
    chat_template = None
    eos_token = "\x03"
    bos_token = "\x02"

    def encode(self, text, add_special_tokens=True):
        if not isinstance(text, str):
            raise TypeError("text must be a str")
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class FakeModelConfig:
    max_position_embeddings = 256
    vocab_size = 128
    eos_token_ids = (EOS,)


class _Req:
    def __init__(self, rid, prompt_ids, params, prompt):
        self.rid, self.prompt_ids, self.params, self.prompt = rid, prompt_ids, params, prompt
        base = sum(prompt_ids) + (params.seed or 0)
        self.starts = [(base + i) % 26 for i in range(params.n)]
        self.tokens = [[] for _ in range(params.n)]
        self.texts = [""] * params.n
        self.finish = [None] * params.n
        self.stop_reason = [None] * params.n


def expected_text(prompt_ids, max_tokens, *, index=0, seed=None):
    """What the fake engine generates for a prompt (no stop strings)."""
    start = (sum(prompt_ids) + (seed or 0) + index) % 26
    return "".join(CYCLE[(start + k) % 26] for k in range(max_tokens))


class FakeEngine:
    """Follows LLMEngine's public interface; ``max_num_seqs`` requests run, the rest wait."""

    def __init__(self, *, max_num_seqs=256, page_size=4, kv_pages=4096, step_delay=0.0):
        self.tokenizer = FakeTokenizer()
        self.model_config = FakeModelConfig()
        self.model_dir = "fake"
        self.max_num_seqs = max_num_seqs
        self.max_model_len = self.model_config.max_position_embeddings
        self.page_size = page_size
        self.kv_pages = kv_pages
        self.step_delay = step_delay
        self.reqs = {}
        self.order = []
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.fail_next_step = False

    def add_request(self, request_id, prompt, params):
        if not isinstance(request_id, str):
            raise TypeError("request_id must be a str")
        if isinstance(prompt, dict):
            ids = list(prompt["prompt_token_ids"])
            text = None
        elif isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
        else:
            ids, text = list(prompt), None
        if not ids:
            raise ValueError("empty prompt")
        if any(not 0 <= t < self.model_config.vocab_size for t in ids):
            raise ValueError("token id out of vocabulary")
        if request_id in self.reqs:
            raise ValueError(f"duplicate request id {request_id}")
        if len(ids) + (params.max_tokens or 0) > self.model_config.max_position_embeddings:
            raise ValueError("prompt + max_tokens exceeds max_position_embeddings")
        self.reqs[request_id] = _Req(request_id, ids, params, text)
        self.order.append(request_id)

    def abort_request(self, request_id):
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if self.reqs.pop(rid, None) is not None:
                self.order.remove(rid)

    def has_unfinished_requests(self):
        return bool(self.reqs)

    def get_num_unfinished_requests(self):
        return len(self.reqs)

    def _pages(self, r):
        return sum(math.ceil((len(r.prompt_ids) + len(t)) / self.page_size) for t in r.tokens)

    def stats(self):
        running = self.order[:self.max_num_seqs]
        used = sum(self._pages(self.reqs[rid]) for rid in running)
        return EngineStats(num_running=len(running), num_waiting=len(self.order) - len(running),
                           num_swapped=0, kv_pages_total=self.kv_pages, kv_pages_used=used,
                           kv_pages_free=self.kv_pages - used, prefix_cache_queries=0,
                           prefix_cache_hits=0, num_preemptions=self.preemptions,
                           prompt_tokens=self.prompt_tokens,
                           generation_tokens=self.generation_tokens)

    def step(self):
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("injected failure")
        if self.step_delay:
            time.sleep(self.step_delay)
        outs = []
        for rid in list(self.order[:self.max_num_seqs]):
            r = self.reqs[rid]
            if not any(r.tokens):
                self.prompt_tokens += len(r.prompt_ids)
            p = r.params
            for i in range(p.n):
                if r.finish[i] is not None:
                    continue
                tok = ord(CYCLE[(r.starts[i] + len(r.tokens[i])) % 26])
                r.tokens[i].append(tok)
                self.generation_tokens += 1
                text = self.tokenizer.decode(r.tokens[i])
                for s in p.stop:
                    if s in text:
                        r.finish[i], r.stop_reason[i] = "stop", s
                        text = text[:text.index(s)]
                if r.finish[i] is None and len(r.tokens[i]) >= p.max_tokens:
                    r.finish[i] = "length"
                if r.finish[i] is None:      # hold back a possible start of a stop string
                    held = max((k for st in p.stop for k in range(1, len(st))
                                if text.endswith(st[:k])), default=0)
                    text = text[:len(text) - held]
                r.texts[i] = text
            done = all(f is not None for f in r.finish)
            comps = [CompletionOutput(i, r.texts[i], list(r.tokens[i]), None,
                                      [{t: -1.0, (t + 1) % 128: -2.0} for t in r.tokens[i]]
                                      if p.logprobs is not None else None,
                                      r.finish[i], r.stop_reason[i]) for i in range(p.n)]
            outs.append(RequestOutput(rid, r.prompt, list(r.prompt_ids), comps, done))
            if done:
                self.abort_request(rid)
        return outs


from pagedcy.tools.ports import free_port  # noqa: E402,F401  (re-exported for the tests)


class InProcessServer:
    """uvicorn on 127.0.0.1 in a thread, serving ``build_app(AsyncEngine(engine), ...)``."""

    def __init__(self, engine, *, max_waiting=None, api_key=None, chat_template=None):
        import uvicorn
        from pagedcy.server.app import build_app
        from pagedcy.server.async_engine import AsyncEngine
        self.engine = engine
        self.async_engine = AsyncEngine(engine, max_waiting=max_waiting)
        self.app = build_app(self.async_engine, model_names=["fake-model"],
                             chat_template=chat_template, api_key=api_key)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.run(self.server.serve())

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("in-process server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(20)
