"""pagedcy's current fp32 path at M=512 (packed fp32 panel, 12x32 micro-kernel) on Q4_K, and its
accuracy on the metric the spike uses (max |err| / (||w|| ||x||) vs float64 of gguf's dequantization).
usage: PYTHONPATH=../.. python bench_pagedcy_prefill.py N K [fmt]   (fmt q4_k default, or q6_k)"""
import sys, time, numpy as np, gguf
from gguf.quants import dequantize
from pagedcy._libs import _gemm
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_pagedcy import mkraw
N, K = int(sys.argv[1]), int(sys.argv[2])
fmt = sys.argv[3] if len(sys.argv) > 3 else "q4_k"
rng = np.random.default_rng(1)
raw = mkraw(fmt, N, K)
x = rng.standard_normal((512, K)).astype(np.float32); out = np.empty((512, N), np.float32)
for th in (1, 2):
    _gemm.linear_rows(x, raw, fmt, out, th); best = 1e9; te = time.perf_counter() + 2
    while time.perf_counter() < te:
        t0 = time.perf_counter(); _gemm.linear_rows(x, raw, fmt, out, th); best = min(best, time.perf_counter() - t0)
    print(f"pagedcy linear_rows {fmt} M=512 N={N} K={K} threads={th}: {2*512*N*K/best/1e9:.0f} GFLOP/s ({best*1e3:.1f} ms)")
w = dequantize(raw[:256], getattr(gguf.GGMLQuantizationType, fmt.upper())).astype(np.float64)
x1 = x[:24].astype(np.float64); o = np.empty((24, N), np.float32); _gemm.linear_rows(x[:24], raw, fmt, o, 1)
ref = x1 @ w.T; scl = np.linalg.norm(x1, axis=1)[:, None] * np.linalg.norm(w, axis=1)[None, :]
print(f"pagedcy fp32-activation path accuracy ({fmt}), 24x256 outputs: max|err|/(||w|| ||x||) = {np.max(np.abs(o[:, :256] - ref) / scl):.3e}")
