"""What the passive OpenMP wait policy costs the attention kernel alone (no BLAS around it).

``python asv_benches/wait_policy_attention.py [--rounds 5]``

Each round runs two fresh subprocesses, one per policy: pagedcy's default
(``OMP_WAIT_POLICY=passive``: idle workers sleep at once, every parallel region wakes them) and
libgomp's own default (``GOMP_SPINCOUNT=300000``: workers spin ~3 ms between regions, so
back-to-back calls find them awake). Cases: the headline decode 32 x 2048 (32/8 heads x 128,
~15 ms a call) and a short one, 16 x 512 on the engine benchmark's shapes (8/2 heads x 64,
~0.1 ms a call), where a wake-up weighs most. Prints each case's best time per policy.
"""
import argparse
import json
import os
import subprocess
import sys
import time

POLICIES = [("passive (pagedcy default)", {}), ("spin (GOMP_SPINCOUNT=300000)", {"GOMP_SPINCOUNT": "300000"})]
CASES = [("decode 32x2048, 32/8 heads x 128", 32, 2048, 32, 8, 128, 30),
         ("decode 16x512, 8/2 heads x 64", 16, 512, 8, 2, 64, 400)]


def _child():
    import numpy as np
    from pagedcy import batch_paged_attention
    from pagedcy._libs._pool import aligned_zeros
    rng = np.random.default_rng(0)
    res = {}
    for name, b, t, h, hk, d, reps in CASES:
        npg = t // 16
        pages = aligned_zeros(b * npg * 2 * 16 * hk * d * 4).view(np.float32).reshape(b * npg, 1, 2, 16, hk, d)
        pages[...] = rng.standard_normal(pages.shape[1:], dtype=np.float32)   # one page, repeated
        tables = rng.permutation(b * npg).astype(np.int32).reshape(b, npg)
        q = rng.standard_normal((b, h, d), dtype=np.float32)
        indptr, lens = np.arange(b + 1, dtype=np.int32), np.full(b, t, np.int32)
        out = np.empty_like(q)
        batch_paged_attention(q, indptr, pages, 0, tables, lens, out=out)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            batch_paged_attention(q, indptr, pages, 0, tables, lens, out=out)
            best = min(best, time.perf_counter() - t0)
        res[name] = best
    print(json.dumps(res))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child()
    from pagedcy.tools.bench_engine import machine_header
    print(machine_header())
    best = {}
    for _ in range(args.rounds):
        for label, add in POLICIES:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME",
                                "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
            env.update(add)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                                 capture_output=True, text=True, timeout=600, check=True)
            for case, t in json.loads(out.stdout.strip().splitlines()[-1]).items():
                key = (case, label)
                best[key] = min(best.get(key, float("inf")), t)
    print(f"best of {args.rounds} rounds (fresh process per policy per round), 2 threads")
    for name, *_ in CASES:
        a, b = best[(name, POLICIES[0][0])], best[(name, POLICIES[1][0])]
        print(f"{name:<36} passive {a * 1e3:8.3f} ms   spin {b * 1e3:8.3f} ms   passive/spin {a / b:.3f}")


if __name__ == "__main__":
    main()
