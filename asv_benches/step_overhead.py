"""Engine-step bookkeeping of the cache manager, step API against the per-layer calls.

``python asv_benches/step_overhead.py [--batch 256] [--rounds 30]``

Decode: B sequences of 100..1000 prompt tokens each add one token; per step the step API
does ``prepare_step`` + one ``write_token_rows`` per layer + ``commit_step``, the per-layer
path does ``write_kv_batch`` per layer + ``batch_tables``. Prefill: 32 prompts of 100
tokens with prefix caching on, as one step against ``write_kv_tokens`` per sequence and
layer. 2 layers, 8 KV heads x 128, page_size 16, float32. The two paths run interleaved,
round after round; each row is its best round.
"""
import argparse
import time

import numpy as np

from pagedcy import PagedKVCacheConfig
from pagedcy._libs._manager_ops import write_token_rows
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager
from pagedcy.tools.info import cpu_description

LAYERS, KVH, HD, PS = 2, 8, 128, 16


def manager(pages):
    return PagedKVCacheManager(PagedKVCacheConfig(PS, pages, LAYERS, KVH, HD),
                               enable_prefix_cache=True)


def decode_case(B, rng):
    m = manager(B * 70)
    hs = []
    for n in rng.integers(100, 1000, B):
        p = rng.integers(0, 1000, int(n))
        h = m.allocate(AllocationRequest(prompt_tokens=p))
        m.commit_step([h], [len(p)])          # the prompt counts as written
        m.extend(h, 1)
        hs.append(h)
    q = np.ones(B, np.int64)
    kv = rng.standard_normal((B, KVH * HD)).astype(np.float32)
    pos = np.array([h.num_tokens() - 1 for h in hs])

    def step_api():
        s = m.prepare_step(hs, q)
        for layer in range(LAYERS):
            write_token_rows(m.store, s.slot_pages, s.slot_offsets, layer, kv, kv)
        m.commit_step(hs, q)

    def per_layer():
        for layer in range(LAYERS):
            m.write_kv_batch(hs, layer, pos, kv, kv)
        m.batch_tables(hs)
    return step_api, per_layer


def prefill_case(rng, n=32, plen=100):
    prompts = [rng.integers(0, 1000, plen) for _ in range(n)]
    kv = rng.standard_normal((n * plen, KVH * HD)).astype(np.float32)

    def step_api():
        m = manager(n * 8)
        hs = [m.allocate(AllocationRequest(prompt_tokens=p)) for p in prompts]
        ql = [plen] * n
        s = m.prepare_step(hs, ql)
        for layer in range(LAYERS):
            write_token_rows(m.store, s.slot_pages, s.slot_offsets, layer, kv, kv)
        m.commit_step(hs, ql)

    def per_layer():
        m = manager(n * 8)
        hs = [m.allocate(AllocationRequest(prompt_tokens=p)) for p in prompts]
        for layer in range(LAYERS):
            for i, h in enumerate(hs):
                rows = kv[i * plen:(i + 1) * plen]
                m.write_kv_tokens(h, layer, 0, rows, rows)
    return step_api, per_layer


def best(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    cases = {f"decode step, {a.batch} sequences": (decode_case(a.batch, rng), 20),
             "prefill, 32 prompts x 100 tokens": (prefill_case(rng), 3)}
    res = {k: [np.inf, np.inf] for k in cases}
    for _ in range(a.rounds):
        for name, ((step_api, per_layer), reps) in cases.items():
            res[name][0] = min(res[name][0], best(step_api, reps))
            res[name][1] = min(res[name][1], best(per_layer, reps))
    print(f"{cpu_description()}; best of {a.rounds} interleaved rounds")
    for name, (s, p) in res.items():
        print(f"{name}: step API {s * 1e6:.0f} us, per-layer calls {p * 1e6:.0f} us "
              f"({p / s:.2f}x)")


if __name__ == "__main__":
    main()
