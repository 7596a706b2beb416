"""Memory pressure of the primary pool: :class:`MemoryPressure` and the watermark monitor."""
import enum

__all__ = ["MemoryPressure", "PressureMonitor"]


class MemoryPressure(enum.IntEnum):
    """How full the primary pool is (evictable prefix-cache pages count as free).

    LOW below ``high_watermark``, HIGH from it, CRITICAL from ``critical_watermark``.
    Ordered, so ``pressure >= MemoryPressure.HIGH`` works.
    """

    LOW = 0
    HIGH = 1
    CRITICAL = 2


class PressureMonitor:
    """Maps a used fraction to a :class:`MemoryPressure` level and calls a callback
    ``fn(new_level, old_level)`` when the level seen by :meth:`update` changes.

    ValueError unless ``0 < high_watermark <= critical_watermark <= 1``.
    """

    __slots__ = ("high", "critical", "_callback", "_last")

    def __init__(self, high_watermark, critical_watermark):
        if not (0.0 < high_watermark <= critical_watermark <= 1.0):
            raise ValueError("need 0 < high_watermark <= critical_watermark <= 1")
        self.high = float(high_watermark)
        self.critical = float(critical_watermark)
        self._callback = None
        self._last = MemoryPressure.LOW

    def level(self, used_fraction):
        """The level of ``used_fraction`` (0..1)."""
        if used_fraction >= self.critical:
            return MemoryPressure.CRITICAL
        if used_fraction >= self.high:
            return MemoryPressure.HIGH
        return MemoryPressure.LOW

    def set_callback(self, fn):
        """Install ``fn`` (None removes it); TypeError if not callable."""
        if fn is not None and not callable(fn):
            raise TypeError("callback must be callable or None")
        self._callback = fn

    def update(self, used_fraction):
        """Record the current level; call the callback if it changed."""
        level = self.level(used_fraction)
        old = self._last
        if level != old:
            self._last = level
            cb = self._callback
            if cb is not None:
                cb(level, old)
