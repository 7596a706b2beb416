"""pagedcy's GEMM kernel against NumPy's BLAS on the projection shapes of a model step.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_benches/gemm_step.py [--seconds 2]``

``--max-simd 1`` caps pagedcy at AVX2 (compare with ``OPENBLAS_CORETYPE=Haswell``, OpenBLAS's
AVX2 kernels, as a stand-in for an AVX2-only CPU); ``--bf16`` adds a column for the same step
with the weights stored as bfloat16 (``linear_rows``: half the bytes to read).

For each row count M, the GEMMs of one decode step of the engine benchmark's model (Llama:
hidden 512, 8 layers, 8 / 2 heads of 64, intermediate 1408, vocab 32000; weights stored
``[out, in]`` as the model keeps them: per layer q|k|v 768x512, o 512x512, gate|up 2816x512,
down 512x1408, then the 32000x512 LM head once), timed as ``linear_kernel`` and as
``np.matmul(x, w.T)`` (BLAS), best step of each. The two alternate in stretches of half a
second with a pause between, for ``--seconds`` and at least ``--min-rounds`` times: OpenBLAS's
threads spin for a while after its last call and would take the cores from pagedcy's OpenMP
threads (that is one reason the models use only pagedcy's kernel). Weights are distinct
arrays (155 MB in all, more than L3), so each GEMM reads its weight from memory as in a real
step (the LM head only at decode row counts). Prints GFLOP/s, the ratio, and the weight-read rate against ``read_bandwidth``.
"""
import argparse
import time

import numpy as np

from pagedcy._libs._bandwidth import read_bandwidth
from pagedcy._libs._gemm import _linear_kernel_tuned, _linear_rows_tuned
from pagedcy._libs._threads import resolve_num_threads
from pagedcy.tools.bench import blas_description
from pagedcy.tools.info import cpu_description

LAYERS, HIDDEN, INTER, VOCAB = 8, 512, 1408, 32000
SHAPES = [(768, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]


def weights(rng):
    """Distinct float32 weights of one step: 8 layers x 4 projections, then the LM head."""
    ws = [rng.standard_normal(s, dtype=np.float32) for _ in range(LAYERS) for s in SHAPES]
    return ws + [rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32)]


def step(fn, xs, ws, outs):
    """One step's GEMMs with ``fn(x, w, out)``; returns seconds."""
    t = time.perf_counter()
    for w in ws:
        fn(xs[w.shape[1]], w, outs[w.shape[0]])
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per row count")
    ap.add_argument("--min-rounds", type=int, default=5,
                    help="alternations per row count at least, however long they take")
    ap.add_argument("--rows", default="1,4,16,32,64,128,512,2048")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-simd", type=int, default=2, help="0 scalar, 1 AVX2, 2 AVX-512")
    ap.add_argument("--bf16", action="store_true", help="also time bfloat16 weights")
    args = ap.parse_args(argv)
    nt = resolve_num_threads(args.threads)
    rng = np.random.default_rng(0)
    ws = weights(rng)
    wbytes = sum(w.nbytes for w in ws)
    bw = read_bandwidth(num_threads=nt)
    print(f"CPU: {cpu_description()}")
    print(f"BLAS: {blas_description()}; pagedcy threads {nt}")
    print(f"weights {wbytes / 1e6:.0f} MB per step; read bandwidth {bw:.1f} GB/s "
          f"({wbytes / bw / 1e6:.2f} ms to read them once)")
    lv = args.max_simd
    ours = lambda x, w, o: _linear_kernel_tuned(x, w, o, nt, lv)  # noqa: E731
    blas = lambda x, w, o: np.matmul(x, w.T, out=o)  # noqa: E731
    # bf16 weights: the same values rounded, timed as the same step (keyed by the f32 array)
    bf = {id(w): (w.view(np.uint32) >> 16).astype(np.uint16) for w in ws} if args.bf16 else {}
    ours_bf = lambda x, w, o: _linear_rows_tuned(x, bf[id(w)], "bf16", o, nt, lv)  # noqa: E731
    extra = " bf16 ms | bf16 / f32 time |" if args.bf16 else ""
    from pagedcy._libs._attention import simd_level    # PAGEDCY_SIMD and the CPU cap it too
    print(f"pagedcy instruction set: {('scalar', 'AVX2', 'AVX-512')[min(lv, simd_level())]}")
    print("| M | pagedcy ms | np.matmul ms | pagedcy GFLOP/s | np GFLOP/s | np / pagedcy time "
          "| pagedcy weight GB/s |" + extra)
    print("|---|---|---|---|---|---|---|" + ("---|---|" if args.bf16 else ""))
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: rng.standard_normal((m, k), dtype=np.float32) for k in (HIDDEN, INTER)}
        wl = ws if m <= 64 else ws[:-1]        # a prefill runs the LM head on last rows only
        outs = {n: np.empty((m, n), np.float32) for n in {w.shape[0] for w in wl}}
        flops = 2 * m * sum(w.size for w in wl)
        wbytes = sum(w.nbytes for w in wl)
        fns = [("ours", ours), ("blas", blas)] + ([("bf16", ours_bf)] if args.bf16 else [])
        best = {name: 1e9 for name, _ in fns}
        # at M = 2048 a step takes ~0.5 s, so --seconds alone gave one step a side: best of one,
        # the first call at that size included (0.57-1.30x OpenBLAS in runs an hour apart)
        t_end, rounds = time.perf_counter() + args.seconds, 0
        while time.perf_counter() < t_end or rounds < args.min_rounds:
            rounds += 1
            for name, fn in fns:
                stretch = time.perf_counter() + 0.5
                while True:
                    best[name] = min(best[name], step(fn, xs, wl, outs))
                    if time.perf_counter() > stretch:
                        break
                time.sleep(0.3)     # let the other side's threads go to sleep
        o, b = best["ours"], best["blas"]
        tail = f" {best['bf16'] * 1e3:.2f} | {best['bf16'] / o:.2f} |" if args.bf16 else ""
        print(f"| {m} | {o * 1e3:.2f} | {b * 1e3:.2f} | {flops / o / 1e9:.1f} | {flops / b / 1e9:.1f} "
              f"| {b / o:.2f}x | {wbytes / o / 1e9:.1f} |" + tail)


if __name__ == "__main__":
    main()
