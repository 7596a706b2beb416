"""Exceptions raised by pagedcy."""


class PoolExhaustedError(MemoryError):
    """A page was needed, none is free and the eviction policy cannot make room.

    Subclasses ``MemoryError`` so generic out-of-memory handlers catch it. The
    object that raised it is left exactly as it was before the failing call.
    """
