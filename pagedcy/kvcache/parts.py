"""The parts one :class:`~pagedcy.kvcache.manager.PagedKVCacheManager` is made of."""
import threading
from dataclasses import dataclass
from typing import Any, Optional

from pagedcy.config import PagedKVCacheConfig
from pagedcy.kvcache.allocator import BlockAllocator
from pagedcy.kvcache.handle import HandleTable
from pagedcy.kvcache.prefix import PrefixCache
from pagedcy.kvcache.stats import Counters
from pagedcy.kvcache.swap import SwapSpace

__all__ = ["ManagerParts"]


@dataclass(frozen=True)
class ManagerParts:
    """One manager's parts, handed to the objects that coordinate them (its lifecycle
    and its K/V data path). Each part owns its own state; this only bundles references.

    manager: the owning manager (what handles report to); config; store: the primary
    :class:`~pagedcy.KVPageStore`; lock: the manager's ``threading.RLock``; counters,
    prefix, allocator, swap (None without swap space), handles.
    """

    manager: Any
    config: PagedKVCacheConfig
    store: Any
    lock: Any
    counters: Counters
    prefix: PrefixCache
    allocator: BlockAllocator
    swap: Optional[SwapSpace]
    handles: HandleTable

    @classmethod
    def build(cls, manager, config, store, *, enable_prefix_cache, swap_pages, swap_path):
        """A fresh set of parts for ``manager`` over ``store``."""
        counters = Counters()
        prefix = PrefixCache(config.page_size, config.max_pages, enable_prefix_cache, counters)
        return cls(manager=manager, config=config, store=store, lock=threading.RLock(),
                   counters=counters, prefix=prefix,
                   allocator=BlockAllocator(store.pool, prefix, counters),
                   swap=SwapSpace(config, swap_pages, swap_path, counters) if swap_pages else None,
                   handles=HandleTable(manager))
