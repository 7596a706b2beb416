"""Per-request state: a :class:`Request` and its ``n`` :class:`Sequence` completions."""
import enum

import numpy as np

from pagedcy.engine.outputs import CompletionOutput, RequestOutput

__all__ = ["SeqStatus", "Sequence", "Request"]


class SeqStatus(enum.IntEnum):
    """Where a sequence is: WAITING (queued for prefill, no pages), RUNNING (pages in the
    pool), SWAPPED (pages in the swap pool), FORK_PENDING (a completion ``i > 0`` waiting
    for completion 0's prefill to fork from), FINISHED."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FORK_PENDING = 3
    FINISHED = 4


class Sequence:
    """One completion: its tokens, KV handle, random stream and text.

    ``tokens`` (int32) is what a prefill feeds the model: the prompt, or after a
    preemption by recompute the prompt plus everything generated. ``num_computed``
    tokens have K/V in the cache; a sequence is decoding once that covers ``tokens``,
    and its next input is then its last generated token.
    """

    __slots__ = ("request", "index", "seq_id", "tokens", "output", "num_computed", "handle",
                 "status", "rng", "detok", "text", "logprobs", "cumulative_logprob",
                 "finish_reason", "stop_reason")

    def __init__(self, request, index, rng, detok):
        self.request = request
        self.index = index
        self.seq_id = (request.request_id, index)   # the manager's request id
        self.tokens = request.prompt_array
        self.output = []
        self.num_computed = 0
        self.handle = None
        self.status = SeqStatus.WAITING if index == 0 else SeqStatus.FORK_PENDING
        self.rng = rng
        self.detok = detok
        self.text = ""
        want = request.params.logprobs is not None
        self.logprobs = [] if want else None
        self.cumulative_logprob = 0.0 if want else None
        self.finish_reason = None
        self.stop_reason = None

    def total_len(self):
        """Prompt plus generated tokens."""
        return self.request.prompt_len + len(self.output)

    def pending(self):
        """Tokens whose K/V still have to be computed."""
        return self.request.prompt_len + len(self.output) - self.num_computed

    def is_decoding(self):
        """True when the next model input is the last generated token."""
        return self.num_computed >= self.tokens.shape[0]

    def reset_for_recompute(self):
        """Forget the cache: the next prefill recomputes prompt + generated tokens."""
        self.handle = None
        self.num_computed = 0
        if self.output:
            self.tokens = np.concatenate(
                [self.request.prompt_array, np.asarray(self.output, dtype=np.int32)])
        self.status = SeqStatus.WAITING

    def append_token(self, token, logprob_entry):
        """Record generated ``token`` (int) and ``(logprob, {id: logprob})`` or None;
        sets ``finish_reason``/``stop_reason`` when it ends the completion."""
        self.output.append(token)
        if logprob_entry is not None:
            self.cumulative_logprob += logprob_entry[0]
            self.logprobs.append(logprob_entry[1])
        checker = self.request.stop_checker
        fin = checker.check_token(token)
        if fin is None and self.detok is not None:
            fin = self._add_text(self.detok.step(token))
        if fin is None:
            fin = checker.check_length(len(self.output))
        if fin is not None:
            self.finish(*fin)

    def _add_text(self, piece):
        """Append detokenized text; ``("stop", s)`` when it completes stop string ``s`` (the
        text is then cut where ``s`` starts), else None."""
        if not piece:
            return None
        self.text += piece
        hit = self.request.stop_checker.find_stop_string(self.text, len(piece))
        if hit is None:
            return None
        self.text = self.text[:hit[0]]
        return "stop", hit[1]

    def finish(self, finish_reason, stop_reason=None):
        """End the completion: the text the detokenizer still holds (the bytes of a
        character cut short) is added first, unless a stop string already cut the text.
        A stop string inside that text ends the completion there instead."""
        if self.detok is not None and not isinstance(stop_reason, str):
            hit = self._add_text(self.detok.flush())
            if hit is not None:
                finish_reason, stop_reason = hit
        self.finish_reason, self.stop_reason = finish_reason, stop_reason

    def completion(self):
        """This sequence's :class:`CompletionOutput` (copies, so later steps do not
        change it)."""
        text = self.text
        if self.finish_reason is None:
            held = self.request.stop_checker.holdback(text)
            if held:
                text = text[:-held]
        return CompletionOutput(self.index, text, list(self.output),
                                self.cumulative_logprob,
                                list(self.logprobs) if self.logprobs is not None else None,
                                self.finish_reason, self.stop_reason)


class Request:
    """One ``add_request``: prompt, parameters, stop checker and its completions.

    ``max_tokens`` is the resolved limit (``params.max_tokens`` or what is left of the
    context). ``seqs`` are created by the engine (it owns the random streams and the
    tokenizer).
    """

    __slots__ = ("request_id", "prompt", "prompt_array", "prompt_len", "params", "max_tokens",
                 "stop_checker", "seqs", "num_cached_tokens", "prompt_token_ids")

    def __init__(self, request_id, prompt, prompt_ids, params, max_tokens, stop_checker):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_array = np.ascontiguousarray(prompt_ids, dtype=np.int32)
        self.prompt_array.flags.writeable = False
        self.prompt_len = int(self.prompt_array.shape[0])
        self.prompt_token_ids = self.prompt_array.tolist()   # shared by every output
        self.params = params
        self.max_tokens = max_tokens
        self.stop_checker = stop_checker
        self.seqs = []
        self.num_cached_tokens = 0

    def finished(self):
        """True once every completion has finished."""
        return all(s.finish_reason is not None for s in self.seqs)

    def output(self):
        """The request's cumulative :class:`RequestOutput`."""
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids,
                             [s.completion() for s in self.seqs], self.finished(),
                             self.num_cached_tokens)
