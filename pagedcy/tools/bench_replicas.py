"""Replica routing benchmark: ``python -m pagedcy bench --serve --replicas 2 [--quick] [...]``.

Issue 24's workload: ``--prefixes`` shared prefixes (16) of ``--prefix-len`` tokens (1024),
``--per-prefix`` requests each (8; 128 in all) in random order, each with a tail of its own
(``--tail-len`` 64 tokens) and ``--max-tokens`` new ones (16), streamed with at most
``--concurrency`` in flight, against ``python -m pagedcy serve --replicas N`` on 127.0.0.1 with
each replica's KV pool sized for ``--kv-prefixes`` (4) prefixes and their requests. One fresh
server per routing policy (``--routers round-robin,prefix``), so every row starts cold; rows
report TTFT p50/p99, output tokens/s and the prompt tokens the replicas computed (the rest came
from their prefix caches). ``--kv-store URL`` is passed to ``serve`` as is.
"""
import argparse
import asyncio
import json
import os
import sys
import tempfile

import numpy as np

from pagedcy.tools.bench_serve import FULL, QUICK, _free_port, run_level, start_server, summarize


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


def run_router(model_dir, router, prompts, args, serve_args):
    """One cold server with ``router``: the summary plus prompt tokens computed."""
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
    row["prompt_tokens"] = sum(s["prompt_tokens"] - before.get(r, {}).get("prompt_tokens", 0)
                               for r, s in after.items())
    row["per_replica"] = {r: s["requests"] - before.get(r, {}).get("requests", 0)
                          for r, s in after.items()}
    row["duration"] = duration
    return row


def main(argv=None):
    """The benchmark; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m pagedcy bench --serve --replicas N",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the small model")
    ap.add_argument("--model", default=None, help="checkpoint (default: a random Llama)")
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
    ap.add_argument("--routers", default="round-robin,prefix")
    ap.add_argument("--kv-store", default=None, help="passed to serve --kv-store")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    routers = args.routers.split(",")
    seq = args.prefix_len + args.tail_len + args.max_tokens
    pages = int(args.kv_prefixes * -(-seq // args.page_size))
    serve_args = ["--num-threads", str(args.num_threads), "--kv-cache-pages", str(pages),
                  "--page-size", str(args.page_size), "--max-model-len", str(seq)]
    if args.kv_store:
        serve_args += ["--kv-store", args.kv_store]
    with tempfile.TemporaryDirectory(prefix="pagedcy-bench-replicas-") as tmp:
        model_dir = args.model
        if model_dir is None:
            from pagedcy.models import write_random_checkpoint
            model_dir = write_random_checkpoint(
                os.path.join(tmp, "llama"), seed=args.seed,
                **dict(QUICK if args.quick else FULL, max_position_embeddings=max(2048, seq)))
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = int(json.load(f)["vocab_size"])
        prompts = prefix_workload(args.prefixes, args.per_prefix, args.prefix_len,
                                  args.tail_len, vocab=vocab, seed=args.seed)
        print(f"# pagedcy bench --serve --replicas {args.replicas}: model "
              f"{'random Llama ' + str(QUICK if args.quick else FULL) if args.model is None else model_dir}")
        print(f"# workload: {args.prefixes} prefixes x {args.prefix_len} tokens, {args.per_prefix} "
              f"requests each ({len(prompts)}) in random order, {args.tail_len}-token tails, "
              f"{args.max_tokens} new tokens, {args.concurrency} in flight; KV pool {pages} pages "
              f"per replica (~{args.kv_prefixes:g} prefixes), {args.num_threads} thread(s) each")
        rows = []
        for router in routers:
            rows.append((router, run_router(model_dir, router, prompts, args, serve_args)))
            print(f"#   {router}: {rows[-1][1]['duration']:.1f} s, requests per replica "
                  f"{sorted(rows[-1][1]['per_replica'].values())}", file=sys.stderr, flush=True)
    total = len(prompts) * (args.prefix_len + args.tail_len)
    print()
    print("| routing | TTFT p50 ms | TTFT p99 ms | output tok/s | prompt tokens computed |")
    print("|---|---|---|---|---|")
    for router, r in rows:
        print(f"| {router} | {r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['tok_s']:.1f} | "
              f"{r['prompt_tokens']} ({100 * r['prompt_tokens'] / total:.0f}% of {total}) |")
    return 0
