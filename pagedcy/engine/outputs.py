"""What the engine hands back: vLLM's ``CompletionOutput``/``RequestOutput``, plus stats."""
import dataclasses

__all__ = ["CompletionOutput", "RequestOutput", "EngineStats"]


@dataclasses.dataclass
class CompletionOutput:
    """One completion of a request, cumulative (everything generated so far).

    index: which of the request's ``n`` completions. text: the detokenized text (a stop
    string and whatever follows it is cut; text that could still turn into a stop string
    or an unfinished UTF-8 character is held back until it cannot). token_ids: every
    generated token id (the stop/EOS token included). cumulative_logprob: sum of the
    chosen tokens' log-probabilities when ``logprobs`` was asked for, else None.
    logprobs: one ``{token_id: logprob}`` per generated token (the chosen token and the
    top ``logprobs``), or None. finish_reason: "stop", "length", "abort" or None while
    running; stop_reason: the stop string or stop token id that ended it (None for EOS
    and length).
    """

    index: int
    text: str
    token_ids: list
    cumulative_logprob: "float | None"
    logprobs: "list | None"
    finish_reason: "str | None" = None
    stop_reason: "str | int | None" = None

    def finished(self):
        """True once ``finish_reason`` is set."""
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    """The state of one request after an engine step.

    prompt: the prompt text (None when the prompt was given as token ids);
    prompt_token_ids: list of int; outputs: one :class:`CompletionOutput` per
    completion, in index order; finished: every completion is done;
    num_cached_tokens: prompt tokens served from the prefix cache.
    """

    request_id: str
    prompt: "str | None"
    prompt_token_ids: list
    outputs: list
    finished: bool
    num_cached_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine's scheduler and KV cache (running totals where noted).

    num_running / num_waiting / num_swapped: sequences in each queue.
    kv_pages_total / kv_pages_used / kv_pages_free: the primary page pool (free counts
    evictable prefix-cache pages). prefix_cache_queries / prefix_cache_hits: prompt
    tokens looked up / served from the prefix cache (totals). num_preemptions: sequences
    preempted (recompute or swap, total). prompt_tokens: prompt tokens computed by the
    model (total, cache hits excluded, recomputation included); generation_tokens:
    tokens generated (total). peak_kv_pages_used: most pages held at once.
    num_steps: model forwards run; forward_seconds: time inside them;
    prefill_step_seconds / decode_step_seconds: wall time of whole steps with some
    prefill rows / with decode rows only (totals).
    kv_store_* (totals, 0 without ``kv_store``): pages_hit / tokens_hit: found valid in
    the store by lookups; pages_missed / tokens_missed: looked up and not served (absent,
    evicted, rejected, or the store failing); pages_loaded / tokens_loaded: copied into
    the pool instead of prefilled; pages_stored / tokens_stored: written to the store;
    pages_dropped: not sent (store backing off, write queue full); values_rejected:
    values that failed validation (corrupt, truncated, another model's); errors: failed
    store calls and refused writes; bytes_in / bytes_out: value bytes read / written;
    lookups and load_seconds: lookups answered and their total latency.
    """

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_pages_total: int
    kv_pages_used: int
    kv_pages_free: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    peak_kv_pages_used: int = 0
    num_steps: int = 0
    forward_seconds: float = 0.0
    prefill_step_seconds: float = 0.0
    decode_step_seconds: float = 0.0
    kv_store_pages_hit: int = 0
    kv_store_pages_missed: int = 0
    kv_store_pages_loaded: int = 0
    kv_store_pages_stored: int = 0
    kv_store_tokens_hit: int = 0
    kv_store_tokens_missed: int = 0
    kv_store_tokens_loaded: int = 0
    kv_store_tokens_stored: int = 0
    kv_store_pages_dropped: int = 0
    kv_store_values_rejected: int = 0
    kv_store_errors: int = 0
    kv_store_bytes_in: int = 0
    kv_store_bytes_out: int = 0
    kv_store_lookups: int = 0
    kv_store_load_seconds: float = 0.0
