"""How many KV pages an engine gets when ``kv_cache_pages`` is not given."""
import os

__all__ = ["default_num_pages", "DEFAULT_CONTEXT", "MAX_POOL_BYTES"]

#: Context each of ``max_num_seqs`` sequences is sized for (or the model's, if shorter).
DEFAULT_CONTEXT = 2048
#: Upper bound of the default pool, before the RAM cap.
MAX_POOL_BYTES = 8 << 30


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 8 << 30


def default_num_pages(bytes_per_page, page_size, max_num_seqs, max_position_embeddings):
    """Pages for ``max_num_seqs`` sequences of ``min(max_position_embeddings, 2048)``
    tokens each, capped at a memory budget of a quarter of physical RAM (at most 8 GiB),
    but never fewer than one full-context sequence needs (``max_position_embeddings``
    tokens) plus one page, unless that is over half the RAM (the engine's max_model_len
    then shrinks to the pool). Pools are zeroed lazily, so pages never written cost no RAM.
    """
    context = min(max_position_embeddings, DEFAULT_CONTEXT)
    want = max_num_seqs * -(-context // page_size)
    budget = min(_physical_memory() // 4, MAX_POOL_BYTES)
    cap = max(1, budget // bytes_per_page)
    floor = min(-(-max_position_embeddings // page_size) + 1,
                max(1, _physical_memory() // 2 // bytes_per_page))
    return int(min(2**31 - 1, max(min(want, cap), floor)))
