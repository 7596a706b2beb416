"""GGUF block-format projections (``pagedcy._libs._gemm.linear_rows`` on the raw blocks) at
decode size, against the machine's read bandwidth.

``python asv_benches/bench_quant.py [--threads N] [--seconds 1] [--mbytes 256]``

For Q4_K / Q8_0 / Q6_K (and Q5_0, the Q4_K_M files' type where K is not a multiple of 256)
weights of qwen2.5-0.5b's MLP shapes (down 896 x 4864, gate / up 4864 x 896; weights
``[out, in]``), times a 1-row ``linear`` over a ring of distinct weights of ``--mbytes`` MB in
all (so each call reads its weight from memory, as a decode step does) and prints the
weight-read rate next to ``read_bandwidth()`` on as many threads, plus the rate with one
weight hot in cache (the register decode's ceiling). The asv classes time the same calls on one
weight.
"""
import argparse
import time

import numpy as np

from pagedcy._libs._gemm import BLOCK_FORMATS, linear_rows
from pagedcy._libs._quant import block_info, dequantize

TYPES = {"Q4_K": 12, "Q8_0": 8, "Q6_K": 14, "Q5_0": 6}
_FMT = {t: name for name, t in BLOCK_FORMATS.items()}


def linear(x, raw, ggml_type, out, num_threads=None):
    """``out = x @ dequantize(raw).T`` by the GEMM on the stored blocks."""
    return linear_rows(x, raw, _FMT[ggml_type], out, num_threads)
SHAPES = [(896, 4864), (4864, 896)]


def random_weight(rng, ggml_type, n, k):
    """Random blocks of an [n, k] weight with sane fp16 scales (0.01): quant bytes random."""
    be, bb = block_info(ggml_type)
    raw = rng.integers(0, 256, (n, k // be * bb), dtype=np.uint8)
    blocks = raw.reshape(-1, bb)
    h = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    fields = {12: (0, 2), 13: (0, 2), 14: (208,), 3: (0, 2), 7: (0, 2)}.get(ggml_type, (0,))
    for off in fields:
        blocks[:, off:off + 2] = h
    return raw


class QuantLinearDecode:
    params = (list(TYPES), [1, 16])
    param_names = ["type", "rows"]

    def setup(self, name, rows):
        rng = np.random.default_rng(0)
        self.t = TYPES[name]
        n, k = SHAPES[0]
        self.raw = random_weight(rng, self.t, n, k)
        self.x = rng.standard_normal((rows, k), dtype=np.float32)
        self.out = np.empty((rows, n), np.float32)

    def time_linear(self, name, rows):
        linear(self.x, self.raw, self.t, self.out)

    def time_dequantize(self, name, rows):
        dequantize(self.raw, self.t, (self.raw.shape[0], self.x.shape[1]))


def _rate(fn, nbytes, seconds):
    """Best GB/s of ``fn`` calls over ``seconds`` (each reading ``nbytes``)."""
    fn()
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main(argv=None):
    from pagedcy._libs._bandwidth import read_bandwidth
    from pagedcy._libs._threads import resolve_num_threads
    from pagedcy.tools.info import cpu_description

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--mbytes", type=int, default=256, help="ring of distinct weights, MB")
    args = ap.parse_args(argv)
    nt = resolve_num_threads(args.threads)
    print(f"CPU: {cpu_description()}")
    counts = sorted({1, nt})
    bw = {c: read_bandwidth(num_threads=c) for c in counts}
    print("read_bandwidth: " + ", ".join(f"{bw[c]:.1f} GB/s on {c} thread(s)" for c in counts))
    print("| type | weight [N, K] | MB | threads | M=1 GB/s (from memory) | vs read_bandwidth "
          "| M=1 GB/s (hot) | M=16 GB/s (from memory) |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name, t in TYPES.items():
        for n, k in SHAPES:
            if k % block_info(t)[0]:
                print(f"| {name} | {n} x {k} | - | - | K not a multiple of {block_info(t)[0]} | | | |")
                continue
            w0 = random_weight(rng, t, n, k)
            ring = [w0] + [w0.copy() for _ in range(max(1, args.mbytes * 10**6 // w0.nbytes) - 1)]
            x1 = rng.standard_normal((1, k), dtype=np.float32)
            x16 = rng.standard_normal((16, k), dtype=np.float32)
            o1, o16 = np.empty((1, n), np.float32), np.empty((16, n), np.float32)
            for c in counts:
                def cold(x, o):
                    for w in ring:
                        linear(x, w, t, o, c)
                ring_bytes = w0.nbytes * len(ring)
                r_cold = _rate(lambda: cold(x1, o1), ring_bytes, args.seconds)
                r_hot = _rate(lambda: linear(x1, w0, t, o1, c), w0.nbytes, args.seconds / 2)
                r16 = _rate(lambda: cold(x16, o16), ring_bytes, args.seconds)
                print(f"| {name} | {n} x {k} | {w0.nbytes / 1e6:.2f} | {c} | {r_cold:.1f} "
                      f"| {r_cold / bw[c]:.2f} | {r_hot:.1f} | {r16:.1f} |")
            del ring


if __name__ == "__main__":
    main()
