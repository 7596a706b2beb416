from typing_extensions import disjoint_base
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

from pagedcy._libs._pool import PagePool
from pagedcy.config import PagedKVCacheConfig

@disjoint_base
class KVPageStore:
    """The page pool plus the KV page layout; every K/V byte moves through here."""
    config: PagedKVCacheConfig
    pool: PagePool
    num_layers: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    kv_dim: int
    row_elems: int
    layout: str
    def __init__(self, config: PagedKVCacheConfig, buffer: Any = ..., *, layout: str = ...) -> None: ...
    def pages(self) -> npt.NDArray[Any]: ...
    def write(self, block_table: npt.ArrayLike, layer: int, start: int,
              keys: npt.ArrayLike, values: npt.ArrayLike) -> None: ...
    def read(self, block_table: npt.ArrayLike, layer: int, which: Union[int, str], start: int, n: int,
             out: Optional[npt.NDArray[Any]] = ..., float32: bool = ...) -> npt.NDArray[Any]: ...
    def copy_pages_from(self, src: KVPageStore, src_pages: npt.ArrayLike,
                        dst_pages: npt.ArrayLike) -> None: ...
