"""The rules of ``serve --replicas``' prefix-aware routing and the replica/front-end output
deltas, without Ray (:mod:`pagedcy.server.routing`, :mod:`pagedcy.server.remote_engine`)."""
import os
import random
import subprocess
import sys

import pytest

from pagedcy.server.routing import (KEY_BYTES, Candidate, PrefixIndex, leading_match, pack_keys,
                                    page_keys, rank, unpack_keys)


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


def test_replica_request_prompt_text_is_one_char_per_token():
    from pagedcy.server.remote_engine import ReplicaRequest
    ids = [0, 65, 0xD7FF, 0xD800, 0xDFFF, 150_000]
    text = ReplicaRequest("r", ids, None).prompt
    assert len(text) == len(ids) and text.encode("utf-8")      # no lone surrogates
    assert len(set(text)) == len(ids)
    assert ReplicaRequest("r", ids[:3], None).prompt == text[:3]


def test_bench_prefix_workload_shape():
    from pagedcy.tools.bench_replicas import prefix_workload
    prompts = prefix_workload(4, 3, 32, 8, vocab=1000, seed=1)
    assert len(prompts) == 12 and all(len(p) == 40 for p in prompts)
    heads = [tuple(p[:32]) for p in prompts]
    assert len(set(heads)) == 4 and all(heads.count(h) == 3 for h in set(heads))
    assert len({tuple(p[32:]) for p in prompts}) == 12            # every tail its own
    assert heads != sorted(heads, key=heads.index)                # shuffled, not grouped
    assert prefix_workload(4, 3, 32, 8, vocab=1000, seed=1) == prompts
