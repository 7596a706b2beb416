"""Executor decode-step time for 64 sequences x 1024 cached tokens, with the attention kernel
alone and the read-bandwidth floor for comparison, all in one run.

``python asv_benches/executor_step.py [--layers 2] [--batch 64] [--kv-len 1024] [--steps 20]``
(32 query heads, 8 KV heads, head_dim 128, page_size 16, float32, vocab 32000).
"""
import argparse
import time

import numpy as np

from pagedcy import PagedKVCacheConfig
from pagedcy._libs._bandwidth import read_bandwidth
from pagedcy.kvcache.executor import PagedAttentionExecutor, PagedExecutorConfig
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args(argv)
    B, T, L, ps = a.batch, a.kv_len, a.layers, 16
    ecfg = PagedExecutorConfig(vocab_size=32000, num_layers=L, num_heads=32, num_kv_heads=8,
                               head_dim=128, max_sequence_length=T + a.steps + 8)
    cfg = PagedKVCacheConfig(ps, B * ((T + a.steps + 3 * ps) // ps + 1), L, 8, 128)
    mgr = PagedKVCacheManager(cfg)
    ex = PagedAttentionExecutor(ecfg, mgr)
    rng = np.random.default_rng(0)
    handles = []
    for _ in range(B):
        h = mgr.allocate(AllocationRequest(initial_tokens=T))
        e = ex.embed(rng.integers(0, 32000, T))
        for layer in range(L):
            mgr.write_kv_tokens(h, layer, 0, e, e)
        handles.append(h)
    ids = rng.integers(0, 32000, B)
    for _ in range(3):
        ex.decode(ids, handles)
    steps = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        ex.decode(ids, handles)
        steps.append(time.perf_counter() - t0)
    q = np.ones((B, 32, 128), np.float32)
    kern = []
    for _ in range(10):
        t0 = time.perf_counter()
        mgr.attention(L - 1, q, handles)
        kern.append(time.perf_counter() - t0)
    bw = read_bandwidth(256 * 2**20, repeats=3)
    kv_bytes = B * handles[0].num_tokens() * 2 * 8 * 128 * 4
    step, k = np.median(steps), np.median(kern)
    print(f"executor decode step, {B} sequences x ~{handles[0].num_tokens()} tokens, {L} layers: "
          f"median {step * 1e3:.2f} ms (min {min(steps) * 1e3:.2f} ms)")
    print(f"  attention kernel alone: {k * 1e3:.2f} ms = {kv_bytes / k / 1e9:.1f} GB/s "
          f"({100 * kv_bytes / k / 1e9 / bw:.0f}% of the {bw:.1f} GB/s read bandwidth); "
          f"kernel share of the step {100 * k / step:.0f}%")


if __name__ == "__main__":
    main()
