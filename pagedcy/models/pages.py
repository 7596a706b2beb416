"""A KVPageStore over a caller's page array, so the model can use the core's nogil writers."""
from __future__ import annotations

import numpy as np

from pagedcy import dtypes as _dtypes
from pagedcy.config import PagedKVCacheConfig
from pagedcy._libs._store import KVPageStore

__all__ = ["PagesAdapter"]


class PagesAdapter:
    """Wraps a ``pages()`` array (``[max_pages, num_layers, 2, page_size, num_kv_heads,
    head_dim]`` float32/float16/bfloat16, or ``head_dim + 4`` int8 with each row's scale: a
    store's head-major view, or a C-order array) in a
    :class:`KVPageStore` sharing its memory, rebuilt only when a different array comes in."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int):
        self.geometry = (num_layers, 2, num_kv_heads, head_dim)
        self._key: tuple | None = None
        self._store: KVPageStore | None = None
        self._pages: np.ndarray | None = None

    def store_for(self, kv_pages) -> KVPageStore:
        """The store viewing ``kv_pages``. TypeError/ValueError for a wrong array."""
        if not isinstance(kv_pages, np.ndarray):
            raise TypeError(f"kv_pages must be a numpy array, got {type(kv_pages).__name__}")
        # the dtype itself, not its .name (Python code in NumPy, most of this call's time)
        key = (kv_pages.__array_interface__["data"][0], kv_pages.shape, kv_pages.strides,
               kv_pages.dtype)
        if key == self._key and self._store is not None:
            return self._store
        L, two, hk, d = self.geometry
        s = kv_pages.shape
        dt = "bfloat16" if kv_pages.dtype == np.uint16 else kv_pages.dtype.name
        try:
            dt = _dtypes.normalize_dtype(dt)
        except (TypeError, ValueError):
            raise TypeError(f"kv_pages dtype {kv_pages.dtype} is not a KV storage dtype") from None
        row = _dtypes.head_row_elems(dt, d)        # int8 rows carry their scale
        if kv_pages.ndim != 6 or (s[1], s[2], s[4], s[5]) != (L, two, hk, row):
            raise ValueError(f"kv_pages must have shape [max_pages, {L}, 2, page_size, {hk}, {row}] "
                             f"for this model and {dt} K/V, got {list(s)}")
        if not kv_pages.flags.writeable:
            raise ValueError("kv_pages must be writable")
        head_major = kv_pages.transpose(0, 1, 4, 2, 3, 5)
        if kv_pages.flags.c_contiguous:
            buffer, layout = kv_pages, "NHD"
        elif head_major.flags.c_contiguous:
            buffer, layout = head_major, "HND"
        else:
            raise ValueError("kv_pages must be a store's pages() view or a C-contiguous array")
        cfg = PagedKVCacheConfig(page_size=s[3], max_pages=s[0], num_layers=L, num_kv_heads=hk,
                                 head_dim=d, dtype=dt)
        store = KVPageStore(cfg, buffer=buffer, layout=layout)
        self._store, self._pages, self._key = store, kv_pages, key  # _pages keeps the memory alive
        return store
