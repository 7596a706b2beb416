"""Core throughput in one run: per-call append_kv_layer time and bulk append/gather GB/s
against np.copyto on the same bytes.  ``python asv_benches/core_throughput.py``"""
import numpy as np

from pagedcy import PagedKVCache, PagedKVCacheConfig
from pagedcy.tools.bench import best_time
from pagedcy.tools.info import cpu_description


def main():
    layers, heads, hd, n = 4, 8, 128, 8192
    cfg = PagedKVCacheConfig(16, n // 16, layers, heads, hd)
    cache = PagedKVCache(cfg)
    rng = np.random.default_rng(0)
    row = rng.standard_normal(heads * hd, dtype=np.float32)
    calls = 4096

    def per_token():
        cache.reset()
        for _ in range(calls // layers):
            for layer in range(layers):
                cache.append_kv_layer(layer, row, row)
            cache.advance()
    t_call = best_time(per_token, 5) / calls
    dst_row = np.empty_like(row)
    t_copy_row = best_time(lambda: [np.copyto(dst_row, row) for _ in range(calls)], 5) / calls

    k = rng.standard_normal((layers, n, heads * hd), dtype=np.float32)
    t_append = best_time(lambda: (cache.reset(), cache.append_tokens(k, k)), 15)
    cache.reset()
    cache.append_tokens(k, k)
    out = np.empty((n, heads * hd), dtype=np.float32)
    t_gather = best_time(lambda: cache.gather_k(0, out), 15)
    a, b = np.empty_like(k), np.empty_like(k)
    a[:] = 1
    b[:] = 1
    t_copyto = best_time(lambda: np.copyto(b, a), 15)
    o2 = np.empty_like(out)
    t_copyto_g = best_time(lambda: np.copyto(o2, k[0]), 15)
    gb = 1e9
    print(f"CPU: {cpu_description()}")
    print(f"append_kv_layer per call (kv_dim {heads*hd}, fp32): {t_call*1e6:.2f} us "
          f"(np.copyto of the same row: {t_copy_row*1e6:.2f} us)")
    print(f"append_tokens: {2*k.nbytes/t_append/gb:.1f} GB/s; np.copyto same bytes: "
          f"{k.nbytes/t_copyto/gb:.1f} GB/s; ratio {(2*k.nbytes/t_append)/(k.nbytes/t_copyto):.2f}")
    print(f"gather_k: {out.nbytes/t_gather/gb:.1f} GB/s; np.copyto same bytes: "
          f"{out.nbytes/t_copyto_g/gb:.1f} GB/s; ratio {t_copyto_g/t_gather:.2f}")


if __name__ == "__main__":
    main()
