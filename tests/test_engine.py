"""LLMEngine on a tiny stand-in model (tests/engine_helpers.py): continuous batching,
chunked prefill, prefix cache, preemption, n > 1, sampling, stops, logprobs, abort and
bad input. The outputs are checked against the model run alone without any cache."""
import numpy as np
import pytest

from engine_helpers import ToyModel
from pagedcy.engine import EngineStats, LLMEngine, RequestOutput, SamplingParams
from pagedcy.engine.sampler import log_softmax
from pagedcy.tools.demo import leak_report

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def make(model=None, **kw):
    kw.setdefault("page_size", 4)
    kw.setdefault("kv_cache_pages", 256)
    return LLMEngine.from_model(model or ToyModel(), **kw)


def run(engine, requests, between=None):
    """Add ``requests`` [(id, prompt, params)], step until done; returns {id: final
    RequestOutput}. Checks every output stream: cumulative, text prefixes, one final."""
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    final, last = {}, {}
    steps = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        steps += 1
        assert steps < 10_000
        for out in outs:
            assert isinstance(out, RequestOutput)
            assert out.request_id not in final, "output after the request finished"
            prev = last.get(out.request_id)
            if prev is not None:
                for a, b in zip(prev.outputs, out.outputs):
                    assert b.text.startswith(a.text)
                    assert b.token_ids[:len(a.token_ids)] == a.token_ids
            last[out.request_id] = out
            if out.finished:
                final[out.request_id] = out
        if between is not None:
            between(engine, steps)
    return final


def assert_no_leak(engine):
    assert leak_report(engine) == ""


def random_prompts(seed, n, lo=1, hi=30, vocab=64, prefix=0):
    rng = np.random.default_rng(seed)
    pre = rng.integers(0, vocab, prefix).tolist()
    return [pre + rng.integers(0, vocab, int(k)).tolist() for k in rng.integers(lo, hi, n)]


@pytest.mark.parametrize("options", [
    dict(),
    dict(kv_cache_pages=14, max_num_batched_tokens=7),                      # recompute
    dict(kv_cache_pages=14, max_num_batched_tokens=7, preemption_mode="swap",
         swap_pages=64),
    dict(kv_cache_pages=14, max_num_batched_tokens=5, preemption_mode="swap",
         swap_pages=6),                                                     # swap pool full
    dict(max_num_seqs=3, max_num_batched_tokens=1),                         # 1 token per step
])
def test_greedy_batch_equals_each_prompt_alone(options):
    model = ToyModel()
    prompts = random_prompts(1, 10, prefix=5)
    eng = make(model, **options)
    final = run(eng, [(str(i), p, GREEDY) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        out = final[str(i)].outputs[0]
        assert out.token_ids == model.reference_greedy(p, 12), i
        assert out.finish_reason == "length" and out.stop_reason is None
        assert final[str(i)].prompt_token_ids == p
    st = eng.stats()
    assert isinstance(st, EngineStats)
    assert st.generation_tokens == 120 and st.num_running == st.num_waiting == 0
    if options.get("kv_cache_pages") == 14:
        assert st.num_preemptions > 0
        assert st.peak_kv_pages_used <= 14
    if options.get("swap_pages") == 64:
        assert eng.manager.stats().swap_outs > 0
    assert_no_leak(eng)


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    model = ToyModel()
    prompt = random_prompts(2, 1, 40, 41)[0]
    eng = make(model, max_num_batched_tokens=6)
    eng.add_request("long", prompt, GREEDY)
    steps = 0
    while True:
        outs = eng.step()
        steps += 1
        if outs:
            break
    assert steps == -(-40 // 6) and model.calls == steps
    assert outs[0].outputs[0].token_ids == model.reference_greedy(prompt, 1)


def test_decodes_run_with_prefill_chunks_in_one_forward():
    model = ToyModel()
    eng = make(model, max_num_batched_tokens=8)
    eng.add_request("short", [1, 2, 3], GREEDY)
    eng.step()                                   # prefill of "short"
    eng.add_request("long", list(range(30)), GREEDY)
    calls = model.calls
    outs = eng.step()                            # decode row of "short" + first chunk of "long"
    assert model.calls == calls + 1
    assert [o.request_id for o in outs] == ["short"]
    assert eng.scheduler.running[1].num_computed == 7    # budget 8 minus the decode row


def test_prefix_cache_second_pass_hits_and_gives_the_same_tokens():
    model = ToyModel()
    prompts = random_prompts(3, 8, 1, 10, prefix=13)
    eng = make(model, kv_cache_pages=64)
    reqs = [(f"a{i}", p, GREEDY) for i, p in enumerate(prompts)]
    first = run(eng, reqs)
    hits = eng.stats().prefix_cache_hits
    second = run(eng, [("b" + r[1:], p, s) for r, p, s in reqs])
    assert eng.stats().prefix_cache_hits > hits
    assert any(o.num_cached_tokens > 0 for o in second.values())
    for i, p in enumerate(prompts):
        want = model.reference_greedy(p, 12)
        assert first[f"a{i}"].outputs[0].token_ids == want
        assert second[f"b{i}"].outputs[0].token_ids == want
    assert_no_leak(eng)


@pytest.mark.parametrize("budget", [64, 6])          # whole prompts, or chunked prefill
def test_requests_arriving_together_compute_a_shared_prefix_once(budget):
    model = ToyModel()
    prompts = random_prompts(5, 4, 3, 9, prefix=17)       # 4 full shared pages, own tails
    other = random_prompts(6, 1, 20, 21)[0]              # shares nothing: never held back
    eng = make(model, kv_cache_pages=64, max_num_batched_tokens=budget)
    reqs = [(f"a{i}", p, GREEDY) for i, p in enumerate(prompts)]
    eng.add_request(*reqs[0])
    eng.add_request(*reqs[1])
    eng.add_request("other", other, GREEDY)
    first = eng.step()
    running = {s.request.request_id for s in eng.scheduler.running}
    assert "a1" not in running                           # waits for a0's shared pages
    assert ("other" in running) == (budget == 64)        # the budget is a0's when chunked
    out = run(eng, reqs[2:])
    out.update({o.request_id: o for o in first if o.finished})
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o
    for rid, p in [*((r, p) for r, p, _ in reqs), ("other", other)]:
        assert out[rid].outputs[0].token_ids == model.reference_greedy(p, 12)
    assert [out[f"a{i}"].num_cached_tokens for i in range(4)] == [0, 16, 16, 16]
    assert eng.stats().prompt_tokens == sum(len(p) for p in prompts) + len(other) - 3 * 16
    assert_no_leak(eng)


def test_prefix_cache_off():
    eng = make(enable_prefix_cache=False)
    prompts = random_prompts(3, 4, prefix=13)
    run(eng, [(str(i), p, GREEDY) for i, p in enumerate(prompts)])
    run(eng, [(f"x{i}", p, GREEDY) for i, p in enumerate(prompts)])
    assert eng.stats().prefix_cache_hits == 0


def sampled(seed, **kw):
    return SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=seed, max_tokens=10, **kw)


def test_seeded_sampling_is_independent_of_the_batch():
    model = ToyModel()
    prompt = random_prompts(4, 1)[0]
    alone = run(make(model), [("s", prompt, sampled(7))])["s"].outputs[0].token_ids
    others = [(f"o{i}", p, sampled(None) if i % 2 else GREEDY)
              for i, p in enumerate(random_prompts(5, 9))]
    busy = run(make(model, kv_cache_pages=20, max_num_batched_tokens=9),
               others[:4] + [("s", prompt, sampled(7))] + others[4:])
    assert busy["s"].outputs[0].token_ids == alone
    other_seed = run(make(model), [("s", prompt, sampled(8))])["s"].outputs[0].token_ids
    assert other_seed != alone        # 10 draws over ~20 tokens: a collision is ~impossible


def test_unseeded_sampling_follows_the_engine_seed():
    model = ToyModel()
    prompts = random_prompts(6, 3)

    def go(seed):
        eng = make(model, seed=seed)
        res = run(eng, [(str(i), p, sampled(None)) for i, p in enumerate(prompts)])
        return [res[str(i)].outputs[0].token_ids for i in range(3)]

    assert go(1) == go(1)
    assert go(1) != go(2)


def test_n_completions_fork_the_prompt_pages():
    model = ToyModel()
    prompt = random_prompts(7, 1, 9, 10)[0]      # 9 tokens: the last page is shared, partly full
    eng = make(model)
    out = run(eng, [("g", prompt, SamplingParams(n=3, temperature=0, max_tokens=6))])["g"]
    want = model.reference_greedy(prompt, 6)
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(o.token_ids == want for o in out.outputs)
    ms = eng.manager.stats()
    assert ms.forks == 2 and ms.cow_copies >= 2
    assert eng.stats().prompt_tokens == 9                  # the prompt was computed once
    eng2 = make(model)
    p = sampled(11, n=4)
    a = run(eng2, [("r", prompt, p)])["r"]
    b = run(make(model, kv_cache_pages=12, max_num_batched_tokens=4),
            [("x", random_prompts(8, 1)[0], GREEDY), ("r", prompt, p)])["r"]
    seqs = [o.token_ids for o in a.outputs]
    assert seqs == [o.token_ids for o in b.outputs]
    assert len({tuple(s) for s in seqs}) > 1           # different streams per completion
    assert_no_leak(eng2)


def test_greedy_n_completions_beside_a_partial_prefill():
    # The greedy n=2 request finishes its prompt and forks in the step where another
    # prompt only gets a chunk: rows [0, 0] are as many as the batch, yet not 0..B-1.
    model = ToyModel()
    prompt, long_prompt = random_prompts(12, 1, 5, 6)[0], random_prompts(13, 1, 30, 31)[0]
    want = model.reference_greedy(prompt, 5)
    for other in (GREEDY, sampled(1)):
        out = run(make(model, max_num_batched_tokens=9),
                  [("g", prompt, SamplingParams(n=2, temperature=0, max_tokens=5)), ("x", long_prompt, other)])
        assert [o.token_ids for o in out["g"].outputs] == [want] * 2


def test_stop_token_ids_eos_and_ignore_eos():
    prompt = random_prompts(9, 1)[0]
    ref = ToyModel().reference_greedy(prompt, 12)
    k = next(i for i in range(2, 12) if ref[i] not in ref[:i])
    t = ref[k]
    out = run(make(), [("a", prompt, SamplingParams(temperature=0, max_tokens=12,
                                                    stop_token_ids=[t]))])["a"].outputs[0]
    assert out.token_ids == ref[:k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", t)
    eos_model = ToyModel(eos_token_ids=(t,))
    out = run(make(eos_model), [("a", prompt, GREEDY)])["a"].outputs[0]
    assert out.token_ids == ref[:k + 1] and (out.finish_reason, out.stop_reason) == ("stop", None)
    out = run(make(eos_model), [("a", prompt, SamplingParams(temperature=0, max_tokens=12,
                                                             ignore_eos=True))])["a"].outputs[0]
    assert out.token_ids == ref and out.finish_reason == "length"


def test_logprobs_are_the_log_softmax_of_the_raw_logits():
    model = ToyModel()
    prompt = random_prompts(10, 1)[0]
    params = SamplingParams(temperature=0.7, top_k=5, seed=3, max_tokens=8, logprobs=3)
    out = run(make(model), [("a", prompt, params)])["a"].outputs[0]
    _, logits = model.reference(prompt, 8, tokens=out.token_ids)
    assert len(out.logprobs) == 8
    total = 0.0
    for tok, entry, lg in zip(out.token_ids, out.logprobs, logits):
        ref = log_softmax(lg)
        top = np.argsort(-ref)[:3].tolist()
        assert set(entry) == set(top) | {tok}
        for t, v in entry.items():
            assert v == pytest.approx(ref[t], abs=2e-3)
        total += entry[tok]
    assert out.cumulative_logprob == pytest.approx(total)
    plain = run(make(model), [("a", prompt, GREEDY)])["a"].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None
    zero = run(make(model), [("a", prompt, SamplingParams(temperature=0, max_tokens=3,
                                                          logprobs=0))])["a"].outputs[0]
    assert [list(e) for e in zero.logprobs] == [[t] for t in zero.token_ids]


def test_abort_frees_pages_and_leaves_the_others_alone():
    model = ToyModel()
    prompts = random_prompts(11, 4, 10, 20)
    eng = make(model, kv_cache_pages=40)
    final = {}

    def abort_at_3(engine, step):
        if step == 3:
            used = engine.manager.used_blocks()
            engine.abort_request("1")
            assert engine.manager.used_blocks() < used
            engine.abort_request(["2", "nope", 5])      # unknown ids are ignored
            engine.abort_request(17)
            assert engine.get_num_unfinished_requests() == 2

    final = run(eng, [(str(i), p, GREEDY) for i, p in enumerate(prompts)], abort_at_3)
    assert set(final) == {"0", "3"}
    for i in (0, 3):
        assert final[str(i)].outputs[0].token_ids == model.reference_greedy(prompts[i], 12)
    assert_no_leak(eng)
    eng.add_request("w", prompts[0], GREEDY)           # aborting a waiting request
    eng.abort_request("w")
    assert not eng.has_unfinished_requests() and eng.step() == []
    assert_no_leak(eng)


BAD_REQUESTS = [
    ("", GREEDY, ValueError, "empty"),
    ([], GREEDY, ValueError, "empty"),
    ({"prompt_token_ids": []}, GREEDY, ValueError, "empty"),
    ([1, 64], GREEDY, ValueError, "vocabulary"),
    ([-1, 3], GREEDY, ValueError, "vocabulary"),
    ([1.0, 2.0], GREEDY, TypeError, "integers"),
    ([1, True], GREEDY, TypeError, "bool"),
    ([[1, 2]], GREEDY, TypeError, "flat"),
    ("some text", GREEDY, ValueError, "tokenizer"),
    ({"foo": 1}, GREEDY, ValueError, "prompt_token_ids"),
    (12, GREEDY, TypeError, "prompt"),
    (list(range(60)) * 9, GREEDY, ValueError, "context"),
    ([1, 2], SamplingParams(max_tokens=511), ValueError, "context"),
    ([1, 2], SamplingParams(max_tokens=None, stop="x"), ValueError, "tokenizer"),
    ([1, 2], SamplingParams(n=9), ValueError, "max_num_seqs"),
    ([1, 2], "greedy", TypeError, "SamplingParams"),
]


def test_bad_requests_are_rejected_and_the_batch_completes_unchanged():
    model = ToyModel()
    prompts = random_prompts(12, 6)
    reqs = [(str(i), p, GREEDY) for i, p in enumerate(prompts)]
    clean = run(make(model, max_num_seqs=8, kv_cache_pages=30), reqs)
    eng = make(model, max_num_seqs=8, kv_cache_pages=30)

    def attack(engine, step):
        if step != 2:
            return
        for prompt, params, exc, word in BAD_REQUESTS:
            with pytest.raises(exc, match=word):
                engine.add_request("bad", prompt, params)
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request("0", [1, 2], GREEDY)
        with pytest.raises(TypeError, match="request_id"):
            engine.add_request(7, [1, 2], GREEDY)
        with pytest.raises(ValueError, match="KV pool"):   # 130 tokens > 30 pages of 4
            engine.add_request("big", [1] * 100, SamplingParams(max_tokens=30))
        assert engine.get_num_unfinished_requests() == 6

    final = run(eng, reqs, attack)
    for rid, out in clean.items():
        assert final[rid].outputs == out.outputs
    assert_no_leak(eng)


@pytest.mark.parametrize("kwargs, exc", [
    (dict(max_tokens=0), ValueError), (dict(max_tokens=-3), ValueError),
    (dict(max_tokens=2.5), TypeError), (dict(n=0), ValueError),
    (dict(temperature=-0.1), ValueError), (dict(temperature=float("nan")), ValueError),
    (dict(temperature="hot"), TypeError), (dict(top_p=0.0), ValueError),
    (dict(top_p=1.5), ValueError), (dict(top_k=-2), ValueError), (dict(min_p=1.2), ValueError),
    (dict(seed=-1), ValueError), (dict(stop=[""]), ValueError), (dict(stop=[3]), TypeError),
    (dict(stop=5), TypeError), (dict(stop_token_ids=[-1]), ValueError),
    (dict(stop_token_ids=["a"]), TypeError), (dict(logprobs=-1), ValueError),
    (dict(n=True), TypeError),
])
def test_sampling_params_reject_bad_values(kwargs, exc):
    with pytest.raises(exc):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_normalisation():
    p = SamplingParams()
    assert (p.n, p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 16, 1.0, 1.0, 0, 0.0)
    assert not p.greedy and SamplingParams(temperature=0).greedy
    q = SamplingParams(stop="end", stop_token_ids=[np.int64(3)], top_k=-1)
    assert q.stop == ("end",) and q.stop_token_ids == (3,) and q.top_k == 0


@pytest.mark.parametrize("options, exc", [
    (dict(kv_cache_pages=0), ValueError), (dict(page_size=0), ValueError),
    (dict(max_num_seqs=0), ValueError), (dict(max_num_batched_tokens=-1), ValueError),
    (dict(preemption_mode="drop"), ValueError), (dict(swap_pages=-1), ValueError),
    (dict(kv_dtype=16), TypeError), (dict(enable_prefix_cache="yes"), TypeError),
    (dict(seed=1.5), TypeError),
])
def test_engine_options_are_checked(options, exc):
    with pytest.raises(exc):
        make(**options)


def test_engine_missing_checkpoint_is_file_not_found(tmp_path):
    pytest.importorskip("pagedcy.models")
    with pytest.raises(FileNotFoundError):
        LLMEngine(str(tmp_path / "nowhere"))
    with pytest.raises(TypeError):
        LLMEngine(42)


def test_default_pool_size_fits_a_full_context():
    eng = LLMEngine.from_model(ToyModel(), max_num_seqs=4)
    ps = eng.manager.block_size()
    assert eng.manager.total_blocks() == 4 * 512 // ps
    eng.add_request("a", [1, 2], SamplingParams(max_tokens=None, temperature=0))
    assert eng.step()[0].outputs[0].token_ids


def test_default_pool_never_plans_more_than_half_the_ram():
    # one full-context sequence is the floor, but not a 2**40-token one (32 TiB of pages)
    from pagedcy.engine.pool_size import _physical_memory, default_num_pages
    pages = default_num_pages(64 << 10, 16, 256, 2**40)
    assert 0 < pages * (64 << 10) <= _physical_memory() // 2
    assert default_num_pages(64 << 10, 16, 1, 8192) == 8192 // 16 + 1


def test_max_model_len_follows_the_model_and_the_pool():
    model = ToyModel()
    ctx = model.config.max_position_embeddings
    assert make(model).max_model_len == ctx
    small = make(model, kv_cache_pages=5)                       # 20 tokens of pages of 4
    assert small.max_model_len == min(ctx, 20)
    # without max_tokens a request runs to max_model_len, which the pool can hold
    out = run(small, [("a", [1, 2, 3], SamplingParams(temperature=0, ignore_eos=True, max_tokens=None))])["a"]
    assert len(out.outputs[0].token_ids) == small.max_model_len - 3
    assert make(model, max_model_len=12).max_model_len == 12
    with pytest.raises(ValueError):
        make(model, max_model_len=12).add_request("b", [1] * 10, SamplingParams(max_tokens=3))
    for bad, exc in ((ctx + 1, ValueError), (21, ValueError), (0, ValueError), (2.5, TypeError)):
        with pytest.raises(exc):
            make(model, kv_cache_pages=5, max_model_len=bad)


class _BrokenLogits(ToyModel):
    """A model whose logits rows are NaN, +inf or -inf (a broken checkpoint)."""

    def forward(self, kv_pages, token_ids, slots):
        out = super().forward(kv_pages, token_ids, slots)
        out[0::3] = np.nan
        out[1::3, 5] = np.inf
        out[2::3] = -np.inf
        return out


def test_non_finite_logits_still_give_tokens_and_the_engine_goes_on():
    # Sampling used to raise mid-step after the KV was committed, leaving every later step
    # failing; now NaN counts as impossible and +inf as certain.
    eng = make(_BrokenLogits())
    reqs = [(f"r{i}", p, sampled(i) if i % 2 else GREEDY) for i, p in enumerate(random_prompts(20, 6))]
    out = run(eng, reqs)
    assert sorted(out) == sorted(r[0] for r in reqs)
    assert all(o.finished and o.outputs[0].finish_reason in ("length", "stop") for o in out.values())
    assert_no_leak(eng)
    assert run(eng, [("after", [1, 2, 3], GREEDY)])["after"].finished


def test_step_without_work_returns_nothing():
    eng = make()
    assert eng.step() == [] and not eng.has_unfinished_requests()


@pytest.mark.parametrize("fault", ["interrupt in the forward", "short logits", "not an array",
                                   "interrupt while sampling"])
def test_a_failed_step_leaves_the_engine_consistent(fault, monkeypatch):
    # Ctrl-C in the forward, bad logits from a from_model() model, or Ctrl-C while sampling:
    # the last two used to leave the step half counted (KV committed, no token) and every
    # later step failed
    from pagedcy.engine import sampler
    model = ToyModel()
    prompts = random_prompts(14, 3)
    eng = make(model)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    eng.step()
    real, greedy = model.forward, sampler.greedy
    def interrupted(*a):
        raise KeyboardInterrupt

    if fault == "interrupt in the forward":
        model.forward = interrupted
    elif fault == "short logits":
        model.forward = lambda *a: real(*a)[:-1]
    elif fault == "not an array":
        model.forward = lambda *a: real(*a).tolist()
    else:
        monkeypatch.setattr(sampler, "greedy", interrupted)
    with pytest.raises(KeyboardInterrupt if fault.startswith("interrupt") else (ValueError, TypeError)):
        eng.step()
    model.forward = real
    monkeypatch.setattr(sampler, "greedy", greedy)
    final = run(eng, [])
    for i, p in enumerate(prompts):
        assert final[str(i)].outputs[0].token_ids == model.reference_greedy(p, 12)
    assert_no_leak(eng)
