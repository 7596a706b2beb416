"""Serving benchmark: ``python -m pagedcy bench --serve [--quick] [--model DIR] [...]``.

(``--replicas N``: the prefix-routing benchmark of :mod:`pagedcy.tools.bench_replicas`.)
Starts ``python -m pagedcy serve`` on 127.0.0.1 (a free port) over a random Llama (hidden 512,
8 layers, 8 query / 2 KV heads, intermediate 1408, vocab 32000; a smaller one with
``--quick``), sends the engine workload (prompts of random token ids, lengths uniform in
[128, 1024], 64 new tokens, ignore_eos, greedy) as streaming completions at each concurrency
level (as many requests as the concurrency, 16 at least), and prints requests/s, output
tokens/s and TTFT/TPOT p50/p99 as vLLM's ``benchmark_serving`` defines them (TTFT: send to
first token; TPOT: (latency - TTFT) / (output tokens - 1) per request). The same engine
settings run ``LLM.generate`` offline on the largest level's requests in the same run, before
and after the server (the better of the two is the yardstick for output tokens/s).
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from pagedcy.tools.bench import blas_description
from pagedcy.tools.info import cpu_description

FULL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=1408, vocab_size=32000, max_position_embeddings=2048)
QUICK = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=352, vocab_size=32000, max_position_embeddings=2048)


def workload(num, *, vocab, seed=0, min_len=128, max_len=1024):
    """``num`` prompts of random token ids, lengths uniform in [min_len, max_len]."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(min_len, max_len + 1, size=num)
    return [rng.integers(10, vocab, size=int(n)).tolist() for n in lens]


def percentile(xs, q):
    """The q-th percentile (0-100) of ``xs`` as a float; NaN for an empty list."""
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else float("nan")


async def _one(client, url, prompt, max_tokens):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - t0
    return ttft, latency, tokens


async def run_level(base_url, prompts, concurrency, max_tokens):
    """Send ``prompts`` with at most ``concurrency`` in flight; per-request results + duration."""
    import httpx
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=limits) as client:
        async def guarded(p):
            async with sem:
                return await _one(client, "/v1/completions", p, max_tokens)
        t0 = time.perf_counter()
        results = await asyncio.gather(*[guarded(p) for p in prompts])
        return results, time.perf_counter() - t0


def summarize(results, duration):
    """requests/s, output tokens/s, TTFT and TPOT p50/p99 (ms)."""
    ttfts = [r[0] for r in results if r[0] is not None]
    tpots = [(lat - ttft) / (n - 1) for ttft, lat, n in results if ttft is not None and n > 1]
    out_tokens = sum(r[2] for r in results)
    return {"req_s": len(results) / duration, "tok_s": out_tokens / duration,
            "tokens": out_tokens,
            "ttft_p50": 1e3 * percentile(ttfts, 50), "ttft_p99": 1e3 * percentile(ttfts, 99),
            "tpot_p50": 1e3 * percentile(tpots, 50), "tpot_p99": 1e3 * percentile(tpots, 99)}


def offline(model_dir, prompts, max_tokens, engine_kw):
    """Output tokens/s of ``LLM.generate`` on ``prompts`` (after a short warm-up)."""
    from pagedcy.engine import LLM, SamplingParams
    llm = LLM(model_dir, **engine_kw)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(10, 42))}], SamplingParams(max_tokens=2),
                 use_tqdm=False)                # a prompt that shares no page with the others
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    duration = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"req_s": len(prompts) / duration, "tok_s": tokens / duration, "tokens": tokens}


def _free_port():
    """A free loopback port (:func:`pagedcy.tools.ports.free_port`)."""
    from pagedcy.tools.ports import free_port
    return free_port()


def start_server(model_dir, port, engine_args):
    """``python -m pagedcy serve`` on 127.0.0.1:port; waits for /health."""
    import httpx
    cmd = [sys.executable, "-m", "pagedcy", "serve", "--model", model_dir, "--host", "127.0.0.1",
           "--port", str(port), *engine_args]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become healthy")


def main(argv=None):
    """``python -m pagedcy bench --serve``: the serving benchmark; returns the exit code.
    With ``--replicas N``: the replica routing benchmark (:mod:`pagedcy.tools.bench_replicas`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--replicas" or a.startswith("--replicas=") for a in argv):
        from pagedcy.tools.bench_replicas import main as replicas_main
        return replicas_main(argv)
    ap = argparse.ArgumentParser(prog="python -m pagedcy bench --serve",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small model and few requests")
    ap.add_argument("--model", default=None, help="checkpoint (default: a random Llama)")
    ap.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per level (default: the concurrency, at least 16; quick 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from pagedcy.tools.info import config_dict
    levels = [int(c) for c in args.concurrency.split(",")]

    with tempfile.TemporaryDirectory(prefix="pagedcy-bench-serve-") as tmp:
        model_dir = args.model
        if model_dir is None:
            from pagedcy.models import write_random_checkpoint
            model_dir = write_random_checkpoint(os.path.join(tmp, "llama"), seed=args.seed,
                                                **(QUICK if args.quick else FULL))
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = int(json.load(f)["vocab_size"])
        max_len = 256 if args.quick else 1024
        # as many requests as the level's concurrency (16 at least): the top level then runs
        # the batch LLM.generate runs, so the ratio measures the server, not batch sizes
        count = {c: args.requests or max(4 if args.quick else 16, c) for c in levels}
        # each level gets prompts of its own, so no level reuses another's prefix-cache pages;
        # the offline runs (fresh engines) take the top level's; one more is the warm-up
        prompts = workload(sum(count.values()) + 1, vocab=vocab, seed=args.seed,
                           min_len=min(128, max_len), max_len=max_len)
        engine_kw = {"num_threads": args.num_threads}
        engine_args = [] if args.num_threads is None else ["--num-threads", str(args.num_threads)]

        cfg = config_dict()
        print(f"# pagedcy bench --serve: CPU {cpu_description()}; pagedcy {cfg['pagedcy']}, threads "
              f"{cfg['num_threads']}, SIMD {cfg['simd']}; BLAS {blas_description()}")
        env = [f"{k}={v}" for k, v in sorted(os.environ.items())
               if k.startswith(("OMP_", "GOMP_", "OPENBLAS_", "MKL_", "PAGEDCY_"))]
        print(f"# engine threads: {args.num_threads or 'default'}; env: {' '.join(env) or '(none set)'}")
        print(f"# model: {'random Llama ' + str(QUICK if args.quick else FULL) if args.model is None else model_dir}")
        print(f"# workload: prompt lengths uniform in [{min(128, max_len)}, {max_len}], "
              f"{args.max_tokens} new tokens, ignore_eos, greedy, streaming completions")
        top = max(levels)
        # offline runs before and after the server's levels (the best is the yardstick), so
        # a neighbour that gets busy mid-run does not favour either side
        level_prompts, k = {}, 1
        for c in levels:
            level_prompts[c] = prompts[k:k + count[c]]
            k += count[c]
        offs = [offline(model_dir, level_prompts[top], args.max_tokens, engine_kw)]
        port = _free_port()
        proc = start_server(model_dir, port, engine_args)
        rows = []
        try:
            base = f"http://127.0.0.1:{port}"
            asyncio.run(run_level(base, [prompts[0][:32]], 1, 2))        # warm-up (own prompt)
            for c in levels:
                results, duration = asyncio.run(run_level(base, level_prompts[c], c,
                                                          args.max_tokens))
                rows.append((c, count[c], summarize(results, duration)))
                print(f"#   concurrency {c}: {count[c]} requests in {duration:.1f} s",
                      file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
        offs.append(offline(model_dir, level_prompts[top], args.max_tokens, engine_kw))
    off = max(offs, key=lambda o: o["tok_s"])

    runs = ", ".join(f"{o['tok_s']:.1f}" for o in offs)
    print(f"# offline LLM.generate on the {count[top]} requests of concurrency {top}, before and "
          f"after the server: {runs} output tok/s")
    print()
    print("| concurrency | requests | req/s | output tok/s | % of offline | TTFT p50 ms "
          "| TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, n, s in rows:
        print(f"| {c} | {n} | {s['req_s']:.2f} | {s['tok_s']:.1f} | "
              f"{100 * s['tok_s'] / off['tok_s']:.0f}% | {s['ttft_p50']:.0f} | "
              f"{s['ttft_p99']:.0f} | {s['tpot_p50']:.1f} | {s['tpot_p99']:.1f} |")
    print(f"| offline | {count[top]} | {off['req_s']:.2f} | {off['tok_s']:.1f} | 100% | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
