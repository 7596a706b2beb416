"""The engine benchmark's baselines: transformers (``generate`` on a padded static batch,
``generate_batch`` continuous batching) and llama.cpp's own benchmark binaries.

Each transformers row runs in a fresh interpreter that never imports pagedcy, so torch keeps
its own OpenMP settings: ``python -m pagedcy.tools.engine_baselines MODE MODEL_DIR SPEC_JSON``
prints one JSON line ``{"seconds", "new_tokens", "prompt_tokens"}``.
"""
import glob
import json
import os
import re
import subprocess
import sys

LLAMA_CPP_CACHE = os.environ.get("PAGEDCY_ANCHORS", os.path.expanduser("~/.cache/pagedcy-anchors"))
GGUF_NAME = "rand-llama-55m-f32.gguf"


def transformers_available():
    """True when torch and transformers import (checked in a subprocess-free way)."""
    import importlib.util
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def run_transformers(mode, model_dir, prompts, new_tokens, threads, timeout=3600):
    """Run one transformers row in a subprocess; returns the child's JSON dict, or
    ``{"error": text}``. ``mode``: "generate" (padded static batch, sdpa) or "generate_batch"."""
    spec = json.dumps({"prompts": prompts, "new_tokens": new_tokens, "threads": threads})
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",)}
    try:
        out = subprocess.run([sys.executable, "-m", "pagedcy.tools.engine_baselines", mode, model_dir],
                             input=spec, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["failed"])[-1]
        return {"error": tail[:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(mode, model_dir, spec):
    import time
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.set_num_threads(spec["threads"])
    prompts, n_new = spec["prompts"], spec["new_tokens"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    if mode == "generate":
        # one padded static batch, left-padded, every request forced to n_new tokens
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        cfg = GenerationConfig(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                               pad_token_id=0, eos_token_id=None)
        with torch.inference_mode():
            model.generate(input_ids=ids[:1, -8:], attention_mask=mask[:1, -8:],
                           generation_config=GenerationConfig(max_new_tokens=2, do_sample=False,
                                                              pad_token_id=0, eos_token_id=None))
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
            secs = time.perf_counter() - t0
        new = int((out.shape[1] - width) * len(prompts))
    elif mode == "generate_batch":
        from transformers import ContinuousBatchingConfig
        cfg = GenerationConfig(max_new_tokens=n_new, do_sample=False, eos_token_id=-1, pad_token_id=0)
        # a cache sized to the workload, as pagedcy's pool is: left to itself on a CPU it sizes
        # the cache from the machine's RAM and spends most of the call allocating it
        page = 256
        cb = ContinuousBatchingConfig(page_size=page, max_batch_tokens=2048,
                                      num_blocks=sum(-(-(len(p) + n_new) // page) for p in prompts) + 2)
        with torch.inference_mode():
            t0 = time.perf_counter()
            res = model.generate_batch(inputs=prompts, generation_config=cfg,
                                       continuous_batching_config=cb, progress_bar=False)
            secs = time.perf_counter() - t0
        new = sum(len(r.generated_tokens) for r in res.values())
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps({"seconds": secs, "new_tokens": new,
                      "prompt_tokens": sum(len(p) for p in prompts)}))


def llama_cpp_bins(model=None):
    """``(llama-bench, llama-batched-bench, gguf)`` paths when the anchor script has built them
    and the model exists (``model``, default the 55M Llama it writes), else None. Never
    builds anything."""
    for src in sorted(glob.glob(os.path.join(LLAMA_CPP_CACHE, "llama_cpp_python-*", "vendor", "llama.cpp"))):
        b = os.path.join(src, "build", "bin")
        bench, batched = os.path.join(b, "llama-bench"), os.path.join(b, "llama-batched-bench")
        path = model if model is not None else os.path.join(LLAMA_CPP_CACHE, GGUF_NAME)
        if all(os.access(p, os.X_OK) for p in (bench, batched)) and os.path.isfile(path):
            return bench, batched, path
    return None


def _table_rows(text):
    """Rows of a markdown-ish ``| a | b |`` table as lists of stripped cells (header included)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s\-:|]+\|$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _run(cmd, timeout):
    """``(stdout, None)`` of a llama.cpp binary, or ``(stdout, error text)`` when it failed
    (a build for another CPU dies of SIGILL, one whose AMX tiles the kernel refuses of SIGSEGV)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "", f"{os.path.basename(cmd[0])} timed out after {timeout} s"
    if out.returncode != 0:
        return out.stdout, f"{os.path.basename(cmd[0])} exited with {out.returncode}"
    return out.stdout, None


def llama_cpp_batched(bins, threads, npl, npp, ntg, timeout=900):
    """llama-batched-bench (``npl`` sequences x (``npp`` prompt + ``ntg`` generated)) with
    ``bins`` (:func:`llama_cpp_bins`' tuple): ``prefill_tps``, ``gen_tps``, ``total_s``,
    ``tables`` and, when it failed, ``error``."""
    batched, model = bins[1], bins[2]
    res = {"tables": []}
    stdout, err = _run([batched, "-m", model, "-t", str(threads), "-c", str(max(4096, npl * (npp + ntg) + 64)),
                        "-b", "2048", "-ub", "512", "-npp", str(npp), "-ntg", str(ntg), "-npl", str(npl)],
                       timeout)
    rows = _table_rows(stdout)
    if len(rows) >= 2:
        head, vals = rows[0], rows[-1]
        col = {h: i for i, h in enumerate(head)}
        res["prefill_tps"] = float(vals[col["S_PP t/s"]])
        res["gen_tps"] = float(vals[col["S_TG t/s"]])
        res["total_s"] = float(vals[col["T s"]])
        res["tables"].append(stdout.strip())
    if err:
        res["error"] = err
    return res


def llama_cpp_single(bins, threads, npp, tg, reps=3, timeout=900):
    """llama-bench (pp ``npp`` and tg ``tg``, one sequence, ``-r reps``: the mean of ``reps``
    runs) with ``bins``: ``single_prefill_tps``, ``single_decode_tps``, ``tables`` and, when
    it failed, ``error``."""
    bench, model = bins[0], bins[2]
    res = {"tables": []}
    stdout, err = _run([bench, "-m", model, "-t", str(threads), "-p", str(npp), "-n", str(tg),
                        "-r", str(reps)], timeout)
    rows = _table_rows(stdout)
    if len(rows) >= 2:
        col = {h: i for i, h in enumerate(rows[0])}
        for vals in rows[1:]:
            rate = float(vals[col["t/s"]].split("±")[0])
            test = vals[col["test"]]
            if test.startswith("pp"):
                res["single_prefill_tps"] = rate
            elif test.startswith("tg"):
                res["single_decode_tps"] = rate
        res["tables"].append(stdout.strip())
    if err:
        res["error"] = err
    return res


def merge_llama_cpp(parts):
    """One dict of several :func:`llama_cpp_batched` / :func:`llama_cpp_single` results: each
    rate the best of the parts that have it (``total_s`` the least), tables in order, errors
    joined."""
    res = {"tables": [t for p in parts for t in p.get("tables", [])]}
    for key, best in (("prefill_tps", max), ("gen_tps", max), ("total_s", min),
                      ("single_prefill_tps", max), ("single_decode_tps", max)):
        got = [p[key] for p in parts if key in p]
        if got:
            res[key] = best(got)
    errors = [p["error"] for p in parts if p.get("error")]
    if errors:
        res["error"] = "; ".join(errors)
    return res


def run_llama_cpp(threads, npl, npp, ntg, timeout=900, model=None, tg=64):
    """Run llama.cpp's batched bench (npl sequences x (npp prompt + ntg generated)) and
    llama-bench (pp npp, tg ``tg``, one sequence, mean of 3 runs) on ``model`` (default the
    55M Llama's GGUF). Returns a dict with ``prefill_tps``, ``gen_tps``, ``total_s``,
    ``single_decode_tps``, ``single_prefill_tps``, the raw tables and, when a binary
    failed, ``error``; None when the binaries are not built."""
    bins = llama_cpp_bins(model)
    if bins is None:
        return None
    return merge_llama_cpp([llama_cpp_batched(bins, threads, npl, npp, ntg, timeout),
                            llama_cpp_single(bins, threads, npp, tg, 3, timeout)])


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], json.loads(sys.stdin.read()))
