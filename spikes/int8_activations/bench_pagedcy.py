"""pagedcy's current fp32-decode GEMV (linear_rows, M=1) on the spike's shapes, hot and cold.
usage: PYTHONPATH=../.. python bench_pagedcy.py N K fmt [M]   (fmt q4_k | q6_k; M rows of x, default 1)"""
import sys, time, numpy as np, gguf
from pagedcy._libs import _gemm
rng = np.random.default_rng(0)
def mkraw(fmt, N, K):  # same generator as /tmp/prof/gemm_m.py: random bytes, d = dmin = 0.01
    qt = getattr(gguf.GGMLQuantizationType, fmt.upper())
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (N, K // bs * ts), dtype=np.uint8)
    r = raw.reshape(N, K // bs, ts)
    half = np.array([0.01], np.float16).view(np.uint8)
    if fmt == "q4_k": r[:, :, 0:2] = half; r[:, :, 2:4] = half
    else: r[:, :, 208:210] = half
    return raw
if __name__ == "__main__":
    N, K, fmt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    w0 = mkraw(fmt, N, K)
    cnt = int(650e6 / w0.nbytes) + 1
    ws = [w0] + [mkraw(fmt, N, K) for _ in range(cnt - 1)]
    M = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    x = rng.standard_normal((M, K)).astype(np.float32); out = np.empty((M, N), np.float32)
    for th in (1, 2):
        bh = bc = 1e9
        for rep in range(5):
            _gemm.linear_rows(x, w0, fmt, out, th)
            t0 = time.perf_counter()
            for _ in range(40): _gemm.linear_rows(x, w0, fmt, out, th)
            bh = min(bh, (time.perf_counter() - t0) / 40)
            t0 = time.perf_counter()
            for w in ws: _gemm.linear_rows(x, w, fmt, out, th)
            bc = min(bc, (time.perf_counter() - t0) / cnt)
        print(f"pagedcy linear_rows {fmt} M={M} {N}x{K} threads={th}: hot {w0.nbytes/bh/1e9:.1f} GB/s ({bh*1e6:.0f} us)  cold {w0.nbytes/bc/1e9:.1f} GB/s ({bc*1e6:.0f} us, {cnt} matrices)")
