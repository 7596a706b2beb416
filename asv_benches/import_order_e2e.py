"""End to end in both import orders: 16 requests (prompts uniform in 128..1024 tokens, 32 new
tokens each, greedy) on the engine bench's 55M random Llama, ``LLM.generate`` with pagedcy
imported first and with torch imported first, against transformers ``generate`` (padded,
sdpa) in the same run.

``python asv_benches/import_order_e2e.py [--threads 2] [--rounds 3] [--pairs 3] [--isa avx2]``

``--isa avx2`` stands in for an AVX2-only CPU on an AVX-512 one: it caps both engines at AVX2,
pagedcy through ``PAGEDCY_SIMD`` and torch through ``ATEN_CPU_CAPABILITY`` (its own kernels),
``MKL_ENABLE_INSTRUCTIONS`` (its BLAS) and ``ONEDNN_MAX_CPU_ISA`` (oneDNN), so neither side keeps
AVX-512 the other lacks. Each child reports the levels in force.

Each order runs in a fresh subprocess (which library loads its OpenMP runtime first is fixed
at import), best of ``--rounds`` inside it; the two orders' subprocesses alternate ``--pairs``
times (pagedcy first, torch first, pagedcy first, ...) and each order keeps its best, so a
host whose bandwidth drifts over minutes does not pass for an import-order effect. The header
names the CPU and each child reports the OpenMP runtime pagedcy's kernels got and the wait
policy in force.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
order, model, threads, rounds, with_hf = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
if order == "torch-first":
    import torch  # noqa: F401
import numpy as np
import pagedcy as pc
from pagedcy._libs import _threads, wait_policy
rng = np.random.default_rng(0)
prompts = [rng.integers(3, 32000, int(n)).tolist() for n in rng.integers(128, 1025, 16)]
llm = pc.LLM(model, num_threads=threads, enable_prefix_cache=False)
sp = pc.SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
reqs = [{"prompt_token_ids": p} for p in prompts]
llm.generate(reqs[:2], sp, use_tqdm=False)
best = float("inf")
for _ in range(rounds):
    t = time.perf_counter()
    llm.generate(reqs, sp, use_tqdm=False)
    best = min(best, time.perf_counter() - t)
res = {"pagedcy_s": best, "runtime": _threads.openmp_runtime().rsplit("/", 1)[-1],
       "wait_policy": str(wait_policy()), "simd": _threads.simd_path().split(" ")[0]}
if with_hf:
    import torch, transformers
    torch.set_num_threads(threads)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        model, dtype=torch.float32, attn_implementation="sdpa").eval()
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    hf = float("inf")
    for _ in range(max(1, rounds - 1)):
        t = time.perf_counter()
        with torch.no_grad():
            m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, min_new_tokens=32,
                       do_sample=False)
        hf = min(hf, time.perf_counter() - t)
    res["transformers_s"] = hf
    res["torch_isa"] = torch.backends.cpu.get_cpu_capability()
print(json.dumps(res))
"""


def main(argv=None):
    """Run both orders; print a table and the targets (torch first <= 5% slower, >= 3x)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=3,
                    help="subprocesses per order, the orders alternating")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="avx2: cap pagedcy and torch at AVX2 (an AVX2-only CPU's proxy)")
    args = ap.parse_args(argv)
    from pagedcy.tools.bench_engine import ensure_checkpoint
    from pagedcy.tools.info import cpu_description
    model = ensure_checkpoint(os.path.join(os.path.expanduser("~"), ".cache", "pagedcy-bench",
                                           "llama-55m"))
    # pagedcy's defaults in each child: importing pagedcy here set GOMP_SPINCOUNT in this
    # process's environment, which a child would otherwise take for the user's choice
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY",
                        "GOMP_SPINCOUNT")}
    if args.isa == "avx2":
        env.update(PAGEDCY_SIMD="avx2", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                   ONEDNN_MAX_CPU_ISA="AVX2")
    print(f"# 16 x (128..1024 + 32) on the 55M Llama, {args.threads} threads, "
          f"{cpu_description()}")
    rows, runs = {}, {"pagedcy-first": [], "torch-first": []}
    for _ in range(args.pairs):
        for order in runs:
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, order, model, str(args.threads),
                                  str(args.rounds), "1"], env=env, check=True,
                                 capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[order].append(r)
            print(f"#   {order}: pagedcy {r['pagedcy_s']:.3f} s, transformers "
                  f"{r['transformers_s']:.3f} s ({time.perf_counter() - t:.0f} s)",
                  file=sys.stderr, flush=True)
    for order, rs in runs.items():
        rows[order] = dict(min(rs, key=lambda r: r["pagedcy_s"]),
                           transformers_s=min(r["transformers_s"] for r in rs))
    print("| import order | pagedcy s | transformers s | ratio | OpenMP runtime | wait policy "
          "| pagedcy SIMD | torch ISA |")
    print("|---|---|---|---|---|---|---|---|")
    for order, r in rows.items():
        print(f"| {order} | {r['pagedcy_s']:.3f} | {r['transformers_s']:.3f} | "
              f"{r['transformers_s'] / r['pagedcy_s']:.2f}x | {r['runtime']} | {r['wait_policy']} "
              f"| {r['simd']} | {r['torch_isa']} |")
    slow = rows["torch-first"]["pagedcy_s"] / rows["pagedcy-first"]["pagedcy_s"] - 1
    pairs = ", ".join(f"{100 * (b['pagedcy_s'] / a['pagedcy_s'] - 1):+.1f}%"
                      for a, b in zip(runs["pagedcy-first"], runs["torch-first"]))
    print(f"torch first is {100 * slow:+.1f}% vs pagedcy first (best of {args.pairs} "
          f"subprocesses each; pair by pair {pairs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
