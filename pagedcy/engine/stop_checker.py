"""When a completion ends: EOS, stop token ids, stop strings, or its length limit."""

__all__ = ["StopChecker"]


class StopChecker:
    """The stop conditions of one request.

    StopChecker(params, eos_token_ids, max_tokens): ``params`` a SamplingParams
    (its ``ignore_eos``, ``stop_token_ids`` and ``stop``), ``eos_token_ids`` the model's EOS
    ids, ``max_tokens`` the number of tokens the completion may generate.
    """

    __slots__ = ("_eos", "_stop_ids", "stop", "_max_stop", "max_tokens")

    def __init__(self, params, eos_token_ids, max_tokens):
        self._eos = frozenset() if params.ignore_eos else frozenset(int(t) for t in eos_token_ids)
        self._stop_ids = frozenset(params.stop_token_ids)
        self.stop = params.stop
        self._max_stop = max((len(s) for s in self.stop), default=0)
        self.max_tokens = max_tokens

    def check_token(self, token):
        """``(finish_reason, stop_reason)`` if generated ``token`` (int) ends the
        completion by itself (EOS or a stop token id), else None. Such a token is kept in
        ``token_ids`` but adds no text."""
        if token in self._eos:
            return "stop", None
        if token in self._stop_ids:
            return "stop", token
        return None

    def check_length(self, num_generated):
        """``("length", None)`` once ``num_generated`` reaches ``max_tokens``, else None."""
        if num_generated >= self.max_tokens:
            return "length", None
        return None

    def find_stop_string(self, text, num_new):
        """``(cut, stop)`` for the earliest stop string that ends inside the last
        ``num_new`` characters of ``text`` (``cut``: where the text is truncated, the
        stop string's start), else None."""
        if not self.stop or not num_new:
            return None
        start = max(0, len(text) - num_new - self._max_stop + 1)
        best = None
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def holdback(self, text):
        """How many trailing characters of ``text`` could still be the start of a stop
        string (not to be shown yet)."""
        if not self.stop or not text:
            return 0
        held = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), held, -1):
                if text.endswith(s[:k]):
                    held = k
                    break
        return held
