"""Paged-attention benchmark: ``python -m pagedcy bench [--quick] [--threads N] [--repeats R]``.

The header names the CPU and its caches, the SIMD path and the huge-page mode;
progress is drawn (tqdm) only when stderr is a terminal.

Headline shape: 32 query heads, 8 KV heads, head_dim 128, page_size 16, pages
in random order. Every case runs once per round, round after round, and the
table reports each case's best time, so a busy neighbour on a shared machine
hits all of them alike. Reports time, GB/s of K+V read (decode) or GFLOP/s
(prefill), the share of the read bandwidth measured in the same run, and the
share of the case's roof (the lesser of the page-walk read rate and the
arithmetic roof: the measured FMA rate times the K/V bytes one lane-FMA
consumes; for the in-cache cases the cache read rate of a buffer their size
instead of the walk), the speed-up over a NumPy reference (gather + batched matmul/softmax) and over
torch's scaled_dot_product_attention on contiguous K/V (when torch imports).
"""
import argparse
import gc
import math
import time

import numpy as np

from pagedcy._libs._attention import (_batch_paged_attention_tuned, batch_paged_attention,
                                      simd_level)
from pagedcy._libs._threads import simd_path
from pagedcy._libs._bandwidth import fma_rate, page_read_bandwidth, read_bandwidth
from pagedcy.tools.info import cpu_description, huge_pages
from pagedcy.tools._argtypes import positive_int
from pagedcy.tools._progress import Progress
from pagedcy._libs._pool import aligned_zeros
from pagedcy import dtypes as _dtypes

H, HKV, D, T = 32, 8, 128, 16


def _median_time(fn, repeats):
    fn()                                  # warm-up (page faults, thread start)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def best_time(fn, repeats):
    """Least seconds of ``repeats`` calls of ``fn`` after one warm-up call (for copy
    throughput, where the fastest run is the one the least disturbed)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _to_storage(x, dtype):
    if dtype == "float32":
        return x
    if dtype == "int8":
        return _dtypes.quantize_int8(x)
    if dtype == "float16":
        return x.astype(np.float16)
    u = x.view(np.uint32)                 # bf16 bits, round to nearest even
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _from_storage(x, dtype):
    if dtype == "int8":
        return _dtypes.dequantize_int8(x)
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32, copy=False)


def page_array(shape, dtype, layout="HND"):
    """Zeroed page storage for float pages of ``shape`` ``[pages, layers, 2, page_size,
    num_kv_heads, head_dim]`` in ``dtype`` (int8: head rows of head_dim + 4), allocated as a
    PagePool's buffer is (4 KiB aligned) and, for "HND", the head-major view a store's
    ``pages()`` returns, so the kernel sees the layout users get. "NHD": C order."""
    sdt = {"float32": np.float32, "float16": np.float16, "int8": np.int8}.get(dtype, np.uint16)
    sdt = np.dtype(sdt)
    shape = tuple(shape[:-1]) + (_dtypes.head_row_elems(dtype, shape[-1]),)
    raw = aligned_zeros(math.prod(shape) * sdt.itemsize).view(sdt)
    if layout == "NHD":
        return raw.reshape(shape)
    P, L, two, T, Hkv, R = shape
    return raw.reshape(P, L, Hkv, two, T, R).transpose(0, 1, 3, 4, 2, 5)


def make_decode(batch, kv_len, dtype, rng, q_len=1, page_size=T, layout="HND"):
    """Random case: ``(query, qo_indptr, pages, block_tables, kv_lens)``; pages of one layer
    in random order, ``q_len`` query rows per sequence (the last ``q_len`` positions).

    At most 256 distinct random pages, repeated in random order to fill the pool: the
    kernel's speed does not depend on the values, and drawing 537 MB of normals took
    2.4 s per case, a third of the asv suite's run time."""
    npg = -(-kv_len // page_size)
    total = batch * npg
    pages = page_array((total, 1, 2, page_size, HKV, D), dtype, layout)
    slab = min(256, total)
    distinct = _to_storage(rng.standard_normal((slab, 1, 2, page_size, HKV, D), dtype=np.float32),
                           dtype)
    for i in range(0, total, slab):
        k = min(slab, total - i)
        pages[i:i + k] = distinct[rng.permutation(slab)[:k]]
    bt = rng.permutation(total).astype(np.int32).reshape(batch, npg)
    q = rng.standard_normal((batch * q_len, H, D), dtype=np.float32)
    indptr = np.arange(0, batch * q_len + 1, q_len, dtype=np.int32)
    lens = np.full(batch, kv_len, dtype=np.int32)
    return q, indptr, pages, bt, lens


def numpy_reference(q, indptr, pages, bt, lens, dtype, causal):
    """Straightforward NumPy paged attention: gather, batched matmul, softmax."""
    B = bt.shape[0]
    q_len = q.shape[0] // B
    kv_len = int(lens[0])
    kv = _from_storage(pages[bt][:, :, 0], dtype)          # [B, npg, 2, T, Hkv, D]
    kv = kv.transpose(0, 2, 4, 1, 3, 5).reshape(B, 2, HKV, -1, D)[:, :, :, :kv_len]
    K, V = kv[:, 0], kv[:, 1]                               # [B, Hkv, L, D]
    G = H // HKV
    qq = q.reshape(B, q_len, HKV, G, D).transpose(0, 2, 3, 1, 4).reshape(B, HKV, G * q_len, D)
    s = np.matmul(qq, K.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(D))
    if causal and q_len > 1:
        i = (kv_len - q_len + np.arange(q_len))[:, None]
        mask = np.arange(kv_len)[None, :] > i
        s = s.reshape(B, HKV, G, q_len, kv_len)
        s[..., mask] = -np.inf
        s = s.reshape(B, HKV, G * q_len, kv_len)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = np.matmul(s, V)
    return o.reshape(B, HKV, G, q_len, D).transpose(0, 3, 1, 2, 4).reshape(B * q_len, H, D)


def torch_case(q, pages, bt, lens, dtype, causal, threads):
    """A closure running torch SDPA on contiguous K/V, or None without torch."""
    try:
        import torch  # type: ignore[import-not-found]
        import torch.nn.functional as F  # type: ignore[import-not-found]
    except ImportError:
        return None
    B = bt.shape[0]
    q_len = q.shape[0] // B
    kv_len = int(lens[0])
    kv = _from_storage(pages[bt][:, :, 0], dtype)
    kv = kv.transpose(0, 2, 4, 1, 3, 5).reshape(B, 2, HKV, -1, D)[:, :, :, :kv_len]
    # int8: torch on the dequantized values in float32
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype, torch.float32)
    K = torch.from_numpy(np.ascontiguousarray(kv[:, 0])).to(tdt)
    V = torch.from_numpy(np.ascontiguousarray(kv[:, 1])).to(tdt)
    del kv
    tq = torch.from_numpy(q.reshape(B, q_len, H, D).transpose(0, 2, 1, 3).copy()).to(tdt)
    torch.set_num_threads(threads)
    is_causal = bool(causal and q_len > 1)

    def run():
        with torch.no_grad():
            return F.scaled_dot_product_attention(tq, K, V, is_causal=is_causal, enable_gqa=True)
    try:
        run()
    except Exception:
        # older torch / dtype without a CPU kernel: repeat K/V heads, compute in float32
        K = K.float().repeat_interleave(H // HKV, dim=1)
        V = V.float().repeat_interleave(H // HKV, dim=1)
        tq = tq.float()

        def run():
            with torch.no_grad():
                return F.scaled_dot_product_attention(tq, K, V, is_causal=is_causal)
    return run


_INPUTS: dict[tuple[int, int, int], dict[str, tuple]] = {}


def case_inputs(batch, kv_len, dtype, q_len, seed, layout="HND"):
    """Inputs of one case; every dtype of a (batch, kv_len, q_len) shape shares the
    same queries and block tables, its pages converted from the same float32 values,
    so dtype rows differ only in the storage format."""
    key = (batch, kv_len, q_len, layout)
    if key not in _INPUTS:
        _INPUTS[key] = {"float32": make_decode(batch, kv_len, "float32",
                                               np.random.default_rng(seed), q_len=q_len,
                                               layout=layout)}
    by_dtype = _INPUTS[key]
    if dtype not in by_dtype:
        q, indptr, p32, bt, lens = by_dtype["float32"]
        pages = page_array(p32.shape, dtype, layout)
        for i in range(0, p32.shape[0], 256):
            pages[i:i + 256] = _to_storage(p32[i:i + 256], dtype)
        by_dtype[dtype] = (q, indptr, pages, bt, lens)
    return by_dtype[dtype]


def bench_case(name, kind, batch, kv_len, dtype, threads, seed, q_len=1, max_simd=2,
               layout="HND", quantize_query=False):
    """One table row of pagedcy on a case, with the closure that runs it (``quantize_query``:
    int8 pages scored with integer dot products, see ``batch_paged_attention``)."""
    q, indptr, pages, bt, lens = case_inputs(batch, kv_len, dtype, q_len, seed, layout)
    out = np.empty_like(q)
    causal = kind == "prefill"
    # small (cache-resident) cases run the kernel several times per call, so
    # the Python call and thread start-up stay out of their rate
    reps = max(1, (64 << 20) // pages.nbytes) if kind == "decode" else 1

    def ours():
        _batch_paged_attention_tuned(q, indptr, pages, 0, bt, lens, out=out, causal=causal,
                                     num_threads=threads, max_simd=max_simd, repeat=reps,
                                     quantize_query=quantize_query)
    ours()                                # warm-up: page faults, thread start
    row = {"case": name, "threads": threads, "simd": min(max_simd, simd_level()),
           "in_cache": "[in cache" in name, "dtype": dtype, "numpy": None, "torch": None, "reps": reps,
           "ran_baselines": False, "run": ours, "times": [], "kind": kind, "nbytes": pages.nbytes,
           "spec": (kind, batch, kv_len, dtype, threads, seed, q_len, layout)}
    if kind == "prefill":
        pairs = sum(min(kv_len, kv_len - q_len + i + 1) for i in range(q_len)) * batch
        row["flops"] = 4.0 * D * H * pairs
    return row


def time_interleaved(rows, repeats, min_seconds, bw=None, bw_buf=None, progress=None, walk=None,
                     fma=None, cache=None, history=None):
    """Run every row's case once per round, round after round (at least `repeats`
    rounds and `min_seconds`), and keep each case's best time: a noisy
    neighbour then hits all cases alike instead of whichever ran during it.
    With `bw` ({threads: GB/s}), each round also measures the read bandwidth
    and `bw` keeps the best, so the yardstick gets the same treatment; `walk`
    likewise for ``page_read_bandwidth`` over the same buffer, and `fma`
    ({(threads, simd): lane-FMAs/s}) for ``fma_rate``, and `cache` ({(threads, nbytes):
    GB/s}) for ``read_bandwidth`` re-reading a buffer of that size (the cache read rate of
    an in-cache case). `history` (a list): each round appends its own probes,
    ``{"walk": {...}, "fma": {...}, "cache": {...}}`` keyed as those dicts, for a round-by-round
    share of the roof (``finish_row``). `progress` (a Progress over `min_seconds`) follows the
    elapsed time."""
    start = time.perf_counter()
    t_end = start + min_seconds
    rounds = 0
    while rounds < repeats or time.perf_counter() < t_end:
        rounds += 1
        if progress is not None:
            progress.set(min(min_seconds, round(time.perf_counter() - start, 1)))
            progress.status(f"timing, round {rounds}")
        for r in rows:
            t0 = time.perf_counter()
            r["run"]()
            r["times"].append(time.perf_counter() - t0)
        now = {"walk": {}, "fma": {}, "cache": {}}
        for k in (bw or {}):
            bw[k] = max(bw[k], read_bandwidth(num_threads=k, repeats=1, buffer=bw_buf))
        for k in (walk or {}):
            now["walk"][k] = page_read_bandwidth(num_threads=k, repeats=1, buffer=bw_buf)
        for th, lvl in (fma or {}):
            now["fma"][th, lvl] = fma_rate(th, lvl, repeats=1)
        for th, nb in (cache or {}):
            now["cache"][th, nb] = cache_read_rate(th, nb)
        for name, best in (("walk", walk), ("fma", fma), ("cache", cache)):
            for k, v in now[name].items():
                best[k] = max(best[k], v)
        if history is not None:
            history.append(now)
    return rounds


_CACHE_BUFS: dict[int, np.ndarray] = {}


def cache_read_rate(threads, nbytes):
    """GB/s of ``read_bandwidth`` over a buffer of ``nbytes`` (rounded up to 4 KiB) read
    again and again, so it stays in whichever cache holds it: the memory roof of a case
    whose K/V are that size and resident (4 x 256 fp32 is 8 MiB, past a 2 MiB L2)."""
    nb = max(4096, -(-nbytes // 4096) * 4096)
    if nb not in _CACHE_BUFS:
        _CACHE_BUFS[nb] = np.ones(nb // 4, dtype=np.float32)
    return read_bandwidth(num_threads=threads, repeats=3, buffer=_CACHE_BUFS[nb])


def kv_bytes_per_fma(dtype, group=H // HKV, head_dim=D):
    """K/V bytes a decode kernel reads per float32 lane-FMA: Q.K and P.V each do
    ``group`` (query heads per KV head) lane-FMAs per stored element, so an element of
    ``b`` bytes feeds ``group`` FMAs (int8 rows also carry a 4-byte scale)."""
    es = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}.get(dtype)
    if es is None:
        es = (head_dim + 4) / head_dim
    return es / group


def row_roof(row, walk, fma, cache=None):
    """(GB/s, bound) of a decode row: the arithmetic roof ``fma[(threads, simd)]`` (lane-FMAs/s)
    times ``kv_bytes_per_fma``, and the lesser of that and, for a row reading from DRAM, the
    page-walk rate ``walk[threads]``, for an in-cache row the cache read rate
    ``cache[(threads, nbytes)]`` of a buffer its size; bound "a" (arithmetic), "w" (walk) or
    "c" (cache). None without the yardsticks."""
    f = (fma or {}).get((row["threads"], row["simd"]))
    if row["kind"] != "decode" or f is None:
        return None
    arith = f * kv_bytes_per_fma(row["dtype"]) / 1e9
    if row["in_cache"]:
        c = (cache or {}).get((row["threads"], row["nbytes"]))
        return (arith, "a") if c is None or arith <= c else (c, "c")
    w = (walk or {}).get(row["threads"])
    if w is None or arith <= w:
        return arith, "a"
    return w, "w"


def finish_row(row, bw, walk=None, fma=None, cache=None, history=None):
    """Fill a benchmark row's derived columns in place from its best time: ``ms``, ``rate``
    and ``unit`` (GB/s of page bytes read for decode, GFLOP/s for prefill), ``pct_bw``
    (decode rate as a percentage of ``bw[threads]``, the measured read bandwidth in GB/s)
    and ``pct_walk`` (the same of ``walk[threads]``, the page-walk read rate, when given);
    ``roof`` / ``pct_roof`` (``row_roof`` with ``fma``: {(threads, simd): lane-FMAs/s}, and
    ``cache``: {(threads, nbytes): GB/s}); with ``history`` (``time_interleaved``'s, one
    entry per time in ``row["times"]``), ``pct_roof_med``: the median over rounds of the
    round's rate over the roof of that round's probes."""
    t = min(row["times"]) / row["reps"]
    row["ms"] = t * 1e3
    row["pct_walk"] = None
    row["roof"] = row_roof(row, walk, fma, cache)
    row["pct_roof"] = None
    if row["kind"] == "decode":
        row["rate"] = row["nbytes"] / t / 1e9
        row["unit"] = "GB/s"
        row["pct_bw"] = 100.0 * row["rate"] / bw[row["threads"]]
        if walk and row["threads"] in walk:
            row["pct_walk"] = 100.0 * row["rate"] / walk[row["threads"]]
        if row["roof"] is not None:
            row["pct_roof"] = 100.0 * row["rate"] / row["roof"][0]
        pcts = []
        for ti, h in zip(row["times"], history or ()):
            roof = row_roof(row, h["walk"], h["fma"], h["cache"])
            if roof is not None:
                pcts.append(100.0 * row["nbytes"] * row["reps"] / ti / 1e9 / roof[0])
        row["pct_roof_med"] = float(np.median(pcts)) if pcts else None
    else:
        row["rate"] = row["flops"] / t / 1e9
        row["unit"] = "GFLOP/s"
        row["pct_bw"] = None


def baseline_case(row, repeats, progress=None):
    """Check pagedcy against the NumPy reference on the same inputs and fill in
    the NumPy / torch speed-ups of `row` (timed after every pagedcy case, so
    BLAS / torch worker threads cannot disturb pagedcy's timings)."""
    kind, batch, kv_len, dtype, threads, seed, q_len, layout = row["spec"]
    name = row["case"]
    if progress is not None:
        progress.status(f"{name}: numpy reference")
    q, indptr, pages, bt, lens = case_inputs(batch, kv_len, dtype, q_len, seed, layout)
    causal = kind == "prefill"
    out = batch_paged_attention(q, indptr, pages, 0, bt, lens, causal=causal, num_threads=threads)
    ref = numpy_reference(q, indptr, pages, bt, lens, dtype, causal)
    err = float(np.max(np.abs(ref - out)))
    if err > (1e-3 if dtype == "float32" else 2e-2):
        raise RuntimeError(f"{name}: pagedcy and the NumPy reference disagree (max err {err})")
    del ref, out
    gc.collect()
    t = row["ms"] / 1e3
    with _blas_threads(threads):         # NumPy gets the row's thread count, as torch does
        tn = _median_time(lambda: numpy_reference(q, indptr, pages, bt, lens, dtype, causal),
                          max(1, repeats // 2))
    row["numpy"] = tn / t
    row["ran_baselines"] = True          # torch column "n/a" = torch not importable
    if progress is not None:
        progress.status(f"{name}: torch sdpa")
    run = torch_case(q, pages, bt, lens, dtype, causal, threads)
    if run is not None:
        row["torch"] = _median_time(run, repeats) / t
    del run
    gc.collect()


def paired_ratio(fn_a, fn_b, repeats):
    """time(a) / time(b), alternating a and b and taking each one's best run,
    so a noisy neighbour hits both sides alike."""
    fn_a()
    fn_b()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn_a()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fn_b()
        tb.append(time.perf_counter() - t0)
    return min(ta) / min(tb)


def _per_thread(rates):
    return ", ".join(f"{k} thread{'s' if k > 1 else ''} {v:.1f} GB/s" for k, v in sorted(rates.items()))


def format_table(rows, bw, bw_start=None, walk=None, fma=None, cache=None):
    """The result table as text: one line per finished row (time, rate, % of read bandwidth,
    % of the page-walk read rate, the roof and its share, speed-up over NumPy and torch), then
    the read bandwidth per thread count (``bw``, GB/s), when given the bandwidth measured at
    the start (``bw_start``), the page-walk read rate (``walk``, GB/s), the FMA rates
    (``fma``, {(threads, simd): lane-FMAs/s}) and the cache read rates (``cache``,
    {(threads, nbytes): GB/s})."""
    head = (f"{'case':<34}{'thr':>4}{'time ms':>10}{'rate':>16}{'% of bw':>9}{'% walk':>8}"
            f"{'roof GB/s':>11}{'% roof':>8}{'med %':>7}{'x numpy':>9}{'x torch':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        rate = f"{r['rate']:.1f} {r['unit']}"
        pct = f"{r['pct_bw']:.0f}%" if r["pct_bw"] is not None else "-"
        pw = f"{r['pct_walk']:.0f}%" if r.get("pct_walk") is not None else "-"
        roof = f"{r['roof'][0]:.1f} {r['roof'][1]}" if r.get("roof") else "-"
        pr = f"{r['pct_roof']:.0f}%" if r.get("pct_roof") is not None else "-"
        pm = f"{r['pct_roof_med']:.0f}%" if r.get("pct_roof_med") is not None else "-"
        xn = f"{r['numpy']:.1f}x" if r["numpy"] is not None else "-"
        xt = f"{r['torch']:.1f}x" if r["torch"] is not None else ("n/a" if r.get("ran_baselines") else "-")
        lines.append(f"{r['case']:<34}{r['threads']:>4}{r['ms']:>10.2f}{rate:>16}{pct:>9}{pw:>8}{roof:>11}{pr:>8}{pm:>7}{xn:>9}{xt:>9}")
    lines.append("")
    lines.append("read bandwidth (read_bandwidth, same run, best of the start and every round): "
                 + _per_thread(bw))
    if bw_start is not None:
        lines.append("  (at the start: "
                     + ", ".join(f"{k} thr {v:.1f} GB/s" for k, v in sorted(bw_start.items())) + ")")
    if walk:
        lines.append("page-walk read rate (page_read_bandwidth: the same buffer as 128 KiB pages in random "
                     "order, 4 at a time, row by row, no compute; the ceiling of a decode walk): "
                     + _per_thread(walk) + " = "
                     + ", ".join(f"{100 * v / bw[k]:.0f}%" for k, v in sorted(walk.items()) if k in bw)
                     + " of the read bandwidth")
    if fma:
        names = {0: "scalar", 1: "AVX2", 2: "AVX-512"}
        lines.append("roof: a = arithmetic (fma_rate, best of the start and every round: lane-FMAs/s of 12 FMA chains, times the K/V bytes "
                     f"one lane-FMA consumes: dtype bytes / {H // HKV} query heads per KV head), "
                     "w = page-walk read rate, c = cache read rate of a buffer the case's size; i8q: int8 K/V with quantize_query=True; FMA rates "
                     + ", ".join(f"{names.get(s, s)} {k} thr {v / 1e9:.1f} G/s" for (k, s), v in sorted(fma.items())))
        lines.append("% roof: the best time's rate over the best roof of any round; med %: the median "
                     "over rounds of a round's rate over the roof probed in that round, seconds apart, "
                     "not minutes (on a host whose page-walk rate moves from 30 to 50 GB/s, one lucky "
                     "probe sets the first)")
    if cache:
        lines.append("cache read rates (read_bandwidth re-reading a buffer of an in-cache case's size, best of "
                     "the start and every round): "
                     + ", ".join(f"{nb / 2**20:.0f} MiB {k} thr {v:.1f} GB/s" for (k, nb), v in sorted(cache.items())))
    return "\n".join(lines)


def _blas_threads(n):
    """Context manager limiting NumPy's BLAS to ``n`` threads (no-op without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-not-found]
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def blas_description():
    """NumPy's BLAS as threadpoolctl reports it (library, version, kernel, threads)."""
    try:
        from threadpoolctl import threadpool_info  # type: ignore[import-not-found]
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    np.ones((2, 2)) @ np.ones((2, 2))     # loads the BLAS library if nothing has yet
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}), "
                     f"{i.get('num_threads')} threads" for i in libs) or "none found"


def main(argv=None):
    """Run the benchmark and print one table; returns the list of result rows."""
    ap = argparse.ArgumentParser(prog="python -m pagedcy bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--threads", type=positive_int, default=2,
                    help="thread count of the multi-threaded cases")
    ap.add_argument("--repeats", type=positive_int, default=7,
                    help="at least this many interleaved rounds (best time reported)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="keep running rounds for at least this long (default 20, --quick 1)")
    ap.add_argument("--no-baselines", action="store_true", help="skip the NumPy / torch baselines")
    args = ap.parse_args(argv)
    nt, rep = args.threads, args.repeats
    secs = args.seconds if args.seconds is not None else (1.0 if args.quick else 20.0)
    if args.quick:
        dec_b, dec_l, long_l, pre_l, bw_bytes = 8, 512, 4096, 256, 64 * 2**20
    else:
        # 2 GiB: several times any last-level cache (the header names this CPU's),
        # so the yardstick is DRAM bandwidth
        dec_b, dec_l, long_l, pre_l, bw_bytes = 32, 2048, 32768, 1024, 2 * 2**30
    base = not args.no_baselines
    dec = f"decode {dec_b}x{dec_l}"
    prefill = f"prefill causal {pre_l} fp32"
    specs = [
        (f"{dec} fp32", "decode", dec_b, dec_l, "float32", nt, 1, 2),
        (f"{dec} fp32", "decode", dec_b, dec_l, "float32", 1, 1, 2),
        (f"decode 1x{long_l} fp32", "decode", 1, long_l, "float32", nt, 1, 2),
        (f"{dec} fp16", "decode", dec_b, dec_l, "float16", nt, 1, 2),
        (f"{dec} bf16", "decode", dec_b, dec_l, "bfloat16", nt, 1, 2),
        (prefill, "prefill", 1, pre_l, "float32", 1, pre_l, 2),
        (prefill, "prefill", 1, pre_l, "float32", nt, pre_l, 2),
        (f"{dec} int8", "decode", dec_b, dec_l, "int8", nt, 1, 2),
        (f"{dec} i8q", "decode", dec_b, dec_l, "int8", nt, 1, 2, "HND", True),
        # the same kernel with K/V resident in the last-level cache: its compute limit
        ("decode 4x256 fp32 [in cache]", "decode", 4, 256, "float32", nt, 1, 2),
        ("decode 4x256 fp16 [in cache]", "decode", 4, 256, "float16", nt, 1, 2),
        ("decode 4x256 int8 [in cache]", "decode", 4, 256, "int8", nt, 1, 2),
        ("decode 4x256 i8q [in cache]", "decode", 4, 256, "int8", nt, 1, 2, "HND", True),
    ]
    if nt == 1:
        specs = [s for i, s in enumerate(specs) if i not in (1, 5)]
    if simd_level() >= 2:
        # what a CPU without AVX-512 runs: the same cases on the AVX2 kernels
        specs += [(f"{dec} fp32 [AVX2 kernels]", "decode", dec_b, dec_l, "float32", nt, 1, 1),
                  (f"{dec} fp16 [AVX2 kernels]", "decode", dec_b, dec_l, "float16", nt, 1, 1),
                  (f"{dec} bf16 [AVX2 kernels]", "decode", dec_b, dec_l, "bfloat16", nt, 1, 1),
                  (f"{dec} int8 [AVX2 kernels]", "decode", dec_b, dec_l, "int8", nt, 1, 1),
                  (f"{dec} i8q [AVX2 kernels]", "decode", dec_b, dec_l, "int8", nt, 1, 1, "HND", True)]
        specs += [(f"{prefill} [AVX2]", "prefill", 1, pre_l, "float32", th, pre_l, 1)
                  for th in sorted({nt, 1}, reverse=True)]
        specs += [(f"decode 4x256 {n} [in cache, AVX2]", "decode", 4, 256, dt, th, 1, 1)
                  for n, dt in (("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"),
                                ("int8", "int8")) for th in sorted({nt, 1}, reverse=True)]
        specs += [("decode 4x256 i8q [in cache, AVX2]", "decode", 4, 256, "int8", th, 1, 1, "HND", True)
                  for th in sorted({nt, 1}, reverse=True)]
    # token-major pages (a C-order array; the store's pages are head-major): what the
    # layout is worth, in the same run
    specs += [(f"{dec} fp32 [NHD pages]", "decode", dec_b, dec_l, "float32", th, 1, 2, "NHD")
              for th in sorted({nt, 1}, reverse=True)]
    with Progress(len(specs) + 1, "setup") as progress:
        progress.status("read bandwidth")
        bw_buf = np.ones(bw_bytes // 4, dtype=np.float32)
        bw = {nt: read_bandwidth(num_threads=nt, repeats=rep, buffer=bw_buf)}
        if nt != 1:
            bw[1] = read_bandwidth(num_threads=1, repeats=rep, buffer=bw_buf)
        walk = {k: page_read_bandwidth(num_threads=k, repeats=1, buffer=bw_buf) for k in bw}
        progress.status("FMA rate")
        fma = {(th, min(ms, simd_level())): 0.0 for _, kind, _, _, _, th, _, ms, *_ in specs
               if kind == "decode"}
        for th, lvl in fma:
            fma[th, lvl] = fma_rate(th, lvl, repeats=3)
        progress.update()
        cache = {}
        seeds = {}
        rows = []
        for name, kind, b, l, dt, th, ql, ms, *extra in specs:
            progress.status(f"{name}: inputs")
            rows.append(bench_case(name, kind, b, l, dt, th,
                                   seeds.setdefault((b, l, ql), 1000 + len(seeds)),
                                   q_len=ql, max_simd=ms, layout=extra[0] if extra else "HND",
                                   quantize_query=len(extra) > 1 and extra[1]))
            if rows[-1]["in_cache"] and rows[-1]["kind"] == "decode":
                key = (th, rows[-1]["nbytes"])
                if key not in cache:
                    cache[key] = cache_read_rate(*key)
            progress.update()
    bw_start = dict(bw)
    with Progress(secs, "timing", unit="s") as progress:
        history = []
        rounds = time_interleaved(rows, rep, secs, bw, bw_buf, progress, walk, fma, cache, history)
    del bw_buf
    for row in rows:
        finish_row(row, bw, walk, fma, cache, history)
        del row["run"]
    if base:
        with Progress(len(rows), "baselines", unit="case") as progress:
            for row in rows:
                baseline_case(row, rep, progress)
                progress.update()
    _INPUTS.clear()
    gc.collect()
    print(f"pagedcy paged attention: H={H} Hkv={HKV} D={D} page_size={T}, random page order; "
          f"time = best of {rounds} interleaved rounds")
    print(f"CPU: {cpu_description()}; SIMD={simd_path()}; huge pages: {huge_pages()}")
    if base:
        print(f"NumPy BLAS (the baseline's matmuls, limited to each row's threads): "
              f"{blas_description()}")
    print(format_table(rows, bw, bw_start, walk, fma, cache))
    _CACHE_BUFS.clear()
    by = {(r["case"], r["threads"]): r for r in rows}
    d32, f16 = by.get((f"{dec} fp32", nt)), by.get((f"{dec} fp16", nt))
    if d32 and f16:
        line = f"fp16 vs fp32 decode speed-up ({nt} threads): {d32['ms'] / f16['ms']:.2f}x"
        a32, a16 = by.get((f"{dec} fp32 [AVX2 kernels]", nt)), by.get((f"{dec} fp16 [AVX2 kernels]", nt))
        if a32 and a16:
            line += f"; with the AVX2 kernels: {a32['ms'] / a16['ms']:.2f}x"
        print(line)
    # i8q: int8 K/V scored with integer dot products on int8 queries (quantize_query=True)
    for i8n, avx2 in (("int8", ""), ("i8q", ""), ("int8", " [AVX2 kernels]"), ("i8q", " [AVX2 kernels]")):
        i8 = by.get((f"{dec} {i8n}{avx2}", nt))
        a32, a16 = (by.get((f"{dec} {d}{avx2}", nt)) for d in ("fp32", "fp16"))
        if i8 and a32 and a16:
            print(f"{i8n} decode speed-up{avx2} ({nt} threads): "
                  f"{a32['ms'] / i8['ms']:.2f}x over fp32, {a16['ms'] / i8['ms']:.2f}x over fp16")
    p1, p2 = by.get((prefill, 1)), by.get((prefill, nt))
    if p1 and p2 and nt > 1:
        print(f"prefill scaling 1 -> {nt} threads: {p1['ms'] / p2['ms']:.2f}x")
    return rows


if __name__ == "__main__":
    main()
