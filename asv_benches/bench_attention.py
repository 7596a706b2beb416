"""asv benchmarks of pagedcy's paged attention, with NumPy / torch baselines.

Shape as in ``python -m pagedcy bench``: 32 query heads, 8 KV heads,
head_dim 128, pages in random order.
"""
import numpy as np

from pagedcy._libs._attention import (_batch_paged_attention_tuned, batch_paged_attention,
                                      simd_level)
from pagedcy.tools.bench import _median_time, make_decode, numpy_reference, paired_ratio, torch_case
from pagedcy._libs._bandwidth import page_read_bandwidth, read_bandwidth

H, HKV, D = 32, 8, 128
_BW = {}


def _bandwidth(threads, walk=False):
    """read_bandwidth (walk=False) or page_read_bandwidth over 512 MiB (the CLI bench's
    size, past any L3 seen here), once per process: asv runs each benchmark in a process of
    its own, and 2 GiB buffers made this most of CI's asv pass."""
    if (threads, walk) not in _BW:
        fn = page_read_bandwidth if walk else read_bandwidth
        _BW[threads, walk] = fn(nbytes=512 * 2**20, num_threads=threads, repeats=3)
    return _BW[threads, walk]


def _make(batch, kv_len, q_len, dtype, page_size, seed=0):
    return make_decode(batch, kv_len, dtype, np.random.default_rng(seed), q_len, page_size)


def _seconds(fn, repeats=5):
    """Median seconds of ``repeats`` calls after a warm-up (the same timer as the CLI bench)."""
    return _median_time(fn, repeats)


class Decode:
    """Batched decode (one query row per sequence)."""
    params = ([1, 32], [2048, 8192], ["float32", "float16", "bfloat16", "int8"], [1, 2], [16])
    param_names = ["batch", "kv_len", "dtype", "threads", "page_size"]
    timeout = 300

    def setup(self, batch, kv_len, dtype, threads, page_size):
        if batch * kv_len > 32 * 2048:
            raise NotImplementedError("grid kept small: at most 64k cached tokens")
        self.args = _make(batch, kv_len, 1, dtype, page_size)
        self.out = np.empty_like(self.args[0])
        self.threads = threads
        self.nbytes = self.args[2].nbytes
        self.run()

    def run(self):
        q, ind, pages, bt, lens = self.args
        batch_paged_attention(q, ind, pages, 0, bt, lens, out=self.out, num_threads=self.threads)

    def time_decode(self, *p):
        self.run()

    def peakmem_decode(self, *p):
        self.run()

    def track_gbps(self, *p):
        return self.nbytes / _seconds(self.run) / 1e9
    track_gbps.unit = "GB/s"

    def track_pct_of_bandwidth(self, *p):
        return 100.0 * self.track_gbps() / _bandwidth(self.threads)
    track_pct_of_bandwidth.unit = "% of read bandwidth"

    def track_pct_of_page_walk(self, *p):
        """Rate as a share of page_read_bandwidth: the same random-page walk with no compute."""
        return 100.0 * self.track_gbps() / _bandwidth(self.threads, walk=True)
    track_pct_of_page_walk.unit = "% of page-walk read rate"

    def track_speedup_vs_numpy(self, batch, kv_len, dtype, threads, page_size):
        q, ind, pages, bt, lens = self.args
        ref = _seconds(lambda: numpy_reference(q, ind, pages, bt, lens, dtype, False), 2)
        return ref / _seconds(self.run)
    track_speedup_vs_numpy.unit = "x"


class DecodeSimdLevel:
    """Headline decode (32 x 2048, 2 threads) per kernel instruction set
    (1 AVX2, 2 AVX-512; a level the CPU lacks is skipped); "int8-q": int8 K/V
    with ``quantize_query=True`` (integer q.k)."""
    params = ([1, 2], ["float32", "float16", "bfloat16", "int8", "int8-q"])
    param_names = ["simd", "dtype"]
    timeout = 300

    def setup(self, simd, dtype):
        if simd > simd_level():
            raise NotImplementedError(f"this CPU (or PAGEDCY_SIMD) stops at level {simd_level()}")
        self.args = _make(32, 2048, 1, dtype.removesuffix("-q"), 16)
        self.out = np.empty_like(self.args[0])
        self.simd = simd
        self.qq = dtype.endswith("-q")
        self.run()

    def run(self):
        q, ind, pages, bt, lens = self.args
        _batch_paged_attention_tuned(q, ind, pages, 0, bt, lens, out=self.out, num_threads=2,
                                     max_simd=self.simd, quantize_query=self.qq)

    def time_decode(self, simd, dtype):
        self.run()


class DecodeFp16Speedup:
    """fp16-vs-fp32 decode speed-up (32 x 2048, 2 threads) per instruction set,
    from alternating runs over the same block tables (the issue's 1.6x target)."""
    params = ([1, 2],)
    param_names = ["simd"]
    timeout = 300

    def setup(self, simd):
        if simd > simd_level():
            raise NotImplementedError(f"this CPU (or PAGEDCY_SIMD) stops at level {simd_level()}")
        self.q, self.ind, self.p32, self.bt, self.lens = _make(32, 2048, 1, "float32", 16)
        self.p16 = self.p32.astype(np.float16)
        self.out = np.empty_like(self.q)
        self.simd = simd

    def _run(self, pages):
        _batch_paged_attention_tuned(self.q, self.ind, pages, 0, self.bt, self.lens, out=self.out,
                                     num_threads=2, max_simd=self.simd)

    def track_fp16_speedup_over_fp32(self, simd):
        return paired_ratio(lambda: self._run(self.p32), lambda: self._run(self.p16), 9)
    track_fp16_speedup_over_fp32.unit = "x"


class DecodePageLayout:
    """Head-major pages (the store's layout) against token-major (C-order) pages on
    32 x 2048 float32 decode from DRAM, from alternating runs of the same values."""
    params = ([1, 2],)
    param_names = ["threads"]
    timeout = 300

    def setup(self, threads):
        args = {lay: make_decode(32, 2048, "float32", np.random.default_rng(0), layout=lay)
                for lay in ("HND", "NHD")}
        self.q, self.ind, self.hnd, self.bt, self.lens = args["HND"]
        self.nhd = args["NHD"][2]
        self.out = np.empty_like(self.q)
        self.threads = threads

    def _run(self, pages):
        batch_paged_attention(self.q, self.ind, pages, 0, self.bt, self.lens, out=self.out,
                              num_threads=self.threads)

    def track_hnd_speedup_over_nhd(self, threads):
        return paired_ratio(lambda: self._run(self.nhd), lambda: self._run(self.hnd), 9)
    track_hnd_speedup_over_nhd.unit = "x"


class DecodeSpeedupVsTorch:
    """pagedcy decode time / torch SDPA (contiguous K/V) time, measured in one process."""
    params = ([32], [2048], ["float32"], [1, 2])
    param_names = ["batch", "kv_len", "dtype", "threads"]
    timeout = 300

    def setup(self, batch, kv_len, dtype, threads):
        q, ind, pages, bt, lens = self.args = _make(batch, kv_len, 1, dtype, 16)
        self.torch_run = torch_case(q, pages, bt, lens, dtype, False, threads)
        if self.torch_run is None:
            raise NotImplementedError("torch not installed")
        self.out = np.empty_like(q)
        self.threads = threads

    def track_speedup_vs_torch(self, *p):
        q, ind, pages, bt, lens = self.args
        ours = _seconds(lambda: batch_paged_attention(q, ind, pages, 0, bt, lens, out=self.out,
                                                      num_threads=self.threads))
        return _seconds(self.torch_run, 3) / ours
    track_speedup_vs_torch.unit = "x"


class DecodeNumpy:
    """NumPy reference decode (gather pages + batched matmul/softmax)."""
    params = ([32], [2048], ["float32"])
    param_names = ["batch", "kv_len", "dtype"]
    timeout = 300

    def setup(self, batch, kv_len, dtype):
        self.args = _make(batch, kv_len, 1, dtype, 16)

    def time_decode_numpy(self, batch, kv_len, dtype):
        numpy_reference(*self.args, dtype, False)


class DecodeCacheVsDram:
    """The same decode kernel with K/V resident in the last-level cache (4 x 256 tokens,
    8 MiB in fp32) and streamed from DRAM (32 x 2048, 512 MiB): side by side, the
    kernel's compute limit and how much of it DRAM-resident decode keeps."""
    params = (["float32", "float16", "bfloat16", "int8"], [1, 2])
    param_names = ["dtype", "threads"]
    timeout = 300

    def setup(self, dtype, threads):
        self.cases = {where: _make(b, n, 1, dtype, 16) for where, b, n in
                      (("cache", 4, 256), ("dram", 32, 2048))}
        self.outs = {k: np.empty_like(v[0]) for k, v in self.cases.items()}
        self.threads = threads

    def _gbps(self, where):
        q, ind, pages, bt, lens = self.cases[where]
        out = self.outs[where]
        # many calls per timing on the small case: Python overhead stays out of the rate
        rep = max(1, (64 << 20) // pages.nbytes)
        t = _seconds(lambda: _batch_paged_attention_tuned(q, ind, pages, 0, bt, lens, out=out,
                                                          num_threads=self.threads, repeat=rep))
        return pages.nbytes * rep / t / 1e9

    def track_gbps_cache_resident(self, dtype, threads):
        return self._gbps("cache")
    track_gbps_cache_resident.unit = "GB/s"

    def track_gbps_dram_resident(self, dtype, threads):
        return self._gbps("dram")
    track_gbps_dram_resident.unit = "GB/s"


class DecodeTorch:
    """torch SDPA decode on contiguous K/V (skipped without torch)."""
    params = ([32], [2048], ["float32"], [1, 2])
    param_names = ["batch", "kv_len", "dtype", "threads"]
    timeout = 300

    def setup(self, batch, kv_len, dtype, threads):
        q, ind, pages, bt, lens = _make(batch, kv_len, 1, dtype, 16)
        self.run = torch_case(q, pages, bt, lens, dtype, False, threads)
        if self.run is None:
            raise NotImplementedError("torch not installed")

    def time_decode_torch(self, *p):
        self.run()


class Prefill:
    """Causal prefill of one sequence."""
    params = ([256, 1024], [1, 2])
    param_names = ["q_len", "threads"]
    timeout = 300

    def setup(self, q_len, threads):
        self.args = _make(1, q_len, q_len, "float32", 16)
        self.out = np.empty_like(self.args[0])
        self.threads = threads
        self.flops = 4.0 * D * H * q_len * (q_len + 1) / 2
        self.run()

    def run(self):
        q, ind, pages, bt, lens = self.args
        batch_paged_attention(q, ind, pages, 0, bt, lens, out=self.out, num_threads=self.threads)

    def time_prefill(self, *p):
        self.run()

    def peakmem_prefill(self, *p):
        self.run()

    def track_gflops(self, *p):
        return self.flops / _seconds(self.run, 3) / 1e9
    track_gflops.unit = "GFLOP/s"

    def _run_flags(self, flags):
        q, ind, pages, bt, lens = self.args
        _batch_paged_attention_tuned(q, ind, pages, 0, bt, lens, out=self.out,
                                     num_threads=self.threads, flags=flags)

    def track_speedup_over_one_page(self, *p):
        """Up to 4 pages per packed step (the default) over one page a step (the private
        flag ``pack1``): time(one page) / time(default), alternating, best of each."""
        return paired_ratio(lambda: self._run_flags(["pack1"]), lambda: self._run_flags(0), 7)
    track_speedup_over_one_page.unit = "x"


class PrefillNumpy:
    params = ([256, 1024],)
    param_names = ["q_len"]
    timeout = 300

    def setup(self, q_len):
        self.args = _make(1, q_len, q_len, "float32", 16)

    def time_prefill_numpy(self, q_len):
        numpy_reference(*self.args, "float32", True)


class PrefillTorch:
    params = ([256, 1024], [1, 2])
    param_names = ["q_len", "threads"]
    timeout = 300

    def setup(self, q_len, threads):
        q, ind, pages, bt, lens = _make(1, q_len, q_len, "float32", 16)
        self.run = torch_case(q, pages, bt, lens, "float32", True, threads)
        if self.run is None:
            raise NotImplementedError("torch not installed")

    def time_prefill_torch(self, *p):
        self.run()


def track_read_bandwidth():
    """Best 2-thread read bandwidth over a 2 GiB buffer (the yardstick of the % figures)."""
    return read_bandwidth(2 * 2**30, num_threads=2, repeats=3)
track_read_bandwidth.unit = "GB/s"


class PageWalk:
    """page_read_bandwidth (2 GiB as 128 KiB pages in random order, 4 at a time, no compute)
    as a share of read_bandwidth, per thread count: how much of the sequential read rate a
    decode-style page walk can reach on this CPU at all."""
    params = ([1, 2],)
    param_names = ["threads"]
    timeout = 300

    def track_page_walk_pct_of_read_bandwidth(self, threads):
        buf = np.ones(2 * 2**30 // 4, np.float32)
        bw = walk = 0.0
        for _ in range(3):                 # alternate, so both see the same neighbours
            bw = max(bw, read_bandwidth(num_threads=threads, repeats=1, buffer=buf))
            walk = max(walk, page_read_bandwidth(num_threads=threads, repeats=1, buffer=buf))
        return 100.0 * walk / bw
    track_page_walk_pct_of_read_bandwidth.unit = "% of read bandwidth"
