"""asv benchmarks for the multi-sequence layer: allocate/deallocate (with and without prefix
hits), fork + copy-on-write, swap out/in, and one executor decode step."""
import numpy as np

from pagedcy import PagedKVCacheConfig
from pagedcy.kvcache.executor import PagedAttentionExecutor, PagedExecutorConfig
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheManager

PS = 16


def _manager(max_pages, prefix=False, swap_pages=0, layers=2, heads=8, head_dim=128):
    cfg = PagedKVCacheConfig(PS, max_pages, layers, heads, head_dim)
    return PagedKVCacheManager(cfg, enable_prefix_cache=prefix, swap_pages=swap_pages)


class AllocateDeallocate:
    """64 requests of a 512-token prompt, allocated then deallocated.

    prefix=True: every prompt shares its first 496 tokens, so after the first request
    all but one page per request come from the prefix cache."""

    params = [[False, True]]
    param_names = ["prefix_hits"]

    def setup(self, prefix):
        self.mgr = _manager(2048, prefix=True)
        rng = np.random.default_rng(0)
        shared = rng.integers(0, 32000, 496)
        self.prompts = [np.concatenate([shared if prefix else rng.integers(0, 32000, 496),
                                        rng.integers(0, 32000, 16)]) for _ in range(64)]
        # Prime the cache the way a server would: the first request's pages are written.
        h = self.mgr.allocate(AllocationRequest(prompt_tokens=self.prompts[0]))
        kv = np.zeros((512, 1024), np.float32)
        for layer in range(2):
            self.mgr.write_kv_tokens(h, layer, 0, kv, kv)
        self.mgr.deallocate(h)

    def time_allocate_deallocate_64(self, prefix):
        mgr = self.mgr
        hs = [mgr.allocate(AllocationRequest(prompt_tokens=p)) for p in self.prompts]
        for h in hs:
            mgr.deallocate(h)

    def peakmem_allocate_64(self, prefix):
        mgr = self.mgr
        hs = [mgr.allocate(AllocationRequest(prompt_tokens=p)) for p in self.prompts]
        for h in hs:
            mgr.deallocate(h)

    def track_prefix_hit_rate(self, prefix):
        mgr = self.mgr
        before = mgr.stats()
        hs = [mgr.allocate(AllocationRequest(prompt_tokens=p)) for p in self.prompts]
        cached = sum(h.num_cached_tokens() for h in hs)
        for h in hs:
            mgr.deallocate(h)
        del before
        return cached / sum(len(p) for p in self.prompts)
    track_prefix_hit_rate.unit = "fraction"


class ForkCopyOnWrite:
    """fork() a 1024-token sequence, then write one token into its last (shared) page:
    the write copies that page (2 layers x 2 x 16 x 1024 floats)."""

    def setup(self):
        self.mgr = _manager(512)
        self.parent = self.mgr.allocate(AllocationRequest(initial_tokens=1024))
        kv = np.ones((1024, 1024), np.float32)
        for layer in range(2):
            self.mgr.write_kv_tokens(self.parent, layer, 0, kv, kv)
        self.row = np.ones(1024, np.float32)

    def time_fork_and_first_write(self):
        child = self.mgr.fork(self.parent)
        self.mgr.write_kv(child, 0, 1023, self.row, self.row)
        self.mgr.deallocate(child)

    def time_fork_only(self):
        self.mgr.deallocate(self.mgr.fork(self.parent))

    def peakmem_fork_and_first_write(self):
        child = self.mgr.fork(self.parent)
        self.mgr.write_kv(child, 0, 1023, self.row, self.row)
        self.mgr.deallocate(child)


class SwapOutIn:
    """swap_out then swap_in of a 2048-token sequence (128 pages, 32 MiB at fp32)."""

    params = [["memory", "file"]]
    param_names = ["backing"]

    def setup(self, backing):
        import tempfile
        import os
        self.tmp = tempfile.mkdtemp()
        cfg = PagedKVCacheConfig(PS, 256, 2, 8, 128)
        path = os.path.join(self.tmp, "swap.bin") if backing == "file" else None
        self.mgr = PagedKVCacheManager(cfg, swap_pages=256, swap_path=path)
        self.h = self.mgr.allocate(AllocationRequest(initial_tokens=2048))
        kv = np.ones((2048, 1024), np.float32)
        for layer in range(2):
            self.mgr.write_kv_tokens(self.h, layer, 0, kv, kv)
        self.nbytes = 128 * cfg.bytes_per_page()

    def teardown(self, backing):
        import shutil
        del self.mgr
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_swap_out_in(self, backing):
        self.mgr.swap_out(self.h)
        self.mgr.swap_in(self.h)

    def peakmem_swap_out_in(self, backing):
        self.mgr.swap_out(self.h)
        self.mgr.swap_in(self.h)

    def track_swap_gbps(self, backing):
        import time
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            self.mgr.swap_out(self.h)
            self.mgr.swap_in(self.h)
            best = min(best, time.perf_counter() - t0)
        return 2 * self.nbytes / best / 1e9
    track_swap_gbps.unit = "GB/s"


class ExecutorDecodeStep:
    """One batched executor decode step: write K/V for every row, one kernel call, logits."""

    params = [[8, 64], [256, 1024]]
    param_names = ["batch", "kv_len"]
    timeout = 300

    def setup(self, batch, kv_len):
        cfg = PagedExecutorConfig(vocab_size=32000, num_layers=1, num_heads=32, num_kv_heads=8,
                                  head_dim=128, max_sequence_length=kv_len + 64)
        pages_per_seq = (kv_len + 64) // PS + 1
        self.mgr = PagedKVCacheManager(PagedKVCacheConfig(PS, batch * pages_per_seq, 1, 8, 128))
        self.ex = PagedAttentionExecutor(cfg, self.mgr)
        rng = np.random.default_rng(0)
        self.handles = []
        kv = rng.standard_normal((kv_len, 1024), dtype=np.float32)
        for _ in range(batch):
            h = self.mgr.allocate(AllocationRequest(initial_tokens=kv_len,
                                                    max_sequence_length=kv_len + 64))
            self.mgr.write_kv_tokens(h, 0, 0, kv, kv)
            self.handles.append(h)
        self.ids = rng.integers(0, 32000, batch)

    def time_decode_step(self, batch, kv_len):
        self.ex.decode(self.ids, self.handles)
        for h in self.handles:       # keep kv_len fixed across repeats
            h.set_num_tokens(h.num_tokens() - 1)

    def peakmem_decode_step(self, batch, kv_len):
        self.ex.decode(self.ids, self.handles)
        for h in self.handles:
            h.set_num_tokens(h.num_tokens() - 1)
