"""Replica routing benchmark: ``python -m pagedcy bench --serve --replicas 2 [--quick] [...]``.

Issue 24's workload: ``--prefixes`` shared prefixes (16) of ``--prefix-len`` tokens (1024),
``--per-prefix`` requests each (8; 128 in all) in random order, each with a tail of its own
(``--tail-len`` 64 tokens) and ``--max-tokens`` new ones (16), streamed with at most
``--concurrency`` in flight, against ``python -m pagedcy serve --replicas N`` on 127.0.0.1 with
each replica's KV pool sized for ``--kv-prefixes`` (4) prefixes and their requests.

Rows (``--rows``, default all four): (a) round robin, (b) prefix-aware routing, (c) round
robin + the Redis KV store, (d) both. One fresh server per row, and for (c)/(d) a fresh, empty
``redis-server`` (or ``--kv-store URL`` as is: then (d) starts with what (c) left), so every
row starts cold. Columns: TTFT p50/p99, output tokens/s, the prompt tokens the replicas
computed (the rest came from their prefix caches or the store) and the store's page hit rate.

Then the cold-replica case (``--no-cold`` skips it): an engine process computes one prefixed
prompt and stops; a just-started one answers another prompt with that prefix, once with the
store and once without. TTFT of each and their ratio. ``--shape 0.5b`` runs a random model of
Qwen2.5-0.5B's shape instead of the engine bench's 55M Llama.
"""
import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

import numpy as np

from pagedcy.tools.bench_serve import FULL, QUICK, _free_port, run_level, start_server, summarize

#: Random models of real shapes (``--shape``): (architecture, config.json fields).
SHAPES = {
    "55m": ("LlamaForCausalLM", FULL),
    "0.5b": ("Qwen2ForCausalLM", dict(hidden_size=896, num_hidden_layers=24,
                                      num_attention_heads=14, num_key_value_heads=2,
                                      intermediate_size=4864, vocab_size=151936,
                                      tie_word_embeddings=True, rope_theta=1e6)),
}
#: The four rows: label -> (router, with the store).
ROWS = {"a": ("round-robin", False), "b": ("prefix", False),
        "c": ("round-robin", True), "d": ("prefix", True)}


def prefix_workload(prefixes, per_prefix, prefix_len, tail_len, *, vocab, seed=0):
    """Prompts (token id lists) in random order: ``per_prefix`` per shared prefix."""
    rng = np.random.default_rng(seed)
    heads = [rng.integers(10, vocab, size=prefix_len).tolist() for _ in range(prefixes)]
    prompts = [h + rng.integers(10, vocab, size=tail_len).tolist()
               for h in heads for _ in range(per_prefix)]
    return [prompts[i] for i in rng.permutation(len(prompts))]


def _replica_stats(base_url):
    import httpx
    return httpx.get(base_url + "/debug/replicas", timeout=30).json()["replicas"]


def _delta(after, before, key):
    return sum(s.get(key, 0) - before.get(r, {}).get(key, 0) for r, s in after.items())


def run_router(model_dir, router, prompts, args, serve_args):
    """One cold server with ``router``: the summary plus prompt tokens computed and the
    store's page hits and misses."""
    port = _free_port()
    proc = start_server(model_dir, port, ["--replicas", str(args.replicas), "--router", router,
                                          *serve_args])
    base = f"http://127.0.0.1:{port}"
    try:
        for k in range(2 * args.replicas):     # warm-up: under a page, so nothing is cached
            asyncio.run(run_level(base, [[5 + k] * 8], 1, 2))
        before = _replica_stats(base)
        results, duration = asyncio.run(run_level(base, prompts, args.concurrency,
                                                  args.max_tokens))
        after = _replica_stats(base)
    finally:
        proc.terminate()
        proc.wait(120)
    row = summarize(results, duration)
    row["prompt_tokens"] = _delta(after, before, "prompt_tokens")
    row["store_hit"] = _delta(after, before, "kv_store_pages_hit")
    row["store_missed"] = _delta(after, before, "kv_store_pages_missed")
    row["store_bytes_in"] = _delta(after, before, "kv_store_bytes_in")
    row["store_load_s"] = _delta(after, before, "kv_store_load_seconds")
    row["per_replica"] = {r: s["requests"] - before.get(r, {}).get("requests", 0)
                          for r, s in after.items()}
    row["duration"] = duration
    return row


def _store_url(args, stack):
    """The store for a (c)/(d) row: ``--kv-store`` as is, else a fresh local redis-server."""
    if args.kv_store:
        return args.kv_store
    from pagedcy.tools.redis_local import RedisServer
    return stack.enter_context(RedisServer()).url


def cold_replica(model_dir, prompts, args, serve_args, store_url):
    """TTFT (s) of a just-started engine process on ``prompts[1]`` after another process
    computed ``prompts[0]`` (same prefix): with ``store_url`` its pages come from the store."""
    store = ["--kv-store", store_url] if store_url else []
    port = _free_port()
    proc = start_server(model_dir, port, [*serve_args, *store])
    try:
        asyncio.run(run_level(f"http://127.0.0.1:{port}", prompts[:1], 1, 1))
        if store_url:                    # the writes go behind the steps: wait for them
            import redis
            client = redis.Redis.from_url(store_url)
            want = (args.prefix_len + args.tail_len) // args.page_size
            end = time.monotonic() + 120
            while client.dbsize() < want and time.monotonic() < end:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(120)
    port = _free_port()
    proc = start_server(model_dir, port, [*serve_args, *store])
    try:
        results, _ = asyncio.run(run_level(f"http://127.0.0.1:{port}", prompts[1:2], 1,
                                           args.max_tokens))
    finally:
        proc.terminate()
        proc.wait(120)
    return results[0][0]


def _model(args, tmp):
    if args.model is not None:
        return args.model
    from pagedcy.models import write_random_checkpoint
    arch, cfg = SHAPES[args.shape] if not args.quick else ("LlamaForCausalLM", QUICK)
    seq = args.prefix_len + args.tail_len + args.max_tokens
    return write_random_checkpoint(os.path.join(tmp, "model"), arch, seed=args.seed,
                                   **dict(cfg, max_position_embeddings=max(2048, seq)))


def main(argv=None):
    """The benchmark; returns the exit code."""
    from contextlib import ExitStack

    from pagedcy.tools.info import cpu_description
    ap = argparse.ArgumentParser(prog="python -m pagedcy bench --serve --replicas N",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the small model")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="55m",
                    help="the random model's shape (default: the engine bench's 55M Llama)")
    ap.add_argument("--model", default=None, help="checkpoint (default: a random model)")
    ap.add_argument("--prefixes", type=int, default=16)
    ap.add_argument("--per-prefix", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--tail-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kv-prefixes", type=float, default=4.0,
                    help="each replica's KV pool holds this many prefixes (with their tails)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-threads", type=int, default=1, help="kernel threads per replica")
    ap.add_argument("--rows", default="a,b,c,d",
                    help="a: round robin, b: prefix-aware, c: round robin + store, d: both")
    ap.add_argument("--kv-store", default=None,
                    help="the store of rows c/d (default: a fresh local redis-server per row)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-replica case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows_wanted = args.rows.split(",")
    if any(r not in ROWS for r in rows_wanted):
        ap.error(f"--rows takes letters of {','.join(ROWS)}, got {args.rows!r}")
    seq = args.prefix_len + args.tail_len + args.max_tokens
    pages = int(args.kv_prefixes * -(-seq // args.page_size))
    serve_args = ["--num-threads", str(args.num_threads), "--kv-cache-pages", str(pages),
                  "--page-size", str(args.page_size), "--max-model-len", str(seq)]
    rows, cold = [], {}
    with tempfile.TemporaryDirectory(prefix="pagedcy-bench-replicas-") as tmp:
        model_dir = _model(args, tmp)
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = int(json.load(f)["vocab_size"])
        prompts = prefix_workload(args.prefixes, args.per_prefix, args.prefix_len,
                                  args.tail_len, vocab=vocab, seed=args.seed)
        what = (f"random {SHAPES[args.shape][0]} {args.shape}" if not args.quick
                else "random Llama (quick)") if args.model is None else model_dir
        print(f"# pagedcy bench --serve --replicas {args.replicas} on {cpu_description()}")
        print(f"# model: {what}")
        print(f"# workload: {args.prefixes} prefixes x {args.prefix_len} tokens, {args.per_prefix} "
              f"requests each ({len(prompts)}) in random order, {args.tail_len}-token tails, "
              f"{args.max_tokens} new tokens, {args.concurrency} in flight; KV pool {pages} pages "
              f"per replica (~{args.kv_prefixes:g} prefixes), {args.num_threads} thread(s) each",
              flush=True)
        for label in rows_wanted:
            router, with_store = ROWS[label]
            with ExitStack() as stack:
                extra = ["--kv-store", _store_url(args, stack)] if with_store else []
                row = run_router(model_dir, router, prompts, args, [*serve_args, *extra])
            rows.append((label, router, with_store, row))
            print(f"#   ({label}) {router}{' + store' if with_store else ''}: "
                  f"{row['duration']:.1f} s, requests per replica "
                  f"{sorted(row['per_replica'].values())}", file=sys.stderr, flush=True)
        if not args.no_cold:
            same_prefix = [p for p in prompts if p[:args.prefix_len] == prompts[0][:args.prefix_len]]
            with ExitStack() as stack:
                cold["store"] = cold_replica(model_dir, same_prefix, args, serve_args,
                                             _store_url(args, stack))
            cold["none"] = cold_replica(model_dir, same_prefix, args, serve_args, None)
    total = len(prompts) * (args.prefix_len + args.tail_len)
    print()
    print("| row | routing | store | TTFT p50 ms | TTFT p99 ms | output tok/s | "
          "prompt tokens computed | store page hit rate |")
    print("|---|---|---|---|---|---|---|---|")
    for label, router, with_store, r in rows:
        looked = r["store_hit"] + r["store_missed"]
        rate = f"{100 * r['store_hit'] / looked:.0f}% of {looked}" if looked else "-"
        print(f"| ({label}) | {router} | {'redis' if with_store else '-'} | {r['ttft_p50']:.0f} | "
              f"{r['ttft_p99']:.0f} | {r['tok_s']:.1f} | {r['prompt_tokens']} "
              f"({100 * r['prompt_tokens'] / total:.0f}% of {total}) | {rate} |")
    by = {label: r for label, _, _, r in rows}
    if "a" in by and "d" in by:
        print(f"\n(d) vs (a): output tok/s {by['d']['tok_s'] / by['a']['tok_s']:.2f}x, "
              f"TTFT p50 {by['a']['ttft_p50'] / by['d']['ttft_p50']:.2f}x lower")
    for label, r in by.items():
        if r["store_load_s"] > 0:
            # lookup latency runs from admission to the pages' arrival, so it includes the
            # lookup thread's waits for the CPU and GIL while its replica computes: a lower
            # bound of the store's rate (asv_benches/kv_store_bandwidth.py measures that)
            print(f"store reads in ({label}): {r['store_bytes_in'] / 1e9:.2f} GB over "
                  f"{r['store_load_s']:.2f} s of summed lookup latency "
                  f"({r['store_bytes_in'] / 1e9 / r['store_load_s']:.2f} GB/s while computing)")
    if cold:
        print(f"\ncold replica, a prefix another process computed: TTFT {1e3 * cold['store']:.0f} ms "
              f"with the store, {1e3 * cold['none']:.0f} ms without: "
              f"{cold['none'] / cold['store']:.1f}x lower")
    return 0
