"""asv benchmarks of pagedcy's paged attention, with NumPy / torch baselines.

Shape as in ``python -m pagedcy bench``: 32 query heads, 8 KV heads,
head_dim 128, pages in random order.
"""
import math

import numpy as np

from pagedcy._attention import batch_paged_attention
from pagedcy._bandwidth import read_bandwidth

H, HKV, D = 32, 8, 128
_BW = {}


def _bandwidth(threads):
    if threads not in _BW:
        _BW[threads] = read_bandwidth(256 * 2**20, num_threads=threads, repeats=3)
    return _BW[threads]


def _storage(x, dtype):
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return x


def _f32(x, dtype):
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32, copy=False)


def _make(batch, kv_len, q_len, dtype, page_size, seed=0):
    rng = np.random.default_rng(seed)
    npg = -(-kv_len // page_size)
    total = batch * npg
    pages = _storage(rng.standard_normal((total, 1, 2, page_size, HKV, D), dtype=np.float32), dtype)
    bt = rng.permutation(total).astype(np.int32).reshape(batch, npg)
    q = rng.standard_normal((batch * q_len, H, D), dtype=np.float32)
    indptr = np.arange(0, batch * q_len + 1, q_len, dtype=np.int32)
    lens = np.full(batch, kv_len, dtype=np.int32)
    return q, indptr, pages, bt, lens


def _contiguous_kv(pages, bt, kv_len, dtype):
    B = bt.shape[0]
    kv = _f32(pages[bt][:, :, 0], dtype)
    kv = kv.transpose(0, 2, 4, 1, 3, 5).reshape(B, 2, HKV, -1, D)[:, :, :, :kv_len]
    return np.ascontiguousarray(kv[:, 0]), np.ascontiguousarray(kv[:, 1])


def _numpy_attention(q, pages, bt, kv_len, q_len, dtype, causal):
    B = bt.shape[0]
    K, V = _contiguous_kv(pages, bt, kv_len, dtype)
    G = H // HKV
    qq = q.reshape(B, q_len, HKV, G, D).transpose(0, 2, 3, 1, 4).reshape(B, HKV, G * q_len, D)
    s = np.matmul(qq, K.transpose(0, 1, 3, 2)) / math.sqrt(D)
    if causal and q_len > 1:
        mask = np.arange(kv_len)[None, :] > (kv_len - q_len + np.arange(q_len))[:, None]
        s = s.reshape(B, HKV, G, q_len, kv_len)
        s[..., mask] = -np.inf
        s = s.reshape(B, HKV, G * q_len, kv_len)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, V)


class Decode:
    """Batched decode (one query row per sequence)."""
    params = ([1, 32], [2048, 8192], ["float32", "float16", "bfloat16"], [1, 2], [16])
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

    def _seconds(self, repeats=5):
        import time
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.run()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    def time_decode(self, *p):
        self.run()

    def peakmem_decode(self, *p):
        self.run()

    def track_gbps(self, *p):
        return self.nbytes / self._seconds() / 1e9
    track_gbps.unit = "GB/s"

    def track_pct_of_bandwidth(self, *p):
        return 100.0 * self.track_gbps() / _bandwidth(self.threads)
    track_pct_of_bandwidth.unit = "% of read bandwidth"


class DecodeNumpy:
    """NumPy reference decode (gather pages + batched matmul/softmax)."""
    params = ([32], [2048], ["float32"])
    param_names = ["batch", "kv_len", "dtype"]
    timeout = 300

    def setup(self, batch, kv_len, dtype):
        self.args = _make(batch, kv_len, 1, dtype, 16)

    def time_decode_numpy(self, batch, kv_len, dtype):
        q, ind, pages, bt, lens = self.args
        _numpy_attention(q, pages, bt, kv_len, 1, dtype, False)


class DecodeTorch:
    """torch SDPA decode on contiguous K/V (skipped without torch)."""
    params = ([32], [2048], ["float32"], [1, 2])
    param_names = ["batch", "kv_len", "dtype", "threads"]
    timeout = 300

    def setup(self, batch, kv_len, dtype, threads):
        try:
            import torch
        except ImportError:
            raise NotImplementedError("torch not installed")
        q, ind, pages, bt, lens = _make(batch, kv_len, 1, dtype, 16)
        K, V = _contiguous_kv(pages, bt, kv_len, dtype)
        self.torch = torch
        torch.set_num_threads(threads)
        self.K, self.V = torch.from_numpy(K), torch.from_numpy(V)
        self.q = torch.from_numpy(q.reshape(batch, 1, H, D).transpose(0, 2, 1, 3).copy())

    def time_decode_torch(self, *p):
        with self.torch.no_grad():
            self.torch.nn.functional.scaled_dot_product_attention(self.q, self.K, self.V, enable_gqa=True)


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
        import time
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            self.run()
            ts.append(time.perf_counter() - t0)
        return self.flops / float(np.median(ts)) / 1e9
    track_gflops.unit = "GFLOP/s"


class PrefillNumpy:
    params = ([256, 1024],)
    param_names = ["q_len"]
    timeout = 300

    def setup(self, q_len):
        self.args = _make(1, q_len, q_len, "float32", 16)

    def time_prefill_numpy(self, q_len):
        q, ind, pages, bt, lens = self.args
        _numpy_attention(q, pages, bt, q_len, q_len, "float32", True)


class PrefillTorch:
    params = ([256, 1024], [1, 2])
    param_names = ["q_len", "threads"]
    timeout = 300

    def setup(self, q_len, threads):
        try:
            import torch
        except ImportError:
            raise NotImplementedError("torch not installed")
        q, ind, pages, bt, lens = _make(1, q_len, q_len, "float32", 16)
        K, V = _contiguous_kv(pages, bt, q_len, "float32")
        self.torch = torch
        torch.set_num_threads(threads)
        self.K, self.V = torch.from_numpy(K), torch.from_numpy(V)
        self.q = torch.from_numpy(q.reshape(1, q_len, H, D).transpose(0, 2, 1, 3).copy())

    def time_prefill_torch(self, *p):
        with self.torch.no_grad():
            self.torch.nn.functional.scaled_dot_product_attention(self.q, self.K, self.V,
                                                                  is_causal=True, enable_gqa=True)


def track_read_bandwidth():
    """Best 2-thread read bandwidth (the yardstick of the % figures)."""
    return read_bandwidth(256 * 2**20, num_threads=2, repeats=3)
track_read_bandwidth.unit = "GB/s"
