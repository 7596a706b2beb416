"""Engine benchmark: ``python -m pagedcy bench --engine [--quick]``.

One random Llama (hidden 512, 8 layers, 8/2 heads, intermediate 1408, vocab 32000: 55M
parameters, fp32, greedy) for every row. Workload A: many requests of mixed prompt lengths
through ``LLM.generate`` against transformers' ``generate`` (padded static batch, sdpa) and
``generate_batch`` (continuous batching). Workload B: llama-batched-bench's shape (16 x (512 +
32)) against llama.cpp, when its binaries are already built under ~/.cache/pagedcy-anchors by
the anchor script. Then overheads: prefill against NumPy's matmul on the same GEMM shapes, a
decode step's GEMM / attention / elementwise / Python split, and peak RSS against weights +
KV pool. The header names the CPU, caches, BLAS kernel, threads, wait policy and environment.
``--gguf FILE`` and ``--bf16-vs-f32`` run :mod:`pagedcy.tools.bench_gguf`'s tables instead.
"""
import glob
import json
import os
import platform

from pagedcy.tools._argtypes import positive_int

# the variables that change how fast a run is: thread pools, wait policies, BLAS kernels
ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "OPENBLAS_", "MKL_", "PAGEDCY_", "GOTO", "BLIS_")


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes():
    """CPU 0's caches as text, e.g. ``"L1d 32K, L1i 32K, L2 1024K, L3 32768K (shared by 0-1)"``."""
    parts = []
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            def read(name):
                with open(os.path.join(d, name)) as f:
                    return f.read().strip()
            level, kind, size = read("level"), read("type"), read("size")
            shared = read("shared_cpu_list")
        except OSError:
            continue
        tag = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        parts.append(f"{tag} {size}" + (f" (shared by {shared})" if "-" in shared or "," in shared else ""))
    return ", ".join(parts) or "unknown"


def thread_pools():
    """Loaded thread pools (threadpoolctl): ``"openblas SkylakeX x2 (libscipy_openblas...)"`` each."""
    try:
        import threadpoolctl
    except ImportError:
        return ["threadpoolctl not installed"]
    out = []
    for i in threadpoolctl.threadpool_info():
        arch = f" {i['architecture']}" if i.get("architecture") else ""
        out.append(f"{i['internal_api']}{arch} x{i['num_threads']} ({os.path.basename(i['filepath'])})")
    return out


def run_env():
    """The performance-relevant environment variables as set, ``NAME=value`` each."""
    return [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)]


def machine_header():
    """Multi-line header: CPU, caches, BLAS/OpenMP pools, thread counts, pagedcy's OpenMP
    wait policy and the environment as run. Imports numpy (for the BLAS) and pagedcy."""
    import numpy as np
    from pagedcy.tools.info import config_dict
    cfg = config_dict()
    env = run_env()
    return "\n".join([
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); caches: {cache_sizes()}",
        f"numpy {np.__version__}; thread pools: {'; '.join(thread_pools())}",
        f"pagedcy {cfg['pagedcy']}: threads {cfg['num_threads']}, SIMD {cfg['simd']}, "
        f"OpenMP wait policy: {cfg.get('wait_policy', 'n/a')}",
        "env: " + (" ".join(env) if env else "(no OMP_/GOMP_/OPENBLAS_/MKL_/PAGEDCY_ variables set)"),
    ])


# ---------------------------------------------------------------------------------------------
# the benchmark: python -m pagedcy bench --engine [--quick]

#: the model of every row: a random Llama of 55M parameters (the llama.cpp anchor's shapes)
MODEL = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, intermediate_size=1408, max_position_embeddings=4096)
#: a tiny stand-in for smoke tests (--tiny-model)
TINY_MODEL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=1024)
#: removed from the environment before numpy loads (the bench re-executes itself without them)
UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _sizes(args):
    """Workload sizes: (A: requests, prompt_min, prompt_max, new), (B: npl, npp, ntg), decode seqs."""
    if args.quick:
        return (8, 32, 128, 16), (4, 128, 8), 8
    return (64, 128, 1024, 64), (16, 512, 32), 32


def ensure_checkpoint(path, tiny=False):
    """Write the benchmark's random Llama to ``path`` unless a checkpoint is already there."""
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    from pagedcy.models import write_random_checkpoint
    return write_random_checkpoint(path, "LlamaForCausalLM", seed=0, tokenizer=False,
                                   **(TINY_MODEL if tiny else MODEL))


def workload_a_prompts(n, lo, hi, vocab, seed=0):
    """``n`` random token-id prompts with lengths uniform in [lo, hi] (ids >= 3: no specials)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, int(k)).tolist() for k in rng.integers(lo, hi + 1, n)]


def _engine(model_dir, threads, **kw):
    from pagedcy.engine import LLMEngine
    return LLMEngine(model_dir, num_threads=threads, **kw)


def _greedy(n):
    from pagedcy.engine import SamplingParams
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run_generate(model_dir, prompts, new_tokens, threads, **kw):
    """Workload A through ``LLM.generate``: ``{"seconds", "new_tokens", "prompt_tokens"}``."""
    import time
    from pagedcy.engine import LLM
    llm = LLM(model_dir, num_threads=threads, **kw)
    llm.generate([{"prompt_token_ids": [3, 4, 5, 6]}], _greedy(2), use_tqdm=False)   # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], _greedy(new_tokens), use_tqdm=False)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "new_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "prompt_tokens": sum(len(p) for p in prompts)}


def run_batched(eng, npl, npp, ntg, vocab, seed=1, profile=None):
    """llama-batched-bench's shape on an engine: ``npl`` sequences of ``npp`` prompt tokens,
    each generating ``ntg`` tokens after the one the prefill samples. Prefill ends when every
    sequence has its first token. Returns prefill/generation tok/s, phase and total seconds,
    and (with a :class:`StepProfile`) the decode phase's breakdown."""
    import time
    prompts = workload_a_prompts(npl, npp, npp, vocab, seed)
    for i, p in enumerate(prompts):
        eng.add_request(f"b{seed}-{i}", {"prompt_token_ids": p}, _greedy(ntg + 1))
    got, t0 = {}, time.perf_counter()
    t_pp = gen_at_pp = None
    steps = step_time = 0
    while eng.has_unfinished_requests():
        if t_pp is not None and profile is not None:
            s0 = time.perf_counter()
            with profile:
                outs = eng.step()
            step_time += time.perf_counter() - s0
            steps += 1
        else:
            outs = eng.step()
        for o in outs:
            got[o.request_id] = len(o.outputs[0].token_ids)
        if t_pp is None and len(got) == npl and min(got.values()) >= 1:
            t_pp = time.perf_counter() - t0
            gen_at_pp = sum(got.values()) - npl      # decode tokens already made during prefill
    total = time.perf_counter() - t0
    t_tg = total - t_pp
    res = {"prefill_tps": npl * npp / t_pp, "gen_tps": (npl * ntg - gen_at_pp) / t_tg,
           "prefill_s": t_pp, "gen_s": t_tg, "total_s": total, "steps": steps, "step_s": step_time}
    return res


def run_single(eng, npp, ntg, vocab):
    """One sequence: ``npp``-token prefill tok/s, then ``ntg`` decode steps' tok/s (llama-bench's
    pp/tg rows)."""
    import time
    (p,) = workload_a_prompts(1, npp, npp, vocab, seed=7)
    eng.add_request("pp", {"prompt_token_ids": p}, _greedy(1))
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        eng.step()
    pp = npp / (time.perf_counter() - t0)
    eng.add_request("tg", {"prompt_token_ids": [p[0]]}, _greedy(ntg + 1))
    eng.step()                                   # the 1-token prefill
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        eng.step()
    return pp, ntg / (time.perf_counter() - t0)


def _kv_pages_for(lengths, page_size=16):
    return sum(-(-n // page_size) for n in lengths) + 8


def run_rss(model_dir, prompts, new_tokens, threads, **weights):
    """Workload A in this process with a pool sized to it; peak RSS against weights + pool."""
    from pagedcy.tools.engine_profile import peak_rss_bytes
    base = peak_rss_bytes()
    pages = _kv_pages_for([len(p) + new_tokens for p in prompts])
    eng = _engine(model_dir, threads, kv_cache_pages=pages, **weights)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", {"prompt_token_ids": p}, _greedy(new_tokens))
    while eng.has_unfinished_requests():
        eng.step()
    pool = eng.manager.store.pages().nbytes
    return {"peak_rss": peak_rss_bytes(), "weights": eng.model.weight_bytes, "pool": pool,
            "before_load": base}


def _child_json(kind, model_dir, spec, timeout=3600):
    """Run ``kind`` ("rss") in a fresh interpreter; its JSON result or ``{"error": ...}``."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "pagedcy.tools.bench_engine", kind, model_dir],
                         input=json.dumps(spec), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        return {"error": ((out.stderr.strip().splitlines() or ["failed"])[-1])[:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _md(header, rows):
    """A markdown table: header cells, then rows of cells (already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _progress(msg):
    import sys
    sys.stderr.write(f"[bench --engine] {msg}\n")
    sys.stderr.flush()


def _reexec_without_unset(argv):
    """Re-execute this command (``python -m pagedcy bench --engine`` + ``argv``) with UNSET
    removed, so OpenBLAS picks its kernel itself."""
    import sys
    if not any(k in os.environ for k in UNSET):
        return
    from pagedcy import _libs
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    if not _libs._user_set:
        env.pop("OMP_WAIT_POLICY", None)    # ours: the new process chooses again
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "pagedcy", "bench", "--engine", *argv], env)


def workload_a(args, model_dir, vocab):
    """Rows of workload A (pagedcy vs transformers) as dicts."""
    from pagedcy.tools import engine_baselines as hf
    (n, lo, hi, new), _, _ = _sizes(args)
    prompts = workload_a_prompts(n, lo, hi, vocab)
    rows = []
    _progress(f"workload A: pagedcy LLM.generate, {n} requests")
    rows.append(("pagedcy LLM.generate", run_generate(model_dir, prompts, new, args.threads,
                                                          **args.weights)))
    if args.no_transformers or not hf.transformers_available():
        reason = "--no-transformers" if args.no_transformers else "torch/transformers not installed"
        rows += [(name, {"skipped": reason}) for name in
                 ("transformers generate (padded batch, sdpa)", "transformers generate_batch")]
        return rows, prompts
    for mode, name in (("generate", "transformers generate (padded batch, sdpa)"),
                       ("generate_batch", "transformers generate_batch")):
        _progress(f"workload A: {name}")
        rows.append((name, hf.run_transformers(mode, model_dir, prompts, new, args.threads)))
    return rows, prompts


def format_a(rows):
    """Workload A's markdown table from ``[(label, result dict), ...]``, pagedcy first."""
    ours = rows[0][1]
    ours_tps = ours["new_tokens"] / ours["seconds"]
    out = []
    for name, r in rows:
        if "seconds" not in r:
            out.append((name, "-", "-", "-", r.get("skipped") or r.get("error")))
            continue
        tps = r["new_tokens"] / r["seconds"]
        out.append((name, f"{r['seconds']:.3f}", f"{tps:.1f}",
                    f"{(r['prompt_tokens'] + r['new_tokens']) / r['seconds']:.0f}",
                    "1.00x" if r is ours else f"pagedcy {ours_tps / tps:.2f}x"))
    return _md(["row", "seconds", "output tok/s", "prompt+output tok/s", "vs pagedcy"], out)


def workload_b(args, model_dir, vocab):
    """pagedcy's and (if built) llama.cpp's rows for npl x (npp + ntg)."""
    from pagedcy.tools import engine_baselines as base
    _, (npl, npp, ntg), _ = _sizes(args)
    _progress(f"workload B: pagedcy {npl} x ({npp} + {ntg})")
    eng = _engine(model_dir, args.threads, max_num_batched_tokens=args.batched_tokens,
                  **args.weights)
    run_batched(eng, 2, 16, 2, vocab, seed=99)                 # warm-up
    ours = run_batched(eng, npl, npp, ntg, vocab)
    ours["single_prefill_tps"], ours["single_decode_tps"] = run_single(eng, npp, 64, vocab)
    theirs = None
    if not args.no_llama_cpp and args.default_model:   # the GGUF is the 55M model only
        _progress("workload B: llama.cpp (cached binaries only)")
        theirs = base.run_llama_cpp(args.threads, npl, npp, ntg)
    return ours, theirs, (npl, npp, ntg)


def format_b(ours, theirs):
    """Workload B's markdown table: pagedcy's rates beside llama.cpp's (``theirs``, or None)."""
    keys = [("prefill tok/s", "prefill_tps", "{:.0f}", True),
            ("generation tok/s (all sequences)", "gen_tps", "{:.0f}", True),
            ("total seconds", "total_s", "{:.3g}", False),
            ("single-sequence prefill tok/s", "single_prefill_tps", "{:.0f}", True),
            ("single-sequence decode tok/s", "single_decode_tps", "{:.1f}", True)]
    rows = []
    for label, k, fmt, higher in keys:
        a = ours.get(k)
        b = theirs.get(k) if theirs else None
        ratio = "-" if a is None or b is None else f"{(a / b if higher else b / a):.2f}x"
        rows.append((label, fmt.format(a) if a is not None else "-",
                     fmt.format(b) if b is not None else "not built", ratio))
    return _md(["metric", "pagedcy", "llama.cpp", "pagedcy / llama.cpp (speed)"], rows)


def overheads(args, model_dir, cfg, prompts_a):
    """Prefill vs the NumPy-GEMM yardstick, the decode-step breakdown and peak RSS."""
    from pagedcy.tools.engine_profile import StepProfile, gemm_only_seconds
    _, (npl, npp, _), dec = _sizes(args)
    chunk = min(args.batched_tokens, npl * npp)
    gemm_tps = chunk / gemm_only_seconds(cfg, chunk, max(1, chunk // npp))
    _progress(f"decode breakdown at {dec} sequences")
    eng = _engine(model_dir, args.threads, max_num_batched_tokens=args.batched_tokens,
                  **args.weights)
    prof = StepProfile()
    r = run_batched(eng, dec, npp, 16, cfg.vocab_size, seed=3, profile=prof)
    _progress("peak RSS (subprocess)")
    (_, _, _, new), _, _ = _sizes(args)
    rss = _child_json("rss", model_dir, {"prompts": prompts_a, "new_tokens": new, "threads": args.threads,
                                       "weights": args.weights})
    return {"chunk": chunk, "gemm_tps": gemm_tps, "decode": r, "acc": dict(prof.acc), "rss": rss,
            "dec": dec}


def format_overheads(o, prefill_tps):
    """The overhead lines: prefill vs the GEMM-only rate, the decode-step breakdown, peak RSS."""
    lines = [f"prefill: {prefill_tps:.0f} tok/s = {100 * prefill_tps / o['gemm_tps']:.0f}% of "
             f"{o['gemm_tps']:.0f} tok/s, the rate np.matmul alone reaches on the same GEMM shapes "
             f"({o['chunk']}-token steps; target >= 60%)"]
    d, acc = o["decode"], o["acc"]
    step = d["step_s"] / max(1, d["steps"])
    parts = {k: v / max(1, d["steps"]) for k, v in acc.items() if k != "gemm_flops"}
    parts["Python + scheduling + sampling"] = step - sum(parts.values())
    rows = [(k, f"{v * 1e3:.2f}", f"{100 * v / step:.1f}%") for k, v in parts.items()]
    rows.append(("whole step", f"{step * 1e3:.2f}", "100%"))
    other = parts["elementwise"] + parts["Python + scheduling + sampling"]
    lines.append(f"decode step at {o['dec']} running sequences (mean of {d['steps']} steps); "
                 f"Python + scheduling + elementwise = {100 * other / step:.1f}% (target <= 10%)")
    lines.append(_md(["part", "ms / step", "share"], rows))
    r = o["rss"]
    if "error" in r:
        lines.append(f"peak RSS: failed: {r['error']}")
    else:
        budget = r["weights"] + r["pool"]
        lines.append(f"peak RSS (workload A, pool sized to it): {r['peak_rss'] / 2**20:.0f} MiB = "
                     f"{r['peak_rss'] / budget:.2f}x of weights {r['weights'] / 2**20:.0f} MiB + KV pool "
                     f"{r['pool'] / 2**20:.0f} MiB (target <= 1.25x; interpreter + numpy + pagedcy "
                     f"before the load: {r['before_load'] / 2**20:.0f} MiB)")
    return "\n".join(lines)


def main(argv=None, *, as_command=False):
    """``python -m pagedcy bench --engine``: print the engine tables; returns the results.

    ``as_command``: this process is that command, so it may replace itself with one run
    without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE; a caller's process (a test, a notebook)
    is never replaced and keeps its OpenBLAS settings."""
    import argparse
    import sys
    import tempfile
    argv = sys.argv[1:] if argv is None else list(argv)
    argv = [a for a in argv if a != "--engine"]
    ap = argparse.ArgumentParser(prog="python -m pagedcy bench --engine",
                                 description="pagedcy's engine against transformers and llama.cpp")
    ap.add_argument("--quick", action="store_true", help="small workloads (a smoke run)")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--model-dir", default=None,
                    help="checkpoint to use (default: the random 55M Llama, written once under "
                         "~/.cache/pagedcy-bench)")
    ap.add_argument("--batched-tokens", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--only", choices=("A", "B", "overheads"), action="append", default=None)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--tiny-model", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", action="append", default=None, metavar="FILE",
                    help="instead of the tables above: pp512, tg64 and 16 x (512 + 32) on this "
                         "GGUF file, RSS, %% of the read bandwidth, llama.cpp's rows beside "
                         "(repeatable; see pagedcy.tools.bench_gguf)")
    ap.add_argument("--bf16-vs-f32", action="store_true",
                    help="a bf16 checkpoint of qwen2.5-0.5b's shape with dtype auto vs float32")
    ap.add_argument("--repeats", type=positive_int, default=3,
                    help="--gguf / --bf16-vs-f32: pp / tg runs per file, each side's best is "
                         "reported (more on a host whose bandwidth swings; default 3)")
    from pagedcy.server.launch import add_weight_arguments
    add_weight_arguments(ap)
    args = ap.parse_args(argv)
    args.weights = dict(dtype=args.dtype, quantization=args.quantization,
                        activation_dtype=args.activation_dtype)
    if as_command:
        _reexec_without_unset(argv)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(args.threads, user_api="blas")
    except ImportError:
        pass
    if args.gguf or args.bf16_vs_f32:
        from pagedcy.tools.bench_gguf import run
        return run(args)
    only = set(args.only or ("A", "B", "overheads"))
    args.default_model = args.model_dir is None and not args.tiny_model
    if args.model_dir is None:
        root = tempfile.mkdtemp(prefix="pagedcy-bench-") if args.tiny_model else \
            os.path.join(os.path.expanduser("~"), ".cache", "pagedcy-bench")
        args.model_dir = os.path.join(root, "rand-llama-tiny" if args.tiny_model else "rand-llama-55m")
        ensure_checkpoint(args.model_dir, tiny=args.tiny_model)
    from pagedcy.models.config import ModelConfig
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = ModelConfig.from_dict(json.load(f))
    print(machine_header())
    print(f"model: {args.model_dir}: {cfg.architecture}, hidden {cfg.hidden_size}, {cfg.num_layers} "
          f"layers, {cfg.num_heads}/{cfg.num_kv_heads} heads, intermediate {cfg.intermediate_size}, "
          f"vocab {cfg.vocab_size}; weights {args.quantization or args.dtype}, greedy, "
          f"{args.threads} threads; engine "
          f"max_num_batched_tokens={args.batched_tokens}")
    results = {}
    prompts_a = workload_a_prompts(*_sizes(args)[0][:3], cfg.vocab_size)
    if "A" in only:
        rows, prompts_a = workload_a(args, args.model_dir, cfg.vocab_size)
        (n, lo, hi, new), _, _ = _sizes(args)
        print(f"\nWorkload A: {n} requests, prompts uniform in [{lo}, {hi}] tokens, {new} new tokens "
              f"each (ignore_eos / min_new_tokens)")
        print(format_a(rows))
        results["A"] = rows
    if "B" in only or "overheads" in only:
        ours, theirs, (npl, npp, ntg) = workload_b(args, args.model_dir, cfg.vocab_size)
        results["B"] = {"pagedcy": ours, "llama.cpp": theirs}
        if "B" in only:
            print(f"\nWorkload B: {npl} sequences x ({npp} prompt + {ntg} generated), "
                  f"llama-batched-bench's shape; single sequence: pp{npp} / tg64")
            print(format_b(ours, theirs))
    if "overheads" in only:
        o = overheads(args, args.model_dir, cfg, prompts_a)
        results["overheads"] = o
        print("\nOverheads and memory")
        print(format_overheads(o, results["B"]["pagedcy"]["prefill_tps"]))
    return results


def _child_main():
    import sys
    kind, model_dir = sys.argv[1], sys.argv[2]
    spec = json.loads(sys.stdin.read())
    if kind == "rss":
        print(json.dumps(run_rss(model_dir, spec["prompts"], spec["new_tokens"], spec["threads"],
                                 **spec.get("weights", {}))))
    else:
        raise SystemExit(f"unknown child {kind!r}")


if __name__ == "__main__":
    _child_main()
