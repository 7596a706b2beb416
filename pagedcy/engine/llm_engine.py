"""``LLMEngine``: requests in, one model forward per step, outputs out (vLLM's API)."""
import os
import time

import numpy as np

from pagedcy import _validate
from pagedcy.engine import sampler
from pagedcy.engine.inputs import parse_prompt
from pagedcy.engine.outputs import EngineStats
from pagedcy.engine.pool_size import default_num_pages
from pagedcy.engine.sampling_params import SamplingParams
from pagedcy.engine.scheduler import Scheduler
from pagedcy.engine.sequence import Request, Sequence, SeqStatus
from pagedcy.engine.stop_checker import StopChecker
from pagedcy.engine.tokenizer import load_tokenizer
from pagedcy.errors import PoolExhaustedError
from pagedcy.kvcache.manager import PagedKVCacheManager

__all__ = ["LLMEngine"]

_PREEMPTION_MODES = ("recompute", "swap")


class LLMEngine:
    """Continuous-batching generation over one checkpoint and one paged KV cache.

    LLMEngine(model_dir, *, kv_cache_pages=None, page_size=16, kv_dtype="float32",
              max_num_seqs=256, max_num_batched_tokens=2048, enable_prefix_cache=True,
              num_threads=None, seed=0, preemption_mode="recompute", swap_pages=0,
              max_model_len=None, dtype="auto", quantization=None, activation_dtype="auto",
              kv_store=None)

    model_dir: a Hugging Face checkpoint directory (``pagedcy.models.load_model``) or a GGUF
    file (``model.gguf``: weights stay in their block formats, memory-mapped; the tokenizer and
    chat template come from its metadata).
    dtype / quantization: how the weights are held (``load_model``'s options, vLLM's names):
    dtype "auto" (as stored: 16-bit stays 16-bit), "float32", "float16" or "bfloat16";
    quantization None, "q8_0" or "q4_0" (GGUF block formats, quantized at load).
    activation_dtype: "auto" (int8 activations for Q4_K / Q5_0 / Q6_K / Q8_0 weights, and int8
    decode queries over a ``kv_dtype="int8"`` cache, as llama.cpp) or "float32" (float32
    activations for every weight and query).
    kv_cache_pages: pages in the KV pool (None: :func:`default_num_pages`).
    max_num_seqs / max_num_batched_tokens: at most this many sequences / new tokens in
    one step (longer prompts are prefilled in chunks). preemption_mode: "recompute" or
    "swap" (swap needs ``swap_pages`` > 0 and falls back to recompute when the swap
    pool is full). seed: seeds requests whose SamplingParams have no seed.
    max_model_len: the longest sequence (prompt + output) a request may ask for, at most
    the model's ``max_position_embeddings`` and the KV pool's tokens (ValueError beyond
    either); None: the smaller of the two (attribute ``max_model_len``).
    kv_store: a Redis URL (``redis://host:port/db``, ``rediss://``, ``unix://``, with
    password and query options as ``redis.Redis.from_url`` reads them) of a KV page store
    shared by engines of the same model: full prompt pages are written there behind the
    steps and read back at admission past the local prefix cache (needs
    ``enable_prefix_cache``; a store that is down or slow only means more prefill).
    Attributes: ``tokenizer`` (:class:`~pagedcy.engine.tokenizer.Tokenizer` or None),
    ``model_config``, ``model_dir``, ``model``, ``manager``, ``scheduler``, ``kv_store``
    (:class:`~pagedcy.kvcache.kvstore.KVStore` or None).

    FileNotFoundError / ValueError from loading the checkpoint; ValueError / TypeError
    for bad options. Single-threaded: the caller serializes calls.
    """

    def __init__(self, model_dir, *, kv_cache_pages=None, page_size=16, kv_dtype="float32",
                 max_num_seqs=256, max_num_batched_tokens=2048, enable_prefix_cache=True,
                 num_threads=None, seed=0, preemption_mode="recompute", swap_pages=0,
                 max_model_len=None, dtype="auto", quantization=None, activation_dtype="auto",
                 kv_store=None):
        if not isinstance(model_dir, (str, os.PathLike)):
            raise TypeError(f"model_dir must be a path, got {type(model_dir).__name__}")
        options = dict(kv_cache_pages=kv_cache_pages, page_size=page_size, kv_dtype=kv_dtype,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       enable_prefix_cache=enable_prefix_cache, seed=seed,
                       preemption_mode=preemption_mode, swap_pages=swap_pages,
                       max_model_len=max_model_len, kv_store=kv_store)
        _check_options(**options)   # before the (slow) load
        from pagedcy.models.loader import is_gguf, load_gguf, load_model
        if is_gguf(model_dir):       # one file: the model, its tokenizer and chat template
            model, tokenizer, _ = load_gguf(model_dir, num_threads=num_threads, dtype=dtype,
                                            quantization=quantization,
                                            activation_dtype=activation_dtype)
            self._setup(model, tokenizer, os.fspath(model_dir), **options)
            return
        model = load_model(model_dir, num_threads=num_threads, dtype=dtype,
                           quantization=quantization, activation_dtype=activation_dtype)
        self._setup(model, load_tokenizer(model_dir), os.fspath(model_dir), **options)

    @classmethod
    def from_model(cls, model, tokenizer=None, **options):
        """An engine over an already loaded model: a ``CausalLM`` or any object with
        ``config`` (ModelConfig fields), ``kv_cache_config(max_pages, page_size, dtype)``
        and ``forward(kv_pages, token_ids, slots)``. ``options``: the constructor's
        keywords except ``num_threads``."""
        _check_options(**options)
        self = cls.__new__(cls)
        self._setup(model, tokenizer, None, **options)
        return self

    def _setup(self, model, tokenizer, model_dir, *, kv_cache_pages=None, page_size=16,
               kv_dtype="float32", max_num_seqs=256, max_num_batched_tokens=2048,
               enable_prefix_cache=True, seed=0, preemption_mode="recompute", swap_pages=0,
               max_model_len=None, kv_store=None):
        self.model = model
        self.model_config = model.config
        self.model_dir = model_dir
        self.tokenizer = tokenizer
        if kv_cache_pages is None:
            probe = model.kv_cache_config(1, page_size, kv_dtype)
            kv_cache_pages = default_num_pages(probe.bytes_per_page(), page_size, max_num_seqs,
                                               self.model_config.max_position_embeddings)
        cfg = model.kv_cache_config(kv_cache_pages, page_size, kv_dtype)
        self.manager = PagedKVCacheManager(cfg, enable_prefix_cache=enable_prefix_cache,
                                           swap_pages=swap_pages)
        self.max_model_len = _context_length(max_model_len, self.model_config.max_position_embeddings,
                                             kv_cache_pages * page_size)
        self.kv_store = None
        lookups = None
        if kv_store is not None:
            self.kv_store, lookups = _open_kv_store(kv_store, model, self.manager)
        self.scheduler = Scheduler(self.manager, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   preemption_mode=preemption_mode, store_lookups=lookups)
        self._seeds = np.random.SeedSequence(seed)
        self._requests = {}
        self._counters = dict.fromkeys(("prompt_tokens", "generation_tokens", "num_steps"), 0)
        self._timers = dict.fromkeys(("forward", "prefill_steps", "decode_steps"), 0.0)

    @property
    def max_num_seqs(self):
        """The most sequences one step runs (also the largest ``n`` a request may ask)."""
        return self.scheduler.max_num_seqs

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request_id, prompt, params=None):
        """Queue a request. ``prompt``: text, a list of token ids, or
        ``{"prompt_token_ids": [...]}``; ``params``: :class:`SamplingParams` (None: the
        defaults). Raises, with nothing changed: TypeError for bad types; ValueError for
        a duplicate id, an empty prompt, a token id outside the vocabulary, text without
        a tokenizer, stop strings without a tokenizer, prompt + max_tokens beyond the
        model's context, a sequence larger than the KV pool or n above max_num_seqs."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.n > self.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.max_num_seqs}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (the model has no tokenizer.json)")
        mc = self.model_config
        text, ids = parse_prompt(prompt, self.tokenizer, mc.vocab_size)
        n_prompt = int(ids.shape[0])
        ctx = self.max_model_len
        max_tokens = params.max_tokens if params.max_tokens is not None else ctx - n_prompt
        # max_model_len fits the pool too, so this one check also keeps every sequence
        # within the KV pages
        if n_prompt + max_tokens > ctx or max_tokens < 1:
            pool = self.manager.total_blocks() * self.manager.block_size()
            why = f"; the KV pool holds {pool} tokens (kv_cache_pages)" if ctx == pool else ""
            raise ValueError(f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds "
                             f"the engine's context (max_model_len) of {ctx} tokens{why}")
        req = Request(request_id, text, ids, params, max_tokens,
                      StopChecker(params, mc.eos_token_ids, max_tokens))
        rngs = self._rngs(params)
        for i in range(params.n):
            detok = self.tokenizer.detokenizer() if self.tokenizer else None
            req.seqs.append(Sequence(req, i, rngs[i] if rngs else None, detok))
        self._requests[request_id] = req
        self.scheduler.add(req.seqs[0])

    def _rngs(self, params):
        if params.greedy:
            return None
        if params.seed is not None:
            return [np.random.default_rng([params.seed, i]) for i in range(params.n)]
        return [np.random.default_rng(s) for s in self._seeds.spawn(params.n)]

    def abort_request(self, request_id):
        """Stop one request (a str) or several (an iterable of str) and free their pages
        at once; unknown ids (and non-string ids) are ignored. No output is produced for
        them."""
        if isinstance(request_id, str):
            ids = [request_id]
        else:
            try:
                ids = list(request_id)
            except TypeError:
                return
        for rid in ids:
            req = self._requests.pop(rid, None) if isinstance(rid, str) else None
            if req is None:
                continue
            for seq in req.seqs:
                if seq.status != SeqStatus.FINISHED:
                    self.scheduler.free(seq)
                    seq.finish("abort")

    def has_unfinished_requests(self):
        """True while any request is queued or running."""
        return bool(self._requests)

    def get_num_unfinished_requests(self):
        """Requests queued or running."""
        return len(self._requests)

    # -- the step ------------------------------------------------------------------------------
    def step(self):
        """Run one scheduler step (one model forward) and return a cumulative
        :class:`RequestOutput` for every request that got a token or finished."""
        t0 = time.perf_counter()
        sched = self.scheduler
        batch = sched.schedule()
        if not len(batch):
            return []
        mgr = self.manager
        handles = [s.handle for s in batch.seqs]
        q_lens = batch.q_lens
        token_ids = batch.token_ids()
        try:
            slots = mgr.prepare_step(handles, q_lens)
        except PoolExhaustedError:   # a copy-on-write copy found no page: retry smaller
            sched.rollback(batch)
            sched.preempt_last()
            return []
        t1 = time.perf_counter()
        try:
            logits = self.model.forward(mgr.store.pages(), token_ids, slots)
            self._timers["forward"] += time.perf_counter() - t1
            picks = self._sample(batch, self._check_logits(logits, len(batch)))
        except BaseException:
            # nothing counted yet (a bad forward, bad logits, an interrupt while sampling):
            # the step can run again
            sched.rollback(batch)
            raise
        mgr.commit_step(handles, q_lens)
        outputs = self._apply(batch, picks)
        c = self._counters
        c["num_steps"] += 1
        c["prompt_tokens"] += int(token_ids.shape[0]) - batch.num_decodes
        kind = "decode_steps" if batch.num_decodes == len(batch) else "prefill_steps"
        self._timers[kind] += time.perf_counter() - t0
        return outputs

    def _check_logits(self, logits, batch_size):
        """The forward's result as float32 ``[batch_size, vocab_size]`` (a model passed to
        from_model may return anything); TypeError/ValueError before the step counts."""
        if not isinstance(logits, np.ndarray) or logits.dtype.kind != "f":
            raise TypeError(f"the model's forward must return a float array, got "
                            f"{type(logits).__name__}{getattr(logits, 'dtype', '')}")
        want = (batch_size, self.model_config.vocab_size)
        if logits.shape != want:
            raise ValueError(f"the model's forward returned logits of shape {logits.shape}, "
                             f"expected {want}")
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def _sample(self, batch, logits):
        """The tokens of the sequences whose prompt or decode row completes this step, fork
        siblings included: [(seq, token, logprobs)]. Changes no sequence, so a failure or an
        interrupt here leaves the step to be rolled back."""
        rows, seqs = [], []
        for b, (seq, q) in enumerate(zip(batch.seqs, batch.q_lens.tolist())):
            if seq.num_computed + q == seq.total_len():
                rows.append(b)
                seqs.append(seq)
                if seq.index == 0 and not seq.output and seq.request.params.n > 1:
                    sibs = [s for s in seq.request.seqs[1:] if s.status == SeqStatus.FORK_PENDING]
                    rows += [b] * len(sibs)          # siblings draw from their parent's row
                    seqs += sibs
        greedy_rows = [i for i, s in enumerate(seqs) if s.rng is None]
        best = dict(zip(greedy_rows, sampler.greedy(logits, [rows[i] for i in greedy_rows]).tolist()
                        if greedy_rows else []))
        picks = []
        for i, (b, seq) in enumerate(zip(rows, seqs)):
            params = seq.request.params
            tok = best.get(i)
            if tok is None:
                tok = sampler.sample_row(logits[b], params, seq.rng)
            lp = None if params.logprobs is None else \
                sampler.token_logprobs(logits[b], tok, params.logprobs)
            picks.append((seq, tok, lp))
        return picks

    def _apply(self, batch, picks):
        """Advance the sequences, fork siblings, append the sampled tokens and check stops;
        returns the outputs."""
        for seq, q in zip(batch.seqs, batch.q_lens.tolist()):
            seq.num_computed += q
        for seq, _, _ in picks:           # before any token: a parent may finish on its first
            if seq.status == SeqStatus.FORK_PENDING:
                self._fork(seq)
        touched = {}
        for seq, tok, lp in picks:
            seq.append_token(tok, lp)
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
            touched[seq.request.request_id] = seq.request
        self._counters["generation_tokens"] += len(picks)
        self.scheduler.drop_finished()
        outputs = []
        for rid, req in touched.items():
            out = req.output()
            if out.finished:
                del self._requests[rid]
            outputs.append(out)
        return outputs

    def _fork(self, sib):
        """Completion ``sib`` (1..n-1) starts sharing completion 0's prompt pages
        (copy-on-write), just as 0 gets its first token."""
        parent = sib.request.seqs[0]
        sib.handle = self.manager.fork(parent.handle, sib.seq_id)
        sib.num_computed = parent.num_computed
        self.scheduler.add_running(sib)

    # -- introspection ---------------------------------------------------------------------------
    def stats(self):
        """An :class:`EngineStats` snapshot."""
        ms = self.manager.stats()
        s = self.scheduler
        c = self._counters
        return EngineStats(
            num_running=len(s.running), num_waiting=len(s.waiting), num_swapped=len(s.swapped),
            kv_pages_total=ms.total_blocks, kv_pages_used=ms.used_blocks,
            kv_pages_free=ms.free_blocks, prefix_cache_queries=ms.prefix_queries,
            prefix_cache_hits=ms.prefix_hits, num_preemptions=s.num_preemptions,
            prompt_tokens=c["prompt_tokens"], generation_tokens=c["generation_tokens"],
            peak_kv_pages_used=ms.peak_used_blocks, num_steps=c["num_steps"],
            forward_seconds=self._timers["forward"],
            prefill_step_seconds=self._timers["prefill_steps"],
            decode_step_seconds=self._timers["decode_steps"], **self._store_stats())

    def _store_stats(self):
        """EngineStats' ``kv_store_*`` fields (zeros without a store)."""
        if self.kv_store is None:
            return {}
        c = self.kv_store.snapshot()
        ps = self.manager.block_size()
        return dict(kv_store_pages_hit=c.hit, kv_store_pages_missed=c.missed,
                    kv_store_pages_loaded=c.loaded, kv_store_pages_stored=c.stored,
                    kv_store_tokens_hit=c.hit * ps, kv_store_tokens_missed=c.missed * ps,
                    kv_store_tokens_loaded=c.loaded * ps, kv_store_tokens_stored=c.stored * ps,
                    kv_store_pages_dropped=c.dropped, kv_store_values_rejected=c.rejected,
                    kv_store_errors=c.errors, kv_store_bytes_in=c.bytes_in,
                    kv_store_bytes_out=c.bytes_out, kv_store_lookups=c.lookups,
                    kv_store_load_seconds=c.load_seconds)

    def close(self):
        """Send the KV store's queued pages (up to a second) and stop its threads; the
        engine keeps working without the store. Nothing to do without one."""
        if self.kv_store is not None:
            self.kv_store.close()


def _open_kv_store(url, model, manager):
    """``(KVStore, StoreLookups)`` for ``url`` over ``manager``'s pool, keyed by
    ``model``'s fingerprint; its writes hooked to the prefix cache."""
    from pagedcy.engine.store_lookups import StoreLookups, attach_writes
    from pagedcy.kvcache.kvstore import KVStore
    from pagedcy.kvcache.kvstore_format import PageCodec, model_fingerprint
    if not manager.prefix_cache_enabled:
        raise ValueError("kv_store needs enable_prefix_cache=True (pages are keyed by their "
                         "prefix hashes)")
    # the kernels' instruction set fixes their summation order, so the K/V's last bits:
    # pages are shared only between engines that would compute the same ones
    from pagedcy._libs._threads import simd_path
    store = KVStore(url, PageCodec(manager.config,
                                   model_fingerprint(model, {"simd": simd_path()})))
    attach_writes(manager, store)
    return store, StoreLookups(store, manager)


def _context_length(max_model_len, max_position_embeddings, pool_tokens):
    """The engine's max_model_len: as asked (checked against the model and the pool), or
    the smaller of the two, so a request without max_tokens fits the pool (vLLM refuses
    to start instead; a small pool here just means shorter sequences)."""
    limit = min(int(max_position_embeddings), int(pool_tokens))
    if max_model_len is None:
        return limit
    v = int(max_model_len)
    if v > max_position_embeddings:
        raise ValueError(f"max_model_len {v} exceeds the model's max_position_embeddings "
                         f"({max_position_embeddings})")
    if v > pool_tokens:
        raise ValueError(f"max_model_len {v} exceeds the {pool_tokens} tokens of the KV pool "
                         f"(kv_cache_pages * page_size): raise kv_cache_pages or lower "
                         f"max_model_len")
    return v


def _check_options(*, kv_cache_pages=None, page_size=16, kv_dtype="float32", max_num_seqs=256,
                   max_num_batched_tokens=2048, enable_prefix_cache=True, seed=0,
                   preemption_mode="recompute", swap_pages=0, max_model_len=None,
                   kv_store=None):
    if kv_store is not None:
        if not isinstance(kv_store, str):
            raise TypeError(f"kv_store must be a URL string, got {type(kv_store).__name__}")
        if not kv_store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"kv_store must be a redis://, rediss:// or unix:// URL, got "
                             f"{kv_store.split(':', 1)[0]!r}")
        if not enable_prefix_cache:
            raise ValueError("kv_store needs enable_prefix_cache=True")
    if kv_cache_pages is not None:
        _validate.check_positive(kv_cache_pages, "kv_cache_pages")
    _validate.check_positive(page_size, "page_size")
    if max_model_len is not None:
        _validate.check_positive(max_model_len, "max_model_len")
    _validate.check_positive(max_num_seqs, "max_num_seqs")
    _validate.check_positive(max_num_batched_tokens, "max_num_batched_tokens")
    _validate.check_count(swap_pages, "swap_pages")
    _validate.check_count(seed, "seed")
    if not isinstance(kv_dtype, str):
        raise TypeError(f"kv_dtype must be a str, got {type(kv_dtype).__name__}")
    if not isinstance(enable_prefix_cache, (bool, np.bool_)):
        raise TypeError("enable_prefix_cache must be a bool")
    if preemption_mode not in _PREEMPTION_MODES:
        raise ValueError(f"preemption_mode must be one of {_PREEMPTION_MODES}, "
                         f"got {preemption_mode!r}")
