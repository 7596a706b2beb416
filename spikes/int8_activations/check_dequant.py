"""Cross-check the spike's float64 reference dequantization against gguf.quants."""
import sys, numpy as np, gguf
from gguf.quants import dequantize
N, K = 64, 512
for path, qt in (("/tmp/i8q4.bin", gguf.GGMLQuantizationType.Q4_K), ("/tmp/i8q6.bin", gguf.GGMLQuantizationType.Q6_K)):
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    buf = open(path, "rb").read()
    nb = N * K // bs * ts
    raw = np.frombuffer(buf[:nb], np.uint8).reshape(N, K // bs * ts)
    ours = np.frombuffer(buf[nb:], np.float64).reshape(N, K)
    ref = dequantize(raw, qt).astype(np.float64)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    print(qt.name, "max rel diff vs gguf.quants:", err)
    assert err < 1e-6
