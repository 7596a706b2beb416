"""The engine on the files people download: ``python -m pagedcy bench --engine --gguf FILE``
(repeatable) and ``--bf16-vs-f32``.

For each GGUF file, in a fresh interpreter (so its RSS is the file's alone): RSS after the
load, prefill of one ``npp``-token prompt (pp512), single-sequence decode (tg64) and the total
seconds of ``npl`` x (``npp`` prompt + ``new`` generated) through ``LLM.generate`` (continuous
batching; llama-batched-bench's shape, 16 x (512 + 32)). Then RSS against file size + KV pool,
the bytes a decode token reads, the read bandwidth (``_bandwidth.read_bandwidth``: the run's
best, and the best of the probes around the file's decode runs) and the decode rate as a
share of what that bandwidth allows, then each decode step against a read right after it
(:func:`_steps_vs_reads`, which carries the 70% target: on a host whose bandwidth moves from
31 to 67 GB/s within seconds, a best step and a best probe seconds apart compare two
different machines), and llama.cpp's rows on the same file
when its binaries are built under ``~/.cache/pagedcy-anchors`` (never built here): its runs
alternate with ours in the same minutes (a llama-bench run after each of our pp / tg runs,
llama-batched-bench after our batched run), and both sides' pp / tg are the best of
``--repeats`` runs (3 by default).

``--bf16-vs-f32``: a random checkpoint of qwen2.5-0.5b's shape saved as bf16 safetensors,
loaded with ``dtype="auto"`` (kept bf16) and ``dtype="float32"`` (widened): RSS and pp / tg
of each load in its own interpreter, then both loads in one interpreter, pp runs alternating and
tg with their decode steps in lockstep (:func:`measure_pair`), which gives the ratio: the
host's read bandwidth moves by a sixth between runs a minute apart (tg ratios of separate runs
1.57-2.39x, of lockstep ones 1.85-1.94x, AMD EPYC Zen 4), and two memory-bound rates are
comparable only when measured in the same seconds.
"""
import json
import os
import time

from pagedcy.tools import bench_engine as be

#: MiB of the buffer read after each decode step (:func:`_steps_vs_reads`): 8x a 32 MiB L3
READ_PAIR_MIB = 256


def read_pair_mib(quick):
    """MiB of :func:`_steps_vs_reads`' buffer: ``READ_PAIR_MIB``, 16 with ``quick``."""
    return 16 if quick else READ_PAIR_MIB

#: qwen2.5-0.5b's shape (the bf16 row); tied embeddings as the real model
QWEN_05B = dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=4096,
                tie_word_embeddings=True)
QWEN_TINY = dict(QWEN_05B, vocab_size=512, hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)


def sizes(quick):
    """``(npp, ntg, npl, new)``: prompt tokens, tg tokens, parallel sequences, generated."""
    return (32, 8, 2, 4) if quick else (512, 64, 16, 32)


def rss_bytes():
    """This process's resident set size now (``VmRSS``), bytes; 0 where unknown."""
    from pagedcy.tools.engine_profile import proc_status_bytes
    return proc_status_bytes("VmRSS") or 0


def decode_read_bytes(model):
    """Weight bytes one decode token reads: every held weight except an untied embedding
    table, of which a token gathers one row (a tied table is read whole as the LM head)."""
    embed = getattr(model, "_embed", None)
    return model.weight_bytes - (embed.nbytes if embed is not None else 0)


def _kv_bytes_per_position(pages):
    """K/V bytes of one token position over all layers, from the pool ``[pages, layers, 2,
    page_size, kv_heads, row]``."""
    return pages[0].nbytes // pages.shape[3]


def _pp(eng, npp, vocab, seed):
    """pp ``npp`` tok/s of one prompt (llama-bench's pp). Distinct seeds give distinct
    prompts, so the prefix cache never serves a repeat."""
    (p,) = be.workload_a_prompts(1, npp, npp, vocab, seed=seed)
    eng.add_request(f"pp{seed}", {"prompt_token_ids": p}, be._greedy(1))
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        eng.step()
    return npp / (time.perf_counter() - t0)


def _single(eng, npp, ntg, vocab, seed):
    """(pp, tg): :func:`_pp`, then tg ``ntg`` tok/s of one sequence from a 1-token prompt
    (llama-bench's tg)."""
    return _pp(eng, npp, vocab, seed), _tg_lockstep({0: eng}, ntg, vocab, seed)[0]


def measure(model, threads=2, quick=False, dtype="auto", repeats=3, batched=True,
            batched_tokens=2048, llama_cpp=None):
    """Load ``model`` (a GGUF file or checkpoint directory) in this process and time it; a
    dict of RSS figures, sizes, ``pp`` / ``tg`` (best of ``repeats``), ``probes`` (read
    bandwidth in GB/s before, between and after those runs) and ``batched_s``.

    ``llama_cpp``: llama.cpp's binaries and file (:func:`engine_baselines.llama_cpp_bins`) to
    run between ours, under ``"llama.cpp"`` (:func:`engine_baselines.merge_llama_cpp`): one
    llama-bench run (``-r 1``) after each of our pp / tg runs and llama-batched-bench after our
    batched run, so both sides are timed in the same minutes and take the best of as many
    runs. On a host whose bandwidth moves by a third within minutes, llama.cpp's mean of 3
    runs timed after all of ours was neither."""
    from pagedcy.engine import LLM
    from pagedcy.tools import engine_baselines as base
    from pagedcy.tools.engine_profile import peak_rss_bytes
    npp, ntg, npl, new = sizes(quick)
    before = rss_bytes()
    pages = be._kv_pages_for([npp + new + 1] * npl + [npp + 1, ntg + 2])
    t0 = time.perf_counter()
    llm = LLM(model, num_threads=threads, dtype=dtype, kv_cache_pages=pages,
              max_num_batched_tokens=batched_tokens)
    load_s = time.perf_counter() - t0
    after_load = rss_bytes()
    eng = llm.llm_engine
    m, c = eng.model, eng.model.config
    res = {"load_s": load_s, "rss_before_load": before, "rss_after_load": after_load,
           "pool": eng.manager.store.pages().nbytes, "weight_bytes": m.weight_bytes,
           "decode_bytes": decode_read_bytes(m),
           "kv_bytes_per_position": _kv_bytes_per_position(eng.manager.store.pages()),
           "file_size": os.path.getsize(model) if os.path.isfile(model) else None,
           "config": f"{c.architecture}, hidden {c.hidden_size}, {c.num_layers} layers, "
                     f"{c.num_heads}/{c.num_kv_heads} heads x {c.head_dim}, intermediate "
                     f"{c.intermediate_size}, vocab {c.vocab_size}"}
    _single(eng, 16, 2, c.vocab_size, seed=100)          # warm-up: threads, first touches
    # bandwidth probes before, between and after the runs: the host's bandwidth swings by a
    # third within seconds, so the best decode is held against the best probe of the same
    # few seconds (not one from minutes away)
    runs, probes, theirs = [], [_bandwidth_child(threads, quick)], []
    for i in range(repeats):
        runs.append(_single(eng, npp, ntg, c.vocab_size, seed=200 + i))
        if llama_cpp:
            theirs.append(base.llama_cpp_single(llama_cpp, threads, npp, ntg, reps=1))
        probes.append(_bandwidth_child(threads, quick))
    res["pp"], res["tg"] = max(r[0] for r in runs), max(r[1] for r in runs)
    res["probes"] = probes
    if batched:
        prompts = be.workload_a_prompts(npl, npp, npp, c.vocab_size, seed=300)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], be._greedy(new + 1),
                            use_tqdm=False)
        res["batched_s"] = time.perf_counter() - t0
        res["batched_new"] = sum(len(o.outputs[0].token_ids) for o in outs)
        if llama_cpp:
            theirs.append(base.llama_cpp_batched(llama_cpp, threads, npl, npp, new))
    if llama_cpp:
        res["llama.cpp"] = base.merge_llama_cpp(theirs)
    res["rss_after_runs"], res["peak_rss"] = rss_bytes(), peak_rss_bytes()
    # after the RSS figures: its read buffer is not the model's memory
    res["steps_vs_reads"] = _steps_vs_reads(eng, ntg, c.vocab_size, repeats, threads, quick)
    return res


def _steps_vs_reads(eng, ntg, vocab, repeats, threads, quick):
    """``repeats`` tg ``ntg`` runs of one sequence with a read of a buffer several times the
    last-level cache after each decode step (``read_bandwidth``, one timed pass on ``threads``
    threads): ``[[step seconds, GB/s], ...]``. A step and its read are milliseconds apart, so
    their ratio holds where the host's bandwidth swings by a half within seconds and the best
    step and the best probe of a run come from different moments."""
    import numpy as np
    from pagedcy._libs._bandwidth import read_bandwidth
    buf = np.ones(read_pair_mib(quick) * 2**20 // 4, np.float32)
    pairs = []

    def read_after(_, seconds):
        pairs.append([seconds, read_bandwidth(buffer=buf, num_threads=threads, repeats=1)])
    for i in range(repeats):
        _tg_lockstep({0: eng}, ntg, vocab, seed=400 + i, after_step=read_after)
    return pairs


def _tg_lockstep(engines, ntg, vocab, seed, after_step=None):
    """tg ``ntg`` tok/s of one sequence on each engine, their decode steps taken in turn (a
    step of the first, a step of the second, ...) and each engine's own steps timed and
    summed: the rates come from the same seconds, step by step. ``after_step(name,
    seconds)``, when given, runs after each timed decode step, outside its time."""
    (p,) = be.workload_a_prompts(1, 1, 1, vocab, seed=seed)
    spent = dict.fromkeys(engines, 0.0)
    for eng in engines.values():
        eng.add_request(f"tg{seed}", {"prompt_token_ids": p}, be._greedy(ntg + 1))
        eng.step()                               # the 1-token prefill samples the first token
    while any(eng.has_unfinished_requests() for eng in engines.values()):
        for name, eng in engines.items():
            if eng.has_unfinished_requests():
                t0 = time.perf_counter()
                eng.step()
                seconds = time.perf_counter() - t0
                spent[name] += seconds
                if after_step is not None:
                    after_step(name, seconds)
    return {name: ntg / s for name, s in spent.items()}


def measure_pair(model, threads=2, quick=False, dtypes=("auto", "float32"), repeats=3):
    """Load ``model`` once per entry of ``dtypes`` in this process and time them side by side:
    pp of one prompt on each in turn, then tg with the loads' decode steps in lockstep
    (:func:`_tg_lockstep`), ``repeats`` rounds; ``{dtype: {"pp": best, "tg": best, "tg_runs":
    [...]}}``. RSS is not measured here (the loads share one process): :func:`measure` in
    separate interpreters gives it."""
    from pagedcy.engine import LLM
    npp, ntg, _, _ = sizes(quick)
    pages = be._kv_pages_for([npp + 1] + [ntg + 2] * len(dtypes))
    engines = {dt: LLM(model, num_threads=threads, dtype=dt, kv_cache_pages=pages).llm_engine
               for dt in dtypes}
    vocab = next(iter(engines.values())).model.config.vocab_size
    for eng in engines.values():
        _single(eng, 16, 2, vocab, seed=100)             # warm-up: threads, first touches
    pp = {dt: [] for dt in dtypes}
    tg = {dt: [] for dt in dtypes}
    for i in range(repeats):
        for dt, eng in engines.items():
            pp[dt].append(_pp(eng, npp, vocab, seed=200 + i))
        for dt, rate in _tg_lockstep(engines, ntg, vocab, seed=300 + i).items():
            tg[dt].append(rate)
    return {dt: {"pp": max(pp[dt]), "tg": max(tg[dt]), "tg_runs": tg[dt]} for dt in dtypes}


def _measure_child(model, timeout=7200, func="measure", **spec):
    """:func:`measure` (or ``func``: ``"measure_pair"``) in a fresh interpreter; its dict or
    ``{"error": text}``."""
    import subprocess
    import sys
    spec["model"], spec["func"] = model, func
    try:
        out = subprocess.run([sys.executable, "-m", "pagedcy.tools.bench_gguf"], input=json.dumps(spec),
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if out.returncode != 0:
        return {"error": ((out.stderr.strip().splitlines() or ["failed"])[-1])[:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def bandwidth(threads, quick):
    """Read bandwidth in GB/s on ``threads`` threads: best of 5 passes over 2 GiB (several
    times the last-level cache, as ``bench``'s), 64 MiB with ``quick``."""
    from pagedcy._libs._bandwidth import read_bandwidth
    return read_bandwidth(nbytes=(64 if quick else 2048) * 2**20, num_threads=threads, repeats=5)


def _bandwidth_child(threads, quick):
    """:func:`bandwidth` in a fresh interpreter, so its buffer never counts in this process's
    RSS or peak RSS."""
    import subprocess
    import sys
    code = ("import sys; from pagedcy.tools.bench_gguf import bandwidth; "
            "print(bandwidth(int(sys.argv[1]), sys.argv[2] == '1'))")
    out = subprocess.run([sys.executable, "-c", code, str(threads), "1" if quick else "0"],
                         capture_output=True, text=True, timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _mib(n):
    return f"{n / 2**20:.{0 if n >= 100 * 2**20 else 2}f} MiB"


def _ratio(a, b, higher=True):
    if a is None or b is None:
        return "-"
    return f"{(a / b if higher else b / a):.2f}x"


def format_file(path, ours, theirs, bw, threads, quick, missing="not built"):
    """One GGUF file's report: the rows table (ours, llama.cpp's, ratio), memory, bandwidth.
    ``theirs``: :func:`engine_baselines.merge_llama_cpp`'s dict, or None (cells say ``missing``)."""
    npp, ntg, npl, new = sizes(quick)
    lines = [f"\n## {path}"]
    if "error" in ours:
        return "\n".join(lines + [f"pagedcy failed: {ours['error']}"])
    lines.append(f"{ours['config']}; file {_mib(ours['file_size'])}; {threads} threads; "
                 f"load {ours['load_s']:.1f} s")
    t = theirs or {}
    note = missing if theirs is None else "failed"
    rows = []
    for label, a, b, fmt, higher in (
            (f"prefill pp{npp} tok/s", ours["pp"], t.get("single_prefill_tps"), "{:.1f}", True),
            (f"decode tg{ntg} tok/s", ours["tg"], t.get("single_decode_tps"), "{:.2f}", True),
            (f"{npl} x ({npp} + {new}) total s", ours.get("batched_s"), t.get("total_s"), "{:.2f}",
             False)):
        rows.append((label, fmt.format(a) if a is not None else "-",
                     fmt.format(b) if b is not None else note, _ratio(a, b, higher)))
    lines.append(be._md(["row", "pagedcy", "llama.cpp", "pagedcy speed / llama.cpp"], rows))
    budget = ours["file_size"] + ours["pool"]
    lines.append(f"RSS after load {_mib(ours['rss_after_load'])}, after the runs "
                 f"{_mib(ours['rss_after_runs'])} (peak {_mib(ours['peak_rss'])}) vs file "
                 f"{_mib(ours['file_size'])} + KV pool {_mib(ours['pool'])} = {_mib(budget)}: "
                 f"{ours['rss_after_load'] / budget:.2f}x after load, "
                 f"{ours['rss_after_runs'] / budget:.2f}x after the runs (target <= 1.25x); "
                 f"less the interpreter + numpy + pagedcy before the load "
                 f"({_mib(ours['rss_before_load'])}): "
                 f"{(ours['rss_after_runs'] - ours['rss_before_load']) / budget:.2f}x; weights as "
                 f"held {_mib(ours['weight_bytes'])}")
    kv = ours["kv_bytes_per_position"] * (ntg + 1) / 2      # mean context over tg's steps
    per_token = ours["decode_bytes"] + kv
    def shares(bw_gbs, note=""):
        """"allows R tok/s: pagedcy decode = X% of it<note>[, llama.cpp's = Y%]" at ``bw_gbs``."""
        roof = bw_gbs * 1e9 / per_token
        text = f"allows {roof:.1f} tok/s: pagedcy decode = {100 * ours['tg'] / roof:.0f}% of it{note}"
        if t.get("single_decode_tps"):
            text += f", llama.cpp's = {100 * t['single_decode_tps'] / roof:.0f}%"
        return text
    lines.append(f"a decode token reads {per_token / 1e6:.1f} MB (weights {ours['decode_bytes'] / 1e6:.1f} "
                 f"MB + K/V {kv / 1e6:.2f} MB at tg{ntg}'s mean context); read bandwidth "
                 f"{bw:.1f} GB/s on {threads} threads {shares(bw)}")
    if ours.get("probes"):
        local = max(ours["probes"])
        lines.append(f"read bandwidth probed before, between and after the tg runs: "
                     f"{', '.join(f'{b:.1f}' for b in ours['probes'])} GB/s; the best, {local:.1f}, "
                     f"{shares(local)}")
    pairs = ours.get("steps_vs_reads")
    if pairs:
        import statistics
        fracs = [per_token / (sec * gbs * 1e9) for sec, gbs in pairs]
        q1, med, q3 = statistics.quantiles(fracs, n=4) if len(fracs) > 1 else fracs * 3
        lines.append(f"decode steps each followed by a read of {read_pair_mib(quick)} MiB "
                     f"({len(pairs)} steps, reads {min(g for _, g in pairs):.1f}-"
                     f"{max(g for _, g in pairs):.1f} GB/s): a step's rate over what its read's "
                     f"bandwidth allows, median {100 * med:.0f}% (quartiles {100 * q1:.0f}-"
                     f"{100 * q3:.0f}%; target >= 70%)")
    if t.get("error"):
        lines.append(f"llama.cpp: {t['error']}")
    for table in t.get("tables", []):
        lines.append("llama.cpp's own table:\n" + table)
    return "\n".join(lines)


def bf16_checkpoint(quick):
    """The random bf16 checkpoint of qwen2.5-0.5b's shape (tiny with ``quick``), written once."""
    import tempfile
    from pagedcy.models import write_random_checkpoint
    if quick:
        path = os.path.join(tempfile.mkdtemp(prefix="pagedcy-bench-"), "rand-qwen-tiny-bf16")
    else:
        path = os.path.join(os.path.expanduser("~"), ".cache", "pagedcy-bench", "rand-qwen2.5-0.5b-bf16")
    if not os.path.isfile(os.path.join(path, "config.json")):
        write_random_checkpoint(path, "Qwen2ForCausalLM", dtype="bfloat16", seed=0, tokenizer=False,
                                **(QWEN_TINY if quick else QWEN_05B))
    return path


def format_bf16(path, auto, f32, quick, pair=None):
    """The bf16-vs-float32 table: rates and RSS of each load of the same bf16 checkpoint, each
    in its own process (``auto``, ``f32``: :func:`measure`'s dicts), and the rates of the two
    loads alternating in one process (``pair``: :func:`measure_pair`'s dict), which carry the
    target."""
    npp, ntg, _, _ = sizes(quick)
    lines = [f"\n## bf16 safetensors {path}: dtype='auto' (kept bf16) vs dtype='float32'"]
    for name, r in (("auto", auto), ("float32", f32), ("both, alternating", pair or {})):
        if "error" in r:
            return "\n".join(lines + [f"dtype={name} failed: {r['error']}"])
    lines.append(auto["config"])

    def rates(how, a, b, note):
        """The pp and tg rows of loads ``a`` (bf16) and ``b`` (float32); ``note`` after tg's ratio."""
        return [(f"prefill pp{npp} tok/s, {how}", f"{a['pp']:.1f}", f"{b['pp']:.1f}", _ratio(a["pp"], b["pp"])),
                (f"decode tg{ntg} tok/s, {how}", f"{a['tg']:.2f}", f"{b['tg']:.2f}", _ratio(a["tg"], b["tg"]) + note)]
    rows = []
    if pair:
        paired = sorted(x / y for x, y in zip(pair["auto"]["tg_runs"], pair["float32"]["tg_runs"]))
        rows += rates("alternating", pair["auto"], pair["float32"],
                      f" (target >= 1.7x; run by run {', '.join(f'{r:.2f}' for r in paired)})")
    rows += rates("own process", auto, f32, "" if pair else " (target >= 1.7x)")
    rows += [("weights as held", _mib(auto["weight_bytes"]), _mib(f32["weight_bytes"]),
              f"{auto['weight_bytes'] / f32['weight_bytes']:.2f}"),
             ("RSS after load", _mib(auto["rss_after_load"]), _mib(f32["rss_after_load"]),
              f"{auto['rss_after_load'] / f32['rss_after_load']:.2f} (target about 0.5)"),
             ("RSS after the runs", _mib(auto["rss_after_runs"]), _mib(f32["rss_after_runs"]),
              f"{auto['rss_after_runs'] / f32['rss_after_runs']:.2f}")]
    lines.append(be._md(["row", "dtype=auto (bf16)", "dtype=float32", "auto / float32"], rows))
    lines.append("alternating: both loads in one process, a pp run of each in turn, then tg with "
                 "their decode steps in lockstep, each load's steps timed; best of the rounds (the "
                 "ratio's rows); own process: each load alone, for its RSS")
    return "\n".join(lines)


def run(args):
    """``bench --engine --gguf FILE ... [--bf16-vs-f32]`` from ``bench_engine.main``'s args."""
    from pagedcy.tools import engine_baselines as base
    print(be.machine_header())
    npp, ntg, npl, new = sizes(args.quick)
    repeats = args.repeats
    print(f"rows: pp{npp} (one {npp}-token prompt), tg{ntg} (one sequence), {npl} x ({npp} prompt + "
          f"{new} generated) through LLM.generate (pagedcy: {new + 1} sampled tokens, the prefill's "
          f"first one included, as llama-batched-bench's {new} decode steps after its prefill); "
          f"greedy, {args.threads} threads, best of {repeats} for pp / tg; llama.cpp (cached binaries "
          f"only) runs between pagedcy's runs: one llama-bench run (-r 1) after each pp / tg run, "
          f"llama-batched-bench after the batched one, best of {repeats} for pp / tg likewise")
    results = {"files": {}}
    bw_start = bandwidth(args.threads, args.quick) if args.gguf else None
    for path in args.gguf or []:
        bins = None if args.no_llama_cpp else base.llama_cpp_bins(os.path.abspath(path))
        be._progress(f"pagedcy on {path}" + (", llama.cpp's runs between ours" if bins else ""))
        ours = _measure_child(os.path.abspath(path), threads=args.threads, quick=args.quick,
                              repeats=repeats, llama_cpp=list(bins) if bins else None)
        theirs = ours.pop("llama.cpp", None)
        results["files"][path] = {"pagedcy": ours, "llama.cpp": theirs}
    if args.gguf:
        # before and after the runs: a busy neighbour lowers one, the better one is the machine's
        bw_end = bandwidth(args.threads, args.quick)
        results["bandwidth"] = bw = max(bw_start, bw_end)
        print(f"read bandwidth (pagedcy._libs._bandwidth.read_bandwidth, {args.threads} threads): "
              f"{bw:.1f} GB/s, the better of {bw_start:.1f} before the files and {bw_end:.1f} after")
        for path, r in results["files"].items():
            print(format_file(path, r["pagedcy"], r["llama.cpp"], bw, args.threads, args.quick,
                              "--no-llama-cpp" if args.no_llama_cpp else "not built"))
    if args.bf16_vs_f32:
        path = bf16_checkpoint(args.quick)
        got = {}
        for dt in ("auto", "float32"):
            be._progress(f"bf16 checkpoint, dtype={dt}")
            got[dt] = _measure_child(path, threads=args.threads, quick=args.quick, dtype=dt,
                                     repeats=repeats, batched=False)
        be._progress("bf16 checkpoint, both dtypes alternating in one process")
        got["pair"] = _measure_child(path, func="measure_pair", threads=args.threads,
                                     quick=args.quick, repeats=repeats)
        results["bf16"] = got
        print(format_bf16(path, got["auto"], got["float32"], args.quick, got["pair"]))
    return results


if __name__ == "__main__":
    import sys
    _spec = json.loads(sys.stdin.read())
    _func = {"measure": measure, "measure_pair": measure_pair}[_spec.pop("func", "measure")]
    print(json.dumps(_func(_spec.pop("model"), **_spec)))
