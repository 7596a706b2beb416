"""Per-request bookkeeping on the event loop: deltas between cumulative outputs, usage, timing.

The engine's outputs are cumulative (whole text and token ids so far, each text a prefix of the
next); a :class:`RequestTracker` turns each into per-choice deltas, so a stream's chunks
concatenate to exactly the non-streamed text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional


@dataclass
class ChoiceDelta:
    """What one choice gained from one output: new text, token ids and logprob dicts."""
    index: int
    text: str
    token_ids: list
    logprobs: Optional[list]
    finish_reason: Optional[str]
    stop_reason: object


class RequestTracker:
    """Follows one request's ``n`` choices; ``arrival`` from ``time.perf_counter()``."""

    def __init__(self, n: int, prompt_tokens: int, arrival: Optional[float] = None):
        self.n = n
        self.prompt_tokens = prompt_tokens
        self.arrival = time.perf_counter() if arrival is None else arrival
        self.texts = [""] * n
        self.token_ids: list[list] = [[] for _ in range(n)]
        self.logprobs: list[list] = [[] for _ in range(n)]
        self.finish_reasons: list[Optional[str]] = [None] * n
        self.stop_reasons: list = [None] * n
        self.first_token_time: Optional[float] = None
        self.finish_time: Optional[float] = None

    @property
    def finished(self) -> bool:
        """True once every choice has a finish reason."""
        return all(r is not None for r in self.finish_reasons)

    def update(self, output) -> list[ChoiceDelta]:
        """Deltas of the choices that changed in ``output`` (a cumulative ``RequestOutput``)."""
        now = time.perf_counter()
        deltas = []
        for comp in output.outputs:
            i = comp.index
            if self.finish_reasons[i] is not None:
                continue
            prev_len, prev_tokens = len(self.texts[i]), len(self.token_ids[i])
            new_ids = list(comp.token_ids[prev_tokens:])
            new_lps = list(comp.logprobs[prev_tokens:]) if comp.logprobs is not None else None
            text = comp.text[prev_len:]
            if new_ids and self.first_token_time is None:
                self.first_token_time = now
            self.texts[i] = comp.text
            self.token_ids[i].extend(new_ids)
            if new_lps:
                self.logprobs[i].extend(new_lps)
            if comp.finish_reason is not None:
                self.finish_reasons[i] = comp.finish_reason
                self.stop_reasons[i] = comp.stop_reason
            if text or new_ids or comp.finish_reason is not None:
                deltas.append(ChoiceDelta(i, text, new_ids, new_lps, comp.finish_reason,
                                          comp.stop_reason))
        if self.finished and self.finish_time is None:
            self.finish_time = now
        return deltas

    def abort(self) -> list[ChoiceDelta]:
        """Finish every open choice with reason "abort" (the server aborted the request)."""
        deltas = []
        for i in range(self.n):
            if self.finish_reasons[i] is None:
                self.finish_reasons[i] = "abort"
                deltas.append(ChoiceDelta(i, "", [], None, "abort", None))
        self.finish_time = time.perf_counter()
        return deltas

    @property
    def completion_tokens(self) -> int:
        """Tokens generated over all choices."""
        return sum(len(t) for t in self.token_ids)

    def usage(self) -> dict:
        """OpenAI usage counts."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def ttft(self) -> Optional[float]:
        """Seconds from arrival to the first token, or None before one."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    def tpot(self) -> Optional[float]:
        """Mean seconds per token after the first (longest choice), or None for < 2 tokens."""
        longest = max((len(t) for t in self.token_ids), default=0)
        if self.first_token_time is None or self.finish_time is None or longest < 2:
            return None
        return (self.finish_time - self.first_token_time) / (longest - 1)
