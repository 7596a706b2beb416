"""A/B microbenchmark of batch_paged_attention at the engine model's shapes.

The engine benchmark model (random Llama: 8 query heads, 2 KV heads,
head_dim 64, page 16, fp32 KV, 8 layers) runs attention at these shapes:
decode 64 x 800 and 16 x 544 tokens, prefill 4 x 512 and 1 x 2048 new
tokens (causal). This script builds a pool ``[pages, 8 layers, 2, 16, 2, 64]``
with random page permutations and times
``_batch_paged_attention_tuned(..., repeat=R)`` (R kernel runs without the
GIL), best of N rounds, with every variant run in turn inside each round so
their ratios come from the same minutes of a shared machine.

Decode "cold": the K/V read per call comes from DRAM: a timed run cycles
over all 8 layers of its pages (64 x 800 reads 52 MB per layer, 16 x 544
9 MB; 420 and 71 MB in all, against a 32 MiB L3), so no variant finds the
previous one's data in L3. Decode "hot": the same batch over a block table that reuses 8
pages, so K/V stays in L2 and the time is compute alone.

Variants: ``new`` is the pagedcy on sys.path; ``--base PATH`` adds ``base``,
an older build of ``_attention`` (a copied ``.so``) loaded beside it;
``--flags NAME[+NAME...]`` adds ``new`` with those tuning flags (repeatable).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. python \\
        asv_benches/attn_model_shapes.py --base /tmp/attn64_base/_attention*.so
"""
import argparse
import importlib.machinery
import importlib.util
import time

import numpy as np

from pagedcy._libs import _attention
from pagedcy._libs._bandwidth import read_bandwidth
from pagedcy.tools.info import cpu_description

H, HKV, D, T, LAYERS, LAYER = 8, 2, 64, 16, 8, 3


def load_base(path):
    """The ``_attention`` extension at ``path`` as a separate module (A/B)."""
    loader = importlib.machinery.ExtensionFileLoader("pagedcy_base_attn._attention", path)
    spec = importlib.util.spec_from_file_location("pagedcy_base_attn._attention", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class Shape:
    """One batch: queries, a pool, block tables over random page permutations."""

    def __init__(self, name, batch, q_len, kv_len, rng, hot_pages=0):
        self.name, self.q_len, self.kv_len, self.batch = name, q_len, kv_len, batch
        npp = -(-kv_len // T)
        n_pages = hot_pages or batch * npp
        self.pages = rng.standard_normal((n_pages, LAYERS, 2, T, HKV, D), dtype=np.float32)
        if hot_pages:
            bt = rng.integers(0, hot_pages, (batch, npp), dtype=np.int32)
        else:
            bt = rng.permutation(n_pages).astype(np.int32).reshape(batch, npp)
        self.bt = bt
        self.lens = np.full(batch, kv_len, dtype=np.int64)
        self.ind = np.arange(batch + 1, dtype=np.int64) * q_len
        self.q = rng.standard_normal((batch * q_len, H, D), dtype=np.float32)
        self.out = np.empty_like(self.q)
        self.kv_bytes = batch * kv_len * HKV * D * 4 * 2
        # causal: row i sees kv_len - q_len + i + 1 keys; 2 FLOPs per MAC, QK and PV
        seen = (kv_len - q_len) * q_len + q_len * (q_len + 1) / 2
        self.flops = batch * seen * H * D * 4

    def run(self, mod, flags, repeat, layers):
        for layer in layers:
            mod._batch_paged_attention_tuned(self.q, self.ind, self.pages, layer, self.bt, self.lens,
                                             out=self.out, num_threads=self.threads, flags=flags,
                                             repeat=repeat)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="path of a baseline _attention .so")
    ap.add_argument("--flags", action="append", default=[], help="tuning flag names joined by '+'")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated shape names to run")
    args = ap.parse_args()

    variants = [("new", _attention, 0)]
    if args.base:
        variants.insert(0, ("base", load_base(args.base), 0))
    for f in args.flags:
        variants.append(("new+" + f, _attention, tuple(f.split("+"))))

    rng = np.random.default_rng(0)
    # (name, shape, repeat, layers per timed call)
    cases = [
        ("decode 64x800 cold", Shape("d64x800", 64, 1, 800, rng), 1, list(range(LAYERS))),
        ("decode 64x800 hot", Shape("d64x800h", 64, 1, 800, rng, hot_pages=8), 8, [LAYER]),
        ("prefill 4x512", Shape("p4x512", 4, 512, 512, rng), 2, [LAYER]),
        ("prefill 1x2048", Shape("p1x2048", 1, 2048, 2048, rng), 1, [LAYER]),
        ("decode 16x544 cold", Shape("d16x544", 16, 1, 544, rng), 1, list(range(LAYERS))),
        ("decode 16x544 hot", Shape("d16x544h", 16, 1, 544, rng, hot_pages=8), 16, [LAYER]),
    ]
    if args.only:
        keep = args.only.split(",")
        cases = [c for c in cases if any(k in c[0] for k in keep)]
    for _, s, _, _ in cases:
        s.threads = args.threads

    # every variant must agree with the first before anything is timed
    for label, s, _, _ in cases:
        ref = None
        for name, mod, flags in variants:
            s.run(mod, flags, 1, [LAYER])
            if ref is None:
                ref = s.out.copy()
            elif not np.allclose(s.out, ref, rtol=1e-4, atol=1e-5):
                raise SystemExit(f"{label}: {name} differs from {variants[0][0]} "
                                 f"(max abs {np.abs(s.out - ref).max():.3g})")

    print(f"CPU: {cpu_description()}; {args.threads} threads; read bandwidth "
          f"{read_bandwidth(2 * 2**30, num_threads=args.threads, repeats=3):.1f} GB/s")
    best = {(c[0], v[0]): float("inf") for c in cases for v in variants}
    for rnd in range(args.rounds):
        for label, s, rep, layers in cases:
            # alternate the order: no variant always runs first (warm-up, cache state)
            for name, mod, flags in variants[::-1] if rnd % 2 else variants:
                t0 = time.perf_counter()
                s.run(mod, flags, rep, layers)
                dt = (time.perf_counter() - t0) / (rep * len(layers))
                best[label, name] = min(best[label, name], dt)

    print(f"{'case':22s} {'variant':18s} {'ms/call':>9s} {'GB/s':>7s} {'GFLOP/s':>8s} {'vs first':>9s}")
    for label, s, _, _ in cases:
        first = best[label, variants[0][0]]
        for name, _, _ in variants:
            t = best[label, name]
            print(f"{label:22s} {name:18s} {t * 1e3:9.3f} {s.kv_bytes / t / 1e9:7.1f} "
                  f"{s.flops / t / 1e9:8.1f} {first / t:8.2f}x")


if __name__ == "__main__":
    main()
