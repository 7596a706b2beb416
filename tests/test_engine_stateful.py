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

from engine_helpers import ToyModel, run_alone
from pagedcy.engine import LLMEngine, SamplingParams

MODEL = ToyModel(seed=5)
PREFIX = list(range(10, 22))     # a shared prefix of 3 pages (page_size 4)
_alone = {}


def alone(prompt, params):
    """Token ids of each completion of the request run alone (memoised)."""
    return run_alone(MODEL, prompt, params, _alone)


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


# the falsifying example, as (own tokens, shared prefix?, kind, max_tokens) adds and aborts
_LIVELOCK = [("add", [0], True, "greedy", 1), ("abort", "r0"),
             ("add", [53, 0, 0, 24, 0, 20, 59, 50], False, "greedy", 8),
             ("add", [20, 0, 0, 0, 55, 58, 22, 56, 0, 17, 0, 37, 35, 42], True, "greedy", 8),
             ("add", [27], False, "greedy", 8), ("add", [14, 30], False, "greedy", 5),
             ("add", [24, 49, 51, 0, 59, 53, 37, 60, 0, 47], False, "greedy", 2),
             ("add", [37], False, "greedy", 3), ("add", [0, 26, 0], False, "greedy", 8),
             ("add", [33, 32], False, "greedy", 2),
             ("add", [12, 29, 39, 28, 38, 18, 18], True, "greedy", 7), ("abort", "r7"),
             ("abort", "r6"),
             ("add", [38, 33, 45, 47, 0, 30, 0, 56, 33, 28, 48, 58, 58, 0], False, "greedy", 5),
             ("add", [0, 29, 48, 33, 47, 49, 37, 20, 26, 56, 0, 36, 60, 57], False, "greedy", 8),
             ("abort", "r10"), ("add", [62, 40, 36], False, "greedy", 3),
             ("add", [38], False, "greedy", 1), ("abort", "r2"),
             ("add", [0, 0, 0, 0, 0], False, "greedy", 6), ("abort", "r1"), ("abort", "r13"),
             ("add", [0, 0], True, "seeded-n2", 8), ("add", [0, 0, 0], False, "seeded-n2", 8),
             ("add", [0] * 13, False, "greedy", 1), ("abort", "r12")]


def test_admission_leaves_room_for_copy_on_write():
    """Regression, the machine's falsifying example replayed: two n=2 requests just forked
    share the page each completion writes next, so the step needs two copy-on-write pages
    that the pool's free count does not show yet. Admitting a waiting 13-token prompt into
    them made every step fail at prepare_step, preempt the newcomer and admit it again."""
    eng = LLMEngine.from_model(MODEL, page_size=4, kv_cache_pages=10, max_num_batched_tokens=9,
                               preemption_mode="recompute", swap_pages=0, max_num_seqs=5,
                               enable_prefix_cache=True)
    reqs, n = {}, 0
    for op in _LIVELOCK:
        if op[0] == "abort":
            eng.abort_request(op[1])
            reqs.pop(op[1])
            continue
        _, own, shared, kind, max_tokens = op
        params = (SamplingParams(temperature=0, max_tokens=max_tokens) if kind == "greedy" else
                  SamplingParams(temperature=1.0, top_k=8, seed=0, max_tokens=max_tokens, n=2))
        reqs[f"r{n}"] = ((PREFIX if shared else []) + own, params)
        eng.add_request(f"r{n}", *reqs[f"r{n}"])
        n += 1
    done, steps = {}, 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = [c.token_ids for c in out.outputs]
        steps += 1
        assert steps < 500, "the engine stopped making progress"
    assert done == {rid: alone(*reqs[rid]) for rid in reqs}
