"""The KV page store over loopback: GB/s of page writes and reads against the prefill time of
the same pages, on the engine bench's 55M Llama (8 layers, 2 KV heads of 64, page 16,
float32: 256 KiB a page).

``python asv_benches/kv_store_bandwidth.py [--pages 256] [--url URL]``: without ``--url``
it starts a throwaway ``redis-server`` on a unix socket (``--tcp``: on a loopback port).
Writes and reads go through the store's own path (:class:`~pagedcy.kvcache.kvstore.KVStore`:
encoding, pipelined SETs, MGETs of growing batches, header and crc32 checks); the prefill is
the engine computing the same prompts without a store. Best of ``--rounds``.
"""
import argparse
import os
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=256, help="pages moved per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--url", default=None)
    ap.add_argument("--tcp", action="store_true", help="a loopback TCP port, not a unix socket")
    args = ap.parse_args(argv)
    from pagedcy.engine import LLMEngine, SamplingParams
    from pagedcy.kvcache.kvstore import KVStore
    from pagedcy.kvcache.kvstore_format import PageCodec, model_fingerprint
    from pagedcy.tools.bench_engine import ensure_checkpoint
    ckpt = ensure_checkpoint(os.path.join(os.path.expanduser("~"), ".cache", "pagedcy-bench",
                                          "llama-55m"))
    srv = None
    url = args.url
    if url is None:
        from pagedcy.tools.redis_local import RedisServer
        srv = RedisServer().start()
        url = srv.tcp_url if args.tcp else srv.url
    try:
        ps, per_prompt = 16, 32                    # 8 prompts of 512 tokens = 256 pages
        n_prompts = max(1, args.pages // per_prompt)
        eng = LLMEngine(ckpt, page_size=ps, kv_cache_pages=n_prompts * per_prompt + 64,
                        num_threads=args.threads, max_num_batched_tokens=2048)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, 32000, per_prompt * ps + 1).tolist() for _ in range(n_prompts)]
        def timed(engine):
            engine.manager.reset_prefix_cache()
            for i, p in enumerate(prompts):
                engine.add_request(f"p{i}", p, SamplingParams(max_tokens=1, temperature=0))
            t0 = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            return time.perf_counter() - t0

        best_prefill = min(timed(eng) for _ in range(args.rounds))
        # the same prompts through an engine with the store: filled once, then loaded
        with_store = LLMEngine(ckpt, page_size=ps, kv_cache_pages=n_prompts * per_prompt + 64,
                               num_threads=args.threads, max_num_batched_tokens=2048,
                               kv_store=url)
        timed(with_store)
        assert with_store.kv_store.flush(120)
        best_loaded = min(timed(with_store) for _ in range(args.rounds))
        loaded = with_store.stats().kv_store_pages_loaded
        with_store.close()
        mgr = eng.manager
        cached = mgr.cached_page_hashes()          # the prompts' pages, just computed
        hashes = list(cached.values())
        pages = [mgr.page_bytes(p) for p in cached]
        codec = PageCodec(mgr.config, model_fingerprint(eng.model) + "bench")
        nbytes = len(hashes) * codec.page_bytes
        best_w = best_r = float("inf")
        for r in range(args.rounds):
            store = KVStore(url, codec, max_pending_bytes=2 * nbytes)
            store.conn.client.flushdb()
            t0 = time.perf_counter()
            for h, p in zip(hashes, pages):
                store.put(h, p)
            assert store.flush(120)
            best_w = min(best_w, time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.lookup(0, hashes)
            while not store.wait_results(1.0):
                pass
            got = store.results()[0].payloads
            best_r = min(best_r, time.perf_counter() - t0)
            assert len(got) == len(hashes), (len(got), store.snapshot())
            store.close()
        gb = nbytes / 1e9
        print(f"{len(hashes)} pages of {codec.page_bytes // 1024} KiB ({nbytes / 2**20:.0f} MiB) "
              f"over {'tcp' if args.tcp else 'unix socket'} ({url.split(':')[0]}):")
        print(f"  store write  {best_w * 1e3:8.1f} ms  {gb / best_w:6.2f} GB/s")
        print(f"  store read   {best_r * 1e3:8.1f} ms  {gb / best_r:6.2f} GB/s "
              f"(fetch + checks, into memory)")
        print(f"  prefill      {best_prefill * 1e3:8.1f} ms  ({n_prompts} prompts of "
              f"{per_prompt * ps + 1} tokens, {args.threads} threads): the read is "
              f"{best_prefill / best_r:.1f}x faster")
        print(f"  engine with the store: {best_loaded * 1e3:8.1f} ms for the same requests "
              f"({loaded} pages loaded over {args.rounds} rounds; only each prompt's last "
              f"token prefilled): {best_prefill / best_loaded:.1f}x faster than prefill")
    finally:
        if srv is not None:
            srv.close()


if __name__ == "__main__":
    main()
