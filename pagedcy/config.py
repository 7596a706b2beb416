"""Cache configuration: the page geometry (``PagedKVCacheConfig``) and what a full pool does
(``EvictionPolicy``), as in the reference design."""
import enum

from pagedcy import _validate, dtypes as _dtypes

__all__ = ["EvictionPolicy", "PagedKVCacheConfig"]


class EvictionPolicy(enum.Enum):
    """What a cache does when it needs a page and none is free.

    NONE: raise :class:`pagedcy.PoolExhaustedError` (fail fast).
    LRU: drop the oldest page of the sequence (a sliding window over the tokens).
    """

    NONE = "none"
    LRU = "lru"


def _positive_int(name, value):
    return _validate.check_positive(value, name, 2**31)


class PagedKVCacheConfig:
    """Geometry of a paged KV cache.

    A page holds ``page_size`` tokens of K and V for every layer, laid out as
    ``[num_layers, 2 (K, V), page_size, num_kv_heads, head_dim]`` values of
    ``dtype`` (float32, float16 or bfloat16). The pool holds ``max_pages`` pages.

    Raises TypeError (naming the field) if a size is not an integer, ValueError if it
    is not in ``[1, 2**31)``, TypeError for an unsupported dtype or eviction policy.
    """

    __slots__ = ("page_size", "max_pages", "num_layers", "num_kv_heads", "head_dim",
                 "eviction", "dtype")

    def __init__(self, page_size, max_pages, num_layers, num_kv_heads, head_dim,
                 eviction=EvictionPolicy.NONE, dtype="float32"):
        object.__setattr__(self, "page_size", _positive_int("page_size", page_size))
        object.__setattr__(self, "max_pages", _positive_int("max_pages", max_pages))
        object.__setattr__(self, "num_layers", _positive_int("num_layers", num_layers))
        object.__setattr__(self, "num_kv_heads", _positive_int("num_kv_heads", num_kv_heads))
        object.__setattr__(self, "head_dim", _positive_int("head_dim", head_dim))
        if isinstance(eviction, str):
            try:
                eviction = EvictionPolicy(eviction.lower())
            except ValueError:
                raise TypeError(f"eviction must be an EvictionPolicy, got {eviction!r}") from None
        if not isinstance(eviction, EvictionPolicy):
            raise TypeError(f"eviction must be an EvictionPolicy, got {eviction!r}")
        object.__setattr__(self, "eviction", eviction)
        object.__setattr__(self, "dtype", _dtypes.normalize_dtype(dtype))
        if self.floats_per_page() >= 2**40 or self.total_bytes() >= 2**46:
            raise ValueError(f"pool of {self.total_bytes()} bytes is too large")

    def __setattr__(self, name, value):
        raise AttributeError("PagedKVCacheConfig is immutable; build a new one")

    def __eq__(self, other):
        if not isinstance(other, PagedKVCacheConfig):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __hash__(self):
        return hash(tuple(getattr(self, s) for s in self.__slots__))

    def __repr__(self):
        fields = ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__)
        return f"PagedKVCacheConfig({fields})"

    def __reduce__(self):
        return (PagedKVCacheConfig, tuple(getattr(self, s) for s in self.__slots__))

    def kv_dim(self):
        """Values per token per layer for K (or V): ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    def floats_per_page(self):
        """Stored elements per page: ``num_layers * 2 * page_size * num_kv_heads * row``, row =
        ``head_dim`` (int8: ``head_dim + 4``, the row's scale)."""
        return (self.num_layers * 2 * self.page_size * self.num_kv_heads
                * _dtypes.head_row_elems(self.dtype, self.head_dim))

    def itemsize(self):
        """Bytes per stored value (4 for float32, 2 for float16/bfloat16)."""
        return _dtypes.itemsize(self.dtype)

    def bytes_per_page(self):
        """Bytes of one page in the storage dtype."""
        return self.floats_per_page() * self.itemsize()

    def total_bytes(self):
        """Bytes of the whole pool: ``max_pages * bytes_per_page()``."""
        return self.max_pages * self.bytes_per_page()

    def max_tokens(self):
        """Token capacity of the pool: ``max_pages * page_size``."""
        return self.max_pages * self.page_size

    def storage_dtype(self):
        """NumPy dtype of page arrays (bfloat16: ml_dtypes.bfloat16 if installed, else uint16)."""
        return _dtypes.storage_dtype(self.dtype)
