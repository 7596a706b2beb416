"""Progress bars for the command-line tools: tqdm on a terminal, nothing anywhere else.

A pipe or a log file gets no progress output at all (no carriage returns, no escape
codes); tqdm is imported only when a bar is actually drawn.
"""
import sys


class Progress:
    """A tqdm bar on ``file`` (stderr by default) when it is a terminal; a no-op otherwise.

    Progress(total, desc, unit="it", file=None, enabled=True)

    ``update(n)`` advances the bar, ``set(value)`` moves it to an absolute position,
    ``status(text)`` replaces the description; ``close()`` (or leaving a ``with`` block)
    removes the bar. ``enabled=False`` turns it off even on a terminal.
    """

    def __init__(self, total=None, desc="", unit="it", file=None, enabled=True):
        file = sys.stderr if file is None else file
        self._bar = None
        isatty = getattr(file, "isatty", None)
        if enabled and isatty is not None and isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=file, leave=False,
                             dynamic_ncols=True)

    @property
    def drawn(self):
        """True when a bar is on screen."""
        return self._bar is not None

    def update(self, n=1):
        if self._bar is not None:
            self._bar.update(n)

    def set(self, value):
        if self._bar is not None:
            self._bar.update(value - self._bar.n)

    def status(self, text):
        if self._bar is not None:
            self._bar.set_description_str(text)

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
