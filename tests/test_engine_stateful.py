"""A hypothesis state machine drives an engine over a small pool with random add / abort /
step sequences (tiny stand-in model, random budgets, preemption modes and swap sizes).

Invariants: the manager's page ownership holds after every call; every request that is not
aborted finishes exactly once; nothing is output for a request after it finished or was
aborted; once all finish no page is held; and every finished request's tokens equal those
of the same request run alone on a roomy engine."""
import numpy as np
import pytest
from hypothesis import settings, strategies as st, HealthCheck
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine_helpers import ToyModel
from pagedcy.engine import LLMEngine, SamplingParams

MODEL = ToyModel(seed=5)
PREFIX = list(range(10, 22))     # a shared prefix of 3 pages (page_size 4)
_alone = {}


def alone(prompt, params):
    """Token ids of each completion of the request run alone (memoised)."""
    key = (tuple(prompt), params)
    if key not in _alone:
        eng = LLMEngine.from_model(MODEL, page_size=4, kv_cache_pages=64)
        eng.add_request("x", prompt, params)
        out = None
        while eng.has_unfinished_requests():
            for o in eng.step():
                out = o
        _alone[key] = [c.token_ids for c in out.outputs]
    return _alone[key]


class EngineMachine(RuleBasedStateMachine):
    @initialize(pages=st.integers(8, 24), budget=st.integers(1, 16),
                mode=st.sampled_from(["recompute", "swap"]), swap=st.sampled_from([0, 6, 40]),
                max_seqs=st.integers(1, 5), prefix_cache=st.booleans())
    def setup(self, pages, budget, mode, swap, max_seqs, prefix_cache):
        self.engine = LLMEngine.from_model(
            MODEL, page_size=4, kv_cache_pages=pages, max_num_batched_tokens=budget,
            preemption_mode=mode, swap_pages=swap, max_num_seqs=max_seqs,
            enable_prefix_cache=prefix_cache)
        self.requests = {}      # id -> (prompt, params)
        self.live = set()
        self.aborted = set()
        self.finished = {}
        self.n = 0

    @rule(own=st.lists(st.integers(0, 63), min_size=1, max_size=14), shared=st.booleans(),
          max_tokens=st.integers(1, 8), kind=st.sampled_from(["greedy", "seeded", "seeded-n2"]),
          seed=st.integers(0, 3))
    def add(self, own, shared, max_tokens, kind, seed):
        prompt = (PREFIX if shared else []) + own
        if kind == "greedy":
            params = SamplingParams(temperature=0, max_tokens=max_tokens)
        else:
            params = SamplingParams(temperature=1.0, top_k=8, seed=seed, max_tokens=max_tokens,
                                    n=2 if kind == "seeded-n2" else 1)
        rid = f"r{self.n}"
        self.n += 1
        pages_needed = -(-(len(prompt) + max_tokens) // 4)
        if params.n > self.engine.scheduler.max_num_seqs \
                or pages_needed > self.engine.manager.total_blocks():
            with pytest.raises(ValueError):
                self.engine.add_request(rid, prompt, params)
            return
        self.engine.add_request(rid, prompt, params)
        self.requests[rid] = (prompt, params)
        self.live.add(rid)

    @rule()
    def step(self):
        for out in self.engine.step():
            rid = out.request_id
            assert rid in self.live, f"output for {rid} after it ended"
            if out.finished:
                self.live.discard(rid)
                self.finished[rid] = out

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.engine.abort_request(rid)
        self.live.discard(rid)
        self.aborted.add(rid)

    @invariant()
    def pages_are_owned(self):
        self.engine.manager.check_invariants()
        assert self.engine.get_num_unfinished_requests() == len(self.live)

    def teardown(self):
        eng = self.engine
        steps = 0
        while self.live:
            self.step()
            steps += 1
            assert steps < 5000, "the engine stopped making progress"
        assert not eng.has_unfinished_requests() and eng.step() == []
        assert set(self.finished) | self.aborted == set(self.requests)
        s = eng.manager.stats()
        assert s.used_blocks == 0 and s.num_handles == 0 and s.swap_used_blocks == 0
        for rid, out in self.finished.items():
            prompt, params = self.requests[rid]
            assert [c.token_ids for c in out.outputs] == alone(prompt, params), rid
            assert all(c.finish_reason == "length" for c in out.outputs)


EngineMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30,
                                           deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestEngineMachine = EngineMachine.TestCase
