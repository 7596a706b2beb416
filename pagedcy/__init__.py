"""pagedcy: run Hugging Face LLMs on the CPU with a paged KV cache and fast paged attention.

- :class:`LLM`, :class:`LLMEngine`, :class:`SamplingParams`, :class:`RequestOutput`,
  :class:`CompletionOutput`: the continuous-batching engine with vLLM's API (imported lazily:
  ``import pagedcy`` itself needs only NumPy). ``python -m pagedcy serve`` is the OpenAI server.

Under it, Cython extension types over one page layout::

    pages[max_pages, num_layers, 2 (K, V), page_size, num_kv_heads, head_dim]

- :class:`PagedKVCacheConfig`, :class:`EvictionPolicy`: cache geometry and policy.
- :class:`PagePool`: the page buffer with a LIFO free list and reference counts.
- :class:`PageTable`: one sequence's logical → physical page map.
- :class:`PagedKVCache`: a single-sequence cache (optionally a sliding window).
- :func:`batch_paged_attention`, :func:`merge_states`: attention read through block tables;
  :class:`AttentionBatch`: a batch's layout checked once, run layer by layer.
- :class:`PagedKVCacheManager`, :func:`paged_attention`, :class:`PagedAttentionExecutor`:
  many sequences with prefix caching, copy-on-write fork and swap; :class:`StepSlots`:
  one engine step's K/V slots (``manager.prepare_step`` / ``commit_step``).
"""
from pagedcy._version import __version__
from pagedcy.config import EvictionPolicy, PagedKVCacheConfig
from pagedcy.errors import PoolExhaustedError
from pagedcy._libs._pool import PagePool
from pagedcy._libs._table import PageTable
from pagedcy._libs._store import KVPageStore
from pagedcy._libs._cache import PagedKVCache
from pagedcy._libs._threads import openmp_enabled, resolve_num_threads
from pagedcy.tools.info import show_config

__all__ = [
    "__version__", "EvictionPolicy", "PagedKVCacheConfig", "PoolExhaustedError",
    "PagePool", "PageTable", "KVPageStore", "PagedKVCache",
    "openmp_enabled", "resolve_num_threads", "show_config",
]

try:  # the attention kernel and the manager build on the core
    from pagedcy._libs._attention import (AttentionBatch, batch_paged_attention,  # noqa: F401
                                          merge_states)
    __all__ += ["AttentionBatch", "batch_paged_attention", "merge_states"]
except ImportError:  # pragma: no cover - present in every complete build
    pass

try:  # the multi-sequence layer needs the attention kernel for attention, not to import
    from pagedcy.kvcache.manager import (AllocationRequest, CacheStats, MemoryPressure,  # noqa: F401
                                         PagedKVCacheHandle, PagedKVCacheManager, StepSlots,
                                         paged_attention)
    from pagedcy.kvcache.executor import (DecodeOutput, PagedAttentionExecutor,  # noqa: F401
                                          PagedExecutorConfig, PrefillOutput)
    __all__ += ["AllocationRequest", "CacheStats", "MemoryPressure", "PagedKVCacheHandle",
                "PagedKVCacheManager", "StepSlots", "paged_attention", "DecodeOutput",
                "PagedAttentionExecutor", "PagedExecutorConfig", "PrefillOutput"]
except ImportError:  # pragma: no cover - _manager_ops missing from a partial build
    pass

# The LLM engine is loaded on first use (``pagedcy.LLM``): ``import pagedcy`` stays
# NumPy-only, and the engine itself imports tokenizers/safetensors only when it loads a
# checkpoint.
_ENGINE_NAMES = ("LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput",
                 "EngineStats")
__all__ += list(_ENGINE_NAMES)


def __getattr__(name):
    if name in _ENGINE_NAMES:
        import pagedcy.engine as _engine
        value = getattr(_engine, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pagedcy' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_ENGINE_NAMES))
