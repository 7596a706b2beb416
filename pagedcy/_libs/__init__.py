"""pagedcy's compiled core: Cython extensions over raw buffers, GIL-free inner loops.

- ``_pool``: the page buffer (LIFO free list, reference counts); ``_table``: one sequence's
  page map; ``_store``: nogil K/V row copies into pages; ``_cache``: the single-sequence cache.
- ``_attention``: batched paged attention (AVX-512 / AVX2 / scalar, chosen at run time).
- ``_manager_ops``: the batched row writes and block tables of the multi-sequence manager.
- ``_threads``, ``_bandwidth``: OpenMP thread counts and the read-bandwidth yardstick.
- ``src/``: the C kernels the extensions include.
"""
