"""Headline decode on pools backed by 2 MiB transparent huge pages vs 4 KiB pages, in one run.

``python asv_benches/huge_pages.py [--seconds S]``: builds each case's pages with NumPy's
huge-page request on and off (``_set_madvise_hugepage``), then times the cases interleaved,
best of the rounds, so a busy neighbour hits both alike. Needs Linux with THP in ``madvise``
or ``always`` mode (``python -m pagedcy info`` shows it).
"""
import argparse
import time

import numpy as np

from pagedcy._libs._attention import batch_paged_attention
from pagedcy.tools.info import huge_pages
from pagedcy.tools.bench import make_decode


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    ma = (getattr(np, "_core", None) or np.core).multiarray
    cases = {}
    for dtype in ("float32", "float16"):
        for huge in (True, False):
            before = ma._set_madvise_hugepage(huge)
            try:
                q, indptr, pages, bt, lens = make_decode(32, 2048, dtype, np.random.default_rng(0))
            finally:
                ma._set_madvise_hugepage(before)
            out = np.empty_like(q)
            cases[(dtype, huge)] = (lambda q=q, i=indptr, p=pages, b=bt, n=lens, o=out:
                                    batch_paged_attention(q, i, p, 0, b, n, out=o,
                                                          num_threads=args.threads))
    best = dict.fromkeys(cases, float("inf"))
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        for key, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - t0)
    print(f"huge pages: {huge_pages()}; decode 32x2048, {args.threads} threads, best ms")
    for dtype in ("float32", "float16"):
        on, off = best[(dtype, True)], best[(dtype, False)]
        print(f"{dtype:>8}: 2 MiB {on * 1e3:7.2f}   4 KiB {off * 1e3:7.2f}   4 KiB / 2 MiB {off / on:.2f}x")


if __name__ == "__main__":
    main()
