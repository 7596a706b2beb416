"""A deterministic, weightless model executor over the paged KV cache, for tests and
benchmarks of the serving path (prefill, batched decode, prefix caching, fork, swap).

There are no weights: a token's embedding is ``e[i] = sin((token + 1) * (i + 1))`` for
``i < num_kv_heads * head_dim``, Q = K = V = embedding (the query repeats each KV head's
slice for the ``num_heads // num_kv_heads`` query heads sharing it), K/V go to every
layer, attention runs over the last layer and logits fold the attention output with
``logits[i % vocab_size] += out[i]``. Every row of a batch is its own sequence, and a
decode step of many rows is one batched kernel call.

Result records: every value this module returns that bundles several fields (the
outputs of ``prefill``/``decode`` and the ``status()``, ``info()`` and
``capabilities()`` reports) is a frozen dataclass with a docstring; nested groups are
dataclasses too, and ``dataclasses.asdict`` turns any of them into plain dicts (for JSON).
"""
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from pagedcy import _validate
from pagedcy.errors import PoolExhaustedError
from pagedcy.kvcache.manager import AllocationRequest, PagedKVCacheHandle, PagedKVCacheManager

__all__ = ["PagedExecutorConfig", "PagedAttentionExecutor", "PrefillOutput", "DecodeOutput",
           "ExecutorStatus", "MemoryUsage", "ModelInfo", "ExecutorCapabilities",
           "MemoryRequirements", "token_embeddings"]


@dataclass(frozen=True)
class PagedExecutorConfig:
    """Model shape of the executor (small defaults: a 256-token vocabulary, 2 layers,
    4 heads of 8 dims).

    num_heads must be a multiple of num_kv_heads (GQA); all sizes are positive integers
    (ValueError for a size < 1, TypeError for a bool, float or other non-integer).
    """

    vocab_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 8
    max_sequence_length: int = 512

    def __post_init__(self):
        for f in ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "max_sequence_length"):
            _validate.check_positive(getattr(self, f), f)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}")


@dataclass(frozen=True)
class PrefillOutput:
    """Result of :meth:`PagedAttentionExecutor.prefill`.

    logits: float32 ``[batch, seq, vocab_size]``; kv_cache: the handle (batch 1 with a
    single handle given, or allocated here) or the list of handles, one per row.
    """

    logits: np.ndarray
    kv_cache: object


@dataclass(frozen=True)
class DecodeOutput:
    """Result of :meth:`PagedAttentionExecutor.decode`.

    logits: float32 ``[batch, vocab_size]``; kv_cache: as passed in.
    """

    logits: np.ndarray
    kv_cache: object


@dataclass(frozen=True)
class MemoryUsage:
    """KV-cache memory in bytes of the storage dtype: allocated_bytes (the whole pool),
    used_bytes (pages held by sequences), peak_bytes, utilization_percent (used/allocated)."""

    allocated_bytes: int
    used_bytes: int
    peak_bytes: int
    utilization_percent: float


@dataclass(frozen=True)
class ExecutorStatus:
    """Result of :meth:`PagedAttentionExecutor.status`.

    state ("ready"), is_ready, current_batch_size (rows of the last call),
    prefill_operations / decode_operations (calls so far), avg_prefill_time_ms /
    avg_decode_time_ms (0.0 before the first call), memory_usage (:class:`MemoryUsage`),
    last_operation ("prefill", "decode" or None).
    """

    state: str
    is_ready: bool
    current_batch_size: int
    prefill_operations: int
    decode_operations: int
    avg_prefill_time_ms: float
    avg_decode_time_ms: float
    memory_usage: MemoryUsage
    last_operation: Optional[str]


@dataclass(frozen=True)
class ModelInfo:
    """Result of :meth:`PagedAttentionExecutor.info`: what the executor computes.

    model_id, model_type, num_parameters (0: no weights), hidden_size (num_heads *
    head_dim), num_layers, num_heads, num_kv_heads, vocab_size, max_sequence_length,
    dtype (of the computation), kv_cache_dtype (of the pages), device, version.
    """

    model_id: str
    model_type: str
    num_parameters: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_sequence_length: int
    dtype: str
    kv_cache_dtype: str
    device: str
    version: str


@dataclass(frozen=True)
class MemoryRequirements:
    """Bytes the executor needs: parameter_memory, activation_memory_per_token,
    kv_cache_memory_per_token (K and V of every layer in the cache's storage dtype),
    overhead_memory."""

    parameter_memory: int
    activation_memory_per_token: int
    kv_cache_memory_per_token: int
    overhead_memory: int


@dataclass(frozen=True)
class ExecutorCapabilities:
    """Result of :meth:`PagedAttentionExecutor.capabilities`: batch and length limits,
    the attention mechanisms, batching and parallelism features, prefix caching (as the
    manager was made), dtypes, devices and :class:`MemoryRequirements`."""

    max_batch_size: int
    max_sequence_length: int
    attention_mechanisms: tuple
    supports_dynamic_batching: bool
    supports_continuous_batching: bool
    supports_speculative_decoding: bool
    supports_tensor_parallelism: bool
    supports_pipeline_parallelism: bool
    supports_prefix_caching: bool
    supported_dtypes: tuple
    supported_devices: tuple
    memory_requirements: MemoryRequirements


def token_embeddings(tokens, kv_dim):
    """float32 ``[n, kv_dim]`` embeddings ``sin((t + 1) * (i + 1))`` of integer ``tokens``.

    The product ``(t + 1) * (i + 1)`` is rounded to float32; the sine is taken in float64
    and rounded once to float32, which is the correctly rounded float32 sine except in
    rare double-rounding ties -- closer to C's ``sinf`` (< 1 ulp) than NumPy's float32
    SIMD sine, whose error is a few ulp.
    """
    t = _validate.token_id_array(tokens, "tokens").reshape(-1).astype(np.float32) + np.float32(1.0)
    i = np.arange(1, kv_dim + 1, dtype=np.float32)
    prod = t[:, None] * i[None, :]                       # rounded to float32 on purpose
    return np.sin(prod.astype(np.float64)).astype(np.float32)


class PagedAttentionExecutor:
    """Runs prefill and decode of the identity-projection model on a manager's cache.

    PagedAttentionExecutor(config, manager)

    The manager's cache geometry must match (num_layers, num_kv_heads, head_dim; else
    ValueError). ``max_batch_size`` (default 64) is only reported by ``capabilities()``.
    ``num_threads`` goes to the attention kernel (None: PAGEDCY_NUM_THREADS or OpenMP's
    default).
    """

    def __init__(self, config, manager, *, max_batch_size=64, num_threads=None):
        if not isinstance(config, PagedExecutorConfig):
            raise TypeError("config must be a PagedExecutorConfig")
        if not isinstance(manager, PagedKVCacheManager):
            raise TypeError("manager must be a PagedKVCacheManager")
        mc = manager.config
        if (mc.num_layers, mc.num_kv_heads, mc.head_dim) != (
                config.num_layers, config.num_kv_heads, config.head_dim):
            raise ValueError(
                f"cache geometry (layers {mc.num_layers}, kv_heads {mc.num_kv_heads}, head_dim "
                f"{mc.head_dim}) does not match the executor's ({config.num_layers}, "
                f"{config.num_kv_heads}, {config.head_dim})")
        self.config = config
        self.manager = manager
        self.max_batch_size = int(max_batch_size)
        self.num_threads = num_threads
        self._kv_dim = config.num_kv_heads * config.head_dim
        self._rep = config.num_heads // config.num_kv_heads
        self._prefill_ops = self._decode_ops = 0
        self._prefill_time = self._decode_time = 0.0
        self._batch = 0
        self._last = None
        self._info = ModelInfo(
            model_id="paged-test-model", model_type="paged-test", num_parameters=0,
            hidden_size=config.num_heads * config.head_dim, num_layers=config.num_layers,
            num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
            vocab_size=config.vocab_size, max_sequence_length=config.max_sequence_length,
            dtype="float32", kv_cache_dtype=mc.dtype, device="cpu", version="test-1.0")

    # -- pieces -------------------------------------------------------------------------
    def embed(self, tokens):
        """float32 ``[n, num_kv_heads*head_dim]`` embeddings of ``tokens`` (also K and V)."""
        return token_embeddings(tokens, self._kv_dim)

    def _query(self, emb):
        c = self.config
        q = emb.reshape(-1, c.num_kv_heads, 1, c.head_dim)
        # Each KV head's slice repeated for the query heads that share it (GQA).
        return np.ascontiguousarray(np.broadcast_to(
            q, (q.shape[0], c.num_kv_heads, self._rep, c.head_dim))).reshape(
                q.shape[0], c.num_heads, c.head_dim)

    def logits(self, attn_out):
        """Fold attention outputs ``[n, num_heads, head_dim]`` into float32 ``[n, vocab]``
        with ``logits[i % vocab] += out[i]`` (summed in float64, rounded once)."""
        V = self.config.vocab_size
        a = np.asarray(attn_out).reshape(attn_out.shape[0], -1)
        n, w = a.shape
        full, rest = divmod(w, V)
        if full == 0:                     # every bucket gets at most one value: no sums
            out = np.zeros((n, V), dtype=np.float32)
            out[:, :w] = a
            return out
        out = np.zeros((n, V), dtype=np.float64)
        if full:
            out += a[:, :full * V].reshape(n, full, V).sum(axis=1, dtype=np.float64)
        if rest:
            # No zero padding: with a vocab larger than the output most buckets get nothing.
            out[:, :rest] += a[:, full * V:]
        return out.astype(np.float32)

    @staticmethod
    def _ids(input_ids, name):
        ids = _validate.token_id_array(input_ids, name).astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= 2**32):
            raise ValueError(f"{name} must be token ids in [0, 2**32)")
        return ids

    def _handles(self, kv_cache, batch):
        if isinstance(kv_cache, PagedKVCacheHandle):
            kv_cache = [kv_cache]
        hs = list(kv_cache)
        if len(hs) != batch:
            raise ValueError(f"{len(hs)} kv_cache handles for a batch of {batch}")
        if any(not isinstance(h, PagedKVCacheHandle) for h in hs):
            raise TypeError("kv_cache must hold PagedKVCacheHandle objects")
        if len({id(h) for h in hs}) != batch:
            raise ValueError("the same handle appears twice in one batch")
        return hs

    # -- the ModelExecutor interface --------------------------------------------------------
    def prefill(self, input_ids, kv_cache=None):
        """Process prompts: ``input_ids`` int ``[batch, seq]`` (or ``[seq]``).

        kv_cache: None (allocate one handle per row, with the prompt for prefix caching),
        a handle (batch 1) or a list of handles, one per row. A given handle is grown to
        ``seq`` tokens if it holds fewer. Only positions from ``handle.num_cached_tokens()``
        on are computed and written; attention still covers the whole prompt. Returns
        :class:`PrefillOutput` with logits ``[batch, seq, vocab]``.
        Raises ValueError (empty/oversized prompt, a handle holding more than ``seq``
        tokens, cached prefix not matching the ids), TypeError, PoolExhaustedError (handles
        allocated by this call are released again).
        """
        t0 = time.perf_counter()
        ids = self._ids(input_ids, "input_ids")
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise ValueError(f"input_ids must be [batch, seq] with seq >= 1, got {ids.shape}")
        B, S = ids.shape
        c = self.config
        if S > c.max_sequence_length:
            raise ValueError(f"prompt of {S} tokens exceeds max_sequence_length "
                             f"{c.max_sequence_length}")
        m = self.manager
        single = isinstance(kv_cache, PagedKVCacheHandle)
        created = []
        if kv_cache is None:
            try:
                for b in range(B):
                    created.append(m.allocate(AllocationRequest(
                        initial_tokens=S, max_sequence_length=c.max_sequence_length,
                        prompt_tokens=ids[b])))
            except BaseException:
                for h in created:
                    m.deallocate(h)
                raise
            hs = created
        else:
            hs = self._handles(kv_cache, B)
        for b, h in enumerate(hs):
            if h.num_tokens() > S:
                raise ValueError(f"handle {h.request_id!r} already holds {h.num_tokens()} "
                                 f"tokens, more than the {S}-token prompt")
            cached = h.num_cached_tokens()
            prompt = h.prompt_tokens()
            if cached and (prompt is None or len(prompt) < cached
                           or not np.array_equal(prompt[:cached], ids[b, :cached])):
                raise ValueError(f"the cached prefix of {h.request_id!r} does not match input_ids")
        for h in hs:
            if h.num_tokens() < S:
                m.extend(h, S - h.num_tokens())
        emb = self.embed(ids)                                 # [B*S, kv_dim]
        embs = emb.reshape(B, S, -1)
        for b, h in enumerate(hs):
            start = h.num_cached_tokens()
            rows = embs[b, start:]
            for layer in range(c.num_layers):
                m.write_kv_tokens(h, layer, start, rows, rows)
        out = m.attention(c.num_layers - 1, self._query(emb), hs, q_lens=[S] * B, causal=True,
                          num_threads=self.num_threads)
        logits = self.logits(out).reshape(B, S, c.vocab_size)
        self._prefill_ops += 1
        self._batch = B
        self._prefill_time += time.perf_counter() - t0
        self._last = "prefill"
        return PrefillOutput(logits, hs[0] if (single or (kv_cache is None and B == 1)) else hs)

    def decode(self, input_ids, kv_cache):
        """One decode step for every row: ``input_ids`` int ``[batch]`` or ``[batch, 1]``,
        ``kv_cache`` a handle (batch 1) or a list of handles, one per row.

        Each row's token is written at position ``num_tokens()`` of its handle (a new
        block is allocated where the last one is full), then one batched kernel call
        attends every row over its ``position + 1`` tokens. Returns :class:`DecodeOutput`
        with logits ``[batch, vocab]``. ValueError past ``max_sequence_length``,
        PoolExhaustedError when blocks run out (checked before anything is written; token
        counts stay unchanged).
        """
        t0 = time.perf_counter()
        ids = self._ids(input_ids, "input_ids")
        if ids.ndim == 2 and ids.shape[1] == 1:
            ids = ids[:, 0]
        if ids.ndim == 0:
            ids = ids[None]
        if ids.ndim != 1 or ids.shape[0] == 0:
            raise ValueError(f"input_ids must be [batch] or [batch, 1], got {np.shape(input_ids)}")
        B = ids.shape[0]
        hs = self._handles(kv_cache, B)
        c = self.config
        m = self.manager
        ps = m.block_size()
        pos = np.fromiter((h.num_tokens() for h in hs), np.int64, B)
        if pos.max() + 1 > c.max_sequence_length:
            raise ValueError(f"decode would exceed max_sequence_length {c.max_sequence_length}")
        need = [(h, -(-(p + 1) // ps) - h.num_blocks()) for h, p in zip(hs, pos.tolist())]
        need = [(h, n) for h, n in need if n > 0]
        if sum(n for _, n in need) > m.free_blocks():
            raise PoolExhaustedError(f"decode needs {sum(n for _, n in need)} new blocks, "
                                     f"{m.free_blocks()} free")
        for h, n in need:
            m.allocate_blocks(h, n)
        emb = self.embed(ids)
        for layer in range(c.num_layers):
            m.write_kv_batch(hs, layer, pos, emb, emb)
        for h, p in zip(hs, pos.tolist()):
            h.set_num_tokens(p + 1)
        out = m.attention(c.num_layers - 1, self._query(emb), hs, causal=True,
                          num_threads=self.num_threads)
        logits = self.logits(out)
        self._decode_ops += 1
        self._batch = B
        self._decode_time += time.perf_counter() - t0
        self._last = "decode"
        return DecodeOutput(logits, kv_cache)

    # -- reporting -------------------------------------------------------------------
    def prefill_count(self):
        """Prefill calls so far."""
        return self._prefill_ops

    def decode_count(self):
        """Decode calls so far."""
        return self._decode_ops

    def info(self):
        """What the executor computes: :class:`ModelInfo`."""
        return self._info

    def capabilities(self):
        """What this executor supports: :class:`ExecutorCapabilities`;
        ``kv_cache_memory_per_token`` is in the cache's real storage bytes."""
        c = self.config
        mc = self.manager.config
        return ExecutorCapabilities(
            max_batch_size=self.max_batch_size,
            max_sequence_length=c.max_sequence_length,
            attention_mechanisms=("paged",),
            supports_dynamic_batching=True,
            supports_continuous_batching=True,
            supports_speculative_decoding=False,
            supports_tensor_parallelism=False,
            supports_pipeline_parallelism=False,
            supports_prefix_caching=self.manager.prefix_cache_enabled,
            supported_dtypes=("float32",),
            supported_devices=("cpu",),
            memory_requirements=MemoryRequirements(
                parameter_memory=0, activation_memory_per_token=0,
                kv_cache_memory_per_token=c.num_kv_heads * c.head_dim * 2 * c.num_layers
                * mc.itemsize(),
                overhead_memory=0),
        )

    def status(self):
        """Counters and memory now: :class:`ExecutorStatus`."""
        m = self.manager
        total = m.total_memory_bytes()
        used = m.used_memory_bytes()
        return ExecutorStatus(
            state="ready", is_ready=True,
            current_batch_size=self._batch,
            prefill_operations=self._prefill_ops,
            decode_operations=self._decode_ops,
            avg_prefill_time_ms=1e3 * self._prefill_time / self._prefill_ops
            if self._prefill_ops else 0.0,
            avg_decode_time_ms=1e3 * self._decode_time / self._decode_ops
            if self._decode_ops else 0.0,
            memory_usage=MemoryUsage(allocated_bytes=total, used_bytes=used,
                                     peak_bytes=m.peak_memory_bytes(),
                                     utilization_percent=100.0 * used / total),
            last_operation=self._last,
        )
