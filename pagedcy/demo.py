"""``python -m pagedcy demo``: a sliding-window cache workload with a summary."""
import time

import numpy as np

from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig


def sliding_window(args):
    """Stream tokens through a small LRU cache; return the summary dict."""
    cfg = PagedKVCacheConfig(page_size=16, max_pages=64, num_layers=4, num_kv_heads=4,
                             head_dim=64, eviction=EvictionPolicy.LRU)
    cache = PagedKVCache(cfg)
    rng = np.random.default_rng(args.seed)
    n_tokens = 2_000 if args.quick else 20_000
    chunk = 64
    k = rng.standard_normal((cfg.num_layers, chunk, cfg.kv_dim()), dtype=np.float32)
    t0 = time.perf_counter()
    peak = 0
    for start in range(0, n_tokens, chunk):
        cache.append_tokens(k, k)
        peak = max(peak, cache.num_pages())
    elapsed = time.perf_counter() - t0
    return {
        "tokens appended": n_tokens,
        "tokens held": cache.seq_len(),
        "tokens evicted": cache.evicted_tokens(),
        "pages used": f"{cache.num_pages()} of {cfg.max_pages} (peak {peak})",
        "bytes used": f"{cache.used_memory_bytes():,} of {cache.total_memory_bytes():,}",
        "append rate": f"{n_tokens / elapsed:,.0f} tokens/s",
    }


def main(args):
    summary = sliding_window(args)
    print("pagedcy demo: sliding-window (LRU) paged KV cache")
    for k, v in summary.items():
        print(f"  {k:>16}: {v}")
    return 0
