"""``python -m pagedcy demo``: a short sliding-window run, then a continuous-batching run.

The continuous-batching part serves a few hundred requests whose prompts share a handful
of system prefixes. Requests arrive over time; each is admitted when pages allow,
prefilled (only the part the prefix cache does not hold), then decoded together with
every other running request in one batched executor step. Some requests fork a sibling
(parallel sampling: copy-on-write pages), and under memory pressure the newest running
sequences are swapped out and later swapped back in. The run ends with a summary and a
leak check; the exit code is 1 if any page leaked.
"""
import sys
import time
from collections import deque

import numpy as np

from pagedcy import EvictionPolicy, PagedKVCache, PagedKVCacheConfig, PoolExhaustedError
from pagedcy.serving.executor import PagedAttentionExecutor, PagedExecutorConfig
from pagedcy.serving.manager import AllocationRequest, MemoryPressure, PagedKVCacheManager


def sliding_window(args):
    """Stream tokens through a small LRU cache; return the summary dict."""
    cfg = PagedKVCacheConfig(page_size=16, max_pages=64, num_layers=4, num_kv_heads=4,
                             head_dim=64, eviction=EvictionPolicy.LRU)
    cache = PagedKVCache(cfg)
    rng = np.random.default_rng(args.seed)
    n_tokens = 2_000 if args.quick else 10_000
    chunk = 64
    k = rng.standard_normal((cfg.num_layers, chunk, cfg.kv_dim()), dtype=np.float32)
    t0 = time.perf_counter()
    peak = 0
    for start in range(0, n_tokens, chunk):
        n = min(chunk, n_tokens - start)
        cache.append_tokens(k[:, :n], k[:, :n])
        peak = max(peak, cache.num_pages())
    assert cache.seq_len() + cache.evicted_tokens() == n_tokens
    elapsed = time.perf_counter() - t0
    return {
        "tokens appended": n_tokens,
        "tokens held": cache.seq_len(),
        "tokens evicted": cache.evicted_tokens(),
        "pages used": f"{cache.num_pages()} of {cfg.max_pages} (peak {peak})",
        "append rate": f"{n_tokens / elapsed:,.0f} tokens/s",
    }


class _Progress:
    """A one-line ``\\r`` progress bar; silent when disabled or stdout is not a terminal."""

    def __init__(self, total, enabled):
        self.total = total
        self.enabled = enabled and sys.stdout.isatty()
        self.last = 0.0

    def update(self, done, extra, force=False):
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        fill = int(width * done / max(self.total, 1))
        sys.stdout.write(f"\r  [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} {extra}  ")
        sys.stdout.flush()

    def close(self):
        if self.enabled:
            sys.stdout.write("\n")
            sys.stdout.flush()


class _Req:
    __slots__ = ("rid", "prompt", "max_new", "arrival", "handle", "tokens", "generated",
                 "swapped", "forked")

    def __init__(self, rid, prompt, max_new, arrival):
        self.rid, self.prompt, self.max_new, self.arrival = rid, prompt, max_new, arrival
        self.handle = None
        self.tokens = []
        self.generated = 0
        self.swapped = self.forked = False


def continuous_batching(args):
    """Serve ``args.requests`` requests with prefix caching, forks and swap; returns
    (summary dict, leaked: bool)."""
    rng = np.random.default_rng(args.seed)
    n_req = args.requests if args.requests is not None else 300
    if args.quick:
        n_req = min(n_req, 60)
    ecfg = PagedExecutorConfig(vocab_size=512, num_layers=2, num_heads=8, num_kv_heads=2,
                               head_dim=32, max_sequence_length=512)
    page = 16
    max_pages = 160 if args.quick else 256
    cfg = PagedKVCacheConfig(page, max_pages, ecfg.num_layers, ecfg.num_kv_heads, ecfg.head_dim)
    mgr = PagedKVCacheManager(cfg, enable_prefix_cache=True, swap_pages=max_pages,
                              high_watermark=0.85, critical_watermark=0.95)
    ex = PagedAttentionExecutor(ecfg, mgr)
    pressure_events = []
    mgr.set_pressure_callback(lambda new, old: pressure_events.append(new))

    prefixes = [rng.integers(0, ecfg.vocab_size, int(n)) for n in rng.integers(32, 97, 6)]
    arrivals = np.floor(np.cumsum(rng.exponential(0.4, n_req))).astype(int)
    reqs = deque()
    for i in range(n_req):
        pre = prefixes[int(rng.integers(len(prefixes)))]
        user = rng.integers(0, ecfg.vocab_size, int(rng.integers(4, 41)))
        reqs.append(_Req(f"r{i}", np.concatenate([pre, user]), int(rng.integers(16, 161)),
                         int(arrivals[i])))
    total = n_req
    max_batch = 64
    fork_prob = 0.1
    running, swapped = [], deque()
    done = forks = prompt_tokens = computed_prompt = generated = steps = 0
    batch_sizes = []
    bar = _Progress(total, not args.no_progress)
    t0 = time.perf_counter()

    finished = []

    def finish(r):
        nonlocal done
        finished.append(r)
        mgr.deallocate(r.handle)
        r.handle = None
        done += 1

    def next_tokens(logits):
        return np.argmax(logits, axis=-1)

    while reqs or running or swapped:
        # 1. Bring swapped sequences back first (FIFO) when memory allows.
        while swapped and mgr.check_pressure() == MemoryPressure.LOW \
                and mgr.free_blocks() >= swapped[0].handle.num_blocks() + len(running) + 1:
            r = swapped.popleft()
            mgr.swap_in(r.handle)
            running.append(r)
        # 2. Admit arrived requests while pages and batch slots allow.
        while (reqs and reqs[0].arrival <= steps and not swapped and len(running) < max_batch
               and mgr.check_pressure() == MemoryPressure.LOW):
            r = reqs[0]
            req = AllocationRequest(request_id=r.rid, prompt_tokens=r.prompt,
                                    max_sequence_length=ecfg.max_sequence_length)
            if not mgr.can_allocate(req):
                break
            reqs.popleft()
            r.handle = mgr.allocate(req)
            prompt_tokens += len(r.prompt)
            computed_prompt += len(r.prompt) - r.handle.num_cached_tokens()
            out = ex.prefill(r.prompt[None], [r.handle])
            last = out.logits[0, -1]
            r.tokens.append(int(np.argmax(last)))
            r.generated = 1
            running.append(r)
            if rng.random() < fork_prob and len(running) < max_batch:
                # Parallel sampling: the sibling shares every page and takes the runner-up
                # token; its first decode write copies the shared last page.
                c = _Req(r.rid + "-fork", r.prompt, int(rng.integers(8, 33)), r.arrival)
                c.handle = mgr.fork(r.handle, c.rid)
                c.tokens.append(int(np.argsort(last)[-2]))
                c.forked = True
                c.generated = 1
                running.append(c)
                forks += 1
                total += 1
                bar.total = total
        if not running:
            if swapped:
                continue
            steps += 1
            continue
        # 3. Make room for this step: a new block for rows at a page boundary, a private
        #    copy for rows whose last page is shared. Under CRITICAL pressure or when that
        #    does not fit, preempt the newest rows by swapping them out (vLLM's policy).
        while True:
            rc = mgr.pool.ref_counts()
            need = 0
            for r in running:
                n = r.handle.num_tokens()
                if n % page == 0:
                    need += 1
                elif rc[r.handle.block_table()[n // page]] > 1:
                    need += 1
            if len(running) == 1 or (need <= mgr.free_blocks()
                                     and mgr.check_pressure() < MemoryPressure.CRITICAL):
                break
            victim = running.pop()
            mgr.swap_out(victim.handle)
            victim.swapped = True
            swapped.append(victim)
        # 4. One batched decode step for every running sequence.
        ids = np.array([r.tokens[-1] for r in running])
        try:
            out = ex.decode(ids, [r.handle for r in running])
        except PoolExhaustedError:
            victim = running.pop()
            mgr.swap_out(victim.handle)
            victim.swapped = True
            swapped.append(victim)
            continue
        batch_sizes.append(len(running))
        nxt = next_tokens(out.logits)
        generated += len(running)
        still = []
        for r, t in zip(running, nxt.tolist()):
            r.tokens.append(t)
            r.generated += 1
            if r.generated >= r.max_new:
                finish(r)
            else:
                still.append(r)
        running = still
        steps += 1
        bar.update(done, f"running {len(running):2d} swapped {len(swapped):2d} "
                         f"pages {mgr.used_blocks():3d}/{max_pages}")
    elapsed = time.perf_counter() - t0
    bar.update(done, "", force=True)
    bar.close()

    s = mgr.stats()
    # Leak check: nothing held, every remaining allocated page is an evictable cached
    # page, and dropping the prefix cache returns the pool to empty.
    leaked = False
    try:
        mgr.check_invariants()
    except AssertionError:
        leaked = True
    leaked |= (s.used_blocks != 0 or s.num_handles != 0
               or mgr.pool.allocated_count() != s.cached_blocks
               or s.swap_used_blocks != 0)
    cached_at_end = s.cached_blocks
    mgr.reset_prefix_cache()
    leaked |= mgr.pool.free_count() != max_pages
    replayed, mismatched = _replay(ecfg, page, [r for r in finished if r.swapped][:2]
                                   + [r for r in finished if r.forked][:2])
    st = ex.status()
    summary = {
        "requests": f"{n_req} (+{forks} forks) finished {done}",
        "prompt tokens": f"{prompt_tokens:,} ({computed_prompt:,} computed, "
                         f"{prompt_tokens - computed_prompt:,} from prefix cache)",
        "generated tokens": f"{generated:,} in {len(batch_sizes)} batched decode steps "
                            f"(mean batch {np.mean(batch_sizes) if batch_sizes else 0:.1f})",
        "throughput": f"{(computed_prompt + generated) / elapsed:,.0f} tokens/s "
                      f"({generated / elapsed:,.0f} generated tokens/s, {elapsed:.1f} s)",
        "prefix-cache hit": f"{100 * s.prefix_hit_rate:.1f}% of prompt tokens",
        "peak pages used": f"{s.peak_used_blocks} of {max_pages} "
                           f"({s.peak_bytes / 2**20:.1f} MiB of {s.total_bytes / 2**20:.1f} MiB)",
        "swaps": f"{s.swap_outs} out, {s.swap_ins} in",
        "forks / COW copies": f"{s.forks} / {s.cow_copies}",
        "cache evictions": f"{s.evictions}",
        "pressure changes": f"{len(pressure_events)} "
                            f"(CRITICAL {sum(e == MemoryPressure.CRITICAL for e in pressure_events)})",
        "avg step": f"prefill {st.avg_prefill_time_ms:.2f} ms, "
                    f"decode {st.avg_decode_time_ms:.2f} ms",
        "replay check": (f"{replayed} swapped/forked requests re-run alone from scratch: "
                         + ("MISMATCH" if mismatched else "same tokens")),
        "leak check": ("LEAKED pages" if leaked else
                       f"ok (0 pages held, {cached_at_end} cached pages released by reset)"),
    }
    return summary, leaked or mismatched > 0


def _replay(ecfg, page, reqs):
    """Re-run requests alone on a fresh cache (no prefix cache, no swap, no sharing) and
    check every recorded greedy token is still a top logit (within float noise).
    Returns (number replayed, number that disagree)."""
    bad = 0
    for r in reqs:
        n = len(r.prompt) + len(r.tokens)
        cfg = PagedKVCacheConfig(page, -(-n // page) + 1, ecfg.num_layers, ecfg.num_kv_heads,
                                 ecfg.head_dim)
        ex = PagedAttentionExecutor(ecfg, PagedKVCacheManager(cfg))
        out = ex.prefill(r.prompt[None])
        h = out.kv_cache
        logits = out.logits[0, -1]
        for i, t in enumerate(r.tokens):
            # A fork's first token is the runner-up by design; every later one is greedy.
            if not (r.forked and i == 0) and logits[t] < logits.max() - 1e-4:
                bad += 1
                break
            if i + 1 < len(r.tokens):
                logits = ex.decode(np.array([t]), [h]).logits[0]
    return len(reqs), bad


def main(args):
    """Run both demo sections and print their summaries; 1 if a page leaked, else 0."""
    summary = sliding_window(args)
    print("pagedcy demo 1/2: sliding-window (LRU) paged KV cache")
    for k, v in summary.items():
        print(f"  {k:>18}: {v}")
    print("pagedcy demo 2/2: continuous batching (prefix cache, fork, swap)")
    sys.stdout.flush()
    summary, leaked = continuous_batching(args)
    for k, v in summary.items():
        print(f"  {k:>18}: {v}")
    return 1 if leaked else 0
