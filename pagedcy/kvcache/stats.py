"""A manager's counters (:class:`Counters`) and their snapshot (:class:`CacheStats`)."""
from dataclasses import dataclass

__all__ = ["CacheStats", "Counters"]


@dataclass(slots=True)
class Counters:
    """Running totals of one manager, shared by its parts (each bumps its own fields).

    allocations, deallocations, forks: handle lifecycle; failures: allocations, extensions,
    copies and swap-outs refused for lack of pages; evictions: cached pages dropped to make
    room; prefix_queries / prefix_hits: prompt tokens looked up / served from the prefix
    cache; cow_copies: pages copied before a write (copy-on-write); swap_outs / swap_ins.
    """

    allocations: int = 0
    deallocations: int = 0
    forks: int = 0
    failures: int = 0
    evictions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    cow_copies: int = 0
    swap_outs: int = 0
    swap_ins: int = 0


class CacheStats(dict):
    """Snapshot of a manager's counters; a dict that also allows attribute access.

    Keys: total_blocks, free_blocks (truly free + evictable), used_blocks (held by handles),
    cached_blocks (evictable prefix pages), peak_used_blocks, num_handles, num_swapped,
    allocations, deallocations, failures (allocations/extensions refused for lack of pages),
    evictions (cached pages dropped to make room), prefix_queries / prefix_hits (in tokens:
    prompt tokens looked up / served from cache), prefix_hit_rate, cow_copies, forks,
    swap_outs, swap_ins, swap_total_blocks, swap_used_blocks, block_size, bytes_per_block,
    total_bytes, used_bytes, peak_bytes (real bytes of the storage dtype), utilization
    (used/total), pressure (MemoryPressure).
    """

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def collect(cls, config, allocator, counters, handles, swap, pressure):
        """The snapshot of one manager's parts: its config, BlockAllocator, Counters,
        HandleTable, SwapSpace (or None) and PressureMonitor."""
        a, c = allocator, counters
        bpp = config.bytes_per_page()
        used = a.used()
        return cls(
            total_blocks=a.total, free_blocks=a.available(), used_blocks=used,
            cached_blocks=a.num_evictable(), peak_used_blocks=a.peak,
            num_handles=len(handles), num_swapped=handles.num_swapped(),
            allocations=c.allocations, deallocations=c.deallocations,
            failures=c.failures, evictions=c.evictions,
            prefix_queries=c.prefix_queries, prefix_hits=c.prefix_hits,
            prefix_hit_rate=c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0,
            cow_copies=c.cow_copies, forks=c.forks,
            swap_outs=c.swap_outs, swap_ins=c.swap_ins,
            swap_total_blocks=swap.total_blocks() if swap is not None else 0,
            swap_used_blocks=swap.used_blocks() if swap is not None else 0,
            block_size=config.page_size, bytes_per_block=bpp,
            total_bytes=config.total_bytes(), used_bytes=used * bpp,
            peak_bytes=a.peak * bpp, utilization=used / a.total,
            pressure=pressure.level(used / a.total),
        )
